// `qhead bench` in a build configured with QHEAD_BENCHMARKS=OFF.
#include "bench/bench.h"
#include "bench/bench_tp.h"
#include "qhead/error.h"

namespace qhead {
namespace {
[[noreturn]] void no_bench() {
  throw Error(ErrorCode::kUnsupported, "bench", "qhead was built without the benchmarks (QHEAD_BENCHMARKS=OFF)");
}
}  // namespace

namespace bench {
std::vector<BenchCase> default_cases() { no_bench(); }
std::vector<int64_t> default_m() { return {}; }
DeviceFacts describe_cpu(int) { no_bench(); }
DeviceFacts describe_cuda() { no_bench(); }
std::vector<BenchRow> run_cpu_bench(const BenchConfig&) { no_bench(); }
std::vector<BenchRow> run_cuda_bench(const BenchConfig&) { no_bench(); }
}  // namespace bench

namespace dist {
std::vector<bench::BenchRow> run_tp_bench(const bench::BenchConfig&, const Comm&) { no_bench(); }
}  // namespace dist
}  // namespace qhead
