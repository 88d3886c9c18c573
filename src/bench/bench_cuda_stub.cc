// run_cuda_bench for builds without CUDA (QHEAD_CUDA=OFF).
#include "bench/bench.h"
#include "qhead/error.h"

namespace qhead::bench {

std::vector<BenchRow> run_cuda_bench(const BenchConfig&) {
  throw Error(ErrorCode::kUnsupported, "bench", "built without CUDA");
}

}  // namespace qhead::bench
