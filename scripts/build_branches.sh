#!/usr/bin/env bash
# Builds the library of each named branch into build-<branch>/libflashback.so of this checkout
# (a worktree per branch beside the checkout, wt-<branch>), so that one run on the GPU machine can run the GPU tests
# and scripts/compare_builds.sh on all of them, beside build/libflashback.so of the checkout:
#
#   scripts/build_branches.sh fwd-tile-counter bwd-dq-smem
#   scripts/compare_builds.sh build/libflashback.so build-fwd-tile-counter/libflashback.so ...
#
# (build*/ is ignored by git: the GPU machine gets these folders only when they are carried
# explicitly, ~9 MB each). Environment: JOBS (default 3), FLASHBACK_HEADDIMS / FLASHBACK_DTYPES
# passed on to CMake when set.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
for branch in "$@"; do
  wt="$root/../wt-$branch"
  [ -d "$wt" ] || git worktree add -q --detach "$wt" "$branch"
  args=()
  [ -n "${FLASHBACK_HEADDIMS:-}" ] && args+=("-DFLASHBACK_HEADDIMS=$FLASHBACK_HEADDIMS")
  [ -n "${FLASHBACK_DTYPES:-}" ] && args+=("-DFLASHBACK_DTYPES=$FLASHBACK_DTYPES")
  cmake -S "$wt" -B "$wt/build" -G Ninja "${args[@]}" > /dev/null
  cmake --build "$wt/build" -j "${JOBS:-3}" --target flashback
  mkdir -p "$root/build-$branch"
  cp "$wt/build/libflashback.so" "$root/build-$branch/"
  echo "build-$branch/libflashback.so <- $branch ($(git -C "$wt" rev-parse --short HEAD))"
done
