#!/usr/bin/env bash
# One device-machine session: build for Hopper, run the test suite on the
# GPU, then the gather benchmark. Logs and JSON go to $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$OUT/device.txt"
python3 -m pip install -q --no-build-isolation --no-deps -e . \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 2>&1 | tail -3
python3 -c "import jax, jdirect; print('jax', jax.__version__, jax.devices(), 'cuda lib', jdirect.has_cuda())" | tee -a "$OUT/device.txt"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider "${@:-tests}" 2>&1 | tee "$OUT/pytest.log" | tail -25
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false python3 benchmarks/gather.py --json "$OUT/gather.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
fi
