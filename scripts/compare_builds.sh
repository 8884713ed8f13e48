#!/usr/bin/env bash
# On the GPU machine: GPU tests (head dim 256 unless TEST_ARGS says otherwise) and a short
# benchmark for each of several builds of the library, in one run, then one table of TFLOP/s per build ($IMPL's: same
# process order for all, SDPA flash as the yardstick in every run). Builds nothing.
#
#   scripts/compare_builds.sh build/libflashback.so build-exp/libflashback.so
#   scripts/compare_builds.sh build/libflashback.so FLASHBACK_DET_COOPERATIVE=1:build/libflashback.so
#
# An argument VAR=value[,VAR2=value]:LIB runs LIB with those environment variables set (the
# library's experimental switches).
# Environment: OUT (default ./logs), ITERS (default 50), REPEATS (default 2), IMPL (the
# benchmark implementation compared, default flashback; flashback_det for the deterministic mode),
# TESTS=0 to skip the tests, TEST_ARGS (pytest selection, default "-k 256"), BENCH_ARGS (e.g.
# "--directions fwd --headdims 64,128"), PACK=1 (at the end, the per-build folders and logs go
# into one $OUT/runs.tgz; compare.json keeps every build's results). The table keys rows by head
# dim, dtype, direction, mask and seqlen and ends with the change of ours / SDPA flash from the
# first build to the last.
# Logs: $OUT/<n>-tests.log, $OUT/<n>/<result>.json, and all builds' results in $OUT/compare.json.
# With the same build first and last (A B C A), a second table gives each build between against
# the mean of the two A runs, with their spread (this run's noise). With builds named more than
# once (A B A B), a third gives each distinct build's mean against the first build's mean.
#
# ALTERNATE=1: the tests per distinct build as above, then ONE benchmark process that loads every
# distinct build and a copy of the first (the A/A floor) and times them call by call in turn
# (bench_attention.py --alternate --builds; labels b1, b2, ... and b1copy; ITERS default 100,
# REPEATS 3). Its table gives each build over b1 per point, the median of per-repeat ratios:
# differences of ~0.5% resolve there, where the run-by-run tables above see ~4% of noise. The
# VAR=value:LIB form is refused in this mode (one process, one environment).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
IMPL=${IMPL:-flashback}
OUT_DIR=${OUT:-$PWD/logs}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# run_tests N LIB [VAR=value...]: the GPU tests of build N into $OUT_DIR/N-tests.log.
run_tests() {
  local n=$1 lib=$2
  shift 2
  # shellcheck disable=SC2086  # TEST_ARGS is a list of pytest flags
  env "$@" FLASHBACK_LIBRARY="$lib" timeout -k 10 300 $PY -m pytest tests/gpu/test_attention.py -q -x ${TEST_ARGS:--k 256} \
    -p no:cacheprovider > "$OUT_DIR/$n-tests.log" 2>&1
}
if [ "${ALTERNATE:-0}" = 1 ]; then
  distinct=()
  for arg in "$@"; do
    [ "${arg##*:}" = "$arg" ] || { echo "ALTERNATE=1 takes library paths only, not VAR=value:LIB ($arg)"; exit 2; }
    [[ " ${distinct[*]-} " == *" $arg "* ]] || distinct+=("$arg")
  done
  [ ${#distinct[@]} -ge 1 ] || { echo "usage: ALTERNATE=1 $0 LIB [LIB...]"; exit 2; }
  spec="" n=0
  for lib in "${distinct[@]}"; do
    n=$((n + 1))
    if [ "${TESTS:-1}" != 0 ]; then
      run_tests "$n" "$lib"
      echo "[b$n] $lib: $(tail -n 1 "$OUT_DIR/$n-tests.log")"
    fi
    spec+="${spec:+,}b$n=$lib"
  done
  # The copy: a second file, so the loader maps it apart (the same path twice would load once).
  copy=$(mktemp -d "$PWD/build-copy.XXXXXX")
  cp "${distinct[0]}" "$copy/libflashback.so"
  spec+=",b1copy=${copy#"$PWD"/}/libflashback.so"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of benchmark flags
  timeout -k 10 "${ALT_TIMEOUT:-540}" $PY benchmarks/bench_attention.py --impls "$IMPL" --builds "$spec" --alternate \
    --iters "${ITERS:-100}" --repeats "${REPEATS:-3}" --out "$OUT_DIR/alternate" ${BENCH_ARGS:-} > "$OUT_DIR/alternate.log" 2>&1
  rc=$?
  rm -rf "$copy"
  [ $rc = 0 ] || echo "the alternated benchmark failed (rc $rc): see $OUT_DIR/alternate.log"
  sed -n '/^$/,$p' "$OUT_DIR/alternate.log"
  exit $rc
fi
n=0
for arg in "$@"; do
  n=$((n + 1))
  echo "== [$n] $arg"
  lib=${arg##*:}
  envs=()
  [ "$lib" != "$arg" ] && IFS=, read -r -a envs <<< "${arg%:*}"
  if [ "${TESTS:-1}" != 0 ]; then
    run_tests "$n" "$lib" "${envs[@]}"
    tail -n 1 "$OUT_DIR/$n-tests.log"
  fi
  env "${envs[@]}" FLASHBACK_LIBRARY="$lib" timeout -k 10 300 $PY benchmarks/bench_attention.py --impls "$IMPL",sdpa_flash \
    --iters "${ITERS:-50}" --repeats "${REPEATS:-2}" --out "$OUT_DIR/$n" ${BENCH_ARGS:-} > "$OUT_DIR/$n-bench.log" 2>&1 \
    || echo "benchmark of [$n] failed: see $OUT_DIR/$n-bench.log"
done
IMPL=$IMPL $PY - "$OUT_DIR" "$@" <<'PYEOF'
import glob, json, os, statistics, sys
out, libs = sys.argv[1], sys.argv[2:]
impl = os.environ.get("IMPL") or "flashback"  # the benchmark's implementation compared
rows = {}
merged = {"builds": libs, "runs": []}
for n, lib in enumerate(libs, 1):
    files = sorted(glob.glob(os.path.join(out, str(n), "*.json")))
    if not files:
        continue
    data = json.load(open(files[-1]))
    # Paths relative to $OUT (the file) and to the working directory (the library), so that a
    # committed compare.json names no machine's directories.
    merged["runs"].append({"build": n, "library": os.path.relpath(lib) if os.path.isabs(lib) else lib,
                           "file": os.path.relpath(files[-1], out), **data})
    for r in data["results"]:
        key = (r["headdim"], r.get("dtype", "bf16"), r["direction"], r["causal"], r["seqlen"])
        rows.setdefault(key, {})[(n, r["impl"])] = statistics.median(r["tflops"])
# Every build's result file in one, so that a copy of $OUT/compare.json alone keeps the A/B.
with open(os.path.join(out, "compare.json"), "w") as f:
    json.dump(merged, f, indent=1)
print(f"{impl} TFLOP/s (ours/sdpa_flash) per build: " + "  ".join(f"[{n}] {l}" for n, l in enumerate(libs, 1))
      + ("  | last/first ratio change" if len(libs) > 1 else ""))
order = {"bwd": 0, "fwd": 1, "train": 2}
bracketed = len(libs) > 2 and libs[0] == libs[-1]
bracket = []
for key in sorted(rows, key=lambda k: (k[0], k[1], order.get(k[2], 3), not k[3], k[4])):
    cells, ratios = [], []
    for n in range(1, len(libs) + 1):
        ours, yard = rows[key].get((n, impl)), rows[key].get((n, "sdpa_flash"))
        cells.append(f"{ours:6.1f} ({ours / yard:.3f})" if ours and yard else "     -")
        ratios.append(ours / yard if ours and yard else None)
    change = (f"  | {ratios[-1] / ratios[0] - 1:+.1%}"
              if len(libs) > 1 and ratios[0] and ratios[-1] else "")
    print(f"d{key[0]:<4} {key[1]:5} {key[2]:5} {'causal' if key[3] else 'full  '} {key[4]:6}  "
          + "  ".join(cells) + change)
    if bracketed:
        ours = [rows[key].get((n, impl)) for n in range(1, len(libs) + 1)]
        if all(ours):
            base = (ours[0] + ours[-1]) / 2
            bracket.append(f"d{key[0]:<4} {key[1]:5} {key[2]:5} {'causal' if key[3] else 'full  '} {key[4]:6}  "
                           + "  ".join(f"{o / base - 1:+6.1%}" for o in ours[1:-1])
                           + f"   | first/last {abs(ours[0] / ours[-1] - 1):.1%}")
if bracket:
    # The same build first and last: each build between against the mean of the two (TFLOP/s),
    # and how far the two bracketing runs of one build are apart (the noise of this run).
    print(f"{impl} TFLOP/s against the mean of the first and last run (same build): "
          + "  ".join(f"[{n}]" for n in range(2, len(libs))))
    print("\n".join(bracket))
# A build named more than once (A B A B, for runs where the card's clock drifts): each distinct
# build's mean TFLOP/s over its runs against the first build's mean, and each build's spread
# (max / min of its runs - 1).
distinct = list(dict.fromkeys(libs))
if len(distinct) < len(libs) and len(distinct) > 1:
    runs_of = {lib: [n for n, l in enumerate(libs, 1) if l == lib] for lib in distinct}
    print(f"{impl} TFLOP/s, mean of each build's runs against the first build's: "
          + "  ".join(f"{lib} x{len(runs_of[lib])}" for lib in distinct[1:]) + "  | spread per build")
    for key in sorted(rows, key=lambda k: (k[0], k[1], order.get(k[2], 3), not k[3], k[4])):
        vals = {lib: [rows[key].get((n, impl)) for n in runs_of[lib]] for lib in distinct}
        if not all(all(v) for v in vals.values()):
            continue
        mean = {lib: sum(v) / len(v) for lib, v in vals.items()}
        base = mean[distinct[0]]
        print(f"d{key[0]:<4} {key[1]:5} {key[2]:5} {'causal' if key[3] else 'full  '} {key[4]:6}  "
              + "  ".join(f"{mean[lib] / base - 1:+6.1%}" for lib in distinct[1:])
              + "   | " + " ".join(f"{max(v) / min(v) - 1:.1%}" for v in vals.values()))
# Energy per call where the benchmark read NVML's counter (runs without --queue-ahead): at the
# card's power cap the clock follows it, so a build can win in GPU time after a sleep and lose
# per call at the cap. Each distinct build's mean mJ per call, and its change from the first's.
energy = {}
for run in merged["runs"]:
    for r in run["results"]:
        if r["impl"] != impl:
            continue
        mj = [g["mj_per_call"] for g in r.get("gpu") or [] if isinstance(g, dict) and g.get("mj_per_call")]
        if mj:
            key = (r["headdim"], r.get("dtype", "bf16"), r["direction"], r["causal"], r["seqlen"])
            energy.setdefault(key, {}).setdefault(run["library"], []).extend(mj)
if energy:
    print(f"{impl} mJ per call (NVML energy over each run / calls), mean per build: "
          + "  ".join(distinct) + ("  | change from the first" if len(distinct) > 1 else ""))
    for key in sorted(energy, key=lambda k: (k[0], k[1], order.get(k[2], 3), not k[3], k[4])):
        means = [statistics.mean(energy[key][lib]) if lib in energy[key] else None for lib in distinct]
        print(f"d{key[0]:<4} {key[1]:5} {key[2]:5} {'causal' if key[3] else 'full  '} {key[4]:6}  "
              + "  ".join(f"{m:8.2f}" if m else "       -" for m in means)
              + ("   | " + "  ".join(f"{m / means[0] - 1:+6.1%}" if m and means[0] else "     -" for m in means[1:])
                 if len(distinct) > 1 else ""))
PYEOF
if [ "${PACK:-0}" = 1 ]; then
  (cd "$OUT_DIR" && items=$(ls -d [0-9]* 2>/dev/null) && [ -n "$items" ] && tar czf runs.tgz $items && rm -rf $items)
fi
