// A persistent thread pool for the CPU fast paths (internal).
//
// Created once (cpu_ops.cc keeps one per process, rebuilt only when the
// thread count changes); each run() hands tasks out dynamically through an
// atomic counter, so a core slowed by other work takes fewer tasks. The
// calling thread works too. Exceptions from a task are rethrown in the caller
// (the first one; the remaining tasks are skipped).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qhead::cpu {

class ThreadPool {
 public:
  // `threads` workers in all, the caller included (>= 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, worker) for every task in [0, n_tasks); worker in
  // [0, size()) identifies the thread (for per-thread scratch). Returns when
  // all tasks are done. Concurrent calls from different threads are
  // serialized; a call from inside a task runs inline on that thread.
  void run(int64_t n_tasks, const std::function<void(int64_t task, int worker)>& fn);

 private:
  void worker_main(int worker);
  void work(int worker);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one run() at a time

  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;  // bumped per run(); workers wait for a change
  bool stop_ = false;
  int active_ = 0;           // workers still inside the current run

  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace qhead::cpu
