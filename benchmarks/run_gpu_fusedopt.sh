#!/usr/bin/env bash
# Device-machine check of the fused sparse optimizer step (jdirect.sparse_update,
# issue 18's sparse Adam target): build for Hopper, the sparse optimizer tests on
# the GPU, compute-sanitizer memcheck over the fused-update kernels on small
# managed and pinned tables (benchmarks/sanitize.sh; with no arguments it
# covers every kernel group), then
# the embeddings benchmark at the size (50M x 128 float32 + Adam
# moments, 1M ids). Logs and JSON/PNG go to $OUT (or ./out). About 6 minutes on an H200.
#   bash benchmarks/run_gpu_fusedopt.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 150 bash -c 'source benchmarks/gpu_build.sh' >> "$OUT/device.txt" 2>&1
tail -1 "$OUT/device.txt"
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_update.py \
  tests/test_sparse_optim.py 2>&1 | tee "$OUT/pytest-fusedopt.log" | tail -8
bash benchmarks/sanitize.sh managed:fused pinned:fused
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 420 python3 benchmarks/embeddings.py \
  --batches 1048576 --dists uniform zipf --out "$OUT" 2>&1 | tee "$OUT/embeddings-bench.log" \
  | tail -25
