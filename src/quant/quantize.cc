#include "qhead/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <vector>

#include "qhead/error.h"
#include "core/parallel.h"
#include "quant/quant_internal.h"

namespace qhead {

using quant::GroupParams;
using quant::promote;

PackedTable quantize_rtn(const TensorView& dense, const QuantScheme& scheme, int threads,
                         const std::string& name, const QuantizeProgress& progress) {
  const char* op = "quantize_rtn";
  quant::check_table(dense, scheme, op, name);  // every size below fits in int64
  const int64_t v = dense.size(0), h = dense.size(1);

  const DType xt = dense.dtype, st = scheme.scale_dtype, pt = promote(xt, st);
  const int64_t g = scheme.groups(h), gl = scheme.group_len(h);

  PackedTable out;
  out.scheme = scheme;
  out.vocab = v;
  out.hidden = h;
  out.packed = Tensor::empty(DType::kI32, {v, scheme.packed_cols(h)});
  out.scale = Tensor::empty(st, {v, g});
  std::vector<int8_t> zps;
  if (!scheme.symmetric) zps.assign(static_cast<size_t>(v * g), 0);

  std::atomic<int64_t> bad_row{-1};
  // Progress: each worker adds its rows every kTick rows; whoever holds the
  // mutex reports (a busy mutex skips the call, the next one catches up).
  // The count is read under the mutex, not taken from the worker's own
  // fetch_add: a worker that added first may reach the mutex last, and the
  // calls must never go backwards.
  constexpr int64_t kTick = 256;
  std::atomic<int64_t> rows_done{0};
  std::mutex progress_mu;
  int64_t reported = 0;  // guarded by progress_mu
  auto report = [&](int64_t n) {
    rows_done.fetch_add(n);
    if (!progress || !progress_mu.try_lock()) return;
    const int64_t d = rows_done.load();
    if (d > reported && d < v) {
      progress(d, v);
      reported = d;
    }
    progress_mu.unlock();
  };
  parallel_for(v, 64, [&](int64_t rb, int64_t re) {
    std::vector<float> x(static_cast<size_t>(h));
    std::vector<int8_t> q(static_cast<size_t>(h));
    int64_t pending = 0;  // rows done since this worker last reported
    for (int64_t r = rb; r < re; ++r) {
      convert(static_cast<const char*>(dense.data) + r * h * dtype_size(xt), xt, x.data(), DType::kF32, h);
      // A NaN or Inf row is reported (the first one found) and not quantized:
      // converting its NaN codes to integers would be undefined.
      if (!std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); })) {
        int64_t expected = -1;
        bad_row.compare_exchange_strong(expected, r);
        continue;
      }
      for (int64_t k = 0; k < g; ++k) {
        const float* xg = x.data() + k * gl;
        const GroupParams p = quant::rtn_params(xg, gl, scheme, xt);
        if (!scheme.symmetric) zps[static_cast<size_t>(r * g + k)] = static_cast<int8_t>(p.zero);
        store_from_f32(out.scale.data(), st, r * g + k, p.scale);
        quant::rtn_codes(xg, gl, p, scheme, pt, q.data() + k * gl);
      }
      pack_codes(q.data(), h, scheme.bits, out.packed.ptr<int32_t>() + r * scheme.packed_cols(h));
      if (progress && ++pending == kTick) {
        report(pending);
        pending = 0;
      }
    }
    if (progress && pending > 0) report(pending);
  }, threads);
  if (bad_row.load() >= 0)
    throw Error(ErrorCode::kInvalidArgument, op,
                name + ": row " + std::to_string(bad_row.load()) + " holds a NaN or Inf; cannot quantize");
  if (!scheme.symmetric) {
    out.zero_point = Tensor::empty(DType::kI32, {scheme.zero_point_rows(v), g});
    pack_zero_points(zps.data(), v, g, scheme.bits, out.zero_point.ptr<int32_t>());
  }
  if (progress) progress(v, v);
  return out;
}

Table quantize_table(const Table& dense, const QuantScheme& scheme, int threads, const std::string& name) {
  return Table::packed(quantize_rtn(dense.dense().view(), scheme, threads, name), name);
}

TokenTables quantize_roles(const Table& embedding, const Table* head,
                           const std::optional<QuantScheme>& embedding_scheme,
                           const std::optional<QuantScheme>& head_scheme, int threads) {
  TokenTables out;
  if (head == nullptr || head->same_storage(embedding)) {
    if (embedding_scheme && head_scheme && !(*embedding_scheme == *head_scheme))
      throw Error(ErrorCode::kInvalidArgument, "quantize_roles",
                  "tied table: embedding scheme " + embedding_scheme->name() + " and head scheme " +
                      head_scheme->name() + " differ, but a tied table is stored once with one scheme");
    const auto& s = embedding_scheme ? embedding_scheme : head_scheme;
    Table t = (s && !embedding.is_packed()) ? quantize_table(embedding, *s, threads, "tied embedding/lm_head")
                                            : embedding;
    out.embedding = t;
    out.head = t;
    return out;
  }
  out.embedding = (embedding_scheme && !embedding.is_packed())
                      ? quantize_table(embedding, *embedding_scheme, threads, "embedding")
                      : embedding;
  out.head = (head_scheme && !head->is_packed()) ? quantize_table(*head, *head_scheme, threads, "lm_head") : *head;
  return out;
}

}  // namespace qhead
