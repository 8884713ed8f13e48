#!/usr/bin/env python3
"""Plot the kernel family from result files of bench_attention.py: one row of panels per head
dim, forward and backward side by side, grouped bars of flashback, FlashAttention-3 and PyTorch
SDPA's flash backend (the yardstick) at each point of the sweep (causal and not, seqlen
4k/8k/16k at 16384 tokens); the whiskers span the three runs of the full protocol, the number
under each group is flashback's fraction of FA3 (of the median TFLOP/s).

  python3 benchmarks/plot_family.py RESULTS.json [MORE.json ...] [--dtype bf16] [--out PNG]

The PNG goes next to the first file, with its name (RESULTS.png), unless --out says otherwise.
Several files are merged (e.g. the family sweep and a head-dim-256 run of the same commit); a
point measured in more than one file keeps the first file's rows. Needs matplotlib.
"""
import argparse
import json
import os
import statistics
import sys

# (impl in the result file, legend label, colour)
IMPLS = (
    ("flashback", "flashback", "#1f77b4"),
    ("fa3", "FlashAttention-3", "#ff7f0e"),
    ("sdpa_flash", "PyTorch SDPA flash", "#7f7f7f"),
)
DIRECTIONS = (("fwd", "forward"), ("bwd", "backward"))


def load_rows(paths):
    """The rows of every file, each point (impl, direction, head dim, dtype, causal, batch,
    seqlen) once: the first file that has it wins. Returns (rows, the first file's payload)."""
    rows, seen, first = [], set(), None
    for path in paths:
        with open(path) as f:
            payload = json.load(f)
        first = first or payload
        for r in payload["results"]:
            key = point(r)
            if key not in seen:
                seen.add(key)
                rows.append(r)
    return rows, first


def seqlen_label(seqlen):
    """4096 -> '4k', 512 -> '512'."""
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def point(r):
    return (r["impl"], r["direction"], r["headdim"], r.get("dtype", "bf16"), bool(r["causal"]),
            r["batch"], r["seqlen"])


def series(rows, dtype):
    """{(head dim, direction): {"groups": [(causal, batch, seqlen)], impl: [(median, min, max) or
    None per group]}} for the impls of IMPLS, in the order causal first, then by seqlen."""
    out = {}
    wanted = {impl for impl, _, _ in IMPLS}
    rows = [r for r in rows if r.get("dtype", "bf16") == dtype and r["impl"] in wanted]
    for d in sorted({r["headdim"] for r in rows}):
        for direction, _ in DIRECTIONS:
            here = [r for r in rows if r["headdim"] == d and r["direction"] == direction]
            if not here:
                continue
            groups = sorted({(bool(r["causal"]), r["batch"], r["seqlen"]) for r in here},
                            key=lambda g: (not g[0], g[2]))
            by_key = {(r["impl"], bool(r["causal"]), r["batch"], r["seqlen"]): r["tflops"] for r in here}
            entry = {"groups": groups}
            for impl, _, _ in IMPLS:
                vals = [by_key.get((impl,) + g) for g in groups]
                entry[impl] = [(statistics.median(v), min(v), max(v)) if v else None for v in vals]
            out[(d, direction)] = entry
    return out


def plot(rows, payload, dtype, png_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(rows, dtype)
    if not data:
        raise SystemExit(f"no {dtype} rows of {', '.join(i for i, _, _ in IMPLS)} in the given files")
    headdims = sorted({d for d, _ in data})
    nheads = {r["headdim"]: r["nheads"] for r in rows}
    # Six points per panel fit 13 inches; the whole sweep (512-16k) needs room per group.
    most = max(len(e["groups"]) for e in data.values())
    fig, axes = plt.subplots(len(headdims), len(DIRECTIONS), figsize=(max(13, 2.1 * most), 2.9 * len(headdims) + 0.9),
                             squeeze=False, sharey=True)
    present = [(impl, label, color) for impl, label, color in IMPLS
               if any(any(v is not None for v in e[impl]) for e in data.values())]
    width = 0.8 / len(present)
    for row, d in enumerate(headdims):
        for col, (direction, title) in enumerate(DIRECTIONS):
            ax = axes[row][col]
            entry = data.get((d, direction))
            if entry is None:
                ax.set_axis_off()
                continue
            groups = entry["groups"]
            for j, (impl, label, color) in enumerate(present):
                xs, ys, lo, hi = [], [], [], []
                for i, v in enumerate(entry[impl]):
                    if v is None:
                        continue
                    med, vmin, vmax = v
                    xs.append(i + (j - (len(present) - 1) / 2) * width)
                    ys.append(med)
                    lo.append(med - vmin)
                    hi.append(vmax - med)
                if xs:
                    bars = ax.bar(xs, ys, width, yerr=[lo, hi], color=color, label=label, capsize=1.5,
                                  error_kw={"elinewidth": 0.7})
                    ax.bar_label(bars, fmt="%.0f", fontsize=6, padding=1)
            labels = []
            for i, (causal, batch, seqlen) in enumerate(groups):
                ours, fa3 = entry["flashback"][i], entry["fa3"][i]
                frac = f"\n{ours[0] / fa3[0]:.3f} of FA3" if ours and fa3 else ""
                # Kind and length on two lines when the panel is crowded.
                sep = "\n" if most > 6 else " "
                labels.append(f"{'causal' if causal else 'full'}{sep}{seqlen_label(seqlen)}{frac}")
            ax.set_xticks(range(len(groups)))
            ax.set_xticklabels(labels, fontsize=7)
            ax.grid(axis="y", alpha=0.3)
            ax.set_title(f"head dim {d} ({nheads.get(d, '?')} heads), {title}", fontsize=9)
            if col == 0:
                ax.set_ylabel("TFLOP/s", fontsize=8)
            ax.tick_params(axis="y", labelsize=7)
    top = max(v[2] for e in data.values() for impl, _, _ in present for v in e[impl] if v)
    axes[0][0].set_ylim(0, top * 1.15)
    handles, labels = next((ax.get_legend_handles_labels() for ax in axes.flat if ax.get_legend_handles_labels()[0]),
                           ([], []))
    fig.legend(handles, labels, loc="upper right", ncol=len(present), fontsize=8, frameon=False)
    shapes = sorted({(r["batch"], r["seqlen"]) for r in rows}, key=lambda bs: bs[1])
    runs = sorted({len(r["tflops"]) for r in rows})
    fig.suptitle(f"Kernel family, {dtype}, batch x seqlen = "
                 f"{', '.join(f'{b} x {seqlen_label(s)}' for b, s in shapes)}, "
                 f"nheads = 2048 / head dim; {payload.get('device', '?')}, commit {payload.get('commit', '?')}, "
                 f"{payload.get('date', '?')}; median of {'/'.join(map(str, runs))} runs, whiskers min-max",
                 fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(png_path, dpi=80)
    plt.close(fig)
    return png_path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="result JSON files of bench_attention.py")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"),
                   help="which rows to plot (FA3 was measured in bf16 only)")
    p.add_argument("--out", help="PNG path (default: the first file's name with .png)")
    a = p.parse_args(argv)
    rows, payload = load_rows(a.results)
    png = a.out or os.path.splitext(a.results[0])[0] + ".png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_family: matplotlib is not installed (pip install matplotlib); no PNG written",
              file=sys.stderr)
        return 1
    plot(rows, payload, a.dtype, png)
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
