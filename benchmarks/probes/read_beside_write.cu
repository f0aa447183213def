// Issue 52: can a step's zero-copy read of the next batch's rows run beside
// this batch's zero-copy writes of its rows (TorchRec's prefetch pipeline),
// and does the table's size matter? A bare probe, no JAX.
//
// A host-resident managed table of `--table-gb` (allocated and advised as
// jdirect's HostTable: sm_lean_reads.cuh's HostResidentTable), 256 B rows (a
// 64-wide float32 embedding row), `--ids` random rows a batch (380K: a
// recsys step's learned rows):
//   read   ffi/gather_kernels.cuh's GatherKernel itself, on 2 blocks an SM
//          (a started read's grid, ffi/gather_async_cuda.cu), on a stream
//          of the highest priority (the side stream's), rows into device
//          memory;
//   write  a scatter of device rows into other random rows of the table,
//          16 lanes a row, every SM (the shape of the fused sparse update's
//          stores: ffi/sparse_update_cuda.cu);
// each alone, then both at once on their two streams, medians of `--reps`.
// Prints ms and GB/s of each, and of both together (the bytes each way over
// the time both took).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 benchmarks/probes/read_beside_write.cu -o /tmp/rw
//   /tmp/rw [--table-gb 8 78] [--ids 380000] [--reps 9]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "sm_lean_reads.cuh"

namespace probe {

constexpr int64_t kRowBytes = 256;

// Row `p` of `rows` stored at table row `idx[p]`, 16 lanes a row (uint4).
__global__ void ScatterRows(char* __restrict__ table, const int32_t* __restrict__ idx, int64_t n,
                            const uint4* __restrict__ rows) {
  const int64_t lanes = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * 16;
       i += lanes) {
    const int64_t p = i >> 4;
    reinterpret_cast<uint4*>(table + idx[p] * kRowBytes)[i & 15] = rows[i];
  }
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  std::vector<double> sizes;
  int64_t ids = 380000;
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--table-gb")) {
      while (i + 1 < argc && argv[i + 1][0] != '-') sizes.push_back(std::atof(argv[++i]));
    } else if (!std::strcmp(argv[i], "--ids") && i + 1 < argc) {
      ids = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    }
  }
  if (sizes.empty()) sizes = {8, 78};
  int device = 0, sms = 0, least = 0, greatest = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t rs, ws;
  CHECK(cudaStreamCreateWithPriority(&rs, cudaStreamNonBlocking, greatest));
  CHECK(cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking));
  const double gb = ids * kRowBytes / 1e9;
  std::printf("%8s %10s %10s %10s %10s %10s %12s\n", "table_gb", "read_ms", "write_ms",
              "both_ms", "read_gbps", "write_gbps", "both_each_way");
  for (double size : sizes) {
    const int64_t nrows = static_cast<int64_t>(size * 1e9) / kRowBytes;
    char* table = HostResidentTable(nrows * kRowBytes, device);
    std::mt19937_64 rng(1);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(nrows - 1));
    std::vector<int32_t> rid(ids), wid(ids);
    for (auto& x : rid) x = pick(rng);
    for (auto& x : wid) x = pick(rng);
    int32_t *drid, *dwid;
    char *out, *src;
    CHECK(cudaMalloc(&drid, ids * 4));
    CHECK(cudaMalloc(&dwid, ids * 4));
    CHECK(cudaMalloc(&out, ids * kRowBytes));
    CHECK(cudaMalloc(&src, ids * kRowBytes));
    CHECK(cudaMemcpy(drid, rid.data(), ids * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dwid, wid.data(), ids * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(src, 2, ids * kRowBytes));
    const Setup setup{table, drid, ids, nrows, kRowBytes, out};
    const Read read{"started", false, static_cast<unsigned>(2 * sms)};
    const unsigned wblocks = static_cast<unsigned>(std::min<int64_t>(16 * sms, (ids * 16 + 255) / 256));
    cudaEvent_t r0, r1, w0, w1;
    for (cudaEvent_t* e : {&r0, &r1, &w0, &w1}) CHECK(cudaEventCreate(e));
    std::vector<float> tr, tw, tb;
    for (int rep = 0; rep < reps + 1; ++rep) {
      float a = 0, b = 0, c = 0, d = 0;
      CHECK(cudaEventRecord(r0, rs));
      Launch(read, setup, rs);
      CHECK(cudaEventRecord(r1, rs));
      CHECK(cudaStreamSynchronize(rs));
      CHECK(cudaEventElapsedTime(&a, r0, r1));
      CHECK(cudaEventRecord(w0, ws));
      ScatterRows<<<wblocks, 256, 0, ws>>>(table, dwid, ids, reinterpret_cast<uint4*>(src));
      CHECK(cudaEventRecord(w1, ws));
      CHECK(cudaStreamSynchronize(ws));
      CHECK(cudaEventElapsedTime(&b, w0, w1));
      // Both: the write's stream waits for the read's start, as a step's
      // update follows its started read.
      CHECK(cudaEventRecord(r0, rs));
      Launch(read, setup, rs);
      CHECK(cudaEventRecord(r1, rs));
      CHECK(cudaStreamWaitEvent(ws, r0, 0));
      ScatterRows<<<wblocks, 256, 0, ws>>>(table, dwid, ids, reinterpret_cast<uint4*>(src));
      CHECK(cudaEventRecord(w1, ws));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaEventElapsedTime(&c, r0, r1));
      CHECK(cudaEventElapsedTime(&d, r0, w1));
      if (rep == 0) continue;  // warm-up
      tr.push_back(a);
      tw.push_back(b);
      tb.push_back(std::max(c, d));
    }
    const float mr = Median(tr), mw = Median(tw), mb = Median(tb);
    std::printf("%8.1f %10.3f %10.3f %10.3f %10.1f %10.1f %12.1f\n", size, mr, mw, mb,
                gb / mr * 1e3, gb / mw * 1e3, gb / mb * 1e3);
    std::fflush(stdout);
    for (void* p : {static_cast<void*>(drid), static_cast<void*>(dwid), static_cast<void*>(out),
                    static_cast<void*>(src)}) {
      CHECK(cudaFree(p));
    }
    CHECK(cudaFree(table));
  }
  return 0;
}
