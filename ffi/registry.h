// The registry of HostTables: maps an opaque handle to a host table's memory.
// Python owns the memory and its lifetime; compiled programs carry only the
// handle, so a table that was closed is reported, never read.
#ifndef JDIRECT_FFI_REGISTRY_H_
#define JDIRECT_FFI_REGISTRY_H_

#include <cstdint>
#include <string>

#if defined(_WIN32)
#define JDIRECT_EXPORT __declspec(dllexport)
#else
#define JDIRECT_EXPORT __attribute__((visibility("default")))
#endif

extern "C" {
// Records a table of `nrows` rows of `row_bytes` bytes at `data`, which
// jdirect.write_rows may write only if `writable` is nonzero. Returns a
// handle > 0; handles are never reused within a process.
JDIRECT_EXPORT int32_t jdirect_table_open(const void* data, int64_t nrows,
                                          int64_t row_bytes, int32_t writable);
// Marks the table closed, then waits until no handler holds it. Returns 0,
// or 1 when the handle is unknown or already closed.
JDIRECT_EXPORT int32_t jdirect_table_close(int32_t handle);
}

namespace jdirect {

struct TableView {
  const char* data = nullptr;
  int64_t nrows = 0;
  int64_t row_bytes = 0;
  bool writable = false;  // the owner's memory may be written (write_rows)
};

// Holds a registered table open for the duration of a handler call: close()
// waits for every lease to end before it returns.
class JDIRECT_EXPORT TableLease {
 public:
  // On failure, ok() is false and error() says why (unknown or closed).
  explicit TableLease(int32_t handle);
  ~TableLease();
  TableLease(const TableLease&) = delete;
  TableLease& operator=(const TableLease&) = delete;

  bool ok() const { return ok_; }
  const TableView& view() const { return view_; }
  const std::string& error() const { return error_; }

 private:
  int32_t handle_;
  bool ok_ = false;
  TableView view_;
  std::string error_;
};

}  // namespace jdirect

#endif  // JDIRECT_FFI_REGISTRY_H_
