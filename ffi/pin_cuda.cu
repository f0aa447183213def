// Page-locking of user-owned host memory for zero-copy GPU reads, exposed as
// a C API for ctypes (jdirect/_ffi.py). Python decides when; this file only
// talks to the CUDA runtime and reports its errors as text.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <unistd.h>

#include "registry.h"  // JDIRECT_EXPORT

namespace {

// Current drivers refuse one registration of >= 512 GiB; chunks stay far
// below that and end on page boundaries so no page is registered twice.
constexpr int64_t kChunkBytes = int64_t{64} << 30;

void SetError(char* err, int64_t errlen, const char* what, cudaError_t code) {
  if (err != nullptr && errlen > 0) {
    std::snprintf(err, static_cast<size_t>(errlen), "%s failed: %s (%d)", what,
                  cudaGetErrorString(code), static_cast<int>(code));
  }
}

int64_t PageBytes() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? p : 4096;
}

// Calls fn(chunk, stop) over [begin, end) in registration chunks; stops at
// and returns the first non-zero result.
template <typename Fn>
int32_t ForEachChunk(char* begin, char* end, Fn fn) {
  const int64_t page = PageBytes();
  for (char* chunk = begin; chunk < end;) {
    uintptr_t next = reinterpret_cast<uintptr_t>(chunk) + kChunkBytes;
    next -= next % page;
    char* stop = std::min(end, reinterpret_cast<char*>(next));
    if (int32_t r = fn(chunk, stop); r != 0) return r;
    chunk = stop;
  }
  return 0;
}

void UnpinRange(char* begin, char* end) {
  ForEachChunk(begin, end, [](char* chunk, char*) {
    cudaHostUnregister(chunk);
    return 0;
  });
}

}  // namespace

extern "C" {

JDIRECT_EXPORT int32_t jdirect_cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Pins [ptr, ptr + bytes) for mapped, portable access from every device.
// Returns 0 when pinned here, 2 when the memory was already registered by
// someone else (leave it to them: do not unpin), 1 on error (err says why).
JDIRECT_EXPORT int32_t jdirect_cuda_pin(void* ptr, int64_t bytes,
                                        int32_t read_only, char* err,
                                        int64_t errlen) {
  if (bytes <= 0) return 0;
  unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
  if (read_only) flags |= cudaHostRegisterReadOnly;
  char* base = static_cast<char*>(ptr);
  return ForEachChunk(base, base + bytes, [&](char* chunk, char* stop) {
    cudaError_t e = cudaHostRegister(chunk, stop - chunk, flags);
    if (e == cudaErrorHostMemoryAlreadyRegistered && chunk == base) {
      cudaGetLastError();
      return 2;
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      SetError(err, errlen, "cudaHostRegister", e);
      UnpinRange(base, chunk);
      return 1;
    }
    // Zero-copy kernels use the host address itself, which needs unified
    // addressing: the device alias must equal the host pointer.
    void* dev = nullptr;
    e = cudaHostGetDevicePointer(&dev, chunk, 0);
    if (e != cudaSuccess || dev != chunk) {
      cudaGetLastError();
      SetError(err, errlen, "cudaHostGetDevicePointer (unified addressing)",
               e == cudaSuccess ? cudaErrorNotSupported : e);
      UnpinRange(base, stop);
      return 1;
    }
    return 0;
  });
}

JDIRECT_EXPORT void jdirect_cuda_unpin(void* ptr, int64_t bytes) {
  if (bytes <= 0) return;
  char* base = static_cast<char*>(ptr);
  UnpinRange(base, base + bytes);
}

// Waits for all work on every device: called by close() after the registry
// has stopped new launches and before memory is unpinned.
JDIRECT_EXPORT int32_t jdirect_cuda_synchronize(char* err, int64_t errlen) {
  int n = 0, current = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetDevice(&current);
  int32_t status = 0;
  for (int d = 0; d < n; ++d) {
    cudaError_t e = cudaSetDevice(d);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess && status == 0) {
      SetError(err, errlen, "cudaDeviceSynchronize", e);
      status = 1;
    }
  }
  cudaSetDevice(current);
  return status;
}

}  // extern "C"
