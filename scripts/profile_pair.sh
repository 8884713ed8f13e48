#!/usr/bin/env bash
# On the GPU machine: Nsight Compute profiles of flashback's main kernel beside FlashAttention-3's
# on the same shape (FA3's flash_attn_interface must be importable). One text report per case
# under $OUT: every metric of `--set full` (the raw page) for both kernels.
#
#   OUT=logs/p scripts/profile_pair.sh "128 bwd causal" "128 fwd causal" "64 bwd noncausal"
#
# Each case: head dim, fwd or bwd, causal or noncausal; shape batch 2 x seqlen 8192,
# nheads = 2048 / head dim (the benchmark sweep's middle point). Each kernel's report stays as
# $OUT/ncu-d<d>-<dir>-<causal>-<impl>.ncu-rep; SOURCE=1 also writes its source page (stall
# samples per SASS instruction) as ...-<impl>-sass.csv, which scripts/sass_hotspots.py reads.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./logs}
mkdir -p "$OUT"
for c in "$@"; do
  read -r d dir causal <<<"$c"
  flags=(--headdim "$d" --nheads $((2048 / d)) --batch 2 --seqlen 8192)
  [ "$causal" = causal ] && flags+=(--causal)
  [ "$dir" = fwd ] && flags+=(--forward)
  if [ "$dir" = fwd ]; then ours=fwd_sm90_kernel; theirs=FlashAttnFwdSm90; else ours=bwd_sm90_kernel; theirs=FlashAttnBwdSm90; fi
  rep="$OUT/ncu-d$d-$dir-$causal.txt"
  : >"$rep"
  for impl in flashback fa3; do
    k=$ours; [ "$impl" = fa3 ] && k=$theirs
    echo "===== $impl d=$d $dir $causal" >>"$rep"
    base="$OUT/ncu-d$d-$dir-$causal-$impl"
    ncu --set full --kernel-name-base demangled -k "regex:$k" -s 1 -c 1 --clock-control none \
      -f -o "$base" python3 scripts/profile_attention.py --impl "$impl" "${flags[@]}" >>"$rep" 2>&1
    ncu -i "$base.ncu-rep" --page raw >>"$rep" 2>&1
    # Stall samples by SASS instruction, for scripts/sass_hotspots.py.
    [ "${SOURCE:-0}" = 1 ] && ncu -i "$base.ncu-rep" --page source --csv --print-source sass >"$base-sass.csv" 2>&1
  done
  echo "$rep: $(grep -c '' "$rep") lines"
done
