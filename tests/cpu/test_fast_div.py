"""The multiply-shift division of csrc/common/fast_div.h (FastDiv), computed here with the same
32-bit arithmetic as the GPU: exact for every divisor and dividend the forward's tile decode
can meet (0 <= n < 2^31, 1 <= d < 2^31), edges of each quotient step included."""
import random

import pytest

MASK = (1 << 32) - 1


def fast_div_of(d):
    """FastDiv::of: l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1, as uint32."""
    l = 0
    while (1 << l) < d:
        l += 1
    m = ((1 << 32) * ((1 << l) - d)) // d + 1
    assert m <= MASK, f"multiplier of {d} does not fit 32 bits"
    return m, l


def fast_div(n, m, l):
    """FastDiv::div: (umulhi(n, m) + n) >> l in uint32 arithmetic."""
    hi = (n * m) >> 32
    s = (hi + n) & MASK
    return s >> l


def check(d, ns):
    m, l = fast_div_of(d)
    for n in ns:
        assert fast_div(n, m, l) == n // d, f"{n} / {d}: got {fast_div(n, m, l)}, expected {n // d}"


def edges(d):
    top = (1 << 31) - 1
    ns = {0, 1, d - 1, d, d + 1, top, top - 1, top - top % d, top - top % d - 1}
    for k in (2, 3, 7, 1000, top // d):
        ns.update({k * d - 1, k * d, k * d + 1})
    return [n for n in ns if 0 <= n <= top]


@pytest.mark.parametrize("d", list(range(1, 300)) + [1 << k for k in range(31)] +
                         [(1 << k) + 1 for k in range(1, 31)] + [(1 << k) - 1 for k in range(2, 32)])
def test_small_and_power_of_two_divisors(d):
    check(d, edges(d) + list(range(0, 4 * d + 3)) if d < 300 else edges(d))


def test_random_divisors():
    rng = random.Random(1234)
    for _ in range(3000):
        d = rng.randrange(1, 1 << 31)
        ns = edges(d) + [rng.randrange(0, 1 << 31) for _ in range(40)]
        check(d, ns)


def test_the_formula_fails_without_the_plus_one():
    """The check can fail: the multiplier one lower gives wrong quotients for some divisor."""
    wrong = 0
    for d in range(3, 200):
        m, l = fast_div_of(d)
        wrong += sum(fast_div(n, m - 1, l) != n // d for n in edges(d))
    assert wrong > 0
