"""Which forward config serves a call, read from csrc/fwd_sm90/fwd_sm90.h: every config a head
dim's entry compiles is reached by some call, and a measured flag sits on the config its calls
run.

A flag adopted on a config that no call reaches is a gain that never ships (lean_softmax at
d = 192 sat on kFwdSm90Hdim192Full, which the grid row never sent a call to). The model below
restates the dispatch of fwd_sm90_launch.cu (fwd_sm90_persistent, fwd_sm90_multi_tile,
fwd_sm90_full_long) and fwd_sm90_launch.cuh (run_fwd_sm90_entry); keep them in step.
"""
import re

import pytest
from sm90_configs import header_text, initializer

ALL_KEYS = 0x7FFFFFFF
GRID_FIELDS = ("full_persistent_keys", "causal_counter_keys", "causal_multi_keys",
               "causal_static_keys", "causal_k_ahead_keys", "full_k_ahead_keys", "full_long_keys")
# Lengths on each side of every threshold the grid rows use, and the longest.
PROBES = sorted({1, 17, 512, 1024, 2048, 2049, 4096, 4097, 8192, 16384, ALL_KEYS})


def _value(token):
    return ALL_KEYS if token.strip() == "kAllKeys" else int(token)


def grid_row(d):
    m = re.search(r"constexpr FwdSm90Grid kFwdSm90Hdim%dGrid = \{([^}]*)\};" % d, header_text("Fwd"))
    assert m, f"kFwdSm90Hdim{d}Grid"
    values = [_value(t) for t in m.group(1).split(",")]
    assert len(values) == len(GRID_FIELDS)
    return dict(zip(GRID_FIELDS, values))


def config_object(name):
    """The config object a name denotes (a reference names the object it refers to)."""
    text = header_text("Fwd")
    seen = set()
    while name not in seen:
        seen.add(name)
        if re.search(r"constexpr FwdSm90Config %s = \{" % name, text):
            return name
        m = re.search(r"constexpr const FwdSm90Config& %s = (\w+);" % name, text)
        assert m, f"{name} is neither a config nor a reference to one"
        name = m.group(1)
    raise AssertionError(f"{name}: references in a cycle")


def row_configs(d):
    names = {"causal": f"kFwdSm90Hdim{d}", "full": f"kFwdSm90Hdim{d}Full",
             "full_long": f"kFwdSm90Hdim{d}FullLong", "multi": f"kFwdSm90Hdim{d}Multi"}
    return {role: config_object(n) for role, n in names.items()}


def serves(d, causal, seqlen_k):
    """The config object of a call (run_fwd_sm90_entry)."""
    g, c = grid_row(d), row_configs(d)
    persistent = seqlen_k <= (g["causal_static_keys"] if causal else g["full_persistent_keys"])
    multi_tile = persistent or (causal and seqlen_k <= g["causal_multi_keys"])
    if c["multi"] != c["causal"] and multi_tile:
        return c["multi"]
    if causal:
        return c["causal"]
    if c["full_long"] != c["full"] and seqlen_k > g["full_long_keys"]:
        return c["full_long"]
    return c["full"]


def compiled(d):
    """The configs the entry compiles: where the grid row sends every call to an own Multi
    config, that one alone (fwd_sm90_multi_takes_all); else each distinct config of the row."""
    g, c = grid_row(d), row_configs(d)
    if c["multi"] != c["causal"] and g["full_persistent_keys"] == ALL_KEYS \
            and g["causal_multi_keys"] == ALL_KEYS:
        return {c["multi"]}
    return set(c.values())


@pytest.mark.parametrize("d", (64, 128, 192, 256))
def test_every_compiled_config_serves_some_call(d):
    reached = {serves(d, causal, s) for causal in (False, True) for s in PROBES}
    assert compiled(d) == reached, (d, sorted(compiled(d) - reached))


def test_the_model_reads_the_known_rows():
    # Spot checks against the grid comments in fwd_sm90.h: d = 192 runs its Multi config for
    # every call; d = 256 causal runs Multi to 2048 keys, its causal config beyond; d = 128
    # non-causal runs Full to 4096 keys and FullLong beyond; d = 64 non-causal runs Multi to 4096.
    assert {serves(192, c, s) for c in (False, True) for s in PROBES} == {"kFwdSm90Hdim192Multi"}
    assert serves(256, True, 2048) == "kFwdSm90Hdim256Multi"
    assert serves(256, True, 4096) == "kFwdSm90Hdim256"
    assert serves(128, False, 4096) == "kFwdSm90Hdim128Full"
    assert serves(128, False, 8192) == "kFwdSm90Hdim128FullLong"
    assert serves(64, False, 4096) == "kFwdSm90Hdim64Multi"
    assert serves(64, False, 8192) == "kFwdSm90Hdim64"


def lean_softmax_on(name):
    """FwdSm90Config's 20th field (lean_softmax), false where the initializer stops before it."""
    fields = initializer("Fwd", name)
    return len(fields) >= 20 and fields[19] == "true"


def test_lean_softmax_where_it_was_measured():
    # Measured faster on the d = 128 non-causal rows and the d = 192 non-causal calls, slower at
    # d = 64 and 256 (docs/perf-log.md, "Measured 2026-12-07, fourth run" and "fifth run").
    for d, causal, seqlen_k in ((128, False, 1024), (128, False, 16384), (192, False, 1024),
                                (192, False, 16384)):
        assert lean_softmax_on(serves(d, causal, seqlen_k)), (d, causal, seqlen_k)
    for d in (64, 256):
        for causal in (False, True):
            for s in PROBES:
                assert not lean_softmax_on(serves(d, causal, s)), (d, causal, s)
