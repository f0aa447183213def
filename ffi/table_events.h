// Per-table CUDA events: each gather from (or row write to) a registered
// table records one on the stream it ran on, so closing the table waits for
// exactly the calls that used it rather than for every device.
#ifndef JDIRECT_FFI_TABLE_EVENTS_H_
#define JDIRECT_FFI_TABLE_EVENTS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace jdirect {

// Records the table's event for `stream` after the work just enqueued there.
xla::ffi::Error RecordTableRead(int32_t handle, cudaStream_t stream);

}  // namespace jdirect

#endif  // JDIRECT_FFI_TABLE_EVENTS_H_
