// Ranges of a host array copied end to end on several threads, for layer-wise
// inference's restricted layers (jdirect/graph/_layer_nodes.py): each node's
// CSR range of source ids, laid out as the layer's edges. A C function called
// through ctypes, which releases the GIL: NumPy's np.repeat and np.arange hold
// it, so the same gather on Python threads ran largely one at a time.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "registry.h"  // JDIRECT_EXPORT

namespace {

// out[e - lo] for e in [a, b): element e of the concatenation, whose range r
// holds elements offsets[r] .. offsets[r + 1] - 1, taken from
// src[starts[r] + e - offsets[r]].
void CopyRanges(const char* src, const int64_t* starts, const int64_t* offsets, int64_t rows,
                int64_t itemsize, int64_t lo, int64_t a, int64_t b, char* out) {
  if (a >= b) return;
  // The range holding element a: the last r with offsets[r] <= a.
  int64_t r = std::upper_bound(offsets, offsets + rows + 1, a) - offsets - 1;
  for (int64_t e = a; e < b && r < rows; ++r) {
    const int64_t end = std::min(offsets[r + 1], b);
    if (end <= e) continue;  // an empty range
    std::memcpy(out + (e - lo) * itemsize, src + (starts[r] + e - offsets[r]) * itemsize,
                static_cast<size_t>((end - e) * itemsize));
    e = end;
  }
}

}  // namespace

extern "C" {

// Elements lo .. hi - 1 of the ranges' concatenation (see CopyRanges) into
// `out`, the output split evenly over `threads` threads. `offsets` has
// rows + 1 ascending entries from 0; every range lies inside `src`.
JDIRECT_EXPORT void jdirect_copy_ranges(const void* src, const int64_t* starts,
                                        const int64_t* offsets, int64_t rows, int64_t itemsize,
                                        int64_t lo, int64_t hi, void* out, int32_t threads) {
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(out);
  const int64_t n = hi - lo;
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  if (count == 1) {
    CopyRanges(from, starts, offsets, rows, itemsize, lo, lo, hi, to);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(count));
  for (int64_t t = 0; t < count; ++t) {
    const int64_t a = lo + n * t / count, b = lo + n * (t + 1) / count;
    pool.emplace_back(CopyRanges, from, starts, offsets, rows, itemsize, lo, a, b, to);
  }
  for (std::thread& thread : pool) thread.join();
}

}  // extern "C"
