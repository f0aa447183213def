// The CUDA neighbour sum (neighbor_sum_common.h), in two kernels on one
// stream. The first: one warp per (destination, column tile), its lanes
// across the row, sums the node's first kWarpEdges edges and stores them;
// it also lists the nodes with more edges (hubs). A warp loads 32 of the
// node's edge ids at once and then kEdges source rows before adding any, so
// that each warp keeps several rows in flight (random rows are bound by
// latency, not bytes, with one in flight). The second kernel adds the rest
// of each listed node, a block per node (blocks take the list's nodes in
// turn), its edges split over the block's warps and their sums added in
// warp order: a power-law graph's hubs (products' have ~50K edges) would
// otherwise hold one warp, and the call, for milliseconds after every other
// node is done. Results do not depend on the list's order (each hub is
// summed by one block in a fixed order): no float atomics.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gather_cuda.h"  // Blocks, MultiprocessorCount
#include "neighbor_sum_common.h"
#include "table_events.h"  // RecordTableRead
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kEdges = 8;             // source rows a warp reads before it adds them
constexpr int64_t kWarpEdges = 512;   // edges of a node the first kernel sums
constexpr int kHubWarps = 16;         // warps that split the rest of a node's edges

template <typename T, typename V>
struct Rows {
  static constexpr int kVec = sizeof(V) / sizeof(T);  // elements a lane reads a row
  const char* __restrict__ table;
  int64_t nrows;
  int64_t width;
  DeviceCache cache;  // a CachedTable's rows in device memory (slots null: none)
};

// Adds to `acc` (this lane's kVec columns from `col`) the rows of edges
// e, e + 32 .. below `hi` in batches of 32 starting at `begin` and every
// `stride` edges (a multiple of 32): each batch's ids in one load, its rows
// kEdges at a time.
template <typename T, typename V, typename I>
__device__ __forceinline__ void AddEdges(const Rows<T, V>& rows, const I* __restrict__ indices,
                                         int64_t begin, int64_t hi, int64_t stride, int64_t col,
                                         int lane, float* acc) {
  constexpr int kVec = Rows<T, V>::kVec;
  for (int64_t e = begin; e < hi; e += stride) {
    const int count = hi - e < 32 ? static_cast<int>(hi - e) : 32;
    const long long mine = lane < count ? static_cast<long long>(indices[e + lane]) : -1;
    for (int j = 0; j < count; j += kEdges) {
      V loaded[kEdges];
#pragma unroll
      for (int u = 0; u < kEdges; ++u) {
        // j + u <= 31: j is a multiple of kEdges below count <= 32.
        const long long r = __shfl_sync(0xffffffffu, mine, j + u);
        const bool ok = j + u < count && r >= 0 && r < rows.nrows && col < rows.width;
        // A cached row's slot is one more dependent load; the kEdges rows
        // are still all in flight before the first is added.
        loaded[u] = ok ? *reinterpret_cast<const V*>(
                             RowAddress(rows.table, r, rows.width * sizeof(T), rows.cache) +
                             col * sizeof(T))
                       : V{};
      }
#pragma unroll
      for (int u = 0; u < kEdges; ++u) {
        T elems[kVec];
        memcpy(elems, &loaded[u], sizeof(V));
#pragma unroll
        for (int v = 0; v < kVec; ++v) acc[v] += ToFloat(elems[v]);
      }
    }
  }
}

template <typename T, typename V, typename P, typename I>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    WarpSumKernel(Rows<T, V> rows, const P* __restrict__ indptr, int64_t ndst,
                  const I* __restrict__ indices, int64_t nnz, const void* start, bool start64,
                  float* __restrict__ out, int64_t size, int64_t tiles,
                  int32_t* __restrict__ hubs) {
  constexpr int kVec = Rows<T, V>::kVec;
  const int lane = threadIdx.x & 31;
  const int64_t first = FirstNode(start, start64);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
       item < size * tiles; item += warps) {
    const int64_t k = item / tiles;
    const int64_t col = (item - k * tiles) * 32 * kVec + lane * kVec;
    float acc[kVec];
#pragma unroll
    for (int v = 0; v < kVec; ++v) acc[v] = 0.f;
    const int64_t node = first + k;
    if (node >= 0 && node < ndst) {  // uniform across the warp
      int64_t lo, hi;
      EdgeRange(indptr, node, nnz, &lo, &hi);
      const bool hub = hi - lo > kWarpEdges;
      AddEdges(rows, indices, lo, hub ? lo + kWarpEdges : hi, 32, col, lane, acc);
      // hubs[0] counts the list hubs[1..]; k < size < 2**31 - 1 (Run checks).
      if (hub && lane == 0 && item - k * tiles == 0) {
        hubs[1 + atomicAdd(hubs, 1)] = static_cast<int32_t>(k);
      }
    }
    if (col < rows.width) {
      float* dst = out + k * rows.width + col;
#pragma unroll
      for (int v = 0; v < kVec; ++v) dst[v] = acc[v];
    }
  }
}

// The edges past each listed node's first kWarpEdges (see the file's
// comment), added to what the first kernel stored.
template <typename T, typename V, typename P, typename I>
__global__ void __launch_bounds__(kHubWarps * 32)
    HubSumKernel(Rows<T, V> rows, const P* __restrict__ indptr, const I* __restrict__ indices,
                 int64_t nnz, const void* start, bool start64, float* __restrict__ out,
                 int64_t tiles, const int32_t* __restrict__ hubs) {
  constexpr int kVec = Rows<T, V>::kVec;
  __shared__ float partial[kHubWarps][32 * kVec];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t first = FirstNode(start, start64);
  const int32_t count = hubs[0];
  for (int32_t h = blockIdx.x; h < count; h += gridDim.x) {
    const int64_t k = hubs[1 + h];
    int64_t lo, hi;
    EdgeRange(indptr, first + k, nnz, &lo, &hi);
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t col = tile * 32 * kVec + lane * kVec;
      float acc[kVec];
#pragma unroll
      for (int v = 0; v < kVec; ++v) acc[v] = 0.f;
      AddEdges(rows, indices, lo + kWarpEdges + 32 * warp, hi, 32 * kHubWarps, col, lane, acc);
#pragma unroll
      for (int v = 0; v < kVec; ++v) partial[warp][lane * kVec + v] = acc[v];
      __syncthreads();
      for (int c = threadIdx.x; c < 32 * kVec; c += blockDim.x) {
        const int64_t at = tile * 32 * kVec + c;
        if (at >= rows.width) continue;
        float sum = 0.f;
        for (int w = 0; w < kHubWarps; ++w) sum += partial[w][c];
        out[k * rows.width + at] += sum;
      }
      __syncthreads();
    }
  }
}

// The widest load (16, 8, 4 bytes, else one element) that divides the row
// and the table's and cache's addresses.
template <typename T>
int LoadBytes(const NeighborSumArgs& a) {
  const uint64_t bits = static_cast<uint64_t>(a.width * sizeof(T)) |
                        reinterpret_cast<uintptr_t>(a.table) |
                        reinterpret_cast<uintptr_t>(a.cache.rows);
  for (int w : {16, 8, 4}) {
    if (w >= static_cast<int>(sizeof(T)) && (bits & static_cast<uint64_t>(w - 1)) == 0) {
      return w;
    }
  }
  return sizeof(T);
}

struct CudaRunner {
  cudaStream_t stream;
  int32_t* hubs;  // the hub list: a count, then up to `size` positions

  template <typename T, typename V, typename P, typename I>
  void Launch(const NeighborSumArgs& a) const {
    constexpr int64_t kVec = sizeof(V) / sizeof(T);
    const int64_t tiles = (a.width + 32 * kVec - 1) / (32 * kVec);
    const Rows<T, V> rows{static_cast<const char*>(a.table), a.nrows, a.width, a.cache};
    const auto* indptr = static_cast<const P*>(a.indptr);
    const auto* indices = static_cast<const I*>(a.indices);
    if (a.nnz > kWarpEdges) cudaMemsetAsync(hubs, 0, sizeof(int32_t), stream);
    WarpSumKernel<T, V, P, I><<<Blocks(a.size * tiles, kWarpsPerBlock, 0),
                                kWarpsPerBlock * 32, 0, stream>>>(
        rows, indptr, a.ndst, indices, a.nnz, a.start, a.start64, a.out, a.size, tiles,
        a.nnz > kWarpEdges ? hubs : nullptr);
    if (a.nnz > kWarpEdges) {  // else no node has edges past the first kernel's
      HubSumKernel<T, V, P, I><<<4 * MultiprocessorCount(), kHubWarps * 32, 0, stream>>>(
          rows, indptr, indices, a.nnz, a.start, a.start64, a.out, tiles, hubs);
    }
  }

  ffi::Error operator()(const NeighborSumArgs& a) const {
    if (a.size == 0 || a.width == 0) return ffi::Error::Success();
    WithNeighborSumTypes(a, [&](auto t, auto p, auto i) {
      using T = decltype(t);
      using P = decltype(p);
      using I = decltype(i);
      switch (LoadBytes<T>(a)) {
        case 16: return Launch<T, uint4, P, I>(a);
        case 8: return Launch<T, uint2, P, I>(a);
        case 4: return Launch<T, uint32_t, P, I>(a);
        default: return Launch<T, T, P, I>(a);
      }
    });
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      return ffi::Error::Internal(std::string("jdirect neighbor_sum: ") +
                                  cudaGetErrorString(err));
    }
    return ffi::Error::Success();
  }
};

// The hub list holds int32 positions: size < 2**31 - 1 (Python checks it;
// a hand-built call must not wrap them into writes before `out`).
ffi::Error CheckHubs(ffi::Result<ffi::AnyBuffer>& out, ffi::Result<ffi::AnyBuffer>& hubs) {
  if (out->dimensions().size() < 1 || out->dimensions()[0] >= INT32_MAX ||
      hubs->element_type() != ffi::DataType::S32 ||
      static_cast<int64_t>(hubs->element_count()) != out->dimensions()[0] + 1) {
    return ffi::Error::InvalidArgument("jdirect neighbor_sum: the hub list must be int32 "
                                       "[size + 1] with size < 2**31 - 1");
  }
  return ffi::Error::Success();
}

// Records the leased tables' events after the launch (close() waits for
// them); where the launch or a record failed, waits for the stream itself.
struct Recorder {
  cudaStream_t stream;

  ffi::Error operator()(const int32_t* handles, int count, bool failed) const {
    ffi::Error first = ffi::Error::Success();
    for (int i = 0; i < count; ++i) {
      ffi::Error e = RecordTableRead(handles[i], stream);
      if (e.failure() && !first.failure()) first = e;
    }
    if (failed || first.failure()) cudaStreamSynchronize(stream);
    return first;
  }
};

CudaRunner Runner(cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& hubs) {
  return CudaRunner{stream, static_cast<int32_t*>(hubs->untyped_data())};
}

ffi::Error Run(cudaStream_t stream, ffi::AnyBuffer table, ffi::AnyBuffer indptr,
               ffi::AnyBuffer indices, ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer> out,
               ffi::Result<ffi::AnyBuffer> hubs) {
  if (auto e = CheckHubs(out, hubs); e.failure()) return e;
  return NeighborSum(Runner(stream, hubs), table, indptr, indices, start, out);
}

ffi::Error RunHost(cudaStream_t stream, ffi::AnyBuffer table,
                   ffi::Buffer<ffi::S32> indptr_handle, ffi::Buffer<ffi::S32> indices_handle,
                   ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> hubs, int64_t indptr_type, int64_t indptr_rows,
                   int64_t indices_type, int64_t indices_rows) {
  if (auto e = CheckHubs(out, hubs); e.failure()) return e;
  return NeighborSumHost(Runner(stream, hubs), HostHandle, Recorder{stream}, table,
                         indptr_handle, indices_handle, start, out, indptr_type, indptr_rows,
                         indices_type, indices_rows);
}

ffi::Error RunCached(cudaStream_t stream, ffi::Buffer<ffi::S32> table_handle,
                     ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer cached, ffi::AnyBuffer indptr,
                     ffi::AnyBuffer indices, ffi::AnyBuffer start,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> hubs,
                     int64_t table_type, int64_t table_rows, int64_t width) {
  if (auto e = CheckHubs(out, hubs); e.failure()) return e;
  return NeighborSumCached(Runner(stream, hubs), HostHandle, Recorder{stream}, table_handle,
                           slots, cached, indptr, indices, start, out, table_type, table_rows,
                           width);
}

ffi::Error RunCachedHost(cudaStream_t stream, ffi::Buffer<ffi::S32> table_handle,
                         ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer cached,
                         ffi::Buffer<ffi::S32> indptr_handle,
                         ffi::Buffer<ffi::S32> indices_handle, ffi::AnyBuffer start,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> hubs,
                         int64_t table_type, int64_t table_rows, int64_t width,
                         int64_t indptr_type, int64_t indptr_rows, int64_t indices_type,
                         int64_t indices_rows) {
  if (auto e = CheckHubs(out, hubs); e.failure()) return e;
  return NeighborSumCachedHost(Runner(stream, hubs), HostHandle, Recorder{stream},
                               table_handle, slots, cached, indptr_handle, indices_handle,
                               start, out, table_type, table_rows, width, indptr_type,
                               indptr_rows, indices_type, indices_rows);
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCuda, jdirect::Run,
                       JDIRECT_BIND_NEIGHBOR_SUM(.Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));
JDIRECT_DEFINE_HANDLER(JdirectNeighborSumHostCuda, jdirect::RunHost,
                       JDIRECT_BIND_NEIGHBOR_SUM_HOST(
                           .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));
JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCachedCuda, jdirect::RunCached,
                       JDIRECT_BIND_NEIGHBOR_SUM_CACHED(
                           .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));
JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCachedHostCuda, jdirect::RunCachedHost,
                       JDIRECT_BIND_NEIGHBOR_SUM_CACHED_HOST(
                           .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));
