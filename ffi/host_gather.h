// Rows gathered by host threads: the CPU gather's body (gather_cpu.cc) and
// the copy-engine read's (copy_engine_read_cuda.cu, whose host threads fill
// pinned staging that the copy engines move to the device). One definition
// of the row each index selects (index.h's ResolveRow and RowAddress) and of
// the fill, so both agree with the GPU kernels bit for bit.
#ifndef JDIRECT_FFI_HOST_GATHER_H_
#define JDIRECT_FFI_HOST_GATHER_H_

#include <cstdint>

#include "gather_common.h"
#include "registry.h"  // JDIRECT_EXPORT

namespace jdirect {

// Rows [begin, end) of the gather `a`, its indices read from `idx` (a host
// copy of a.idx, of a.idx64's width), written to `out` (row i at
// out + i * a.row_bytes): the table's row, or the fill pattern where the
// index selects none.
JDIRECT_EXPORT void GatherRowsOnHost(const GatherArgs& a, const void* idx, char* out,
                                     int64_t begin, int64_t end);

// The same for every row of `a`, split in chunks over the process's gather
// threads and the calling thread; returns when every row is written. Calls
// from several threads run one after another.
JDIRECT_EXPORT void GatherRowsOnThreads(const GatherArgs& a, const void* idx, char* out,
                                        int64_t begin, int64_t end);

}  // namespace jdirect

#endif  // JDIRECT_FFI_HOST_GATHER_H_
