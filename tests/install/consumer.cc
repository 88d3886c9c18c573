// A program outside the project, built against an installed qhead (CMake
// package or pkg-config): quantizes a seeded random table, runs logits and
// top-k, and checks them against float64 dot products on the dequantized rows.
// Exits 0 when every value is within the f32 bound, 1 otherwise.
#include <qhead/cuda.h>
#include <qhead/error.h>
#include <qhead/ops.h>
#include <qhead/quantize.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  const int64_t V = 37, H = 64, M = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  qhead::Tensor w = qhead::Tensor::empty(qhead::DType::kF32, {V, H});
  for (int64_t i = 0; i < V * H; ++i) w.ptr<float>()[i] = n(rng);
  qhead::Tensor x = qhead::Tensor::empty(qhead::DType::kF32, {M, H});
  for (int64_t i = 0; i < M * H; ++i) x.ptr<float>()[i] = n(rng);
  try {
    const qhead::Table t = qhead::quantize_table(qhead::Table::dense(w), qhead::QuantScheme::parse("w4g32"));
    const qhead::Tensor out = qhead::logits(t, x.view());
    const qhead::TopK top = qhead::topk(t, x.view(), 5);
    std::vector<float> row(H);
    int bad = 0;
    for (int64_t v = 0; v < V; ++v) {
      t.row_f32(v, row.data());
      for (int64_t m = 0; m < M; ++m) {
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < H; ++j) {
          ref += double(x.ptr<float>()[m * H + j]) * row[j];
          mag += std::fabs(double(x.ptr<float>()[m * H + j]) * row[j]);
        }
        const double bound = 2.0 * H * 0x1p-24 * mag + 1e-30;  // γ_H·Σ|x·w|, doubled for margin
        if (std::fabs(out.ptr<float>()[m * V + v] - ref) > bound) ++bad;
      }
    }
    for (int64_t m = 0; m < M; ++m)
      if (top.values.ptr<float>()[m * 5] != out.ptr<float>()[m * V + top.ids.ptr<int32_t>()[m * 5]]) ++bad;
    std::printf("qhead consumer: %s (%d bad values; cuda available: %s)\n", bad ? "FAILED" : "ok", bad,
                qhead::cuda::available() ? "yes" : "no");
    return bad ? 1 : 0;
  } catch (const qhead::Error& e) {
    std::fprintf(stderr, "qhead consumer: %s\n", e.what());
    return 1;
  }
}
