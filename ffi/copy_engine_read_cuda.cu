// The copy-engine read: host threads gather a registered table's rows into
// pinned staging and the GPU's copy engines move them to the device, so that
// no SM takes part (issue 54). It pays where the GPU's read is slow: a table
// in pinned memory, which the GPU maps in 4 KB pages, so that even in
// address order it reads ~110M random rows a second, while host threads
// gather rows under 256 B faster than that; wider rows, and managed memory
// at any width, the GPU reads faster (benchmarks/RESULTS.md). Python chooses
// it, or a share of the rows (jdirect/_read_policy.py, copy_engine_share).
//
// Everything is ordered on streams; nothing waits on the host or spins on
// the GPU. On the device's two copy streams, after the work enqueued on the
// caller's stream: the indices are copied to pinned host memory, then for
// each piece of the rows a host function (cudaLaunchHostFunc) gathers it on
// the host threads and a copy moves it into the result; pieces alternate
// between the two streams, so one piece's gather overlaps another's copy.
// The caller's stream then waits for both. A host function makes no CUDA
// call, so it cannot close a cycle with another thread's CUDA call (an
// earlier design's done spun on the GPU for host work and deadlocked so).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "gather_common.h"
#include "gather_cuda.h"
#include "host_gather.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

// Pieces of a read: enough to overlap gathers with copies, each large
// enough that its host function's start (tens of microseconds) is small
// against its rows.
constexpr int kMaxPieces = 8;
constexpr int64_t kPieceBytes = 4 << 20;

std::atomic<int64_t> copy_engine_reads{0};

ffi::Error CudaFailed(const char* call, cudaError_t e) {
  cudaGetLastError();  // do not leave it for the next launch check
  return ffi::Error::Internal(std::string("jdirect copy-engine read: ") + call +
                              " failed: " + cudaGetErrorString(e));
}

// One read's host work, shared by its pieces' host functions; the last
// piece to finish deletes it.
struct HostWork {
  struct Piece {
    HostWork* work;
    int64_t begin, end;
  };
  GatherArgs args;  // idx: the pinned host copy; out: the pinned staging
  Piece pieces[kMaxPieces];
  std::atomic<int> left;

  // Called by `count` pieces' host functions, or for pieces that were
  // never enqueued.
  void Finished(int count) {
    if (count > 0 && left.fetch_sub(count, std::memory_order_acq_rel) == count) delete this;
  }
};

void CUDART_CB GatherPiece(void* p) {
  const HostWork::Piece piece = *static_cast<HostWork::Piece*>(p);
  HostWork* work = piece.work;
  GatherRowsOnThreads(work->args, work->args.idx, work->args.out, piece.begin, piece.end);
  work->Finished(1);
}

// A device's copy streams, events and pinned buffers. Reads on one device
// are enqueued one at a time (`mu`), and each read's copy streams first
// wait for the previous read's (`ends`), so one staging buffer serves them
// all: a read's gather starts only after the previous read's copies.
struct DeviceState {
  std::mutex mu;
  cudaStream_t copies[2] = {nullptr, nullptr};
  cudaEvent_t ready = nullptr, ids_ready = nullptr, ends[2] = {nullptr, nullptr};
  char* ids = nullptr;
  int64_t ids_bytes = 0;
  char* staging = nullptr;
  int64_t staging_bytes = 0;
};

ffi::Error Create(DeviceState& d) {
  for (cudaStream_t& s : d.copies) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaFailed("cudaStreamCreateWithFlags", e);
    }
  }
  for (cudaEvent_t* event : {&d.ready, &d.ids_ready, &d.ends[0], &d.ends[1]}) {
    if (cudaError_t e = cudaEventCreateWithFlags(event, cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaFailed("cudaEventCreateWithFlags", e);
    }
  }
  return ffi::Error::Success();
}

// The device's state, made on first use and kept for the process (leaked,
// as the side streams are: a handler may run while statics are destroyed).
ffi::Error StateOf(int device, DeviceState** state) {
  static std::mutex mu;
  static auto* states = new std::unordered_map<int, DeviceState*>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = states->find(device);
  if (it != states->end()) {
    *state = it->second;
    return ffi::Error::Success();
  }
  auto* d = new DeviceState;
  if (auto e = Create(*d); e.failure()) return e;  // d leaks: the device is unusable
  (*states)[device] = *state = d;
  return ffi::Error::Success();
}

// Makes `*buffer` hold at least `bytes` of pinned memory. Grows it after the
// copy streams have finished with it (rarely: a program's reads are of fixed
// sizes), doubling, so that growing reads do not wait each time.
ffi::Error Room(DeviceState& d, char** buffer, int64_t* have, int64_t bytes) {
  if (bytes <= *have) return ffi::Error::Success();
  for (cudaStream_t s : d.copies) {
    if (cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess) {
      return CudaFailed("cudaStreamSynchronize", e);
    }
  }
  if (*buffer != nullptr) {
    if (cudaError_t e = cudaFreeHost(*buffer); e != cudaSuccess) {
      return CudaFailed("cudaFreeHost", e);
    }
    *buffer = nullptr;
    *have = 0;
  }
  const int64_t size = std::max<int64_t>(bytes, 2 * *have);
  void* p = nullptr;
  if (cudaError_t e = cudaHostAlloc(&p, static_cast<size_t>(size), cudaHostAllocPortable);
      e != cudaSuccess) {
    return CudaFailed("cudaHostAlloc", e);
  }
  *buffer = static_cast<char*>(p);
  *have = size;
  return ffi::Error::Success();
}

// Makes `waiter` wait for the work enqueued so far on `stream`, via `event`.
ffi::Error Follow(cudaStream_t waiter, cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t e = cudaEventRecord(event, stream); e != cudaSuccess) {
    return CudaFailed("cudaEventRecord", e);
  }
  if (cudaError_t e = cudaStreamWaitEvent(waiter, event, 0); e != cudaSuccess) {
    return CudaFailed("cudaStreamWaitEvent", e);
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error CopyEngineGather(const GatherArgs& a, cudaStream_t stream,
                            const std::function<ffi::Error()>& alongside) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    return CudaFailed("cudaGetDevice", e);
  }
  DeviceState* state;
  if (auto e = StateOf(device, &state); e.failure()) return e;
  DeviceState& d = *state;
  std::lock_guard<std::mutex> lock(d.mu);
  const int64_t index_bytes = a.n * (a.idx64 ? 8 : 4);
  const int64_t bytes = a.n * a.row_bytes;
  if (auto e = Room(d, &d.ids, &d.ids_bytes, index_bytes); e.failure()) return e;
  if (auto e = Room(d, &d.staging, &d.staging_bytes, bytes); e.failure()) return e;
  // The first copy stream starts after the caller's stream (which made the
  // indices and may have written the table) and after the second copy
  // stream's part of the previous read (its copies read the staging).
  if (auto e = Follow(d.copies[0], d.ready, stream); e.failure()) return e;
  if (cudaError_t e = cudaStreamWaitEvent(d.copies[0], d.ends[1], 0); e != cudaSuccess) {
    return CudaFailed("cudaStreamWaitEvent", e);
  }
  if (cudaError_t e = cudaMemcpyAsync(d.ids, a.idx, static_cast<size_t>(index_bytes),
                                      cudaMemcpyDeviceToHost, d.copies[0]);
      e != cudaSuccess) {
    return CudaFailed("cudaMemcpyAsync", e);
  }
  if (auto e = Follow(d.copies[1], d.ids_ready, d.copies[0]); e.failure()) return e;
  const int pieces = static_cast<int>(
      std::clamp<int64_t>(std::min<int64_t>(bytes / kPieceBytes, a.n), 1, kMaxPieces));
  auto* work = new HostWork;
  work->args = a;
  work->args.idx = d.ids;
  work->args.out = d.staging;
  work->left.store(pieces, std::memory_order_relaxed);
  for (int p = 0; p < pieces; ++p) {
    const int64_t begin = a.n * p / pieces, end = a.n * (p + 1) / pieces;
    work->pieces[p] = HostWork::Piece{work, begin, end};
    cudaStream_t copy = d.copies[p % 2];
    const size_t offset = static_cast<size_t>(begin * a.row_bytes);
    cudaError_t e = cudaLaunchHostFunc(copy, GatherPiece, &work->pieces[p]);
    if (e != cudaSuccess) {
      work->Finished(pieces - p);
      return CudaFailed("cudaLaunchHostFunc", e);
    }
    e = cudaMemcpyAsync(a.out + offset, d.staging + offset,
                        static_cast<size_t>((end - begin) * a.row_bytes),
                        cudaMemcpyHostToDevice, copy);
    if (e != cudaSuccess) {
      work->Finished(pieces - p - 1);
      return CudaFailed("cudaMemcpyAsync", e);
    }
  }
  if (auto e = alongside(); e.failure()) return e;
  for (int s = 0; s < 2; ++s) {
    if (auto e = Follow(stream, d.ends[s], d.copies[s]); e.failure()) return e;
  }
  copy_engine_reads.fetch_add(1, std::memory_order_relaxed);
  return ffi::Error::Success();
}

}  // namespace jdirect

extern "C" JDIRECT_EXPORT int64_t jdirect_cuda_copy_engine_reads() {
  return jdirect::copy_engine_reads.load(std::memory_order_relaxed);
}
