"""The Hopper kernels' config headers as text, for the CPU tests that read which config a table
row or a call runs (tests/cpu/test_candidates.py, tests/cpu/test_fwd_dispatch.py)."""
import functools
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = {"Fwd": "csrc/fwd_sm90/fwd_sm90.h", "Bwd": "csrc/bwd_sm90/bwd_sm90.h"}


@functools.lru_cache(maxsize=None)
def header_text(kind):
    """The checkout's header of "Fwd" or "Bwd" configs (read once per test session)."""
    with open(os.path.join(ROOT, HEADERS[kind])) as f:
        return f.read()


def initializer(kind, name):
    """The brace list of config `name` in its header, as stripped tokens."""
    m = re.search(r"constexpr %sSm90Config %s = \{([^}]*)\};" % (kind, name), header_text(kind))
    assert m, name
    return [t.strip() for t in m.group(1).split(",")]
