#!/usr/bin/env bash
# Device session for the training issues: build for Hopper, run the GPU test
# suite, then the sampler and GraphSAGE benchmarks on `products`. Each step
# can be skipped (RUN_TESTS=0 ...); logs and JSON go to $OUT.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source benchmarks/gpu_build.sh
if [ "${RUN_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests} 2>&1 | tee "$OUT/pytest.log" | tail -8
fi
if [ "${RUN_SAMPLER:-1}" = 1 ]; then
  python3 benchmarks/sampler.py --json "$OUT/sampler.json" 2>&1 | tee "$OUT/sampler.log" | tail -8
fi
if [ "${RUN_GRAPHSAGE:-1}" = 1 ]; then
  python3 benchmarks/graphsage.py --json "$OUT/graphsage.json" ${GRAPHSAGE_ARGS:-} 2>&1 \
    | tee "$OUT/graphsage.log" | tail -22
fi
