// The asynchronous gather's CUDA handlers (jdirect.gather_start and
// jdirect.gather_done), in the manner of XLA's async collectives: the start
// enqueues the read on a jdirect side stream, so that the kernels XLA
// enqueues after it on its own stream run alongside; the done makes XLA's
// stream wait for the read. Neither blocks the host.
//
// Lifetimes. XLA believes the start finished when its stream passes it, so
// every buffer the side stream still touches must stay live in XLA's eyes
// until the done: the rows (aliased through the done to its result), the
// sort workspace (an extra result of the start), the indices and the cache
// operands are all operands of the done (jdirect/_ops.py). The table's
// memory is guarded as for any gather: the start records the table's read
// event on the side stream, and close() waits for it.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "gather_common.h"
#include "gather_cuda.h"
#include "xla/ffi/api/ffi.h"

namespace jdirect {
namespace {

// Default grid of an asynchronous read, per SM. Measured on an H200
// (benchmarks/results/journal/LOG.md, 2026-11-22, GPU-centric training):
// against bf16 matmuls (benchmarks/overlap.py) 32 blocks hid all of the
// compute and 2 per SM almost none, but in the GraphSAGE step, whose
// kernels are small, 2 per SM gave the faster epoch (32 blocks were slower
// than no overlap at all).
constexpr int64_t kAsyncBlocksPerSM = 2;

ffi::Error CudaFailed(const char* call, cudaError_t e) {
  cudaGetLastError();  // do not leave it for the next launch check
  return ffi::Error::Internal(std::string("jdirect gather_start/gather_done: ") + call +
                              " failed: " + cudaGetErrorString(e));
}

struct Started {
  cudaEvent_t event;  // recorded on the side stream after the read
  int device;
};

// Handlers for several devices may run at once (one thread each): all
// state sits under one mutex.
struct AsyncState {
  std::mutex mu;
  std::unordered_map<int, cudaStream_t> side_streams;         // by device
  std::unordered_map<int, std::vector<cudaEvent_t>> free_events;  // by device
  std::unordered_map<const void*, Started> started;           // by rows buffer
};

AsyncState& State() {
  static AsyncState* s = new AsyncState;  // leaked: handlers may run at shutdown
  return *s;
}

// The device's side stream, created on first use and kept for the process.
// Non-blocking: no implicit ordering with the legacy default stream. The
// highest priority: the read's few blocks are scheduled ahead of queued
// compute blocks, and the grid cap leaves the compute the other SMs.
ffi::Error SideStream(AsyncState& s, int device, cudaStream_t* stream) {
  auto it = s.side_streams.find(device);
  if (it != s.side_streams.end()) {
    *stream = it->second;
    return ffi::Error::Success();
  }
  int least = 0, greatest = 0;
  if (cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest); e != cudaSuccess) {
    return CudaFailed("cudaDeviceGetStreamPriorityRange", e);
  }
  if (cudaError_t e = cudaStreamCreateWithPriority(stream, cudaStreamNonBlocking, greatest);
      e != cudaSuccess) {
    return CudaFailed("cudaStreamCreateWithPriority", e);
  }
  s.side_streams[device] = *stream;
  return ffi::Error::Success();
}

// Events are pooled per device (an event is recorded on streams of its own
// device). An event may go back to the pool as soon as the last
// cudaStreamWaitEvent on it has been enqueued: a wait captures the record
// it was issued against, so recording the event again cannot change it.
ffi::Error TakeEvent(AsyncState& s, int device, cudaEvent_t* event) {
  std::vector<cudaEvent_t>& pool = s.free_events[device];
  if (!pool.empty()) {
    *event = pool.back();
    pool.pop_back();
    return ffi::Error::Success();
  }
  if (cudaError_t e = cudaEventCreateWithFlags(event, cudaEventDisableTiming); e != cudaSuccess) {
    return CudaFailed("cudaEventCreateWithFlags", e);
  }
  return ffi::Error::Success();
}

void PutEvent(AsyncState& s, int device, cudaEvent_t event) {
  s.free_events[device].push_back(event);
}

// Makes `waiter` wait for the work enqueued so far on `stream`.
ffi::Error Fork(AsyncState& s, int device, cudaStream_t stream, cudaStream_t waiter) {
  cudaEvent_t ready;
  if (auto e = TakeEvent(s, device, &ready); e.failure()) return e;
  cudaError_t err = cudaEventRecord(ready, stream);
  const char* call = "cudaEventRecord";
  if (err == cudaSuccess) {
    err = cudaStreamWaitEvent(waiter, ready, 0);
    call = "cudaStreamWaitEvent";
  }
  PutEvent(s, device, ready);
  return err == cudaSuccess ? ffi::Error::Success() : CudaFailed(call, err);
}

// The start's common body: `launch(runner)` enqueues the gather with the
// runner it is given.
template <typename Launch>
ffi::Error Start(cudaStream_t stream, ffi::Result<ffi::AnyBuffer>& out,
                 ffi::Result<ffi::AnyBuffer>& workspace, int64_t max_blocks,
                 const Launch& launch) {
  // Nothing to overlap, and zero-size buffers need not have distinct
  // addresses to key them by: an ordinary gather (it still checks the
  // table), and the done skips the lookup too.
  if (out->size_bytes() == 0) return launch(Runner(stream, workspace, max_blocks));
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    return CudaFailed("cudaGetDevice", e);
  }
  const int64_t cap = max_blocks > 0 ? max_blocks : kAsyncBlocksPerSM * MultiprocessorCount();
  AsyncState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  cudaStream_t side;
  if (auto e = SideStream(s, device, &side); e.failure()) return e;
  // The read waits for XLA's stream: it produced the indices and the cache
  // operands, and may have used the rows' and workspace's memory for
  // earlier buffers.
  if (auto e = Fork(s, device, stream, side); e.failure()) return e;
  if (auto e = launch(Runner(side, workspace, cap)); e.failure()) return e;
  cudaEvent_t finished;
  if (auto e = TakeEvent(s, device, &finished); e.failure()) return e;
  if (cudaError_t e = cudaEventRecord(finished, side); e != cudaSuccess) {
    PutEvent(s, device, finished);
    return CudaFailed("cudaEventRecord", e);
  }
  auto [it, inserted] = s.started.try_emplace(out->untyped_data(), Started{finished, device});
  if (!inserted) {
    // A start whose done never ran (its program failed in between, or an
    // eager Pending was dropped) left this entry; nothing waits on it.
    PutEvent(s, it->second.device, it->second.event);
    it->second = Started{finished, device};
  }
  return ffi::Error::Success();
}

ffi::Error GatherHostStart(cudaStream_t stream, ffi::Buffer<ffi::S32> handle,
                           ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer cached,
                           ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> workspace, int64_t mode, int64_t fill_lo,
                           int64_t fill_hi, int64_t max_blocks, int64_t nrows,
                           int64_t row_bytes, int64_t compact_rows, int64_t copy_thousandths) {
  int32_t h;
  if (auto e = HostHandle(handle, &h); e.failure()) return e;
  return Start(stream, out, workspace, max_blocks, [&](const CudaRunner& run) {
    return GatherFromHandle(run, h, slots, cached, idx, out, mode, fill_lo, fill_hi, nrows,
                            row_bytes, compact_rows, copy_thousandths);
  });
}

ffi::Error GatherHostStaticStart(cudaStream_t stream, ffi::Buffer<ffi::S32> slots,
                                 ffi::AnyBuffer cached, ffi::AnyBuffer idx,
                                 ffi::Result<ffi::AnyBuffer> out,
                                 ffi::Result<ffi::AnyBuffer> workspace, int64_t handle,
                                 int64_t mode, int64_t fill_lo, int64_t fill_hi,
                                 int64_t max_blocks, int64_t nrows, int64_t row_bytes,
                                 int64_t compact_rows, int64_t copy_thousandths) {
  return Start(stream, out, workspace, max_blocks, [&](const CudaRunner& run) {
    return GatherFromHandle(run, static_cast<int32_t>(handle), slots, cached, idx, out, mode,
                            fill_lo, fill_hi, nrows, row_bytes, compact_rows, copy_thousandths);
  });
}

ffi::Error GatherDone(cudaStream_t stream, ffi::AnyBuffer rows,
                      ffi::RemainingArgs /*keep_alive*/, ffi::Result<ffi::AnyBuffer> out) {
  if (out->size_bytes() != rows.size_bytes()) {
    return ffi::Error::InvalidArgument("jdirect gather_done: result and rows differ in size");
  }
  if (rows.size_bytes() == 0) return ffi::Error::Success();
  {
    AsyncState& s = State();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.started.find(rows.untyped_data());
    if (it == s.started.end()) {
      return ffi::Error::InvalidArgument(
          "gather_done without a matching gather_start: every Pending must reach gather_done "
          "exactly once and unchanged (a Pending passed into another jitted function must be "
          "donated to it, or XLA copies its rows before the read has finished)");
    }
    const Started started = it->second;
    s.started.erase(it);
    const cudaError_t e = cudaStreamWaitEvent(stream, started.event, 0);
    PutEvent(s, started.device, started.event);
    if (e != cudaSuccess) return CudaFailed("cudaStreamWaitEvent", e);
  }
  // XLA did not alias the result to the rows: copy them, after the wait.
  if (out->untyped_data() != rows.untyped_data()) {
    if (cudaError_t e = cudaMemcpyAsync(out->untyped_data(), rows.untyped_data(),
                                        rows.size_bytes(), cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess) {
      return CudaFailed("cudaMemcpyAsync", e);
    }
  }
  return ffi::Error::Success();
}

}  // namespace

ffi::Error FollowStartedReads(cudaStream_t stream, ffi::RemainingArgs args) {
  AsyncState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.started.empty()) return ffi::Error::Success();
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error() || buffer->size_bytes() == 0) continue;
    // A live buffer's address names at most one unfinished start; an entry a
    // failed program left behind names a finished read (waiting is a no-op).
    auto it = s.started.find(buffer->untyped_data());
    if (it == s.started.end()) continue;
    if (cudaError_t e = cudaStreamWaitEvent(stream, it->second.event, 0); e != cudaSuccess) {
      return CudaFailed("cudaStreamWaitEvent", e);
    }
  }
  return ffi::Error::Success();
}

}  // namespace jdirect

#define JDIRECT_CUDA_CTX .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()

JDIRECT_DEFINE_HANDLER(JdirectGatherHostStartCuda, jdirect::GatherHostStart,
                       JDIRECT_BIND_GATHER_HOST(JDIRECT_CUDA_CTX));
JDIRECT_DEFINE_HANDLER(JdirectGatherHostStaticStartCuda, jdirect::GatherHostStaticStart,
                       JDIRECT_BIND_GATHER_HOST_STATIC(JDIRECT_CUDA_CTX));
JDIRECT_DEFINE_HANDLER(JdirectGatherDoneCuda, jdirect::GatherDone,
                       JDIRECT_BIND_GATHER_DONE(JDIRECT_CUDA_CTX));
