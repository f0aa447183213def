#include "registry.h"

#include <condition_variable>
#include <mutex>
#include <unordered_map>

namespace jdirect {
namespace {

struct Entry {
  TableView view;
  int leases = 0;
  bool closing = false;  // no new leases once close() has begun
};

struct Registry {
  std::mutex mu;
  std::condition_variable released;
  std::unordered_map<int32_t, Entry> open;
  int32_t next = 1;
};

Registry& Get() {
  // Leaked on purpose: handlers may run during interpreter shutdown.
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

TableLease::TableLease(int32_t handle) : handle_(handle) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.open.find(handle);
  if (it == r.open.end() || it->second.closing) {
    error_ = "jdirect: HostTable #" + std::to_string(handle) +
             " is closed (or was never opened); a compiled function cannot "
             "read a table after close()";
    return;
  }
  ++it->second.leases;
  view_ = it->second.view;
  ok_ = true;
}

TableLease::~TableLease() {
  if (!ok_) return;
  Registry& r = Get();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.open.find(handle_);
    if (it != r.open.end()) --it->second.leases;
  }
  r.released.notify_all();
}

}  // namespace jdirect

extern "C" int32_t jdirect_table_open(const void* data, int64_t nrows,
                                      int64_t row_bytes, int32_t writable) {
  jdirect::Registry& r = jdirect::Get();
  std::lock_guard<std::mutex> lock(r.mu);
  int32_t h = r.next++;
  r.open[h].view = {static_cast<const char*>(data), nrows, row_bytes, writable != 0};
  return h;
}

extern "C" int32_t jdirect_table_close(int32_t handle) {
  jdirect::Registry& r = jdirect::Get();
  std::unique_lock<std::mutex> lock(r.mu);
  auto it = r.open.find(handle);
  if (it == r.open.end() || it->second.closing) return 1;
  it->second.closing = true;
  // Leases end after the handler has launched (GPU) or finished (CPU); the
  // caller then synchronises the devices before freeing the memory. Look the
  // entry up again on each wake: an insert may have rehashed the map.
  r.released.wait(lock, [&] { return r.open.at(handle).leases == 0; });
  r.open.erase(handle);
  return 0;
}
