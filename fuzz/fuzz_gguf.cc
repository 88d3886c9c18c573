// libFuzzer target: a GGUF file held in memory — header, metadata, tensor
// infos — then what `qhead inspect FILE.gguf` and the GGUF table import do
// with it: typed metadata reads, the roles, the packed size under a scheme,
// and (for small tensors) dequantization and RTN quantization.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "qhead/gguf.h"
#include "qhead/scheme.h"

using namespace qhead;

namespace {

// Elements dequantized per tensor at most (keeps each run fast).
constexpr int64_t kMaxDequantValues = int64_t(1) << 12;

void read_metadata(const GgufFile& f) {
  for (const std::string& key : f.keys()) {
    fuzz::expect_only_qhead_errors([&] { (void)f.get_string(key); });
    fuzz::expect_only_qhead_errors([&] { (void)f.get_int(key); });
    fuzz::expect_only_qhead_errors([&] { (void)f.get_float(key); });
    fuzz::expect_only_qhead_errors([&] { (void)f.get_bool(key); });
    fuzz::expect_only_qhead_errors([&] { (void)f.get_string_array(key); });
    fuzz::expect_only_qhead_errors([&] { (void)f.get_array_length(key); });
    if (const GgufValue* v = f.find(key); v && v->is_array())
      for (uint64_t i = 0; i < v->count && i < 4; ++i) (void)v->at(i);
  }
  (void)f.dump_metadata();
}

void run(const uint8_t* data, size_t size) {
  const GgufFile f = GgufFile::from_bytes(fuzz::aligned_copy(data, size), size, "fuzz.gguf");
  read_metadata(f);
  for (const std::string& name : f.names()) {
    const GgufFile::Info& in = f.info(name);
    (void)f.data(name);
    fuzz::expect_only_qhead_errors([&] { (void)f.view(name); });
    if (in.rows() * in.cols() <= kMaxDequantValues)
      fuzz::expect_only_qhead_errors([&] { (void)gguf_dequantize(f, name, 1); });
  }
  // As `qhead inspect`: the roles and their packed size under a scheme.
  const GgufRoles r = gguf_roles(f);
  for (const char* scheme : {"w4g64", "w8", "w3g32a"}) {
    fuzz::expect_only_qhead_errors([&] {
      const QuantScheme s = QuantScheme::parse(scheme, DType::kBF16);
      s.check_hidden(r.hidden, "inspect", r.embedding);
      (void)s.table_bytes(r.vocab, r.hidden, "inspect", r.embedding);
    });
  }
  // The import: dequantize, then RTN-quantize (small tables only).
  if (r.vocab * r.hidden <= kMaxDequantValues) {
    fuzz::expect_only_qhead_errors([&] { (void)gguf_load_tables(f, std::nullopt, 1); });
    fuzz::expect_only_qhead_errors([&] { (void)gguf_load_tables(f, QuantScheme::parse("w4g32a"), 1); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_only_qhead_errors([&] { run(data, size); });
  return 0;
}
