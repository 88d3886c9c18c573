// qhead/table.h — a [V, H] token table: dense, or packed per a QuantScheme.
//
// The packed layout IS the compressed-tensors `pack-quantized` layout
// (docs/architecture.md, Decisions: one packed copy, used as loaded), so a
// checkpoint's tensors are used as loaded and one table serves both the
// embedding and the head:
//
//   weight_packed      I32 [V, ceil(H·b / 32)]    codes q + 2^(b-1), a dense
//                                                  little-endian bit stream per row:
//                                                  element j at stream bit j·b
//   weight_scale       F16|BF16|F32 [V, G]         G = H / group_size, or 1 per row
//   weight_zero_point  I32 [ceil(V·b / 32), G]     asymmetric only: zero points z ∈
//                                                  [qmin, qmax], stored +2^(b-1) and
//                                                  packed along V (dim 0), as
//                                                  compressed-tensors packs them
//   weight_shape       I64 [2] = {V, H}
//
// Dequantized value: w[v, j] = (q[v, j] - z[v, j / gs]) * s[v, j / gs].
// A row is contiguous in every tensor except the zero points, which are read
// one code per (row, group).
//
// Optional column order (GPTQ act-order, `desc_act` with `g_idx`): a group is
// a set of hidden indices that need not be contiguous. Such a table is stored
// with its columns permuted so that every group is contiguous again:
//
//   col_perm           I32 [H]                    stored column j holds hidden
//                                                  index col_perm[j]
//
// so w[v, col_perm[j]] = (q[v, j] - z[v, j / gs]) * s[v, j / gs]. The kernels
// run on the stored order: ops.cc permutes x's columns (x'[m, j] =
// x[m, col_perm[j]]) before logits/top-k and un-permutes the rows embed
// gathers, so every backend sees a plain table (Table::stored_order()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "qhead/scheme.h"
#include "qhead/tensor.h"

namespace qhead {

class SafetensorsFile;
class SafetensorsWriter;

// ---- packing (shared by the quantizer, the loaders and the reference ops) ----
//
// A row of n codes is one little-endian bit stream: code i occupies bits
// [i·b, i·b + b) of the stream, word k holds stream bits [32k, 32k + 32).
// For b ∈ {2, 4, 8} a code never straddles words.

// Packs n signed codes q[i] ∈ [-2^(b-1), 2^(b-1) - 1] into ceil(n·b/32) words.
void pack_codes(const int8_t* q, int64_t n, int bits, int32_t* out);
// Unpacks n signed codes from words (inverse of pack_codes).
void unpack_codes(const int32_t* words, int64_t n, int bits, int8_t* q);
// Unsigned stored code i (q + 2^(b-1)) of a stream read with stride `stride`
// words between consecutive words (1 along a row; G down a zero-point column).
inline uint32_t stored_code_at(const int32_t* words, int64_t i, int bits, int64_t stride = 1) {
  const int64_t bit = i * bits;
  const int64_t k = bit >> 5;
  const int off = static_cast<int>(bit & 31);
  uint64_t v = static_cast<uint32_t>(words[k * stride]);
  if (off + bits > 32) v |= static_cast<uint64_t>(static_cast<uint32_t>(words[(k + 1) * stride])) << 32;
  return static_cast<uint32_t>(v >> off) & ((1u << bits) - 1u);
}
// Signed code i of a packed row.
inline int code_at(const int32_t* row, int64_t i, int bits) {
  return static_cast<int>(stored_code_at(row, i, bits)) - (1 << (bits - 1));
}
// Packs zero points z[V, G] (signed) along dim 0 into out[ceil(V·b/32), G],
// as compressed-tensors' pack_to_int32(packed_dim=0) does.
void pack_zero_points(const int8_t* z, int64_t v, int64_t g, int bits, int32_t* out);
// Zero point of (row, group) from the dim-0-packed tensor with g_cols columns.
inline int zero_point_at(const int32_t* zp, int64_t g_cols, int64_t row, int64_t group, int bits) {
  return static_cast<int>(stored_code_at(zp + group, row, bits, g_cols)) - (1 << (bits - 1));
}

// ---- the packed table --------------------------------------------------------

struct PackedTable {
  QuantScheme scheme;
  int64_t vocab = 0;   // V
  int64_t hidden = 0;  // H
  Tensor packed;       // I32 [V, scheme.packed_cols(H)]
  Tensor scale;        // scheme.scale_dtype [V, G]
  Tensor zero_point;   // I32 [ceil(V·b/32), G]; undefined when symmetric
  Tensor col_perm;     // I32 [H]: a permutation of 0..H-1; undefined = identity

  // Checks dtypes, shapes against (V, H, scheme), that every scale is finite
  // and that col_perm is a permutation. `where` names the source in errors.
  void validate(const std::string& where) const;
  size_t nbytes() const;
  // Dequantizes row v into out[H] (f32), in hidden order (col_perm applied).
  void dequantize_row(int64_t v, float* out) const;
};

class Table {
 public:
  Table() = default;
  // A dense [V, H] table (F32/F16/BF16, contiguous, CPU).
  static Table dense(Tensor weight);
  // A packed table; validated (throws naming `where`).
  static Table packed(PackedTable p, const std::string& where = "table");

  bool is_packed() const { return packed_ != nullptr; }
  int64_t vocab() const;
  int64_t hidden() const;
  // Where the table's storage lives (all its tensors share one device).
  Device device() const;
  // Bytes of table storage (all tensors).
  size_t nbytes() const;
  const PackedTable& packed() const;  // throws unless is_packed()
  const Tensor& dense() const;        // throws if is_packed()
  // Dequantizes (or converts) row v into out[H] as f32 (CPU tables only).
  void row_f32(int64_t v, float* out) const;
  // The whole table as a dense f32 [V, H] tensor (multithreaded).
  Tensor to_dense_f32() const;
  // True when both tables are the same storage (a tied pair holds one copy).
  bool same_storage(const Table& o) const {
    return (packed_ && packed_ == o.packed_) || (dense_ && dense_ == o.dense_);
  }
  // A packed table whose columns are stored permuted (PackedTable::col_perm).
  bool has_col_perm() const { return packed_ && packed_->col_perm.defined(); }
  // The same storage seen without its column permutation (the table the
  // kernels run on, in stored column order); *this when there is none.
  const Table& stored_order() const { return stored_ ? *stored_ : *this; }

 private:
  std::shared_ptr<const PackedTable> packed_;
  std::shared_ptr<const Tensor> dense_;
  std::shared_ptr<const Table> stored_;  // set when packed_->col_perm is defined
};

// ---- compressed-tensors tensors in safetensors files ------------------------

// Tensor-name prefix for a weight: "lm_head.weight" → "lm_head" (a trailing
// ".weight" dropped, as compressed-tensors names its tensors "<module>.weight_packed").
std::string packed_prefix(const std::string& weight_name);

// True if `file` holds `<prefix>.weight_packed`.
bool has_packed(const SafetensorsFile& file, const std::string& prefix);

// Infers the scheme of `<prefix>.weight_*` from tensor shapes, or from the
// qhead metadata entry when the file carries one (shapes alone cannot tell
// 4-bit from 8-bit when H ≤ 4, nor 2/3/5/6/7-bit from 4/8: then this throws
// and names what is ambiguous).
QuantScheme infer_scheme(const SafetensorsFile& file, const std::string& prefix);

// Loads `<prefix>.weight_*` as a packed table without copying (views into the
// mapping). `scheme` overrides inference (the bits come from a checkpoint's
// config). Validates everything; errors name the file and the tensor.
Table load_packed(const SafetensorsFile& file, const std::string& prefix,
                  std::optional<QuantScheme> scheme = std::nullopt);

// Adds `<prefix>.weight_packed`, `.weight_scale`, [`.weight_zero_point`],
// `.weight_shape` and a metadata entry recording the scheme. `shape_store`
// receives the I64 weight_shape tensor, which must outlive the writer's write().
// A table with a col_perm is kUnsupported (the layout has no field for it).
void add_packed(SafetensorsWriter& w, const std::string& prefix, const PackedTable& t,
                Tensor& shape_store);

// Metadata key under which qhead records a packed tensor's scheme.
std::string scheme_metadata_key(const std::string& prefix);

}  // namespace qhead
