// The CUDA bench in builds without CUDA (QHEAD_CUDA=OFF).
#include "bench/bench.h"
#include "qhead/error.h"

namespace qhead::bench {

DeviceFacts describe_cuda() { return {}; }

std::vector<BenchRow> run_cuda_bench(const BenchConfig&) {
  throw Error(ErrorCode::kUnsupported, "bench", "built without CUDA");
}

}  // namespace qhead::bench
