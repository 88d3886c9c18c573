// The qhead command-line tool: one function per subcommand. Each returns the
// process exit status; qhead::Error escapes to main(), which prints one line
// and exits non-zero.
#pragma once

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include <optional>
#include <string>
#include <vector>

namespace qhead::bench {
struct BenchRow;
}

namespace qhead::cli {

struct InspectArgs {
  std::string file;  // a safetensors file, or a model directory
  bool json = false;
  // Model directories only: the scheme to size the table under, and explicit
  // role tensor names for architectures qhead does not know.
  std::string scheme = "w4g64";
  std::string embedding_tensor = "";
  std::string head_tensor = "";
};
int run_inspect(const InspectArgs& a);

// qhead quantize: one tensor of a safetensors file (input is a file: --tensor,
// --scheme), or a model directory's roles (input is a directory: --embedding
// and/or --head; qhead/model_write.h).
struct QuantizeArgs {
  std::string input;
  std::string tensor;  // file mode
  std::string scheme;  // file mode
  std::string output;
  std::optional<std::string> scale_dtype;  // "f16" | "bf16" | "f32"; default: the input's
  int threads = 0;
  bool json = false;
  std::string quantizer = "rtn";  // rtn | mse | gptq | gptq-mse
  std::string calibration = "";   // FILE[:TENSOR], [N, H] activations (required by gptq)
  std::optional<double> damp = std::nullopt;  // GPTQ damping (default: QuantizeOptions's)
  // Model-directory mode.
  std::optional<std::string> embedding = std::nullopt;  // scheme for the embedding
  std::optional<std::string> head = std::nullopt;       // scheme for the head
  bool requantize = false;               // allow a scheme on an already quantized role
  bool mixed_schemes = false;            // allow config groups with different weight schemes
  bool force = false;                    // replace a non-empty output directory
  bool untie = false;                    // a tied model written as two tables
  std::string embedding_tensor = "";     // role tensor overrides
  std::string head_tensor = "";
};
int run_quantize(const QuantizeArgs& a);
// The work of `qhead quantize` in file mode without printing; its JSON summary.
nlohmann::json quantize_file(const QuantizeArgs& a);
// The work of `qhead quantize` in model-directory mode (progress bars when
// `progress` and stderr is a terminal); its JSON summary.
nlohmann::json quantize_model_dir(const QuantizeArgs& a, bool progress);

struct DemoArgs {
  std::string workdir;  // where the dense and packed files go (default: temp dir)
  int threads = 0;
  bool json = false;
  bool keep = false;
};
int run_demo(const DemoArgs& a);

struct BenchArgs {
  std::vector<std::string> shapes;   // "VxH" (each may be a comma list); default: bench::default_cases()
  std::vector<std::string> schemes;  // "w4g64" (each may be a comma list)
  std::string m;                     // "1,8,32,256" (default)
  int threads = 0;                   // 0: all cores
  std::string device = "cpu";        // cpu | cuda
  int64_t k = 50;
  int reps = 0;                      // 0: auto (scaled with the shape)
  bool json = false;
  int tp = 0;                        // > 0: the vocab-parallel head over this many GPUs (cmd_tp.cc)
  std::string act;                   // CUDA: f16 (default) | bf16
  std::string isa;                   // CPU: auto (default) | avx2 | avx512 | reference
  bool plan_env = false;             // CUDA: the rows' plans take the QHEAD_CUDA_* environment overrides
  std::string command;               // the command line, as the JSON rows record it
};
int run_bench(const BenchArgs& a);
// qhead bench --device cuda --tp N: starts N ranks (tp-run) unless inside one; rank 0 prints.
int run_bench_tp(const BenchArgs& a);

// qhead tp-run -n N [--devices 0,1] -- CMD ARGS...: one process per rank (qhead/dist.h launch).
struct TpRunArgs {
  int n = 0;
  std::string devices;               // "0,1": CUDA device per rank; default rank r on device r
  int timeout_s = 0;                 // 0: no limit
  std::vector<std::string> command;
};
int run_tp(const TpRunArgs& a);

// qhead generate / qhead agree (cmd_python.cc): execs the Python named by
// $QHEAD_PYTHON (default python3 on PATH) on `-m <module> ARGS...`, ARGS as
// given; returns only when the exec failed (after saying so on stderr).
int run_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args);

// Shared by the commands: "1.23 MB".
std::string human_bytes(double bytes);
// The non-empty pieces of s between separators (list flags: --m 1,8 --shape A,B).
std::vector<std::string> split(const std::string& s, char sep);
// What makes a benchmark row reproducible: the device, the exact command and
// the date (UTC), beside the version and commit of the binary (version.h).
struct BenchContext {
  std::string device;   // "cpu: AMD EPYC 9454, 2 threads" | "cuda: NVIDIA H200"
  bench::DeviceFacts facts;  // the device in detail (bench::describe_cpu / describe_cuda)
  std::string command;  // the command line, shell-quoted
  std::string date;     // "2026-01-31T12:00:00Z"
};
BenchContext bench_context(const BenchArgs& a);
// One benchmark row as the stable `--json` object (`qhead bench`, `qhead bench --tp`).
nlohmann::json bench_row_json(const bench::BenchRow& r);
// The document `--json` prints: {"qhead": {"version", "commit"}, "device": {...},
// "command", "date", "rows": [...]} — every file a run writes describes itself.
nlohmann::json bench_document(const BenchContext& ctx, nlohmann::json rows);

// Whether `p` is a directory; a path stat cannot resolve (a link loop, no
// permission) is a qhead::Error (kIo), not a std::filesystem exception.
bool is_directory_checked(const std::string& p);

}  // namespace qhead::cli
