// libFuzzer target: a safetensors file (header, layout, tensors) held in
// memory, then every tensor read and every packed table loaded and
// dequantized, as `qhead inspect FILE` does.
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"

using namespace qhead;

namespace {

const std::string kPackedSuffix = ".weight_packed";

void run(const uint8_t* data, size_t size) {
  const SafetensorsFile f = SafetensorsFile::from_bytes(fuzz::aligned_copy(data, size), size, "fuzz.safetensors");
  // Every byte of every tensor is read, so ASan sees any view outside the input.
  uint64_t sum = 0;
  for (const std::string& name : f.names()) {
    const Tensor t = f.get(name);
    const auto* p = static_cast<const unsigned char*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
  }
  for (const auto& [k, v] : f.metadata()) sum += k.size() + v.size();
  // Packed tables: scheme inference, validation, and every row dequantized.
  for (const std::string& name : f.names()) {
    if (name.size() <= kPackedSuffix.size() ||
        name.compare(name.size() - kPackedSuffix.size(), kPackedSuffix.size(), kPackedSuffix) != 0)
      continue;
    const std::string prefix = name.substr(0, name.size() - kPackedSuffix.size());
    fuzz::expect_only_qhead_errors([&] {
      const Table t = load_packed(f, prefix);
      if (t.vocab() * t.hidden() > (int64_t(1) << 20)) return;
      std::string row(static_cast<size_t>(t.hidden()) * sizeof(float), '\0');
      for (int64_t r = 0; r < t.vocab(); ++r) t.row_f32(r, reinterpret_cast<float*>(row.data()));
    });
  }
  if (sum == 0x5eed) std::fputc('\0', stderr);  // keeps the reads
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_only_qhead_errors([&] { run(data, size); });
  return 0;
}
