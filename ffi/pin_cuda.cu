// Page-locking of user-owned host memory for zero-copy GPU reads, exposed as
// a C API for ctypes (jdirect/_ffi.py). Python decides when; this file talks
// to the CUDA runtime and keeps the books.
//
// CUDA registers whole pages, and one page may hold the ends of two small
// arrays. So jdirect registers page-aligned intervals and reference-counts
// them across tables: a page stays pinned while any table on it is open, and
// two tables never fight over a registration. Memory that another library
// registered is used as it is and never unregistered here.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "registry.h"  // JDIRECT_EXPORT

namespace {

// Current drivers refuse one registration of >= 512 GiB.
constexpr uintptr_t kChunkBytes = uintptr_t{64} << 30;

struct Interval {
  uintptr_t end;
  int refs;
};

struct Books {
  std::mutex mu;
  std::map<uintptr_t, Interval> intervals;  // by start; disjoint, page-aligned
  std::map<int64_t, std::vector<uintptr_t>> pins;  // pin id -> interval starts
  int64_t next_pin = 1;
};

Books& GetBooks() {
  static Books* b = new Books;  // leaked: used until process exit
  return *b;
}

void SetError(char* err, int64_t errlen, const char* what, cudaError_t code) {
  if (err != nullptr && errlen > 0) {
    std::snprintf(err, static_cast<size_t>(errlen), "%s failed: %s (%d)", what,
                  cudaGetErrorString(code), static_cast<int>(code));
  }
}

uintptr_t PageBytes() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uintptr_t>(p) : 4096;
}

bool DeviceMapped(uintptr_t p) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, reinterpret_cast<void*>(p)) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost &&
         attr.devicePointer == reinterpret_cast<void*>(p);
}

// Registers [start, end) (page-aligned, not yet ours) in chunks, recording
// each chunk in `made`. A chunk another library already registered (and
// mapped) is used without being recorded, so it is never unregistered here.
// Returns false with `err` set on failure.
bool RegisterGap(Books& b, uintptr_t start, uintptr_t end, unsigned flags,
                 std::vector<uintptr_t>* made, char* err, int64_t errlen) {
  for (uintptr_t chunk = start; chunk < end;) {
    const uintptr_t stop = std::min(end, chunk + kChunkBytes);
    cudaError_t e = cudaHostRegister(reinterpret_cast<void*>(chunk), stop - chunk, flags);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();
      if (DeviceMapped(chunk) && DeviceMapped(stop - 1)) {
        chunk = stop;
        continue;
      }
      SetError(err, errlen, "cudaHostRegister (memory partly registered elsewhere)", e);
      return false;
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      SetError(err, errlen, "cudaHostRegister", e);
      return false;
    }
    b.intervals[chunk] = Interval{stop, 0};
    made->push_back(chunk);
    // Zero-copy kernels use the host address itself (unified addressing).
    if (!DeviceMapped(chunk)) {
      SetError(err, errlen, "cudaHostGetDevicePointer (unified addressing)",
               cudaErrorNotSupported);
      return false;
    }
    chunk = stop;
  }
  return true;
}

void Release(Books& b, const std::vector<uintptr_t>& starts) {
  for (uintptr_t s : starts) {
    auto it = b.intervals.find(s);
    if (it == b.intervals.end()) continue;
    if (--it->second.refs <= 0) {
      cudaHostUnregister(reinterpret_cast<void*>(s));
      cudaGetLastError();
      b.intervals.erase(it);
    }
  }
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
// Returns a pin id (> 0) for jdirect_cuda_unpin, 0 for an empty range, or -1
// on error (err says why).
JDIRECT_EXPORT int64_t jdirect_cuda_pin(void* ptr, int64_t bytes, int32_t read_only,
                                        char* err, int64_t errlen) {
  if (bytes <= 0) return 0;
  const uintptr_t page = PageBytes();
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr) / page * page;
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(ptr) + static_cast<uintptr_t>(bytes) + page - 1) / page * page;
  unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
  if (read_only) flags |= cudaHostRegisterReadOnly;

  Books& b = GetBooks();
  std::lock_guard<std::mutex> lock(b.mu);
  std::vector<uintptr_t> used, made;
  // Walk [start, end): reuse our intervals that overlap it, register the gaps.
  uintptr_t cursor = start;
  auto it = b.intervals.upper_bound(start);
  if (it != b.intervals.begin() && std::prev(it)->second.end > start) --it;
  bool ok = true;
  for (; ok && cursor < end; ) {
    if (it != b.intervals.end() && it->first < end) {
      if (it->first > cursor) {
        ok = RegisterGap(b, cursor, it->first, flags, &made, err, errlen);
      }
      used.push_back(it->first);
      cursor = std::max(cursor, it->second.end);
      ++it;
    } else {
      ok = RegisterGap(b, cursor, end, flags, &made, err, errlen);
      cursor = end;
    }
  }
  if (!ok) {
    for (uintptr_t s : made) b.intervals[s].refs = 1;
    Release(b, made);
    return -1;
  }
  used.insert(used.end(), made.begin(), made.end());
  for (uintptr_t s : used) ++b.intervals[s].refs;
  const int64_t id = b.next_pin++;
  b.pins[id] = std::move(used);
  return id;
}

JDIRECT_EXPORT void jdirect_cuda_unpin(int64_t pin) {
  Books& b = GetBooks();
  std::lock_guard<std::mutex> lock(b.mu);
  auto it = b.pins.find(pin);
  if (it == b.pins.end()) return;
  Release(b, it->second);
  b.pins.erase(it);
}

}  // extern "C"
