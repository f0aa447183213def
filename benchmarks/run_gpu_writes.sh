#!/usr/bin/env bash
# Device-machine check of jdirect.write_rows (issue 18 item 1): build for
# Hopper, the write tests on the GPU (every kind of host memory), the table
# and gather tests that the HostTable's write token touches, then
# compute-sanitizer memcheck over the write kernels (benchmarks/sanitize.sh;
# with no arguments it covers every kernel group), then the write benchmark
# (benchmarks/writes.py). Logs, JSON and the PNG go to $OUT (or ./out).
#   bash benchmarks/run_gpu_writes.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_build.sh >> "$OUT/device.txt"; tail -1 "$OUT/device.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_write.py tests/test_write_order.py 2>&1 \
  | tee "$OUT/pytest-write.log" | tail -15
python3 -m pytest -q -p no:cacheprovider tests/test_host_table.py tests/test_gather.py \
  tests/test_table_kinds.py tests/test_async_gather.py tests/test_replicated.py 2>&1 \
  | tee "$OUT/pytest-tables.log" | tail -15
# memcheck over the pytest files crashed the tool under JAX; the standalone
# script drives the same kernels.
bash benchmarks/sanitize.sh managed:writes pinned:writes
# Throughput of set/add into managed and pinned tables against the D2H memcpy.
XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/writes.py --table-gb 8 \
  --json "$OUT/writes.json" 2>&1 | tee "$OUT/writes-bench.log" | tail -20
