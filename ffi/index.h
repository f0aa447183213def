// Index resolution shared by the CPU and CUDA gathers: one definition of
// jnp.take's index semantics, so both backends agree bit for bit.
#ifndef JDIRECT_FFI_INDEX_H_
#define JDIRECT_FFI_INDEX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define JDIRECT_HD __host__ __device__ __forceinline__
#else
#define JDIRECT_HD inline
#endif

namespace jdirect {

// Values match jdirect/gather.py's _MODES.
enum class Mode : int64_t { kFill = 0, kClip = 1, kWrap = 2 };

inline bool IsValidMode(int64_t m) { return m >= 0 && m <= 2; }

// Returns the table row for `raw`, or -1 when jnp.take would yield the fill
// value. Requires nrows > 0. The result is always in [-1, nrows): this is
// the single place that keeps every read inside the table.
template <typename I>
JDIRECT_HD int64_t ResolveRow(I raw, int64_t nrows, Mode mode) {
  int64_t i = static_cast<int64_t>(raw);
  switch (mode) {
    case Mode::kClip:
      // jnp.take's clip mode does not wrap negative indices: they clip to 0.
      return i < 0 ? 0 : (i >= nrows ? nrows - 1 : i);
    case Mode::kWrap: {
      int64_t r = i % nrows;
      return r < 0 ? r + nrows : r;
    }
    case Mode::kFill:
    default:
      // Negative indices wrap once (i + nrows cannot overflow for i < 0).
      if (i < 0) i += nrows;
      return (i >= 0 && i < nrows) ? i : -1;
  }
}

// The fill element's bytes repeated to 16 bytes. Every element size jnp
// supports (1, 2, 4, 8, 16) divides 16, so byte k of any output row is
// bytes[k % 16] whatever the row width.
struct FillPattern {
  uint64_t lo;
  uint64_t hi;
};

// Rows of a cached table kept in device memory: row r lives at slot
// slots[r] of `rows` if that slot is in [0, count), else in the host table:
// at host row r, or, for a host table of only the uncached rows
// (`compact_rows` >= 0, CachedTable.of_uncached), at host row -2 - slots[r].
// An uncached table has slots == nullptr. The bound checks keep a bad slot
// map from reading outside the cache or the host table (a compact host
// table has at least one row: a cache of every row is read by XLA).
struct DeviceCache {
  const int32_t* slots = nullptr;
  const char* rows = nullptr;
  int64_t count = 0;
  int64_t compact_rows = -1;
};

JDIRECT_HD const char* RowAddress(const char* table, int64_t r, int64_t row_bytes,
                                  const DeviceCache& cache) {
  if (cache.slots != nullptr) {
    const int64_t s = cache.slots[r];
    if (s >= 0 && s < cache.count) return cache.rows + s * row_bytes;
    if (cache.compact_rows >= 0) {
      const int64_t k = -2 - s;
      return table + (k >= 0 && k < cache.compact_rows ? k : 0) * row_bytes;
    }
  }
  return table + r * row_bytes;
}

}  // namespace jdirect

#endif  // JDIRECT_FFI_INDEX_H_
