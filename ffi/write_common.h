// The row-write handlers' bodies (jdirect.write_rows), shared by the CPU and
// CUDA backends: each backend supplies a runner (`ffi::Error run(const
// WriteArgs&)`) that stores rows[k] at table row keys[k] for every key in
// [0, nrows) and skips the others.
//
// Python resolves the indices (jnp's mode="drop": negative ids count from
// the end, others out of range are dropped), keeps one key per touched row
// (the last `set`, or the sum of every `add`) and marks the others out of
// range, so each row is written once and no backend needs atomics. The
// checks here only stop a malformed call from writing outside a table or
// into one that was registered read-only.
#ifndef JDIRECT_FFI_WRITE_COMMON_H_
#define JDIRECT_FFI_WRITE_COMMON_H_

#include <cstdint>
#include <string>

#include "gather_common.h"
#include "registry.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {

struct WriteArgs {
  char* table;
  int64_t nrows;
  int64_t row_bytes;
  const void* keys;  // resolved rows; out of [0, nrows): not written
  bool keys64;
  int64_t n;  // number of keys (and of rows)
  const char* rows;
  int32_t handle;
};

// The lease spans the runner: on the CPU the stores, on the GPU the launch
// and the recording of the table's event, which close() waits for.
// Checks a lease of table `handle` for a write by `op`: open, of the
// traced shape and registered writable.
inline ffi::Error CheckWritable(const TableLease& lease, int32_t handle, int64_t nrows,
                                int64_t row_bytes, const char* op) {
  if (auto e = CheckLease(lease, nrows, row_bytes); e.failure()) return e;
  if (!lease.view().writable) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      std::string("jdirect ") + op + ": HostTable #" + std::to_string(handle) +
                          " wraps read-only memory");
  }
  return ffi::Error::Success();
}

template <typename Runner>
ffi::Error WriteToHandle(const Runner& run, int32_t handle, ffi::AnyBuffer keys,
                         ffi::AnyBuffer rows, int64_t nrows, int64_t row_bytes) {
  TableLease lease(handle);
  if (auto e = CheckWritable(lease, handle, nrows, row_bytes, "write_rows"); e.failure()) {
    return e;
  }
  if (keys.element_type() != ffi::DataType::S32 && keys.element_type() != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("jdirect write_rows: keys must be int32 or int64");
  }
  const int64_t n = static_cast<int64_t>(keys.element_count());
  if (static_cast<int64_t>(rows.size_bytes()) != n * row_bytes) {
    return ffi::Error::InvalidArgument(
        "jdirect write_rows: rows size does not match keys x row bytes");
  }
  if (n == 0 || row_bytes == 0) return ffi::Error::Success();
  // Writable tables are registered by their owner over memory it may write:
  // the registry keeps a const pointer only because gathers share it.
  const WriteArgs a{const_cast<char*>(lease.view().data),
                    nrows,
                    row_bytes,
                    keys.untyped_data(),
                    keys.element_type() == ffi::DataType::S64,
                    n,
                    static_cast<const char*>(rows.untyped_data()),
                    handle};
  return run(a);
}

}  // namespace jdirect

// The token operand and result order writes of one table and the reads
// after them (jdirect/write.py): the handlers never read the operand and
// set the result to zero. The remaining operands are rows read from the
// table before the write, passed only so that the write follows them.
#define JDIRECT_BIND_WRITE_HOST(CTX)                          \
  xla::ffi::Ffi::Bind() CTX                                   \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* handle */    \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* token in */  \
      .Arg<xla::ffi::AnyBuffer>() /* keys */                  \
      .Arg<xla::ffi::AnyBuffer>() /* rows */                  \
      .RemainingArgs() /* reads to follow */                  \
      .Ret<xla::ffi::Buffer<xla::ffi::S32>>() /* token out */ \
      .Attr<int64_t>("nrows")                                 \
      .Attr<int64_t>("row_bytes")

#define JDIRECT_BIND_WRITE_HOST_STATIC(CTX)                   \
  xla::ffi::Ffi::Bind() CTX                                   \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* token in */  \
      .Arg<xla::ffi::AnyBuffer>() /* keys */                  \
      .Arg<xla::ffi::AnyBuffer>() /* rows */                  \
      .RemainingArgs() /* reads to follow */                  \
      .Ret<xla::ffi::Buffer<xla::ffi::S32>>() /* token out */ \
      .Attr<int64_t>("handle")                                \
      .Attr<int64_t>("nrows")                                 \
      .Attr<int64_t>("row_bytes")

#endif  // JDIRECT_FFI_WRITE_COMMON_H_
