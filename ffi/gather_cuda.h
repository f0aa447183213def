// The CUDA gather's launch path, shared by the ordinary handlers
// (gather_cuda.cu) and the asynchronous start (gather_async_cuda.cu).
#ifndef JDIRECT_FFI_GATHER_CUDA_H_
#define JDIRECT_FFI_GATHER_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "gather_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {

// SMs of the current device (132 if it cannot be asked).
int MultiprocessorCount();

// Blocks of a grid-stride kernel: enough for `work` items at `per_block`
// each, at most `max_blocks` (<= 0: 16 per SM, which saturates the link
// with the GPU to itself).
unsigned Blocks(int64_t work, int64_t per_block, int64_t max_blocks);

// Enqueues a gather on `stream`: the address-order sort when `workspace`
// is large enough for it, then the gather kernel, then the table's read
// event (table_events.h) on the same stream. Every kernel's grid is capped
// at `max_blocks` (<= 0: 16 blocks per SM).
struct CudaRunner {
  cudaStream_t stream;
  char* workspace;
  int64_t workspace_bytes;
  int64_t max_blocks;

  ffi::Error operator()(const GatherArgs& a) const;
};

CudaRunner Runner(cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& workspace,
                  int64_t max_blocks);

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
