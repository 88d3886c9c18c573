// libFuzzer target: a model directory's config.json (architecture, sizes,
// tie, quantization_config) next to a fixed compressed-tensors checkpoint
// (tests/fixtures/ct_models/untied/model.safetensors): inspect_model, then
// load_model_tables when inspection accepts it.
#include <cstdint>

#include "fuzz_common.h"
#include "qhead/model.h"

using namespace qhead;

namespace {

const fuzz::fs::path& model_dir() {
  static const fuzz::fs::path dir = [] {
    const fuzz::fs::path d = fuzz::scratch_dir() / "model";
    fuzz::fs::create_directories(d);
    fuzz::copy_fixture(fuzz::fixture_dir() / "ct_models" / "untied" / "model.safetensors", d / "model.safetensors");
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
  fuzz::run_model_dir_input(model_dir(), "config.json", data, size);
  return 0;
}
