// Persistent thread pool (see thread_pool.h).
#include "thread_pool.h"

#include <exception>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <system_error>

namespace tbljax {

namespace {
std::atomic<ThreadPool*> g_default{nullptr};
}  // namespace

ThreadPool::ThreadPool(int num_threads, const char* name) {
  for (int i = 1; i < std::max(1, num_threads); ++i) {
    try {
      // Linux takes at most 15 characters; each worker holds its own copy of the name.
      workers_.emplace_back([this, n = std::string(name).substr(0, 15)] { WorkerLoop(n); });
    } catch (const std::system_error&) {
      break;  // the OS refused another thread: run with the ones we have (the caller helps too)
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  for (;;) {
    int64_t begin, end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_ >= n_) return;
      begin = next_;
      // At most n / 16 per thread (small chunks balance uneven work, JPEG decodes, and a
      // thread the OS descheduled: whoever runs takes the next), and shrinking with what is
      // left down to single items, so that the threads finish together. Fixed chunks left one
      // thread idle for half a chunk on average at the end of every job: 4 images, ~1 ms, per
      // 256-image batch of compact records on 2 threads.
      const int64_t left = n_ - begin, t = num_threads();
      end = begin + std::clamp<int64_t>(left / (2 * t), 1, std::max<int64_t>(1, n_ / (16 * t)));
      next_ = end;
    }
    for (int64_t i = begin; i < end; ++i) (*fn_)(i);
  }
}

void ThreadPool::WorkerLoop(const std::string& name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name.c_str());
#else
  (void)name;
#endif
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return active_ == 0; });
  fn_ = nullptr;
}

int ThreadPool::DefaultThreadCount() {
  if (const char* env = std::getenv("TBLJAX_NUM_THREADS")) {
    int v = std::atoi(env);
    if (v > 0) return v;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& ThreadPool::Default() {
  // Leaked on purpose: joining threads during static destruction at exit can deadlock.
  static ThreadPool* pool = [] {
    auto* p = new ThreadPool(DefaultThreadCount());
    g_default.store(p, std::memory_order_release);
    return p;
  }();
  return *pool;
}

ThreadPool* ThreadPool::DefaultIfStarted() { return g_default.load(std::memory_order_acquire); }

Status DefaultPool(ThreadPool** pool) {
  if (*pool != nullptr) return Status::Ok();
  try {
    *pool = &ThreadPool::Default();
  } catch (const std::exception& e) {
    return IOError(std::string("could not start the kernel's thread pool: ") + e.what());
  }
  return Status::Ok();
}

}  // namespace tbljax
