// CUDA gather handlers: GPU threads read rows straight from host memory
// (pinned or host-resident managed, zero-copy over PCIe) or from device
// memory, with jnp.take's semantics. The kernels are in gather_kernels.cuh.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
#include <string>

#include "gather_common.h"
#include "gather_cuda.h"
#include "gather_kernels.cuh"
#include "index.h"
#include "table_events.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

// Address-order gathers launched so far: lets tests see which path ran.
std::atomic<int64_t> sorted_gathers{0};

}  // namespace

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

unsigned Blocks(int64_t work, int64_t per_block, int64_t max_blocks) {
  int64_t blocks = (work + per_block - 1) / per_block;
  const int64_t cap = max_blocks > 0 ? max_blocks
                                     : static_cast<int64_t>(MultiprocessorCount()) * 16;
  return static_cast<unsigned>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

namespace {

// The widest access that divides the row and both base addresses.
int VectorBytes(const GatherArgs& a) {
  const uint64_t bits = static_cast<uint64_t>(a.row_bytes) |
                        reinterpret_cast<uintptr_t>(a.table) |
                        reinterpret_cast<uintptr_t>(a.cache.rows) |
                        reinterpret_cast<uintptr_t>(a.out);
  for (int w : {16, 8, 4, 2}) {
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  }
  return 1;
}

// Calls fn(V{}) with V the vector type for the row and pointers.
template <typename Fn>
void WithVector(const GatherArgs& a, Fn fn) {
  switch (VectorBytes(a)) {
    case 16: return fn(uint4{});
    case 8: return fn(uint2{});
    case 4: return fn(uint32_t{});
    case 2: return fn(uint16_t{});
    default: return fn(uint8_t{});
  }
}

// Launches the gather kernel over `n` rows taken from `rows`.
template <typename Rows>
void LaunchGather(const GatherArgs& a, Rows rows, cudaStream_t stream, int64_t max_blocks) {
  WithVector(a, [&](auto vec) {
    using V = decltype(vec);
    const int64_t vpr = a.row_bytes / static_cast<int64_t>(sizeof(V));
    const int64_t total = a.n * vpr;
    const unsigned blocks = Blocks(total, int64_t{kThreads} * kUnroll, max_blocks);
    // 32-bit items while the counter cannot wrap (the grid's stride times
    // kUnroll is far below 2**31).
    if (total <= std::numeric_limits<int32_t>::max()) {
      GatherKernel<V, uint32_t, Rows><<<blocks, kThreads, 0, stream>>>(
          a.table, rows, static_cast<uint32_t>(vpr), static_cast<uint32_t>(total),
          reinterpret_cast<V*>(a.out), a.fill, a.cache);
    } else {
      GatherKernel<V, uint64_t, Rows><<<blocks, kThreads, 0, stream>>>(
          a.table, rows, static_cast<uint64_t>(vpr), static_cast<uint64_t>(total),
          reinterpret_cast<V*>(a.out), a.fill, a.cache);
    }
  });
}

int EndBit(int64_t max_key) {
  int bits = 1;
  while (bits < 64 && (max_key >> bits) != 0) ++bits;
  return bits;
}

int64_t AlignUp(int64_t x) { return (x + 255) / 256 * 256; }

// Where the sort's arrays sit inside the workspace buffer XLA allocates (an
// extra result of the call, so its lifetime follows the program's streams).
template <typename K>
struct SortLayout {
  int64_t keys_in, keys_out, pos_in, pos_out, temp, temp_bytes, total;
  int end_bit;

  SortLayout(int64_t n, int64_t nrows) {
    end_bit = EndBit(nrows);  // keys run up to nrows (fills)
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<K*>(nullptr),
                                    static_cast<K*>(nullptr), static_cast<int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), n, 0, end_bit);
    temp_bytes = static_cast<int64_t>(bytes);
    keys_in = 0;
    keys_out = AlignUp(n * static_cast<int64_t>(sizeof(K)));
    pos_in = keys_out + keys_out;
    pos_out = pos_in + AlignUp(n * 4);
    temp = pos_out + AlignUp(n * 4);
    total = temp + temp_bytes;
  }
};

bool NarrowKeys(int64_t nrows) { return nrows < std::numeric_limits<uint32_t>::max(); }

int64_t SortWorkspaceBytes(int64_t n, int64_t nrows) {
  return NarrowKeys(nrows) ? SortLayout<uint32_t>(n, nrows).total
                           : SortLayout<uint64_t>(n, nrows).total;
}

template <typename I, typename K>
ffi::Error LaunchAddressOrder(const GatherArgs& a, cudaStream_t stream, char* ws,
                              int64_t max_blocks) {
  const int64_t n = a.n;
  const SortLayout<K> layout(n, a.nrows);
  K* keys_in = reinterpret_cast<K*>(ws + layout.keys_in);
  K* keys_out = reinterpret_cast<K*>(ws + layout.keys_out);
  int32_t* pos_in = reinterpret_cast<int32_t*>(ws + layout.pos_in);
  int32_t* pos_out = reinterpret_cast<int32_t*>(ws + layout.pos_out);
  ResolveKeysKernel<I, K><<<Blocks(n, kThreads, max_blocks), kThreads, 0, stream>>>(
      static_cast<const I*>(a.idx), n, a.nrows, a.mode, keys_in, pos_in);
  size_t temp_bytes = static_cast<size_t>(layout.temp_bytes);
  cudaError_t err = cub::DeviceRadixSort::SortPairs(ws + layout.temp, temp_bytes, keys_in,
                                                    keys_out, pos_in, pos_out, n, 0,
                                                    layout.end_bit, stream);
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string("jdirect gather: cub SortPairs failed: ") +
                                cudaGetErrorString(err));
  }
  LaunchGather(a, SortedRows<K>{keys_out, pos_out, static_cast<K>(a.nrows)}, stream,
               max_blocks);
  sorted_gathers.fetch_add(1, std::memory_order_relaxed);
  return ffi::Error::Success();
}

}  // namespace

ffi::Error CudaRunner::operator()(const GatherArgs& a) const {
  if (a.n == 0 || a.row_bytes == 0) return ffi::Error::Success();
  const int64_t copied = a.CopiedRows();
  ffi::Error status =
      copied == 0 ? ReadOnGpu(a)
                  // The copy engines take the leading rows while GPU threads
                  // read the others.
                  : CopyEngineGather(RowsOf(a, 0, copied), stream, [&]() {
                      return ReadOnGpu(RowsOf(a, copied, a.n));
                    });
  if (status.failure()) return status;
  // close() waits for this event instead of for the whole device.
  return a.handle > 0 ? RecordTableRead(a.handle, stream) : ffi::Error::Success();
}

ffi::Error CudaRunner::ReadOnGpu(const GatherArgs& a) const {
  if (a.n == 0) return ffi::Error::Success();
  ffi::Error status = ffi::Error::Success();
  // Python decides the order (jdirect/_ops.py, address_order) and sizes
  // a workspace only for address order; an empty one means caller order.
  const bool sorted = workspace_bytes > 0 && a.n <= std::numeric_limits<int32_t>::max() &&
                      workspace_bytes >= SortWorkspaceBytes(a.n, a.nrows);
  const bool narrow = NarrowKeys(a.nrows);
  if (sorted && a.idx64) {
    status = narrow ? LaunchAddressOrder<int64_t, uint32_t>(a, stream, workspace, max_blocks)
                    : LaunchAddressOrder<int64_t, uint64_t>(a, stream, workspace, max_blocks);
  } else if (sorted) {
    status = narrow ? LaunchAddressOrder<int32_t, uint32_t>(a, stream, workspace, max_blocks)
                    : LaunchAddressOrder<int32_t, uint64_t>(a, stream, workspace, max_blocks);
  } else if (a.idx64) {
    LaunchGather(a, CallerRows<int64_t>{static_cast<const int64_t*>(a.idx), a.nrows, a.mode},
                 stream, max_blocks);
  } else {
    LaunchGather(a, CallerRows<int32_t>{static_cast<const int32_t*>(a.idx), a.nrows, a.mode},
                 stream, max_blocks);
  }
  if (status.failure()) return status;
  // May also report an earlier launch's error on this thread: the message
  // names the call that noticed it, not necessarily the one that caused it.
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string("jdirect gather: kernel launch failed: ") +
                                cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

CudaRunner Runner(cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& workspace,
                  int64_t max_blocks) {
  return CudaRunner{stream, static_cast<char*>(workspace->untyped_data()),
                    static_cast<int64_t>(workspace->size_bytes()), max_blocks};
}

ffi::Error HostHandle(ffi::Buffer<ffi::S32> handle, int32_t* value) {
  if (handle.element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: a HostTable handle has exactly one element");
  }
  // HostTable keeps its handle in pinned_host memory.
  const int32_t* p = handle.typed_data();
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // do not leave this error for the next launch check
    return ffi::Error::Internal("jdirect gather: cannot query the HostTable handle's memory");
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: the HostTable handle was moved to device memory; "
        "pass the HostTable itself to jit, not a device_put copy of it");
  }
  *value = *p;
  return ffi::Error::Success();
}

namespace {

ffi::Error GatherArray(cudaStream_t stream, ffi::AnyBuffer table, ffi::AnyBuffer idx,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                       int64_t mode, int64_t fill_lo, int64_t fill_hi, int64_t max_blocks) {
  return GatherFromArray(Runner(stream, workspace, max_blocks), table, idx, out, mode,
                         fill_lo, fill_hi);
}

ffi::Error GatherHost(cudaStream_t stream, ffi::Buffer<ffi::S32> handle,
                      ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer cached, ffi::AnyBuffer idx,
                      ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                      int64_t mode, int64_t fill_lo, int64_t fill_hi, int64_t max_blocks,
                      int64_t nrows, int64_t row_bytes, int64_t compact_rows,
                      int64_t copy_thousandths) {
  int32_t h;
  if (auto e = HostHandle(handle, &h); e.failure()) return e;
  return GatherFromHandle(Runner(stream, workspace, max_blocks), h, slots, cached, idx, out,
                          mode, fill_lo, fill_hi, nrows, row_bytes, compact_rows, copy_thousandths);
}

ffi::Error GatherHostStatic(cudaStream_t stream, ffi::Buffer<ffi::S32> slots,
                            ffi::AnyBuffer cached, ffi::AnyBuffer idx,
                            ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::AnyBuffer> workspace, int64_t handle, int64_t mode,
                            int64_t fill_lo, int64_t fill_hi, int64_t max_blocks, int64_t nrows,
                            int64_t row_bytes, int64_t compact_rows, int64_t copy_thousandths) {
  return GatherFromHandle(Runner(stream, workspace, max_blocks), static_cast<int32_t>(handle),
                          slots, cached, idx, out, mode, fill_lo, fill_hi, nrows, row_bytes,
                          compact_rows, copy_thousandths);
}

}  // namespace
}  // namespace jdirect

// Sizes the workspace result for address order (0 on failure, e.g. with
// no GPU): called by Python at trace time.
extern "C" JDIRECT_EXPORT int64_t jdirect_cuda_sort_workspace_bytes(int64_t n, int64_t nrows) {
  if (n <= 0 || n > std::numeric_limits<int32_t>::max()) return 0;
  const int64_t bytes = jdirect::SortWorkspaceBytes(n, nrows);
  cudaGetLastError();  // a failed query (no device) must not linger
  return bytes;
}

extern "C" JDIRECT_EXPORT int64_t jdirect_cuda_sorted_gathers() {
  return jdirect::sorted_gathers.load(std::memory_order_relaxed);
}

#define JDIRECT_CUDA_CTX .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()

JDIRECT_DEFINE_HANDLER(JdirectGatherCuda, jdirect::GatherArray,
                       JDIRECT_BIND_GATHER_ARRAY(JDIRECT_CUDA_CTX));
JDIRECT_DEFINE_HANDLER(JdirectGatherHostCuda, jdirect::GatherHost,
                       JDIRECT_BIND_GATHER_HOST(JDIRECT_CUDA_CTX));
JDIRECT_DEFINE_HANDLER(JdirectGatherHostStaticCuda, jdirect::GatherHostStatic,
                       JDIRECT_BIND_GATHER_HOST_STATIC(JDIRECT_CUDA_CTX));
