// The CUDA gather's launch path, shared by the ordinary handlers
// (gather_cuda.cu) and the asynchronous start (gather_async_cuda.cu).
#ifndef JDIRECT_FFI_GATHER_CUDA_H_
#define JDIRECT_FFI_GATHER_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "gather_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {

// SMs of the current device (132 if it cannot be asked).
int MultiprocessorCount();

// Blocks of a grid-stride kernel: enough for `work` items at `per_block`
// each, at most `max_blocks` (<= 0: 16 per SM, which saturates the link
// with the GPU to itself).
unsigned Blocks(int64_t work, int64_t per_block, int64_t max_blocks);

// Enqueues a gather on `stream`: the copy engines' share of the rows
// (GatherArgs::copy_thousandths), GPU threads' reads of the others (the
// address-order sort when `workspace` is large enough for it, then the
// gather kernel), then the table's read event (table_events.h) on the same
// stream. Every kernel's grid is capped at `max_blocks` (<= 0: 16 blocks
// per SM).
struct CudaRunner {
  cudaStream_t stream;
  char* workspace;
  int64_t workspace_bytes;
  int64_t max_blocks;

  ffi::Error operator()(const GatherArgs& a) const;

 private:
  // The GPU threads' read of all of `a`'s rows.
  ffi::Error ReadOnGpu(const GatherArgs& a) const;
};

CudaRunner Runner(cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& workspace,
                  int64_t max_blocks);

// Enqueues the copy-engine read of all of `a`'s rows (a registered table
// without a device cache) after the work on `stream`, then `alongside()`
// (work enqueued on `stream` to run beside it), then makes `stream` wait
// for the read: the indices go to the host, host threads gather the rows
// into pinned staging (cudaLaunchHostFunc), copy engines move them into
// a.out. No SM runs any of it (copy_engine_read_cuda.cu).
ffi::Error CopyEngineGather(const GatherArgs& a, cudaStream_t stream,
                            const std::function<ffi::Error()>& alongside);

// The table handle a registered gather names: read on the host when the
// call is enqueued, so it must live in host memory.
ffi::Error HostHandle(ffi::Buffer<ffi::S32> handle, int32_t* value);

// Makes `stream` wait for the reads begun by gather_start (and not yet
// finished by their done) whose rows buffers are among `args`: a write of a
// table takes the rows read from its version as operands to follow
// (jdirect/write.py), and a started read runs on the side stream, which
// XLA's order alone would not keep it ahead of the write
// (gather_async_cuda.cu).
ffi::Error FollowStartedReads(cudaStream_t stream, ffi::RemainingArgs args);

}  // namespace jdirect

#endif  // JDIRECT_FFI_GATHER_CUDA_H_
