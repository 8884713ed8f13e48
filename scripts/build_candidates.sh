#!/usr/bin/env bash
# Builds the library with a candidate config in place of a table row, one library per argument,
# into build-<candidate>/libflashback.so of this checkout, for one run on the GPU machine that runs the GPU
# tests and scripts/compare_builds.sh on them beside build/libflashback.so:
#
#   scripts/build_candidates.sh kBwdSm90Hdim192=kBwdSm90Hdim192Wg3
#   scripts/compare_builds.sh build/libflashback.so build-kBwdSm90Hdim192Wg3/libflashback.so ...
#
# ROW=CANDIDATE: the candidate's initializer (its `constexpr ... CANDIDATE = {...};` line in
# csrc/*/*.h) replaces the row's, in a copy of HEAD (a worktree beside the checkout, cand-<candidate>); the
# checkout itself is not touched. build*/ is ignored by git: copy the folders to the GPU machine.
# ROW=CANDIDATE,ROW2=CANDIDATE2,...: one library with all of them in place (named after the
# first candidate, e.g. kBwdSm90Hdim128=kBwdSm90Hdim128X,kBwdSm90Hdim192=kBwdSm90Hdim192X).
# A row that aliases another config (kFwdSm90Hdim128Full, kBwdSm90Hdim192Det) becomes a config
# of its own: kFwdSm90Hdim128Full=kFwdSm90Hdim128N176 swaps the non-causal forward only.
# Environment: JOBS (default 3), FLASHBACK_HEADDIMS / FLASHBACK_DTYPES passed on to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
for arg in "$@"; do
  first=${arg%%,*}
  cand=${first#*=}
  [ "${first%%=*}" != "$first" ] && [ -n "$cand" ] || { echo "usage: $0 ROW=CANDIDATE[,ROW=CANDIDATE...] ..."; exit 2; }
  wt="$root/../cand-$cand"
  rm -rf "$wt"
  git worktree prune
  git worktree add -q --detach "$wt" HEAD
  IFS=, read -r -a pairs <<< "$arg"
  for pair in "${pairs[@]}"; do
  row=${pair%%=*}
  pcand=${pair#*=}
  [ "$row" != "$pair" ] && [ -n "$pcand" ] || { echo "usage: $0 ROW=CANDIDATE[,ROW=CANDIDATE...] ..."; exit 2; }
  python3 - "$wt" "$row" "$pcand" <<'PYEOF'
import glob, re, sys
wt, row, cand = sys.argv[1:]
for path in glob.glob(f"{wt}/csrc/*/*.h"):
    text = open(path).read()
    m = re.search(r"constexpr \w+ " + re.escape(cand) + r" = (\{[^}]*\});", text)
    if not m:
        continue
    new, n = re.subn(r"(constexpr \w+ " + re.escape(row) + r" = )\{[^}]*\};", lambda g: g.group(1) + m.group(1) + ";", text)
    if n == 0:  # a row that aliases another config (static constexpr const Config& ROW = OTHER;)
        new, n = re.subn(r"static constexpr const (\w+)& " + re.escape(row) + r" = \w+;",
                         lambda g: f"constexpr {g.group(1)} {row} = {m.group(1)};", text)
    if n != 1:
        sys.exit(f"{row}: not defined once in {path}")
    open(path, "w").write(new)
    print(f"{path.removeprefix(wt + '/')}: {row} = {m.group(1)}")
    break
else:
    sys.exit(f"{cand}: no such config in csrc/*/*.h")
PYEOF
  done
  args=()
  [ -n "${FLASHBACK_HEADDIMS:-}" ] && args+=("-DFLASHBACK_HEADDIMS=$FLASHBACK_HEADDIMS")
  [ -n "${FLASHBACK_DTYPES:-}" ] && args+=("-DFLASHBACK_DTYPES=$FLASHBACK_DTYPES")
  cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHBACK_BUILD_HOPPER_TESTS=OFF "${args[@]}" > /dev/null
  cmake --build "$wt/build" -j "${JOBS:-3}" --target flashback
  mkdir -p "$root/build-$cand"
  cp "$wt/build/libflashback.so" "$root/build-$cand/"
  echo "build-$cand/libflashback.so <- $arg at $(git rev-parse --short HEAD)"
done
