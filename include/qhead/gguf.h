// qhead/gguf.h — GGUF (llama.cpp / ggml) import: a validated mmap reader and
// exact dequantization of the common ggml types to f32.
//
// File layout (GGUF v2 and v3 are identical; everything little-endian):
//   u32 magic "GGUF" · u32 version · u64 tensor_count · u64 kv_count
//   kv_count × { string key · u32 value_type · value }
//   tensor_count × { string name · u32 n_dims · u64 ne[n_dims] · u32 ggml_type · u64 offset }
//   padding to `general.alignment` (default 32) · data section
// where string = u64 length + bytes (no terminator) and an array value is
// u32 element_type · u64 count · count values (arrays may nest). ggml lists
// dims innermost first (ne[0] is the row length); tensor offsets are relative
// to the data section and multiples of the alignment.
//
// open() validates everything before it returns, with the same discipline as
// the safetensors reader: every count and length is checked against the bytes
// left in the file before it is used, known value and tensor types only,
// n_dims <= 4, dims non-negative with products that do not overflow, row
// length a multiple of the type's block size, offsets aligned, inside the file
// and not overlapping, no duplicate keys or tensor names. Every failure throws
// qhead::Error(kInvalidFile) naming the file, and the key or tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qhead/quantize.h"
#include "qhead/tensor.h"

namespace qhead {

// ggml tensor types (ids as stored in the file; gaps are retired ids).
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28,
  kIQ1_M = 29, kBF16 = 30, kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39,
};

// Block geometry of a ggml type: `block_size` values stored in `type_size` bytes.
struct GgmlTypeTraits {
  const char* name;   // "Q4_K"
  int64_t block_size;  // values per block (1 for plain types)
  int64_t type_size;   // bytes per block
  bool dequantizable;  // qhead::gguf_dequantize handles it
};
// Traits of a known type id; nullopt for ids this reader does not know.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type);
// "Q4_K", or "type 99" for an unknown id.
std::string ggml_type_name(uint32_t type);

// GGUF metadata value types (ids as stored).
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);  // "u32", "string", "array", ...

// One metadata value. Strings are views into the file mapping and stay valid
// as long as any copy of the GgufFile they came from is alive.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  // Scalars: integers (and bool) in `i` when signed or `u` when unsigned —
  // both are set when the value fits both; floats in `f`.
  int64_t i = 0;
  uint64_t u = 0;
  bool fits_i64 = false, fits_u64 = false;
  double f = 0.0;
  std::string_view str;            // kString
  // Arrays: element type and count; the elements are in `strings` (string
  // arrays), `items` (arrays of arrays) or `raw` (numbers and bools, packed
  // little-endian in the mapping; read them with at()).
  GgufValueType elem_type = GgufValueType::kU8;
  uint64_t count = 0;
  std::vector<std::string_view> strings;
  std::vector<GgufValue> items;
  const unsigned char* raw = nullptr;

  bool is_array() const { return type == GgufValueType::kArray; }
  // Element i of an array as a value of its own. Throws kInvalidArgument when
  // this is not an array or i >= count.
  GgufValue at(uint64_t i) const;
};

class GgufFile {
 public:
  // One tensor, as the file describes it.
  struct Info {
    std::string name;
    uint32_t type = 0;     // ggml type id (GgmlType)
    Shape dims;            // outermost first: ggml ne reversed, so a [V, H] table is {V, H}
    uint64_t offset = 0;   // relative to the data section, as stored
    uint64_t file_offset = 0;  // absolute offset in the file
    uint64_t nbytes = 0;   // rows × (row length / block size) × type size
    int64_t rows() const;  // product of all dims but the last (1 for a 1-D tensor)
    int64_t cols() const;  // the last dim (ggml ne[0]); 1 for a 0-D tensor (a scalar)
  };

  // Maps and validates `path`. Throws Error (kIo / kInvalidFile; kUnsupported
  // for GGUF v1 and big-endian files).
  // Anything but a regular file (a directory, FIFO, device) is refused
  // without opening it for reading.
  static GgufFile open(const std::string& path);
  // Validates a GGUF image of `size` bytes at `bytes` (which the returned file
  // and its tensors keep alive); `name` stands for the path in error messages.
  // The same checks and errors as open().
  static GgufFile from_bytes(std::shared_ptr<const void> bytes, size_t size, const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_start_; }
  size_t file_size() const { return file_size_; }

  // Tensor names in file order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Throws kInvalidArgument naming the file if the tensor is absent.
  const Info& info(const std::string& name) const;
  // The tensor's bytes in the mapping (valid while this file object or a copy lives).
  const void* data(const std::string& name) const;
  // The whole-file mapping, for Tensor::borrow.
  const std::shared_ptr<const void>& mapping() const { return mapping_; }
  // A zero-copy view of an F32 / F16 / BF16 tensor with dims(); kUnsupported
  // for other types (use gguf_dequantize) or a data address not aligned to
  // the element size (possible with general.alignment = 1).
  Tensor view(const std::string& name) const;

  // ---- metadata -------------------------------------------------------------
  // Keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  bool has_key(const std::string& key) const { return meta_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters: nullopt when the key is absent; kInvalidFile naming the key
  // when it is present with another type.
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<int64_t> get_int(const std::string& key) const;   // any integer type that fits int64
  std::optional<double> get_float(const std::string& key) const;  // f32 / f64 (and integers)
  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::vector<std::string>> get_string_array(const std::string& key) const;
  // Element count of an array value (any element type).
  std::optional<uint64_t> get_array_length(const std::string& key) const;
  // One line per key: "key: type = value", arrays shown by type, length and
  // their first `max_items` elements; long strings cut at 80 characters.
  std::string dump_metadata(size_t max_items = 8) const;

 private:
  std::string path_;
  std::shared_ptr<const void> mapping_;
  size_t file_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, Info> index_;
  std::vector<std::string> keys_;
  std::map<std::string, GgufValue> meta_;
};

// Dequantizes a whole tensor to a new F32 tensor [rows, cols] (cols = ggml
// ne[0], rows = the product of the other dims), value for value as ggml's
// dequantize_row_* and the gguf Python package compute it (f32 arithmetic, no
// fused multiply-add). Handles F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K; any other type throws kUnsupported naming the tensor and
// the type. Rows are split over `threads` threads (<= 0: the default).
Tensor gguf_dequantize(const GgufFile& file, const std::string& name, int threads = 0);

// Dequantizes `n` values (a multiple of the type's block size) of ggml type
// `type` from `src` into `dst`. Throws kUnsupported / kInvalidArgument.
void gguf_dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);

// The two token-table roles of a GGUF model (llama.cpp's names).
struct GgufRoles {
  std::string embedding;  // "token_embd.weight"
  std::string head;       // "output.weight", or the embedding's name when tied
  bool tied = false;      // no output.weight: the head reuses the embedding
  int64_t vocab = 0, hidden = 0;
};
// Resolves the roles: token_embd.weight is the embedding; output.weight, when
// present, the head (its dims must equal the embedding's); absent, the model
// is tied. Throws kInvalidFile when token_embd.weight is missing or not 2-D.
GgufRoles gguf_roles(const GgufFile& file);

// The model's token tables as qhead Tables: each role dequantized to f32
// (ggml's block formats are not the pack-quantized layout, so they are not
// used in place), then, when `scheme` is given, RTN-quantized to it. Tied
// (no output.weight): ONE Table serves both roles.
TokenTables gguf_load_tables(const GgufFile& file, const std::optional<QuantScheme>& scheme = std::nullopt,
                             int threads = 0);

}  // namespace qhead
