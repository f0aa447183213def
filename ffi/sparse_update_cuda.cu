// CUDA sparse update (sparse_update_common.h): one kernel reads each touched
// row's slot rows (and table row) from host memory, applies the rule with
// the summed gradient row from device memory and stores the new rows
// straight back. PCIe is full duplex: the stores (posted writes) of some
// rows overlap the reads of others across warps, where a gather followed
// by a separate write would use one direction at a time.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "gather_cuda.h"     // Blocks, HostHandle, FollowStartedReads
#include "gather_kernels.cuh"  // kThreads, kUnroll
#include "sparse_update_common.h"
#include "table_events.h"
#include "write_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

// W consecutive elements of a row, moved as one access (16 bytes of
// float32 at W = 4).
template <typename T, int W>
struct alignas(sizeof(T) * W) Packet {
  T v[W];
};

// Work is flattened to (key, packet-in-row) items, as in the gather, so
// consecutive threads move consecutive packets of one row (coalesced) and
// short rows keep every lane busy. Each thread issues the loads of kUnroll
// items before it computes and stores any: PCIe reads take microseconds.
template <Rule R, typename T, int W, typename K>
__global__ void SparseUpdateKernel(SparseUpdateArgs a, uint32_t packets_per_row,
                                   uint32_t total) {
  using Rows = Packet<T, W>;
  using Floats = Packet<float, W>;
  // Both kernels declare these views themselves: in a shared struct nvcc
  // drops the members' __restrict__, and with it the read-only loads
  // (ld.global.nc) of keys, gradients and given rows.
  const K* __restrict__ keys = static_cast<const K*>(a.keys);
  Rows* table = reinterpret_cast<Rows*>(a.table);
  const Rows* __restrict__ given = reinterpret_cast<const Rows*>(a.rows);
  const Floats* __restrict__ grads = reinterpret_cast<const Floats*>(a.grads);
  Floats* slot0 = reinterpret_cast<Floats*>(a.slots[0]);
  Floats* slot1 = reinterpret_cast<Floats*>(a.slots[1]);
  const float scalars[kScalars] = {a.scalars[kLr], a.scalars[kCorrection1],
                                   a.scalars[kCorrection2]};
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t base = blockIdx.x * blockDim.x + threadIdx.x; base < total;
       base += stride * kUnroll) {
    int64_t at[kUnroll];  // the packet's index in the tables, or -1
    Rows w[kUnroll];
    Floats g[kUnroll], s0[kUnroll] = {}, s1[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t item = base + u * stride;
      at[u] = -1;
      if (item < total) {
        const uint32_t k = item / packets_per_row;
        const int64_t r = static_cast<int64_t>(keys[k]);
        if (r >= 0 && r < a.nrows) {
          at[u] = r * packets_per_row + (item - k * packets_per_row);
          g[u] = grads[item];
          w[u] = given != nullptr ? given[item] : table[at[u]];
          if constexpr (SlotCount(R) > 0) s0[u] = slot0[at[u]];
          if constexpr (SlotCount(R) > 1) s1[u] = slot1[at[u]];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (at[u] < 0) continue;
      Rows out;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        out.v[e] = FromFloat<T>(Update<R>(a.hyper, scalars, ToFloat(w[u].v[e]), g[u].v[e],
                                          s0[u].v[e], s1[u].v[e]));
      }
      table[at[u]] = out;
      if constexpr (SlotCount(R) > 0) slot0[at[u]] = s0[u];
      if constexpr (SlotCount(R) > 1) slot1[at[u]] = s1[u];
    }
  }
}

// Row-wise rules reduce over a row before they store any of it, so work is
// split by key: a group of `group` lanes (a power of two up to a warp, the
// fewest that give each packet of a row of up to 32 packets its own lane)
// takes one key at a time. Consecutive lanes move consecutive packets of a
// row, as in SparseUpdateKernel (coalesced); short rows put several keys
// in a warp, so that many keys' reads are in flight, and rows of more than
// a warp's packets give each lane up to kUnroll packets a chunk. Each group
// issues its host reads (the slot value, the table row's first chunk)
// before it reduces the row's squared gradients (device memory) with
// shuffles; a chunk's loads all precede its stores.
template <typename T, int W, typename K>
__global__ void RowwiseAdagradKernel(SparseUpdateArgs a, uint32_t packets_per_row,
                                     uint32_t group) {
  using Rows = Packet<T, W>;
  using Floats = Packet<float, W>;
  const K* __restrict__ keys = static_cast<const K*>(a.keys);
  Rows* table = reinterpret_cast<Rows*>(a.table);
  const Rows* __restrict__ given = reinterpret_cast<const Rows*>(a.rows);
  const Floats* __restrict__ grads = reinterpret_cast<const Floats*>(a.grads);
  float* acc = a.slots[0];
  const float lr = a.scalars[kLr];
  const uint32_t lane = threadIdx.x & (group - 1);
  // The shuffles name only the group's lanes: the groups of a warp leave
  // the loop over keys, or skip a padding key, each on its own.
  const uint32_t first = threadIdx.x & 31 & ~(group - 1);
  const unsigned mask = group == 32 ? 0xffffffffu : ((1u << group) - 1) << first;
  const uint32_t chunk = group * kUnroll;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / group;
  for (int64_t k = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / group;
       k < a.n; k += groups) {
    const int64_t r = static_cast<int64_t>(keys[k]);
    if (r < 0 || r >= a.nrows) continue;
    Rows* row = table + r * packets_per_row;
    const Rows* old = given != nullptr ? given + k * packets_per_row : row;
    const Floats* g = grads + k * packets_per_row;
    float s = acc[r];
    Rows w[kUnroll];
    Floats gv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t p = lane + u * group;
      if (p < packets_per_row) {
        w[u] = old[p];
        gv[u] = g[p];
      }
    }
    float sum_sq = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (lane + u * group >= packets_per_row) continue;
#pragma unroll
      for (int e = 0; e < W; ++e) sum_sq += gv[u].v[e] * gv[u].v[e];
    }
    for (uint32_t p = chunk + lane; p < packets_per_row; p += group) {
      const Floats x = g[p];
#pragma unroll
      for (int e = 0; e < W; ++e) sum_sq += x.v[e] * x.v[e];
    }
    // A butterfly: every lane ends with the same sum, so the same scale.
    for (uint32_t offset = group / 2; offset > 0; offset /= 2) {
      sum_sq += __shfl_xor_sync(mask, sum_sq, offset);
    }
    const float scale = RowwiseScale(a.hyper, lr, s, sum_sq, a.dim);
    for (uint32_t start = 0; start < packets_per_row; start += chunk) {
      if (start > 0) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint32_t p = start + lane + u * group;
          if (p < packets_per_row) {
            w[u] = old[p];
            gv[u] = g[p];
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t p = start + lane + u * group;
        if (p >= packets_per_row) continue;
        Rows out;
#pragma unroll
        for (int e = 0; e < W; ++e) {
          out.v[e] = FromFloat<T>(RowwiseUpdate(scale, ToFloat(w[u].v[e]), gv[u].v[e]));
        }
        row[p] = out;
      }
    }
    if (lane == 0) acc[r] = s;
  }
}

// Four elements per access when the row length and every base address
// allow it (16-byte float32 accesses), else one. A slot of one value a
// row is read as single floats.
int Width(const SparseUpdateArgs& a) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(a.table) | reinterpret_cast<uintptr_t>(a.grads) |
                   reinterpret_cast<uintptr_t>(a.rows);
  if (!PerRowSlots(a.rule)) {
    bits |= reinterpret_cast<uintptr_t>(a.slots[0]) | reinterpret_cast<uintptr_t>(a.slots[1]);
  }
  return a.dim % 4 == 0 && bits % 16 == 0 ? 4 : 1;
}

// Keys are launched in pieces whose item count fits the kernel's 32-bit
// counter (one piece for any realistic batch).
template <Rule R, typename T, int W, typename K>
void LaunchElements(SparseUpdateArgs a, cudaStream_t stream) {
  const int64_t per_row = a.dim / W;
  const int64_t piece = std::numeric_limits<int32_t>::max() / per_row;
  const int64_t n = a.n;
  for (int64_t start = 0; start < n; start += piece) {
    const int64_t keys = n - start < piece ? n - start : piece;
    SparseUpdateArgs p = a;
    p.keys = static_cast<const K*>(a.keys) + start;
    p.n = keys;
    p.grads = a.grads + start * a.dim;
    if (a.rows != nullptr) p.rows = a.rows + start * a.dim * static_cast<int64_t>(sizeof(T));
    const int64_t total = keys * per_row;
    SparseUpdateKernel<R, T, W, K>
        <<<Blocks(total, int64_t{kThreads} * kUnroll, 0), kThreads, 0, stream>>>(
            p, static_cast<uint32_t>(per_row), static_cast<uint32_t>(total));
  }
}

template <typename T, int W, typename K>
void LaunchRowwise(const SparseUpdateArgs& a, cudaStream_t stream) {
  const int64_t per_row = a.dim / W;
  uint32_t group = 1;
  while (group < 32 && group < per_row) group *= 2;
  RowwiseAdagradKernel<T, W, K><<<Blocks(a.n * group, kThreads, 0), kThreads, 0, stream>>>(
      a, static_cast<uint32_t>(per_row), group);
}

template <Rule R, typename T, int W, typename K>
void Launch(const SparseUpdateArgs& a, cudaStream_t stream) {
  if constexpr (PerRowSlots(R)) {
    LaunchRowwise<T, W, K>(a, stream);
  } else {
    LaunchElements<R, T, W, K>(a, stream);
  }
}

template <Rule R, typename T>
void LaunchTyped(const SparseUpdateArgs& a, cudaStream_t stream) {
  const bool wide = Width(a) == 4;
  if (a.keys64) {
    wide ? Launch<R, T, 4, int64_t>(a, stream) : Launch<R, T, 1, int64_t>(a, stream);
  } else {
    wide ? Launch<R, T, 4, int32_t>(a, stream) : Launch<R, T, 1, int32_t>(a, stream);
  }
}

template <Rule R>
void LaunchRule(const SparseUpdateArgs& a, cudaStream_t stream) {
  a.bf16 ? LaunchTyped<R, Bf16>(a, stream) : LaunchTyped<R, float>(a, stream);
}

struct CudaUpdater {
  cudaStream_t stream;

  ffi::Error operator()(const SparseUpdateArgs& a) const {
    switch (a.rule) {
      case Rule::kSgd: LaunchRule<Rule::kSgd>(a, stream); break;
      case Rule::kAdagrad: LaunchRule<Rule::kAdagrad>(a, stream); break;
      case Rule::kAdam: LaunchRule<Rule::kAdam>(a, stream); break;
      case Rule::kRowwiseAdagrad: LaunchRule<Rule::kRowwiseAdagrad>(a, stream); break;
    }
    // May also report an earlier launch's error on this thread: the message
    // names the call that noticed it, not necessarily the one that caused it.
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      return ffi::Error::Internal(std::string("jdirect sparse_update: kernel launch failed: ") +
                                  cudaGetErrorString(err));
    }
    // close() of each table waits for its event before its memory goes.
    for (int i = 0; i <= SlotCount(a.rule); ++i) {
      if (auto e = RecordTableRead(a.handles[i], stream); e.failure()) return e;
    }
    return ffi::Error::Success();
  }
};

ffi::Error SparseUpdate(cudaStream_t stream, ffi::AnyBuffer keys, ffi::Buffer<ffi::F32> grads,
                        ffi::AnyBuffer rows, ffi::Buffer<ffi::F32> scalars,
                        ffi::RemainingArgs rest, ffi::Result<ffi::Buffer<ffi::S32>> token,
                        int64_t rule, ffi::Span<const int64_t> handles, int64_t nrows,
                        int64_t dim, double b1, double b2, double eps) {
  // `rest` holds handle operands, then what the update follows: the rows
  // read from its tables' versions among them (a handle never matches).
  if (auto e = FollowStartedReads(stream, rest); e.failure()) return e;
  if (auto e = ZeroToken(stream, token); e.failure()) return e;
  return SparseUpdateTables(CudaUpdater{stream}, HostHandle, keys, grads, rows, scalars, rest,
                            rule, handles, nrows, dim, b1, b2, eps);
}

}  // namespace
}  // namespace jdirect

JDIRECT_DEFINE_HANDLER(JdirectSparseUpdateCuda, jdirect::SparseUpdate,
                       JDIRECT_BIND_SPARSE_UPDATE(.Ctx<xla::ffi::PlatformStream<cudaStream_t>>()));
