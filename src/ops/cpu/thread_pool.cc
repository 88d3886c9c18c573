#include "ops/cpu/thread_pool.h"

#include <algorithm>

namespace qhead::cpu {

namespace {
thread_local bool t_in_pool_task = false;
}  // namespace

ThreadPool::ThreadPool(int threads) {
  const int n = std::max(1, threads);
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

void ThreadPool::work(int worker) {
  const bool nested = t_in_pool_task;
  t_in_pool_task = true;
  for (;;) {
    if (failed_.load(std::memory_order_relaxed)) break;
    const int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    try {
      (*fn_)(task, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
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

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  if (t_in_pool_task || workers_.empty() || n_tasks == 1) {
    // Inline: a nested call, a one-thread pool, or nothing to share.
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0, std::memory_order_relaxed);
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
