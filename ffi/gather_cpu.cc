// CPU twin of the CUDA gather: the same targets, registered for platform
// "cpu", so programs and tests run unchanged without a GPU.
#include <cstring>

#include "gather_common.h"
#include "host_gather.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

// The copy-engine read's twin: the same host threads gather its rows,
// straight into the result (the CPU has no copy engine to stage for).
struct CpuRunner {
  ffi::Error operator()(const GatherArgs& a) const {
    const int64_t copied = a.CopiedRows();
    GatherRowsOnThreads(a, a.idx, a.out, 0, copied);
    GatherRowsOnHost(a, a.idx, a.out, copied, a.n);
    return ffi::Error::Success();
  }
};

ffi::Error GatherArray(ffi::AnyBuffer table, ffi::AnyBuffer idx,
                       ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> /*workspace*/, int64_t mode,
                       int64_t fill_lo, int64_t fill_hi, int64_t /*max_blocks*/) {
  return GatherFromArray(CpuRunner{}, table, idx, out, mode, fill_lo, fill_hi);
}

ffi::Error GatherHost(ffi::Buffer<ffi::S32> handle, ffi::Buffer<ffi::S32> slots,
                      ffi::AnyBuffer cached, ffi::AnyBuffer idx,
                      ffi::Result<ffi::AnyBuffer> out,
                      ffi::Result<ffi::AnyBuffer> /*workspace*/, int64_t mode,
                      int64_t fill_lo, int64_t fill_hi, int64_t /*max_blocks*/,
                      int64_t nrows, int64_t row_bytes, int64_t compact_rows,
                      int64_t copy_thousandths) {
  int32_t h;
  if (auto e = HandleOnCpu(handle, &h); e.failure()) return e;
  return GatherFromHandle(CpuRunner{}, h, slots, cached, idx, out, mode, fill_lo, fill_hi,
                          nrows, row_bytes, compact_rows, copy_thousandths);
}

ffi::Error GatherHostStatic(ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer cached,
                            ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::AnyBuffer> /*workspace*/,
                            int64_t handle, int64_t mode, int64_t fill_lo,
                            int64_t fill_hi, int64_t /*max_blocks*/, int64_t nrows,
                            int64_t row_bytes, int64_t compact_rows, int64_t copy_thousandths) {
  return GatherFromHandle(CpuRunner{}, static_cast<int32_t>(handle), slots, cached, idx,
                          out, mode, fill_lo, fill_hi, nrows, row_bytes, compact_rows,
                          copy_thousandths);
}

// gather_done's twin: the start already wrote the rows, so only a copy
// where XLA did not alias the result to the operand.
ffi::Error GatherDone(ffi::AnyBuffer rows, ffi::RemainingArgs /*keep_alive*/,
                      ffi::Result<ffi::AnyBuffer> out) {
  if (out->size_bytes() != rows.size_bytes()) {
    return ffi::Error::InvalidArgument("jdirect gather_done: result and rows differ in size");
  }
  if (out->untyped_data() != rows.untyped_data() && rows.size_bytes() > 0) {
    std::memcpy(out->untyped_data(), rows.untyped_data(), rows.size_bytes());
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectGatherCpu, jdirect::GatherArray,
                              JDIRECT_BIND_GATHER_ARRAY());
JDIRECT_DEFINE_HANDLER(JdirectGatherHostCpu, jdirect::GatherHost,
                              JDIRECT_BIND_GATHER_HOST());
JDIRECT_DEFINE_HANDLER(JdirectGatherHostStaticCpu,
                              jdirect::GatherHostStatic,
                              JDIRECT_BIND_GATHER_HOST_STATIC());
// The asynchronous pair's twins: the start is an ordinary gather (the CPU
// has no stream to overlap it on) and the done an identity.
JDIRECT_DEFINE_HANDLER(JdirectGatherHostStartCpu, jdirect::GatherHost,
                       JDIRECT_BIND_GATHER_HOST());
JDIRECT_DEFINE_HANDLER(JdirectGatherHostStaticStartCpu, jdirect::GatherHostStatic,
                       JDIRECT_BIND_GATHER_HOST_STATIC());
JDIRECT_DEFINE_HANDLER(JdirectGatherDoneCpu, jdirect::GatherDone,
                       JDIRECT_BIND_GATHER_DONE());
