// qhead/scheme.h — how a table is quantized.
//
// A QuantScheme is the compressed-tensors weight quantization args that the
// pack-quantized format can carry: `type: int`, `num_bits` 2..8, `strategy`
// group (group_size > 0) or channel (one scale per vocab row, group_size -1),
// `symmetric` true/false, and the dtype the scales are stored in.
//
// Integer range (compressed-tensors `calculate_range` for type int, used for
// symmetric AND asymmetric): q ∈ [-2^(b-1), 2^(b-1) - 1]. Dequantization is
// w = (q - z) · s, z = 0 when symmetric.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "qhead/dtype.h"

namespace qhead {

struct QuantScheme {
  int bits = 4;                     // 2..8
  int group_size = -1;              // > 0: elements per group along H; -1: per row
  bool symmetric = true;            // false: a zero point per group
  DType scale_dtype = DType::kF16;  // F16, BF16 or F32

  int qmin() const { return -(1 << (bits - 1)); }
  int qmax() const { return (1 << (bits - 1)) - 1; }
  // Stored code = q + offset, in [0, 2^bits - 1].
  int offset() const { return 1 << (bits - 1); }
  bool per_row() const { return group_size < 0; }

  // Int32 words for n >= 0 codes, ceil(n·bits / 32): compressed-tensors packs
  // densely, code i at bit i·bits of the row's bit stream (low bits first), so
  // for bits not dividing 32 a code may straddle two words. Computed without
  // forming n·bits, so it cannot overflow for any n and bits <= 32.
  int64_t packed_cols(int64_t n) const { return n / 32 * bits + ((n % 32) * bits + 31) / 32; }
  // Int32 rows of the zero-point tensor for v vocab rows (packed along V).
  int64_t zero_point_rows(int64_t v) const { return packed_cols(v); }
  // Scale / zero-point groups per row.
  int64_t groups(int64_t h) const { return per_row() ? 1 : h / group_size; }
  // Group length along H (h for per-row).
  int64_t group_len(int64_t h) const { return per_row() ? h : group_size; }

  // Throws kInvalidArgument unless bits ∈ [2, 8], group_size == -1 or > 0,
  // scale dtype is a float type.
  void validate() const;
  // Throws kInvalidArgument (naming `op` and `tensor`) unless a row of h values
  // splits into whole groups. Exact tail handling is deliberately not offered:
  // compressed-tensors itself rejects a partial last group for pack-quantized.
  void check_hidden(int64_t h, const std::string& op, const std::string& tensor) const;
  // Bytes of a [v, h] table packed under this (valid) scheme: codes, scales
  // and zero points. Throws kInvalidArgument naming `op`, `tensor` and the
  // dims when v < 0, h < 0 or a size does not fit in int64.
  int64_t table_bytes(int64_t v, int64_t h, const std::string& op, const std::string& tensor) const;

  // "w4g64" (4-bit, group 64, symmetric), "w8" (8-bit per row),
  // "w4g128a" (asymmetric). The scale dtype is not part of the name.
  std::string name() const;
  // Parses a scheme name; the scale dtype is `scale_dtype`. Accepted group
  // sizes: 32, 64, 128, 256 (the CLI's set) or none; bits 2..8.
  static QuantScheme parse(std::string_view name, DType scale_dtype = DType::kF16);

  bool operator==(const QuantScheme&) const = default;
};

}  // namespace qhead
