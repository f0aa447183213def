// Host threads that gather rows (host_gather.h): one pool for the process,
// woken once a call. Each thread takes chunks of rows from a shared counter
// until none is left, so a thread the OS preempts (XLA's, the driver's run
// beside it) delays only its own chunk, not a fixed share of the rows.
#include "host_gather.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace jdirect {
namespace {

// Rows a chunk takes: about 64 KB, at least one row, at most 4,096 rows.
constexpr int64_t kChunkBytes = 64 << 10;
constexpr int64_t kMaxChunkRows = 4096;
constexpr int kMaxThreads = 15;

int DefaultThreads() {
  // A count >= 0; anything else is refused by Python before a read asks
  // for the pool (jdirect/_read_policy.py), and here means the default.
  if (const char* env = std::getenv("JDIRECT_GATHER_THREADS"); env != nullptr && *env) {
    char* end = nullptr;
    const long asked = std::strtol(env, &end, 10);
    if (*end == '\0' && asked >= 0) return static_cast<int>(std::min<long>(asked, 256));
  }
  cpu_set_t set;
  int cpus = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cpus - 1, 1, kMaxThreads);
}

class Pool {
 public:
  explicit Pool(int threads) {
    for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { Loop(); });
  }

  // Runs body(c) for every chunk c in [0, chunks) on the pool and the
  // calling thread.
  template <typename Body>
  void Run(int64_t chunks, const Body& body) {
    std::lock_guard<std::mutex> one_at_a_time(run_mu_);
    Job job{chunks, [&body](int64_t c) { body(c); }};
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    Work(job);
    std::unique_lock<std::mutex> l(mu_);
    job_ = nullptr;  // no thread joins it from now on
    idle_.wait(l, [&job] { return job.joined == 0; });
  }

 private:
  struct Job {
    int64_t chunks;
    std::function<void(int64_t)> body;
    std::atomic<int64_t> next{0};
    int joined = 0;  // threads working on it, under mu_
  };

  static void Work(Job& job) {
    for (int64_t c; (c = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) {
      job.body(c);
    }
  }

  void Loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      wake_.wait(l, [&] { return job_ != nullptr && generation_ != seen; });
      seen = generation_;
      Job* job = job_;
      ++job->joined;
      l.unlock();
      Work(*job);
      l.lock();
      if (--job->joined == 0) idle_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_mu_, mu_;
  std::condition_variable wake_, idle_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
};

Pool& ThePool() {
  // Leaked: its threads wait for work until the process exits, and a
  // handler may still gather while static objects are destroyed.
  static Pool* pool = new Pool(DefaultThreads());
  return *pool;
}

template <typename I>
void GatherRows(const GatherArgs& a, const I* idx, char* out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t r = ResolveRow(idx[i], a.nrows, a.mode);
    char* dst = out + i * a.row_bytes;
    if (r >= 0) {
      std::memcpy(dst, RowAddress(a.table, r, a.row_bytes, a.cache), a.row_bytes);
      continue;
    }
    // Byte k of a filled row is the pattern's byte k % 16 (index.h).
    char pattern[16];
    std::memcpy(pattern, &a.fill.lo, 8);
    std::memcpy(pattern + 8, &a.fill.hi, 8);
    for (int64_t k = 0; k < a.row_bytes; k += 16) {
      std::memcpy(dst + k, pattern, static_cast<size_t>(std::min<int64_t>(16, a.row_bytes - k)));
    }
  }
}

}  // namespace

void GatherRowsOnHost(const GatherArgs& a, const void* idx, char* out, int64_t begin,
                      int64_t end) {
  if (a.idx64) {
    GatherRows(a, static_cast<const int64_t*>(idx), out, begin, end);
  } else {
    GatherRows(a, static_cast<const int32_t*>(idx), out, begin, end);
  }
}

void GatherRowsOnThreads(const GatherArgs& a, const void* idx, char* out, int64_t begin,
                         int64_t end) {
  if (end <= begin || a.row_bytes <= 0) return;
  const int64_t per = std::clamp<int64_t>(kChunkBytes / a.row_bytes, 1, kMaxChunkRows);
  const int64_t chunks = (end - begin + per - 1) / per;
  if (chunks == 1) return GatherRowsOnHost(a, idx, out, begin, end);
  ThePool().Run(chunks, [&](int64_t c) {
    const int64_t first = begin + c * per;
    GatherRowsOnHost(a, idx, out, first, std::min(end, first + per));
  });
}

}  // namespace jdirect
