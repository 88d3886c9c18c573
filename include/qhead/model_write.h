// qhead/model_write.h — write a Hugging Face model directory whose token-table
// roles are quantized in the compressed-tensors `pack-quantized` layout.
//
// write_quantized_model(dir, out_dir, options) reads a model directory (as
// inspect_model does: config.json + model.safetensors, or
// model.safetensors.index.json + shards), RTN-quantizes the roles that get a
// scheme and writes out_dir:
//
//   - each quantized role as `<module>.weight_packed`, `.weight_scale`,
//     [`.weight_zero_point`], `.weight_shape` (add_packed: the tensors
//     compressed-tensors 0.20 writes), in the shard that held the role;
//   - every other tensor unchanged: shards holding no role are copied byte for
//     byte, the others rewritten with their other tensors' bytes as they were
//     (same file names, same safetensors metadata); the index's weight_map is
//     rewritten with the new names and metadata.total_size recomputed;
//   - every other file of the directory (tokenizer, generation config, ...)
//     copied by content, subdirectories included. A symbolic link to a
//     regular file (a Hugging Face cache snapshot is made of them) becomes a
//     regular file holding its target's bytes; links to directories, broken
//     or looping links, FIFOs, sockets and devices are left out and listed in
//     the report's skipped_files;
//   - config.json as it was (tie_word_embeddings included) with a
//     `quantization_config` as compressed-tensors 0.20's
//     ModelCompressor.update_config writes it: quant_method
//     "compressed-tensors", format "pack-quantized", quantization_status
//     "compressed", one config group per distinct scheme (`group_0`, ...)
//     whose targets are the roles' exact module names, weights {num_bits,
//     type "int", symmetric, strategy group|channel, group_size, dynamic
//     false}. An existing compressed-tensors config is kept for the other
//     modules: the requantized roles' exact names are moved out of their old
//     groups into the new ones (an exact name outranks a regex or class target
//     in the library's matching), and an `ignore` entry naming a role exactly is
//     dropped (one that matches it by regex or class is kUnsupported: removing
//     it would change other modules).
//
// One weight scheme per output, unless `mixed_schemes`: every config group
// with weights must have the weights (and format) of the group transformers
// 5.24 decompresses every dense module with (get_dense_scheme: the first group,
// in the file's order, without a "re:" target naming experts). With two
// schemes it fails on the second (a shape or zero-point error) or, where the
// shapes happen to fit (a w4 first group and a w8 head), loads the second with
// the first's bits and no error (relative error ~1). Otherwise kUnsupported,
// naming the groups and their schemes. That covers an embedding and a head
// given different schemes, and a role given a scheme other than that of the
// modules an existing compressed-tensors config already quantizes.
//
// Tied models (one table for both roles): ONE packed tensor is written, under
// the embedding's module name; a second stored copy of the head is dropped.
// One scheme only: different embedding and head schemes are kInvalidArgument;
// either one alone applies to the shared table.
//
// `untie` writes a tied model as two tables instead: the head, which needs a
// scheme, packed under its own module name (ModelInfo::head_name, e.g.
// lm_head) with the chosen quantizer, in the embedding's shard; the embedding
// with its own scheme (the quantizer's form without calibration, as an untied
// embedding gets) or, without one, kept as stored; config.json's
// tie_word_embeddings (top level, and text_config's where it has one) set to
// false. The second table costs its bytes; it buys an embedding the head's
// quantizer does not choose (docs/accuracy.md measures the pairs). Two
// different schemes need `mixed_schemes`, as for an untied model. On an
// untied model `untie` changes nothing.
//
// A role without a scheme is kept as stored. A role already quantized that gets
// a scheme is kInvalidArgument unless `requantize` (then it is dequantized to
// f32 and quantized again from those values).
//
// GPTQ checkpoints (model.h) convert when the head is the only GPTQ module: the
// head must get a scheme and `requantize` (its GPTQ tensors, act-order
// included, are dequantized and RTN-quantized; they cannot be kept), the GPTQ
// quantization config (and quantize_config.json) is replaced by a
// compressed-tensors one. A checkpoint that GPTQ-quantizes other modules too
// (every GPTQ / AutoRound export of a whole model) is kUnsupported before any
// other check: config.json holds one quantization_config, compressed-tensors
// has no format for the other modules' GPTQ tensors, and a head written back
// in GPTQ form is dropped by transformers' GPTQ loader (see
// docs/architecture.md). inspect_model / load_model_tables read it as it is.
//
// Writing is atomic: everything goes into a temporary directory beside
// out_dir (`.NAME.qhead-tmp-PID`, holding a QHEAD_INCOMPLETE marker, with
// config.json written last), is re-opened with inspect_model /
// load_model_tables and checked (quantized roles' tensors equal to what was
// quantized, every other tensor byte-identical to the input), and only then
// renamed to out_dir. Inputs are only ever opened read-only, and every file
// written is created new (O_EXCL) inside that directory, so no path an input
// resolves to, through links or otherwise, is ever truncated. Temporaries of
// killed runs for the same out_dir (their pid no longer alive) are removed
// first. An existing
// non-empty out_dir is refused unless `force` (then replaced); out_dir may not
// be, or lie inside, dir, nor (with force) contain it. GGUF input is
// kUnsupported (qhead reads GGUF but cannot write its other tensors), as is
// any other quantization method.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qhead/dtype.h"
#include "qhead/model.h"
#include "qhead/quantize.h"
#include "qhead/scheme.h"

namespace qhead {

// What a progress callback is told. Calls are serialized (never concurrent)
// but may come from worker threads.
struct ModelWriteProgress {
  enum class Stage { kQuantize, kCopy };
  Stage stage;
  std::string what;  // "embedding model.embed_tokens" / a shard's file name
  int64_t done;      // rows quantized, or bytes copied
  int64_t total;
};

struct ModelWriteOptions {
  // Scheme names as QuantScheme::parse takes them ("w4g64", "w8", "w4g32a");
  // unset: the role is kept as stored.
  std::optional<std::string> embedding_scheme;
  std::optional<std::string> head_scheme;
  // Scale dtype of every role quantized here; unset: the role's dtype (a dense
  // role's own dtype; a requantized role's existing scale dtype).
  std::optional<DType> scale_dtype;
  bool requantize = false;  // allow a scheme on a role that is already quantized
  // Write a quantization_config whose config groups have different weight
  // schemes (e.g. a w4g32 embedding and a w8 head). Off: such an output is
  // kUnsupported, because transformers (5.24) decompresses every module with
  // ONE group's scheme and misreads the others; compressed-tensors' own
  // ModelCompressor load path reads each group's scheme.
  bool mixed_schemes = false;
  bool force = false;       // replace an existing non-empty out_dir
  bool untie = false;       // a tied model written as two tables (see above)
  int threads = 0;          // quantizer threads (<= 0: default)
  // How the head (or the tied table) is quantized, and its calibration
  // activations ([N, H], required by the GPTQ quantizers; not owned). An
  // untied embedding takes the quantizer's identity-Hessian form (gptq: rtn,
  // gptq-mse: mse), never weighted by the calibration (the head's inputs).
  Quantizer quantizer = Quantizer::kRtn;
  std::optional<TensorView> calibration;
  double damp = QuantizeOptions{}.damp;  // GPTQ damping / the weighted MSE search's floor
  ModelOverrides overrides; // explicit role tensor names
  std::function<void(const ModelWriteProgress&)> progress;  // optional
};

struct ModelWriteReport {
  struct Role {
    std::string role;     // "embedding" | "head"
    std::string tensor;   // weight name in the input ("lm_head.weight")
    std::string module;   // module name ("lm_head"): the packed tensors' prefix
    std::string file;     // output file holding it (name within out_dir; "" when not stored)
    // "quantized" (dense -> packed), "requantized" (packed or GPTQ -> packed),
    // "kept" (stored as it was), "shared" (tied head: the embedding's table).
    std::string action;
    std::string before;   // "dense BF16" / "w4g32 (BF16 scales)" / "GPTQ w4g128 (F16 scales)"
    std::optional<QuantScheme> scheme;  // the role's scheme in out_dir (nullopt: dense)
    size_t bytes_before = 0;  // bytes of its stored tensors in dir (0: not stored)
    size_t bytes_after = 0;   // bytes of its stored tensors in out_dir (0: not stored)
    double seconds = 0.0;     // quantization time
  };
  std::string input_dir, output_dir;
  std::string architecture;
  int64_t vocab = 0, hidden = 0;
  bool tied = false;    // out_dir's roles are one table
  bool untied = false;  // the input was tied and out_dir stores two tables (untie)
  Role embedding, head;
  std::vector<std::string> rewritten_files;  // safetensors files rewritten (names within out_dir)
  std::vector<std::string> copied_files;     // everything else copied (relative paths)
  // Entries of dir not copied, with why (relative path, "a FIFO" / "a broken
  // link" / "a link to a directory (not followed)" / ...).
  std::vector<std::pair<std::string, std::string>> skipped_files;
  // Temporaries of killed runs for the same out_dir removed (or, for a previous
  // output a killed run had set aside while out_dir was missing, restored).
  std::vector<std::string> cleaned;
  int64_t tensors_checked = 0;  // tensors compared after writing (all of out_dir's)
  bool verified = false;        // out_dir was re-opened and checked
  double seconds = 0.0;         // whole call
};

// Does the work described above; throws qhead::Error (nothing is left at
// out_dir on failure; the temporary directory is removed).
ModelWriteReport write_quantized_model(const std::string& dir, const std::string& out_dir,
                                       const ModelWriteOptions& options = {});

}  // namespace qhead
