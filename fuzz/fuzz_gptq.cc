// libFuzzer target: the tensors of a GPTQ checkpoint. The input is the
// model.safetensors of a directory whose config.json is fixed (Llama, vocab
// 64 x hidden 64, untied, GPTQ 4-bit group 32 asymmetric with the head
// quantized): inspect_model validates qweight/qzeros/scales/g_idx, then
// load_model_tables converts the head to the packed layout.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "qhead/model.h"

using namespace qhead;

namespace {

const char* kConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 64,
  "vocab_size": 64,
  "tie_word_embeddings": false,
  "quantization_config": {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 32,
    "sym": false,
    "desc_act": false,
    "lm_head": true
  }
})";

const fuzz::fs::path& model_dir() {
  static const fuzz::fs::path dir = [] {
    const fuzz::fs::path d = fuzz::scratch_dir() / "model";
    fuzz::fs::create_directories(d);
    const std::string c = kConfig;
    fuzz::write_file(d / "config.json", reinterpret_cast<const uint8_t*>(c.data()), c.size());
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::setenv("QHEAD_NUM_THREADS", "1", 1);  // one thread: deterministic coverage, no thread start per run
  (void)model_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::run_model_dir_input(model_dir(), "model.safetensors", data, size);
  return 0;
}
