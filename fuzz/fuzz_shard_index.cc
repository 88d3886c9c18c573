// libFuzzer target: a sharded model's model.safetensors.index.json (its
// weight_map) next to the fixed config.json and two shards of
// tests/fixtures/ct_models/sharded_untied: inspect_model, then
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
    const fuzz::fs::path src = fuzz::fixture_dir() / "ct_models" / "sharded_untied";
    for (const char* f : {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
      fuzz::copy_fixture(src / f, d / f);
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
  fuzz::run_model_dir_input(model_dir(), "model.safetensors.index.json", data, size);
  return 0;
}
