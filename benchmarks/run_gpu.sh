#!/usr/bin/env bash
# One device-machine session: build for Hopper, run the test suite on the
# GPU, compute-sanitizer over the gather and table tests, then the gather
# benchmark. Logs and JSON go to $OUT (or ./out).
#   RUN_TESTS=0 / RUN_SANITIZER=0 / RUN_BENCH=0 skip a stage;
#   BENCH_ARGS="..." passes arguments to benchmarks/gather.py.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_build.sh >> "$OUT/device.txt"; tail -1 "$OUT/device.txt"
TABLE_TESTS="tests/test_gather.py tests/test_host_table.py tests/test_table_kinds.py tests/test_table_inputs.py"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider "${@:-tests}" 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if [ "${RUN_SANITIZER:-1}" = 1 ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false compute-sanitizer --tool memcheck --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider $TABLE_TESTS \
    -k "address or rank1 or extreme or empty or readme or cached or int8 or out_dtype or sharing or every_kind or gpu_ or close" \
    > "$OUT/sanitizer.log" 2>&1
  grep -E "passed|failed|ERROR SUMMARY" "$OUT/sanitizer.log" | tail -3
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/gather.py --json "$OUT/gather.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
fi
