// CUDA gather: GPU threads read rows straight from pinned host memory
// (zero-copy over PCIe) or from device memory, with jnp.take's semantics.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gather_common.h"
#include "index.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

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
                             FillPattern fill) {
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
        vals[u] = r >= 0 ? reinterpret_cast<const V*>(table + r * row_bytes)[v]
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

int MultiprocessorCount() {
  static int counts[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (counts[dev] == 0) {
    int c = 0;
    cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev);
    counts[dev] = c > 0 ? c : 132;
  }
  return counts[dev];
}

template <typename V, typename I>
void Launch(const GatherArgs& a, cudaStream_t stream) {
  const int64_t vecs_per_row = a.row_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t total = a.n * vecs_per_row;
  const int64_t per_block = static_cast<int64_t>(kThreads) * kUnroll;
  int64_t blocks = (total + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(MultiprocessorCount()) * 16;
  if (blocks > cap) blocks = cap;
  GatherKernel<V, I><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      a.table, a.nrows, static_cast<const I*>(a.idx), vecs_per_row, total,
      reinterpret_cast<V*>(a.out), a.mode, a.fill);
}

// The widest access that divides the row and both base addresses.
int VectorBytes(const GatherArgs& a) {
  const uint64_t bits = static_cast<uint64_t>(a.row_bytes) |
                        reinterpret_cast<uintptr_t>(a.table) |
                        reinterpret_cast<uintptr_t>(a.out);
  for (int w : {16, 8, 4, 2}) {
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  }
  return 1;
}

template <typename I>
void LaunchIndexed(const GatherArgs& a, cudaStream_t stream) {
  switch (VectorBytes(a)) {
    case 16: return Launch<uint4, I>(a, stream);
    case 8: return Launch<uint2, I>(a, stream);
    case 4: return Launch<uint32_t, I>(a, stream);
    case 2: return Launch<uint16_t, I>(a, stream);
    default: return Launch<uint8_t, I>(a, stream);
  }
}

struct CudaRunner {
  cudaStream_t stream;
  ffi::Error operator()(const GatherArgs& a) const {
    if (a.n == 0 || a.row_bytes == 0) return ffi::Error::Success();
    if (a.idx64) {
      LaunchIndexed<int64_t>(a, stream);
    } else {
      LaunchIndexed<int32_t>(a, stream);
    }
    // May also report an earlier launch's error on this thread: the message
    // names the call that noticed it, not necessarily the one that caused it.
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      return ffi::Error::Internal(
          std::string("jdirect gather: kernel launch failed: ") +
          cudaGetErrorString(err));
    }
    return ffi::Error::Success();
  }
};

ffi::Error GatherArray(cudaStream_t stream, ffi::AnyBuffer table,
                       ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out,
                       int64_t mode, int64_t fill_lo, int64_t fill_hi) {
  return GatherFromArray(CudaRunner{stream}, table, idx, out, mode, fill_lo,
                         fill_hi);
}

ffi::Error GatherHost(cudaStream_t stream, ffi::Buffer<ffi::S32> handle,
                      ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out,
                      int64_t mode, int64_t fill_lo, int64_t fill_hi,
                      int64_t nrows, int64_t row_bytes) {
  if (handle.element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: a HostTable handle has exactly one element");
  }
  // The handle is read here, on the host, when the call is enqueued, so it
  // must live in host memory (HostTable keeps it in pinned_host).
  const int32_t* p = handle.typed_data();
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // do not leave this error for the next launch check
    return ffi::Error::Internal(
        "jdirect gather: cannot query the HostTable handle's memory");
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: the HostTable handle was moved to device memory; "
        "pass the HostTable itself to jit, not a device_put copy of it");
  }
  return GatherFromHandle(CudaRunner{stream}, *p, idx, out, mode, fill_lo,
                          fill_hi, nrows, row_bytes);
}

ffi::Error GatherHostStatic(cudaStream_t stream, ffi::AnyBuffer idx,
                            ffi::Result<ffi::AnyBuffer> out, int64_t handle,
                            int64_t mode, int64_t fill_lo, int64_t fill_hi,
                            int64_t nrows, int64_t row_bytes) {
  return GatherFromHandle(CudaRunner{stream}, static_cast<int32_t>(handle), idx,
                          out, mode, fill_lo, fill_hi, nrows, row_bytes);
}

}  // namespace
}  // namespace jdirect

#define JDIRECT_STREAM .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()

JDIRECT_DEFINE_HANDLER(JdirectGatherCuda, jdirect::GatherArray,
                              JDIRECT_BIND_GATHER_ARRAY(JDIRECT_STREAM));
JDIRECT_DEFINE_HANDLER(JdirectGatherHostCuda, jdirect::GatherHost,
                              JDIRECT_BIND_GATHER_HOST(JDIRECT_STREAM));
JDIRECT_DEFINE_HANDLER(JdirectGatherHostStaticCuda,
                              jdirect::GatherHostStatic,
                              JDIRECT_BIND_GATHER_HOST_STATIC(JDIRECT_STREAM));
