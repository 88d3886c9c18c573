// qhead — command-line entry point. Parses arguments (CLI11) and turns any
// library error into a one-line message and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.h"
#include "qhead/error.h"

int main(int argc, char** argv) {
  using namespace qhead::cli;
  CLI::App app{"qhead: quantized LLM token tables (embedding + lm_head) in the compressed-tensors pack-quantized layout"};
  app.require_subcommand(1);

  InspectArgs ia;
  auto* inspect = app.add_subcommand(
      "inspect", "Validate a safetensors file and list its tensors and packed tables, or show a model directory's "
                 "embedding and head (architecture, tie, storage, bytes now and under --scheme)");
  inspect->add_option("file", ia.file, "safetensors file or Hugging Face model directory")->required();
  inspect->add_flag("--json", ia.json, "machine-readable output");
  inspect->add_option("--scheme", ia.scheme, "model directory or .gguf: scheme to size the table under (default w4g64)");
  inspect->add_option("--embedding-tensor", ia.embedding_tensor, "model directory: embedding weight name (override)");
  inspect->add_option("--head-tensor", ia.head_tensor, "model directory: head weight name (override)");

  QuantizeArgs qa;
  auto* quantize = app.add_subcommand(
      "quantize",
      "RTN-quantize into the compressed-tensors pack-quantized layout: one [V, H] tensor of a safetensors file "
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
  quantize->add_option("--embedding-tensor", qa.embedding_tensor, "model dir: embedding weight name (override)");
  quantize->add_option("--head-tensor", qa.head_tensor, "model dir: head weight name (override)");
  quantize->add_option("--scale-dtype", qa.scale_dtype,
                       "f16 | bf16 | f32 (default: the input's dtype; a requantized role's scale dtype)")
      ->check(CLI::IsMember({"f16", "bf16", "f32"}));
  quantize->add_option("--threads", qa.threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  quantize->add_flag("--json", qa.json, "machine-readable output (no progress bars)");

  DemoArgs da;
  auto* demo = app.add_subcommand(
      "demo", "The main job: quantize a deterministic Qwen3-0.6B-shaped table (151936 x 1024) to w4g64, "
              "inspect it and check every op against the reference");
  demo->add_option("--workdir", da.workdir, "directory for the files (default: a temporary directory)");
  demo->add_option("--threads", da.threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  demo->add_flag("--json", da.json, "machine-readable summary");
  demo->add_flag("--keep", da.keep, "keep the files written");

  BenchArgs ba;
  auto* bench = app.add_subcommand(
      "bench", "Time dense BLAS, dequant + BLAS fallback, fused logits and fused top-k on the same tables, "
               "against the memory read bandwidth measured in the same run");
  bench->add_option("--shape", ba.shapes, "VxH (repeatable or comma-separated); default: the five issue shapes");
  bench->add_option("--scheme", ba.schemes, "w4g64, w8g128, w4g128a, ... (repeatable or comma-separated)");
  bench->add_option("--m", ba.m, "activation rows per call, comma-separated (default 1,8,32,256)");
  bench->add_option("--threads", ba.threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  bench->add_option("--device", ba.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  bench->add_option("--k", ba.k, "top-k of the fused_topk path (default 50)")->check(CLI::PositiveNumber);
  bench->add_option("--reps", ba.reps, "timed calls per path (default: auto, >= 5, about 1 s)")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--act", ba.act,
                    "CUDA: activation dtype, also the scales' and the dense baseline's: f16 (default) | bf16")
      ->check(CLI::IsMember({"f16", "bf16"}));
  bench->add_flag("--json", ba.json, "a JSON array, one object per (shape, scheme, m, path)");
  bench->add_option("--tp", ba.tp,
                    "CUDA: shard the table by vocab rows over N GPUs (one process each, NCCL) and time the sharded "
                    "top-k step against one GPU (default shape 262144x2560 w4g128, M = 1)")
      ->check(CLI::PositiveNumber);

  TpRunArgs ta;
  auto* tprun = app.add_subcommand(
      "tp-run", "Run a command once per rank (one process per GPU) with QHEAD_TP_RANK/WORLD/DEVICE/ID_FILE and "
                "NCCL_NVLS_ENABLE=0 set; if one rank fails the others are stopped");
  tprun->add_option("-n", ta.n, "number of ranks")->required()->check(CLI::PositiveNumber);
  tprun->add_option("--devices", ta.devices, "CUDA device of each rank, comma-separated (default: rank r on device r)");
  tprun->add_option("--timeout", ta.timeout_s, "seconds before every rank is stopped (default: none)")
      ->check(CLI::NonNegativeNumber);
  tprun->add_option("command", ta.command, "the command and its arguments, after --")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*inspect) return run_inspect(ia);
    if (*quantize) return run_quantize(qa);
    if (*demo) return run_demo(da);
    if (*bench) return ba.tp > 0 ? run_bench_tp(ba) : run_bench(ba);
    if (*tprun) return run_tp(ta);
  } catch (const qhead::Error& e) {
    std::fprintf(stderr, "qhead: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qhead: error: %s\n", e.what());
    return 3;
  }
  return 1;
}
