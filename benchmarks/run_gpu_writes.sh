#!/usr/bin/env bash
# Device-machine check of jdirect.write_rows (issue 18 item 1): build for
# Hopper, the write tests on the GPU (every kind of host memory), the table
# and gather tests that the HostTable's write token touches, then
# compute-sanitizer memcheck over the write tests. Logs go to $OUT (or ./out).
#   bash benchmarks/run_gpu_writes.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_build.sh >> "$OUT/device.txt"; tail -1 "$OUT/device.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_write.py 2>&1 \
  | tee "$OUT/pytest-write.log" | tail -15
python3 -m pytest -q -p no:cacheprovider tests/test_host_table.py tests/test_gather.py \
  tests/test_table_kinds.py tests/test_async_gather.py tests/test_replicated.py 2>&1 \
  | tee "$OUT/pytest-tables.log" | tail -15
XLA_PYTHON_CLIENT_PREALLOCATE=false compute-sanitizer --tool memcheck --print-limit 20 \
  python3 -m pytest -q -p no:cacheprovider tests/test_write.py > "$OUT/sanitizer-write.log" 2>&1
grep -E "passed|failed|ERROR SUMMARY" "$OUT/sanitizer-write.log" | tail -3
