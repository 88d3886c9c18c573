// core/parallel.h — a minimal parallel-for over index ranges (internal).
//
// The reference ops, the quantizer and the GGUF dequantizer split work over
// vocab rows with it. Threads are started per call: these are not the hot
// kernels, whose fast paths run on the persistent pool of
// src/ops/cpu/thread_pool.cc. Exceptions thrown by a worker are rethrown in
// the caller.
#pragma once

#include <cstdint>
#include <functional>

#include "qhead/ops.h"  // default_num_threads()

namespace qhead {

// Calls fn(begin, end) on disjoint chunks covering [0, n), on up to
// `threads` threads (<= 0: default_num_threads()). Chunks are at least
// `min_chunk` long so tiny jobs stay on the calling thread.
void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn,
                  int threads = 0);

}  // namespace qhead
