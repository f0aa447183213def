#!/usr/bin/env bash
# Builds and runs sm_lean_read.cu (issue 54, item 3) on a GPU machine; the
# table goes to stdout and $OUT/$LOG (default sm_lean_read.log), the
# kernels' register use to $OUT/sm_lean_ptxas.log. cuBLAS: the CUDA toolkit's where nvcc has it,
# else the nvidia-cublas wheel that JAX's CUDA plugin installs.
#   bash benchmarks/probes/run_sm_lean.sh [--table-gb 4] [--ids 2000000] [--gemms 40] [--n 8192]
set -euo pipefail
out=${OUT:-/tmp/sm_lean}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

blas=(-lcublas)
if ! echo '#include <cublas_v2.h>' | nvcc -x cu -E - -o /dev/null 2>/dev/null; then
  wheel=$(python3 - <<'PY'
import glob, os
try:
    import nvidia  # the namespace package of NVIDIA's wheels
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    for header in sorted(glob.glob(os.path.join(root, "*", "include", "cublas_v2.h"))):
        print(os.path.dirname(os.path.dirname(header)))
        raise SystemExit
PY
)
  [ -n "$wheel" ] || { echo "no cuBLAS: neither the CUDA toolkit nor an nvidia-cublas wheel"; exit 1; }
  # The wheel ships libcublas.so.N only: a link named for -lcublas.
  for lib in "$wheel"/lib/libcublas*.so.*; do
    base=$(basename "$lib"); ln -s "$lib" "$build/${base%%.so.*}.so"
  done
  blas=(-I"$wheel/include" -L"$build" -lcublas -Xlinker -rpath="$wheel/lib")
fi
nvcc -O3 -std=c++17 -arch=sm_90 -Xptxas -v "$here/sm_lean_read.cu" "${blas[@]}" \
  -o "$build/probe" 2> "$out/sm_lean_ptxas.log"
timeout 300 "$build/probe" "$@" 2>&1 | tee "$out/${LOG:-sm_lean_read.log}"
