// CUDA kernels of the gather. Two orders of access:
// - caller order (GatherKernel): one pass, each index read where it stands;
// - address order (ResolveKeysKernel, CUB sort, GatherSortedKernel): rows
//   are read in ascending address order (duplicates adjacent, so repeats
//   hit L2) and scattered to the caller's positions. Over PCIe every random row costs an
//   address translation (~35 M rows/s on the measured VM); ascending order
//   shares translations between neighbours and restores the link's rate.
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

// Work is flattened to (index, vector-in-row) items so that consecutive
// threads read consecutive vectors of one row (coalesced), and short rows
// still keep every lane busy.
template <typename V, typename I>
__global__ void GatherKernel(const char* __restrict__ table, int64_t nrows,
                             const I* __restrict__ idx, int64_t vecs_per_row,
                             int64_t total, V* __restrict__ out, Mode mode,
                             FillPattern fill, DeviceCache cache) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_bytes = vecs_per_row * static_cast<int64_t>(sizeof(V));
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       base < total; base += stride * kUnroll) {
    V vals[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t item = base + u * stride;
      if (item < total) {
        const int64_t i = item / vecs_per_row;
        const int64_t v = item - i * vecs_per_row;
        const int64_t r = ResolveRow(idx[i], nrows, mode);
        vals[u] = r >= 0 ? reinterpret_cast<const V*>(RowAddress(table, r, row_bytes, cache))[v]
                         : FillVector<V>(fill, v);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t item = base + u * stride;
      if (item < total) out[item] = vals[u];
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

// Items are (sorted index, vector-in-row): rows are read in ascending
// address order and written to the caller's positions. Duplicates are
// adjacent after the sort, so their repeated reads hit L2 instead of PCIe;
// no thread loops over a run, so a hot row cannot serialise a warp.
template <typename V, typename K>
__global__ void GatherSortedKernel(const char* __restrict__ table,
                                   const K* __restrict__ keys,
                                   const int32_t* __restrict__ positions,
                                   int64_t n, K fill_key, int64_t vecs_per_row,
                                   V* __restrict__ out, FillPattern fill,
                                   DeviceCache cache) {
  const int64_t total = n * vecs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_bytes = vecs_per_row * static_cast<int64_t>(sizeof(V));
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       base < total; base += stride * kUnroll) {
    V vals[kUnroll];
    int64_t dst[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t item = base + u * stride;
      if (item < total) {
        const int64_t k = item / vecs_per_row;
        const int64_t v = item - k * vecs_per_row;
        const K key = keys[k];
        dst[u] = static_cast<int64_t>(positions[k]) * vecs_per_row + v;
        vals[u] = key == fill_key
                      ? FillVector<V>(fill, v)
                      : reinterpret_cast<const V*>(RowAddress(
                            table, static_cast<int64_t>(key), row_bytes, cache))[v];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * stride < total) out[dst[u]] = vals[u];
    }
  }
}

}  // namespace jdirect

#endif  // JDIRECT_FFI_GATHER_KERNELS_CUH_
