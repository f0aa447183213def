// Shared by the CUDA handlers that write host tables (write_cuda.cu,
// sparse_update_cuda.cu).
#ifndef JDIRECT_FFI_WRITE_CUDA_H_
#define JDIRECT_FFI_WRITE_CUDA_H_

#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"

namespace jdirect {

// Sets a write's one-element token result to zero on `stream` (write_common.h:
// the token orders the table's later reads and writes after this call).
xla::ffi::Error ZeroToken(cudaStream_t stream,
                          xla::ffi::Result<xla::ffi::Buffer<xla::ffi::S32>>& token);

}  // namespace jdirect

#endif  // JDIRECT_FFI_WRITE_CUDA_H_
