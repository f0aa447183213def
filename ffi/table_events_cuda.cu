// Per-table events (table_events.h), and the C API that waits for them
// (jdirect/_ffi.py). One event per (table, stream): XLA may read one table
// from several streams (a compute_on region, several devices), and an event
// remembers only its latest record.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "registry.h"  // JDIRECT_EXPORT
#include "table_events.h"

namespace jdirect {
namespace {

struct StreamEvent {
  cudaStream_t stream;
  cudaEvent_t event;
};

struct Events {
  std::mutex mu;
  std::map<int32_t, std::vector<StreamEvent>> by_table;
};

Events& GetEvents() {
  static Events* e = new Events;  // leaked: handlers may run at shutdown
  return *e;
}

}  // namespace

xla::ffi::Error RecordTableRead(int32_t handle, cudaStream_t stream) {
  Events& ev = GetEvents();
  std::lock_guard<std::mutex> lock(ev.mu);
  std::vector<StreamEvent>& events = ev.by_table[handle];
  cudaEvent_t* event = nullptr;
  for (StreamEvent& se : events) {
    if (se.stream == stream) event = &se.event;
  }
  cudaError_t e = cudaSuccess;
  if (event == nullptr) {
    // Created on the current device, which is the stream's while XLA runs
    // the handler.
    cudaEvent_t created;
    e = cudaEventCreateWithFlags(&created, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      events.push_back(StreamEvent{stream, created});
      event = &events.back().event;
    }
  }
  if (e == cudaSuccess) e = cudaEventRecord(*event, stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return xla::ffi::Error::Internal(std::string("jdirect gather: recording the table's "
                                                 "event failed: ") + cudaGetErrorString(e));
  }
  return xla::ffi::Error::Success();
}

}  // namespace jdirect

// Waits until every gather recorded for `handle` has finished, then forgets
// its events. Called by close() after the registry has stopped new gathers
// (so no record can race with it). Returns 0, or 1 with `err` set; the
// events are destroyed either way.
extern "C" JDIRECT_EXPORT int32_t jdirect_cuda_table_wait(int32_t handle, char* err,
                                                          int64_t errlen) {
  std::vector<jdirect::StreamEvent> events;
  {
    jdirect::Events& ev = jdirect::GetEvents();
    std::lock_guard<std::mutex> lock(ev.mu);
    auto it = ev.by_table.find(handle);
    if (it == ev.by_table.end()) return 0;
    events = std::move(it->second);
    ev.by_table.erase(it);
  }
  int32_t status = 0;
  for (const jdirect::StreamEvent& se : events) {
    cudaError_t e = cudaEventSynchronize(se.event);
    if (e != cudaSuccess && status == 0) {
      if (err != nullptr && errlen > 0) {
        std::snprintf(err, static_cast<size_t>(errlen), "cudaEventSynchronize failed: %s (%d)",
                      cudaGetErrorString(e), static_cast<int>(e));
      }
      status = 1;
    }
    cudaEventDestroy(se.event);
  }
  cudaGetLastError();
  return status;
}
