#!/usr/bin/env python3
"""Attention benchmark: flashback against PyTorch SDPA (flash, cuDNN, memory-efficient) and FA3.

Sweep (docs/design.md section 6): head dim 256, bf16, 8 heads, 16384 tokens in total:
(batch, seqlen) = (4, 4096), (2, 8192), (1, 16384); causal and not. --seqlens short times the
short-sequence sweep instead, (32, 512), (16, 1024), (8, 2048), where per-CTA and per-call costs
weigh most; --seqlens all both.

Convention (FlashAttention's benchmarks): forward FLOPs = 4 * batch * seqlen^2 * nheads * headdim,
halved when causal; backward FLOPs = 2.5 x forward. TFLOP/s = FLOPs / median time.

Timing: CUDA events around each call; the median of --iters (default 100) timed calls after
--warmup calls, repeated three times in one process (the three numbers of "tflops"). The
repeats are interleaved: each repeat times every implementation once, on odd repeats with all
but the first in reverse order, so a clock boost after a lighter kernel does not always favour
the same one.
- fwd: one forward call with autograd recording (the training forward).
- bwd: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) after one forward, i.e. the
  user-visible path including each library's preprocess/postprocess kernels.
- train: forward then torch.autograd.grad of its output, one training step of the attention
  (3.5x the forward FLOPs).
- impl "flashback_bwd_call": the raw flashback.attention_backward(dout, q, k, v, out, lse) call.
With --cold-l2 a 256 MB buffer is zeroed before every timed call, outside its events (as Triton's
do_bench does): the L2 then holds neither the inputs nor the kernel's code, as after the other
kernels of a training step.
With --sample-clock MS a thread reads the SM clock every MS milliseconds while a run's calls
execute; each row records the mean per run and the table adds ours/fa3/MHz (at the power cap two
runs of one kernel differ mostly by the clock they got).
With --alternate the implementations of a point are timed call by call in turn instead of run by
run, so that all meet the same clock (ratios within ~1% across repeats at the power cap, where
runs move by 10%); with --builds A=PATH,B=PATH it times flashback once per build of the library,
all loaded in one process, and adds B/A (an A/B of two builds at that resolution).
Inputs are fresh torch.randn, stored (batch, seqlen, nheads, headdim); SDPA gets (b, h, s, d)
views of the same memory (its causal mask is top-left: the same here, seqlen_q == seqlen_k).
The yardstick is SDPA's flash backend; the table shows ours/yardstick and, where the run timed
them, ours/fa3 (the same run's fraction of FA3) and det/ours (the deterministic mode against the
default; its forward runs the same kernels).

Results: <out>/<YYYY-MM-DD>-<gpu>-<commit>[-<tag>].json (written after every shape, so a run that
is cut short keeps what it measured; the tag names a non-default sweep, e.g. "short-d64-128")
and, with --plot, a PNG of the same name.

  python3 benchmarks/bench_attention.py [--quick] [--plot] [--impls flashback,sdpa_flash] [--out DIR]
  python3 benchmarks/bench_attention.py --summarize RESULTS.json [--plot]

Without an sm_90 GPU (or without a loadable flashback, when it is asked for) it says so and exits 0.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

DEVICE = "cuda"
HEADDIM = 256  # the default sweep's head dim
NHEADS = 8
HEADDIMS = (64, 128, 192, 256)
DTYPES = ("bf16", "fp16")


def nheads_for(headdim):
    """FlashAttention's benchmark convention: a model width of 2048 (8 heads at d = 256)."""
    return 2048 // headdim
SHAPES = ((4, 4096), (2, 8192), (1, 16384))  # (batch, seqlen): 16384 tokens each
TOKENS = 16384
# --seqlens: the main sweep, the short-sequence sweep (batch x seqlen = 16384 tokens too), or both.
SEQLEN_SETS = {"main": (4096, 8192, 16384), "short": (512, 1024, 2048)}
SEQLEN_SETS["all"] = SEQLEN_SETS["short"] + SEQLEN_SETS["main"]


def shapes_for(seqlens):
    """(batch, seqlen) pairs of TOKENS tokens each."""
    return tuple((TOKENS // s, s) for s in seqlens)
IMPLS = ("flashback", "flashback_det", "sdpa_flash", "cudnn", "sdpa_efficient", "fa3")
# The default run leaves out SDPA's memory-efficient backend: at ~40 TFLOP/s it alone would take
# most of the sweep's time, and its numbers are in docs/perf-log.md. "--impls all" adds it,
# and flashback_det (deterministic=True: the Hopper backward with its dQ adds in a fixed order).
DEFAULT_IMPLS = ("flashback", "sdpa_flash", "cudnn", "fa3")
BWD_CALL = "flashback_bwd_call"  # extra rows of impl "flashback": the raw attention_backward call
YARDSTICK = "sdpa_flash"
COLUMNS = ("flashback", BWD_CALL, "flashback_det", "sdpa_flash", "cudnn", "sdpa_efficient", "fa3")  # table order
OURS = ("flashback", "flashback_det")
# --builds LABEL=PATH,...: flashback's implementations once per build of the library, named
# "flashback@LABEL" (and "flashback_det@LABEL"), all in one process and timed call by call in turn
# (--alternate), so that an A/B of two builds meets one clock. label -> path; the loaded
# libraries in BUILD_LIBS.
BUILDS = {}
BUILD_LIBS = {}


def base_impl(impl):
    """The implementation without its build label: "flashback@B" -> "flashback"."""
    return impl.split("@", 1)[0]


# The words of a result file's method that say its dtypes were timed in turn (run_sweep writes
# them, format_table reads them to pair fp16 / bf16 per repeat).
DTYPES_IN_TURN = "of a point timed in turn too"


def split_dtype(label):
    """(impl, dtype) of "impl#dtype" (--alternate with several --dtypes: a point's dtypes timed in
    turn, each implementation once per dtype), (label, None) without one."""
    impl, _, dtype = label.partition("#")
    return impl, dtype or None


def build_label(impl):
    """The build label of "flashback@B" ("B"), or None."""
    return impl.split("@", 1)[1] if "@" in impl else None


def parse_builds(text):
    """{label: path} from "A=path,B=path" (labels of letters, digits, '_', '-', '.'); ValueError
    on a malformed entry or a repeated label."""
    builds = {}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        label, eq, path = item.partition("=")
        if not eq or not path or not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
            raise ValueError(f"{item!r} is not LABEL=PATH")
        if label in builds:
            raise ValueError(f"build label {label!r} given twice")
        builds[label] = path
    if len(builds) < 2:
        raise ValueError("--builds takes at least two LABEL=PATH entries")
    return builds


def expand_builds(impls, labels):
    """flashback / flashback_det replaced by one implementation per build label, in order."""
    out = []
    for impl in impls:
        out += [f"{impl}@{label}" for label in labels] if impl in OURS else [impl]
    return out


def paired_ratio(first_ms, later_ms):
    """later's speed over first's at one point: the median over repeats of first_ms[r] /
    later_ms[r] (both timed in the same alternated rounds, so each repeat's pair shares the
    clock); the ratio of the medians where the repeat counts differ."""
    pairs = [a / b for a, b in zip(first_ms, later_ms) if a and b]
    if pairs and len(first_ms) == len(later_ms):
        return statistics.median(pairs)
    if not (first_ms and later_ms):
        return None
    a, b = statistics.median(first_ms), statistics.median(later_ms)
    return a / b if a and b else None


def in_build(impl, fn):
    """fn, run under impl's build of the library where it names one (--builds)."""
    label = build_label(impl)
    if label is None:
        return fn
    from flashback import _lib
    lib = BUILD_LIBS[label]

    def call():
        with _lib.using(lib):
            return fn()
    return call

# ----------------------------------------------------------------------------------------------
# Convention, naming and the result file (no GPU needed: unit-tested on the CPU)


DIRECTIONS = ("fwd", "bwd", "train")
# The order of a table's rows and a plot's panels: backward first.
SHOWN_ORDER = {"bwd": 0, "fwd": 1, "train": 2}


def attention_flops(batch, seqlen, nheads, headdim, causal, direction, seqlen_k=None):
    """FlashAttention's convention: forward 4*b*sq*sk*h*d (halved when causal), backward 2.5x,
    a training step ("train": forward + backward) 3.5x."""
    sk = seqlen if seqlen_k is None else seqlen_k
    fwd = 4 * batch * seqlen * sk * nheads * headdim
    if causal:
        fwd //= 2
    if direction == "fwd":
        return fwd
    if direction == "bwd":
        return fwd * 5 // 2
    if direction == "train":
        return fwd * 7 // 2
    raise ValueError(f"direction must be 'fwd', 'bwd' or 'train', got {direction!r}")


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def gpu_slug(device_name):
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA GH200 480GB' -> 'gh200'."""
    words = [w for w in re.split(r"[\s_]+", device_name.lower()) if w not in ("nvidia", "tesla", "geforce", "rtx")]
    slug = re.sub(r"[^a-z0-9]+", "-", words[0] if words else "").strip("-")
    return slug or "gpu"


def git_commit(repo=REPO):
    """The commit results are named by: FLASHBACK_COMMIT if set, else the one the loaded library
    was built from (flashback.build_commit(): a copy of the tree whose .git lags behind its
    files named results by a stale HEAD), else the short commit of the tree; 'unknown' when
    none is there."""
    env = os.environ.get("FLASHBACK_COMMIT", "").strip()
    if env:
        return env
    try:
        import flashback
        built = flashback.build_commit()
        if built and built != "unknown":
            return built
    except Exception:  # noqa: BLE001 - no library here (CPU-only use of this module)
        pass
    try:
        res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = res.stdout.strip()
    return commit if res.returncode == 0 and commit else "unknown"


def result_filename(device_name, commit, date, tag=""):
    """<date>-<gpu>-<commit>[-<tag>].json; the tag names a sweep other than the default one, so
    that a short-sequence or head-dim run of the same day and commit does not overwrite it."""
    return f"{date}-{gpu_slug(device_name)}-{commit}{'-' + tag if tag else ''}.json"


def sweep_tag(seqlens, headdims, dtypes):
    """'' for the default sweep, else e.g. 'short-d64-128-fp16'."""
    parts = []
    if tuple(seqlens) != SEQLEN_SETS["main"]:
        named = [k for k, v in SEQLEN_SETS.items() if tuple(seqlens) == v]
        parts.append(named[0] if named else "s" + "-".join(map(str, seqlens)))
    if tuple(headdims) != (HEADDIM,):
        parts.append("d" + "-".join(map(str, headdims)))
    if tuple(dtypes) != ("bf16",):
        parts.append("-".join(dtypes))
    return "-".join(parts)


def make_payload(device, commit, date, torch_version, results, **extra):
    """The result schema: {device, commit, date, torch, results: [{impl, direction, causal, batch,
    seqlen, nheads, headdim, tflops: [run1, run2, run3]}]}. Rows may carry more keys (ms, path, gpu:
    the SM clock and power sampled after each run's timing, a list per run; older files hold one
    sample);
    extra top-level keys (notes, method) are allowed."""
    payload = {"device": device, "commit": commit, "date": date, "torch": torch_version, "results": results}
    payload.update(extra)
    return payload


def result_row(impl, direction, causal, batch, seqlen, nheads, headdim, ms_runs, dtype="bf16"):
    flops = attention_flops(batch, seqlen, nheads, headdim, causal, direction)
    return {"impl": impl, "direction": direction, "causal": bool(causal), "batch": batch, "seqlen": seqlen,
            "nheads": nheads, "headdim": headdim, "dtype": dtype,
            "tflops": [round(tflops(flops, ms), 2) for ms in ms_runs],
            "ms": [round(ms, 4) for ms in ms_runs]}


def write_results(out_dir, payload):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, result_filename(payload["device"], payload["commit"], payload["date"],
                                                 payload.get("tag", "")))
    # One result row per line: readable, and diffs of committed results stay small.
    head = {k: v for k, v in payload.items() if k != "results"}
    text = json.dumps(head, indent=1)[:-2] + ',\n "results": [\n'
    text += ",\n".join("  " + json.dumps(r) for r in payload["results"])
    text += "\n ]\n}\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def row_gpu_mean(r, key):
    """Mean of `key` over the GPU states of a result row's runs, or None where no run has it."""
    vals = [g[key] for g in r.get("gpu") or [] if isinstance(g, dict) and g.get(key)]
    return statistics.mean(vals) if vals else None


def row_mj_per_call(r):
    """Mean NVML energy per call of a result row's runs (mJ), or None where it was not read."""
    return row_gpu_mean(r, "mj_per_call")


def row_clock_mhz(r):
    """Mean SM clock over a result row's runs while they ran (MHz, --sample-clock), or None."""
    return row_gpu_mean(r, "sm_clock_mean_mhz")


# A ratio is marked when the repeats of either side spread by more than this (max / min): at
# seqlen <= 1024 a call can take about as long as the host's work for it, and a slower host then
# halves a whole repeat of flashback and FA3 alike (seen on an H200 host: 267 / 271 / 488 TFLOP/s),
# while the C++-launched yardstick stays put; at the power cap repeats swing by up to ~15%.
UNSTEADY_SPREAD = 1.25


def spread(tflops):
    """max / min of a row's repeats (1.0 for one repeat or none)."""
    runs = [t for t in tflops if t]
    return max(runs) / min(runs) if len(runs) > 1 else 1.0


def format_table(payload):
    """Median TFLOP/s per implementation; ours/yardstick = flashback / sdpa_flash; where the run
    timed FA3, ours/fa3 = flashback / fa3; where it timed the deterministic mode, det/ours =
    flashback_det / flashback; where the rows carry energy per call for flashback and FA3, its
    ratio (mJ ours / mJ FA3 per call: above 1, ours spends more energy on the same work, which at
    the power cap costs clock); where they carry the clock sampled during the runs
    (--sample-clock), ours/fa3/MHz (each side's TFLOP/s over its mean clock). A ratio whose two
    sides include a repeat spread above UNSTEADY_SPREAD is marked "?", with a note under the
    table."""
    rows = payload["results"]
    def point(r):
        return (r["headdim"], r.get("dtype", "bf16"), r["direction"], bool(r["causal"]), r["batch"], r["seqlen"])

    med = {(r["impl"],) + point(r): statistics.median(r["tflops"]) for r in rows}
    ms_of = {(r["impl"],) + point(r): r.get("ms") or [] for r in rows}
    unsteady = {(r["impl"],) + point(r) for r in rows if spread(r["tflops"]) > UNSTEADY_SPREAD}
    marked = 0
    def per_point(read):
        """read(row) per (impl, point), and whether both flashback's and FA3's rows have it."""
        values = {(r["impl"],) + point(r): read(r) for r in rows}
        return values, all(any(v for k, v in values.items() if k[0] == impl) for impl in ("flashback", "fa3"))
    energy, with_energy = per_point(row_mj_per_call)
    clock, with_clock = per_point(row_clock_mhz)
    order_of = {label: i for i, label in enumerate(payload.get("builds", {}))}  # --builds, as given
    built = sorted(dict.fromkeys(r["impl"] for r in rows if build_label(r["impl"])),
                   key=lambda i: order_of.get(build_label(i), len(order_of)))
    impls = [i for c in COLUMNS for i in [c] + [b for b in built if base_impl(b) == c] if any(r["impl"] == i for r in rows)]
    impls += sorted({r["impl"] for r in rows} - set(impls))
    # "ours" in the ratios: flashback, or with --builds the first build's.
    ours_impl = "flashback" if "flashback" in impls else next((i for i in impls if base_impl(i) == "flashback"),
                                                              "flashback")
    # --builds: each later build over the first, per implementation (a column "B/A").
    firsts = {}
    for i in impls:
        if build_label(i):
            firsts.setdefault(base_impl(i), i)
    keys = sorted({point(r) for r in rows},
                  key=lambda k: (k[0], k[1], SHOWN_ORDER.get(k[2], 3), not k[3], k[5]))
    # Ratios to flashback's median: (column, the other implementation, flashback divided by it).
    ratios = [("ours/yardstick", YARDSTICK, True)]
    if "fa3" in impls:
        ratios.append(("ours/fa3", "fa3", True))
    if "flashback_det" in impls:
        ratios.append(("det/ours", "flashback_det", False))
    build_ratios = [(f"{build_label(i)}/{build_label(firsts[base_impl(i)])}"
                     f"{'(det)' if base_impl(i) == 'flashback_det' else ''}", i, firsts[base_impl(i)])
                    for i in impls if build_label(i) and i != firsts[base_impl(i)]]
    # Both dtypes at a point: fp16 over bf16 per implementation named here, on the fp16 row; per
    # repeat (paired_ratio) where the dtypes were timed in turn (each repeat's pair shares the
    # clock), else the medians' ratio (run by run the repeats of two dtypes share nothing).
    dtypes_in_turn = DTYPES_IN_TURN in str(payload.get("method", ""))
    dtype_ratios = [(name, impl) for name, impl in (("fp16/bf16", ours_impl), (f"fp16/bf16({YARDSTICK})", YARDSTICK))
                    if {k[2] for k in med if k[0] == impl} >= {"bf16", "fp16"}]
    head = (["dir", "d", "dtype", "causal", "batch", "seqlen"] + impls + [name for name, _, _ in ratios]
            + [name for name, _, _ in build_ratios] + [name for name, _ in dtype_ratios])
    if with_energy:
        head.append("mJ ours/fa3")
    if with_clock:
        head.append("ours/fa3/MHz")
    lines = [head]
    for d, dtype, direction, causal, batch, seqlen in keys:
        key = (d, dtype, direction, causal, batch, seqlen)
        vals = [med.get((i,) + key) for i in impls]
        ours = med.get((ours_impl,) + key)
        cells = []
        for _, other, ours_over_other in ratios:
            x = med.get((other,) + key)
            if not (ours and x):
                cells.append("-")
                continue
            mark = "?" if {(ours_impl,) + key, (other,) + key} & unsteady else ""
            marked += bool(mark)
            cells.append(f"{(ours / x if ours_over_other else x / ours):.3f}{mark}")
        for _, later, first in build_ratios:
            ratio = paired_ratio(ms_of.get((first,) + key, []), ms_of.get((later,) + key, []))
            mark = "?" if ratio and {(later,) + key, (first,) + key} & unsteady else ""
            marked += bool(mark)
            cells.append(f"{ratio:.3f}{mark}" if ratio else "-")
        for _, impl in dtype_ratios:
            bf16_key = (impl, d, "bf16") + key[2:]
            if dtype != "fp16":
                ratio = None
            elif dtypes_in_turn:
                ratio = paired_ratio(ms_of.get(bf16_key, []), ms_of.get((impl,) + key, []))
            else:
                ratio = (med.get((impl,) + key) or 0) / med[bf16_key] if med.get(bf16_key) else None
            cells.append(f"{ratio:.3f}" if ratio else "-")
        line = ([direction, str(d), dtype, "yes" if causal else "no", str(batch), str(seqlen)]
                + [f"{v:.1f}" if v is not None else "-" for v in vals] + cells)
        if with_energy:
            e_ours, e_fa3 = energy.get(("flashback",) + key), energy.get(("fa3",) + key)
            line.append(f"{e_ours / e_fa3:.3f}" if e_ours and e_fa3 else "-")
        if with_clock:
            c_ours, c_fa3, fa3 = clock.get(("flashback",) + key), clock.get(("fa3",) + key), med.get(("fa3",) + key)
            line.append(f"{(ours / c_ours) / (fa3 / c_fa3):.3f}" if c_ours and c_fa3 and ours and fa3 else "-")
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = [f"{payload.get('device', '?')}  commit {payload.get('commit', '?')}  {payload.get('date', '?')}  "
            f"torch {payload.get('torch', '?')}  (TFLOP/s, median of runs; headdim "
            f"{'/'.join(sorted({str(r['headdim']) for r in rows})) or '-'}, nheads "
            f"{'/'.join(sorted({str(r['nheads']) for r in rows})) or '-'})"]
    # The first column left-aligned, so that "dir" and each direction start their line.
    text += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
             for line in lines]
    text.append(path_summary(rows))
    if marked:
        text.append(f"?: {marked} ratio(s) with a side whose repeats spread by more than "
                    f"{UNSTEADY_SPREAD:.2f}x (max / min): a moving host, clock or neighbour, not a "
                    f"steady measurement; rerun, or time the GPU alone with --queue-ahead")
    notes = payload.get("notes", [])
    # Some committed result files carry one note as a plain string, not a list.
    for note in [notes] if isinstance(notes, str) else notes:
        text.append("note: " + note)
    return "\n".join(text)


def path_summary(rows):
    """One line on which kernels flashback ran (its rows record it as "path")."""
    seen = [r for r in rows if "path" in r]
    if not seen:
        return "flashback path: not recorded"
    off = [r for r in seen if r["path"] != "sm90"]
    if not off:
        return f"flashback path: sm90 on all {len(seen)} timed rows"
    return "flashback path: NOT sm90 on " + "; ".join(
        f"{r['impl']} {r['direction']} causal={r['causal']} {r['batch']}x{r['seqlen']}: {r['path']}"
        for r in off)


def plot(payload, png_path):
    """Grouped bars: TFLOP/s per shape per implementation, one panel per direction, head dim and
    dtype in the file (backward, forward, training step); the whiskers span the runs."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: matplotlib is not installed; no PNG written")
        return None
    rows = payload["results"]
    impls = [c for c in COLUMNS if any(r["impl"] == c for r in rows)]
    impls += sorted({r["impl"] for r in rows} - set(impls))
    colors = {impl: plt.get_cmap("tab10")(i % 10) for i, impl in enumerate(impls)}
    # A panel per (direction, head dim, dtype): a file of several head dims or dtypes (--headdims,
    # --dtypes) must not put one head dim's bars beside another's.
    panels = sorted({(r["direction"], r["headdim"], r.get("dtype", "bf16")) for r in rows},
                    key=lambda p: (SHOWN_ORDER.get(p[0], 3), p[1], p[2])) or [("bwd", HEADDIM, "bf16")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 4.5 * len(panels)), squeeze=False)
    for ax, (direction, headdim, dtype) in zip(axes[:, 0], panels):
        mine = [r for r in rows if (r["direction"], r["headdim"], r.get("dtype", "bf16")) == (direction, headdim, dtype)]
        keys = sorted({(bool(r["causal"]), r["batch"], r["seqlen"]) for r in mine}, key=lambda k: (not k[0], k[2]))
        present = [i for i in impls if any(r["impl"] == i for r in mine)]
        width = 0.8 / max(1, len(present))
        top = 0.0
        for j, impl in enumerate(present):
            xs, ys, lo, hi = [], [], [], []
            for i, key in enumerate(keys):
                r = next((r for r in mine if (r["impl"], bool(r["causal"]), r["batch"], r["seqlen"]) == (impl,) + key),
                         None)
                if r:
                    m = statistics.median(r["tflops"])
                    xs.append(i + (j - (len(present) - 1) / 2) * width)
                    ys.append(m)
                    lo.append(m - min(r["tflops"]))
                    hi.append(max(r["tflops"]) - m)
                    top = max(top, max(r["tflops"]))
            bars = ax.bar(xs, ys, width, yerr=[lo, hi], label=impl, color=colors[impl], capsize=2)
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{'causal' if c else 'full'}\n{b}x{s}" for c, b, s in keys])
        ax.set_ylabel(f"{direction} TFLOP/s")
        heads = sorted({r["nheads"] for r in mine})
        ax.set_title(f"{direction}, head dim {headdim}, {dtype}, {'/'.join(map(str, heads))} heads", fontsize=10)
        ax.set_ylim(0, max(1.0, top) * 1.25)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=len(present), loc="upper center")
    fig.suptitle(f"attention, {TOKENS} tokens — {payload.get('device', '?')}, commit {payload.get('commit', '?')}, "
                 f"{payload.get('date', '?')}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


# ----------------------------------------------------------------------------------------------
# The GPU part


def environment_problem(impls):
    """None when the benchmark can run, else why not."""
    try:
        import torch
    except ImportError as e:
        return f"PyTorch is not installed ({e})"
    if not torch.cuda.is_available():
        return f"no CUDA GPU found (torch {torch.__version__})"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"{torch.cuda.get_device_name()} is sm_{major}{minor}; this benchmark needs an sm_90 (Hopper) GPU"
    if any(base_impl(i) in OURS for i in impls):
        try:
            import flashback
        except Exception as e:  # noqa: BLE001 - any failure to import means: not available
            return f"flashback could not be imported ({type(e).__name__}: {e})"
        if not flashback.is_available():
            return ("flashback is not available: its library was not found or did not load "
                    "(build it into build/ and set FLASHBACK_LIBRARY=build/libflashback.so)")
        from flashback import _lib
        handles = {}
        for label, path in BUILDS.items():
            try:
                BUILD_LIBS[label] = _lib.load_file(path)
            except _lib.LibraryNotFoundError as e:
                return f"build {label} did not load: {e}"
            # The same file twice (or a link to it) loads once: its "A/B" would time one build.
            other = handles.setdefault(BUILD_LIBS[label]._handle, label)
            if other != label:
                return f"builds {other} and {label} are the same loaded file ({path}): copy it to compare a build with itself"
    return None


def _use_source_package():
    """Import flashback from this checkout's python/ when a library was built for it
    (FLASHBACK_LIBRARY set, or build/libflashback.so present); otherwise the installed package.
    A flashback package on PYTHONPATH wins over both: a library built from another tree needs
    the Python of that tree (the C structs must match)."""
    if any(os.path.isdir(os.path.join(d, "flashback"))
           for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d):
        return
    src = os.path.join(REPO, "python")
    built = os.environ.get("FLASHBACK_LIBRARY") or os.path.isfile(os.path.join(REPO, "build", "libflashback.so"))
    if built and os.path.isdir(os.path.join(src, "flashback")) and src not in sys.path:
        sys.path.insert(0, src)


def _forward_fn(impl, causal):
    """fn(q, k, v) -> out, all (batch, seqlen, nheads, headdim)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if base_impl(impl) in OURS:
        import flashback
        det = base_impl(impl) == "flashback_det"
        return lambda q, k, v: flashback.attention(q, k, v, causal=causal, deterministic=det)
    if impl == "fa3":
        from flash_attn_interface import flash_attn_func

        def fa3(q, k, v):
            res = flash_attn_func(q, k, v, causal=causal)
            return res[0] if isinstance(res, tuple) else res  # older versions return (out, lse)
        return fa3
    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[impl]

    def sdpa(q, k, v):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal)
        return out.transpose(1, 2)
    return sdpa


# --queue-ahead: the GPU first sleeps this long per timed call (clock cycles at ~2 GHz, 1.5 ms:
# longer than the host needs to issue one training step),
# so the host has queued every call before the first one runs.
QUEUE_AHEAD_CYCLES_PER_CALL = 3_000_000
QUEUE_AHEAD = False
# Millijoules per call of each run of the last time_ms (NVML's energy counter over the run /
# calls), empty where the counter cannot be read or the run slept first (QUEUE_AHEAD: the sleep
# would be counted). At the card's power cap the clock follows energy per call, so two kernels
# of equal speed at a free clock can differ there.
LAST_MJ_PER_CALL = []


def energy_mj():
    """The GPU's energy counter (mJ since the driver loaded), or None."""
    try:
        import pynvml
        import torch
        return pynvml.nvmlDeviceGetTotalEnergyConsumption(torch.cuda._get_pynvml_handler())
    except Exception:  # noqa: BLE001 - no NVML binding, or a GPU without the counter
        return None


# --sample-clock: seconds between SM clock readings taken while a run's calls execute (0: none).
# The reading after a run (gpu_state) sees the card already idle; the mean over the run is the
# clock the calls ran at, at the power cap the main difference between two runs of one kernel.
CLOCK_SAMPLE_S = 0.0
# Mean SM clock (MHz) of each run of the last time_ms, where sampled.
LAST_CLOCK_MHZ = []


class ClockSampler:
    """Reads `read()` (MHz) every `interval` seconds on a thread of its own between start() and
    stop(); stop() returns the mean of the readings, or None without any. A Python thread takes
    the interpreter lock for each reading, so it can delay the host's launches by a few
    microseconds: opt-in, and meant for calls the GPU, not the host, bounds."""

    def __init__(self, read, interval):
        self.read, self.interval = read, interval
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def _loop(self):
        while not self._stop.wait(self.interval):
            try:
                self.samples.append(self.read())
            except Exception:  # noqa: BLE001 - a failed reading is left out
                pass

    def start(self):
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return statistics.mean(self.samples) if self.samples else None


SIDE_STREAM = False  # --side-stream: the sweep runs on a stream of its own
ALTERNATE = False  # --alternate: implementations timed call by call in turn (time_alternating)
COLD_L2_BYTES = 0  # --cold-l2: bytes zeroed before every timed call (0: none)


def time_ms(fn, iters, warmup, repeats):
    """Median milliseconds of `iters` calls, measured with CUDA events per call, `repeats` times.

    Each event pair brackets one call on the GPU. When a call's kernels take less time than the
    host needs to issue the next call, the GPU waits for the host between the events and the
    pair measures host time too (what an eager program that cannot run ahead sees). With
    QUEUE_AHEAD (--queue-ahead) the GPU sleeps before each run until all its calls are queued,
    so the pairs measure GPU time only (what a program whose host runs ahead sees)."""
    import torch
    flush = torch.empty(COLD_L2_BYTES // 4, dtype=torch.int32, device=DEVICE) if COLD_L2_BYTES else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    runs = []
    LAST_MJ_PER_CALL.clear()
    LAST_CLOCK_MHZ.clear()
    for _ in range(repeats):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        if QUEUE_AHEAD:
            torch.cuda._sleep(QUEUE_AHEAD_CYCLES_PER_CALL * iters)
        e0 = None if QUEUE_AHEAD else energy_mj()
        # Not with QUEUE_AHEAD: the readings would include the sleep before the calls.
        sampler = (ClockSampler(torch.cuda.clock_rate, CLOCK_SAMPLE_S).start()
                   if CLOCK_SAMPLE_S > 0 and not QUEUE_AHEAD else None)
        for s, e in zip(starts, ends):
            if flush is not None:
                flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        e1 = energy_mj() if e0 is not None else None
        if e1 is not None:
            LAST_MJ_PER_CALL.append(round((e1 - e0) / iters, 3))
        mhz = sampler.stop() if sampler is not None else None
        if mhz is not None:
            LAST_CLOCK_MHZ.append(round(mhz, 1))
        runs.append(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)))
    return runs


def alternation_order(names, i, prev_last=None):
    """The order of the implementations in round `i` of an alternating run: as given in round 0,
    then a fixed shuffle per round (seeded by i, the same in every run), turned so that it does not
    start with `prev_last`, the previous round's last. So no call follows a call of its own
    implementation (with two, strictly A B A B), and over the rounds each one follows every other
    one: a kernel that leaves the card hot does not always hand over to the same successor."""
    import random
    names = list(names)
    order = names if i == 0 else random.Random(i).sample(names, len(names))
    if len(order) > 1 and order[0] == prev_last:
        order = order[1:] + order[:1]
    return order


def alternation_rounds(names, iters):
    """The orders of rounds 0 .. iters - 1 (alternation_order, each round after the last)."""
    rounds, last = [], None
    for i in range(iters):
        rounds.append(alternation_order(names, i, last))
        last = rounds[-1][-1] if rounds[-1] else None
    return rounds


def time_alternating(fns, iters, warmup, repeats):
    """{name: [median ms per repeat]} for several callables timed call by call in turn (--alternate):
    each of `iters` rounds runs every callable once, each call bracketed by its own CUDA events,
    in alternation_rounds' orders. At a card's power cap the clock drifts over a run by more than
    the differences being measured; calls milliseconds apart share the clock, so the ratio between
    implementations holds still even where each one's TFLOP/s does not. No energy or clock
    readings (the calls of all implementations share them). --cold-l2 zeroes the flush buffer
    before every call, outside its events; --queue-ahead sleeps before every chunk of rounds
    holding about `iters` calls, as many as time_ms queues at once."""
    import torch
    names = list(fns)
    flush = torch.empty(COLD_L2_BYTES // 4, dtype=torch.int32, device=DEVICE) if COLD_L2_BYTES else None
    for _ in range(warmup):
        for n in names:
            fns[n]()
    torch.cuda.synchronize()
    rounds = alternation_rounds(names, iters)
    per_chunk = max(1, iters // max(1, len(names))) if QUEUE_AHEAD else max(1, iters)
    runs = {n: [] for n in names}
    for _ in range(repeats):
        ev = {n: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(iters)] for n in names}
        for c0 in range(0, iters, per_chunk):
            c1 = min(iters, c0 + per_chunk)
            if QUEUE_AHEAD:
                torch.cuda._sleep(QUEUE_AHEAD_CYCLES_PER_CALL * (c1 - c0) * len(names))
            for i in range(c0, c1):
                for n in rounds[i]:
                    if flush is not None:
                        flush.zero_()
                    s, e = ev[n][i]
                    s.record()
                    fns[n]()
                    e.record()
        torch.cuda.synchronize()
        for n in names:
            runs[n].append(statistics.median(s.elapsed_time(e) for s, e in ev[n]))
    return runs


def measure_alternating(impls, q, k, v, dout, causal, iters, warmup, repeats, notes, directions=DIRECTIONS,
                        dtype_name="bf16", inputs=None):
    """({impl: {direction: [ms per repeat]}}, {impl: {direction: path}}): every direction timed with
    the implementations in alternation (time_alternating). An implementation that rejects the
    shape is left out with a note; an error while a direction is timed drops that direction for
    the point, with a note (the calls of all implementations are interleaved, so it cannot be
    pinned on one). The paths are flashback's (either mode), read after one more untimed call of
    that implementation alone, since the timed calls of the two modes interleave.
    `inputs` ({label: (q, k, v, dout)}, --alternate with several --dtypes) gives each label of
    `impls` ("impl#dtype", split_dtype) its own tensors, so that dtypes are timed in turn too."""
    import torch
    where = f"d={q.shape[-1]} {dtype_name} causal={causal} batch={q.shape[0]} seqlen={q.shape[1]}"
    args = {i: (inputs[i] if inputs else (q, k, v, dout)) for i in impls}
    fwds, outs = {}, {}
    for label in impls:
        impl = split_dtype(label)[0]
        q_, k_, v_, g_ = args[label]
        try:
            fwd = _forward_fn(impl, causal)
            out = in_build(impl, lambda: fwd(q_, k_, v_))()
            in_build(impl, lambda: torch.autograd.grad(out, (q_, k_, v_), g_, retain_graph=True))()
        except Exception as e:  # noqa: BLE001 - a backend that rejects the shape is skipped
            notes.append(f"{label} {where} skipped: {_short(e)}")
            print("note: " + notes[-1], flush=True)
            continue
        fwds[label], outs[label] = fwd, out
    res, paths = {label: {} for label in fwds}, {}
    for key in directions:
        if key == "fwd":
            fns = {i: (lambda f=f, a=args[i]: f(*a[:3])) for i, f in fwds.items()}
        elif key == "bwd":
            fns = {i: (lambda o=o, a=args[i]: torch.autograd.grad(o, a[:3], a[3], retain_graph=True))
                   for i, o in outs.items()}
        else:
            fns = {i: (lambda f=f, a=args[i]: torch.autograd.grad(f(*a[:3]), a[:3], a[3])) for i, f in fwds.items()}
        fns = {i: in_build(split_dtype(i)[0], fn) for i, fn in fns.items()}
        try:
            timed = time_alternating(fns, iters, warmup, repeats)
        except Exception as e:  # noqa: BLE001 - keep the point's other directions
            notes.append(f"{key} {where} with {', '.join(fns)} alternating failed: {_short(e)}")
            print("note: " + notes[-1], flush=True)
            torch.cuda.empty_cache()
            continue
        for impl, ms in timed.items():
            res[impl][key] = ms
        for impl in fns:
            if base_impl(split_dtype(impl)[0]) in OURS:
                import flashback
                fns[impl]()
                f, b = in_build(split_dtype(impl)[0],
                                lambda: (flashback.last_forward_path(), flashback.last_backward_path()))()
                paths.setdefault(impl, {})[key] = {
                    "fwd": f, "bwd": b, "train": "sm90" if f == b == "sm90" else f"forward {f}; backward {b}"}[key]
    return {impl: r for impl, r in res.items() if r}, paths


def warm_gpu(seconds):
    """Large bf16 matmuls for about `seconds` before the sweep's first timed call. A card coming
    from idle ramps its clock over the first fraction of a second, which otherwise lands on the
    first measured row (seen: its three repeats 103 / 117 / 143 TFLOP/s, the later rows steady)."""
    import time

    import torch
    if seconds <= 0:
        return
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            a = torch.matmul(a, a).clamp_(-1, 1)
        torch.cuda.synchronize()
    del a
    torch.cuda.empty_cache()


def gpu_state():
    """The GPU's SM clock (MHz) and power draw (W) now, read through NVML by PyTorch, or {} where
    that is not available. Sampled right after each timed measurement: a card at its power cap
    runs at a lower clock, which is one way two dtypes or two builds can differ in speed."""
    try:
        import torch
        state = {"sm_clock_mhz": int(torch.cuda.clock_rate()), "power_w": round(torch.cuda.power_draw() / 1000.0, 1)}
        if LAST_MJ_PER_CALL:  # the energy of the measurement just taken
            state["mj_per_call"] = statistics.mean(LAST_MJ_PER_CALL)
        if LAST_CLOCK_MHZ:  # the clock it ran at (--sample-clock)
            state["sm_clock_mean_mhz"] = statistics.mean(LAST_CLOCK_MHZ)
        return state
    except Exception:  # noqa: BLE001 - no GPU, no NVML binding, or an older PyTorch
        return {}


def measure(impl, q, k, v, dout, causal, iters, warmup, repeats, notes, paths=None, directions=DIRECTIONS,
            states=None):
    """{direction or BWD_CALL: [ms per run]} for one implementation on one shape. An error
    before anything is measured propagates (the caller skips the implementation); one in the
    extra flashback_bwd_call measurement becomes a note. For flashback, `paths` (a dict) gets
    the backward kernels that ran ("sm90" or "reference: why") per timed key. `directions`
    picks which of fwd, bwd, train are timed. `states` (a dict), when given, gets gpu_state()
    right after each timed key."""
    import torch
    if states is None:
        states = {}
    fwd = _forward_fn(impl, causal)
    out = fwd(q, k, v)  # also the check that the implementation takes the shape
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    ours = impl in ("flashback", "flashback_det") and paths is not None
    res = {}
    if "fwd" in directions:
        res["fwd"] = time_ms(lambda: fwd(q, k, v), iters, warmup, repeats)
        states["fwd"] = gpu_state()
        if ours:
            import flashback
            paths["fwd"] = flashback.last_forward_path()
    if "bwd" in directions:
        res["bwd"] = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), iters, warmup, repeats)
        states["bwd"] = gpu_state()
        if ours:
            import flashback
            paths["bwd"] = flashback.last_backward_path()
    del out
    if "train" in directions:
        # The training step as a model sees it: forward with autograd recording, then its backward.
        res["train"] = time_ms(lambda: torch.autograd.grad(fwd(q, k, v), (q, k, v), dout), iters, warmup, repeats)
        states["train"] = gpu_state()
        if ours:
            import flashback
            f, b = flashback.last_forward_path(), flashback.last_backward_path()
            paths["train"] = "sm90" if f == b == "sm90" else f"forward {f}; backward {b}"
    if impl == "flashback" and "bwd" in directions:
        import flashback
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        try:
            with torch.no_grad():
                o, lse = flashback.attention_forward(qd, kd, vd, causal=causal)
                res[BWD_CALL] = time_ms(lambda: flashback.attention_backward(dout, qd, kd, vd, o, lse, causal=causal),
                                        iters, warmup, repeats)
                if paths is not None:
                    paths[BWD_CALL] = flashback.last_backward_path()
        except Exception as e:  # noqa: BLE001
            notes.append(f"{BWD_CALL} causal={causal} batch={q.shape[0]} seqlen={q.shape[1]} failed: {_short(e)}")
            print("note: " + notes[-1], flush=True)
    return res


def _short(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


def repeat_order(impls, rep):
    """The order of the implementations in repeat `rep` of a point: as given on even repeats, on
    odd ones the first kept and the rest reversed. Over three repeats (the last of one repeat
    followed by the first of the next) each implementation then follows two different ones,
    where a rotation would keep every implementation's predecessor."""
    order = list(impls)
    return order[:1] + order[1:][::-1] if rep % 2 else order


def run_sweep(impls, iters, warmup, repeats, out_dir, want_plot, directions=DIRECTIONS, headdims=(HEADDIM,),
              dtypes=("bf16",), shapes=SHAPES, tag="", warm_seconds=1.0, causals=(True, False), preheat=0.0):
    import torch
    device = torch.cuda.get_device_name()
    payload = make_payload(device, git_commit(), datetime.date.today().isoformat(), torch.__version__, [],
                           notes=[], method=(f"FlashAttention FLOP convention (fwd 4*b*s^2*h*d, /2 causal; bwd 2.5x); "
                                             f"median of {iters} CUDA-event-timed calls after {warmup} warm-up, "
                                             + (f"{repeats} repeats interleaved across implementations (on odd repeats "
                                                f"all but the first in reverse order); " if not ALTERNATE else
                                                f"{repeats} repeats; ")
                                             + "bwd = autograd.grad after one forward"
                                             + (f"; {BWD_CALL} = raw attention_backward call" if not ALTERNATE else "")
                                             + (f"; {warm_seconds:g} s of matmuls before the first row"
                                                if warm_seconds > 0 else "")
                                             + ("; queue-ahead: the GPU sleeps until every timed call of a run "
                                                "is queued (GPU time, no host time)" if QUEUE_AHEAD else "")
                                             + (f"; {preheat:g} s of matmuls before every implementation's run"
                                                if preheat > 0 and not ALTERNATE else "")
                                             + ("; alternate: the implementations timed call by call in turn "
                                                "(each round every one once, the order varied per round, no call "
                                                "right after one of its own implementation), no energy or clock readings"
                                                + (f", {preheat:g} s of matmuls before every point" if preheat > 0 else "")
                                                + (f"; the dtypes ({', '.join(dtypes)}) {DTYPES_IN_TURN}"
                                                   if len(dtypes) > 1 else "")
                                                if ALTERNATE else "")
                                             + ("; every call on a side stream (not the default stream)"
                                                if SIDE_STREAM else "")
                                             + (f"; {COLD_L2_BYTES >> 20} MB zeroed before every timed call "
                                                "(cold L2)" if COLD_L2_BYTES else "")))
    if tag:
        payload["tag"] = tag
    if BUILDS:  # paths as given (relative to the checkout when run from it), and each build's commit
        payload["builds"] = {k: os.path.relpath(v) if os.path.isabs(v) else v for k, v in BUILDS.items()}
        payload["build_commits"] = {k: lib.flashback_build_commit().decode("utf-8", "replace")
                                    for k, lib in BUILD_LIBS.items()}
    if "fa3" in impls:
        try:
            import flash_attn_interface  # noqa: F401
        except Exception as e:  # noqa: BLE001
            payload["notes"].append(f"fa3 skipped: flash_attn_interface not importable ({_short(e)})")
            impls = [i for i in impls if i != "fa3"]
    print(f"{device}, commit {payload['commit']}, torch {torch.__version__}; implementations: {', '.join(impls)}; "
          f"{iters} timed calls x {repeats} runs per point", flush=True)
    for note in payload["notes"]:
        print("note: " + note)
    path = None
    warm_gpu(warm_seconds)
    gen = torch.Generator(device=DEVICE).manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    # --alternate with several dtypes: one point per (head dim, mask, shape), its dtypes timed in
    # turn like its implementations (a run-by-run fp16 / bf16 ratio carries the clock's drift).
    dtype_groups = [tuple(dtypes)] if ALTERNATE and len(dtypes) > 1 else [(t,) for t in dtypes]
    for headdim, group, causal, (batch, seqlen) in ((d, g, c, bs) for d in headdims for g in dtype_groups
                                                     for c in causals for bs in shapes):
            nheads = nheads_for(headdim)
            dtype_name = "+".join(group)
            shape = (batch, seqlen, nheads, headdim)
            draws = [torch.randn(shape, generator=gen, device=DEVICE) for _ in range(4)]
            inputs_of = {}  # dtype -> (q, k, v, dout), the same values in each dtype
            for t in group:
                ts = [x.to(torch.float16 if t == "fp16" else torch.bfloat16) for x in draws]
                for x in ts[:3]:
                    x.requires_grad_()
                inputs_of[t] = tuple(ts)
            del draws
            q, k, v, dout = inputs_of[group[0]]
            # The repeats are interleaved: repeat r times every implementation once, in the order
            # of repeat_order, so that no implementation always runs right after the same other one.
            # A card at its power cap runs faster for a fraction of a second after a lighter
            # load; with all repeats of one implementation back to back, that boost lands on
            # whichever one follows a slower implementation (seen: three repeats 706 / 705 /
            # 578 TFLOP/s after SDPA, the next implementation's 620 / 557 / 569).
            # fa3 (its build here) takes bf16 only; with several dtypes a label is "impl#dtype".
            point_impls = [i if len(group) == 1 else f"{i}#{t}" for t in group for i in impls
                           if not (i == "fa3" and t != "bf16")]
            runs, paths_of, states_of = {}, {}, {}  # impl -> {key: [ms per repeat]}, ...
            if ALTERNATE:
                warm_gpu(preheat)
                runs, paths_of = measure_alternating(
                    point_impls, q, k, v, dout, causal, iters, warmup, repeats, payload["notes"], directions,
                    dtype_name, inputs={i: inputs_of[split_dtype(i)[1]] for i in point_impls} if len(group) > 1
                    else None)
                torch.cuda.empty_cache()
            for rep in range(repeats if not ALTERNATE else 0):
                for impl in repeat_order(point_impls, rep):
                    if rep > 0 and impl not in runs:
                        continue  # skipped at its first repeat
                    paths, states = {}, {}
                    # --preheat: every run starts after the same load (the card at its power cap
                    # answers a lighter predecessor with a higher clock for a fraction of a
                    # second, and the interleaving keeps flashback first in every repeat).
                    warm_gpu(preheat)
                    try:
                        res = measure(impl, q, k, v, dout, causal, iters, warmup, 1, payload["notes"], paths,
                                      directions, states)
                    except Exception as e:  # noqa: BLE001 - a backend that rejects the shape is skipped
                        note = (f"{impl} d={headdim} {dtype_name} causal={causal} batch={batch} seqlen={seqlen} "
                                f"skipped: {_short(e)}")
                        payload["notes"].append(note)
                        print("note: " + note, flush=True)
                        runs.pop(impl, None)
                        torch.cuda.empty_cache()
                        continue
                    for key, ms in res.items():
                        runs.setdefault(impl, {}).setdefault(key, []).extend(ms)
                    paths_of.setdefault(impl, {}).update(paths)
                    for key, st in states.items():
                        states_of.setdefault(impl, {}).setdefault(key, []).append(st)
                    torch.cuda.empty_cache()
            for impl in point_impls:
                base, row_dtype = split_dtype(impl)
                for key, ms_runs in runs.get(impl, {}).items():
                    row_impl, direction = (BWD_CALL, "bwd") if key == BWD_CALL else (base, key)
                    row = result_row(row_impl, direction, causal, batch, seqlen, nheads, headdim, ms_runs,
                                     row_dtype or dtype_name)
                    if key in paths_of.get(impl, {}):
                        row["path"] = paths_of[impl][key]
                    if any(states_of.get(impl, {}).get(key, [])):
                        row["gpu"] = states_of[impl][key]
                    payload["results"].append(row)
                    print(f"{row_impl:>18} {direction} d={headdim} {row['dtype']} causal={causal!s:5} "
                          f"{batch}x{seqlen:<6} TFLOP/s {'/'.join(f'{t:.1f}' for t in row['tflops'])}", flush=True)
            del q, k, v, dout, inputs_of
            torch.cuda.empty_cache()
            path = write_results(out_dir, payload)
    print()
    print(format_table(payload))
    print(f"results: {path}")
    if want_plot and path:
        png = plot(payload, path[:-len(".json")] + ".png")
        if png:
            print(f"plot: {png}")
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few iterations, for smoke tests")
    p.add_argument("--plot", action="store_true", help="also write a PNG next to the JSON")
    p.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                   help=f"comma-separated subset of {','.join(IMPLS)} (default {','.join(DEFAULT_IMPLS)}; "
                        f"'all' means all, sdpa_efficient included; fa3 runs when importable)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for the JSON (and PNG)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per run (default 100, --quick 10)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 10, --quick 2)")
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement (default 3)")
    p.add_argument("--directions", default=",".join(DIRECTIONS),
                   help=f"comma-separated subset of {','.join(DIRECTIONS)} to time (default all)")
    p.add_argument("--headdims", default=str(HEADDIM),
                   help=f"comma-separated head dims (default {HEADDIM}; 'all' = {','.join(map(str, HEADDIMS))}); "
                        f"nheads = 2048 / headdim")
    p.add_argument("--dtypes", default="bf16", help="comma-separated subset of bf16,fp16 (default bf16)")
    p.add_argument("--seqlens", default="main",
                   help="main (4096,8192,16384), short (512,1024,2048), all, or a comma-separated list of "
                        f"divisors of {TOKENS}; batch = {TOKENS} / seqlen")
    p.add_argument("--masks", choices=("both", "causal", "noncausal"), default="both",
                   help="causal masking: both (default), or only causal / non-causal points")
    p.add_argument("--queue-ahead", action="store_true",
                   help="let the host queue every timed call before the GPU runs the first (GPU time only; "
                        "without it, calls shorter than the host's work per call measure the host too)")
    p.add_argument("--preheat", type=float, default=0.0, metavar="SECONDS",
                   help="matmuls for this long before every implementation's run of a point, so that each "
                        "starts from the same load at the card's power cap (default 0: none)")
    p.add_argument("--side-stream", action="store_true",
                   help="run every call on a stream of its own instead of PyTorch's default stream (the legacy "
                        "default stream serialises kernels: programmatic dependent launch only overlaps them "
                        "on other streams, as in CUDA-graph capture)")
    p.add_argument("--cold-l2", action="store_true",
                   help="zero a 256 MB buffer before every timed call, outside its events, so that each call "
                        "starts with neither its inputs nor its code in L2 (as Triton's do_bench times)")
    p.add_argument("--sample-clock", type=float, default=0.0, metavar="MS",
                   help="read the SM clock every MS milliseconds while a run's calls execute and record its "
                        "mean per run (the table then also gives ours/fa3/MHz); a Python thread, so keep "
                        "it off where the host bounds the calls (default 0: off)")
    p.add_argument("--alternate", action="store_true",
                   help="time the implementations call by call in turn instead of run by run, so that they "
                        "share the clock (ratios steadier at the power cap; no energy or clock columns, no "
                        "raw backward call row)")
    p.add_argument("--builds", metavar="LABEL=PATH,...",
                   help="with --alternate: flashback (and flashback_det) once per build of the library, "
                        "e.g. A=build/libflashback.so,B=build-x/libflashback.so, all timed call by call in "
                        "turn in one process; the table adds each later build over the first (B/A). Builds "
                        "of this tree only (the Python package checks each library's structs)")
    p.add_argument("--summarize", metavar="JSON", help="print the table of a result file (with --plot: its PNG) and exit")
    a = p.parse_args(argv)

    if a.summarize:
        with open(a.summarize) as f:
            payload = json.load(f)
        print(format_table(payload))
        if a.plot:
            png = plot(payload, re.sub(r"\.json$", "", a.summarize) + ".png")
            if png:
                print(f"plot: {png}")
        return 0

    impls = list(IMPLS) if a.impls.strip() == "all" else [i.strip() for i in a.impls.split(",") if i.strip()]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        p.error(f"unknown implementation(s) {', '.join(unknown)} (choose from {', '.join(IMPLS)})")
    if a.builds is not None:
        if not a.alternate:
            p.error("--builds needs --alternate (builds in one process are compared call by call; "
                    "scripts/compare_builds.sh compares them run by run)")
        if not any(i in OURS for i in impls):
            p.error("--builds needs flashback or flashback_det in --impls")
        try:
            BUILDS.update(parse_builds(a.builds))
        except ValueError as e:
            p.error(f"--builds: {e}")
        impls = expand_builds(impls, list(BUILDS))
    directions = tuple(d.strip() for d in a.directions.split(",") if d.strip())
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad or not directions:
        p.error(f"--directions takes a subset of {','.join(DIRECTIONS)}, got {a.directions!r}")
    headdims = HEADDIMS if a.headdims.strip() == "all" else tuple(int(d) for d in a.headdims.split(",") if d.strip())
    if not headdims or any(d not in HEADDIMS for d in headdims):
        p.error(f"--headdims takes a subset of {','.join(map(str, HEADDIMS))}, got {a.headdims!r}")
    dtypes = tuple(dict.fromkeys(t.strip() for t in a.dtypes.split(",") if t.strip()))
    if not dtypes or any(t not in DTYPES for t in dtypes):
        p.error(f"--dtypes takes a subset of {','.join(DTYPES)}, got {a.dtypes!r}")
    if a.seqlens.strip() in SEQLEN_SETS:
        seqlens = SEQLEN_SETS[a.seqlens.strip()]
    else:
        try:
            seqlens = tuple(int(x) for x in a.seqlens.split(",") if x.strip())
        except ValueError:
            seqlens = ()
        if not seqlens or any(x <= 0 or TOKENS % x for x in seqlens):
            p.error(f"--seqlens takes main, short, all or divisors of {TOKENS}, got {a.seqlens!r}")
    if not a.preheat >= 0:
        p.error(f"--preheat takes seconds >= 0, got {a.preheat!r}")
    if a.alternate and a.sample_clock > 0:
        p.error("--sample-clock does not combine with --alternate (the implementations' calls share the readings)")
    iters = a.iters if a.iters is not None else (10 if a.quick else 100)
    warmup = a.warmup if a.warmup is not None else (2 if a.quick else 10)

    _use_source_package()
    problem = environment_problem(impls)
    if problem:
        print(f"bench_attention: nothing to benchmark: {problem}.")
        return 0
    global QUEUE_AHEAD
    QUEUE_AHEAD = a.queue_ahead
    tag = "-".join(t for t in (sweep_tag(seqlens, headdims, dtypes), "qa" if a.queue_ahead else "",
                                "" if a.masks == "both" else a.masks) if t)
    global SIDE_STREAM
    SIDE_STREAM = a.side_stream
    global ALTERNATE
    ALTERNATE = a.alternate
    if a.alternate:
        tag = "-".join(t for t in (tag, "alt") if t)
    if BUILDS:
        tag = "-".join(t for t in (tag, "builds") if t)
    if a.side_stream:
        tag = "-".join(t for t in (tag, "side") if t)
    global COLD_L2_BYTES
    COLD_L2_BYTES = 256 << 20 if a.cold_l2 else 0
    if not a.sample_clock >= 0:
        p.error(f"--sample-clock takes milliseconds >= 0, got {a.sample_clock!r}")
    global CLOCK_SAMPLE_S
    CLOCK_SAMPLE_S = a.sample_clock / 1000.0
    if a.cold_l2:
        tag = "-".join(t for t in (tag, "cold") if t)
    import contextlib
    import torch
    with torch.cuda.stream(torch.cuda.Stream()) if a.side_stream else contextlib.nullcontext():
        run_sweep(impls, iters, warmup, a.repeats, a.out, a.plot, directions, headdims, dtypes, shapes_for(seqlens),
                  tag, warm_seconds=0.0 if a.quick else 1.0,
                  causals={"both": (True, False), "causal": (True,), "noncausal": (False,)}[a.masks],
                  preheat=a.preheat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
