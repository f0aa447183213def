// CPU twin of the CUDA row writes: the same targets, registered for
// platform "cpu", with the same semantics (write_common.h).
#include <cstring>

#include "write_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

template <typename K>
void WriteRows(const WriteArgs& a) {
  const K* keys = static_cast<const K*>(a.keys);
  for (int64_t k = 0; k < a.n; ++k) {
    const int64_t r = static_cast<int64_t>(keys[k]);
    if (r >= 0 && r < a.nrows) {
      std::memcpy(a.table + r * a.row_bytes, a.rows + k * a.row_bytes, a.row_bytes);
    }
  }
}

struct CpuWriter {
  ffi::Error operator()(const WriteArgs& a) const {
    if (a.keys64) {
      WriteRows<int64_t>(a);
    } else {
      WriteRows<int32_t>(a);
    }
    return ffi::Error::Success();
  }
};

ffi::Error WriteHost(ffi::Buffer<ffi::S32> handle, ffi::Buffer<ffi::S32> /*token_in*/,
                     ffi::AnyBuffer keys, ffi::AnyBuffer rows,
                     ffi::RemainingArgs /*reads*/, ffi::Result<ffi::Buffer<ffi::S32>> token,
                     int64_t nrows, int64_t row_bytes) {
  if (handle.element_count() != 1 || token->element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "jdirect write_rows: a HostTable handle and a token have exactly one element");
  }
  token->typed_data()[0] = 0;
  return WriteToHandle(CpuWriter{}, handle.typed_data()[0], keys, rows, nrows, row_bytes);
}

ffi::Error WriteHostStatic(ffi::Buffer<ffi::S32> /*token_in*/, ffi::AnyBuffer keys,
                           ffi::AnyBuffer rows, ffi::RemainingArgs /*reads*/,
                           ffi::Result<ffi::Buffer<ffi::S32>> token,
                           int64_t handle, int64_t nrows, int64_t row_bytes) {
  if (token->element_count() != 1) {
    return ffi::Error::InvalidArgument("jdirect write_rows: a token has exactly one element");
  }
  token->typed_data()[0] = 0;
  return WriteToHandle(CpuWriter{}, static_cast<int32_t>(handle), keys, rows, nrows,
                       row_bytes);
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectWriteHostCpu, jdirect::WriteHost, JDIRECT_BIND_WRITE_HOST());
JDIRECT_DEFINE_HANDLER(JdirectWriteHostStaticCpu, jdirect::WriteHostStatic,
                       JDIRECT_BIND_WRITE_HOST_STATIC());
