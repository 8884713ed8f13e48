"""scripts/call_breakdown.py's aggregation, on fabricated profiler events (the GPU part runs on
the device)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts"))
import call_breakdown as cb  # noqa: E402


def test_short_names():
    assert cb.short_name("void flashback::sm90::(anonymous namespace)::bwd_sm90_preprocess_kernel<256, "
                         "(flashback::hopper::Dtype)0>(flashback_bwd_params, int)") == "bwd_sm90_preprocess_kernel"
    assert cb.short_name("Memset (Device)") == "Memset (Device)"
    # CUTLASS's launcher (all of FA3's kernels): named by the operator it runs
    assert cb.short_name("void cutlass::device_kernel<flash::FlashAttnBwdSm90<flash::CollectiveMainloopBwdSm90<2, "
                         "cute::tuple<cute::C<64> > >, int> >(flash::FlashAttnBwdSm90<int>::Params)") == "FlashAttnBwdSm90"
    assert cb.short_name("void cutlass::device_kernel<flash::FlashAttnBwdPreprocess<cute::tuple<cute::C<64>>, "
                         "cutlass::bfloat16_t> >(int)") == "FlashAttnBwdPreprocess"
    assert cb.short_name("void cutlass::device_kernel(int)") == "device_kernel"


def test_breakdown_per_call_and_span():
    events = []
    t = 0.0
    for _ in range(2):  # two calls: memset 10, preprocess 20, main 100, postprocess 30, gaps of 5
        for name, dur in (("Memset (Device)", 10), ("void a::pre<1>()", 20), ("void a::main<1>()", 100),
                          ("void a::post<1>()", 30)):
            events.append((name, t, t + dur))
            t += dur + 5
    rows, span = cb.breakdown(list(reversed(events)), calls=2)
    assert [r[0] for r in rows] == ["Memset (Device)", "pre", "main", "post"]
    assert [r[1] for r in rows] == [1, 1, 1, 1]
    assert [r[2] for r in rows] == [10, 20, 100, 30]
    assert span == (2 * 160 + 7 * 5) / 2  # the last end minus the first start, per call
    table = cb.format_table(rows, span)
    assert "62.5%" in table  # main: 100 of 160
    assert "177.5" in table


def test_empty():
    assert cb.breakdown([], calls=3) == ([], 0.0)
