"""benchmarks/bench_attention.py without a GPU: its no-GPU exit, FLOP convention, result file
(name and schema, as read by the tools that compare against FA3) and table."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "bench_attention.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_attention", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k != "FLASHBACK_COMMIT"}
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_without_gpu_says_so_and_exits_0(tmp_path):
    res = _run("--quick", "--plot", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "nothing to benchmark: no CUDA GPU found" in res.stdout
    assert list(tmp_path.iterdir()) == []  # no result file


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cold_l2_is_an_option(tmp_path):
    res = _run("--quick", "--cold-l2", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "nothing to benchmark" in res.stdout


def test_unknown_impl_is_an_error():
    res = _run("--impls", "flashback,nope")
    assert res.returncode == 2
    assert "unknown implementation(s) nope" in res.stderr


def test_unknown_direction_is_an_error():
    res = _run("--directions", "fwd,sideways")
    assert res.returncode == 2
    assert "--directions takes a subset of fwd,bwd,train" in res.stderr


def test_flop_convention(bench):
    # FlashAttention's: forward 4*b*s^2*h*d, halved when causal; backward 2.5x forward.
    fwd = 4 * 4 * 4096**2 * 8 * 256
    assert bench.attention_flops(4, 4096, 8, 256, False, "fwd") == fwd
    assert bench.attention_flops(4, 4096, 8, 256, True, "fwd") == fwd // 2
    assert bench.attention_flops(4, 4096, 8, 256, False, "bwd") == fwd * 5 // 2
    assert bench.attention_flops(4, 4096, 8, 256, True, "bwd") == fwd * 5 // 4
    assert bench.attention_flops(1, 100, 2, 64, False, "fwd", seqlen_k=300) == 4 * 100 * 300 * 2 * 64
    with pytest.raises(ValueError):
        bench.attention_flops(1, 1, 1, 64, False, "both")
    # 1e12 FLOP in 1 ms is 1000 TFLOP/s.
    assert bench.tflops(1e12, 1.0) == pytest.approx(1000.0)
    # Every shape of the sweep has 16384 tokens.
    assert all(b * s == 16384 for b, s in bench.SHAPES)


def test_result_row(bench):
    flops = bench.attention_flops(2, 8192, 8, 256, True, "bwd")
    row = bench.result_row("flashback", "bwd", True, 2, 8192, 8, 256, [flops / 400e12 * 1e3] * 3)
    assert row["tflops"] == [400.0, 400.0, 400.0]
    assert (row["impl"], row["direction"], row["causal"], row["batch"], row["seqlen"], row["nheads"],
            row["headdim"]) == ("flashback", "bwd", True, 2, 8192, 8, 256)


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA H100 PCIe", "h100"),
                                       ("NVIDIA GeForce RTX 4090", "4090")])
def test_gpu_slug(bench, name, slug):
    assert bench.gpu_slug(name) == slug


def _payload(bench):
    rows = []
    for causal in (True, False):
        for batch, seqlen in bench.SHAPES:
            for impl, tf in (("flashback", 300.0), ("sdpa_flash", 250.0), (bench.BWD_CALL, 310.0)):
                for direction in ("fwd", "bwd", "train"):
                    if impl == bench.BWD_CALL and direction != "bwd":
                        continue
                    ms = bench.attention_flops(batch, seqlen, 8, 256, causal, direction) / (tf * 1e12) * 1e3
                    rows.append(bench.result_row(impl, direction, causal, batch, seqlen, 8, 256, [ms] * 3))
    return bench.make_payload("NVIDIA H200", "abc1234", "2026-11-29", "2.11.0+cu130", rows,
                              notes=["cudnn skipped: example"])


def test_result_file_name_and_schema(bench, tmp_path):
    path = bench.write_results(str(tmp_path / "results"), _payload(bench))
    assert os.path.basename(path) == "2026-11-29-h200-abc1234.json"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+-[0-9a-z]+\.json", os.path.basename(path))
    data = json.load(open(path))
    assert {"device", "commit", "date", "torch", "results"} <= set(data)
    assert (data["device"], data["commit"], data["date"], data["torch"]) == (
        "NVIDIA H200", "abc1234", "2026-11-29", "2.11.0+cu130")
    assert len(data["results"]) == 2 * 3 * 7
    for r in data["results"]:
        assert r["impl"] in bench.IMPLS + (bench.BWD_CALL,)
        assert r["direction"] in ("fwd", "bwd", "train")
        assert isinstance(r["causal"], bool)
        assert all(isinstance(r[k], int) for k in ("batch", "seqlen", "nheads", "headdim"))
        assert len(r["tflops"]) == 3 and all(isinstance(t, float) for t in r["tflops"])
    # What the FA3-fraction tool looks up: the backward of impl "flashback" and "sdpa_flash" at
    # head dim 256 for each (causal, seqlen) of the sweep.
    for causal in (True, False):
        for _, seqlen in bench.SHAPES:
            for impl in ("flashback", "sdpa_flash"):
                assert any((r["impl"], r["direction"], r["causal"], r["seqlen"], r["headdim"])
                           == (impl, "bwd", causal, seqlen, 256) for r in data["results"])


def test_table_and_summarize(bench, tmp_path):
    payload = _payload(bench)
    table = bench.format_table(payload)
    assert "ours/yardstick" in table and "1.200" in table  # 300 / 250
    assert "note: cudnn skipped: example" in table
    path = bench.write_results(str(tmp_path), payload)
    res = _run("--summarize", path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == table.strip()


def test_table_takes_a_note_given_as_one_string(bench):
    payload = _payload(bench)
    payload["notes"] = "one note, written by hand"
    lines = bench.format_table(payload).splitlines()
    assert "note: one note, written by hand" in lines
    assert "note: o" not in lines  # not one line per character


def test_table_energy_column(bench):
    import copy

    payload = _payload(bench)
    assert "mJ ours/fa3" not in bench.format_table(payload)  # no FA3, no energy: no column
    fa3 = [dict(copy.deepcopy(r), impl="fa3") for r in payload["results"] if r["impl"] == "flashback"]
    payload["results"] += fa3
    assert "mJ ours/fa3" not in bench.format_table(payload)  # FA3 but no energy read
    for r in payload["results"]:
        mj = {"flashback": 1.32, "fa3": 1.2}.get(r["impl"])
        if mj is not None:
            r["gpu"] = [{"sm_clock_mhz": 1700, "power_w": 690.0, "mj_per_call": mj}] * 3
    table = bench.format_table(payload)
    assert "mJ ours/fa3" in table
    rows = [line for line in table.splitlines() if line.split()[:1] in (["fwd"], ["bwd"], ["train"])]
    assert len(rows) == 2 * 3 * 3 and all(line.split()[-1] == "1.100" for line in rows)  # 1.32 / 1.2
    assert bench.row_mj_per_call({"gpu": [{"mj_per_call": 2.0}, {"mj_per_call": 4.0}, {}]}) == 3.0
    assert bench.row_mj_per_call({"gpu": [{"sm_clock_mhz": 1}]}) is None


def test_table_fa3_and_deterministic_columns(bench):
    import copy

    payload = _payload(bench)
    table = bench.format_table(payload)
    assert "ours/fa3" not in table and "det/ours" not in table  # neither timed: no columns
    ours = [r for r in payload["results"] if r["impl"] == "flashback"]
    payload["results"] += [dict(copy.deepcopy(r), impl="fa3", tflops=[400.0, 375.0, 390.0]) for r in ours]
    payload["results"] += [dict(copy.deepcopy(r), impl="flashback_det", tflops=[270.0, 270.0, 270.0])
                           for r in ours if r["direction"] == "bwd"]
    lines = bench.format_table(payload).splitlines()
    head = lines[1].split()
    assert head[-2:] == ["ours/fa3", "det/ours"]
    rows = [line.split() for line in lines if line.split()[:1] in (["fwd"], ["bwd"], ["train"])]
    assert rows
    for row in rows:
        ours_tf = float(row[head.index("flashback")])
        assert row[head.index("ours/fa3")] == f"{ours_tf / 390.0:.3f}"  # the median of FA3's runs
        if row[0] == "bwd":
            assert row[head.index("det/ours")] == f"{270.0 / ours_tf:.3f}"
        else:
            assert row[head.index("det/ours")] == "-"  # no deterministic forward


def test_commit(bench, tmp_path, monkeypatch):
    import flashback

    monkeypatch.setenv("FLASHBACK_COMMIT", "feed123")
    assert bench.git_commit(str(tmp_path)) == "feed123"
    monkeypatch.delenv("FLASHBACK_COMMIT")
    # The loaded library's build commit names the results before the tree's HEAD does.
    monkeypatch.setattr(flashback, "build_commit", lambda: "beef456-dirty")
    assert bench.git_commit(str(tmp_path)) == "beef456-dirty"
    for unknown in (lambda: "unknown", lambda: (_ for _ in ()).throw(OSError("no library"))):
        monkeypatch.setattr(flashback, "build_commit", unknown)
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
        assert bench.git_commit(str(tmp_path)) == "unknown"  # not a git checkout
        if os.path.exists(os.path.join(ROOT, ".git")):
            assert re.fullmatch(r"[0-9a-f]{4,40}", bench.git_commit(ROOT))


def test_default_impls_leave_out_the_slow_backend(bench):
    assert "sdpa_efficient" not in bench.DEFAULT_IMPLS
    assert set(bench.DEFAULT_IMPLS) <= set(bench.IMPLS)
    assert {"flashback", "sdpa_flash", "cudnn", "fa3"} <= set(bench.DEFAULT_IMPLS)


def test_path_summary_names_every_point_off_the_fast_path(bench):
    row = dict(impl="flashback", direction="bwd", causal=True, batch=4, seqlen=4096)
    assert bench.path_summary([]) == "flashback path: not recorded"
    assert "sm90 on all 2 timed" in bench.path_summary([dict(row, path="sm90"), dict(row, path="sm90")])
    text = bench.path_summary([dict(row, path="sm90"),
                               dict(row, seqlen=8192, path="reference: a tensor is not 128-byte aligned")])
    assert text.startswith("flashback path: NOT sm90 on ")
    assert "4x8192" in text and "128-byte aligned" in text and "4x4096" not in text


def test_training_step_flops(bench):
    # forward + backward = 1 + 2.5 forwards
    fwd = bench.attention_flops(2, 8192, 8, 256, True, "fwd")
    assert bench.attention_flops(2, 8192, 8, 256, True, "train") == fwd * 7 // 2
    with pytest.raises(ValueError):
        bench.attention_flops(2, 8192, 8, 256, True, "both")


def test_seqlen_sets(bench):
    assert bench.shapes_for(bench.SEQLEN_SETS["short"]) == ((32, 512), (16, 1024), (8, 2048))
    assert bench.shapes_for(bench.SEQLEN_SETS["main"]) == bench.SHAPES
    assert [s for _, s in bench.shapes_for(bench.SEQLEN_SETS["all"])] == [512, 1024, 2048, 4096, 8192, 16384]


def test_sweep_tag_names_non_default_sweeps(bench):
    main, short = bench.SEQLEN_SETS["main"], bench.SEQLEN_SETS["short"]
    assert bench.sweep_tag(main, (256,), ("bf16",)) == ""
    assert bench.sweep_tag(short, (256,), ("bf16",)) == "short"
    assert bench.sweep_tag((1024,), (64, 128), ("bf16", "fp16")) == "s1024-d64-128-bf16-fp16"
    assert bench.result_filename("NVIDIA H200", "abc1234", "2026-12-01", "short") == \
        "2026-12-01-h200-abc1234-short.json"


@pytest.mark.parametrize("bad", ["3000", "0", "short,main", ""])
def test_bad_seqlens_are_an_error(bad):
    res = _run("--seqlens", bad)
    assert res.returncode == 2
    assert "--seqlens" in res.stderr


def test_gpu_state_is_empty_or_numbers(bench):
    state = bench.gpu_state()
    assert state == {} or (set(state) == {"sm_clock_mhz", "power_w"}
                           and state["sm_clock_mhz"] > 0 and state["power_w"] > 0)
    if not torch.cuda.is_available():
        assert state == {}


def test_repeat_order_varies_the_predecessor(bench):
    """Three repeats: every implementation is timed once per repeat, and (with three or more
    implementations) follows at least two different ones over the point, counting the last of
    one repeat as the predecessor of the next repeat's first."""
    for impls in (["flashback", "sdpa_flash", "fa3"], ["flashback", "flashback_det", "sdpa_flash", "fa3"]):
        orders = [bench.repeat_order(impls, r) for r in range(3)]
        assert all(sorted(o) == sorted(impls) for o in orders)
        seq = [i for o in orders for i in o]
        preds = {i: set() for i in impls}
        for a, b in zip(seq, seq[1:]):
            if a != b:
                preds[b].add(a)
        assert all(len(p) >= 2 for p in preds.values()), preds
    assert bench.repeat_order(["a"], 1) == ["a"]
    assert bench.repeat_order([], 0) == []


@pytest.mark.parametrize("bad", ["-1", "nan"])
def test_bad_preheat_is_an_error(bad):
    res = _run("--preheat", bad)
    assert res.returncode == 2
    assert "--preheat takes seconds >= 0" in res.stderr


def test_table_marks_unsteady_ratios(bench):
    """A ratio whose sides include a repeat spread above UNSTEADY_SPREAD carries "?" and the
    table says how many; steady points stay unmarked."""
    import copy

    payload = _payload(bench)
    ours = [r for r in payload["results"] if r["impl"] == "flashback"]
    payload["results"] += [dict(copy.deepcopy(r), impl="fa3", tflops=[400.0, 390.0, 395.0]) for r in ours]
    table = bench.format_table(payload)
    assert "?" not in table  # the example's repeats are steady
    # One point of FA3 halved in two of three repeats (a slow host), one of ours by 1.2x only.
    fa3 = [r for r in payload["results"] if r["impl"] == "fa3"]
    fa3[0]["tflops"] = [400.0, 200.0, 205.0]
    ours[1]["tflops"] = [300.0, 250.0, 290.0]
    assert bench.spread(fa3[0]["tflops"]) == 2.0 and bench.spread(ours[1]["tflops"]) == 1.2
    lines = bench.format_table(payload).splitlines()
    head = lines[1].split()
    rows = [line.split() for line in lines if line.split()[:1] in (["fwd"], ["bwd"], ["train"])]
    marked = [row for row in rows if row[head.index("ours/fa3")].endswith("?")]
    assert len(marked) == 1
    row = marked[0]
    assert (row[0], int(row[1]), int(row[5])) == (fa3[0]["direction"], fa3[0]["headdim"], fa3[0]["seqlen"])
    assert not row[head.index("ours/yardstick")].endswith("?")  # ours and the yardstick are steady there
    assert sum(line.startswith("?: 1 ratio(s)") for line in lines) == 1
    assert bench.spread([5.0]) == 1.0 and bench.spread([]) == 1.0


def test_clock_sampler_means_its_readings(bench):
    import itertools
    import time

    counter = itertools.count(1000)
    sampler = bench.ClockSampler(lambda: next(counter), 0.001).start()
    time.sleep(0.05)
    mean = sampler.stop()
    n = len(sampler.samples)
    assert n >= 2 and sampler.samples == list(range(1000, 1000 + n))
    assert mean == sum(range(1000, 1000 + n)) / n
    # A reading that fails is left out; none at all gives None.
    def fail():
        raise RuntimeError("no NVML")
    assert bench.ClockSampler(fail, 0.001).start().stop() is None
    assert bench.ClockSampler(lambda: 1.0, 60.0).start().stop() is None  # stopped before any


def test_table_per_mhz_column(bench):
    import copy

    payload = _payload(bench)
    ours = [r for r in payload["results"] if r["impl"] == "flashback"]
    payload["results"] += [dict(copy.deepcopy(r), impl="fa3", tflops=[400.0, 400.0, 400.0]) for r in ours]
    assert "ours/fa3/MHz" not in bench.format_table(payload)  # no clock sampled: no column
    for r in payload["results"]:
        mhz = {"flashback": 1500.0, "fa3": 1800.0}.get(r["impl"])
        if mhz is not None:
            r["gpu"] = [{"sm_clock_mhz": 1980, "sm_clock_mean_mhz": mhz}] * 3
    lines = bench.format_table(payload).splitlines()
    head = lines[1].split()
    assert head[-1] == "ours/fa3/MHz"
    rows = [line.split() for line in lines if line.split()[:1] in (["fwd"], ["bwd"], ["train"])]
    assert rows
    for row in rows:
        ours_tf = float(row[head.index("flashback")])
        # (ours / 1500 MHz) / (400 / 1800 MHz): the lower clock credited to ours.
        assert row[-1] == f"{(ours_tf / 1500.0) / (400.0 / 1800.0):.3f}"
    assert bench.row_clock_mhz({"gpu": [{"sm_clock_mean_mhz": 1500.0}, {"sm_clock_mean_mhz": 1700.0}, {}]}) == 1600.0
    assert bench.row_clock_mhz({"gpu": [{"sm_clock_mhz": 1980}]}) is None


def test_alternation_never_repeats_an_implementation_and_varies_its_predecessor(bench):
    for names in (["flashback", "fa3"], ["flashback", "sdpa_flash", "fa3"],
                  ["flashback", "flashback_det", "sdpa_flash", "fa3"]):
        n = len(names)
        rounds = bench.alternation_rounds(names, 100)
        assert rounds[0] == names
        assert all(sorted(r) == sorted(names) for r in rounds)
        seq = [x for r in rounds for x in r]
        # No call right after one of its own implementation, across round boundaries too.
        assert all(a != b for a, b in zip(seq, seq[1:])), names
        # Within the first 4n rounds every implementation follows each other one.
        head = [x for r in rounds[:4 * n] for x in r]
        preds = {m: {a for a, b in zip(head, head[1:]) if b == m} for m in names}
        assert all(preds[m] == set(names) - {m} for m in names), (names, preds)
    assert bench.alternation_rounds(["flashback", "fa3"], 4) == [["flashback", "fa3"]] * 4
    assert bench.alternation_rounds([], 3) == [[], [], []] and bench.alternation_rounds(["a"], 2) == [["a"], ["a"]]


class _FakeClock:
    """Stands in for CUDA events on the CPU: time advances only inside the timed callables."""
    now = 0.0

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = _FakeClock.now

        def elapsed_time(self, other):
            return other.t - self.t


@pytest.fixture
def fake_cuda(monkeypatch):
    _FakeClock.now = 0.0
    monkeypatch.setattr(torch.cuda, "Event", _FakeClock.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return _FakeClock


def test_time_alternating_times_each_call_in_turn(bench, fake_cuda):
    order = []
    calls = {"a": 0, "b": 0}

    def call(name, ms):
        def fn():
            order.append(name)
            # The timed rounds' costs grow with the round (the 2 warm-up calls cost 0), so that
            # events read from another round's calls would change the medians.
            fake_cuda.now += 0.0 if calls[name] < 1 else ms * ((calls[name] - 1) % 3 + 1)
            calls[name] += 1
        return fn
    runs = bench.time_alternating({"a": call("a", 2.0), "b": call("b", 3.0)}, iters=3, warmup=1, repeats=2)
    # Per repeat each callable ran 1x, 2x and 3x its cost: the median is 2x.
    assert runs == {"a": [4.0, 4.0], "b": [6.0, 6.0]}
    assert order == ["a", "b"] + ["a", "b"] * 6


def _fake_attention(fake_cuda, fwd_ms, bwd_ms):
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            fake_cuda.now += fwd_ms
            return q * k + v

        @staticmethod
        def backward(ctx, g):
            fake_cuda.now += bwd_ms
            return g, g, g
    return Fn.apply


def test_measure_alternating_times_every_direction_and_skips_a_rejecting_backend(bench, fake_cuda, monkeypatch):
    cost = {"flashback": (1.0, 2.0), "fa3": (1.5, 2.5)}

    def forward_fn(impl, causal):
        if impl == "cudnn":
            def reject(q, k, v):
                raise RuntimeError("no kernel for this shape")
            return reject
        return _fake_attention(fake_cuda, *cost[impl])
    monkeypatch.setattr(bench, "_forward_fn", forward_fn)
    fake = type(sys)("flashback")
    fake.last_forward_path = lambda: "sm90"
    fake.last_backward_path = lambda: "reference: test"
    monkeypatch.setitem(sys.modules, "flashback", fake)
    q, k, v = (torch.randn(1, 8, 2, 4, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 8, 2, 4)
    notes = []
    res, paths = bench.measure_alternating(["flashback", "cudnn", "fa3"], q, k, v, dout, True, iters=3, warmup=1,
                                           repeats=2, notes=notes, directions=("fwd", "bwd", "train"),
                                           dtype_name="fp16")
    assert sorted(res) == ["fa3", "flashback"]
    assert notes == ["cudnn d=4 fp16 causal=True batch=1 seqlen=8 skipped: RuntimeError: no kernel for this shape"]
    for impl, (f, b) in cost.items():
        assert res[impl] == {"fwd": [f, f], "bwd": [b, b], "train": [f + b, f + b]}, impl
    assert paths == {"flashback": {"fwd": "sm90", "bwd": "reference: test", "train": "forward sm90; backward reference: test"}}


def test_measure_alternating_drops_a_direction_that_fails(bench, fake_cuda, monkeypatch):
    def forward_fn(impl, causal):
        attention = _fake_attention(fake_cuda, 1.0, 2.0)
        if impl == "sdpa_flash":
            return attention
        state = {"calls": 0}

        def flaky(q, k, v):  # takes the shape, then fails while the forward is timed
            state["calls"] += 1
            if state["calls"] > 2:
                raise RuntimeError("out of memory")
            return attention(q, k, v)
        return flaky
    monkeypatch.setattr(bench, "_forward_fn", forward_fn)
    q, k, v = (torch.randn(1, 8, 2, 4, requires_grad=True) for _ in range(3))
    notes = []
    res, _ = bench.measure_alternating(["sdpa_flash", "fa3"], q, k, v, torch.randn(1, 8, 2, 4), False, iters=3,
                                       warmup=1, repeats=1, notes=notes, directions=("fwd", "bwd"))
    assert res == {"sdpa_flash": {"bwd": [2.0]}, "fa3": {"bwd": [2.0]}}
    assert len(notes) == 1 and notes[0].startswith("fwd d=4 bf16 causal=False") and "out of memory" in notes[0]


def test_alternate_is_an_option():
    res = _run("--alternate", "--help")
    assert res.returncode == 0 and "--alternate" in res.stdout
    res = _run("--alternate", "--sample-clock", "5")
    assert res.returncode == 2 and "--sample-clock does not combine with --alternate" in res.stderr


def test_time_alternating_queues_ahead_in_chunks(bench, fake_cuda, monkeypatch):
    """--queue-ahead: a sleep before every chunk of rounds, each chunk about `iters` calls (what
    time_ms queues at once), so the launch queue holds as much as in the default mode."""
    sleeps = []
    monkeypatch.setattr(bench, "QUEUE_AHEAD", True)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: sleeps.append(cycles), raising=False)

    def fn():
        fake_cuda.now += 1.0
    runs = bench.time_alternating({"a": fn, "b": fn}, iters=5, warmup=0, repeats=1)
    assert runs == {"a": [1.0], "b": [1.0]}
    per_call = bench.QUEUE_AHEAD_CYCLES_PER_CALL
    assert sleeps == [per_call * 4, per_call * 4, per_call * 2]  # rounds 0-1, 2-3, 4; two calls a round


def test_parse_builds(bench):
    assert bench.parse_builds("A=build/libflashback.so, B-2=x/lib.so") == {
        "A": "build/libflashback.so", "B-2": "x/lib.so"}
    for bad, why in (("A=x", "at least two"), ("A=x,A=y", "given twice"), ("A=x,B", "not LABEL=PATH"),
                     ("A=x,=y", "not LABEL=PATH"), ("A=x,B c=y", "not LABEL=PATH"), ("A=x,B=", "not LABEL=PATH")):
        with pytest.raises(ValueError, match=why):
            bench.parse_builds(bad)


def test_expand_builds(bench):
    assert bench.expand_builds(["flashback", "sdpa_flash", "flashback_det", "fa3"], ["A", "B"]) == [
        "flashback@A", "flashback@B", "sdpa_flash", "flashback_det@A", "flashback_det@B", "fa3"]
    assert (bench.base_impl("flashback_det@B"), bench.build_label("flashback_det@B")) == ("flashback_det", "B")
    assert (bench.base_impl("fa3"), bench.build_label("fa3")) == ("fa3", None)


def test_builds_need_alternate_and_flashback():
    res = _run("--builds", "A=a.so,B=b.so")
    assert res.returncode == 2 and "--builds needs --alternate" in res.stderr
    res = _run("--alternate", "--impls", "fa3", "--builds", "A=a.so,B=b.so")
    assert res.returncode == 2 and "needs flashback or flashback_det" in res.stderr
    res = _run("--alternate", "--builds", "A=a.so")
    assert res.returncode == 2 and "at least two" in res.stderr


def test_measure_alternating_runs_each_build_under_its_library(bench, fake_cuda, monkeypatch):
    """Every call of flashback@X, its forward, its backward and the path read after it, runs
    while `using` holds X's library; the other implementations' calls under none."""
    active = {"lib": None}
    seen = []

    class Using:
        def __init__(self, lib):
            self.lib = lib

        def __enter__(self):
            self.saved, active["lib"] = active["lib"], self.lib

        def __exit__(self, *exc):
            active["lib"] = self.saved
    fake_lib = type(sys)("flashback._lib")
    fake_lib.using = Using
    fake = type(sys)("flashback")
    fake._lib = fake_lib
    fake.last_forward_path = lambda: f"sm90 {active['lib']}"
    fake.last_backward_path = lambda: f"bwd {active['lib']}"
    monkeypatch.setitem(sys.modules, "flashback", fake)
    monkeypatch.setitem(sys.modules, "flashback._lib", fake_lib)
    monkeypatch.setattr(bench, "BUILD_LIBS", {"A": "libA", "B": "libB"})

    def forward_fn(impl, causal):
        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                seen.append((impl, "fwd", active["lib"]))
                fake_cuda.now += 1.0 if impl.endswith("A") else 2.0
                return q * k + v

            @staticmethod
            def backward(ctx, g):
                seen.append((impl, "bwd", active["lib"]))
                fake_cuda.now += 3.0
                return g, g, g
        return Fn.apply
    monkeypatch.setattr(bench, "_forward_fn", forward_fn)
    q, k, v = (torch.randn(1, 8, 2, 4, requires_grad=True) for _ in range(3))
    res, paths = bench.measure_alternating(["flashback@A", "flashback@B", "fa3"], q, k, v, torch.randn(1, 8, 2, 4),
                                           True, iters=3, warmup=1, repeats=1, notes=[], directions=("fwd", "bwd"))
    assert res == {"flashback@A": {"fwd": [1.0], "bwd": [3.0]}, "flashback@B": {"fwd": [2.0], "bwd": [3.0]},
                   "fa3": {"fwd": [2.0], "bwd": [3.0]}}
    expected = {"flashback@A": "libA", "flashback@B": "libB", "fa3": None}
    assert seen and all(lib == expected[impl] for impl, _, lib in seen)
    assert {(impl, d) for impl, d, _ in seen} == {(i, d) for i in expected for d in ("fwd", "bwd")}
    assert paths == {"flashback@A": {"fwd": "sm90 libA", "bwd": "bwd libA"},
                     "flashback@B": {"fwd": "sm90 libB", "bwd": "bwd libB"}}
    assert active["lib"] is None


def test_table_with_builds(bench):
    """B/A is the median of the per-repeat ratios (each repeat's pair timed in the same rounds),
    not the ratio of the medians; the first build is "ours"; columns follow the builds' order."""
    rows = []
    for impl, ms in (("flashback@B", [1.0, 1.2, 1.188]), ("flashback@A", [1.0, 1.2, 1.1]), ("fa3", [1.2] * 3),
                     ("sdpa_flash", [2.2] * 3), ("flashback_det@A", [1.1] * 3), ("flashback_det@B", [1.2] * 3)):
        rows.append(bench.result_row(impl, "bwd", True, 4, 4096, 8, 256, ms))
    payload = bench.make_payload("NVIDIA H200", "abc1234", "2026-12-07", "2.11", rows,
                                 builds={"A": "a.so", "B": "b.so"})
    table = bench.format_table(payload)
    head, line = table.splitlines()[1].split(), table.splitlines()[2].split()
    assert head[6:12] == ["flashback@A", "flashback@B", "flashback_det@A", "flashback_det@B", "sdpa_flash", "fa3"]
    cells = dict(zip(head, line))
    # Per repeat A/B: 1.0, 1.0, 1.1 / 1.188 = 0.926 -> median 1.000; the medians' ratio would be 1.1 / 1.188.
    assert cells["B/A"] == "1.000"
    assert cells["B/A(det)"] == f"{1.1 / 1.2:.3f}"
    assert cells["ours/fa3"] == f"{1.2 / 1.1:.3f}"  # the first build is "ours" (median 1.1 ms)
    assert cells["ours/yardstick"] == "2.000"


def test_paired_ratio(bench):
    assert bench.paired_ratio([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == 2.0
    assert bench.paired_ratio([1.0, 2.0], [1.0, 1.0, 4.0]) == pytest.approx(1.5 / 1.0)  # unequal: medians
    assert bench.paired_ratio([], []) is None


def test_measure_alternating_gives_each_dtype_label_its_own_inputs(bench, fake_cuda, monkeypatch):
    """--alternate with several dtypes: "impl#dtype" labels, each called on its dtype's tensors,
    the results keyed by label; the implementation is the label's part before '#'."""
    seen = []

    def forward_fn(impl, causal):
        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                seen.append((impl, q.dtype, k.dtype, v.dtype))
                fake_cuda.now += 1.0 if q.dtype == torch.bfloat16 else 2.0
                return q * k + v

            @staticmethod
            def backward(ctx, g):
                fake_cuda.now += 4.0 if g.dtype == torch.bfloat16 else 5.0
                return g, g, g
        return Fn.apply
    monkeypatch.setattr(bench, "_forward_fn", forward_fn)
    inputs = {}
    for t in (torch.bfloat16, torch.float16):
        q, k, v = (torch.randn(1, 8, 2, 4, dtype=t, requires_grad=True) for _ in range(3))
        inputs[t] = (q, k, v, torch.randn(1, 8, 2, 4, dtype=t))
    labels = ["sdpa_flash#bf16", "sdpa_flash#fp16", "fa3#bf16"]
    by_label = {lab: inputs[torch.float16 if lab.endswith("fp16") else torch.bfloat16] for lab in labels}
    res, _ = bench.measure_alternating(labels, *by_label["sdpa_flash#bf16"], False, iters=3, warmup=1, repeats=1,
                                       notes=[], directions=("fwd", "bwd"), dtype_name="bf16+fp16",
                                       inputs=by_label)
    assert res == {"sdpa_flash#bf16": {"fwd": [1.0], "bwd": [4.0]}, "sdpa_flash#fp16": {"fwd": [2.0], "bwd": [5.0]},
                   "fa3#bf16": {"fwd": [1.0], "bwd": [4.0]}}
    assert {(i, q) for i, q, k, v in seen} == {("sdpa_flash", torch.bfloat16), ("sdpa_flash", torch.float16),
                                              ("fa3", torch.bfloat16)}
    assert all(q == k == v for _, q, k, v in seen)
    assert bench.split_dtype("flashback@B#fp16") == ("flashback@B", "fp16")
    assert bench.split_dtype("fa3") == ("fa3", None)


def test_sweep_alternates_dtypes_within_a_point(bench, monkeypatch, tmp_path):
    """run_sweep with --alternate and two dtypes: one alternated measurement per (head dim, mask,
    shape) holding both dtypes (fa3 in bf16 only), the same values in each dtype, rows written per
    dtype, and the table's fp16/bf16 columns paired per repeat."""
    calls = []

    def fake_measure(impls, q, k, v, dout, causal, iters, warmup, repeats, notes, directions, dtype_name,
                     inputs=None):
        calls.append((list(impls), dtype_name, {i: tuple(x.dtype for x in inputs[i]) for i in impls}))
        a, b = inputs["flashback#bf16"][0], inputs["flashback#fp16"][0]
        assert torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2)  # one draw, two dtypes
        ms = {"flashback#bf16": [1.0, 1.2, 1.0], "flashback#fp16": [1.1, 1.2, 1.25],
              "sdpa_flash#bf16": [2.0] * 3, "sdpa_flash#fp16": [2.0, 2.5, 2.0], "fa3#bf16": [1.2] * 3}
        return {i: {"fwd": [t / 100 for t in ms[i]]} for i in impls}, {}
    monkeypatch.setattr(bench, "measure_alternating", fake_measure)
    monkeypatch.setattr(bench, "ALTERNATE", True)
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "warm_gpu", lambda s: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", type(sys)("flash_attn_interface"))
    path = bench.run_sweep(["flashback", "sdpa_flash", "fa3"], 3, 1, 3, str(tmp_path), False, ("fwd",), (64,),
                           ("bf16", "fp16"), ((1, 1024),), "t", warm_seconds=0.0, causals=(True,))
    assert [c[0] for c in calls] == [["flashback#bf16", "sdpa_flash#bf16", "fa3#bf16",
                                      "flashback#fp16", "sdpa_flash#fp16"]]
    assert calls[0][1] == "bf16+fp16"
    assert calls[0][2]["fa3#bf16"] == (torch.bfloat16,) * 4
    assert calls[0][2]["flashback#fp16"] == (torch.float16,) * 4
    with open(path) as f:
        payload = json.load(f)
    assert sorted((r["impl"], r["dtype"]) for r in payload["results"]) == [
        ("fa3", "bf16"), ("flashback", "bf16"), ("flashback", "fp16"), ("sdpa_flash", "bf16"), ("sdpa_flash", "fp16")]
    assert "dtypes (bf16, fp16) of a point timed in turn too" in payload["method"]
    lines = bench.format_table(payload).splitlines()
    head = lines[1].split()
    rows = {ln.split()[2]: dict(zip(head, ln.split())) for ln in lines[2:4]}
    # Per repeat fp16 / bf16 speed: 1/1.1, 1.2/1.2, 1/1.25 -> median 0.909 (the medians' ratio: 1/1.2).
    assert rows["fp16"]["fp16/bf16"] == "0.909"
    assert rows["fp16"]["fp16/bf16(sdpa_flash)"] == "1.000"
    assert rows["bf16"]["fp16/bf16"] == "-"


def test_table_fp16_over_bf16_run_by_run_is_the_medians_ratio(bench):
    """Without the dtypes timed in turn the repeats of the two dtypes share nothing: the column is
    the ratio of the medians, not paired per repeat."""
    rows = [bench.result_row("flashback", "fwd", True, 1, 1024, 32, 64, ms, dtype)
            for dtype, ms in (("bf16", [1.0, 1.2, 1.0]), ("fp16", [1.1, 1.2, 1.25]))]
    table = bench.format_table(bench.make_payload("NVIDIA H100", "abc1234", "2026-12-07", "2.11", rows))
    head, fp16_line = table.splitlines()[1].split(), table.splitlines()[3].split()
    cells = dict(zip(head, fp16_line))
    assert cells["dtype"] == "fp16"
    # Medians 1.0 and 1.2 ms (TFLOP/s rounded to 0.01 in the rows); paired per repeat would be 0.909.
    assert float(cells["fp16/bf16"]) == pytest.approx(1.0 / 1.2, abs=2e-3)


def test_plot_has_a_panel_per_direction_headdim_and_dtype(bench, tmp_path, monkeypatch):
    """A file of two head dims and two dtypes: one panel each, every panel's bars from its own
    rows (a panel per direction alone would have drawn the first matching row of any head dim)."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    seen = {}
    real_subplots = plt.subplots

    def spy(*args, **kwargs):
        fig, axes = real_subplots(*args, **kwargs)
        seen["axes"] = axes
        return fig, axes
    monkeypatch.setattr(plt, "subplots", spy)
    rows, expected = [], {}
    for n, (d, dtype) in enumerate(((64, "bf16"), (64, "fp16"), (128, "bf16"), (128, "fp16"))):
        ms = 1.0 + 0.25 * n
        row = bench.result_row("flashback", "fwd", True, 4, 4096, 2048 // d, d, [ms] * 3, dtype)
        rows.append(row)
        expected[(d, dtype)] = row["tflops"][0]
    png = bench.plot(bench.make_payload("NVIDIA H100", "abc1234", "2026-12-07", "2.11", rows),
                     str(tmp_path / "p.png"))
    assert png and os.path.exists(png)
    axes = seen["axes"][:, 0]
    assert len(axes) == 4
    for ax in axes:
        m = re.match(r"fwd, head dim (\d+), (\w+), \d+ heads", ax.get_title())
        assert m, ax.get_title()
        bars = next(c for c in ax.containers if isinstance(c, matplotlib.container.BarContainer))
        heights = [b.get_height() for b in bars]
        assert heights == [pytest.approx(expected[(int(m.group(1)), m.group(2))])]
