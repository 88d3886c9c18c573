// qhead — command-line entry point. Parses arguments (CLI11) and turns every
// error into one line on stderr (or, under --json, an error object on stdout)
// and the exit status of its kind (usage.h; README "Exit codes").
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <new>
#include <utility>
#include <vector>

#include "commands.h"
#include "qhead/error.h"
#include "usage.h"
#include "version.h"

namespace {

using namespace qhead::cli;

// One error, reported as the command line promises: under --json one object
// {"error": {"code", "message"}} on stdout (the stream a --json caller
// parses), else `line` on stderr. Returns the exit status.
int report(bool json, const char* code, const std::string& message, const std::string& line, int status) {
  if (json) {
    const nlohmann::json j = {{"error", {{"code", code}, {"message", message}}}};
    std::clearerr(stdout);
    std::fprintf(stdout, "%s\n", j.dump(2).c_str());
    if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  }
  std::fprintf(stderr, "%s\n", line.c_str());  // also when stdout cannot take the JSON
  return status;
}

// The commands the Python package implements: name -> module.
struct PythonCommand {
  const char* name;
  const char* module;
  const char* help;
};
constexpr PythonCommand kPythonCommands[] = {
    {"generate", "qhead.generate",
     "Greedy generation with the dense and the quantized token table, batch 1: texts, first differing token, "
     "tokens/s, the head's share and bytes per step (runs python -m qhead.generate; QHEAD_PYTHON names the Python)"},
    {"agree", "qhead.agree",
     "Top-1 agreement of quantized heads with the dense model on real decode states, with intervals and "
     "rescoring (runs python -m qhead.agree; QHEAD_PYTHON names the Python)"},
};

int run(int argc, char** argv) {
  // A Python command gets every argument after its name unchanged: nothing here
  // parses them (`qhead generate --help` is the Python CLI's help).
  if (argc >= 2)
    for (const PythonCommand& c : kPythonCommands)
      if (std::strcmp(argv[1], c.name) == 0) return run_python_module(c.name, c.module, {argv + 2, argv + argc});

  CLI::App app{"qhead: quantized LLM token tables (embedding + lm_head) in the compressed-tensors pack-quantized layout"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_line(), "print the version and the commit it was built from, and exit");
  constexpr int64_t kInt = std::numeric_limits<int32_t>::max();
  const CLI::Validator kThreads = int_range(0, 1024, "0: all cores");

  InspectArgs ia;
  auto* inspect = app.add_subcommand(
      "inspect", "Validate a safetensors file and list its tensors and packed tables, or show a model directory's "
                 "or a .gguf file's embedding and head (architecture, tie, storage, bytes now and under --scheme)");
  inspect->add_option("file", ia.file, "safetensors file, Hugging Face model directory or .gguf file")->required();
  inspect->add_flag("--json", ia.json, "machine-readable output");
  inspect->add_option("--scheme", ia.scheme, "model directory or .gguf: scheme to size the table under (default w4g64)");
  inspect->add_option("--embedding-tensor", ia.embedding_tensor, "model directory: embedding weight name (override)");
  inspect->add_option("--head-tensor", ia.head_tensor, "model directory: head weight name (override)");

  QuantizeArgs qa;
  auto* quantize = app.add_subcommand(
      "quantize",
      "Quantize (RTN, MSE search or GPTQ) into the compressed-tensors pack-quantized layout: one [V, H] tensor of "
      "a safetensors file "
      "(IN FILE --tensor NAME --scheme S -o OUT), or a Hugging Face model directory's embedding and head "
      "(MODEL_DIR --embedding S --head S -o OUT_DIR: a compressed-tensors model directory, checked after writing)");
  quantize->add_option("input", qa.input, "input safetensors file, or model directory")->required();
  quantize->add_option("-o,--output", qa.output, "output file, or output directory (never the input)")->required();
  quantize->add_option("--tensor", qa.tensor, "file: name of the dense [V, H] tensor, e.g. lm_head.weight");
  quantize->add_option("--scheme", qa.scheme, "file: w<bits>[g<32|64|128|256>][a]: w4g64, w8, w4g128a");
  quantize->add_option("--embedding", qa.embedding, "model dir: scheme for the embedding (tied: the shared table)");
  quantize->add_option("--head", qa.head, "model dir: scheme for the head (tied: the shared table)");
  quantize->add_flag("--requantize", qa.requantize,
                     "model dir: quantize a role that is already packed, from its dequantized values");
  quantize->add_flag("--mixed-schemes", qa.mixed_schemes,
                     "model dir: allow config groups with different weight schemes (read by compressed-tensors' "
                     "ModelCompressor; transformers reads every module with the first group's scheme)");
  quantize->add_flag("--force", qa.force, "model dir: replace an existing non-empty output directory");
  quantize->add_flag("--untie", qa.untie,
                     "model dir, tied model: write two tables, the head (--head, required) with --quantizer and the "
                     "embedding with --embedding or kept as stored; config.json gets tie_word_embeddings false");
  quantize->add_option("--embedding-tensor", qa.embedding_tensor, "model dir: embedding weight name (override)");
  quantize->add_option("--head-tensor", qa.head_tensor, "model dir: head weight name (override)");
  quantize->add_option("--scale-dtype", qa.scale_dtype,
                       "f16 | bf16 | f32 (default: the input's dtype; a requantized role's scale dtype)")
      ->check(CLI::IsMember({"f16", "bf16", "f32"}));
  quantize->add_option("--quantizer", qa.quantizer,
                       "rtn (round to nearest, default) | mse (per-group scale/clip search; weighted by the "
                       "calibration when given) | gptq | gptq-mse (GPTQ against the calibration's X^T X; model dir: "
                       "the head or tied table, an untied embedding gets rtn / mse)")
      ->check(CLI::IsMember({"rtn", "mse", "gptq", "gptq-mse"}));
  quantize->add_option("--calibration", qa.calibration,
                       "STATES.safetensors[:TENSOR]: the head's inputs [N, H] (default tensor 'hidden', as qhead "
                       "agree's states files hold them; else the file's only 2-D tensor); required by gptq");
  quantize->add_option("--damp", qa.damp,
                       "with --calibration: GPTQ's damping, a fraction of mean(diag X^T X / N) added to the "
                       "diagonal (also the weighted MSE search's floor; default 0.1)");
  quantize->add_option("--threads", qa.threads, "worker threads (default 0: all cores)")->check(kThreads);
  quantize->add_flag("--json", qa.json, "machine-readable output (no progress bars)");

  DemoArgs da;
  auto* demo = app.add_subcommand(
      "demo", "The main job: quantize a deterministic Qwen3-0.6B-shaped table (151936 x 1024) to w4g64, "
              "inspect it and check every op against the reference");
  demo->add_option("--workdir", da.workdir, "directory for the files (default: a temporary directory)");
  demo->add_option("--threads", da.threads, "worker threads (default 0: all cores)")->check(kThreads);
  demo->add_flag("--json", da.json, "machine-readable summary");
  demo->add_flag("--keep", da.keep, "keep the files written");

  BenchArgs ba;
  auto* bench = app.add_subcommand(
      "bench", "Time dense BLAS, dequant + BLAS fallback, fused logits and fused top-k on the same tables, "
               "against the memory read bandwidth measured in the same run; ends with a verdict line per shape and "
               "scheme (fused at M = 1: its fraction of the ceiling and its speed-up over the best baseline)");
  bench->add_option("--shape", ba.shapes, "VxH (repeatable or comma-separated); default: five real-model shapes")
      ->check(shape_list());
  bench->add_option("--scheme", ba.schemes, "w4g64, w8g128, w4g128a, ... (repeatable or comma-separated)");
  bench->add_option("--m", ba.m, "activation rows per call, comma-separated (default 1,8,32,256)")
      ->check(int_list(1, 65536));
  bench->add_option("--threads", ba.threads, "worker threads (default 0: all cores)")->check(kThreads);
  bench->add_option("--device", ba.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  bench->add_option("--k", ba.k, "top-k of the fused_topk path (default 50)")->check(int_range(1, kInt));
  bench->add_option("--reps", ba.reps, "timed calls per path (default: auto, at least 5, about 1 s, at most 50)")
      ->check(int_range(1, 1000000));
  bench->add_option("--act", ba.act,
                    "CUDA: activation dtype, also the scales' and the dense baseline's: f16 (default) | bf16")
      ->check(CLI::IsMember({"f16", "bf16"}));
  bench->add_option("--isa", ba.isa,
                    "CPU: the kernels' ISA path, auto (default: the best this CPU has) | avx2 | avx512 | reference")
      ->check(CLI::IsMember({"auto", "avx2", "avx512", "reference"}));
  bench->add_flag("--json", ba.json, "a JSON array, one object per (shape, scheme, m, path)");
  bench->add_flag("--plan-env", ba.plan_env,
                  "CUDA: every row's kernel plan takes the QHEAD_CUDA_* overrides of the environment (an A/B of a "
                  "switch in one binary; the rows' notes name the plan); without it the rows take the plan's own "
                  "choice and the environment is ignored");
  bench->add_option("--tp", ba.tp,
                    "CUDA: shard the table by vocab rows over N GPUs (one process each, NCCL) and time the sharded "
                    "top-k step against one GPU (default shape 262144x2560 w4g128, M = 1)")
      ->check(int_range(1, 1024));

  TpRunArgs ta;
  auto* tprun = app.add_subcommand(
      "tp-run", "Run a command once per rank (one process per GPU) with QHEAD_TP_RANK/WORLD/DEVICE/ID_FILE and "
                "NCCL_NVLS_ENABLE=0 set; if one rank fails the others are stopped");
  tprun->add_option("-n", ta.n, "number of ranks")->required()->check(int_range(1, 1024));
  tprun->add_option("--devices", ta.devices, "CUDA device of each rank, comma-separated (default: rank r on device r)")
      ->check(int_list(0, 1023));
  tprun->add_option("--timeout", ta.timeout_s, "seconds before every rank is stopped (default 0: none)")
      ->check(int_range(0, kInt, "0: none"));
  tprun->add_option("command", ta.command, "the command and its arguments, after --")->required();

  // Listed in --help; their arguments are never parsed here (prefix_command:
  // everything after the name is left for the Python command).
  std::vector<std::pair<CLI::App*, const PythonCommand*>> python_commands;
  for (const PythonCommand& c : kPythonCommands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help)->prefix_command()->allow_extras();
    sub->set_help_flag();
    python_commands.emplace_back(sub, &c);
  }

  check_names(app, argc, argv);  // an unknown option or command first, with the nearest valid name
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    throw usage_error(app, argc, argv, e);
  }
  ba.command = command_line(argc, argv);
  int status = kExitOk;
  if (*inspect)
    status = run_inspect(ia);
  else if (*quantize)
    status = run_quantize(qa);
  else if (*demo)
    status = run_demo(da);
  else if (*bench)
    status = ba.tp > 0 ? run_bench_tp(ba) : run_bench(ba);
  else if (*tprun)
    status = run_tp(ta);
  else if (auto it = std::find_if(python_commands.begin(), python_commands.end(), [](const auto& p) { return bool(*p.first); });
           it != python_commands.end())
    status = run_python_module(it->second->name, it->second->module, it->first->remaining());
  else
    throw UsageError("qhead", "a command is required (qhead --help)");
  // Output that did not reach its file (a full disk, a closed pipe) is an
  // I/O error, not a success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw qhead::Error(qhead::ErrorCode::kIo, "stdout", std::string("cannot write the output: ") + std::strerror(errno));
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = json_requested(argc, argv);
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    return report(json, "invalid_argument", e.what(), e.what(), kExitUsage);
  } catch (const qhead::Error& e) {
    return report(json, error_code_name(e.code()), e.what(), std::string("qhead: error: ") + e.what(), exit_status(e.code()));
  } catch (const std::bad_alloc& e) {
    return report(json, "internal", std::string("out of memory (") + e.what() + ")",
                  std::string("qhead: internal error: out of memory (") + e.what() + ")", kExitInternal);
  } catch (const std::exception& e) {
    if (std::ferror(stdout)) {  // the output did not reach its file (fmt throws when a write fails)
      const std::string what = std::string("stdout: cannot write the output: ") + e.what();
      return report(json, "io", what, "qhead: error: " + what, kExitIo);
    }
    return report(json, "internal", e.what(), std::string("qhead: internal error: ") + e.what(), kExitInternal);
  } catch (...) {
    return report(json, "internal", "an exception that is not a std::exception",
                  "qhead: internal error: an exception that is not a std::exception", kExitInternal);
  }
}
