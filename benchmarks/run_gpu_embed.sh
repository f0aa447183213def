#!/usr/bin/env bash
# Device session for issue 18 items 2, 3 and 5 (trainable host-resident
# embeddings): build for Hopper, the embedding, sparse-optimizer and table
# checkpoint tests on the GPU (with the write tests they rest on), then the
# embedding benchmark at the sizes (50M x 128 float32, 77 GB with
# Adam's moments, in managed host memory; needs an H200's free memory and
# ~90 GB of host RAM; about 4 minutes). Logs, JSON and PNG go to $OUT.
#   RUN_TESTS=0 / RUN_BENCH=0 skip a stage; BENCH_ARGS="..." adds arguments
#   (e.g. "--rows 20000000" on an H100, whose free memory caps managed tables).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_build.sh >> "$OUT/device.txt"; tail -1 "$OUT/device.txt"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -p no:cacheprovider \
    tests/test_embedding.py tests/test_sparse_optim.py tests/test_embedding_checkpoint.py \
    2>&1 | tee "$OUT/pytest_embed.log" | tail -8
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  free -g | tee "$OUT/free.txt" | head -2
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 540 python3 benchmarks/embeddings.py \
    --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/embeddings.log" | tail -30
fi
