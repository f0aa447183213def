#!/usr/bin/env bash
# Device session for the GraphSAGE issue and the sanitizer: build, GPU tests,
# graphsage benchmark on `products`, compute-sanitizer over the gather tests.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps -e . \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 2>&1 | tail -3
if [ "${RUN_PROBE:-1}" = 1 ]; then
  for mode in jdirect device; do
    python3 benchmarks/probe_overlap.py $mode 2>&1 | tee -a "$OUT/probe.log" | tail -1
  done
  grep -q "probe (device) ok" "$OUT/probe.log" || { echo "overlap probe failed"; exit 3; }
fi
if [ "${RUN_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" | tail -8
fi
if [ "${RUN_GRAPHSAGE:-1}" = 1 ]; then
  python3 benchmarks/graphsage.py --json "$OUT/graphsage.json" ${GRAPHSAGE_ARGS:-} 2>&1 \
    | tee "$OUT/graphsage.log" | tail -14
fi
if [ "${RUN_SANITIZER:-1}" = 1 ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${SANITIZER_TIMEOUT:-300}" \
    compute-sanitizer --tool memcheck --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/test_gather.py tests/test_host_table.py \
      -k "${SANITIZER_K:-address or rank1 or extreme or empty or readme or cached or int8 or out_dtype or managed or sharing}" 2>&1 \
    | tee "$OUT/sanitizer.log" | tail -12
fi
