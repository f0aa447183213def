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

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectNeighborSumCpu, jdirect::Run, JDIRECT_BIND_NEIGHBOR_SUM());
