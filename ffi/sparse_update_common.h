// The fused sparse optimizer step (jdirect.embeddings' optimizers on
// HostTables), shared by the CPU and CUDA backends: for each distinct key
// in [0, nrows), read the table row (unless the caller passes it) and the
// slot rows, apply the rule with the key's summed gradient row, and store
// the new table row and slot rows back in place. Keys out of range (the
// padding id nrows) read and write nothing. One definition of the rules
// (`Update` for the element-wise ones, `RowwiseScale` and `RowwiseUpdate`
// for row-wise Adagrad) serves both backends; each backend supplies a
// runner (`ffi::Error run(const SparseUpdateArgs&)`).
//
// Python (jdirect/sparse_update.py) passes distinct keys, so every row
// is written once and no backend needs atomics; the checks here, with the
// write's (write_common.h), only stop a malformed call from touching memory
// outside a table or a table registered read-only.
#ifndef JDIRECT_FFI_SPARSE_UPDATE_COMMON_H_
#define JDIRECT_FFI_SPARSE_UPDATE_COMMON_H_

#include <cmath>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "elements.h"  // Bf16, ToFloat, FromFloat
#include "index.h"     // JDIRECT_HD
#include "write_common.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {

// Values match jdirect/sparse_update.py's RULES; the slots each rule
// keeps (float32 tables of the table's shape, or of one value a row: see
// PerRowSlots) are listed there in order.
enum class Rule : int64_t { kSgd = 0, kAdagrad = 1, kAdam = 2, kRowwiseAdagrad = 3 };
constexpr int kMaxSlots = 2;

JDIRECT_HD constexpr int SlotCount(Rule rule) {
  switch (rule) {
    case Rule::kSgd: return 0;
    case Rule::kAdagrad: return 1;
    case Rule::kAdam: return 2;
    case Rule::kRowwiseAdagrad: return 1;
  }
  return -1;
}

// Whether the rule's slots hold one float32 a row (shape (nrows,)) rather
// than one per element of the row: the rule then reduces over the row.
JDIRECT_HD constexpr bool PerRowSlots(Rule rule) { return rule == Rule::kRowwiseAdagrad; }

// Hyperparameters fixed when the program is traced, as the rules use them:
// Python floats (doubles) rounded once to float32, 1 - b1 and 1 - b2
// computed in double first, as Python computes them.
struct Hyper {
  float b1, one_minus_b1, b2, one_minus_b2, eps;
};

// Step scalars computed in the program (device memory on a GPU): the
// learning rate and Adam's bias corrections 1 - b1**t and 1 - b2**t.
enum Scalar { kLr = 0, kCorrection1 = 1, kCorrection2 = 2, kScalars = 3 };

JDIRECT_HD float Rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return rsqrtf(x);
#else
  return 1.0f / std::sqrt(x);
#endif
}

// jdirect/embeddings/optimizers.py's element-wise rules for one element,
// with the same operations in the same order: w is the table's value, g the
// summed gradient, s0 and s1 the slots' values (updated in place). Returns
// the table's new value.
template <Rule R>
JDIRECT_HD float Update(const Hyper& h, const float* scalars, float w, float g, float& s0,
                        float& s1) {
  const float lr = scalars[kLr];
  if constexpr (R == Rule::kSgd) {
    return w - lr * g;
  } else if constexpr (R == Rule::kAdagrad) {
    const float acc = g * g + s0;
    s0 = acc;
    const float scale = acc > 0.0f ? Rsqrt(acc + h.eps) : 0.0f;
    return w - lr * (scale * g);
  } else {
    static_assert(R == Rule::kAdam, "row-wise rules update through RowwiseScale");
    const float mu = h.one_minus_b1 * g + h.b1 * s0;
    const float nu = h.one_minus_b2 * (g * g) + h.b2 * s1;
    s0 = mu;
    s1 = nu;
    const float mu_hat = mu / scalars[kCorrection1];
    const float nu_hat = nu / scalars[kCorrection2];
    return w - lr * (mu_hat / (std::sqrt(nu_hat) + h.eps));
  }
}

// Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD, optimizers.py's
// sparse_rowwise_adagrad) for one row of `dim` elements: adds the mean of
// the row's squared summed gradients, sum_sq / dim, to the row's slot value
// s (in place) and returns the step every element of the row takes,
// lr / (sqrt(s) + eps). Only the sum's order differs from jnp's.
JDIRECT_HD float RowwiseScale(const Hyper& h, float lr, float& s, float sum_sq, int64_t dim) {
  s = s + sum_sq / static_cast<float>(dim);
  return lr / (std::sqrt(s) + h.eps);
}

// The new value of an element w with summed gradient g, given its row's
// RowwiseScale.
JDIRECT_HD float RowwiseUpdate(float scale, float w, float g) { return w - scale * g; }

struct SparseUpdateArgs {
  char* table;               // nrows x dim elements of the table's type
  float* slots[kMaxSlots];   // the first `SlotCount`: float32, nrows x dim (or nrows)
  int64_t nrows;
  int64_t dim;
  const void* keys;          // distinct rows; out of [0, nrows): skipped
  bool keys64;
  int64_t n;                 // number of keys
  const float* grads;        // n x dim summed gradient rows
  const char* rows;          // n x dim table rows at keys, or null: read the table
  const float* scalars;      // kScalars values (Scalar)
  Hyper hyper;
  Rule rule;
  bool bf16;                 // the table's type: bfloat16, else float32
  int32_t handles[1 + kMaxSlots];
};

// The handler's body. `handles` has one entry per table (the table, then
// its slots): > 0 a handle fixed in the program, 0 the next one-element
// handle operand at the front of `rest`; the operands after those (the
// tables' tokens, rows read before) only order the call and are not read.
// The leases span the runner, as a write's (write_common.h).
template <typename Runner>
ffi::Error SparseUpdateTables(const Runner& run, HandleReader read_handle, ffi::AnyBuffer keys,
                              ffi::Buffer<ffi::F32> grads, ffi::AnyBuffer rows,
                              ffi::Buffer<ffi::F32> scalars, ffi::RemainingArgs rest,
                              int64_t rule, ffi::Span<const int64_t> handles, int64_t nrows,
                              int64_t dim, double b1, double b2, double eps) {
  if (rule < 0 || rule > static_cast<int64_t>(Rule::kRowwiseAdagrad)) {
    return ffi::Error::InvalidArgument("jdirect sparse_update: unknown rule " +
                                       std::to_string(rule));
  }
  const Rule r = static_cast<Rule>(rule);
  const int tables = 1 + SlotCount(r);
  if (static_cast<int>(handles.size()) != tables) {
    return ffi::Error::InvalidArgument(
        "jdirect sparse_update: the rule's table and slots need one handle each");
  }
  if (rows.element_type() != ffi::DataType::F32 && rows.element_type() != ffi::DataType::BF16) {
    return ffi::Error::InvalidArgument(
        "jdirect sparse_update: the table's rows must be float32 or bfloat16");
  }
  if (keys.element_type() != ffi::DataType::S32 && keys.element_type() != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("jdirect sparse_update: keys must be int32 or int64");
  }
  const int64_t n = static_cast<int64_t>(keys.element_count());
  const int64_t given = static_cast<int64_t>(rows.element_count());
  if (nrows < 0 || dim < 0 || static_cast<int64_t>(grads.element_count()) != n * dim ||
      (given != 0 && given != n * dim) || scalars.element_count() != kScalars) {
    return ffi::Error::InvalidArgument(
        "jdirect sparse_update: gradients, rows or scalars do not match keys x dim");
  }
  SparseUpdateArgs a{};
  size_t operand = 0;
  for (int i = 0; i < tables; ++i) {
    if (handles[i] > 0) {
      a.handles[i] = static_cast<int32_t>(handles[i]);
      continue;
    }
    auto handle = rest.get<ffi::Buffer<ffi::S32>>(operand++);
    if (handle.has_error()) return handle.error();
    if (auto e = read_handle(*handle, &a.handles[i]); e.failure()) return e;
  }
  std::optional<TableLease> leases[1 + kMaxSlots];
  for (int i = 0; i < tables; ++i) {
    const int64_t width = i == 0 ? static_cast<int64_t>(ffi::ByteWidth(rows.element_type())) : 4;
    const int64_t row_bytes = i > 0 && PerRowSlots(r) ? width : dim * width;
    leases[i].emplace(a.handles[i]);
    if (auto e = CheckWritable(*leases[i], a.handles[i], nrows, row_bytes, "sparse_update");
        e.failure()) {
      return e;
    }
    // The rules load and store whole elements (gathers and writes fall back
    // to bytes): a table over memory at an odd offset (a memmap past an odd
    // header, say) would fault on a GPU, which ends the CUDA context.
    if (reinterpret_cast<uintptr_t>(leases[i]->view().data) % width != 0) {
      return ffi::Error::InvalidArgument(
          std::string("jdirect sparse_update: the ") + (i == 0 ? "table's" : "slot's") +
          " memory is not aligned to its element size; copy it with HostTable.copy_of");
    }
  }
  if (n == 0 || dim == 0) return ffi::Error::Success();
  if (dim > INT32_MAX) {
    return ffi::Error::InvalidArgument("jdirect sparse_update: rows of more than 2**31 - 1 "
                                       "elements are not supported");
  }
  // Writable tables are registered by their owner over memory it may write:
  // the registry keeps a const pointer only because gathers share it.
  a.table = const_cast<char*>(leases[0]->view().data);
  for (int i = 1; i < tables; ++i) {
    a.slots[i - 1] = reinterpret_cast<float*>(const_cast<char*>(leases[i]->view().data));
  }
  a.nrows = nrows;
  a.dim = dim;
  a.keys = keys.untyped_data();
  a.keys64 = keys.element_type() == ffi::DataType::S64;
  a.n = n;
  a.grads = grads.typed_data();
  a.rows = given ? static_cast<const char*>(rows.untyped_data()) : nullptr;
  a.scalars = scalars.typed_data();
  a.hyper = Hyper{static_cast<float>(b1), static_cast<float>(1.0 - b1), static_cast<float>(b2),
                  static_cast<float>(1.0 - b2), static_cast<float>(eps)};
  a.rule = r;
  a.bf16 = rows.element_type() == ffi::DataType::BF16;
  return run(a);
}

}  // namespace jdirect

// The token result orders the tables' later reads and writes after the
// update (jdirect/write.py); the handlers set it to zero. `rows` always has
// the table's element type: empty when the table rows are to be read.
#define JDIRECT_BIND_SPARSE_UPDATE(CTX)                               \
  xla::ffi::Ffi::Bind() CTX                                           \
      .Arg<xla::ffi::AnyBuffer>() /* keys */                          \
      .Arg<xla::ffi::Buffer<xla::ffi::F32>>() /* summed gradients */  \
      .Arg<xla::ffi::AnyBuffer>() /* table rows at keys, or empty */  \
      .Arg<xla::ffi::Buffer<xla::ffi::F32>>() /* step scalars */      \
      .RemainingArgs() /* handles, then operands to follow */         \
      .Ret<xla::ffi::Buffer<xla::ffi::S32>>() /* token out */         \
      .Attr<int64_t>("rule")                                          \
      .Attr<xla::ffi::Span<const int64_t>>("handles")                 \
      .Attr<int64_t>("nrows")                                         \
      .Attr<int64_t>("dim")                                           \
      .Attr<double>("b1")                                             \
      .Attr<double>("b2")                                             \
      .Attr<double>("eps")

#endif  // JDIRECT_FFI_SPARSE_UPDATE_COMMON_H_
