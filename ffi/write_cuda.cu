// CUDA row writes (jdirect.write_rows): GPU threads store whole rows from
// device memory straight into a host table (pinned or host-resident
// managed), as posted PCIe writes. Python hands over one key per touched
// row, in ascending order (write_common.h), so neighbouring stores share
// address translations and no row is stored twice; no host atomics.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "gather_cuda.h"  // HostHandle, MultiprocessorCount, FollowStartedReads
#include "table_events.h"
#include "write_common.h"
#include "write_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

constexpr int kWriteThreads = 256;

// Work is flattened to (key, vector-in-row) items, so consecutive threads
// store consecutive vectors of one row (full, aligned stores coalesce into
// whole PCIe writes) and short rows keep every lane busy. `T` is the item
// counter: 32 bits whenever the item count fits (cheaper division).
template <typename V, typename T, typename K>
__global__ void WriteRowsKernel(char* __restrict__ table, int64_t nrows,
                                const K* __restrict__ keys, T vecs_per_row, T total,
                                const V* __restrict__ rows) {
  const T stride = static_cast<T>(gridDim.x) * blockDim.x;
  for (T item = static_cast<T>(blockIdx.x) * blockDim.x + threadIdx.x; item < total;
       item += stride) {
    const T k = item / vecs_per_row;
    const int64_t r = static_cast<int64_t>(keys[k]);
    if (r >= 0 && r < nrows) {
      V* dst = reinterpret_cast<V*>(table) + r * static_cast<int64_t>(vecs_per_row);
      dst[item - k * vecs_per_row] = rows[item];
    }
  }
}

// The widest access (16 bytes down to 1) that divides the row and both
// base addresses.
int VectorBytes(const WriteArgs& a) {
  const uint64_t bits = static_cast<uint64_t>(a.row_bytes) |
                        reinterpret_cast<uintptr_t>(a.table) |
                        reinterpret_cast<uintptr_t>(a.rows);
  for (int w : {16, 8, 4, 2}) {
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  }
  return 1;
}

template <typename V, typename K>
void LaunchWrite(const WriteArgs& a, cudaStream_t stream) {
  const int64_t vpr = a.row_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t total = a.n * vpr;
  // Enough blocks for the work, at most 16 per SM (the gather's cap, which
  // saturates the link with the GPU to itself).
  const int64_t cap = static_cast<int64_t>(MultiprocessorCount()) * 16;
  const int64_t want = (total + kWriteThreads - 1) / kWriteThreads;
  const unsigned blocks = static_cast<unsigned>(want < cap ? want : cap);
  const K* keys = static_cast<const K*>(a.keys);
  const V* rows = reinterpret_cast<const V*>(a.rows);
  if (total <= std::numeric_limits<int32_t>::max()) {
    WriteRowsKernel<V, uint32_t, K><<<blocks, kWriteThreads, 0, stream>>>(
        a.table, a.nrows, keys, static_cast<uint32_t>(vpr), static_cast<uint32_t>(total), rows);
  } else {
    WriteRowsKernel<V, uint64_t, K><<<blocks, kWriteThreads, 0, stream>>>(
        a.table, a.nrows, keys, static_cast<uint64_t>(vpr), static_cast<uint64_t>(total), rows);
  }
}

template <typename K>
void LaunchWriteKeys(const WriteArgs& a, cudaStream_t stream) {
  switch (VectorBytes(a)) {
    case 16: return LaunchWrite<uint4, K>(a, stream);
    case 8: return LaunchWrite<uint2, K>(a, stream);
    case 4: return LaunchWrite<uint32_t, K>(a, stream);
    case 2: return LaunchWrite<uint16_t, K>(a, stream);
    default: return LaunchWrite<uint8_t, K>(a, stream);
  }
}

struct CudaWriter {
  cudaStream_t stream;

  ffi::Error operator()(const WriteArgs& a) const {
    if (a.keys64) {
      LaunchWriteKeys<int64_t>(a, stream);
    } else {
      LaunchWriteKeys<int32_t>(a, stream);
    }
    // May also report an earlier launch's error on this thread: the message
    // names the call that noticed it, not necessarily the one that caused it.
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      return ffi::Error::Internal(std::string("jdirect write_rows: kernel launch failed: ") +
                                  cudaGetErrorString(err));
    }
    // close() waits for this event before the memory is unpinned or freed.
    return RecordTableRead(a.handle, stream);
  }
};

}  // namespace

ffi::Error ZeroToken(cudaStream_t stream, ffi::Result<ffi::Buffer<ffi::S32>>& token) {
  if (token->element_count() != 1) {
    return ffi::Error::InvalidArgument("jdirect: a write's token has exactly one element");
  }
  cudaError_t err = cudaMemsetAsync(token->typed_data(), 0, sizeof(int32_t), stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ffi::Error::Internal(
        std::string("jdirect: cudaMemsetAsync of a write's token failed: ") +
        cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

namespace {

ffi::Error WriteHost(cudaStream_t stream, ffi::Buffer<ffi::S32> handle,
                     ffi::Buffer<ffi::S32> /*token_in*/, ffi::AnyBuffer keys,
                     ffi::AnyBuffer rows, ffi::RemainingArgs reads,
                     ffi::Result<ffi::Buffer<ffi::S32>> token,
                     int64_t nrows, int64_t row_bytes) {
  int32_t h;
  if (auto e = HostHandle(handle, &h); e.failure()) return e;
  if (auto e = FollowStartedReads(stream, reads); e.failure()) return e;
  if (auto e = ZeroToken(stream, token); e.failure()) return e;
  return WriteToHandle(CudaWriter{stream}, h, keys, rows, nrows, row_bytes);
}

ffi::Error WriteHostStatic(cudaStream_t stream, ffi::Buffer<ffi::S32> /*token_in*/,
                           ffi::AnyBuffer keys, ffi::AnyBuffer rows,
                           ffi::RemainingArgs reads,
                           ffi::Result<ffi::Buffer<ffi::S32>> token, int64_t handle,
                           int64_t nrows, int64_t row_bytes) {
  if (auto e = FollowStartedReads(stream, reads); e.failure()) return e;
  if (auto e = ZeroToken(stream, token); e.failure()) return e;
  return WriteToHandle(CudaWriter{stream}, static_cast<int32_t>(handle), keys, rows, nrows,
                       row_bytes);
}

}  // namespace
}  // namespace jdirect

#define JDIRECT_CUDA_CTX .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()

JDIRECT_DEFINE_HANDLER(JdirectWriteHostCuda, jdirect::WriteHost,
                       JDIRECT_BIND_WRITE_HOST(JDIRECT_CUDA_CTX));
JDIRECT_DEFINE_HANDLER(JdirectWriteHostStaticCuda, jdirect::WriteHostStatic,
                       JDIRECT_BIND_WRITE_HOST_STATIC(JDIRECT_CUDA_CTX));
