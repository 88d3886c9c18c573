// qhead demo — the README's main job until a real model is wired in.
//
// Builds a deterministic Qwen3-0.6B-shaped tied token table (151936 x 1024,
// BF16), writes it as a safetensors checkpoint, quantizes it to w4g64 with
// `qhead quantize`, shows `qhead inspect` of the result, and checks every op
// on the packed table against the scalar reference and a float64 oracle:
// quantization error bound, embed, logits (reference and dequant + BLAS),
// top-k + log-sum-exp, and argmax agreement with the dense table before and
// after exact rescoring of the top candidates.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "commands.h"
#include "qhead/ops.h"
#include "qhead/quantize.h"
#include "qhead/safetensors.h"

namespace qhead::cli {

namespace {

constexpr int64_t kVocab = 151936, kHidden = 1024;
constexpr const char* kTensor = "model.embed_tokens.weight";

// Counter-based generator: the table is the same on every machine and thread count.
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double unit(uint64_t x) { return double(splitmix(x) >> 11) * 0x1.0p-53; }
// Approximately N(0, 1): sum of four uniforms, centred and scaled.
float gauss(uint64_t key) {
  double s = 0;
  for (uint64_t i = 0; i < 4; ++i) s += unit(key * 4 + i);
  return float((s - 2.0) * std::sqrt(3.0));
}

// Calls fn(worker, begin, end) once per worker on disjoint chunks covering
// [0, n), the workers (up to `threads`, <= 0: default_num_threads()) running
// at once; the first exception a worker throws is rethrown here. Returns the
// number of workers.
int for_each_chunk(int64_t n, int threads, const std::function<void(int, int64_t, int64_t)>& fn) {
  const int workers = int(std::max<int64_t>(1, std::min<int64_t>(threads > 0 ? threads : default_num_threads(), n)));
  const int64_t chunk = (n + workers - 1) / workers;
  std::exception_ptr first_error;
  std::mutex mu;
  auto run = [&](int w) {
    try {
      const int64_t b = std::min(n, w * chunk), e = std::min(n, b + chunk);
      if (b < e) fn(w, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first_error) first_error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
  return workers;
}

// An embedding-like table: per-row scale in [0.5, 1.5] x 0.02, occasional outliers.
Tensor make_table(int threads) {
  Tensor t = Tensor::empty(DType::kBF16, {kVocab, kHidden});
  auto* p = t.ptr<uint16_t>();
  for_each_chunk(kVocab, threads, [&](int, int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float row_scale = 0.02f * float(0.5 + unit(uint64_t(r) ^ 0xabcdefull));
      for (int64_t j = 0; j < kHidden; ++j) {
        const uint64_t key = uint64_t(r) * uint64_t(kHidden) + uint64_t(j);
        float v = gauss(key) * row_scale;
        if (splitmix(key ^ 0x5555ull) % 4096 == 0) v *= 8.0f;  // outliers, as real tables have
        p[r * kHidden + j] = f32_to_bf16(v);
      }
    }
  });
  return t;
}

struct Check {
  std::string name;
  bool pass;
  std::string detail;
};

}  // namespace

int run_demo(const DemoArgs& a) {
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  namespace fs = std::filesystem;
  const fs::path dir = a.workdir.empty() ? fs::temp_directory_path() / fmt::format("qhead_demo_{}", ::getpid())
                                         : fs::path(a.workdir);
  fs::create_directories(dir);
  const std::string dense_path = (dir / "dense.safetensors").string();
  const std::string packed_path = (dir / "w4g64.safetensors").string();
  std::vector<Check> checks;
  auto log = [&](const std::string& s) {
    if (!a.json) fmt::print("{}\n", s);
  };

  // 1. The dense checkpoint.
  auto t0 = clock::now();
  {
    Tensor table = make_table(a.threads);
    SafetensorsWriter w;
    w.add(kTensor, table.view());
    w.set_metadata("qhead.demo", "deterministic Qwen3-0.6B-shaped tied table");
    w.write(dense_path);
  }
  log(fmt::format("== built {} [{} x {}] BF16 in {:.2f} s", kTensor, kVocab, kHidden, secs(t0)));

  // 2. qhead quantize, 3. qhead inspect.
  log("\n== qhead quantize " + dense_path + " --tensor " + kTensor + " --scheme w4g64 -o " + packed_path);
  QuantizeArgs qa{dense_path, kTensor, "w4g64", packed_path, std::nullopt, a.threads, a.json};
  nlohmann::json quantized;
  if (a.json) quantized = quantize_file(qa);
  else run_quantize(qa);
  if (!a.json) {
    log("\n== qhead inspect " + packed_path);
    run_inspect({packed_path, false});
  }

  // 4. Correctness on the packed table, used in place from the mapping.
  log("\n== correctness (packed table used in place via mmap; tied: one copy serves embed and logits)");
  const SafetensorsFile pf = SafetensorsFile::open(packed_path);
  const SafetensorsFile df = SafetensorsFile::open(dense_path);
  const Table dense = Table::dense(df.get(kTensor));
  const TokenTables roles = quantize_roles(load_packed(pf, "model.embed_tokens"), nullptr, std::nullopt, std::nullopt);
  const Table& q = roles.head;
  const PackedTable& pt = q.packed();
  checks.push_back({"tied: one packed copy for both roles", roles.tied() && roles.embedding.same_storage(roles.head),
                    fmt::format("{} of packed storage", human_bytes(double(q.nbytes())))});

  // 4a. |w - ŵ| <= s/2 · (1 + slack) everywhere. RTN alone gives s/2 (int4
  //     symmetric, s = amax/7.5: +amax maps to 7.5 and clamps to 7, still s/2).
  //     compressed-tensors' arithmetic adds BF16 roundings: s is rounded to
  //     BF16 (relative 2^-8), so |x/s| reaches 7.5·(1 + 2^-8) and clamps to 7
  //     with error 0.5 + 7.5·2^-8; x/s itself is rounded to BF16 (at most
  //     2^-6 below 8). Slack = 2·max(7.5·2^-8, 2^-6) = 0.0586.
  t0 = clock::now();
  constexpr double kSlackBound = 1.0 + 2.0 * 7.5 / 256.0;
  std::atomic<int64_t> violations{0};
  const int workers = int(std::min<int64_t>(a.threads > 0 ? a.threads : default_num_threads(), kVocab));
  std::vector<double> worst(size_t(std::max(workers, 1)), 0.0);  // one slot per worker
  for_each_chunk(kVocab, workers, [&](int my, int64_t b, int64_t e) {
    std::vector<float> wq(kHidden), wd(kHidden);
    for (int64_t r = b; r < e; ++r) {
      q.row_f32(r, wq.data());
      dense.row_f32(r, wd.data());
      for (int64_t j = 0; j < kHidden; ++j) {
        const double s = load_as_f32(pt.scale.data(), pt.scale.dtype(), r * pt.scheme.groups(kHidden) + j / 64);
        const double ratio = std::fabs(double(wq[j]) - double(wd[j])) / (s / 2);
        worst[size_t(my)] = std::max(worst[size_t(my)], ratio);
        if (ratio > kSlackBound) violations++;
      }
    }
  });
  const double worst_ratio = *std::max_element(worst.begin(), worst.end());
  checks.push_back({"quantization error |w - w_q| <= s/2 (1 + 0.0586 for BF16 rounding)", violations == 0,
                    fmt::format("max |w - w_q| / (s/2) = {:.4f} over {} values ({:.1f} s)", worst_ratio,
                                kVocab * kHidden, secs(t0))});

  // 4b. embed: gathered rows equal the dequantized rows, bit for bit.
  std::vector<int32_t> idv = {0, 1, 2, 151935, 77777, 12345, 151934, 0};
  Tensor ids = Tensor::empty(DType::kI32, {int64_t(idv.size())});
  std::copy(idv.begin(), idv.end(), ids.ptr<int32_t>());
  Tensor e = embed(roles.embedding, ids.view());
  bool emb_ok = true;
  std::vector<float> row(kHidden);
  for (size_t i = 0; i < idv.size(); ++i) {
    pt.dequantize_row(idv[i], row.data());
    emb_ok &= std::memcmp(row.data(), e.ptr<float>() + int64_t(i) * kHidden, kHidden * 4) == 0;
  }
  checks.push_back({"embed == dequantized rows (exact)", emb_ok, fmt::format("{} ids incl. 0 and V-1", idv.size())});

  // 4c. logits: reference vs dequant+BLAS vs a float64 oracle.
  const int64_t M = 4;
  Tensor x = Tensor::empty(DType::kBF16, {M, kHidden});
  std::mt19937_64 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < M * kHidden; ++i) x.ptr<uint16_t>()[i] = f32_to_bf16(nd(rng));
  t0 = clock::now();
  Tensor lr = Tensor::empty(DType::kF32, {M, kVocab});
  logits(q, x.view(), lr.view(), Backend::kReference);
  const double t_ref = secs(t0);
  t0 = clock::now();
  Tensor lb = Tensor::empty(DType::kF32, {M, kVocab});
  logits(q, x.view(), lb.view(), Backend::kFallbackBlas);
  const double t_blas = secs(t0);
  t0 = clock::now();
  Tensor lf = Tensor::empty(DType::kF32, {M, kVocab});
  logits(q, x.view(), lf.view(), Backend::kAuto);  // the fused CPU kernels (AVX2/AVX-512) where available
  const double t_fused = secs(t0);
  // Bound for an f32 dot product of length H: γ_H Σ|x w|, γ_H = H u / (1 - H u), u = 2^-24.
  const double u = std::ldexp(1.0, -24), gamma = kHidden * u / (1 - kHidden * u);
  double worst_ref = 0, worst_blas = 0, worst_fused = 0;
  std::vector<float> xf(size_t(M * kHidden));
  convert(x.data(), DType::kBF16, xf.data(), DType::kF32, M * kHidden);
  for (int64_t r = 0; r < kVocab; r += 37) {
    pt.dequantize_row(r, row.data());
    for (int64_t i = 0; i < M; ++i) {
      double exact = 0, mag = 0;
      for (int64_t j = 0; j < kHidden; ++j) {
        exact += double(xf[size_t(i * kHidden + j)]) * row[size_t(j)];
        mag += std::fabs(double(xf[size_t(i * kHidden + j)]) * row[size_t(j)]);
      }
      const double bound = gamma * mag + 1e-30;
      worst_ref = std::max(worst_ref, std::fabs(lr.ptr<float>()[i * kVocab + r] - exact) / bound);
      worst_blas = std::max(worst_blas, std::fabs(lb.ptr<float>()[i * kVocab + r] - exact) / bound);
      worst_fused = std::max(worst_fused, std::fabs(lf.ptr<float>()[i * kVocab + r] - exact) / bound);
    }
  }
  checks.push_back({"logits reference within f32 dot-product bound", worst_ref <= 1.0,
                    fmt::format("max err / bound = {:.3f} (M = {}, {:.2f} s)", worst_ref, M, t_ref)});
  checks.push_back({"logits dequant + BLAS within the same bound", worst_blas <= 1.0,
                    fmt::format("max err / bound = {:.3f} ({:.2f} s)", worst_blas, t_blas)});
  checks.push_back({"logits fused (kAuto) within the same bound", worst_fused <= 1.0,
                    fmt::format("max err / bound = {:.3f} ({:.3f} s)", worst_fused, t_fused)});

  // 4d. top-k (kAuto: the fused pass, whose logits are the fused kernel's):
  //     ids and values equal the sorted fused logits; lse vs float64.
  const int64_t K = 50;
  t0 = clock::now();
  TopK tk = topk(q, x.view(), K);
  const double t_topk = secs(t0);
  bool topk_ok = true;
  double lse_err = 0;
  for (int64_t i = 0; i < M; ++i) {
    std::vector<int32_t> order(static_cast<size_t>(kVocab));
    for (int64_t r = 0; r < kVocab; ++r) order[size_t(r)] = int32_t(r);
    const float* li = lf.ptr<float>() + i * kVocab;
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t p, int32_t qq) {
      return li[p] > li[qq] || (li[p] == li[qq] && p < qq);
    });
    for (int64_t k = 0; k < K; ++k)
      topk_ok &= tk.ids.ptr<int32_t>()[i * K + k] == order[size_t(k)] &&
                 tk.values.ptr<float>()[i * K + k] == li[order[size_t(k)]];
    double mx = -INFINITY, s = 0;
    for (int64_t r = 0; r < kVocab; ++r) mx = std::max(mx, double(li[r]));
    for (int64_t r = 0; r < kVocab; ++r) s += std::exp(double(li[r]) - mx);
    lse_err = std::max(lse_err, std::fabs(double(tk.logsumexp.ptr<float>()[i]) - (mx + std::log(s))));
  }
  checks.push_back({"top-k (k = 50) == sorted fused logits", topk_ok,
                    fmt::format("M = {}, {:.2f} s, never stores [M, V]", M, t_topk)});
  checks.push_back({"log-sum-exp vs float64", lse_err <= 1e-5 * 16,
                    fmt::format("max |err| = {:.2e}", lse_err)});

  // 4e. argmax: quantized vs dense; then exact rescoring of the top-50.
  Tensor ld = Tensor::empty(DType::kF32, {M, kVocab});
  logits(dense, x.view(), ld.view(), Backend::kReference);
  Rescored rs = rescore(dense, x.view(), tk.ids.view());
  int agree = 0, agree_rescored = 0;
  for (int64_t i = 0; i < M; ++i) {
    const float* di = ld.ptr<float>() + i * kVocab;
    const int64_t dense_arg = std::max_element(di, di + kVocab) - di;
    agree += tk.ids.ptr<int32_t>()[i * K] == dense_arg;
    agree_rescored += rs.ids.ptr<int32_t>()[i * K] == dense_arg;
  }
  checks.push_back({"argmax after exact rescoring of the top-50 == dense argmax", agree_rescored == M,
                    fmt::format("quantized argmax agrees on {}/{} synthetic states, rescored on {}/{}", agree, M,
                                agree_rescored, M)});

  bool all = true;
  for (const auto& c : checks) all &= c.pass;
  if (a.json) {
    nlohmann::json j;
    j["quantize"] = quantized;
    j["table"] = {{"vocab", kVocab}, {"hidden", kHidden}, {"scheme", "w4g64"}, {"file", packed_path},
                  {"packed_bytes", q.nbytes()}, {"dense_bytes", dense.nbytes()}};
    j["checks"] = nlohmann::json::array();
    for (const auto& c : checks) j["checks"].push_back({{"name", c.name}, {"pass", c.pass}, {"detail", c.detail}});
    j["pass"] = all;
    fmt::print("{}\n", j.dump(2));
  } else {
    for (const auto& c : checks) fmt::print("  [{}] {}: {}\n", c.pass ? "PASS" : "FAIL", c.name, c.detail);
    fmt::print("\n{}\n", all ? "all checks passed" : "SOME CHECKS FAILED");
  }
  if (!a.keep && a.workdir.empty()) fs::remove_all(dir);
  return all ? 0 : 1;
}

}  // namespace qhead::cli
