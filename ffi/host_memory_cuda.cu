// Host memory that GPU gathers read fastest, allocated by jdirect
// (jdirect/host_memory.py decides which kind and keeps the books). C API for
// ctypes (jdirect/_ffi.py).
//
// - Managed: cudaMallocManaged with the preferred location on the
//   host and every GPU marked as accessing it. Pages stay in host memory (no
//   migration) and GPUs map them with 64 KB / 2 MB translation entries, so
//   random row reads are not capped by translations as with pinned memory
//   (4 KB entries): measured faster random gathers on an H200
//   (benchmarks/results/journal/LOG.md, 2026-11-22).
// Pinned memory is not allocated here: jdirect/host_memory.py maps and
// touches its pages, and ffi/pin_cuda.cu registers them.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "registry.h"  // JDIRECT_EXPORT

namespace {

void SetError(char* err, int64_t errlen, const char* what, cudaError_t code) {
  if (err != nullptr && errlen > 0) {
    std::snprintf(err, static_cast<size_t>(errlen), "%s failed: %s (%d)", what,
                  cudaGetErrorString(code), static_cast<int>(code));
  }
  cudaGetLastError();
}

cudaError_t AdviseHostResident(void* p, size_t bytes) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  const cudaMemLocation host{cudaMemLocationTypeHost, 0};
  if (e == cudaSuccess) e = cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, host);
  for (int d = 0; e == cudaSuccess && d < devices; ++d) {
    const cudaMemLocation gpu{cudaMemLocationTypeDevice, d};
    e = cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, gpu);
  }
  return e;
}

}  // namespace

extern "C" {

// Smallest free memory over the local GPUs, and that GPU's total. Returns 0,
// or 1 with `err` set.
JDIRECT_EXPORT int32_t jdirect_cuda_mem_info(int64_t* free_bytes, int64_t* total_bytes,
                                             char* err, int64_t errlen) {
  int devices = 0, current = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e == cudaSuccess && devices == 0) e = cudaErrorNoDevice;
  if (e == cudaSuccess) e = cudaGetDevice(&current);
  *free_bytes = -1;
  for (int d = 0; e == cudaSuccess && d < devices; ++d) {
    size_t f = 0, t = 0;
    e = cudaSetDevice(d);
    if (e == cudaSuccess) e = cudaMemGetInfo(&f, &t);
    if (e == cudaSuccess && (*free_bytes < 0 || static_cast<int64_t>(f) < *free_bytes)) {
      *free_bytes = static_cast<int64_t>(f);
      *total_bytes = static_cast<int64_t>(t);
    }
  }
  cudaSetDevice(current);
  if (e != cudaSuccess) {
    SetError(err, errlen, "cudaMemGetInfo", e);
    return 1;
  }
  return 0;
}

// Allocates `bytes` (> 0) of host-resident managed memory. Returns null with
// `err` set on failure. (Pinned memory is registered in place by
// jdirect_cuda_pin: jdirect/host_memory.py first touches its pages on many
// threads, which cudaHostAlloc does on one.)
JDIRECT_EXPORT void* jdirect_cuda_managed_alloc(int64_t bytes, char* err, int64_t errlen) {
  void* p = nullptr;
  const size_t n = static_cast<size_t>(bytes);
  cudaError_t e = cudaMallocManaged(&p, n, cudaMemAttachGlobal);
  if (e != cudaSuccess) {
    SetError(err, errlen, "cudaMallocManaged", e);
    return nullptr;
  }
  e = AdviseHostResident(p, n);
  if (e != cudaSuccess) {
    SetError(err, errlen, "cudaMemAdvise", e);
    cudaFree(p);
    return nullptr;
  }
  return p;
}

JDIRECT_EXPORT void jdirect_cuda_managed_free(void* p) {
  cudaFree(p);
  cudaGetLastError();
}

}  // extern "C"
