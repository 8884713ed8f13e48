#!/usr/bin/env bash
# On the GPU machine, with the library already built into build/ (this script builds nothing):
#   1. every GPU test; a failing test does not stop the others  -> $OUT/tests.log
#      and the d = 256 tests again with the 2-CTA backward pair forced -> $OUT/tests-pair.log
#   2. the benchmark sweep with its plot, always, even after failed tests
#                                -> benchmarks/results/, copied into $OUT (+ $OUT/bench.log)
#   3. a short summary, last: test counts and failures, then the benchmark table.
#
#   scripts/device_run.sh                 # OUT defaults to ./logs
#   OUT=/some/dir BENCH_ARGS=--quick scripts/device_run.sh
#
# Environment, all optional:
#   OUT                where logs and results go (default ./logs)
#   FLASHBACK_LIBRARY  the library under test (default build/libflashback.so)
#   FLASHBACK_COMMIT   commit to name the result file by, for a copy of the tree without .git
#                      or whose .git lags behind the files (set it to the commit of the build)
#   BENCH_IMPLS        default flashback,sdpa_flash,cudnn,fa3 (fa3 when importable). "all" adds
#                      sdpa_efficient: at ~40 TFLOP/s it alone takes ~2 minutes of the sweep, and
#                      its numbers are in docs/perf-log.md already.
#   BENCH_ARGS         more benchmark flags, e.g. --quick
#   TESTS=0            skip the GPU tests (a later call on a build whose tests already ran)
#   TEST_TIMEOUT       seconds for the GPU tests (default 300)
#   PAIR_TEST_TIMEOUT  seconds for their d = 256 part with the 2-CTA pair forced (default 120)
#   TIME_BUDGET        seconds for the whole script (default 570). The benchmark gets what the
#                      tests left; cut short, it keeps the shapes it finished (written per shape).
#   BREAKDOWN=1        before the benchmark, scripts/call_breakdown.py at d = 256 (causal 4k,
#                      non-causal 512; ours and FA3's)     -> $OUT/breakdown.log
#   REQUIRE_GPU        run only on a card whose name contains this (any case; e.g. H200): on another card,
#                      or none, say so and exit 3 before anything else (a measurement that must be
#                      the H200's costs nothing on an H100 then)
#   SANITIZE=1         after the tests, compute-sanitizer on scripts/sanitize_family.py: memcheck
#                      over every head dim and dtype, racecheck over every head dim in bf16
#                      (~1-2 min together)     -> $OUT/memcheck.log, $OUT/racecheck.log
# Exit status: 0 when the tests (and with SANITIZE=1 both sanitizers) passed and the benchmark
# finished, 3 when REQUIRE_GPU did not match the card, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-$ROOT/logs}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
RESULTS=$ROOT/benchmarks/results
export FLASHBACK_LIBRARY=${FLASHBACK_LIBRARY:-$ROOT/build/libflashback.so}
BENCH_IMPLS=${BENCH_IMPLS:-flashback,sdpa_flash,cudnn,fa3}
TEST_TIMEOUT=${TEST_TIMEOUT:-300}
PAIR_TEST_TIMEOUT=${PAIR_TEST_TIMEOUT:-120}
TIME_BUDGET=${TIME_BUDGET:-570}

if [ -n "${REQUIRE_GPU:-}" ]; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  case ${card,,} in  # any case: REQUIRE_GPU=h200 takes an "NVIDIA H200"
    *"${REQUIRE_GPU,,}"*) ;;
    *) echo "REQUIRE_GPU=$REQUIRE_GPU: this machine's card is '${card:-none}': nothing run"; exit 3 ;;
  esac
fi

echo "== environment (also in $OUT_DIR/env.txt)"
{
  date -u +"%Y-%m-%d %H:%M:%S UTC"
  echo "git HEAD: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo none); results named by: ${FLASHBACK_COMMIT:-git HEAD}"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv 2>&1
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" 2>&1
  ls -l "$FLASHBACK_LIBRARY" 2>&1
} | tee "$OUT_DIR/env.txt"
[ -f "$FLASHBACK_LIBRARY" ] || echo "WARNING: $FLASHBACK_LIBRARY not found: build the library into build/ first"

echo
if [ "${TESTS:-1}" = 0 ]; then
  # A later call on the same build (e.g. the protocol split over calls by head dim).
  echo "== GPU tests skipped (TESTS=0)"
  echo "skipped (TESTS=0)" > "$OUT_DIR/tests.log"
  echo "skipped (TESTS=0)" > "$OUT_DIR/tests-pair.log"
  test_rc=0
  pair_rc=0
else
  echo "== GPU tests (log: $OUT_DIR/tests.log)"
  # -rfEs: failures, errors and skip reasons in the short summary (-rs alone would drop failures).
  timeout -k 10 "$TEST_TIMEOUT" $PY -m pytest tests -m gpu -q -rfEs -p no:cacheprovider > "$OUT_DIR/tests.log" 2>&1
  test_rc=$?
  tail -n 3 "$OUT_DIR/tests.log"
  # The d = 256 backward runs most test shapes (short walks) on one CTA per K/V block; its tests
  # again with the 2-CTA pair forced, so the pair kernel meets every shape too.
  timeout -k 10 "$PAIR_TEST_TIMEOUT" env FLASHBACK_BWD_PAIR=1 $PY -m pytest tests -m gpu -q -rfEs \
    -p no:cacheprovider -k d256 > "$OUT_DIR/tests-pair.log" 2>&1
  pair_rc=$?
  tail -n 1 "$OUT_DIR/tests-pair.log"
fi

san_summary=()
if [ "${SANITIZE:-0}" = 1 ]; then
  echo
  echo "== compute-sanitizer (logs: $OUT_DIR/memcheck.log, $OUT_DIR/racecheck.log)"
  for tool in memcheck racecheck; do
    dtypes=bf16,fp16
    [ $tool = racecheck ] && dtypes=bf16  # racecheck is ~10x slower; the kernels are one source
    timeout -k 10 240 compute-sanitizer --tool $tool --error-exitcode 3 $PY scripts/sanitize_family.py \
      --dtypes $dtypes > "$OUT_DIR/$tool.log" 2>&1
    rc=$?
    line="$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT_DIR/$tool.log" | tail -n 1)"
    echo "$line"
    san_summary+=("$line")
    [ $rc -eq 0 ] || test_rc=1
  done
fi

if [ "${BREAKDOWN:-0}" = 1 ]; then
  # One backward call's kernels by GPU time (main kernel against memset / pre- / postprocess),
  # d = 256 at a long and a short point, ours and FA3's when importable.
  echo
  echo "== call breakdown (log: $OUT_DIR/breakdown.log)"
  for args in "--seqlen 4096 --causal" "--seqlen 512"; do
    for impl in flashback fa3; do
      # shellcheck disable=SC2086  # args is a list of flags
      timeout -k 5 60 $PY scripts/call_breakdown.py --headdim 256 $args --impl $impl 2>&1 | tail -n 12
    done
  done | tee "$OUT_DIR/breakdown.log"
fi

echo
echo "== benchmark (log: $OUT_DIR/bench.log)"
left=$(( TIME_BUDGET - SECONDS - 30 ))
(( left < 60 )) && left=60
marker=$(mktemp)
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
timeout -k 10 "$left" $PY benchmarks/bench_attention.py --plot --impls "$BENCH_IMPLS" --out "$RESULTS" ${BENCH_ARGS:-} 2>&1 \
  | tee "$OUT_DIR/bench.log"
bench_rc=${PIPESTATUS[0]}
json=$(find "$RESULTS" -maxdepth 1 -type f -name '*.json' -newer "$marker" 2>/dev/null | sort | tail -n 1)
rm -f "$marker"
if [ -n "$json" ]; then
  png=${json%.json}.png
  [ -f "$png" ] && [ "$png" -nt "$json" ] || $PY benchmarks/bench_attention.py --summarize "$json" --plot > /dev/null 2>&1
  cp "$json" "$OUT_DIR/"
  [ -f "$png" ] && cp "$png" "$OUT_DIR/"
fi

echo
echo "==================== summary ===================="
counts=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped|deselected)|no tests ran' "$OUT_DIR/tests.log" | tail -n 1)
case $test_rc in
  0) status="ok" ;;
  124|137) status="TIMED OUT after ${TEST_TIMEOUT}s" ;;
  *) status="exit $test_rc" ;;
esac
[ "${TESTS:-1}" = 0 ] && counts="skipped (TESTS=0)"
echo "tests: ${counts:-no summary line} [$status] (full log: $OUT_DIR/tests.log)"
grep -E '^(FAILED|ERROR) ' "$OUT_DIR/tests.log" | head -n 25
pair_counts=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped|deselected)|no tests ran' "$OUT_DIR/tests-pair.log" | tail -n 1)
[ "${TESTS:-1}" = 0 ] && pair_counts="skipped (TESTS=0)"
echo "tests with FLASHBACK_BWD_PAIR=1 (d256): ${pair_counts:-no summary line} [exit $pair_rc] (log: $OUT_DIR/tests-pair.log)"
grep -E '^(FAILED|ERROR) ' "$OUT_DIR/tests-pair.log" | head -n 10
for line in "${san_summary[@]+"${san_summary[@]}"}"; do echo "compute-sanitizer $line"; done
case $bench_rc in
  0) status="ok" ;;
  124|137) status="TIMED OUT after ${left}s: partial results" ;;
  *) status="exit $bench_rc" ;;
esac
echo "benchmark: [$status]"
if [ -n "$json" ]; then
  $PY benchmarks/bench_attention.py --summarize "$json"
  echo "results: $OUT_DIR/$(basename "$json")"
else
  tail -n 2 "$OUT_DIR/bench.log"
  echo "no result file"
fi
[ "$test_rc" -eq 0 ] && [ "$pair_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
exit $?
