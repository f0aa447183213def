#!/usr/bin/env bash
# Builds jdirect in place on a device machine (no network): pip's editable
# install when scikit-build-core is there, else CMake directly with the
# libraries copied into jdirect/. Source it: it exports PYTHONPATH.
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
# A warm machine keeps ignored build outputs between calls: build again only
# when the native sources changed since the last build there.
cuda_built() { python3 -c "import sys, jdirect; sys.exit(not jdirect.has_cuda())" 2> /dev/null; }
stamp=$(cat ffi/* CMakeLists.txt pyproject.toml | sha1sum | cut -c1-16)
if [ "$(cat build/gpu-stamp 2>/dev/null)" = "$stamp" ] && cuda_built; then
  echo "build up to date ($stamp)" > "$OUT/build.log"
else
  if ! python3 -m pip install -q --no-build-isolation --no-deps -e . \
      -C cmake.define.JDIRECT_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
      > "$OUT/build.log" 2>&1; then
    { cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DJDIRECT_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DPython_EXECUTABLE="$(which python3)" && ninja -C build/gpu &&
      cp build/gpu/libjdirect_cpu.so build/gpu/libjdirect_cuda.so jdirect/; } >> "$OUT/build.log" 2>&1
  fi
  if cuda_built; then
    mkdir -p build && echo "$stamp" > build/gpu-stamp
  fi
fi
python3 -c "import jax, jdirect; print('jax', jax.__version__, jax.devices(), 'cuda lib', jdirect.has_cuda())"
