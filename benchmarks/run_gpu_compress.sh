#!/usr/bin/env bash
# Device session for issue 21 item 1 (compressed rows and the cache as
# trainer features): build for Hopper, the row-encoding tests on the
# GPU, then on `products` (device sampler, overlap on) the
# epochs of float32 / bfloat16 / int8 rows, each without a cache (`jdirect`)
# and with 20 % of the encoded table cached (`jdirect-cache`), the defaults
# (auto rows, auto cache), and the all-in-GPU `device` source in the same
# run, with their PCIe counters; then accuracy over 3 seeds per encoding.
# Every command runs under `timeout` (build, 90 s, 320 s: under 480 s with a
# warm build). Logs, JSON and PNG go to $OUT.
#   RUN_TESTS=0 / RUN_BENCH=0 skip a stage.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_build.sh >> "$OUT/device.txt"; tail -1 "$OUT/device.txt"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee -a "$OUT/device.txt"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_row_encoding.py 2>&1 \
    | tee "$OUT/pytest_compress.log" | tail -6
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  # One process, one graph: the timed epochs (written first), then 3 seeds x
  # 3 epochs of float32 / bfloat16 / int8 rows for accuracy.
  timeout 320 python3 benchmarks/row_encoding.py --dataset products --epochs 3 --seeds 3 \
    --acc-epochs 3 --json "$OUT/row_encoding.json" 2>&1 | tee "$OUT/row_encoding.log" | tail -45
fi
