// The gather handlers' bodies, shared by the CPU and CUDA backends: each
// backend supplies a runner (`ffi::Error run(const GatherArgs&)`). The Python
// layer validates user input; these checks only stop a malformed call (a
// hand-built ffi_call, a mismatched handle) from reading out of bounds.
#ifndef JDIRECT_FFI_GATHER_COMMON_H_
#define JDIRECT_FFI_GATHER_COMMON_H_

#include <cstdint>
#include <string>

#include "index.h"
#include "registry.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {

namespace ffi = xla::ffi;

struct GatherArgs {
  const char* table;
  int64_t nrows;
  int64_t row_bytes;
  const void* idx;
  bool idx64;
  int64_t n;  // number of indices
  char* out;
  Mode mode;
  FillPattern fill;
  DeviceCache cache;
  int32_t handle;  // the registered table read, or 0 for an array operand
  // Thousandths of the rows (the leading ones) that host threads gather and
  // copy engines move, beside GPU threads reading the rest: the copy-engine
  // read (copy_engine_read_cuda.cu; on the CPU, the threads gather into the
  // result). Only a registered table without a device cache has it.
  int64_t copy_thousandths = 0;

  // The rows `copy_thousandths` gives the copy engines.
  int64_t CopiedRows() const { return n * copy_thousandths / 1000; }
};

// `a` for its rows [begin, end) only.
inline GatherArgs RowsOf(const GatherArgs& a, int64_t begin, int64_t end) {
  GatherArgs part = a;
  part.idx = static_cast<const char*>(a.idx) + begin * (a.idx64 ? 8 : 4);
  part.out = a.out + begin * a.row_bytes;
  part.n = end - begin;
  return part;
}

inline ffi::Error MakeGatherArgs(const char* table, int64_t nrows,
                                 int64_t row_bytes, ffi::AnyBuffer idx,
                                 ffi::Result<ffi::AnyBuffer> out, int64_t mode,
                                 int64_t fill_lo, int64_t fill_hi,
                                 GatherArgs* args) {
  if (idx.element_type() != ffi::DataType::S32 &&
      idx.element_type() != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: indices must be int32 or int64");
  }
  if (!IsValidMode(mode)) {
    return ffi::Error::InvalidArgument("jdirect gather: unknown mode " +
                                       std::to_string(mode));
  }
  const int64_t n = static_cast<int64_t>(idx.element_count());
  if (nrows < 0 || row_bytes < 0 ||
      static_cast<int64_t>(out->size_bytes()) != n * row_bytes) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: output size does not match indices x row bytes");
  }
  if (n > 0 && nrows == 0) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: cannot take from a table with no rows");
  }
  *args = GatherArgs{table,
                     nrows,
                     row_bytes,
                     idx.untyped_data(),
                     idx.element_type() == ffi::DataType::S64,
                     n,
                     static_cast<char*>(out->untyped_data()),
                     static_cast<Mode>(mode),
                     FillPattern{static_cast<uint64_t>(fill_lo),
                                 static_cast<uint64_t>(fill_hi)},
                     DeviceCache{},
                     0};
  return ffi::Error::Success();
}

// The device cache of a CachedTable; empty operands mean no cache.
// `compact_rows` >= 0: the host table holds only the uncached rows, that many
// (DeviceCache), which needs a cache.
inline ffi::Error MakeCache(ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer rows,
                            int64_t nrows, int64_t row_bytes, DeviceCache* cache,
                            int64_t compact_rows = -1) {
  if (slots.element_count() == 0 && compact_rows < 0) return ffi::Error::Success();
  if (static_cast<int64_t>(slots.element_count()) != nrows || row_bytes <= 0 ||
      static_cast<int64_t>(rows.size_bytes()) % row_bytes != 0 || compact_rows == 0) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: cache slots or rows do not match the table");
  }
  *cache = DeviceCache{slots.typed_data(), static_cast<const char*>(rows.untyped_data()),
                       static_cast<int64_t>(rows.size_bytes()) / row_bytes, compact_rows};
  return ffi::Error::Success();
}

// Shape of a table operand: rows are along the first axis; a rank-1 table
// has rows of one element.
inline ffi::Error TableShape(ffi::AnyBuffer table, int64_t* nrows,
                             int64_t* row_bytes) {
  auto dims = table.dimensions();
  if (dims.size() < 1) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: the table must have rank >= 1");
  }
  *nrows = dims[0];
  int64_t row_elems = 1;
  for (size_t d = 1; d < dims.size(); ++d) row_elems *= dims[d];
  *row_bytes = row_elems * static_cast<int64_t>(ffi::ByteWidth(table.element_type()));
  return ffi::Error::Success();
}

// Reads a table handle operand: the CUDA backend's lives in host memory
// (gather_cuda.h's HostHandle), the CPU's is read in place (HandleOnCpu).
using HandleReader = ffi::Error (*)(ffi::Buffer<ffi::S32>, int32_t*);

inline ffi::Error HandleOnCpu(ffi::Buffer<ffi::S32> handle, int32_t* value) {
  if (handle.element_count() != 1) {
    return ffi::Error::InvalidArgument("jdirect: a HostTable handle has exactly one element");
  }
  *value = handle.typed_data()[0];
  return ffi::Error::Success();
}

// Checks a HostTable lease against the shape the program was traced for.
inline ffi::Error CheckLease(const TableLease& lease, int64_t nrows,
                             int64_t row_bytes) {
  // FAILED_PRECONDITION, not INVALID_ARGUMENT: JAX turns the latter into a
  // ValueError on some dispatch paths only; this way every path raises
  // the same JaxRuntimeError.
  if (!lease.ok()) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, lease.error());
  if (lease.view().nrows != nrows || lease.view().row_bytes != row_bytes) {
    return ffi::Error::InvalidArgument(
        "jdirect gather: HostTable handle does not match the traced table "
        "shape");
  }
  return ffi::Error::Success();
}

template <typename Runner>
ffi::Error GatherFromArray(const Runner& run, ffi::AnyBuffer table,
                           ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out,
                           int64_t mode, int64_t fill_lo, int64_t fill_hi) {
  int64_t nrows, row_bytes;
  if (auto e = TableShape(table, &nrows, &row_bytes); e.failure()) return e;
  GatherArgs a;
  if (auto e = MakeGatherArgs(static_cast<const char*>(table.untyped_data()),
                              nrows, row_bytes, idx, out, mode, fill_lo,
                              fill_hi, &a);
      e.failure()) {
    return e;
  }
  return run(a);
}

// The lease spans the runner: on the CPU the copy, on the GPU the launch and
// the recording of the table's event, which close() waits for before the
// memory is released. `nrows` is the table's as read (indices resolve
// against it); the host table has `compact_rows` rows where that is >= 0 (a
// cache's compact host table), else `nrows`. `copy_thousandths` as
// GatherArgs' (0 where there is a cache).
template <typename Runner>
ffi::Error GatherFromHandle(const Runner& run, int32_t handle,
                            ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer cached,
                            ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out,
                            int64_t mode, int64_t fill_lo, int64_t fill_hi,
                            int64_t nrows, int64_t row_bytes, int64_t compact_rows,
                            int64_t copy_thousandths) {
  TableLease lease(handle);
  const int64_t leased = compact_rows >= 0 ? compact_rows : nrows;
  if (auto e = CheckLease(lease, leased, row_bytes); e.failure()) return e;
  GatherArgs a;
  if (auto e = MakeGatherArgs(lease.view().data, nrows, row_bytes, idx, out,
                              mode, fill_lo, fill_hi, &a);
      e.failure()) {
    return e;
  }
  if (auto e = MakeCache(slots, cached, nrows, row_bytes, &a.cache, compact_rows); e.failure()) {
    return e;
  }
  a.handle = handle;
  if (copy_thousandths < 0 || copy_thousandths > 1000) {
    return ffi::Error::InvalidArgument("jdirect gather: copy_thousandths must be in [0, 1000]");
  }
  a.copy_thousandths = a.cache.slots == nullptr ? copy_thousandths : 0;
  return run(a);
}

}  // namespace jdirect

// XLA_FFI_DEFINE_HANDLER_SYMBOL plus default visibility, so the library can
// hide everything else.
#define JDIRECT_DEFINE_HANDLER(fn, impl, binding)                     \
  extern "C" JDIRECT_EXPORT XLA_FFI_Error* fn(XLA_FFI_CallFrame*);    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(fn, impl, binding)

// Bindings shared by both backends; CTX is empty on the CPU and the stream
// on the GPU. `workspace` holds the GPU's address-order sort (empty for
// caller order) and `max_blocks` caps the GPU's grids (0: the default);
// the CPU handlers ignore both. The asynchronous start has the bindings of
// the registered-table gathers.
#define JDIRECT_BIND_GATHER_ARRAY(CTX)                    \
  xla::ffi::Ffi::Bind() CTX                               \
      .Arg<xla::ffi::AnyBuffer>() /* table */             \
      .Arg<xla::ffi::AnyBuffer>() /* idx */               \
      .Ret<xla::ffi::AnyBuffer>() /* out */               \
      .Ret<xla::ffi::AnyBuffer>() /* workspace */         \
      .Attr<int64_t>("mode")                              \
      .Attr<int64_t>("fill_lo")                           \
      .Attr<int64_t>("fill_hi")                           \
      .Attr<int64_t>("max_blocks")

#define JDIRECT_BIND_GATHER_HOST(CTX)                          \
  xla::ffi::Ffi::Bind() CTX                                    \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* handle */     \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* cache slots */ \
      .Arg<xla::ffi::AnyBuffer>() /* cached rows */            \
      .Arg<xla::ffi::AnyBuffer>() /* idx */                    \
      .Ret<xla::ffi::AnyBuffer>() /* out */                    \
      .Ret<xla::ffi::AnyBuffer>() /* workspace */              \
      .Attr<int64_t>("mode")                                   \
      .Attr<int64_t>("fill_lo")                                \
      .Attr<int64_t>("fill_hi")                                \
      .Attr<int64_t>("max_blocks")                             \
      .Attr<int64_t>("nrows")                                  \
      .Attr<int64_t>("row_bytes")                              \
      .Attr<int64_t>("compact_rows")                           \
      .Attr<int64_t>("copy_thousandths")

#define JDIRECT_BIND_GATHER_HOST_STATIC(CTX)    \
  xla::ffi::Ffi::Bind() CTX                     \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* cache slots */ \
      .Arg<xla::ffi::AnyBuffer>() /* cached rows */ \
      .Arg<xla::ffi::AnyBuffer>() /* idx */     \
      .Ret<xla::ffi::AnyBuffer>() /* out */     \
      .Ret<xla::ffi::AnyBuffer>() /* workspace */ \
      .Attr<int64_t>("handle")                  \
      .Attr<int64_t>("mode")                    \
      .Attr<int64_t>("fill_lo")                 \
      .Attr<int64_t>("fill_hi")                 \
      .Attr<int64_t>("max_blocks")              \
      .Attr<int64_t>("nrows")                   \
      .Attr<int64_t>("row_bytes")               \
      .Attr<int64_t>("compact_rows")            \
      .Attr<int64_t>("copy_thousandths")

// gather_done: the start's rows (aliased to the result), then every
// operand the start's read still uses, passed only to keep it alive.
#define JDIRECT_BIND_GATHER_DONE(CTX)                   \
  xla::ffi::Ffi::Bind() CTX                             \
      .Arg<xla::ffi::AnyBuffer>() /* rows */            \
      .RemainingArgs()            /* keep-alive */      \
      .Ret<xla::ffi::AnyBuffer>() /* rows, aliased */

#endif  // JDIRECT_FFI_GATHER_COMMON_H_
