// The scalar reference: plain loops, one row at a time, f32 accumulation in
// index order. This is the spec of every op and the oracle of every test.
#include "ops/ops_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/parallel.h"

namespace qhead::ref {

namespace {

// x row m as f32.
void x_row(const TensorView& x, int64_t m, float* out) {
  const int64_t h = x.size(1);
  convert(static_cast<const char*>(x.data) + m * h * dtype_size(x.dtype), x.dtype, out, DType::kF32, h);
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t j = 0; j < n; ++j) acc += a[j] * b[j];
  return acc;
}

// Orders candidates: larger value first, then lower id.
struct Cand {
  float value;
  int32_t id;
};
inline bool better(const Cand& a, const Cand& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

}  // namespace

void embed(const Table& table, const TensorView& ids, const TensorView& out) {
  const int64_t n = ids.size(0), h = table.hidden();
  parallel_for(n, 16, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(h));
    for (int64_t i = b; i < e; ++i) {
      table.row_f32(id_at(ids, i), row.data());
      convert(row.data(), DType::kF32, static_cast<char*>(out.data) + i * h * dtype_size(out.dtype), out.dtype, h);
    }
  });
}

void logits(const Table& table, const TensorView& x, const TensorView& out) {
  const int64_t m = x.size(0), h = x.size(1), v = table.vocab();
  std::vector<float> xf(static_cast<size_t>(m * h));
  for (int64_t i = 0; i < m; ++i) x_row(x, i, xf.data() + i * h);
  float* o = out.ptr<float>();
  parallel_for(v, 64, [&](int64_t b, int64_t e) {
    std::vector<float> w(static_cast<size_t>(h));
    for (int64_t r = b; r < e; ++r) {
      table.row_f32(r, w.data());
      for (int64_t i = 0; i < m; ++i) o[i * v + r] = dot(xf.data() + i * h, w.data(), h);
    }
  });
}

void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values,
          const TensorView& ids, const TensorView& lse) {
  const int64_t m = x.size(0), h = x.size(1), v = table.vocab();
  std::vector<float> xf(static_cast<size_t>(h)), w(static_cast<size_t>(h));
  for (int64_t i = 0; i < m; ++i) {
    x_row(x, i, xf.data());
    // A min-heap (worst candidate on top) of the best k seen so far, and an
    // online log-sum-exp: running max `mx` and Σ exp(l - mx) in double.
    std::vector<Cand> heap;
    heap.reserve(static_cast<size_t>(k));
    auto worse_on_top = [](const Cand& a, const Cand& b) { return better(a, b); };
    double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (int64_t r = 0; r < v; ++r) {
      table.row_f32(r, w.data());
      const float l = dot(xf.data(), w.data(), h);
      const double ld = l;
      if (ld > mx) {
        sum = sum * std::exp(mx - ld) + 1.0;
        mx = ld;
      } else {
        sum += std::exp(ld - mx);
      }
      const Cand c{l, static_cast<int32_t>(r)};
      if (static_cast<int64_t>(heap.size()) < k) {
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), worse_on_top);
      } else if (better(c, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), worse_on_top);
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), worse_on_top);
      }
    }
    std::sort(heap.begin(), heap.end(), better);
    for (int64_t j = 0; j < k; ++j) {
      values.ptr<float>()[i * k + j] = heap[static_cast<size_t>(j)].value;
      ids.ptr<int32_t>()[i * k + j] = heap[static_cast<size_t>(j)].id;
    }
    lse.ptr<float>()[i] = static_cast<float>(mx + std::log(sum));
  }
}

void rescore(const Table& dense, const TensorView& x, const TensorView& candidates,
             const TensorView& values, const TensorView& ids) {
  const int64_t m = x.size(0), h = x.size(1), k = candidates.size(1);
  std::vector<float> xf(static_cast<size_t>(h)), w(static_cast<size_t>(h));
  std::vector<Cand> c(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    x_row(x, i, xf.data());
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = id_at(candidates, i * k + j);
      dense.row_f32(id, w.data());
      c[static_cast<size_t>(j)] = {dot(xf.data(), w.data(), h), static_cast<int32_t>(id)};
    }
    std::sort(c.begin(), c.end(), better);
    for (int64_t j = 0; j < k; ++j) {
      values.ptr<float>()[i * k + j] = c[static_cast<size_t>(j)].value;
      ids.ptr<int32_t>()[i * k + j] = c[static_cast<size_t>(j)].id;
    }
  }
}

}  // namespace qhead::ref
