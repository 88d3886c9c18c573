// The sample op on the host: the exact draw from a row of logits (the
// reference, and every path's fallback) and the CPU driver. The contract is
// in qhead/ops.h; the shared pieces in sample.h.
#include "ops/sample.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/entry.h"
#include "core/parallel.h"
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

namespace {

// The whole-row draw sorts each row as 64-bit keys, ascending: the high word
// ~order_key(z) (larger z, smaller key; -0 takes the key of +0, as the order
// treats them as equal), the low word the id. Ascending keys are thus the
// order draw_sorted takes, value descending and ties to the lower id, and a
// sort compares keys without loading the values. A NaN sorts before +inf
// (sign bit clear) or after -inf (sign bit set).
inline uint32_t row_key_hi(float z) {
  uint32_t u = entry::float_bits(z);
  u = (u << 1) != 0 ? u : 0;  // -0 as +0
  // ~order_key: a negative value keeps its bits, a positive one flips all but the sign.
  const uint32_t neg = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);
  return u ^ (~neg & 0x7FFFFFFFu);
}
inline uint64_t row_key(float z, int64_t id) {
  return (static_cast<uint64_t>(row_key_hi(z)) << 32) | static_cast<uint32_t>(id);
}
inline float key_z(uint64_t key) { return entry::key_value(~static_cast<uint32_t>(key >> 32)); }
inline int32_t key_id(uint64_t key) { return static_cast<int32_t>(static_cast<uint32_t>(key)); }

// Sorts keys[0, n) ascending by their high word, stably: an LSD radix sort
// in kRadixDigits digits of kRadixBits bits, tmp[0, n) the other buffer; a
// digit that every key shares costs no pass. Keys built in id order (the id
// in the low word) thus end ascending as whole keys. Returns the buffer that
// holds the sorted keys (keys or tmp). 11-bit digits: three passes, the
// three histograms 24 KiB; on 151936 keys 0.65-0.85 ms, against 0.8-1.3 ms
// with 8-bit digits (four passes) and 8-8.6 ms for std::sort of the keys.
// Below kRadixMin keys std::sort is faster (the histograms' fixed cost; the
// same at 512 keys, 2x slower at 2048) and sorts them to the same order, the
// keys being distinct.
constexpr int kRadixBits = 11, kRadixDigits = (32 + kRadixBits - 1) / kRadixBits;
constexpr int64_t kRadixMin = 512;
uint64_t* sort_keys(uint64_t* keys, uint64_t* tmp, int64_t n) {
  constexpr uint32_t kBins = 1u << kRadixBits, kMask = kBins - 1;
  if (n < kRadixMin) {
    std::sort(keys, keys + n);
    return keys;
  }
  uint32_t count[kRadixDigits * kBins] = {};  // count[d * kBins + b]: the keys whose digit d is b
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t hi = static_cast<uint32_t>(keys[i] >> 32);
    for (int d = 0; d < kRadixDigits; ++d) ++count[d * kBins + ((hi >> (d * kRadixBits)) & kMask)];
  }
  uint64_t *src = keys, *dst = tmp;
  for (int d = 0; d < kRadixDigits; ++d) {
    const int shift = 32 + d * kRadixBits;
    uint32_t* c = count + d * kBins;
    if (c[(src[0] >> shift) & kMask] == static_cast<uint64_t>(n)) continue;
    uint32_t at = 0;  // c[b] becomes where the keys of digit b start
    for (uint32_t b = 0; b < kBins; ++b) {
      const uint32_t nb = c[b];
      c[b] = at;
      at += nb;
    }
    for (int64_t i = 0; i < n; ++i) dst[c[(src[i] >> shift) & kMask]++] = src[i];
    std::swap(src, dst);
  }
  return src;
}

// A top-k cut (k < V) of a row of at least kSelectMin columns sorts only
// the keys whose top kSelectBits bits are at most those of the k-th key (a
// histogram of the row's top bits finds them): k keys and those that share
// the k-th key's top bits. V = 151936, top_k 50: 0.45-0.62 ms a draw,
// against 1.09-1.25 ms with nth_element on all V keys, then a sort of the k.
// A smaller row sorts all its keys (8192 keys: ≈ 30 µs; the bound is not
// tuned).
constexpr int kSelectBits = 11;
constexpr int64_t kSelectMin = 8192;

// The buffers of one chunk of rows.
struct RowScratch {
  std::vector<uint64_t> keys;  // [V] the row's keys (a top-k cut: its candidates), sorted in place or into tmp
  std::vector<uint64_t> tmp;   // [V] the radix sort's other buffer
  std::vector<float> sorted;   // [k] the sorted candidates' z, for draw_sorted
  std::vector<uint32_t> hist;  // [2^kSelectBits] a top-k cut's histogram of the keys' top bits

  void fit(int64_t v, int64_t k) {
    const auto grow = [](auto& b, int64_t n) {
      if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
    };
    grow(keys, v);
    grow(tmp, v);
    grow(sorted, k);
    grow(hist, int64_t{1} << kSelectBits);
  }
};

// The scratch of finished calls, for the next: fresh [V] buffers cost their
// page faults on every call (V = 151936, one row a call: 4.8-5.0 ms a draw
// with fresh buffers, 2.8-3.2 ms reusing them). Holds at most one scratch per
// chunk that ran at once.
class ScratchCache {
 public:
  std::unique_ptr<RowScratch> take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::make_unique<RowScratch>();
    std::unique_ptr<RowScratch> s = std::move(free_.back());
    free_.pop_back();
    return s;
  }
  void give(std::unique_ptr<RowScratch> s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(s));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<RowScratch>> free_;
};
ScratchCache& scratch_cache() {
  static ScratchCache cache;
  return cache;
}

// One row under a cut: z = l * inv_t, its k candidates (the top_k; all V
// without top_k) sorted by their keys, the log-sum-exp of z in f64 where
// the cut needs it (the largest z, then exp(z_j - it) summed in column
// order), then draw_sorted at the row's uniform. Returns the drawn id.
// s: fitted to (v, k).
int32_t draw_row(const float* l, int64_t v, int64_t k, float inv_t, const SampleParams& p, const Cut& cut,
                 uint32_t row, RowScratch& s) {
  uint64_t* keys = s.keys.data();
  uint32_t neg_zero = 0;  // the row holds a -0 (keyed as +0)
  int64_t n = v;          // the keys to sort
  if (k == v || v < kSelectMin) {
    for (int64_t j = 0; j < v; ++j) {
      const float z = l[j] * inv_t;
      neg_zero |= entry::float_bits(z) == 0x80000000u;
      keys[j] = row_key(z, j);
    }
  } else {
    constexpr int kShift = 32 - kSelectBits;
    uint32_t* hist = s.hist.data();
    std::fill_n(hist, size_t{1} << kSelectBits, 0u);
    for (int64_t j = 0; j < v; ++j) {
      const float z = l[j] * inv_t;
      neg_zero |= entry::float_bits(z) == 0x80000000u;
      ++hist[row_key_hi(z) >> kShift];
    }
    uint32_t last = 0;       // the top bits of the k-th key
    int64_t upto = hist[0];  // the keys whose top bits are at most `last`
    while (upto < k) upto += hist[++last];
    n = 0;
    for (int64_t j = 0; j < v; ++j) {
      const float z = l[j] * inv_t;
      if ((row_key_hi(z) >> kShift) <= last) keys[n++] = row_key(z, j);
    }
  }
  const uint64_t* top = sort_keys(keys, s.tmp.data(), n);
  float* sorted = s.sorted.data();
  for (int64_t j = 0; j < k; ++j) sorted[j] = key_z(top[j]);
  if (neg_zero)  // the zeros' own signs
    for (int64_t j = 0; j < k; ++j)
      if (sorted[j] == 0.0f) sorted[j] = l[key_id(top[j])] * inv_t;
  // draw_sorted reads lse only for a top-p cut without top_k (the whole
  // row's weight); every other cut draws the same without it.
  double lse = 0.0;
  if (!cut.top_k && cut.top_p < 1.0) {
    const double mx = sorted[0];
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(l[j] * inv_t) - mx);
    lse = mx + std::log(sum);
  }
  const int j = draw_sorted(sorted, k, lse, true, cut, draw_uniform(p.seed, p.offset, row));
  return key_id(top[j]);
}

}  // namespace

void from_logits(const float* logits, int64_t m, int64_t v, const SampleParams& p, int32_t* ids,
                 const int64_t* rows) {
  const float inv_t = p.temperature > 0.0f ? 1.0f / p.temperature : 1.0f;
  const Cut cut = cut_of(p);
  const bool cut_rows = p.temperature > 0.0f && truncated(p);
  const int64_t k = p.top_k > 0 ? p.top_k : v;
  // Rows are independent (each has its own counter and id slot): chunks of
  // rows, at least 2^14 columns each, on parallel_for's threads.
  const int64_t min_rows = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(v, 1));
  const auto chunk = [&](int64_t r0, int64_t r1) {
    std::unique_ptr<RowScratch> s;
    if (cut_rows) {
      s = scratch_cache().take();
      s->fit(v, k);
    }
    std::vector<float> z(cut_rows ? 0 : static_cast<size_t>(v));
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = logits + r * v;
      const int64_t i = rows ? rows[r] : r;  // the row of the call: its counter and its id slot
      if (p.temperature == 0.0f) {  // argmax, ties: lower id
        int64_t best = 0;
        for (int64_t j = 1; j < v; ++j)
          if (l[j] > l[best]) best = j;
        ids[i] = static_cast<int32_t>(best);
      } else if (cut_rows) {
        ids[i] = draw_row(l, v, k, inv_t, p, cut, static_cast<uint32_t>(i), *s);
      } else {  // Gumbel-max with the fused path's noise
        for (int64_t j = 0; j < v; ++j) z[static_cast<size_t>(j)] = l[j] * inv_t;
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
      }
    }
    if (s) scratch_cache().give(std::move(s));
  };
  parallel_for(m, min_rows, chunk, num_threads());
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
