// CPU twin of the CUDA sparse update: the same target, registered for
// platform "cpu", with the same semantics and rules (sparse_update_common.h).
#include <cstdint>

#include "sparse_update_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

// Calls update(r, row, old, g) for each key in [0, nrows): its table row r,
// that row's storage, its current values (the given rows, else the row)
// and its summed gradient row.
template <typename T, typename K, typename F>
void ForEachKey(const SparseUpdateArgs& a, F update) {
  const K* keys = static_cast<const K*>(a.keys);
  T* table = reinterpret_cast<T*>(a.table);
  const T* given = reinterpret_cast<const T*>(a.rows);
  for (int64_t k = 0; k < a.n; ++k) {
    const int64_t r = static_cast<int64_t>(keys[k]);
    if (r < 0 || r >= a.nrows) continue;
    T* row = table + r * a.dim;
    update(r, row, given != nullptr ? given + k * a.dim : row, a.grads + k * a.dim);
  }
}

template <Rule R, typename T, typename K>
void UpdateRows(const SparseUpdateArgs& a) {
  ForEachKey<T, K>(a, [&](int64_t r, T* row, const T* old, const float* g) {
    for (int64_t j = 0; j < a.dim; ++j) {
      const int64_t at = r * a.dim + j;
      float s0 = 0.0f, s1 = 0.0f;
      if constexpr (SlotCount(R) > 0) s0 = a.slots[0][at];
      if constexpr (SlotCount(R) > 1) s1 = a.slots[1][at];
      row[j] = FromFloat<T>(Update<R>(a.hyper, a.scalars, ToFloat(old[j]), g[j], s0, s1));
      if constexpr (SlotCount(R) > 0) a.slots[0][at] = s0;
      if constexpr (SlotCount(R) > 1) a.slots[1][at] = s1;
    }
  });
}

// Row-wise Adagrad: the row's sum of squared gradients first, then every
// element with the row's one scale.
template <typename T, typename K>
void UpdateRowwise(const SparseUpdateArgs& a) {
  ForEachKey<T, K>(a, [&](int64_t r, T* row, const T* old, const float* g) {
    float sum_sq = 0.0f;
    for (int64_t j = 0; j < a.dim; ++j) sum_sq += g[j] * g[j];
    const float scale = RowwiseScale(a.hyper, a.scalars[kLr], a.slots[0][r], sum_sq, a.dim);
    for (int64_t j = 0; j < a.dim; ++j) {
      row[j] = FromFloat<T>(RowwiseUpdate(scale, ToFloat(old[j]), g[j]));
    }
  });
}

template <Rule R, typename T, typename K>
void UpdateKeys(const SparseUpdateArgs& a) {
  if constexpr (PerRowSlots(R)) {
    UpdateRowwise<T, K>(a);
  } else {
    UpdateRows<R, T, K>(a);
  }
}

template <Rule R>
void UpdateTyped(const SparseUpdateArgs& a) {
  if (a.bf16) {
    a.keys64 ? UpdateKeys<R, Bf16, int64_t>(a) : UpdateKeys<R, Bf16, int32_t>(a);
  } else {
    a.keys64 ? UpdateKeys<R, float, int64_t>(a) : UpdateKeys<R, float, int32_t>(a);
  }
}

struct CpuUpdater {
  ffi::Error operator()(const SparseUpdateArgs& a) const {
    switch (a.rule) {
      case Rule::kSgd: UpdateTyped<Rule::kSgd>(a); break;
      case Rule::kAdagrad: UpdateTyped<Rule::kAdagrad>(a); break;
      case Rule::kAdam: UpdateTyped<Rule::kAdam>(a); break;
      case Rule::kRowwiseAdagrad: UpdateTyped<Rule::kRowwiseAdagrad>(a); break;
    }
    return ffi::Error::Success();
  }
};

ffi::Error SparseUpdate(ffi::AnyBuffer keys, ffi::Buffer<ffi::F32> grads, ffi::AnyBuffer rows,
                        ffi::Buffer<ffi::F32> scalars, ffi::RemainingArgs rest,
                        ffi::Result<ffi::Buffer<ffi::S32>> token, int64_t rule,
                        ffi::Span<const int64_t> handles, int64_t nrows, int64_t dim, double b1,
                        double b2, double eps) {
  if (token->element_count() != 1) {
    return ffi::Error::InvalidArgument("jdirect: a write's token has exactly one element");
  }
  token->typed_data()[0] = 0;
  return SparseUpdateTables(CpuUpdater{}, HandleOnCpu, keys, grads, rows, scalars, rest, rule,
                            handles, nrows, dim, b1, b2, eps);
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectSparseUpdateCpu, jdirect::SparseUpdate,
                       JDIRECT_BIND_SPARSE_UPDATE());
