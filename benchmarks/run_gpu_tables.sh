#!/usr/bin/env bash
# Device session for the `tables` branch (issues 16 item 3 and 17, table
# level): build for Hopper, run the table test modules on the GPU with x64
# off and on, the trainer's cached feature mode end to end, then the gather
# benchmark for the kinds whose read path changed (CachedTable, Int8Table)
# beside the HostTable. Logs and JSON go to $OUT; any step can be skipped
# (RUN_TESTS=0, RUN_CACHE=0, RUN_BENCH=0).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source benchmarks/gpu_build.sh
TABLE_TESTS="tests/test_table_kinds.py tests/test_host_table.py tests/test_gather.py
  tests/test_async_gather.py tests/test_table_inputs.py tests/test_table_devices.py
  tests/test_replicated.py tests/test_transfer.py tests/test_table_regressions.py
  tests/test_table_properties.py"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider $TABLE_TESTS 2>&1 | tee "$OUT/pytest_tables.log" | tail -8
  JAX_ENABLE_X64=1 python3 -m pytest -q -p no:cacheprovider $TABLE_TESTS 2>&1 \
    | tee "$OUT/pytest_tables_x64.log" | tail -8
fi
if [ "${RUN_CACHE:-1}" = 1 ]; then
  # The trainer's paths through gather_start: CachedTable (feature mode
  # jdirect-cache) and the device sampler's HostTables.
  python3 -m pytest -q -p no:cacheprovider tests/test_pipeline.py tests/test_device_sampler.py \
    2>&1 | tee "$OUT/pytest_pipeline.log" | tail -8
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  # Compare with the jdirect, jdirect-cached and jdirect-int8 rows of
  # benchmarks/RESULTS.md (same GPU kind): within noise expected.
  python3 benchmarks/gather.py --table-gb 16 --methods jdirect jdirect-cached jdirect-int8 \
    --json "$OUT/gather_tables.json" 2>&1 | tee "$OUT/gather_tables.log" | tail -30
fi
