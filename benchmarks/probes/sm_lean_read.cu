// Issue 54, item 3: does an SM-lean zero-copy read beat jdirect's current
// read beside compute that fills every SM? A bare probe, no JAX.
//
// Reads `--ids` random rows (default 2M) of a host-resident managed-memory
// table (allocated and advised as ffi/host_memory_cuda.cu does:
// cudaMallocManaged, preferred location the host, accessed by the GPU;
// filled by CPU threads) at row widths 200, 256 and 400 B with:
//   jdirect/N  ffi/gather_kernels.cuh's GatherKernel itself (256-thread
//              blocks, 4 loads in flight a thread, the widest vector that
//              divides the row, as ffi/gather_cuda.cu's LaunchGather picks)
//              on N blocks: 2 per SM (the trainer's started read, the
//              default of ffi/gather_async_cuda.cu), 16 per SM (a plain
//              gather's cap) and 32;
//   lean/N     8 rows in flight a warp (a warp's lanes issue every load of
//              8 rows before any store), 512-thread blocks, N = 16, 32, 66.
// Each alone, then beside a chain of `--gemms` cuBLAS bf16 GEMMs of
// `--n`^3 (default 40 of 8192^3, every SM busy) on another stream, both
// released at once by a gate. Reads are launched back to back on their
// stream until past the chain's end; "beside" counts only the reads that
// finished inside the chain, "covered" is the share of the chain's time
// that reads ran beside it (the GEMM slowdown means what it says at 100 %).
// Every kernel's output is checked against a host gather of the same ids
// (a position-weighted checksum), so a wrong kernel cannot look fast.
//
// Build and run (CUDA 12.8+ / 13, an sm_90 GPU; under 90 s on an H200):
//   bash benchmarks/probes/run_sm_lean.sh          (finds cuBLAS; log in $OUT)
//   nvcc -O3 -std=c++17 -arch=sm_90 benchmarks/probes/sm_lean_read.cu -lcublas -o /tmp/probe
//   /tmp/probe [--table-gb 4] [--ids 2000000] [--gemms 40] [--n 8192]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../ffi/gather_kernels.cuh"

namespace {

void Check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::printf("FAILED line %d: %s: %s\n", line, what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void Check(cublasStatus_t s, const char* what, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAILED line %d: %s: cuBLAS status %d\n", line, what, static_cast<int>(s));
    std::exit(1);
  }
}
#define CHECK(call) Check((call), #call, __LINE__)

// ---- kernels ------------------------------------------------------------

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

// Position-weighted sum of 64-bit words, mod 2**64: rows in the wrong
// place change it, and the order of the additions does not.
__global__ void Checksum(const uint64_t* __restrict__ words, int64_t count,
                         unsigned long long* sum) {
  uint64_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    acc += words[i] * (2 * static_cast<uint64_t>(i) + 1);
  }
  atomicAdd(sum, static_cast<unsigned long long>(acc));
}

// Holds its stream until the host raises `flag` (gives up after ~5 s so a
// lost flag cannot hang the probe).
__global__ void Gate(const volatile int* flag) {
  const long long start = clock64();
  while (*flag == 0 && clock64() - start < 10'000'000'000LL) {
  }
}

__global__ void FillBf16(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint32_t h = (static_cast<uint32_t>(i) ^ seed) * 2654435761u;
    x[i] = __float2bfloat16(static_cast<float>(h >> 8) / 16777216.0f - 0.5f);
  }
}

// ---- host side ----------------------------------------------------------

uint64_t Mix(uint64_t x) {  // splitmix64: the table's word at word offset x
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// ffi/gather_cuda.cu's VectorBytes: the widest access dividing the row and
// both base addresses.
int VectorBytes(int64_t row_bytes, const void* table, const void* out) {
  const uint64_t bits = static_cast<uint64_t>(row_bytes) |
                        reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(out);
  for (int w : {16, 8, 4, 2}) {
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  }
  return 1;
}

struct Read {
  std::string name;
  bool lean;
  unsigned blocks;
};

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

void Launch(const Read& r, const Setup& s, cudaStream_t stream) {
  switch (VectorBytes(s.row_bytes, s.table, s.out)) {
    case 16: LaunchWith<uint4>(r, s, stream); break;
    case 8: LaunchWith<uint2>(r, s, stream); break;
    case 4: LaunchWith<uint32_t>(r, s, stream); break;
    case 2: LaunchWith<uint16_t>(r, s, stream); break;
    default: LaunchWith<uint8_t>(r, s, stream); break;
  }
  CHECK(cudaGetLastError());
}

float Ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Gemms {
  cublasHandle_t handle;
  __nv_bfloat16 *a, *b, *c;
  int n, count;

  void Enqueue() {
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < count; ++i) {
      CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                         CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
    }
  }
};

int64_t Arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line at a time, even into a pipe
  const int64_t table_bytes = Arg(argc, argv, "--table-gb", 4) << 30;
  const int64_t n = Arg(argc, argv, "--ids", 2'000'000);
  const int gemm_count = static_cast<int>(Arg(argc, argv, "--gemms", 40));
  const int gemm_n = static_cast<int>(Arg(argc, argv, "--n", 8192));
  const std::vector<int64_t> widths = {200, 256, 400};

  int device = 0, sms = 0;
  CHECK(cudaSetDevice(device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("sm_lean_read: %s, %d SMs; table %.1f GiB host-resident managed, %lld random ids; "
              "chain of %d bf16 GEMMs of %d^3\n",
              prop.name, sms, table_bytes / double(1 << 30), static_cast<long long>(n),
              gemm_count, gemm_n);

  // The table, as jdirect's HostTable allocates it, filled by CPU threads.
  char* table = nullptr;
  CHECK(cudaMallocManaged(&table, table_bytes, cudaMemAttachGlobal));
  CHECK(cudaMemAdvise(table, table_bytes, cudaMemAdviseSetPreferredLocation,
                      cudaMemLocation{cudaMemLocationTypeHost, 0}));
  CHECK(cudaMemAdvise(table, table_bytes, cudaMemAdviseSetAccessedBy,
                      cudaMemLocation{cudaMemLocationTypeDevice, device}));
  {
    uint64_t* words = reinterpret_cast<uint64_t*>(table);
    const int64_t count = table_bytes / 8;
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
  }

  int32_t* idx = nullptr;
  char* out = nullptr;
  unsigned long long* sum = nullptr;
  CHECK(cudaMalloc(&idx, n * sizeof(int32_t)));
  CHECK(cudaMalloc(&out, n * widths.back()));
  CHECK(cudaMalloc(&sum, sizeof(unsigned long long)));

  Gemms gemms{};
  gemms.n = gemm_n;
  gemms.count = gemm_count;
  const int64_t elems = int64_t{gemm_n} * gemm_n;
  for (auto** m : {&gemms.a, &gemms.b, &gemms.c}) CHECK(cudaMalloc(m, elems * 2));
  FillBf16<<<1024, 256>>>(gemms.a, elems, 1);  // not zeros: a GEMM of zeros draws less power
  FillBf16<<<1024, 256>>>(gemms.b, elems, 2);
  CHECK(cudaGetLastError());
  CHECK(cublasCreate(&gemms.handle));

  cudaStream_t gate_stream, gemm_stream, read_stream;
  for (auto* st : {&gate_stream, &gemm_stream, &read_stream}) {
    CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
  }
  CHECK(cublasSetStream(gemms.handle, gemm_stream));
  int* flag = nullptr;
  int* flag_dev = nullptr;
  CHECK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(&flag_dev, flag, 0));
  constexpr int kMaxReads = 512;
  std::vector<cudaEvent_t> ev(kMaxReads + 1);
  cudaEvent_t gate_ev, c0, c1;
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  for (auto* e : {&gate_ev, &c0, &c1}) CHECK(cudaEventCreate(e));

  // Reference: a 64 MB pinned host -> device copy (the link's rate).
  {
    const size_t bytes = 64 << 20;
    void* pinned = nullptr;
    CHECK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
    std::memset(pinned, 1, bytes);
    std::vector<float> ms;
    for (int i = 0; i < 6; ++i) {
      CHECK(cudaEventRecord(ev[0], read_stream));
      CHECK(cudaMemcpyAsync(out, pinned, bytes, cudaMemcpyHostToDevice, read_stream));
      CHECK(cudaEventRecord(ev[1], read_stream));
      CHECK(cudaEventSynchronize(ev[1]));
      if (i > 0) ms.push_back(Ms(ev[0], ev[1]));
    }
    std::printf("pinned 64 MB host -> device copy: %.1f GB/s\n", bytes / Median(ms) / 1e6);
    CHECK(cudaFreeHost(pinned));
  }

  auto chain_alone = [&] {
    std::vector<float> ms;
    for (int i = 0; i < 3; ++i) {
      CHECK(cudaEventRecord(c0, gemm_stream));
      gemms.Enqueue();
      CHECK(cudaEventRecord(c1, gemm_stream));
      CHECK(cudaEventSynchronize(c1));
      ms.push_back(Ms(c0, c1));
    }
    return Median(ms);
  };
  chain_alone();  // warm-up: cuBLAS picks its kernels
  const float chain_ms = chain_alone();
  std::printf("GEMM chain alone: %.1f ms (%.0f TFLOP/s)\n", chain_ms,
              2.0 * gemm_n * double(gemm_n) * gemm_n * gemm_count / (chain_ms * 1e9));

  const std::vector<Read> reads = {
      {"jdirect", false, static_cast<unsigned>(2 * sms)},
      {"jdirect", false, static_cast<unsigned>(16 * sms)},
      {"jdirect", false, 32},
      {"lean", true, 16},
      {"lean", true, 32},
      {"lean", true, 66},
  };
  std::printf("%6s %-12s %7s %4s %11s %12s %15s %7s %8s %8s\n", "row", "read", "threads", "vec",
              "alone GB/s", "beside GB/s", "chain beside ms", "GEMM x", "covered", "checked");
  bool all_right = true;
  std::mt19937_64 rng(1);
  for (const int64_t width : widths) {
    const int64_t nrows = table_bytes / width;
    std::vector<int32_t> ids(n);
    std::uniform_int_distribution<int64_t> pick(0, nrows - 1);
    for (auto& i : ids) i = static_cast<int32_t>(pick(rng));
    CHECK(cudaMemcpy(idx, ids.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
    // The host gather's checksum of these rows (words in output order).
    const int64_t wpr = width / 8;
    const uint64_t* words = reinterpret_cast<const uint64_t*>(table);
    uint64_t expected = 0;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t j = 0; j < wpr; ++j) {
        expected += words[ids[p] * wpr + j] * (2 * static_cast<uint64_t>(p * wpr + j) + 1);
      }
    }
    const Setup s{table, idx, n, nrows, width, out};
    const double gb = n * double(width) / 1e9;
    for (const Read& r : reads) {
      // Alone, checked: the output is poisoned first, so stale rows fail.
      CHECK(cudaMemset(out, 0xFF, n * width));
      Launch(r, s, read_stream);
      CHECK(cudaMemsetAsync(sum, 0, sizeof(*sum), read_stream));
      Checksum<<<1024, 256, 0, read_stream>>>(reinterpret_cast<const uint64_t*>(out),
                                              n * wpr, sum);
      CHECK(cudaGetLastError());
      unsigned long long got = 0;
      CHECK(cudaMemcpyAsync(&got, sum, sizeof(got), cudaMemcpyDeviceToHost, read_stream));
      CHECK(cudaStreamSynchronize(read_stream));
      const bool right = got == expected;
      all_right = all_right && right;
      std::vector<float> ms;
      for (int i = 0; i < 5; ++i) {
        CHECK(cudaEventRecord(ev[0], read_stream));
        Launch(r, s, read_stream);
        CHECK(cudaEventRecord(ev[1], read_stream));
        CHECK(cudaEventSynchronize(ev[1]));
        ms.push_back(Ms(ev[0], ev[1]));
      }
      const float read_ms = Median(ms);

      // Beside: enough reads to outlast the chain even if slowed 3x.
      const int count = std::min(kMaxReads, 2 + static_cast<int>(3 * chain_ms / read_ms));
      *reinterpret_cast<volatile int*>(flag) = 0;
      Gate<<<1, 1, 0, gate_stream>>>(flag_dev);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(gate_ev, gate_stream));
      CHECK(cudaStreamWaitEvent(gemm_stream, gate_ev, 0));
      CHECK(cudaStreamWaitEvent(read_stream, gate_ev, 0));
      CHECK(cudaEventRecord(c0, gemm_stream));
      gemms.Enqueue();
      CHECK(cudaEventRecord(c1, gemm_stream));
      for (int i = 0; i < count; ++i) {
        CHECK(cudaEventRecord(ev[i], read_stream));
        Launch(r, s, read_stream);
      }
      CHECK(cudaEventRecord(ev[count], read_stream));
      *reinterpret_cast<volatile int*>(flag) = 1;  // both streams start now
      CHECK(cudaDeviceSynchronize());
      const float chain_beside = Ms(c0, c1);
      int inside = 0;  // reads that finished before the chain did
      while (inside < count && Ms(c0, ev[inside + 1]) <= chain_beside) ++inside;
      const float start = std::max(0.0f, Ms(c0, ev[0]));
      const float covered =
          std::min(1.0f, std::max(0.0f, std::min(Ms(c0, ev[count]), chain_beside) - start) /
                             chain_beside);
      char beside[32] = "-";
      if (inside > 0) std::snprintf(beside, sizeof(beside), "%.1f",
                                    inside * gb / (Ms(ev[0], ev[inside]) / 1e3));
      const unsigned threads = r.lean ? kLeanThreads : jdirect::kThreads;
      std::printf("%4lldB %-12s %7u %3dB %11.1f %12s %15.1f %6.2fx %7.0f%% %8s\n",
                  static_cast<long long>(width), (r.name + "/" + std::to_string(r.blocks)).c_str(),
                  threads, VectorBytes(width, table, out), gb / (read_ms / 1e3), beside,
                  chain_beside, chain_beside / chain_ms, 100 * covered,
                  right ? "ok" : "WRONG");
    }
  }

  for (auto& e : ev) CHECK(cudaEventDestroy(e));
  for (auto e : {gate_ev, c0, c1}) CHECK(cudaEventDestroy(e));
  for (auto st : {gate_stream, gemm_stream, read_stream}) CHECK(cudaStreamDestroy(st));
  CHECK(cublasDestroy(gemms.handle));
  for (auto* m : {gemms.a, gemms.b, gemms.c}) CHECK(cudaFree(m));
  CHECK(cudaFreeHost(flag));
  CHECK(cudaFree(sum));
  CHECK(cudaFree(out));
  CHECK(cudaFree(idx));
  CHECK(cudaFree(table));
  std::printf(all_right ? "every read checked against the host gather: ok\n"
                        : "WRONG rows: a read's checksum differs from the host gather's\n");
  return all_right ? 0 : 1;
}
