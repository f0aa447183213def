// CPU twin of the CUDA neighbour sum (neighbor_sum_common.h).
#include <cstdint>
#include <cstring>

#include "neighbor_sum_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

template <typename T, typename P, typename I>
void SumRows(const NeighborSumArgs& a) {
  const char* table = static_cast<const char*>(a.table);
  const int64_t row_bytes = a.row_bytes();
  const P* indptr = static_cast<const P*>(a.indptr);
  const I* indices = static_cast<const I*>(a.indices);
  const int64_t start = FirstNode(a.start, a.start64);
  std::memset(a.out, 0, sizeof(float) * a.size * a.width);
  for (int64_t k = 0; k < a.size; ++k) {
    const int64_t node = start + k;
    if (node < 0 || node >= a.ndst) continue;
    int64_t lo, hi;
    EdgeRange(indptr, node, a.nnz, &lo, &hi);
    float* out = a.out + k * a.width;
    for (int64_t e = lo; e < hi; ++e) {
      const int64_t r = static_cast<int64_t>(indices[e]);
      if (r < 0 || r >= a.nrows) continue;
      const T* row = reinterpret_cast<const T*>(RowAddress(table, r, row_bytes, a.cache));
      for (int64_t c = 0; c < a.width; ++c) out[c] += ToFloat(row[c]);
    }
  }
}

struct CpuRunner {
  ffi::Error operator()(const NeighborSumArgs& a) const {
    WithNeighborSumTypes(a, [&](auto t, auto p, auto i) {
      SumRows<decltype(t), decltype(p), decltype(i)>(a);
    });
    return ffi::Error::Success();
  }
};

ffi::Error Run(ffi::AnyBuffer table, ffi::AnyBuffer indptr, ffi::AnyBuffer indices,
               ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer> out,
               ffi::Result<ffi::AnyBuffer> /*hubs*/) {
  return NeighborSum(CpuRunner{}, table, indptr, indices, start, out);
}

// The sum is done when a runner returns: nothing to record for close().
ffi::Error Done(const int32_t*, int, bool) { return ffi::Error::Success(); }

ffi::Error RunHost(ffi::AnyBuffer table, ffi::Buffer<ffi::S32> indptr_handle,
                   ffi::Buffer<ffi::S32> indices_handle, ffi::AnyBuffer start,
                   ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> /*hubs*/,
                   int64_t indptr_type, int64_t indptr_rows, int64_t indices_type,
                   int64_t indices_rows) {
  return NeighborSumHost(CpuRunner{}, HandleOnCpu, Done, table, indptr_handle, indices_handle,
                         start, out, indptr_type, indptr_rows, indices_type, indices_rows);
}

ffi::Error RunCached(ffi::Buffer<ffi::S32> table_handle, ffi::Buffer<ffi::S32> slots,
                     ffi::AnyBuffer cached, ffi::AnyBuffer indptr, ffi::AnyBuffer indices,
                     ffi::AnyBuffer start, ffi::Result<ffi::AnyBuffer> out,
                     ffi::Result<ffi::AnyBuffer> /*hubs*/, int64_t table_type,
                     int64_t table_rows, int64_t width) {
  return NeighborSumCached(CpuRunner{}, HandleOnCpu, Done, table_handle, slots, cached, indptr,
                           indices, start, out, table_type, table_rows, width);
}

ffi::Error RunCachedHost(ffi::Buffer<ffi::S32> table_handle, ffi::Buffer<ffi::S32> slots,
                         ffi::AnyBuffer cached, ffi::Buffer<ffi::S32> indptr_handle,
                         ffi::Buffer<ffi::S32> indices_handle, ffi::AnyBuffer start,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> /*hubs*/,
                         int64_t table_type, int64_t table_rows, int64_t width,
                         int64_t indptr_type, int64_t indptr_rows, int64_t indices_type,
                         int64_t indices_rows) {
  return NeighborSumCachedHost(CpuRunner{}, HandleOnCpu, Done, table_handle, slots, cached,
                               indptr_handle, indices_handle, start, out, table_type,
                               table_rows, width, indptr_type, indptr_rows, indices_type,
                               indices_rows);
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCpu, jdirect::Run, JDIRECT_BIND_NEIGHBOR_SUM());
JDIRECT_DEFINE_HANDLER(JdirectNeighborSumHostCpu, jdirect::RunHost,
                       JDIRECT_BIND_NEIGHBOR_SUM_HOST());
JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCachedCpu, jdirect::RunCached,
                       JDIRECT_BIND_NEIGHBOR_SUM_CACHED());
JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCachedHostCpu, jdirect::RunCachedHost,
                       JDIRECT_BIND_NEIGHBOR_SUM_CACHED_HOST());
