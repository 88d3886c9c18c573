// run_tp_bench for builds without NCCL.
#include "bench/bench_tp.h"
#include "qhead/error.h"

namespace qhead::dist {

std::vector<bench::BenchRow> run_tp_bench(const bench::BenchConfig&, const Comm&) {
  throw Error(ErrorCode::kUnsupported, "bench.tp", "qhead was built without NCCL (the vocab-parallel head needs it)");
}

}  // namespace qhead::dist
