"""TMA: tensor maps of rank 2-5 (bf16/fp32, 128B swizzle or none), loads on an mbarrier, stores,
tensor reduce-add, bulk reduce-add of fp32, multicast loads in a cluster. Compared with PyTorch."""
import pytest

torch = pytest.importorskip("torch")

from hopper_lib import check, ints, ptr  # noqa: E402
from ctypes import c_longlong  # noqa: E402

pytestmark = pytest.mark.gpu


def box_of(src, coord, box):
    """The TMA box at `coord` (innermost first) of `src` (torch order: outermost first);
    out-of-bounds elements read as zero, like TMA loads."""
    rank = len(box)
    out = torch.zeros(tuple(reversed(box)), dtype=src.dtype, device=src.device)
    src_sl, out_sl = [], []
    for axis in range(rank):  # torch axis `axis` is TMA dim rank-1-axis
        d = rank - 1 - axis
        lo, hi = coord[d], coord[d] + box[d]
        clo, chi = max(lo, 0), min(hi, src.shape[axis])
        src_sl.append(slice(clo, chi))
        out_sl.append(slice(clo - lo, chi - lo))
    out[tuple(out_sl)] = src[tuple(src_sl)]
    return out, src_sl, out_sl


def swizzle128(raw):
    """Byte image of a 1024-aligned 128B-swizzled tile: in 128-byte line L, 16-byte chunk c is
    stored at chunk c ^ (L % 8)."""
    lines = raw.view(-1, 8, 16)
    n = lines.shape[0]
    perm = torch.arange(8, device=raw.device)[None, :] ^ (torch.arange(n, device=raw.device) % 8)[:, None]
    return torch.gather(lines, 1, perm[:, :, None].expand(n, 8, 16)).reshape(-1)


def make_case(rank, dtype, sw):
    esize = 2 if dtype == torch.bfloat16 else 4
    inner_box = (128 if sw else 32) // esize
    dims = [inner_box * 2 + 8] + [5 + i for i in range(1, rank)]
    box = [inner_box] + [16 if rank == 2 else 2] * (rank - 1)
    if rank == 2:
        dims[1] = 40
    # Load: innermost box hangs 8 elements past the end; last dim's box partly out of bounds too.
    load = [dims[0] - inner_box + 8] + [1] * (rank - 2) + [dims[-1] - box[-1] + 1]
    # Store: in bounds except the last dim, which starts on the final slice.
    store = [0] * (rank - 1) + [dims[-1] - 1]
    return dims, box, load, store


CASES = [(r, dt, sw, 0) for r in (2, 3, 4, 5) for dt in ("bf16", "f32") for sw in (0, 1)]
# The same loads after an L2 prefetch of their (partly out-of-bounds) box: no fault, same bytes.
CASES += [(r, "bf16", 1, 1) for r in (2, 4)]
# Loads with an L2 cache policy (2: evict_last, 4: evict_first; hopper::tma_load_hint): same bytes.
CASES += [(r, dt, 1, pf) for r in (2, 4) for dt in ("bf16", "f32") for pf in (2, 4)]
# ... after a prefetch with the same policy (rank 4; hopper::tma_prefetch_l2_hint).
CASES += [(4, "bf16", 1, 3), (4, "f32", 1, 5)]
FLAGS = {0: "", 1: "-prefetch", 2: "-evict_last", 4: "-evict_first", 3: "-prefetch-evict_last",
         5: "-prefetch-evict_first"}


@pytest.mark.parametrize("rank,dt,sw,prefetch", CASES,
                         ids=[f"rank{r}-{d}-{'sw128' if s else 'noswz'}{FLAGS[pf]}" for r, d, s, pf in CASES])
def test_tma_load_store(hlib, rank, dt, sw, prefetch):
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    dims, box, load, store = make_case(rank, dtype, sw)
    shape = tuple(reversed(dims))
    src = torch.randn(shape, device="cuda", dtype=dtype)
    dst = torch.randn(shape, device="cuda", dtype=dtype)
    dst0 = dst.clone()
    box_bytes = int(torch.tensor(box).prod()) * src.element_size()
    raw = torch.full((box_bytes,), 0xAB, dtype=torch.uint8, device="cuda")
    rc = hlib.fbh_tma_load_store(ptr(src), ptr(raw), ptr(dst), int(dt == "f32"), rank,
                                 ints(dims, c_longlong), ints(box), ints(load), ints(store), sw, prefetch)
    check(hlib, rc, "fbh_tma_load_store")

    tile, _, _ = box_of(src, load, box)
    expect_raw = tile.contiguous().view(torch.uint8).reshape(-1)
    if sw:
        expect_raw = swizzle128(expect_raw)
    assert torch.equal(raw, expect_raw), "shared-memory image of the TMA box differs"

    expect_dst = dst0.clone()
    region, src_sl, out_sl = box_of(dst0, store, box)  # only for the clipped slices
    expect_dst[tuple(src_sl)] = tile[tuple(out_sl)]
    assert torch.equal(dst, expect_dst), "TMA store wrote the wrong elements"


def test_tma_encode_rejects_bad_arguments(hlib):
    x = torch.zeros(64 * 64, device="cuda", dtype=torch.bfloat16)

    def enc(dims, strides, box, sw, base=x.data_ptr(), f32=0):
        return hlib.fbh_tma_encode(base, f32, len(dims), ints(dims, c_longlong), ints(strides or [0], c_longlong),
                                   ints(box), sw)

    assert enc([64, 64], [128], [64, 64], 1) == 0
    assert enc([64, 64], [128], [128, 8], 1) != 0  # inner box 256 B > 128B swizzle span
    assert enc([64, 64], [128], [64, 257], 0) != 0  # box dim > 256
    assert enc([64, 64], [100], [64, 8], 0) != 0  # stride not a multiple of 16
    assert enc([64, 64], [128], [64, 8], 0, base=x.data_ptr() + 8) != 0  # base not 16-B aligned


@pytest.mark.parametrize("sw", [0, 1], ids=["noswz", "sw128"])
def test_tma_reduce_add(hlib, sw):
    rows, cols, box_rows, box_cols, ncta = 40, 72, 16, 32, 3
    c0, c1 = 40, 30  # rows 30..45: the last 6 are past the end and must be skipped
    src = torch.randn(ncta * box_rows, box_cols, device="cuda")
    dst = torch.randn(rows, cols, device="cuda")
    expect = dst.clone()
    expect[c1:rows, c0:c0 + box_cols] += src.view(ncta, box_rows, box_cols).sum(0)[: rows - c1]
    rc = hlib.fbh_tma_reduce_add(ptr(src), ptr(dst), rows, cols, box_rows, box_cols, ncta, c0, c1, sw)
    check(hlib, rc, "fbh_tma_reduce_add")
    torch.testing.assert_close(dst, expect, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("n,ncta", [(4096, 4), (1000, 7), (16, 1)])
def test_bulk_reduce_add_f32(hlib, n, ncta):
    src = torch.randn(ncta, n, device="cuda")
    dst = torch.randn(n, device="cuda")
    expect = dst + src.sum(0)
    rc = hlib.fbh_bulk_reduce_add_f32(ptr(src), ptr(dst), n, ncta)
    check(hlib, rc, "fbh_bulk_reduce_add_f32")
    torch.testing.assert_close(dst, expect, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("n,ncta", [(4096, 8), (1000, 5)])
def test_ordered_bulk_reduce_is_the_sequential_sum(hlib, n, ncta):
    """Bulk reduces handed on by acquire / release turns (the deterministic dQ warp's pattern)
    land in turn order: the result is the fp32 sum taken in that order, bitwise."""
    src = torch.randn(ncta, n, device="cuda") * 1e3
    dst = torch.randn(n, device="cuda")
    expect = dst.clone()
    for b in range(ncta):
        expect = expect + src[b]
    turn = torch.zeros(1, dtype=torch.int32, device="cuda")
    rc = hlib.fbh_ordered_bulk_reduce_add_f32(ptr(src), ptr(dst), ptr(turn), n, ncta)
    check(hlib, rc, "fbh_ordered_bulk_reduce_add_f32")
    assert int(turn.item()) == ncta
    assert torch.equal(dst, expect), f"{int((dst != expect).sum())} elements differ from the ordered sum"


@pytest.mark.parametrize("n,ncta", [(1000, 3), (4096, 600)])
def test_last_arrival_sees_every_row(hlib, n, ncta):
    """A count by atom.acq_rel (the dQ conversion queue's): exactly one CTA counts last, and it
    reads every other CTA's stores (its sum of the rows is the sequential one, bitwise)."""
    src = torch.randn(ncta, n, device="cuda")
    rows = torch.full_like(src, float("nan"))
    out = torch.full((n,), float("nan"), device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    lasts = torch.zeros(1, dtype=torch.int32, device="cuda")
    rc = hlib.fbh_last_arrival_sum(ptr(src), ptr(rows), ptr(out), ptr(counter), ptr(lasts), n, ncta)
    check(hlib, rc, "fbh_last_arrival_sum")
    expect = torch.zeros(n, device="cuda")
    for b in range(ncta):
        expect = expect + src[b]
    assert int(counter.item()) == ncta
    assert int(lasts.item()) == 1
    assert torch.equal(out, expect), f"{int((out != expect).sum())} sums differ"


@pytest.mark.parametrize("n", [64, 1000, 16])
def test_bulk_load(hlib, n):
    src = torch.randn(n, device="cuda")
    dst = torch.full((n,), float("nan"), device="cuda")
    check(hlib, hlib.fbh_bulk_load(ptr(src), ptr(dst), n), "fbh_bulk_load")
    assert torch.equal(dst, src)


@pytest.mark.parametrize("cluster_size", [2, 4])
@pytest.mark.parametrize("sw", [0, 1], ids=["noswz", "sw128"])
def test_tma_multicast(hlib, cluster_size, sw):
    rows, nclusters = 64, 3
    src = torch.randn(nclusters * rows, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(nclusters * cluster_size, rows * 128, dtype=torch.uint8, device="cuda")
    rc = hlib.fbh_tma_multicast(ptr(src), ptr(out), rows, cluster_size, nclusters, sw)
    check(hlib, rc, "fbh_tma_multicast")
    for cta in range(nclusters * cluster_size):
        q = cta // cluster_size
        expect = src[q * rows:(q + 1) * rows].contiguous().view(torch.uint8).reshape(-1)
        if sw:
            expect = swizzle128(expect)
        assert torch.equal(out[cta], expect), f"CTA {cta} of cluster {q} holds the wrong tile"


@pytest.mark.parametrize("delay", [0, 200000], ids=["together", "late-arm"])
def test_tma_multicast_4d(hlib, delay):
    """The attention kernels' form: a 64-row tile of four 64-column boxes of a rank-4 tensor,
    each CTA of a pair issuing two of the boxes to both; a tile half past the rows arrives as
    zeros in both CTAs. late-arm: one CTA announces its bytes only after its partner's boxes
    have landed."""
    seqlen, heads, batch, nclusters = 160, 3, 2, 6
    src = torch.randn(batch, heads, seqlen, 256, device="cuda", dtype=torch.bfloat16)
    out = torch.full((2 * nclusters, 4 * 64 * 128), 0xA5, dtype=torch.uint8, device="cuda")
    check(hlib, hlib.fbh_tma_multicast_4d(ptr(src), ptr(out), seqlen, heads, batch, nclusters, delay),
          "fbh_tma_multicast_4d")
    padded = torch.cat([src, torch.zeros(batch, heads, 64, 256, device="cuda", dtype=src.dtype)], dim=2)
    for cta in range(2 * nclusters):
        q = cta // 2
        row0 = (0, 64, seqlen - 32)[q % 3]
        rows = padded[q % batch, q % heads, row0:row0 + 64]
        expect = torch.cat([swizzle128(rows[:, 64 * a:64 * (a + 1)].contiguous().view(torch.uint8).reshape(-1))
                            for a in range(4)])
        assert torch.equal(out[cta], expect), f"CTA {cta} (rank {cta % 2}) of cluster {q} holds the wrong tile"
