#include "ops/cpu/thread_pool.h"

#include <algorithm>

namespace qhead::cpu {

namespace {
thread_local bool t_in_pool_task = false;
}  // namespace

ThreadPool::ThreadPool(int threads) {
  const int n = std::max(1, threads);
  shares_ = std::make_unique<Share[]>(static_cast<size_t>(n));
  workers_.reserve(static_cast<size_t>(n - 1));
  for (int w = 1; w < n; ++w) workers_.emplace_back([this, w] { worker_main(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
constexpr uint64_t pack(uint64_t lo, uint64_t hi) { return lo | (hi << 32); }
constexpr uint64_t lo_of(uint64_t v) { return v & 0xffffffffu; }
constexpr uint64_t hi_of(uint64_t v) { return v >> 32; }
}  // namespace

int64_t ThreadPool::next_contiguous(int worker) {
  const int n = size();
  for (int i = 0; i < n; ++i) {
    const int victim = (worker + i) % n;  // i == 0: the worker's own share, from the front
    std::atomic<uint64_t>& s = shares_[static_cast<size_t>(victim)].lohi;
    uint64_t cur = s.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t lo = lo_of(cur), hi = hi_of(cur);
      if (lo >= hi) break;
      const uint64_t want = i == 0 ? pack(lo + 1, hi) : pack(lo, hi - 1);
      if (s.compare_exchange_weak(cur, want, std::memory_order_relaxed)) return static_cast<int64_t>(i == 0 ? lo : hi - 1);
    }
  }
  return -1;
}

bool ThreadPool::run_task(int64_t task, int worker) {
  try {
    (*fn_)(task, worker);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
    failed_.store(true, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void ThreadPool::work(int worker) {
  const bool nested = t_in_pool_task;
  t_in_pool_task = true;
  for (;;) {
    if (failed_.load(std::memory_order_relaxed)) break;
    const int64_t task = schedule_ == Schedule::kContiguous ? next_contiguous(worker)
                                                            : next_.fetch_add(1, std::memory_order_relaxed);
    if (task < 0 || task >= n_tasks_) break;
    if (!run_task(task, worker)) break;
  }
  t_in_pool_task = nested;
}

void ThreadPool::worker_main(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work(worker);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t, int)>& fn, Schedule schedule) {
  if (n_tasks <= 0) return;
  if (t_in_pool_task || workers_.empty() || n_tasks == 1) {
    // Inline: a nested call, a one-thread pool, or nothing to share.
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  if (n_tasks > 0xffffffffLL) schedule = Schedule::kShared;  // the shares hold 32-bit task indices
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0, std::memory_order_relaxed);
    schedule_ = schedule;
    if (schedule == Schedule::kContiguous) {
      // The shares are set before the workers are woken (under mu_, which
      // they take before reading anything of this run).
      const int n = size();
      const uint64_t total = static_cast<uint64_t>(n_tasks);
      for (int w = 0; w < n; ++w)
        shares_[static_cast<size_t>(w)].lohi.store(pack(total * static_cast<uint64_t>(w) / static_cast<uint64_t>(n),
                                                        total * static_cast<uint64_t>(w + 1) / static_cast<uint64_t>(n)),
                                                   std::memory_order_relaxed);
    }
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  work(0);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_ == 0; });
    fn_ = nullptr;
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace qhead::cpu
