// The neighbour sum (jdirect.neighbor_sum), shared by the CPU and CUDA
// backends: for k in [0, size), node = start + k,
//   out[k] = sum over e in [indptr[node], indptr[node + 1]) of
//            float32(table[indices[e]])
// and a zero row where node is outside [0, len(indptr) - 1). An edge whose
// id is outside [0, nrows) adds nothing, and edge positions are clipped to
// [0, len(indices)), so a malformed CSR never reads outside its arrays or
// the table. The rows come from an array or from a HostTable, whose rows a
// device cache holds are read there (the same values: a CachedTable's).
// Each backend supplies a runner (`ffi::Error run(const NeighborSumArgs&)`).
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
  DeviceCache cache;     // rows of `table` also in device memory (a
                         // CachedTable's; none where cache.slots is null)
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

  int64_t row_bytes() const { return width * (bf16 ? 2 : 4); }
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

inline bool IsOffset(ffi::DataType t) { return IsIndex(t) || t == ffi::DataType::U32; }

inline ffi::Error Bad(const char* what) {
  return ffi::Error::InvalidArgument(std::string("jdirect neighbor_sum: ") + what);
}

// The rows from an array operand.
inline ffi::Error ArrayRows(ffi::AnyBuffer table, NeighborSumArgs* a) {
  if (table.element_type() != ffi::DataType::F32 &&
      table.element_type() != ffi::DataType::BF16) {
    return Bad("the table must be float32 or bfloat16");
  }
  int64_t nrows, row_bytes;
  if (auto e = TableShape(table, &nrows, &row_bytes); e.failure()) return e;
  a->table = table.untyped_data();
  a->bf16 = table.element_type() == ffi::DataType::BF16;
  a->nrows = nrows;
  a->width = row_bytes / static_cast<int64_t>(ffi::ByteWidth(table.element_type()));
  a->cache = DeviceCache{};
  return ffi::Error::Success();
}

// The rows of a leased HostTable of `nrows` rows of `width` elements of
// `table_type` (XLA's type number), as traced, and its device cache
// (`slots` and `cached` rows; empty: none).
inline ffi::Error LeasedRows(const TableLease& lease, ffi::Buffer<ffi::S32> slots,
                             ffi::AnyBuffer cached, int64_t table_type, int64_t nrows,
                             int64_t width, NeighborSumArgs* a) {
  const auto type = static_cast<ffi::DataType>(table_type);
  if ((type != ffi::DataType::F32 && type != ffi::DataType::BF16) || nrows < 0 || width < 0) {
    return Bad("the table must hold float32 or bfloat16 rows");
  }
  a->bf16 = type == ffi::DataType::BF16;
  a->width = width;
  if (auto e = CheckLease(lease, nrows, a->row_bytes()); e.failure()) return e;
  if (slots.element_count() != 0 && cached.element_type() != type) {
    return Bad("the cached rows must be of the table's type");
  }
  a->table = lease.view().data;
  a->nrows = nrows;
  a->cache = DeviceCache{};
  if (a->row_bytes() == 0) return ffi::Error::Success();  // no row is read
  return MakeCache(slots, cached, nrows, a->row_bytes(), &a->cache);
}

// The CSR from array operands.
inline ffi::Error ArrayCsr(ffi::AnyBuffer indptr, ffi::AnyBuffer indices, NeighborSumArgs* a) {
  if (!IsOffset(indptr.element_type()) || indptr.dimensions().size() != 1 ||
      indptr.element_count() < 1) {
    return Bad("indptr must be a non-empty int32, uint32 or int64 vector");
  }
  if (!IsIndex(indices.element_type()) || indices.dimensions().size() != 1) {
    return Bad("indices must be an int32 or int64 vector");
  }
  a->indptr = indptr.untyped_data();
  a->indptr_type = indptr.element_type();
  a->ndst = static_cast<int64_t>(indptr.element_count()) - 1;
  a->indices = indices.untyped_data();
  a->indices64 = indices.element_type() == ffi::DataType::S64;
  a->nnz = static_cast<int64_t>(indices.element_count());
  return ffi::Error::Success();
}

// The CSR from two leased HostTables (the offsets and the ids, read in
// place), of the element types (XLA's type numbers) and lengths the
// program was traced for.
inline ffi::Error LeasedCsr(const TableLease& offsets, const TableLease& ids,
                            int64_t indptr_type, int64_t indptr_rows, int64_t indices_type,
                            int64_t indices_rows, NeighborSumArgs* a) {
  const auto p_type = static_cast<ffi::DataType>(indptr_type);
  const auto i_type = static_cast<ffi::DataType>(indices_type);
  if (!IsOffset(p_type) || !IsIndex(i_type) || indptr_rows < 1 || indices_rows < 0) {
    return Bad("a host CSR needs int32, uint32 or int64 offsets (at least one) and int32 "
               "or int64 ids");
  }
  if (auto e = CheckLease(offsets, indptr_rows, ffi::ByteWidth(p_type)); e.failure()) return e;
  if (auto e = CheckLease(ids, indices_rows, ffi::ByteWidth(i_type)); e.failure()) return e;
  a->indptr = offsets.view().data;
  a->indptr_type = p_type;
  a->ndst = indptr_rows - 1;
  a->indices = ids.view().data;
  a->indices64 = i_type == ffi::DataType::S64;
  a->nnz = indices_rows;
  return ffi::Error::Success();
}

// Checks `start` and the output against the rows' width.
inline ffi::Error StartAndOutput(ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer>& out,
                                 NeighborSumArgs* a) {
  if (!IsIndex(start.element_type()) || start.element_count() != 1) {
    return Bad("start must be one int32 or int64");
  }
  auto dims = out->dimensions();
  if (out->element_type() != ffi::DataType::F32 || dims.size() < 1 ||
      static_cast<int64_t>(out->element_count()) != dims[0] * a->width) {
    return Bad("the output must be float32 [size, *row]");
  }
  a->start = start.untyped_data();
  a->start64 = start.element_type() == ffi::DataType::S64;
  a->out = static_cast<float*>(out->untyped_data());
  a->size = dims[0];
  return ffi::Error::Success();
}

// The four handlers' bodies: rows from an array or a leased HostTable (with
// its cache), the CSR from arrays or leased HostTables. Each backend
// supplies `run(args)`, `read_handle` and `record(handles, count, failed)`,
// which on a GPU records the leased tables' events after the launch
// (close() waits for them) and, where the launch or a record failed, waits
// for the stream itself: a kernel may be queued that close() would not
// wait for. The leases span both.
template <typename Runner>
ffi::Error NeighborSum(const Runner& run, ffi::AnyBuffer table, ffi::AnyBuffer indptr,
                       ffi::AnyBuffer indices, ffi::AnyBuffer start,
                       ffi::Result<ffi::AnyBuffer> out) {
  NeighborSumArgs a;
  if (auto e = ArrayRows(table, &a); e.failure()) return e;
  if (auto e = ArrayCsr(indptr, indices, &a); e.failure()) return e;
  if (auto e = StartAndOutput(start, out, &a); e.failure()) return e;
  return run(a);
}

template <typename Runner, typename Recorder>
ffi::Error Recorded(const Runner& run, Recorder record, const NeighborSumArgs& a,
                    const int32_t* handles, int count) {
  ffi::Error ran = run(a);
  ffi::Error recorded = record(handles, count, ran.failure());
  return ran.failure() ? ran : recorded;
}

template <typename Runner, typename Recorder>
ffi::Error NeighborSumHost(const Runner& run, HandleReader read_handle, Recorder record,
                           ffi::AnyBuffer table, ffi::Buffer<ffi::S32> indptr_handle,
                           ffi::Buffer<ffi::S32> indices_handle, ffi::AnyBuffer start,
                           ffi::Result<ffi::AnyBuffer> out, int64_t indptr_type,
                           int64_t indptr_rows, int64_t indices_type, int64_t indices_rows) {
  int32_t h[2];
  if (auto e = read_handle(indptr_handle, &h[0]); e.failure()) return e;
  if (auto e = read_handle(indices_handle, &h[1]); e.failure()) return e;
  TableLease offsets(h[0]), ids(h[1]);
  NeighborSumArgs a;
  if (auto e = ArrayRows(table, &a); e.failure()) return e;
  if (auto e = LeasedCsr(offsets, ids, indptr_type, indptr_rows, indices_type, indices_rows,
                         &a);
      e.failure()) {
    return e;
  }
  if (auto e = StartAndOutput(start, out, &a); e.failure()) return e;
  return Recorded(run, record, a, h, 2);
}

template <typename Runner, typename Recorder>
ffi::Error NeighborSumCached(const Runner& run, HandleReader read_handle, Recorder record,
                             ffi::Buffer<ffi::S32> table_handle, ffi::Buffer<ffi::S32> slots,
                             ffi::AnyBuffer cached, ffi::AnyBuffer indptr,
                             ffi::AnyBuffer indices, ffi::AnyBuffer start,
                             ffi::Result<ffi::AnyBuffer> out, int64_t table_type,
                             int64_t table_rows, int64_t width) {
  int32_t h;
  if (auto e = read_handle(table_handle, &h); e.failure()) return e;
  TableLease rows(h);
  NeighborSumArgs a;
  if (auto e = LeasedRows(rows, slots, cached, table_type, table_rows, width, &a);
      e.failure()) {
    return e;
  }
  if (auto e = ArrayCsr(indptr, indices, &a); e.failure()) return e;
  if (auto e = StartAndOutput(start, out, &a); e.failure()) return e;
  return Recorded(run, record, a, &h, 1);
}

template <typename Runner, typename Recorder>
ffi::Error NeighborSumCachedHost(const Runner& run, HandleReader read_handle, Recorder record,
                                 ffi::Buffer<ffi::S32> table_handle,
                                 ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer cached,
                                 ffi::Buffer<ffi::S32> indptr_handle,
                                 ffi::Buffer<ffi::S32> indices_handle, ffi::AnyBuffer start,
                                 ffi::Result<ffi::AnyBuffer> out, int64_t table_type,
                                 int64_t table_rows, int64_t width, int64_t indptr_type,
                                 int64_t indptr_rows, int64_t indices_type,
                                 int64_t indices_rows) {
  int32_t h[3];
  if (auto e = read_handle(table_handle, &h[0]); e.failure()) return e;
  if (auto e = read_handle(indptr_handle, &h[1]); e.failure()) return e;
  if (auto e = read_handle(indices_handle, &h[2]); e.failure()) return e;
  TableLease rows(h[0]), offsets(h[1]), ids(h[2]);
  NeighborSumArgs a;
  if (auto e = LeasedRows(rows, slots, cached, table_type, table_rows, width, &a);
      e.failure()) {
    return e;
  }
  if (auto e = LeasedCsr(offsets, ids, indptr_type, indptr_rows, indices_type, indices_rows,
                         &a);
      e.failure()) {
    return e;
  }
  if (auto e = StartAndOutput(start, out, &a); e.failure()) return e;
  return Recorded(run, record, a, h, 3);
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

// A HostTable's rows (its handle, attributes table_type, table_rows, width)
// with its device cache (slots and rows; empty: none).
#define JDIRECT_BIND_NEIGHBOR_SUM_CACHED(CTX)                         \
  xla::ffi::Ffi::Bind() CTX                                          \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* the table's handle */ \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* cache slots */      \
      .Arg<xla::ffi::AnyBuffer>() /* cached rows */                  \
      .Arg<xla::ffi::AnyBuffer>() /* indptr */                       \
      .Arg<xla::ffi::AnyBuffer>() /* indices */                      \
      .Arg<xla::ffi::AnyBuffer>() /* start */                        \
      .Ret<xla::ffi::AnyBuffer>() /* out */                          \
      .Ret<xla::ffi::AnyBuffer>() /* hubs, as JDIRECT_BIND_NEIGHBOR_SUM's */ \
      .Attr<int64_t>("table_type")                                   \
      .Attr<int64_t>("table_rows")                                   \
      .Attr<int64_t>("width")

#define JDIRECT_BIND_NEIGHBOR_SUM_CACHED_HOST(CTX)                    \
  xla::ffi::Ffi::Bind() CTX                                          \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* the table's handle */ \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* cache slots */      \
      .Arg<xla::ffi::AnyBuffer>() /* cached rows */                  \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* indptr's handle */  \
      .Arg<xla::ffi::Buffer<xla::ffi::S32>>() /* indices' handle */  \
      .Arg<xla::ffi::AnyBuffer>() /* start */                        \
      .Ret<xla::ffi::AnyBuffer>() /* out */                          \
      .Ret<xla::ffi::AnyBuffer>() /* hubs, as JDIRECT_BIND_NEIGHBOR_SUM's */ \
      .Attr<int64_t>("table_type")                                   \
      .Attr<int64_t>("table_rows")                                   \
      .Attr<int64_t>("width")                                        \
      .Attr<int64_t>("indptr_type")                                  \
      .Attr<int64_t>("indptr_rows")                                  \
      .Attr<int64_t>("indices_type")                                 \
      .Attr<int64_t>("indices_rows")

#endif  // JDIRECT_FFI_NEIGHBOR_SUM_COMMON_H_
