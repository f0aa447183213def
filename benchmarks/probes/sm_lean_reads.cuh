// The reads sm_lean_read.cu compares, and how each is launched: jdirect's
// GatherKernel and LeanGatherKernel (ffi/gather_kernels.cuh, themselves; the
// lean one is the SM-lean read of issue 54's item 3) as ffi/gather_cuda.cu's
// LaunchGather launches them.
#ifndef JDIRECT_BENCHMARKS_PROBES_SM_LEAN_READS_CUH_
#define JDIRECT_BENCHMARKS_PROBES_SM_LEAN_READS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../ffi/gather_kernels.cuh"

namespace probe {

// A failed CUDA call ends the probe with its line (a probe, not a library).
inline void Check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::printf("FAILED line %d: %s: %s\n", line, what, cudaGetErrorString(e));
    std::exit(1);
  }
}
#define CHECK(call) Check((call), #call, __LINE__)

using jdirect::kLeanRows;
using jdirect::kLeanThreads;

// ffi/gather_cuda.cu's VectorBytes: the widest access dividing the row and
// both base addresses.
inline int VectorBytes(int64_t row_bytes, const void* table, const void* out) {
  const uint64_t bits = static_cast<uint64_t>(row_bytes) |
                        reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(out);
  for (int w : {16, 8, 4, 2}) {
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  }
  return 1;
}

// A read under test: jdirect's GatherKernel or the lean one, on `blocks`.
struct Read {
  std::string name;
  bool lean;
  unsigned blocks;
};

// What every read reads and writes: `n` rows `idx` of the table into `out`.
struct Setup {
  const char* table;
  const int32_t* idx;
  int64_t n, nrows, row_bytes;
  char* out;
};

template <typename V>
void LaunchJdirect(const Setup& s, unsigned cap, cudaStream_t stream) {
  using jdirect::kThreads;
  using jdirect::kUnroll;
  const int64_t vpr = s.row_bytes / int64_t{sizeof(V)};
  const int64_t total = s.n * vpr;  // fits 32 bits here, as LaunchGather's first branch
  const int64_t blocks = std::min<int64_t>((total + kThreads * kUnroll - 1) / (kThreads * kUnroll),
                                           cap);
  jdirect::CallerRows<int32_t> rows{s.idx, s.nrows, jdirect::Mode::kFill};
  jdirect::GatherKernel<V, uint32_t, jdirect::CallerRows<int32_t>>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          s.table, rows, static_cast<uint32_t>(vpr), static_cast<uint32_t>(total),
          reinterpret_cast<V*>(s.out), jdirect::FillPattern{0, 0}, jdirect::DeviceCache{});
}

template <typename V>
void LaunchLean(const Setup& s, unsigned blocks, cudaStream_t stream) {
  jdirect::LaunchLeanGather(blocks, stream, s.table,
                            jdirect::CallerRows<int32_t>{s.idx, s.nrows, jdirect::Mode::kFill},
                            s.n, static_cast<uint32_t>(s.row_bytes / int64_t{sizeof(V)}),
                            reinterpret_cast<V*>(s.out), jdirect::FillPattern{0, 0},
                            jdirect::DeviceCache{});
}

template <typename V>
void LaunchWith(const Read& r, const Setup& s, cudaStream_t stream) {
  if (r.lean) {
    LaunchLean<V>(s, r.blocks, stream);
  } else {
    LaunchJdirect<V>(s, r.blocks, stream);
  }
}

inline void Launch(const Read& r, const Setup& s, cudaStream_t stream) {
  switch (VectorBytes(s.row_bytes, s.table, s.out)) {
    case 16: LaunchWith<uint4>(r, s, stream); break;
    case 8: LaunchWith<uint2>(r, s, stream); break;
    case 4: LaunchWith<uint32_t>(r, s, stream); break;
    case 2: LaunchWith<uint16_t>(r, s, stream); break;
    default: LaunchWith<uint8_t>(r, s, stream); break;
  }
  CHECK(cudaGetLastError());
}

}  // namespace probe

#endif  // JDIRECT_BENCHMARKS_PROBES_SM_LEAN_READS_CUH_
