// CPU twin of the CUDA neighbour sum (neighbor_sum_common.h).
#include <cstdint>
#include <cstring>

#include "neighbor_sum_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

template <typename T, typename P, typename I>
void SumRows(const NeighborSumArgs& a) {
  const T* table = static_cast<const T*>(a.table);
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
      const T* row = table + r * a.width;
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

ffi::Error RunHost(ffi::AnyBuffer table, ffi::Buffer<ffi::S32> indptr_handle,
                   ffi::Buffer<ffi::S32> indices_handle, ffi::AnyBuffer start,
                   ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> /*hubs*/,
                   int64_t indptr_type, int64_t indptr_rows, int64_t indices_type,
                   int64_t indices_rows) {
  // The sum is done when it returns: nothing to record for close().
  const auto done = [](int32_t, int32_t, bool) { return ffi::Error::Success(); };
  return NeighborSumHost(CpuRunner{}, HandleOnCpu, done, table, indptr_handle, indices_handle,
                         start, out, indptr_type, indptr_rows, indices_type, indices_rows);
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCpu, jdirect::Run, JDIRECT_BIND_NEIGHBOR_SUM());
JDIRECT_DEFINE_HANDLER(JdirectNeighborSumHostCpu, jdirect::RunHost,
                       JDIRECT_BIND_NEIGHBOR_SUM_HOST());
