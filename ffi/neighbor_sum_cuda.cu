// The CUDA neighbour sum (neighbor_sum_common.h): one warp per
// (destination, column tile), its lanes across the row. A warp loads 32 of
// the node's edge ids at once and then kEdges source rows before adding
// any, so that each warp keeps several rows in flight: random rows from
// device memory are bound by latency, not bytes, with one in flight.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gather_cuda.h"  // Blocks
#include "neighbor_sum_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kEdges = 8;  // source rows a warp reads before it adds them

template <typename T, typename V, typename P, typename I>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    NeighborSumKernel(const T* __restrict__ table, int64_t nrows, int64_t width,
                      const P* __restrict__ indptr, int64_t ndst,
                      const I* __restrict__ indices, int64_t nnz, const void* start,
                      bool start64, float* __restrict__ out, int64_t size, int64_t tiles) {
  constexpr int kVec = sizeof(V) / sizeof(T);  // elements a lane reads a row
  const int lane = threadIdx.x & 31;
  const int64_t first = start64 ? *static_cast<const int64_t*>(start)
                                : *static_cast<const int32_t*>(start);
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
      for (int64_t e = lo; e < hi; e += 32) {
        const int count = hi - e < 32 ? static_cast<int>(hi - e) : 32;
        const long long mine = lane < count ? static_cast<long long>(indices[e + lane]) : -1;
        for (int j = 0; j < count; j += kEdges) {
          V rows[kEdges];
#pragma unroll
          for (int u = 0; u < kEdges; ++u) {
            // j + u <= 31: j is a multiple of kEdges below count <= 32.
            const long long r = __shfl_sync(0xffffffffu, mine, j + u);
            const bool ok = j + u < count && r >= 0 && r < nrows && col < width;
            rows[u] = ok ? *reinterpret_cast<const V*>(table + r * width + col) : V{};
          }
#pragma unroll
          for (int u = 0; u < kEdges; ++u) {
            T elems[kVec];
            memcpy(elems, &rows[u], sizeof(V));
#pragma unroll
            for (int v = 0; v < kVec; ++v) acc[v] += ToFloat(elems[v]);
          }
        }
      }
    }
    if (col < width) {
      float* dst = out + k * width + col;
#pragma unroll
      for (int v = 0; v < kVec; ++v) dst[v] = acc[v];
    }
  }
}

// The widest load (16, 8, 4 bytes, else one element) that divides the row
// and the table's address.
template <typename T>
int LoadBytes(const NeighborSumArgs& a) {
  const uint64_t bits = static_cast<uint64_t>(a.width * sizeof(T)) |
                        reinterpret_cast<uintptr_t>(a.table);
  for (int w : {16, 8, 4}) {
    if (w >= static_cast<int>(sizeof(T)) && (bits & static_cast<uint64_t>(w - 1)) == 0) {
      return w;
    }
  }
  return sizeof(T);
}

struct CudaRunner {
  cudaStream_t stream;

  template <typename T, typename V, typename P, typename I>
  void Launch(const NeighborSumArgs& a) const {
    constexpr int64_t kVec = sizeof(V) / sizeof(T);
    const int64_t tiles = (a.width + 32 * kVec - 1) / (32 * kVec);
    const unsigned blocks = Blocks(a.size * tiles, kWarpsPerBlock, 0);
    NeighborSumKernel<T, V, P, I><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<const T*>(a.table), a.nrows, a.width, static_cast<const P*>(a.indptr),
        a.ndst, static_cast<const I*>(a.indices), a.nnz, a.start, a.start64, a.out, a.size,
        tiles);
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

ffi::Error Run(cudaStream_t stream, ffi::AnyBuffer table, ffi::AnyBuffer indptr,
               ffi::AnyBuffer indices, ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer> out) {
  return NeighborSum(CudaRunner{stream}, table, indptr, indices, start, out);
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCuda, jdirect::Run,
                       JDIRECT_BIND_NEIGHBOR_SUM(.Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));
