// The CUDA gather kernel and the sort-key kernel of the address-order path.
//
// One kernel serves both orders of access; a `Rows` policy says, for the
// k-th work row, which table row to read (-1: the fill value) and where in
// the output it goes:
// - CallerRows: row k is index k, written at position k (one pass);
// - SortedRows: rows come from a CUB sort of the resolved indices, so they
//   are read in ascending address order (repeats adjacent, so they hit L2)
//   and written to the caller's positions. Over PCIe into pinned memory
//   every random row costs an address translation; ascending order shares
//   translations between neighbours.
#ifndef JDIRECT_FFI_GATHER_KERNELS_CUH_
#define JDIRECT_FFI_GATHER_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "index.h"

namespace jdirect {

constexpr int kThreads = 256;
// Independent loads each thread issues before its first store: PCIe reads
// take microseconds, so latency is hidden only with many in flight.
constexpr int kUnroll = 4;

template <typename V>
__device__ __forceinline__ V FillVector(const FillPattern& fill, int64_t v) {
  // sizeof(V) divides 16, so a vector never straddles the pattern's end.
  const char* bytes = reinterpret_cast<const char*>(&fill);
  return *reinterpret_cast<const V*>(bytes + ((v * sizeof(V)) & 15));
}

template <typename I>
struct CallerRows {
  const I* __restrict__ idx;
  int64_t nrows;
  Mode mode;

  __device__ __forceinline__ int64_t row(int64_t k) const {
    return ResolveRow(idx[k], nrows, mode);
  }
  __device__ __forceinline__ int64_t position(int64_t k) const { return k; }
};

// Keys are resolved rows, with `fill_key` (= nrows, sorting last) for fills.
template <typename K>
struct SortedRows {
  const K* __restrict__ keys;
  const int32_t* __restrict__ positions;
  K fill_key;

  __device__ __forceinline__ int64_t row(int64_t k) const {
    const K key = keys[k];
    return key == fill_key ? -1 : static_cast<int64_t>(key);
  }
  __device__ __forceinline__ int64_t position(int64_t k) const { return positions[k]; }
};

// Work is flattened to (row, vector-in-row) items so that consecutive
// threads read consecutive vectors of one row (coalesced) and short rows
// still keep every lane busy. `T` is the item counter: 32 bits whenever the
// item count fits, because 64-bit division costs several times more
// instructions. No thread loops over a run of equal rows, so a hot row
// cannot serialise a warp.
template <typename V, typename T, typename Rows>
__global__ void GatherKernel(const char* __restrict__ table, Rows rows, T vecs_per_row,
                             T total, V* __restrict__ out, FillPattern fill,
                             DeviceCache cache) {
  const T stride = static_cast<T>(gridDim.x) * blockDim.x;
  const int64_t row_bytes = static_cast<int64_t>(vecs_per_row) * sizeof(V);
  for (T base = static_cast<T>(blockIdx.x) * blockDim.x + threadIdx.x; base < total;
       base += stride * kUnroll) {
    V vals[kUnroll];
    int64_t dst[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const T item = base + u * stride;
      if (item < total) {
        const T k = item / vecs_per_row;
        const T v = item - k * vecs_per_row;
        const int64_t r = rows.row(k);
        dst[u] = rows.position(k) * static_cast<int64_t>(vecs_per_row) + v;
        vals[u] = r >= 0 ? reinterpret_cast<const V*>(RowAddress(table, r, row_bytes, cache))[v]
                         : FillVector<V>(fill, v);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * stride < total) out[dst[u]] = vals[u];
    }
  }
}

// Sort keys: the resolved row, or nrows (sorting last) for a fill.
template <typename I, typename K>
__global__ void ResolveKeysKernel(const I* __restrict__ idx, int64_t n,
                                  int64_t nrows, Mode mode, K* __restrict__ keys,
                                  int32_t* __restrict__ positions) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const int64_t r = ResolveRow(idx[i], nrows, mode);
    keys[i] = static_cast<K>(r >= 0 ? r : nrows);
    positions[i] = static_cast<int32_t>(i);
  }
}

}  // namespace jdirect

#endif  // JDIRECT_FFI_GATHER_KERNELS_CUH_
