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
// Build and run (CUDA 13: its cudaMemAdvise; an sm_90 GPU; under 90 s on an H200):
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

#include "sm_lean_reads.cuh"

namespace probe {

// Beside sm_lean_reads.cuh's Check of CUDA calls (one overload set, so
// that CHECK takes either).
inline void Check(cublasStatus_t s, const char* what, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAILED line %d: %s: cuBLAS status %d\n", line, what, static_cast<int>(s));
    std::exit(1);
  }
}

namespace {

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

float Ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A chain of bf16 GEMMs on one stream: compute that fills every SM.
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

// What a read did beside the chain.
struct Beside {
  float gbps;      // the reads that finished inside the chain (0: none did)
  float chain_ms;  // the chain's time beside the reads
  float covered;   // share of the chain's time that reads ran beside it
};

constexpr int kMaxReads = 128;  // reads enqueued beside one chain, at most

// Streams, events, the gate and the GEMM chain, shared by every measurement.
class Rig {
 public:
  Rig(int gemm_n, int gemm_count) : ev_(kMaxReads + 1) {
    gemms_.n = gemm_n;
    gemms_.count = gemm_count;
    const int64_t elems = int64_t{gemm_n} * gemm_n;
    for (auto** m : {&gemms_.a, &gemms_.b, &gemms_.c}) CHECK(cudaMalloc(m, elems * 2));
    FillBf16<<<1024, 256>>>(gemms_.a, elems, 1);  // not zeros: a GEMM of zeros draws less power
    FillBf16<<<1024, 256>>>(gemms_.b, elems, 2);
    CHECK(cudaDeviceSynchronize());  // the legacy stream does not order the streams below
    CHECK(cublasCreate(&gemms_.handle));
    for (auto* st : {&gate_, &gemm_, &read_}) {
      CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
    }
    CHECK(cublasSetStream(gemms_.handle, gemm_));
    CHECK(cudaHostAlloc(&flag_, sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(&flag_dev_, flag_, 0));
    for (auto& e : ev_) CHECK(cudaEventCreate(&e));
    for (auto* e : {&gate_ev_, &c0_, &c1_}) CHECK(cudaEventCreate(e));
    CHECK(cudaMalloc(&sum_, sizeof(*sum_)));
  }

  ~Rig() {
    for (auto& e : ev_) CHECK(cudaEventDestroy(e));
    for (auto e : {gate_ev_, c0_, c1_}) CHECK(cudaEventDestroy(e));
    for (auto st : {gate_, gemm_, read_}) CHECK(cudaStreamDestroy(st));
    CHECK(cublasDestroy(gemms_.handle));
    for (auto* m : {gemms_.a, gemms_.b, gemms_.c}) CHECK(cudaFree(m));
    CHECK(cudaFreeHost(flag_));
    CHECK(cudaFree(sum_));
  }

  // GB/s of a 64 MB pinned host -> device copy (the link's rate).
  float CopyGbps() {
    const size_t bytes = 64 << 20;
    void *pinned = nullptr, *dst = nullptr;
    CHECK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
    CHECK(cudaMalloc(&dst, bytes));
    std::memset(pinned, 1, bytes);
    std::vector<float> ms;
    for (int i = 0; i < 6; ++i) {  // the first warms up
      CHECK(cudaEventRecord(ev_[0], read_));
      CHECK(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, read_));
      CHECK(cudaEventRecord(ev_[1], read_));
      CHECK(cudaEventSynchronize(ev_[1]));
      if (i > 0) ms.push_back(Ms(ev_[0], ev_[1]));
    }
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(dst));
    return bytes / Median(ms) / 1e6;
  }

  // The chain's time alone, median of 3.
  float ChainMs() {
    std::vector<float> ms;
    for (int i = 0; i < 3; ++i) {
      CHECK(cudaEventRecord(c0_, gemm_));
      gemms_.Enqueue();
      CHECK(cudaEventRecord(c1_, gemm_));
      CHECK(cudaEventSynchronize(c1_));
      ms.push_back(Ms(c0_, c1_));
    }
    return Median(ms);
  }

  // Whether read `r` writes the rows whose host checksum is `expected`; the
  // output is poisoned first, so rows left from an earlier read fail.
  bool Checked(const Read& r, const Setup& s, uint64_t expected) {
    CHECK(cudaMemsetAsync(s.out, 0xFF, s.n * s.row_bytes, read_));
    Launch(r, s, read_);
    CHECK(cudaMemsetAsync(sum_, 0, sizeof(*sum_), read_));
    Checksum<<<1024, 256, 0, read_>>>(reinterpret_cast<const uint64_t*>(s.out),
                                      s.n * s.row_bytes / 8, sum_);
    CHECK(cudaGetLastError());
    unsigned long long got = 0;
    CHECK(cudaMemcpyAsync(&got, sum_, sizeof(got), cudaMemcpyDeviceToHost, read_));
    CHECK(cudaStreamSynchronize(read_));
    return got == expected;
  }

  // One read's time alone, median of 5.
  float AloneMs(const Read& r, const Setup& s) {
    std::vector<float> ms;
    for (int i = 0; i < 5; ++i) {
      CHECK(cudaEventRecord(ev_[0], read_));
      Launch(r, s, read_);
      CHECK(cudaEventRecord(ev_[1], read_));
      CHECK(cudaEventSynchronize(ev_[1]));
      ms.push_back(Ms(ev_[0], ev_[1]));
    }
    return Median(ms);
  }

  // Reads launched back to back beside the chain, both released by the
  // gate at once: enough to outlast the chain (alone `chain_ms`) even if
  // each read (alone `read_ms`) slows 3x.
  Beside Besides(const Read& r, const Setup& s, float read_ms, float chain_ms) {
    const int count = std::min(kMaxReads, 2 + static_cast<int>(3 * chain_ms / read_ms));
    *reinterpret_cast<volatile int*>(flag_) = 0;
    Gate<<<1, 1, 0, gate_>>>(flag_dev_);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(gate_ev_, gate_));
    CHECK(cudaStreamWaitEvent(gemm_, gate_ev_, 0));
    CHECK(cudaStreamWaitEvent(read_, gate_ev_, 0));
    CHECK(cudaEventRecord(c0_, gemm_));
    gemms_.Enqueue();
    CHECK(cudaEventRecord(c1_, gemm_));
    for (int i = 0; i < count; ++i) {
      CHECK(cudaEventRecord(ev_[i], read_));
      Launch(r, s, read_);
    }
    CHECK(cudaEventRecord(ev_[count], read_));
    *reinterpret_cast<volatile int*>(flag_) = 1;  // both streams start now
    CHECK(cudaDeviceSynchronize());
    Beside b{0, Ms(c0_, c1_), 0};
    int inside = 0;  // reads that finished before the chain did
    while (inside < count && Ms(c0_, ev_[inside + 1]) <= b.chain_ms) ++inside;
    if (inside > 0) b.gbps = inside * s.n * s.row_bytes / (Ms(ev_[0], ev_[inside]) * 1e6f);
    const float start = std::max(0.0f, Ms(c0_, ev_[0]));
    const float end = std::min(Ms(c0_, ev_[count]), b.chain_ms);
    b.covered = std::max(0.0f, end - start) / b.chain_ms;
    return b;
  }

 private:
  Gemms gemms_{};
  cudaStream_t gate_, gemm_, read_;
  int* flag_ = nullptr;  // raised by the host to open the gate
  int* flag_dev_ = nullptr;
  std::vector<cudaEvent_t> ev_;
  cudaEvent_t gate_ev_, c0_, c1_;
  unsigned long long* sum_ = nullptr;
};


// Checksum's value for the rows `ids` of `table` gathered on the host.
uint64_t HostChecksum(const char* table, const std::vector<int32_t>& ids, int64_t row_bytes) {
  const int64_t wpr = row_bytes / 8;
  const uint64_t* words = reinterpret_cast<const uint64_t*>(table);
  uint64_t sum = 0;
  for (int64_t p = 0; p < static_cast<int64_t>(ids.size()); ++p) {
    for (int64_t j = 0; j < wpr; ++j) {
      sum += words[ids[p] * wpr + j] * (2 * static_cast<uint64_t>(p * wpr + j) + 1);
    }
  }
  return sum;
}

int64_t Arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line at a time, even into a pipe
  const int64_t table_bytes = Arg(argc, argv, "--table-gb", 4) << 30;
  const int64_t n = Arg(argc, argv, "--ids", 2'000'000);
  const int gemm_count = static_cast<int>(Arg(argc, argv, "--gemms", 40));
  const int gemm_n = static_cast<int>(Arg(argc, argv, "--n", 8192));
  const std::vector<int64_t> widths = {200, 256, 400};  // bytes, each a multiple of 8

  const int device = 0;
  int sms = 0;
  CHECK(cudaSetDevice(device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("sm_lean_read: %s, %d SMs; table %.1f GiB host-resident managed, %lld random ids; "
              "chain of %d bf16 GEMMs of %d^3\n",
              prop.name, sms, table_bytes / double(1 << 30), static_cast<long long>(n),
              gemm_count, gemm_n);
  char* table = HostResidentTable(table_bytes, device);
  int32_t* idx = nullptr;
  char* out = nullptr;
  CHECK(cudaMalloc(&idx, n * sizeof(int32_t)));
  CHECK(cudaMalloc(&out, n * widths.back()));
  bool all_right = true;
  {
    Rig rig(gemm_n, gemm_count);
    std::printf("pinned 64 MB host -> device copy: %.1f GB/s\n", rig.CopyGbps());
    rig.ChainMs();  // warm-up: cuBLAS picks its kernels
    const float chain_ms = rig.ChainMs();
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
    std::printf("%6s %-12s %7s %4s %11s %12s %15s %7s %8s %8s\n", "row", "read", "threads",
                "vec", "alone GB/s", "beside GB/s", "chain beside ms", "GEMM x", "covered",
                "checked");
    std::mt19937_64 rng(1);
    for (const int64_t width : widths) {
      const int64_t nrows = table_bytes / width;
      std::vector<int32_t> ids(n);
      std::uniform_int_distribution<int64_t> pick(0, nrows - 1);
      for (auto& i : ids) i = static_cast<int32_t>(pick(rng));
      CHECK(cudaMemcpy(idx, ids.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
      const uint64_t expected = HostChecksum(table, ids, width);
      const Setup s{table, idx, n, nrows, width, out};
      for (const Read& r : reads) {
        const bool right = rig.Checked(r, s, expected);
        all_right = all_right && right;
        const float read_ms = rig.AloneMs(r, s);
        const Beside b = rig.Besides(r, s, read_ms, chain_ms);
        char beside[32] = "-";
        if (b.gbps > 0) std::snprintf(beside, sizeof(beside), "%.1f", b.gbps);
        std::printf("%4lldB %-12s %7u %3dB %11.1f %12s %15.1f %6.2fx %7.0f%% %8s\n",
                    static_cast<long long>(width),
                    (r.name + "/" + std::to_string(r.blocks)).c_str(),
                    r.lean ? kLeanThreads : jdirect::kThreads, VectorBytes(width, table, out),
                    n * double(width) / (read_ms * 1e6), beside, b.chain_ms,
                    b.chain_ms / chain_ms, 100 * b.covered, right ? "ok" : "WRONG");
      }
    }
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(idx));
  CHECK(cudaFree(table));
  std::printf(all_right ? "every read checked against the host gather: ok\n"
                        : "WRONG rows: a read's checksum differs from the host gather's\n");
  return all_right ? 0 : 1;
}

}  // namespace probe

int main(int argc, char** argv) { return probe::Main(argc, argv); }
