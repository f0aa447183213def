#!/usr/bin/env bash
# Device check for issue 16 (graph/ split by role, behaviour unchanged):
# build for Hopper, the graph tests on the GPU, then the sampler benchmark
# and benchmarks/graphsage.py on `products` (device and CPU sampler, every
# feature source), to compare with the last recorded figures in
# benchmarks/RESULTS.md (the benchmark's `e2e_s` is now `epoch_s` and its
# `sample_s` is `device_sample_s`: jdirect/graph/metrics.py). Logs and JSON
# go to $OUT.
set -uo pipefail
OUT=${OUT:-out}
export OUT
TESTS="${TESTS:-tests/test_train.py tests/test_device_sampler.py tests/test_data_parallel.py \
tests/test_cli.py tests/test_sampler.py tests/test_pipeline.py tests/test_checkpoint.py}" \
  bash benchmarks/run_gpu_graphsage.sh
