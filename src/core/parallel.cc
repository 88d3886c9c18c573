#include "core/parallel.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qhead {

int default_num_threads() {
  if (const char* env = std::getenv("QHEAD_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn,
                  int threads) {
  if (n <= 0) return;
  if (threads <= 0) threads = default_num_threads();
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int64_t workers = std::min<int64_t>(threads, (n + min_chunk - 1) / min_chunk);
  if (workers <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + workers - 1) / workers;
  std::exception_ptr first_error;
  std::mutex mu;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers - 1));
  auto run = [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first_error) first_error = std::current_exception();
    }
  };
  for (int64_t w = 1; w < workers; ++w) {
    const int64_t b = w * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back(run, b, e);
  }
  run(0, std::min(n, chunk));
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace qhead
