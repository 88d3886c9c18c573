// qhead/quantize.h — quantization of a dense table: round-to-nearest (RTN),
// a per-group scale/clip search (MSE) and GPTQ, all writing the same
// compressed-tensors pack-quantized layout.
//
// RTN (quantize_rtn):
// The arithmetic follows compressed-tensors (0.20) step for step, so the same
// input gives the same codes and scales as its calculate_qparams + quantize:
//   per group: mn = min(min x, 0), mx = max(max x, 0)
//   symmetric:  s = rnd_x(max(|mn|, |mx|) / ((2^b - 1) / 2)),  z = 0
//   asymmetric: s = rnd_x(rnd_x(mx - mn) / (2^b - 1)),
//               z = round(clamp(rnd_x(qmin - rnd_x(mn / s)), qmin, qmax))
//   s rounded to the scale dtype; s == 0 → eps of the scale dtype
//   q = round(clamp(rnd_p(rnd_p(x / s) + z), qmin, qmax))
// where rnd_x rounds to the input dtype (torch computes f16/bf16 ops in f32
// and rounds the result), rnd_p to the promoted dtype of (input, scale), and
// round() is round-half-to-even. Differences from compressed-tensors:
//   - an all-zero group in an asymmetric scheme: compressed-tensors computes
//     z from 0/0 (NaN cast to int8, platform-defined); qhead uses z = qmin,
//     which dequantizes the group to exact zeros as well.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "qhead/scheme.h"
#include "qhead/table.h"

namespace qhead {

// Progress of a long quantization: rows done out of the total. Calls never
// overlap (a mutex serializes them) but may come from worker threads; the
// counts they report only grow, and the last call reports done == total.
// Keep it cheap: it is called every few hundred rows.
using QuantizeProgress = std::function<void(int64_t rows_done, int64_t rows_total)>;

// Quantizes a dense [V, H] F32/F16/BF16 table (CPU, contiguous) to `scheme`,
// multithreaded over rows (threads <= 0: default). `name` is used in errors;
// `progress`, when set, is told the rows done as the work proceeds.
PackedTable quantize_rtn(const TensorView& dense, const QuantScheme& scheme, int threads = 0,
                         const std::string& name = "table", const QuantizeProgress& progress = {});

// Convenience: a packed Table from a dense Table.
Table quantize_table(const Table& dense, const QuantScheme& scheme, int threads = 0,
                     const std::string& name = "table");

// How the codes and scales of a table are chosen. Every quantizer writes the
// same layout (codes, scales, zero points of `scheme`), so the kernels, the
// readers and compressed-tensors see no difference.
//   kRtn     round to nearest, compressed-tensors' arithmetic (quantize_rtn).
//   kMse     per group, the scale (symmetric) or the clip range and zero point
//            (asymmetric) minimising the group's squared weight error, searched
//            over a grid around the RTN choice with a least-squares refit of
//            the scale (llama.cpp make_qx_quants style; the scale may come out
//            negative, which maps the group's largest magnitude to the wider
//            end of the signed code range). The RTN choice is one of the
//            candidates, so no group's error exceeds RTN's. With calibration
//            the error is weighted per column by the activations' mean square.
//   kGptq    GPTQ (Frantar et al.) against H = XᵀX/N of the calibration rows:
//            columns in order (the layout holds no act-order permutation),
//            blocks of `block` columns with lazy batch updates, damping
//            `damp`·mean(diag H); each group's scale and zero point computed as
//            RTN does from the error-compensated weights when the group starts.
//            Symmetric schemes then refit each row's group scales on the same
//            objective (QuantizeOptions::refit_scales). Without the refit and
//            with a diagonal H it equals RTN exactly (for an F32 table).
//   kGptqMse GPTQ with each group's scale from the kMse search (weighted by
//            diag H) instead of RTN's min/max.
enum class Quantizer { kRtn, kMse, kGptq, kGptqMse };

// "rtn", "mse", "gptq", "gptq-mse".
const char* quantizer_name(Quantizer q);
// Parses a quantizer name; kInvalidArgument naming the accepted ones otherwise.
Quantizer parse_quantizer(std::string_view name);
// Whether the quantizer needs calibration activations (the GPTQ ones).
inline bool quantizer_needs_calibration(Quantizer q) { return q == Quantizer::kGptq || q == Quantizer::kGptqMse; }

struct QuantizeOptions {
  Quantizer quantizer = Quantizer::kRtn;
  int threads = 0;              // <= 0: default
  std::string name = "table";   // used in errors
  QuantizeProgress progress;    // optional, as for quantize_rtn
  // The head's inputs, [N, H] F32/F16/BF16 on the CPU, contiguous, finite
  // (e.g. decode states after the last norm). Required by the GPTQ
  // quantizers; kMse uses it, when given, for per-column error weights;
  // kRtn ignores it. Not owned: it must outlive the call.
  std::optional<TensorView> calibration;
  // GPTQ: diagonal damping, a fraction of mean(diag H); also the floor added
  // to kMse's calibration column weights. 0.1 gave the lowest mean KL on both
  // measured models (docs/tuning-notes.md, "GPTQ damping").
  double damp = 0.1;
  int block = 128;     // GPTQ: columns per block of lazy updates
  // GPTQ, symmetric schemes: after the codes are chosen, refit each row's
  // group scales by least squares on GPTQ's objective (w - ŵ)ᵀH(w - ŵ) (the
  // codes kept; a row keeps its scales unless the refit lowers it).
  bool refit_scales = true;
  // GPTQ with the refit: passes after the first run the column loop again
  // with the refit scales held fixed, then refit again; each row keeps the
  // pass with the lowest objective.
  int passes = 1;
};

// Quantizes a dense [V, H] table with the chosen quantizer. kRtn gives exactly
// quantize_rtn's output. Errors (qhead::Error) name the op, `options.name`
// and the calibration tensor: GPTQ without calibration, calibration whose H
// differs from the table's, a NaN/Inf in the calibration, N == 0.
PackedTable quantize(const TensorView& dense, const QuantScheme& scheme, const QuantizeOptions& options);

// The two roles of a model's token table. When tied, `embedding` and `head`
// are the same Table: one packed copy serves gather and logits.
struct TokenTables {
  Table embedding;
  Table head;
  bool tied() const { return embedding.same_storage(head); }
};

// Quantizes both roles. Tied (head == nullptr): one table with one scheme,
// shared by both roles. Untied: each role with its own scheme. A role whose
// scheme is nullopt stays dense.
TokenTables quantize_roles(const Table& embedding, const Table* head,
                           const std::optional<QuantScheme>& embedding_scheme,
                           const std::optional<QuantScheme>& head_scheme, int threads = 0);

}  // namespace qhead
