"""scripts/device_run.sh's REQUIRE_GPU guard: on a machine whose card does not match (here, one
with no GPU or another card), it says so and exits 3 before the tests or the benchmark."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, env_extra, fake_card):
    """The script with an nvidia-smi first on PATH that names fake_card (None: prints nothing and
    fails, as on a machine without a driver), and PYTHON=true, so that past the guard nothing
    runs a test or a benchmark (and nothing is written into the checkout)."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON="true", **env_extra)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{fake_card}'\n" if fake_card else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "device_run.sh")], capture_output=True,
                          text=True, timeout=120, env=env)


def test_require_gpu_stops_on_another_card(tmp_path):
    res = _run(tmp_path, {"REQUIRE_GPU": "H200"}, fake_card="NVIDIA H100 80GB HBM3")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "this machine's card is 'NVIDIA H100 80GB HBM3': nothing run" in res.stdout
    assert "== GPU tests" not in res.stdout and "== benchmark" not in res.stdout
    assert not (tmp_path / "out" / "tests.log").exists()


def test_require_gpu_stops_without_a_card(tmp_path):
    res = _run(tmp_path, {"REQUIRE_GPU": "H200"}, fake_card=None)
    assert res.returncode == 3 and "card is 'none'" in res.stdout


def test_require_gpu_lets_the_named_card_through(tmp_path):
    """The matching card passes the guard: the script goes on to its tests (skipped here) and its
    benchmark (PYTHON=true: a no-op)."""
    res = _run(tmp_path, {"REQUIRE_GPU": "h200", "TESTS": "0"}, fake_card="NVIDIA H200")
    assert res.returncode != 3 and "nothing run" not in res.stdout
    assert "== GPU tests skipped (TESTS=0)" in res.stdout and "== benchmark" in res.stdout
