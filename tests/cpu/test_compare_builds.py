"""The summary of scripts/compare_builds.sh (its embedded Python), run on fabricated result files:
the bracketed table (A B A) and the per-build means of repeated builds (A B A B)."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def summary_script():
    text = open(os.path.join(ROOT, "scripts", "compare_builds.sh")).read()
    m = re.search(r"<<'PYEOF'\n(.*?)\nPYEOF", text, re.S)
    assert m, "compare_builds.sh has no embedded summary"
    return m.group(1)


def write_run(out, n, ours, yard):
    os.makedirs(os.path.join(out, str(n)))
    rows = [{"impl": impl, "direction": "fwd", "causal": True, "batch": 4, "seqlen": 4096, "nheads": 16,
             "headdim": 128, "dtype": "bf16", "tflops": [v, v, v]} for impl, v in (("flashback", ours),
                                                                                 ("sdpa_flash", yard))]
    json.dump({"device": "x", "commit": "c", "date": "d", "torch": "t", "results": rows},
              open(os.path.join(out, str(n), "r.json"), "w"))


def run_summary(tmp_path, libs, values):
    script = tmp_path / "summary.py"
    script.write_text(summary_script())
    for n, (ours, yard) in enumerate(values, 1):
        write_run(str(tmp_path), n, ours, yard)
    res = subprocess.run([sys.executable, str(script), str(tmp_path), *libs], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert json.load(open(tmp_path / "compare.json"))["builds"] == libs
    return res.stdout


def test_bracketed_table(tmp_path):
    out = run_summary(tmp_path, ["a.so", "b.so", "a.so"], [(100, 50), (105, 50), (102, 50)])
    # b against the mean of the two a runs (101): +4.0%; the a runs 100 / 102 apart by 2.0%.
    assert re.search(r"\+4\.0%\s+\| first/last 2\.0%", out), out


def test_repeated_builds_are_averaged(tmp_path):
    out = run_summary(tmp_path, ["a.so", "b.so", "a.so", "b.so"], [(100, 50), (99, 50), (104, 50), (107, 50)])
    # a: mean 102, spread 4.0%; b: mean 103, +1.0%, spread 8.1%.
    line = [l for l in out.splitlines() if "spread" not in l and "| 4.0% 8.1%" in l]
    assert line and "+1.0%" in line[0], out


def test_distinct_builds_give_no_mean_table(tmp_path):
    out = run_summary(tmp_path, ["a.so", "b.so"], [(100, 50), (110, 50)])
    assert "mean of each build" not in out
    assert "+10.0%" in out  # last / first ratio change


def test_impl_selects_the_compared_implementation(tmp_path):
    """IMPL=flashback_det compares the deterministic mode's rows, not the default's."""
    script = tmp_path / "summary.py"
    script.write_text(summary_script())
    for n, (ours, det) in enumerate([(100, 80), (100, 88)], 1):
        os.makedirs(tmp_path / str(n))
        rows = [{"impl": impl, "direction": "bwd", "causal": True, "batch": 4, "seqlen": 4096, "nheads": 8,
                 "headdim": 256, "dtype": "bf16", "tflops": [v, v, v]}
                for impl, v in (("flashback", ours), ("flashback_det", det), ("sdpa_flash", 50))]
        json.dump({"results": rows}, open(tmp_path / str(n) / "r.json", "w"))
    res = subprocess.run([sys.executable, str(script), str(tmp_path), "a.so", "b.so"], capture_output=True,
                         text=True, env={**os.environ, "IMPL": "flashback_det"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("flashback_det TFLOP/s"), res.stdout
    assert "+10.0%" in res.stdout, res.stdout  # 80 -> 88; the default rows are equal


def test_energy_table(tmp_path):
    """Rows that carry NVML energy per call (runs without --queue-ahead) get a table of it per
    build: each distinct build's mean mJ per call and its change from the first's."""
    script = tmp_path / "summary.py"
    script.write_text(summary_script())
    for n, mj in enumerate([(2.0, 2.2), (2.5, 2.5), (2.2, 2.0)], 1):  # builds a, b, a
        os.makedirs(tmp_path / str(n))
        rows = [{"impl": impl, "direction": "fwd", "causal": True, "batch": 4, "seqlen": 4096, "nheads": 16,
                 "headdim": 128, "dtype": "bf16", "tflops": [100.0] * 2,
                 "gpu": [{"sm_clock_mhz": 1700, "power_w": 690.0, "mj_per_call": m} for m in mj]}
                for impl in ("flashback", "sdpa_flash")]
        json.dump({"results": rows}, open(tmp_path / str(n) / "r.json", "w"))
    res = subprocess.run([sys.executable, str(script), str(tmp_path), "a.so", "b.so", "a.so"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "mJ per call" in res.stdout, res.stdout
    # a: mean of 2.0, 2.2, 2.2, 2.0 = 2.1; b: 2.5, +19.0%.
    line = [l for l in res.stdout.splitlines() if l.startswith("d128") and "2.10" in l and "2.50" in l]
    assert line and "+19.0%" in line[0], res.stdout


def test_no_energy_no_table(tmp_path):
    out = run_summary(tmp_path, ["a.so", "b.so"], [(100, 50), (110, 50)])
    assert "mJ per call" not in out


def _compare(tmp_path, *args, **env):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "compare_builds.sh"), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OUT": str(tmp_path / "out"), **env})


def test_alternate_refuses_environment_switches(tmp_path):
    res = _compare(tmp_path, "X=1:a.so", ALTERNATE="1", TESTS="0")
    assert res.returncode == 2 and "library paths only" in res.stdout


def test_alternate_runs_one_process_with_every_distinct_build_and_a_copy(tmp_path):
    """ALTERNATE=1: one benchmark call whose --builds names each distinct library once (b1, b2)
    and a copy of the first (b1copy) that exists during the call and is removed after it."""
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"first build")
    b.write_bytes(b"second build")
    record = tmp_path / "call.json"
    stub = tmp_path / "python"
    stub.write_text(f"""#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
spec = argv[argv.index("--builds") + 1]
builds = dict(item.split("=", 1) for item in spec.split(","))
copy = builds.get("b1copy", "")
json.dump({{"argv": argv, "builds": builds, "copy_bytes": open(copy, "rb").read().decode() if os.path.isfile(copy) else None}},
          open({str(record)!r}, "w"))
print("\\ntable")
""")
    stub.chmod(0o755)
    res = _compare(tmp_path, str(a), str(b), str(a), str(b), ALTERNATE="1", TESTS="0", PYTHON=str(stub),
                   BENCH_ARGS="--headdims 64")
    assert res.returncode == 0, res.stdout + res.stderr
    call = json.load(open(record))
    assert call["builds"]["b1"] == str(a) and call["builds"]["b2"] == str(b) and len(call["builds"]) == 3
    assert call["copy_bytes"] == "first build"  # a copy of b1, present while the benchmark ran
    assert not os.path.exists(os.path.join(ROOT, call["builds"]["b1copy"]))  # and removed after
    assert {"--alternate", "--headdims", "64"} <= set(call["argv"])
    assert call["argv"][call["argv"].index("--iters") + 1] == "100"
    assert "table" in res.stdout
