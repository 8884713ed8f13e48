"""benchmarks/plot_family.py without a GPU: which rows it plots from the committed family
results, and (where matplotlib is installed) that it writes a PNG."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
FILES = [os.path.join(RESULTS, f"2026-12-01-h200-1464dd2-{name}.json") for name in ("family", "hdim256")]


@pytest.fixture(scope="module")
def plot_family():
    spec = importlib.util.spec_from_file_location("plot_family", os.path.join(ROOT, "benchmarks", "plot_family.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_series_of_the_family_results(plot_family):
    rows, payload = plot_family.load_rows(FILES)
    assert payload["commit"] == "1464dd2"
    data = plot_family.series(rows, "bf16")
    assert sorted(data) == [(d, direction) for d in (64, 128, 192, 256) for direction in ("bwd", "fwd")]
    for entry in data.values():
        # causal first, then by seqlen; every point has all three implementations in bf16
        assert entry["groups"] == [(True, 4, 4096), (True, 2, 8192), (True, 1, 16384),
                                   (False, 4, 4096), (False, 2, 8192), (False, 1, 16384)]
        for impl in ("flashback", "fa3", "sdpa_flash"):
            assert all(v is not None for v in entry[impl])
    # One point against the file: forward, d = 64, causal 4k, flashback (median of its 3 runs).
    row = next(r for r in rows if (r["impl"], r["direction"], r["headdim"], r.get("dtype", "bf16"),
                                   r["causal"], r["seqlen"]) == ("flashback", "fwd", 64, "bf16", True, 4096))
    assert data[(64, "fwd")]["flashback"][0] == (sorted(row["tflops"])[1], min(row["tflops"]), max(row["tflops"]))
    # FA3 was timed in bf16 only: the fp16 series has no FA3 bars, and head dim 256 no fp16 rows.
    fp16 = plot_family.series(rows, "fp16")
    assert sorted({d for d, _ in fp16}) == [64, 128, 192]
    assert all(v is None for entry in fp16.values() for v in entry["fa3"])


def test_seqlen_labels(plot_family):
    assert [plot_family.seqlen_label(s) for s in (512, 1000, 4096, 16384)] == ["512", "1000", "4k", "16k"]


def test_writes_a_png(plot_family, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "family.png"
    assert plot_family.main(FILES + ["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
