// qhead/parallel.h — a minimal parallel-for over index ranges.
//
// The reference ops and the quantizer split work over vocab rows. Threads are
// started per call here (these are not the hot kernels; the CPU fast path
// issue brings a persistent pool). Exceptions thrown by a worker are
// rethrown in the caller.
#pragma once

#include <cstdint>
#include <functional>

namespace qhead {

// Default worker count: hardware threads (at least 1), or QHEAD_NUM_THREADS.
int default_num_threads();

// Calls fn(begin, end) on disjoint chunks covering [0, n), on up to
// `threads` threads (<= 0: default_num_threads()). Chunks are at least
// `min_chunk` long so tiny jobs stay on the calling thread.
void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn,
                  int threads = 0);

}  // namespace qhead
