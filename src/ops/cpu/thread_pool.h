// A persistent thread pool for the CPU fast paths (internal).
//
// Created once (cpu_ops.cc keeps one per process, rebuilt only when the
// thread count changes); each run() hands tasks out dynamically, so a core
// slowed by other work takes fewer tasks. Two schedules:
//   kShared      one atomic counter: tasks go out in order to whoever asks.
//   kContiguous  worker w owns the w-th contiguous share of the tasks and
//                runs it in order; a worker whose share is done takes tasks
//                from the END of the others' shares (one at a time). Each
//                worker thus reads one long run of consecutive table rows —
//                what the streaming prefetchers (and the kernels' software
//                prefetch, which runs ahead of the current task into the
//                next one) need — and the balance is still dynamic.
// The calling thread works too. Exceptions from a task are rethrown in the
// caller (the first one; the remaining tasks are skipped).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
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

  enum class Schedule { kShared, kContiguous };

  // Calls fn(task, worker) for every task in [0, n_tasks); worker in
  // [0, size()) identifies the thread (for per-thread scratch). Returns when
  // all tasks are done. Concurrent calls from different threads are
  // serialized; a call from inside a task runs inline on that thread.
  void run(int64_t n_tasks, const std::function<void(int64_t task, int worker)>& fn,
           Schedule schedule = Schedule::kShared);

 private:
  void worker_main(int worker);
  void work(int worker);
  // kContiguous: the next task of `worker` (its own share first, then stolen
  // from the back of the others'), or -1 when none is left.
  int64_t next_contiguous(int worker);
  bool run_task(int64_t task, int worker);  // false once a task has failed

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one run() at a time

  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;  // bumped per run(); workers wait for a change
  bool stop_ = false;
  int active_ = 0;           // workers still inside the current run

  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};  // kShared: the next task
  Schedule schedule_ = Schedule::kShared;
  // kContiguous: per worker the remaining share [lo, hi), packed into one
  // word (lo in the low 32 bits) so that the owner (taking lo) and thieves
  // (taking hi - 1) update it with one compare-exchange. One cache line each.
  struct alignas(64) Share {
    std::atomic<uint64_t> lohi{0};
  };
  std::unique_ptr<Share[]> shares_;
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace qhead::cpu
