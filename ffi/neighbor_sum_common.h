// The neighbour sum (jdirect.neighbor_sum), shared by the CPU and CUDA
// backends: for k in [0, size), node = start + k,
//   out[k] = sum over e in [indptr[node], indptr[node + 1]) of
//            float32(table[indices[e]])
// and a zero row where node is outside [0, len(indptr) - 1). An edge whose
// id is outside [0, nrows) adds nothing, and edge positions are clipped to
// [0, len(indices)), so a malformed CSR never reads outside its arrays or
// the table. Each backend supplies a runner
// (`ffi::Error run(const NeighborSumArgs&)`).
#ifndef JDIRECT_FFI_NEIGHBOR_SUM_COMMON_H_
#define JDIRECT_FFI_NEIGHBOR_SUM_COMMON_H_

#include <cstdint>
#include <string>

#include "elements.h"
#include "gather_common.h"  // TableShape, JDIRECT_DEFINE_HANDLER
#include "index.h"          // JDIRECT_HD
#include "xla/ffi/api/ffi.h"

namespace jdirect {

struct NeighborSumArgs {
  const void* table;     // nrows x width elements: float32, or bfloat16 if bf16
  bool bf16;
  int64_t nrows;
  int64_t width;         // elements of a row
  const void* indptr;    // ndst + 1 offsets of type indptr_type: int32, uint32
                         // (edges past int32 without 64-bit types) or int64
  ffi::DataType indptr_type;
  int64_t ndst;
  const void* indices;   // nnz source ids, int64 if indices64 else int32
  bool indices64;
  int64_t nnz;
  const void* start;     // the first node: one int64 if start64 else int32
  bool start64;
  float* out;            // size x width
  int64_t size;
};

// The first node: `start` holds one int64 if start64, else one int32.
JDIRECT_HD int64_t FirstNode(const void* start, bool start64) {
  return start64 ? *static_cast<const int64_t*>(start) : *static_cast<const int32_t*>(start);
}

// The edge range [lo, hi) of `node`, clipped into [0, nnz).
template <typename P>
JDIRECT_HD void EdgeRange(const P* indptr, int64_t node, int64_t nnz, int64_t* lo,
                          int64_t* hi) {
  int64_t a = static_cast<int64_t>(indptr[node]);
  int64_t b = static_cast<int64_t>(indptr[node + 1]);
  a = a < 0 ? 0 : (a > nnz ? nnz : a);
  b = b < a ? a : (b > nnz ? nnz : b);
  *lo = a;
  *hi = b;
}

// Calls fn(T{}, P{}, I{}): the table's element type, the offsets' and the
// ids' integer types.
template <typename Fn>
void WithNeighborSumTypes(const NeighborSumArgs& a, Fn fn) {
  auto ids = [&](auto t, auto p) {
    if (a.indices64) return fn(t, p, int64_t{});
    return fn(t, p, int32_t{});
  };
  auto offsets = [&](auto t) {
    if (a.indptr_type == ffi::DataType::S64) return ids(t, int64_t{});
    if (a.indptr_type == ffi::DataType::U32) return ids(t, uint32_t{});
    return ids(t, int32_t{});
  };
  if (a.bf16) return offsets(Bf16{});
  return offsets(float{});
}

inline bool IsIndex(ffi::DataType t) {
  return t == ffi::DataType::S32 || t == ffi::DataType::S64;
}

// Checks the table, `start` and the output, and fills their fields of `a`.
inline ffi::Error RowsAndOutput(ffi::AnyBuffer table, ffi::AnyBuffer start,
                                ffi::Result<ffi::AnyBuffer>& out, NeighborSumArgs* a) {
  const auto bad = [](const char* what) {
    return ffi::Error::InvalidArgument(std::string("jdirect neighbor_sum: ") + what);
  };
  if (table.element_type() != ffi::DataType::F32 &&
      table.element_type() != ffi::DataType::BF16) {
    return bad("the table must be float32 or bfloat16");
  }
  if (!IsIndex(start.element_type()) || start.element_count() != 1) {
    return bad("start must be one int32 or int64");
  }
  int64_t nrows, row_bytes;
  if (auto e = TableShape(table, &nrows, &row_bytes); e.failure()) return e;
  const int64_t width = row_bytes / static_cast<int64_t>(ffi::ByteWidth(table.element_type()));
  auto dims = out->dimensions();
  if (out->element_type() != ffi::DataType::F32 || dims.size() < 1 ||
      static_cast<int64_t>(out->element_count()) != dims[0] * width) {
    return bad("the output must be float32 [size, *row]");
  }
  a->table = table.untyped_data();
  a->bf16 = table.element_type() == ffi::DataType::BF16;
  a->nrows = nrows;
  a->width = width;
  a->start = start.untyped_data();
  a->start64 = start.element_type() == ffi::DataType::S64;
  a->out = static_cast<float*>(out->untyped_data());
  a->size = dims[0];
  return ffi::Error::Success();
}

inline bool IsOffset(ffi::DataType t) { return IsIndex(t) || t == ffi::DataType::U32; }

// The CSR from array operands.
template <typename Runner>
ffi::Error NeighborSum(const Runner& run, ffi::AnyBuffer table, ffi::AnyBuffer indptr,
                       ffi::AnyBuffer indices, ffi::AnyBuffer start,
                       ffi::Result<ffi::AnyBuffer> out) {
  if (!IsOffset(indptr.element_type()) || indptr.dimensions().size() != 1 ||
      indptr.element_count() < 1) {
    return ffi::Error::InvalidArgument(
        "jdirect neighbor_sum: indptr must be a non-empty int32, uint32 or int64 vector");
  }
  if (!IsIndex(indices.element_type()) || indices.dimensions().size() != 1) {
    return ffi::Error::InvalidArgument(
        "jdirect neighbor_sum: indices must be an int32 or int64 vector");
  }
  NeighborSumArgs a;
  if (auto e = RowsAndOutput(table, start, out, &a); e.failure()) return e;
  a.indptr = indptr.untyped_data();
  a.indptr_type = indptr.element_type();
  a.ndst = static_cast<int64_t>(indptr.element_count()) - 1;
  a.indices = indices.untyped_data();
  a.indices64 = indices.element_type() == ffi::DataType::S64;
  a.nnz = static_cast<int64_t>(indices.element_count());
  return run(a);
}

// The CSR from two registered host tables (HostTables of the offsets and
// the ids, read in place): their handle operands, and the element types
// (XLA's type numbers) and lengths the program was traced for. The leases
// span the runner and `record(indptr_handle, indices_handle, failed)`,
// which on a GPU records both tables' events after the launch (close()
// waits for them) and, where the launch or a record failed, waits for the
// stream itself: a kernel may be queued that close() would not wait for.
template <typename Runner, typename Recorder>
ffi::Error NeighborSumHost(const Runner& run, HandleReader read_handle, Recorder record,
                           ffi::AnyBuffer table, ffi::Buffer<ffi::S32> indptr_handle,
                           ffi::Buffer<ffi::S32> indices_handle, ffi::AnyBuffer start,
                           ffi::Result<ffi::AnyBuffer> out, int64_t indptr_type,
                           int64_t indptr_rows, int64_t indices_type, int64_t indices_rows) {
  const auto p_type = static_cast<ffi::DataType>(indptr_type);
  const auto i_type = static_cast<ffi::DataType>(indices_type);
  if (!IsOffset(p_type) || !IsIndex(i_type) || indptr_rows < 1 || indices_rows < 0) {
    return ffi::Error::InvalidArgument(
        "jdirect neighbor_sum: a host CSR needs int32, uint32 or int64 offsets (at least "
        "one) and int32 or int64 ids");
  }
  int32_t hp, hi;
  if (auto e = read_handle(indptr_handle, &hp); e.failure()) return e;
  if (auto e = read_handle(indices_handle, &hi); e.failure()) return e;
  TableLease offsets(hp), ids(hi);
  if (auto e = CheckLease(offsets, indptr_rows, ffi::ByteWidth(p_type)); e.failure()) return e;
  if (auto e = CheckLease(ids, indices_rows, ffi::ByteWidth(i_type)); e.failure()) return e;
  NeighborSumArgs a;
  if (auto e = RowsAndOutput(table, start, out, &a); e.failure()) return e;
  a.indptr = offsets.view().data;
  a.indptr_type = p_type;
  a.ndst = indptr_rows - 1;
  a.indices = ids.view().data;
  a.indices64 = i_type == ffi::DataType::S64;
  a.nnz = indices_rows;
  ffi::Error ran = run(a);
  ffi::Error recorded = record(hp, hi, ran.failure());
  return ran.failure() ? ran : recorded;
}

}  // namespace jdirect

#define JDIRECT_BIND_NEIGHBOR_SUM(CTX)                \
  xla::ffi::Ffi::Bind() CTX                           \
      .Arg<xla::ffi::AnyBuffer>() /* table */         \
      .Arg<xla::ffi::AnyBuffer>() /* indptr */        \
      .Arg<xla::ffi::AnyBuffer>() /* indices */       \
      .Arg<xla::ffi::AnyBuffer>() /* start */         \
      .Ret<xla::ffi::AnyBuffer>() /* out */            \
      .Ret<xla::ffi::AnyBuffer>() /* hubs: int32[size + 1], the GPU's list of nodes */ \
                                  /* with more edges than a warp sums; CPU: unused */

#define JDIRECT_BIND_NEIGHBOR_SUM_HOST(CTX)                           \
  xla::ffi::Ffi::Bind() CTX                                          \
      .Arg<xla::ffi::AnyBuffer>() /* table */                        \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* indptr's handle */  \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* indices' handle */  \
      .Arg<xla::ffi::AnyBuffer>() /* start */                        \
      .Ret<xla::ffi::AnyBuffer>() /* out */                          \
      .Ret<xla::ffi::AnyBuffer>() /* hubs, as JDIRECT_BIND_NEIGHBOR_SUM's */ \
      .Attr<int64_t>("indptr_type")                                  \
      .Attr<int64_t>("indptr_rows")                                  \
      .Attr<int64_t>("indices_type")                                 \
      .Attr<int64_t>("indices_rows")

#endif  // JDIRECT_FFI_NEIGHBOR_SUM_COMMON_H_
