// Managed (unified) memory tables, for comparison with zero-copy: the
// PyTorch unified-memory RFC's approach. C API for ctypes (jdirect/_ffi.py).
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
}

}  // namespace

extern "C" {

// Advice values (jdirect/managed_table.py): 0 none; 1 preferred location
// host, accessed by `device` (reads go over PCIe, pages stay put); 2
// preferred location `device` (pages migrate there on first touch).
//
// Refuses (returns null, err set) when `bytes` exceeds the device's free
// memory: oversubscribed managed memory can hang the GPU.
JDIRECT_EXPORT void* jdirect_cuda_managed_alloc(int64_t bytes, int32_t device, int32_t advice,
                                                char* err, int64_t errlen) {
  size_t free_bytes = 0, total = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_bytes, &total);
  if (e != cudaSuccess) {
    cudaGetLastError();
    SetError(err, errlen, "cudaMemGetInfo", e);
    return nullptr;
  }
  if (bytes <= 0 || static_cast<uint64_t>(bytes) > free_bytes) {
    if (err != nullptr && errlen > 0) {
      std::snprintf(err, static_cast<size_t>(errlen),
                    "refusing %lld bytes of managed memory: the GPU has %llu bytes free "
                    "(oversubscribing managed memory can hang the GPU)",
                    static_cast<long long>(bytes), static_cast<unsigned long long>(free_bytes));
    }
    return nullptr;
  }
  void* p = nullptr;
  e = cudaMallocManaged(&p, static_cast<size_t>(bytes), cudaMemAttachGlobal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    SetError(err, errlen, "cudaMallocManaged", e);
    return nullptr;
  }
  const cudaMemLocation host{cudaMemLocationTypeHost, 0};
  const cudaMemLocation gpu{cudaMemLocationTypeDevice, device};
  if (advice == 1) {
    e = cudaMemAdvise(p, static_cast<size_t>(bytes), cudaMemAdviseSetPreferredLocation, host);
    if (e == cudaSuccess) {
      e = cudaMemAdvise(p, static_cast<size_t>(bytes), cudaMemAdviseSetAccessedBy, gpu);
    }
  } else if (advice == 2) {
    e = cudaMemAdvise(p, static_cast<size_t>(bytes), cudaMemAdviseSetPreferredLocation, gpu);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    SetError(err, errlen, "cudaMemAdvise", e);
    cudaFree(p);
    return nullptr;
  }
  return p;
}

// Moves the pages to `device` ahead of use and waits.
JDIRECT_EXPORT int32_t jdirect_cuda_managed_prefetch(void* p, int64_t bytes, int32_t device,
                                                     char* err, int64_t errlen) {
  const cudaMemLocation gpu{cudaMemLocationTypeDevice, device};
  cudaError_t e = cudaMemPrefetchAsync(p, static_cast<size_t>(bytes), gpu, 0, nullptr);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    cudaGetLastError();
    SetError(err, errlen, "cudaMemPrefetchAsync", e);
    return 1;
  }
  return 0;
}

JDIRECT_EXPORT void jdirect_cuda_managed_free(void* p) {
  cudaFree(p);
  cudaGetLastError();
}

}  // extern "C"
