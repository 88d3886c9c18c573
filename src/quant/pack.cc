// Bit-stream packing of quantized codes, the compressed-tensors
// `pack_to_int32` layout (see qhead/table.h for the picture).
#include <cstring>

#include "qhead/table.h"

namespace qhead {

void pack_codes(const int8_t* q, int64_t n, int bits, int32_t* out) {
  const int64_t words = (n * bits + 31) / 32;
  std::memset(out, 0, static_cast<size_t>(words) * sizeof(int32_t));
  const int offset = 1 << (bits - 1);
  const uint32_t mask = (1u << bits) - 1u;
  auto* w = reinterpret_cast<uint32_t*>(out);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t code = static_cast<uint32_t>(q[i] + offset) & mask;
    const int64_t bit = i * bits;
    const int64_t k = bit >> 5;
    const int off = static_cast<int>(bit & 31);
    w[k] |= code << off;
    if (off + bits > 32) w[k + 1] |= code >> (32 - off);  // straddles into the next word
  }
}

void unpack_codes(const int32_t* words, int64_t n, int bits, int8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(code_at(words, i, bits));
}

void pack_zero_points(const int8_t* z, int64_t v, int64_t g, int bits, int32_t* out) {
  // Column-wise bit streams: column c holds z[0..v, c], word k of the column
  // at out[k * g + c].
  const int64_t words = (v * bits + 31) / 32;
  std::memset(out, 0, static_cast<size_t>(words * g) * sizeof(int32_t));
  const int offset = 1 << (bits - 1);
  const uint32_t mask = (1u << bits) - 1u;
  auto* w = reinterpret_cast<uint32_t*>(out);
  for (int64_t c = 0; c < g; ++c) {
    for (int64_t r = 0; r < v; ++r) {
      const uint32_t code = static_cast<uint32_t>(z[r * g + c] + offset) & mask;
      const int64_t bit = r * bits;
      const int64_t k = bit >> 5;
      const int off = static_cast<int>(bit & 31);
      w[k * g + c] |= code << off;
      if (off + bits > 32) w[(k + 1) * g + c] |= code >> (32 - off);
    }
  }
}

}  // namespace qhead
