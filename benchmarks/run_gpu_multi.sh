#!/usr/bin/env bash
# Device session for several GPUs (nvidia-h200-x2): build, the GPU tests
# (multi-device ones run on the real GPUs), a two-process CLI run on
# `products` (one GPU each), then the scaling benchmarks. Steps can be
# skipped (RUN_TESTS=0 ...) and bounded (*_TIMEOUT, seconds); PROCESSES=0
# skips the scaling run as two processes; logs and JSON go to $OUT. The machine's NCCL
# settings (NVLink multicast off) are inherited by every process started.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source benchmarks/gpu_build.sh
env | grep -E '^(NCCL|CUDA)_' | sort > "$OUT/env.txt"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
if [ "${RUN_TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests} 2>&1 \
    | tee "$OUT/pytest.log" | tail -8
fi
if [ "${RUN_CLI:-1}" = 1 ]; then
  cli() {
    timeout ${CLI_TIMEOUT:-240} python3 examples/train_graphsage.py --config products --no-baseline \
      --coordinator localhost:12355 --num-processes 2 --process-id "$1" --local-device-ids "$1" \
      --metrics "$OUT/cli-2proc.json" > "$OUT/cli-2proc-p$1.log" 2>&1
  }
  cli 1 & cli 0; wait
  tail -6 "$OUT/cli-2proc-p0.log"
fi
if [ "${RUN_SCALING:-1}" = 1 ]; then
  timeout "${PRODUCTS_TIMEOUT:-420}" python3 benchmarks/scaling.py --features jdirect --epochs 3 \
    --processes "${PROCESSES:-2}" --out "$OUT/scaling-products" 2>&1 \
    | tee "$OUT/scaling-products.log" | tail -8
  timeout "${PAPERS_TIMEOUT:-300}" python3 benchmarks/scaling.py --config configs/papers100m.py \
    --processes 0 --epochs 2 --out "$OUT/scaling-papers" 2>&1 \
    | tee "$OUT/scaling-papers.log" | tail -8
fi
