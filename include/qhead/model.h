// qhead/model.h — a Hugging Face model directory: find the token table's two
// roles (embedding, head), whether they are tied and how each is stored.
//
// A directory holds `config.json` and either `model.safetensors` or
// `model.safetensors.index.json` + the shards it names. The roles are found by
// architecture (config `model_type`, else `architectures[0]`):
//
//   family                               embedding                          head
//   llama qwen2 qwen3 mistral gemma* phi  model.embed_tokens.weight          lm_head.weight
//   gpt2                                 transformer.wte.weight (wte.weight) lm_head.weight (tied)
//   gpt_neox (Pythia)                    gpt_neox.embed_in.weight            embed_out.weight
//   opt                                  model.decoder.embed_tokens.weight   lm_head.weight
//
// or named explicitly by ModelOverrides (CLI `--embedding-tensor`/`--head-tensor`).
// A role is stored dense (`X.weight`) or packed (`X.weight_packed`, `_scale`,
// [`_zero_point`], `_shape`: compressed-tensors pack-quantized).
//
// Tied (`tie_word_embeddings`; when absent, the architecture's default: true for
// gpt2, opt and gemma, false otherwise): ONE Table serves both roles, whether the
// checkpoint stores one tensor or two identical ones (compared byte for byte); a
// tied config whose stored tensors differ is an error that says so.
//
// `quantization_config` (quant_method `compressed-tensors`, format
// `pack-quantized`) decides per role whether it is quantized and how, with the
// library's matching rules: a module in `ignore` (exact name, `re:` regex, or
// class name) is not quantized; otherwise the first of its matching targets —
// exact names, then `re:` regexes (in sorted order, anchored at the start as
// Python's re.match), then class names — picks the group. The embedding is a
// class `Embedding` module, the head a `Linear`; module names are the weight
// names without `.weight`. Anything else (another quant_method or format, float
// types, bits outside 2..8, strategies other than group/channel, actorder
// "group" — "weight"/"static" only reordered calibration and are read) is
// kUnsupported naming the tensor, what was found and what is supported.
//
// GPTQ (quant_method `gptq`, AutoGPTQ/GPTQModel/AutoRound's GPTQ export; or
// a `quantize_config.json` beside a config without quantization_config): the
// head is quantized when `<module>.qweight` is stored (config `lm_head: true`):
//
//   qweight  I32 [H·b/32, V]   codes q ∈ [0, 2^b) packed along H (the input
//                              dim), low bits first
//   qzeros   I32 [G, V·b/32]   zero points packed along V; checkpoint format
//                              v1 (`gptq`, the default) stores z − 1, v2
//                              (`checkpoint_format: gptq_v2`) stores z
//   scales   F16 [G, V]
//   g_idx    I32 [H]           group of each input column (optional)
//   w[v, k] = scales[g_idx[k], v] · (q[k, v] − z[g_idx[k], v])
//
// bits and group_size come from the config, overridden per module by its
// `dynamic` rules (GPTQModel/AutoRound: regex → {bits, group_size, ...}, "-:"
// excludes; first match in file order, re.match semantics).
// It is converted at load into the native layout (a copy: the codes
// transposed to rows, scales transposed, zero points repacked along V; bits
// 2, 4 and 8). Symmetric when every zero is 2^(b-1) (what GPTQ's sym stores),
// asymmetric otherwise. Act-order (`desc_act`: g_idx not k / group_size):
// the columns are stored sorted by group with PackedTable::col_perm, which is
// exact (every group must hold group_size columns). Embeddings are never
// GPTQ-quantized; a tied config with a GPTQ head is an error.
//
// Every other failure is kInvalidFile naming the file and the key or tensor:
// a missing config.json, a missing shard, an index naming a tensor its shard
// lacks, a shape disagreeing with config `vocab_size`/`hidden_size`, a stored
// role whose form disagrees with the quantization config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "qhead/quantize.h"
#include "qhead/scheme.h"

namespace qhead {

// Explicit weight names ("lm_head.weight"); empty = resolve by architecture.
struct ModelOverrides {
  std::string embedding_tensor;
  std::string head_tensor;
};

struct ModelInfo {
  std::string dir;
  std::string architecture;  // config architectures[0] (or model_type when absent)
  std::string model_type;    // config model_type ("" when absent)
  int64_t vocab = 0;         // rows of the table (= config vocab_size)
  int64_t hidden = 0;        // columns (= config hidden_size / n_embd / d_model)
  bool tied = false;
  // The head's weight name: the stored one, or, for a tied head that is not
  // stored, the name the family (or ModelOverrides::head_tensor) gives it,
  // where an untied copy goes ("" when unknown).
  std::string head_name;
  // Whether config.json carries a compressed-tensors quantization_config.
  bool compressed_tensors = false;
  // The quantization method named by the checkpoint ("" when none):
  // "compressed-tensors", "gptq" (also AutoRound's GPTQ export).
  std::string quant_method;

  enum class Format {
    kDense,          // <module>.weight
    kPackQuantized,  // compressed-tensors <module>.weight_packed, _scale, [_zero_point], _shape
    kGptq,           // <module>.qweight, .qzeros, .scales, [.g_idx]: converted at load
  };
  struct Role {
    std::string tensor;                 // weight name, e.g. "lm_head.weight"
    std::string file;                   // the safetensors file holding it
    bool stored = false;                // false: a tied head not stored (shares the embedding)
    bool packed = false;                // quantized (format says how it is stored)
    Format format = Format::kDense;
    int gptq_version = 0;               // kGptq: 1 (zeros stored z − 1) or 2
    bool act_order = false;             // kGptq: g_idx is not k / group_size (loaded with col_perm)
    std::optional<QuantScheme> scheme;  // set when packed (scale dtype from the tensor)
    DType dtype = DType::kF32;          // dense dtype, or the scale dtype when packed
    size_t bytes = 0;                   // bytes of its stored tensors (0 when not stored)
  };
  Role embedding, head;

  // Bytes the token table takes in memory now (a tied table counted once).
  size_t table_bytes() const;
};

// Reads config.json and the safetensors headers and resolves both roles
// (validating shapes, tie and quantization config) without reading tensor data
// except to compare a tied pair stored twice.
ModelInfo inspect_model(const std::string& dir, const ModelOverrides& overrides = {});

// Loads the two roles as Tables (views into the files' mappings, no copy: a
// packed role via load_packed, a dense one as the mapped tensor; a GPTQ role
// is converted into new memory, multithreaded). Tied: one
// Table for both roles (TokenTables::tied()). `info`, when given, receives
// what inspect_model returns.
TokenTables load_model_tables(const std::string& dir, const ModelOverrides& overrides = {},
                              ModelInfo* info = nullptr);

}  // namespace qhead
