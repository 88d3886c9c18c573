// qhead/quantize.h — round-to-nearest (RTN) quantization of a dense table.
//
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
