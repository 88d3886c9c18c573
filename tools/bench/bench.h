// qhead bench — the measurements behind `qhead bench` (tools/bench/: a tool
// that links the library, not part of it; the CLI prints its rows).
//
// One run measures, for each (shape, scheme, M), every path a user could take
// — dense BLAS on the full-precision table, fallback (dequantize + BLAS),
// fused logits, fused top-k — as the median µs per call after warm-up, and
// judges it against a ceiling measured in the same run (memory read
// bandwidth on the CPU). Caches are defeated by rotating among enough copies
// of the table that their total is at least twice the last-level cache, or
// the row says that the shape fits in cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace qhead::bench {

struct BenchCase {
  int64_t vocab = 0;   // V
  int64_t hidden = 0;  // H
  std::string scheme;  // a `qhead quantize` scheme name: "w4g64", "w8g128", "w4g128a"
};

// The default activation rows per call: 1, 8, 32, 256 (tests/cases.h, bench_m).
std::vector<int64_t> default_m();

struct BenchConfig {
  std::vector<BenchCase> cases;            // (shape, scheme) pairs, in output order
  std::vector<int64_t> m = default_m();    // activation rows per call
  int threads = 0;                         // 0: all cores (CPU) / ignored (CUDA)
  std::string device = "cpu";              // "cpu" | "cuda"
  int64_t k = 50;                          // top-k
  bool json = false;                       // output format (the CLI's business)
  int reps = 0;                            // timed calls per path; 0: auto (>= 5, about 1 s, at most 50)
  std::string act = "f16";                 // CUDA: activations, scales and the dense baseline, f16 | bf16
  std::string isa = "auto";                // CPU: the kernels' ISA path, auto | avx2 | avx512 | reference
  bool plan_env = false;                   // CUDA: the plans take the QHEAD_CUDA_* environment overrides
};

// The default cases, five real-model shapes: 151936x1024 (w4g64, w8g128),
// 50304x512 (w4g64), 128256x4096 (w4g128), 262144x640 (w4g64).
std::vector<BenchCase> default_cases();

// One measurement. JSON field names are stable (scripts depend on them):
// shape, scheme, m, path, us_median, gbps, bw_fraction, speedup_vs_dense,
// and, when known, kernel, read_ceiling_fraction, matrix_fraction, note. A baseline
// the run cannot measure is one run-level row (shape "", measured = false)
// whose note says why.
struct BenchRow {
  std::string shape;   // "151936x1024" ("" for the ceiling row)
  std::string scheme;  // "w4g64" ("" for the ceiling row)
  int64_t m = 0;
  std::string path;    // "dense", "fallback", "fused", "fused_topk", "ceiling" (read bandwidth),
                       // "compute_ceiling" (CPU: f32 FMA rate), + device-specific extras
                       // (CPU: "dense_bf16" / "dense_f16", the half-precision dense baselines;
                       // "fused_int8", the opt-in int8-activation mode, where VNNI exists)
  bool measured = true;  // false: a baseline this run cannot measure (the note says why)
  double us_median = 0.0;         // median µs per call
  double gbps = 0.0;              // table bytes read per call / time (the ceiling row: the measured bandwidth)
  double bw_fraction = 0.0;       // gbps / measured read bandwidth of the same run
  double speedup_vs_dense = 0.0;  // dense µs / this path's µs (0 when no dense row)
  std::optional<double> read_ceiling_fraction;  // device-specific: fraction of a measured read ceiling
  std::optional<double> matrix_fraction;        // device-specific: fraction of a measured matrix-unit rate
  // A path that changes the arithmetic (CPU "fused_int8": int8 activations)
  // against the exact fused path on the same table and x: the largest
  // |logit difference| and the largest |logit| of the exact path.
  std::optional<double> max_abs_err;
  std::optional<double> max_abs_logit;
  // CUDA: the median µs the call took on the CPU (what the event timing includes before its
  // first kernel starts: argument checks, dispatch, launches).
  std::optional<double> host_us;
  std::string act;  // CUDA: the activation dtype of the row ("f16", "bf16"); "" for the CPU's f32
  std::string kernel;  // CUDA: the kernel that ran (cuda_plan::logits_kernel_name; top-k: "path:kernel")
  std::string note;               // cache residency, copies rotated, caveats
};

// What the run measured on, as (key, value) pairs for the JSON's "device":
// CUDA: name, compute capability, multiprocessors, memory, driver and
// runtime versions, clocks as found; CPU: model, ISA the kernels use, threads.
using DeviceFacts = std::vector<std::pair<std::string, std::string>>;
DeviceFacts describe_cpu(int threads);
DeviceFacts describe_cuda();

std::vector<BenchRow> run_cpu_bench(const BenchConfig& cfg);
// Built with CUDA: src/cuda/; without: throws Error(kUnsupported, "bench", "built without CUDA").
std::vector<BenchRow> run_cuda_bench(const BenchConfig& cfg);

}  // namespace qhead::bench
