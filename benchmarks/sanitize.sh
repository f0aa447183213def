#!/usr/bin/env bash
# compute-sanitizer memcheck over every CUDA kernel of jdirect: each group of
# benchmarks/sanitize_kernels.py (reads, writes, fused updates; managed and
# pinned tables) in its own process, since the tool itself crashed
# (segmentation fault) in the pinned write group when it followed the managed
# groups in one process. Prints, per group, the script's last line and the
# tool's ERROR SUMMARY (none when the tool crashed); logs go to $OUT.
# Sourced or run from the repository root, after the build:
#   [SANITIZE_TIMEOUT=240] bash benchmarks/sanitize.sh [GROUP ...]   # GROUP: managed:reads ... pinned:fused
OUT=${OUT:-out}
mkdir -p "$OUT"
groups=${*:-managed:reads managed:writes managed:fused pinned:reads pinned:writes pinned:fused}
for group in $groups; do
  memory=${group%%:*} check=${group##*:}
  log="$OUT/sanitizer-$memory-$check.log"
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool memcheck \
    --print-limit 20 python3 benchmarks/sanitize_kernels.py --memory "$memory" \
    --check "$check" > "$log" 2>&1
  echo "$group: exit $? | $(grep -E "^sanitize_kernels: done|MISMATCH" "$log" | tr '\n' ' ')| $(grep -E "ERROR SUMMARY" "$log" | tail -1)"
done | tee "$OUT/sanitizer-summary.txt"
