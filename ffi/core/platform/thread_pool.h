// A persistent pool of worker threads that runs one parallel-for at a time. Kernels and
// decoders share it so no call spawns threads; the caller's thread takes part in the work.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "status.h"

namespace tbljax {

class ThreadPool {
 public:
  // num_threads counts the calling thread: a pool of 1 runs everything inline. The workers
  // carry `name` (its first 15 characters) where the OS names threads (Linux: top -H, ps -L,
  // /proc/PID/task/*/comm), so a process shows how many pools it runs.
  explicit ThreadPool(int num_threads, const char* name = kDefaultName);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, n), spread over the pool in chunks, and returns when all
  // are done. Calls from several threads at once are serialized.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  // The process-wide pool used by default; its size is set by TBLJAX_NUM_THREADS or the
  // number of CPUs this process may run on. Started on first use.
  static ThreadPool& Default();
  static int DefaultThreadCount();
  // The default pool if it has been started, else null (starts nothing).
  static ThreadPool* DefaultIfStarted();

  static constexpr const char* kDefaultName = "tbljax-pool";

 private:
  void WorkerLoop(const std::string& name);
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t next_ = 0;         // next index to hand out (guarded by mu_)
  int active_ = 0;           // workers still inside the current job
  uint64_t generation_ = 0;  // bumps once per job so workers wake exactly once
  bool stop_ = false;
};

// *pool, or the process-wide pool when null, started on first use. The OS may refuse threads
// (EAGAIN seen when another process held thousands): that is an IOError, not a throw.
Status DefaultPool(ThreadPool** pool);

}  // namespace tbljax
