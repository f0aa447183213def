// The reads sm_lean_read.cu compares, and how each is launched: jdirect's
// GatherKernel (ffi/gather_kernels.cuh, itself) as ffi/gather_cuda.cu's
// LaunchGather launches it, and the SM-lean read of issue 54's item 3.
#ifndef JDIRECT_BENCHMARKS_PROBES_SM_LEAN_READS_CUH_
#define JDIRECT_BENCHMARKS_PROBES_SM_LEAN_READS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

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

constexpr int kLeanRows = 8;      // rows in flight a warp
constexpr int kLeanThreads = 512;

// A warp takes kLeanRows consecutive output rows at a time; each lane holds
// up to kItems vectors of them and issues all its loads before any store.
template <typename V, int kItems>
__global__ void LeanRead(const char* __restrict__ table, const int32_t* __restrict__ idx,
                         int64_t n, int vpr, V* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int group = kLeanRows * vpr;  // vectors of kLeanRows rows
  for (int64_t first = warp * kLeanRows; first < n; first += warps * kLeanRows) {
    const int32_t my_row = (lane < kLeanRows && first + lane < n) ? idx[first + lane] : 0;
    V vals[kItems];
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int item = lane + 32 * u;
      const int r = min(item / vpr, kLeanRows - 1);
      const int64_t row = __shfl_sync(0xffffffffu, my_row, r);  // every lane shuffles
      if (item < group && first + r < n) {
        vals[u] = reinterpret_cast<const V*>(table + row * vpr * int64_t{sizeof(V)})[item - r * vpr];
      }
    }
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int item = lane + 32 * u;
      const int r = item / vpr;
      if (item < group && first + r < n) out[(first + r) * vpr + item - r * vpr] = vals[u];
    }
  }
}

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

template <typename V, int kItems>
void LaunchLeanItems(const Setup& s, unsigned blocks, cudaStream_t stream) {
  const int vpr = static_cast<int>(s.row_bytes / int64_t{sizeof(V)});
  LeanRead<V, kItems><<<blocks, kLeanThreads, 0, stream>>>(s.table, s.idx, s.n, vpr,
                                                          reinterpret_cast<V*>(s.out));
}

template <typename V>
void LaunchLean(const Setup& s, unsigned blocks, cudaStream_t stream) {
  const int64_t vpr = s.row_bytes / int64_t{sizeof(V)};
  switch ((kLeanRows * vpr + 31) / 32) {  // vectors a lane holds
    case 1: return LaunchLeanItems<V, 1>(s, blocks, stream);
    case 2: return LaunchLeanItems<V, 2>(s, blocks, stream);
    case 3: return LaunchLeanItems<V, 3>(s, blocks, stream);
    case 4: return LaunchLeanItems<V, 4>(s, blocks, stream);
    case 5: return LaunchLeanItems<V, 5>(s, blocks, stream);
    case 6: return LaunchLeanItems<V, 6>(s, blocks, stream);
    case 7: return LaunchLeanItems<V, 7>(s, blocks, stream);
    case 8: return LaunchLeanItems<V, 8>(s, blocks, stream);
    default:
      std::printf("FAILED: %lld-byte rows need more than 8 vectors a lane\n",
                  static_cast<long long>(s.row_bytes));
      std::exit(1);
  }
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


inline uint64_t Mix(uint64_t x) {  // splitmix64: the table's word at word offset x
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// `bytes` of host-resident managed memory, allocated and advised as
// jdirect's HostTable does (ffi/host_memory_cuda.cu), filled by CPU threads
// with Mix(word offset).
inline char* HostResidentTable(int64_t bytes, int device) {
  char* table = nullptr;
  CHECK(cudaMallocManaged(&table, bytes, cudaMemAttachGlobal));
  CHECK(cudaMemAdvise(table, bytes, cudaMemAdviseSetPreferredLocation,
                      cudaMemLocation{cudaMemLocationTypeHost, 0}));
  CHECK(cudaMemAdvise(table, bytes, cudaMemAdviseSetAccessedBy,
                      cudaMemLocation{cudaMemLocationTypeDevice, device}));
  uint64_t* words = reinterpret_cast<uint64_t*>(table);
  const int64_t count = bytes / 8;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      for (int64_t i = count * t / threads; i < count * (t + 1) / threads; ++i) {
        words[i] = Mix(static_cast<uint64_t>(i));
      }
    });
  }
  for (auto& th : pool) th.join();
  return table;
}

}  // namespace probe

#endif  // JDIRECT_BENCHMARKS_PROBES_SM_LEAN_READS_CUH_
