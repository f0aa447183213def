#!/usr/bin/env bash
# Builds jdirect in place on a device machine (no network): pip's editable
# install when scikit-build-core is there, else CMake directly with the
# libraries copied into jdirect/. Source it: it exports PYTHONPATH.
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -m pip install -q --no-build-isolation --no-deps -e . \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1; then
  { cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DPython_EXECUTABLE="$(which python3)" && ninja -C build/gpu &&
    cp build/gpu/libjdirect_cpu.so build/gpu/libjdirect_cuda.so jdirect/; } >> "$OUT/build.log" 2>&1
fi
python3 -c "import jax, jdirect; print('jax', jax.__version__, jax.devices(), 'cuda lib', jdirect.has_cuda())"
