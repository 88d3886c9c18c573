// The sample op on the host: the exact draw from a row of logits (the
// reference, and every path's fallback) and the CPU driver. The contract is
// in qhead/ops.h; the shared pieces in sample.h.
#include "ops/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/ops_ref.h"
#include "ops/sample_host.h"
#include "qhead/error.h"

namespace qhead::sampling {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "sample", what); }

}  // namespace

void check_params(const SampleParams& p, int64_t vocab) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f)
    fail("temperature = " + std::to_string(p.temperature) + " must be finite and >= 0");
  if (p.top_k < 0 || p.top_k > vocab)
    fail("top_k = " + std::to_string(p.top_k) + " must be in [0, V = " + std::to_string(vocab) + "] (0: no top-k)");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("top_p = " + std::to_string(p.top_p) + " must be in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) fail("min_p = " + std::to_string(p.min_p) + " must be in [0, 1)");
  if (p.temperature > 0.0f && !std::isfinite(1.0f / p.temperature))
    fail("temperature = " + std::to_string(p.temperature) + " is too small: 1 / T overflows f32 (use 0 for argmax)");
}

bool truncated(const SampleParams& p) { return p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f; }

Cut cut_of(const SampleParams& p) {
  Cut c;
  c.top_k = p.top_k > 0;
  c.top_p = p.top_p;
  c.min_p = p.min_p;
  return c;
}

void from_logits(const float* logits, int64_t m, int64_t v, const SampleParams& p, int32_t* ids,
                 const int64_t* rows) {
  const float inv_t = p.temperature > 0.0f ? 1.0f / p.temperature : 1.0f;
  std::vector<float> z(static_cast<size_t>(v)), sorted(static_cast<size_t>(v));
  std::vector<int32_t> order(static_cast<size_t>(v));
  const Cut cut = cut_of(p);
  for (int64_t r = 0; r < m; ++r) {
    const float* l = logits + r * v;
    const int64_t i = rows ? rows[r] : r;  // the row of the call: its counter and its id slot
    if (p.temperature == 0.0f) {  // argmax, ties: lower id
      int64_t best = 0;
      for (int64_t j = 1; j < v; ++j)
        if (l[j] > l[best]) best = j;
      ids[i] = static_cast<int32_t>(best);
      continue;
    }
    for (int64_t j = 0; j < v; ++j) z[static_cast<size_t>(j)] = l[j] * inv_t;
    if (!truncated(p)) {  // Gumbel-max with the fused path's noise
      float bv = -std::numeric_limits<float>::infinity();
      int64_t bi = -1;
      for (int64_t j = 0; j < v; ++j) {
        const Philox4 w = gumbel_words(p.seed, p.offset, static_cast<uint32_t>(i), static_cast<uint32_t>(j / 4));
        const float val = z[static_cast<size_t>(j)] + gumbel(w.v[j % 4]);
        if (bi < 0 || val > bv) {
          bv = val;
          bi = j;
        }
      }
      ids[i] = static_cast<int32_t>(bi);
      continue;
    }
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const float za = z[static_cast<size_t>(a)], zb = z[static_cast<size_t>(b)];
      return za > zb || (za == zb && a < b);
    });
    double mx = z[static_cast<size_t>(order[0])], s = 0.0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(static_cast<double>(z[static_cast<size_t>(j)]) - mx);
    const double lse = mx + std::log(s);
    const int64_t k = p.top_k > 0 ? p.top_k : v;
    for (int64_t j = 0; j < k; ++j) sorted[static_cast<size_t>(j)] = z[static_cast<size_t>(order[static_cast<size_t>(j)])];
    const int j = draw_sorted(sorted.data(), k, lse, true, cut, draw_uniform(p.seed, p.offset, static_cast<uint32_t>(i)));
    ids[i] = order[static_cast<size_t>(j)];
  }
}

namespace {

// The CPU fused path of a truncated draw: the top-K candidates of l/T with
// the log-sum-exp of l/T, then the inverse CDF. The rows whose cut may lie
// past the candidates (no top_k) are drawn from their whole row of logits
// (one more pass over the table and a sort of the row: a cut that deep keeps
// a good part of the vocabulary). False: the table is not one the CPU
// kernels take.
bool cpu_truncated(const Table& table, const TensorView& x, const SampleParams& p, int32_t* ids) {
  const int64_t m = x.size(0), v = table.vocab(), h = table.hidden();
  const Cut cut = cut_of(p);
  const int64_t k = p.top_k > 0 ? p.top_k : std::min<int64_t>(v, kFirstCandidates);
  Tensor vals = Tensor::empty(DType::kF32, {m, k}), cids = Tensor::empty(DType::kI32, {m, k}),
         lse = Tensor::empty(DType::kF32, {m});
  if (!cpu::topk(table, x, k, vals.view(), cids.view(), lse.view(), 1.0f / p.temperature)) return false;
  const bool whole = p.top_k > 0 || k == v;
  std::vector<int64_t> left;  // the rows whose cut lies past the candidates
  for (int64_t i = 0; i < m; ++i) {
    const int j = draw_sorted(vals.view().ptr<float>() + i * k, k, lse.view().ptr<float>()[i], whole, cut,
                              draw_uniform(p.seed, p.offset, static_cast<uint32_t>(i)));
    if (j < 0)
      left.push_back(i);
    else
      ids[i] = cids.view().ptr<int32_t>()[i * k + j];
  }
  if (left.empty()) return true;
  const int64_t n = static_cast<int64_t>(left.size());
  const size_t rb = static_cast<size_t>(h) * dtype_size(x.dtype);
  Tensor xr = Tensor::empty(x.dtype, {n, h});
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(static_cast<const char*>(x.data) + static_cast<size_t>(left[static_cast<size_t>(i)]) * rb, rb,
                static_cast<char*>(xr.data()) + static_cast<size_t>(i) * rb);
  Tensor l = Tensor::empty(DType::kF32, {n, v});
  if (!cpu::logits(table, xr.view(), l.view())) return false;
  from_logits(l.view().ptr<float>(), n, v, p, ids, left.data());
  return true;
}

}  // namespace

void run_cpu(const Table& table, const TensorView& x, const SampleParams& p, const TensorView& ids,
             Backend backend) {
  const int64_t m = x.size(0), v = table.vocab();
  if (m == 0) return;
  int32_t* out = ids.ptr<int32_t>();
  const bool fast = backend == Backend::kAuto || backend == Backend::kFused;
  if (fast && p.temperature == 0.0f) {
    Tensor vals = Tensor::empty(DType::kF32, {m, 1}), lse = Tensor::empty(DType::kF32, {m});
    const TensorView iv(ids.data, DType::kI32, {m, 1});
    if (cpu::topk(table, x, 1, vals.view(), iv, lse.view())) return;
  } else if (fast && !truncated(p)) {
    if (cpu::sample_gumbel(table, x, 1.0f / p.temperature, p.seed, p.offset, ids)) return;
  } else if (fast) {
    if (cpu_truncated(table, x, p, out)) return;
  }
  // The reference (and every case the kernels do not take): the logits, then
  // the exact draw from them.
  Tensor l = Tensor::empty(DType::kF32, {m, v});
  if (backend == Backend::kFallbackBlas)
    blas::logits_fallback(table, x, l.view());
  else
    ref::logits(table, x, l.view());
  from_logits(l.view().ptr<float>(), m, v, p, out);
}

}  // namespace qhead::sampling
