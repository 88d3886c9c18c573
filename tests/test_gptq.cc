// GPTQ checkpoints (include/qhead/model.h): a GPTQ head is converted at load
// into the native packed layout — with a column permutation for act-order —
// and every op on it must give the values GPTQ's formula defines:
//   w[v, k] = scales[g_idx[k], v] · (q[k, v] − z[g_idx[k], v])
// Model directories are written here from random codes in GPTQ's own layout
// (packing done by this file, independently of the loader); the real tools'
// checkpoints are tested on the fixtures in tests/fixtures/gptq.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "qhead/cuda.h"
#include "qhead/model.h"
#include "qhead/model_write.h"
#include "qhead/ops.h"
#include "qhead/safetensors.h"
#include "test_util.h"

namespace qhead {
namespace {

namespace fs = std::filesystem;
namespace qt = qhead::test;
using nlohmann::json;

struct GptqCase {
  int bits;
  int group;  // -1: per row
  bool asym;
  int version;  // 1: zeros stored z − 1; 2: stored z
  bool act_order;
  int64_t v, h;
};

std::string case_name(const ::testing::TestParamInfo<GptqCase>& i) {
  const GptqCase& c = i.param;
  return "w" + std::to_string(c.bits) + (c.group < 0 ? std::string("row") : "g" + std::to_string(c.group)) +
         (c.asym ? "asym" : "sym") + "_v" + std::to_string(c.version) + (c.act_order ? "_actorder" : "") + "_V" +
         std::to_string(c.v) + "_H" + std::to_string(c.h);
}

// A temporary directory removed at the end of the test.
struct TempDir {
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "qhead_gptq_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path path;
};

// Writes a Llama-shaped model directory whose lm_head is stored in GPTQ form
// and returns the head's dequantized weights [V, H] computed from the same
// random codes (the oracle). `edit` may change the config before it is written.
struct Written {
  std::vector<float> w;     // [V, H] expected head weights
  std::vector<float> emb;   // [V, H] the dense embedding
};
Written write_gptq_model(const fs::path& dir, const GptqCase& c, uint64_t seed,
                         const std::function<void(json&)>& edit = {},
                         const std::function<void(std::map<std::string, Tensor>&)>& edit_tensors = {}) {
  qt::Rng rng(seed);
  const int b = c.bits, pack = 32 / b, mid = 1 << (b - 1), top = (1 << b) - 1;
  const int64_t v = c.v, h = c.h, gl = c.group > 0 ? c.group : h, g = h / gl;
  // g_idx: k / gs, or a random act-order (column k sits at position pos[k] of
  // the activation order and belongs to group pos[k] / gs).
  std::vector<int32_t> g_idx(static_cast<size_t>(h));
  std::vector<int64_t> pos(static_cast<size_t>(h));
  std::iota(pos.begin(), pos.end(), 0);
  if (c.act_order) std::shuffle(pos.begin(), pos.end(), rng);
  for (int64_t k = 0; k < h; ++k) g_idx[static_cast<size_t>(k)] = static_cast<int32_t>(pos[static_cast<size_t>(k)] / gl);

  std::uniform_int_distribution<int> code(0, top), zero(c.version == 1 ? 1 : 0, top);
  std::uniform_real_distribution<float> sdist(1.0f / 64, 1.0f / 16);
  std::vector<int> q(static_cast<size_t>(h * v)), z(static_cast<size_t>(g * v));
  std::vector<uint16_t> s(static_cast<size_t>(g * v));
  for (auto& x : q) x = code(rng);
  for (auto& x : z) x = c.asym ? zero(rng) : mid;
  for (auto& x : s) x = f32_to_f16(sdist(rng));

  Tensor qweight = Tensor::empty(DType::kI32, {h / pack, v});
  Tensor qzeros = Tensor::empty(DType::kI32, {g, (v * b + 31) / 32});
  Tensor scales = Tensor::empty(DType::kF16, {g, v});
  Tensor gidx = Tensor::empty(DType::kI32, {h});
  uint32_t* qw = qweight.ptr<uint32_t>();
  for (int64_t k = 0; k < h; ++k)
    for (int64_t n = 0; n < v; ++n)
      qw[(k / pack) * v + n] |= static_cast<uint32_t>(q[static_cast<size_t>(k * v + n)]) << (b * (k % pack));
  uint32_t* qz = qzeros.ptr<uint32_t>();
  const int64_t zc = qzeros.size(1);
  for (int64_t gi = 0; gi < g; ++gi)
    for (int64_t n = 0; n < v; ++n) {
      const uint32_t stored = static_cast<uint32_t>(z[static_cast<size_t>(gi * v + n)] - (c.version == 1 ? 1 : 0));
      qz[gi * zc + n / pack] |= stored << (b * (n % pack));
    }
  std::memcpy(scales.data(), s.data(), s.size() * 2);
  std::memcpy(gidx.data(), g_idx.data(), g_idx.size() * 4);

  Written out;
  out.w.resize(static_cast<size_t>(v * h));
  for (int64_t n = 0; n < v; ++n)
    for (int64_t k = 0; k < h; ++k) {
      const int64_t gi = g_idx[static_cast<size_t>(k)];
      out.w[static_cast<size_t>(n * h + k)] =
          f16_to_f32(s[static_cast<size_t>(gi * v + n)]) *
          static_cast<float>(q[static_cast<size_t>(k * v + n)] - z[static_cast<size_t>(gi * v + n)]);
    }
  Tensor emb = qt::random_tensor(DType::kF16, v, h, seed + 1);
  out.emb = qt::to_f32(emb.view());

  std::map<std::string, Tensor> tensors = {{"model.embed_tokens.weight", emb},
                                           {"lm_head.qweight", qweight},
                                           {"lm_head.qzeros", qzeros},
                                           {"lm_head.scales", scales},
                                           {"lm_head.g_idx", gidx},
                                           {"model.norm.weight", qt::random_tensor(DType::kF16, 1, h, seed + 2)}};
  if (edit_tensors) edit_tensors(tensors);
  SafetensorsWriter wr;
  for (const auto& [name, t] : tensors) wr.add(name, t.view());
  wr.write((dir / "model.safetensors").string());

  json cfg = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", v},
              {"hidden_size", h},
              {"tie_word_embeddings", false},
              {"quantization_config",
               {{"quant_method", "gptq"},
                {"bits", b},
                {"group_size", c.group},
                {"desc_act", c.act_order},
                {"sym", !c.asym},
                {"lm_head", true},
                {"checkpoint_format", c.version == 1 ? "gptq" : "gptq_v2"}}}};
  if (edit) edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return out;
}

// x [M, H] f32 in [-1, 1).
Tensor random_x(int64_t m, int64_t h, uint64_t seed) { return qt::random_tensor(DType::kF32, m, h, seed); }

// Oracle logits [M, V] in double and the error bound of each.
struct Oracle {
  std::vector<double> l, tol;
};
// CPU: f32 accumulation in any order (logit_tol). CUDA (`cuda`): the kernels
// add at most one f32 rounding per group scale on top (γ_{H+H+1}(2u32) covers
// any grouping, as tests/test_cuda.cc derives), and the dequant + cuBLAS path
// rounds each weight to f16 once (u16).
Oracle oracle(const std::vector<float>& w, const std::vector<float>& x, int64_t m, int64_t v, int64_t h, bool cuda) {
  Oracle o;
  o.l.resize(static_cast<size_t>(m * v));
  o.tol.resize(o.l.size());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t n = 0; n < v; ++n) {
      const qt::Dot d = qt::dot_f64(x.data() + r * h, w.data() + n * h, h);
      o.l[static_cast<size_t>(r * v + n)] = d.value;
      o.tol[static_cast<size_t>(r * v + n)] =
          cuda ? (qt::gamma_n(2 * h + 1, 2 * qt::kU32) + qt::unit_roundoff(DType::kF16) + qt::gamma_n(h + 4, qt::kU64)) *
                         d.abs_sum + 1e-30
               : qt::logit_tol(d, h);
    }
  return o;
}

// Runs logits, top-k and embed on `t` (CPU or, when `cuda`, on a device copy)
// with `backend` and checks them against the oracle.
void check_ops(const Table& host_table, const std::vector<float>& w, Backend backend, bool cuda, uint64_t seed) {
  const int64_t v = host_table.vocab(), h = host_table.hidden();
  const Table t = cuda ? cuda::to_device(host_table) : host_table;
  auto dev = [&](const Tensor& x) { return cuda ? cuda::to_device(x.view()) : x; };
  auto host = [&](const Tensor& x) { return cuda ? cuda::to_host(x.view()) : x; };
  for (int64_t m : {int64_t(1), int64_t(3), int64_t(17)}) {
    SCOPED_TRACE("M = " + std::to_string(m));
    // CUDA ops take f16/bf16 activations; the oracle sees the same values.
    const Tensor x = cuda ? qt::random_tensor(DType::kF16, m, h, seed + static_cast<uint64_t>(m))
                          : random_x(m, h, seed + static_cast<uint64_t>(m));
    const Oracle o = oracle(w, qt::to_f32(x.view()), m, v, h, cuda);
    // logits
    Tensor out = Tensor::empty(DType::kF32, {m, v});
    qt::poison(out.view());
    Tensor out_d = dev(out);
    logits(t, dev(x).view(), out_d.view(), backend);
    out = host(out_d);
    int64_t bad = 0;
    for (int64_t i = 0; i < m * v; ++i) {
      const double got = out.ptr<float>()[i];
      if (!(std::fabs(got - o.l[static_cast<size_t>(i)]) <= o.tol[static_cast<size_t>(i)] + std::fabs(o.l[static_cast<size_t>(i)]) * qt::kU32))
        if (++bad <= 3)
          ADD_FAILURE() << "logit " << i << ": got " << got << ", oracle " << o.l[static_cast<size_t>(i)] << " ± "
                        << o.tol[static_cast<size_t>(i)];
    }
    EXPECT_EQ(bad, 0);
    // top-k: every returned value is its id's logit, ids distinct, values
    // sorted, and nothing left out beats the k-th by more than the bounds.
    const int64_t k = std::min<int64_t>(5, v);
    Tensor vals = Tensor::empty(DType::kF32, {m, k}), ids = Tensor::empty(DType::kI32, {m, k}),
           lse = Tensor::empty(DType::kF32, {m});
    qt::poison(vals.view());
    qt::poison(ids.view(), -1);
    qt::poison(lse.view());
    Tensor vals_d = dev(vals), ids_d = dev(ids), lse_d = dev(lse);
    topk(t, dev(x).view(), k, vals_d.view(), ids_d.view(), lse_d.view(), backend);
    vals = host(vals_d);
    ids = host(ids_d);
    lse = host(lse_d);
    double max_tol = 0;
    for (double tt : o.tol) max_tol = std::max(max_tol, tt);
    for (int64_t r = 0; r < m; ++r) {
      std::vector<char> chosen(static_cast<size_t>(v), 0);
      double kth = INFINITY;
      for (int64_t i = 0; i < k; ++i) {
        const int32_t id = ids.ptr<int32_t>()[r * k + i];
        ASSERT_TRUE(id >= 0 && id < v) << "row " << r << " slot " << i << " id " << id;
        ASSERT_FALSE(chosen[static_cast<size_t>(id)]) << "id " << id << " returned twice";
        chosen[static_cast<size_t>(id)] = 1;
        const double want = o.l[static_cast<size_t>(r * v + id)];
        const float got = vals.ptr<float>()[r * k + i];
        EXPECT_LE(std::fabs(got - want), o.tol[static_cast<size_t>(r * v + id)] + std::fabs(want) * qt::kU32)
            << "row " << r << " id " << id;
        kth = std::min(kth, want);
      }
      for (int64_t n = 0; n < v; ++n)
        if (!chosen[static_cast<size_t>(n)])
          EXPECT_LE(o.l[static_cast<size_t>(r * v + n)], kth + 2 * max_tol) << "row " << r << ": id " << n << " left out";
      // lse: 1-Lipschitz in the logits' max error, plus f32 evaluation
      // (exp to ~2^-22 relative, a length-V f32 sum) and the final rounding.
      double mx = -INFINITY, sum = 0;
      for (int64_t n = 0; n < v; ++n) mx = std::max(mx, o.l[static_cast<size_t>(r * v + n)]);
      for (int64_t n = 0; n < v; ++n) sum += std::exp(o.l[static_cast<size_t>(r * v + n)] - mx);
      const double want = mx + std::log(sum);
      const double tol = max_tol + qt::gamma_n(v + 2, qt::kU32) + std::ldexp(1.0, -21) + std::fabs(want) * qt::kU32;
      EXPECT_LE(std::fabs(lse.ptr<float>()[r] - want), tol) << "lse row " << r;
    }
  }
  // embed: rows come back in hidden order, exactly (f32 output).
  std::vector<int32_t> idv = {0, static_cast<int32_t>(v - 1), static_cast<int32_t>(v / 2), 0};
  Tensor ids = Tensor::empty(DType::kI32, {static_cast<int64_t>(idv.size())});
  std::memcpy(ids.data(), idv.data(), idv.size() * 4);
  Tensor rows = Tensor::empty(DType::kF32, {ids.size(0), h});
  qt::poison(rows.view());
  Tensor rows_d = dev(rows);
  embed(t, dev(ids).view(), rows_d.view(), backend);
  rows = host(rows_d);
  for (size_t i = 0; i < idv.size(); ++i)
    ASSERT_EQ(std::memcmp(rows.ptr<float>() + i * h, w.data() + idv[i] * h, static_cast<size_t>(h) * 4), 0)
        << "embed row " << idv[i];
}

class GptqConvert : public ::testing::TestWithParam<GptqCase> {};

TEST_P(GptqConvert, LoadsExactlyAndOpsMatchTheFormula) {
  const GptqCase& c = GetParam();
  TempDir d;
  const Written wr = write_gptq_model(d.path, c, 1000 + static_cast<uint64_t>(c.bits * 7 + c.group + c.v));
  ModelInfo m;
  const TokenTables t = load_model_tables(d.path.string(), {}, &m);
  EXPECT_EQ(m.quant_method, "gptq");
  EXPECT_FALSE(m.tied);
  EXPECT_EQ(m.embedding.format, ModelInfo::Format::kDense);
  EXPECT_EQ(m.head.format, ModelInfo::Format::kGptq);
  EXPECT_EQ(m.head.gptq_version, c.version);
  EXPECT_EQ(m.head.act_order, c.act_order);
  ASSERT_TRUE(m.head.scheme);
  EXPECT_EQ(m.head.scheme->bits, c.bits);
  EXPECT_EQ(m.head.scheme->group_size, c.group);
  EXPECT_EQ(m.head.scheme->symmetric, !c.asym);
  EXPECT_EQ(m.head.scheme->scale_dtype, DType::kF16);
  ASSERT_TRUE(t.head.is_packed());
  EXPECT_EQ(t.head.has_col_perm(), c.act_order);
  EXPECT_FALSE(t.embedding.is_packed());

  // Every row, dequantized, equals the formula exactly ((q − z) · s is exact in f32).
  std::vector<float> row(static_cast<size_t>(c.h));
  for (int64_t n = 0; n < c.v; ++n) {
    t.head.row_f32(n, row.data());
    ASSERT_EQ(std::memcmp(row.data(), wr.w.data() + n * c.h, row.size() * 4), 0) << "row " << n;
  }
  const Tensor dense = t.head.to_dense_f32();
  EXPECT_EQ(std::memcmp(dense.data(), wr.w.data(), wr.w.size() * 4), 0);

  for (Backend be : {Backend::kReference, Backend::kAuto, Backend::kFallbackBlas}) {
    SCOPED_TRACE(std::string("backend ") + std::to_string(static_cast<int>(be)));
    check_ops(t.head, wr.w, be, false, 77);
  }
  if (cuda::available()) {
    for (Backend be : {Backend::kAuto, Backend::kFused, Backend::kFallbackBlas}) {
      SCOPED_TRACE(std::string("cuda backend ") + std::to_string(static_cast<int>(be)));
      check_ops(t.head, wr.w, be, true, 91);
    }
    // One device allocation holds the converted table, the permutation included.
    const size_t before = cuda::allocation_count();
    const Table dt = cuda::to_device(t.head);
    EXPECT_EQ(cuda::allocation_count(), before + 1);
    EXPECT_EQ(dt.has_col_perm(), c.act_order);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, GptqConvert,
    ::testing::Values(GptqCase{4, 32, true, 1, true, 50, 128}, GptqCase{4, 32, true, 1, false, 50, 128},
                      GptqCase{4, 64, false, 1, true, 3, 256}, GptqCase{4, 128, true, 2, true, 67, 256},
                      GptqCase{4, -1, true, 1, false, 33, 96}, GptqCase{8, 64, true, 2, true, 50, 128},
                      GptqCase{8, 32, false, 1, false, 1, 64}, GptqCase{8, -1, true, 1, false, 50, 64},
                      GptqCase{2, 32, true, 1, true, 50, 64}, GptqCase{2, 64, false, 2, false, 17, 128},
                      GptqCase{4, 32, true, 2, true, 1000, 512}),
    case_name);

// ---- malformed checkpoints ------------------------------------------------------

void expect_error(const std::function<void()>& f, ErrorCode code, std::initializer_list<std::string> fragments) {
  const std::string msg = qt::expect_error(f, code);
  for (const auto& s : fragments) EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
}

const GptqCase kBase{4, 32, true, 1, true, 50, 128};

TEST(GptqErrors, V1ZeroPointOutOfRange) {
  TempDir d;
  write_gptq_model(d.path, kBase, 5, {}, [](std::map<std::string, Tensor>& t) {
    t["lm_head.qzeros"].ptr<uint32_t>()[0] |= 0xFu;  // stored 15: z = 16
  });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kUnsupported, {"lm_head.qzeros[0, row 0]", "z = 16"});
}

TEST(GptqErrors, UnevenActOrderGroups) {
  TempDir d;
  write_gptq_model(d.path, kBase, 6, {}, [](std::map<std::string, Tensor>& t) {
    int32_t* g = t["lm_head.g_idx"].ptr<int32_t>();
    g[0] = (g[0] + 1) % 4;  // one group gains a column, another loses one
  });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kUnsupported, {"lm_head.g_idx", "exactly group_size = 32"});
}

TEST(GptqErrors, GroupIndexOutOfRange) {
  TempDir d;
  write_gptq_model(d.path, kBase, 7, {}, [](std::map<std::string, Tensor>& t) { t["lm_head.g_idx"].ptr<int32_t>()[5] = 4; });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kInvalidFile, {"lm_head.g_idx[5] = 4"});
}

TEST(GptqErrors, ShapesDisagreeWithConfig) {
  TempDir d;
  write_gptq_model(d.path, kBase, 8, [](json& c) { c["quantization_config"]["group_size"] = 64; });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kInvalidFile, {"lm_head.scales", "group_size 64"});
  TempDir d2;
  write_gptq_model(d2.path, kBase, 8, [](json& c) { c["quantization_config"]["bits"] = 8; });
  expect_error([&] { inspect_model(d2.path.string()); }, ErrorCode::kInvalidFile, {"lm_head"});
}

TEST(GptqErrors, MissingPartAndBias) {
  TempDir d;
  write_gptq_model(d.path, kBase, 9, {}, [](std::map<std::string, Tensor>& t) { t.erase("lm_head.qzeros"); });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kInvalidFile, {"no lm_head.qzeros"});
  TempDir d2;
  write_gptq_model(d2.path, kBase, 9, {}, [](std::map<std::string, Tensor>& t) {
    t["lm_head.bias"] = qt::random_tensor(DType::kF16, 1, 50, 3);
  });
  expect_error([&] { inspect_model(d2.path.string()); }, ErrorCode::kUnsupported, {"lm_head.bias"});
}

TEST(GptqErrors, ConfigContradictsTensors) {
  TempDir d;
  write_gptq_model(d.path, kBase, 10, [](json& c) { c["quantization_config"]["lm_head"] = false; });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kInvalidFile, {"lm_head.qweight", "lm_head: false"});
  TempDir d2;
  write_gptq_model(d2.path, kBase, 10, [](json& c) { c["tie_word_embeddings"] = true; });
  expect_error([&] { inspect_model(d2.path.string()); }, ErrorCode::kInvalidFile, {"tie_word_embeddings is true", "GPTQ"});
  TempDir d3;
  write_gptq_model(d3.path, kBase, 10, [](json& c) { c.erase("quantization_config"); });
  expect_error([&] { inspect_model(d3.path.string()); }, ErrorCode::kInvalidFile, {"lm_head.qweight", "no GPTQ quantization_config"});
}

TEST(GptqErrors, UnsupportedBitsAndFormat) {
  TempDir d;
  write_gptq_model(d.path, kBase, 11, [](json& c) { c["quantization_config"]["bits"] = 3; });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kUnsupported, {"GPTQ bits 3"});
  TempDir d2;
  write_gptq_model(d2.path, kBase, 11, [](json& c) { c["quantization_config"]["checkpoint_format"] = "marlin"; });
  expect_error([&] { inspect_model(d2.path.string()); }, ErrorCode::kUnsupported, {"checkpoint_format \"marlin\"", "gptq_v2"});
  TempDir d3;
  write_gptq_model(d3.path, kBase, 11, [](json& c) { c["quantization_config"]["quant_method"] = "awq"; });
  expect_error([&] { inspect_model(d3.path.string()); }, ErrorCode::kUnsupported, {"\"awq\"", "gptq"});
}

TEST(GptqErrors, GptqEmbeddingRefused) {
  TempDir d;
  write_gptq_model(d.path, kBase, 12, {}, [](std::map<std::string, Tensor>& t) {
    t.erase("model.embed_tokens.weight");
    t["model.embed_tokens.qweight"] = t["lm_head.qweight"];
    t["model.embed_tokens.qzeros"] = t["lm_head.qzeros"];
    t["model.embed_tokens.scales"] = t["lm_head.scales"];
  });
  expect_error([&] { inspect_model(d.path.string()); }, ErrorCode::kUnsupported, {"model.embed_tokens", "GPTQ"});
}

// AutoGPTQ's older layout: no quantization_config, a quantize_config.json beside.
TEST(Gptq, QuantizeConfigJson) {
  TempDir d;
  const GptqCase c{4, 32, false, 1, false, 50, 128};
  const Written wr = write_gptq_model(d.path, c, 13, [](json& cfg) {
    json qc = cfg["quantization_config"];
    qc.erase("quant_method");
    cfg.erase("quantization_config");
    return qc;
  });
  std::ofstream(d.path / "quantize_config.json")
      << json({{"bits", 4}, {"group_size", 32}, {"desc_act", false}, {"sym", true}}).dump();
  const TokenTables t = load_model_tables(d.path.string());
  std::vector<float> row(128);
  t.head.row_f32(49, row.data());
  EXPECT_EQ(std::memcmp(row.data(), wr.w.data() + 49 * 128, 128 * 4), 0);
}

// A column-permuted table written as pack-quantized would lose the order: refused.
TEST(Gptq, ActOrderTableIsNotWrittenAsPackQuantized) {
  TempDir d;
  write_gptq_model(d.path, kBase, 14);
  const TokenTables t = load_model_tables(d.path.string());
  SafetensorsWriter w;
  Tensor shape;
  const std::string msg = qt::expect_error([&] { add_packed(w, "lm_head", t.head.packed(), shape); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("act-order"), std::string::npos) << msg;
}

// A col_perm that is not a permutation is rejected when the table is built.
TEST(Gptq, BadPermutationRejected) {
  PackedTable p = qt::random_packed(4, 64, QuantScheme{4, 32, true, DType::kF16}, 3);
  p.col_perm = Tensor::empty(DType::kI32, {64});
  for (int j = 0; j < 64; ++j) p.col_perm.ptr<int32_t>()[j] = j;
  p.col_perm.ptr<int32_t>()[10] = 11;
  const std::string msg = qt::expect_error([&] { Table::packed(p, "t"); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("col_perm[11] = 11 repeats"), std::string::npos) << msg;
}

}  // namespace
}  // namespace qhead

// ---- checkpoints written by the real tools (tests/fixtures/gptq, made by
// scripts/make_gptq_fixtures.py with AutoRound 0.16.1 and GPTQModel 7.7.0) ----

namespace qhead {
namespace {

struct ToolFixture {
  const char* dir;
  int bits, group;
  bool sym;
  int version;
  bool act_order;
  int64_t vocab;
};

class GptqToolFixture : public ::testing::TestWithParam<ToolFixture> {};

TEST_P(GptqToolFixture, MatchesTheToolsOwnDequantization) {
  const ToolFixture& f = GetParam();
  const std::string dir = std::string(QHEAD_FIXTURE_DIR) + "/gptq/" + f.dir;
  ModelInfo m;
  const TokenTables t = load_model_tables(dir, {}, &m);
  EXPECT_EQ(m.quant_method, "gptq");
  EXPECT_FALSE(m.tied);
  EXPECT_EQ(m.vocab, f.vocab);
  EXPECT_EQ(m.hidden, 128);
  EXPECT_EQ(m.head.format, ModelInfo::Format::kGptq);
  EXPECT_EQ(m.head.gptq_version, f.version);
  EXPECT_EQ(m.head.act_order, f.act_order);
  ASSERT_TRUE(m.head.scheme);
  EXPECT_EQ(*m.head.scheme, (QuantScheme{f.bits, f.group, f.sym, DType::kF16}));
  EXPECT_EQ(t.head.has_col_perm(), f.act_order);

  const SafetensorsFile e = SafetensorsFile::open(dir + "/expected.safetensors");
  const Tensor exact = e.get("lm_head.dequant_numpy");  // GPTQ's formula in f32 (exact)
  const Tensor tool = e.get("lm_head.dequant");         // the tool's own dequant, computed in f16
  const Tensor emb = e.get("embed_tokens");
  ASSERT_EQ(exact.shape(), (Shape{f.vocab, 128}));
  const Tensor mine = t.head.to_dense_f32();
  EXPECT_EQ(std::memcmp(mine.data(), exact.data(), exact.nbytes()), 0) << "not bit-identical to the formula";
  // The tools multiply in f16: one rounding, half an f16 ulp of the exact value
  // (2^-11 relative; 2^-25 absolute below f16's normal range).
  int64_t bad = 0;
  for (int64_t i = 0; i < mine.numel(); ++i) {
    const double a = mine.ptr<float>()[i], b = tool.ptr<float>()[i];
    if (!(std::fabs(a - b) <= std::max(std::fabs(a) * std::ldexp(1.0, -11), std::ldexp(1.0, -25))))
      if (++bad <= 3) ADD_FAILURE() << "element " << i << ": qhead " << a << ", tool " << b;
  }
  EXPECT_EQ(bad, 0);
  const Tensor emb_mine = t.embedding.to_dense_f32();
  EXPECT_EQ(std::memcmp(emb_mine.data(), emb.data(), emb.nbytes()), 0) << "embedding";
  // And the ops on the converted head (act-order included) against the formula.
  check_ops(t.head, qt::to_f32(exact.view()), Backend::kAuto, false, 5);
  if (cuda::available()) check_ops(t.head, qt::to_f32(exact.view()), Backend::kAuto, true, 6);
}

// Every fixture GPTQ-quantizes the decoder's Linears too (q/k/v/o/gate/up/down
// of layer 0, as real GPTQ/AutoRound exports do). Reading the roles does not
// depend on that; writing cannot be done loadably (model_write.cc
// refuse_gptq_modules), so every quantize request is refused before anything
// is written, with the reason and what to do, and the input still reads.
TEST_P(GptqToolFixture, QuantizeRefusesAllLayerExports) {
  const ToolFixture& f = GetParam();
  const std::string dir = std::string(QHEAD_FIXTURE_DIR) + "/gptq/" + f.dir;
  // The fixture is an all-layer export (the premise of this test).
  const SafetensorsFile st = SafetensorsFile::open(dir + "/model.safetensors");
  for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                        "mlp.up_proj", "mlp.down_proj"})
    EXPECT_TRUE(st.contains(std::string("model.layers.0.") + m + ".qweight")) << m;
  const ModelInfo m = inspect_model(dir);
  EXPECT_EQ(m.embedding.format, ModelInfo::Format::kDense);
  EXPECT_EQ(m.embedding.dtype, std::string(f.dir).rfind("autoround", 0) == 0 ? DType::kBF16 : DType::kF16);
  EXPECT_EQ(m.head.format, ModelInfo::Format::kGptq);

  TempDir t;
  const fs::path out = t.path / "out";
  struct Ask {
    const char* what;
    std::optional<std::string> emb, head;
    bool requantize;
  };
  for (const Ask& a : {Ask{"head", std::nullopt, "w4g32", true}, Ask{"head, plain", std::nullopt, "w8", false},
                       Ask{"embedding only", "w8", std::nullopt, false}, Ask{"both", "w4g64", "w4g64", true}}) {
    SCOPED_TRACE(a.what);
    ModelWriteOptions o;
    o.embedding_scheme = a.emb;
    o.head_scheme = a.head;
    o.requantize = a.requantize;
    const std::string msg =
        qt::expect_error([&] { write_quantized_model(dir, out.string(), o); }, ErrorCode::kUnsupported);
    for (const char* frag : {"GPTQ-quantizes other modules", "model.layers.0.", "(7 modules)", "one quantization_config",
                             "compressed-tensors has no format", "transformers", "qhead inspect",
                             "run qhead quantize on the unquantized model"})
      EXPECT_NE(msg.find(frag), std::string::npos) << "'" << frag << "' not in: " << msg;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_TRUE(fs::is_empty(t.path)) << "a temporary directory was left behind";
  }
  // The input reads as before (the roles' values are MatchesTheToolsOwnDequantization's).
  const TokenTables back = load_model_tables(dir);
  EXPECT_TRUE(back.head.is_packed());
  EXPECT_FALSE(back.embedding.is_packed());
}

// The usual export: the decoder's Linears GPTQ-quantized, lm_head left dense
// (lm_head: false). Made from each fixture by storing its head as a dense F16
// lm_head.weight (the tool's own dequantization). Both roles read as stored;
// quantize is refused as for the fixtures themselves.
TEST_P(GptqToolFixture, DenseHeadBesideGptqLayers) {
  const ToolFixture& f = GetParam();
  const fs::path src = fs::path(QHEAD_FIXTURE_DIR) / "gptq" / f.dir;
  TempDir t;
  const fs::path dir = t.path / "in";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "model.safetensors" && e.path().filename() != "config.json")
      fs::copy_file(e.path(), dir / e.path().filename());
  const SafetensorsFile in = SafetensorsFile::open((src / "model.safetensors").string());
  const SafetensorsFile e = SafetensorsFile::open((src / "expected.safetensors").string());
  const Tensor dequant = e.get("lm_head.dequant");  // f16-rounded values widened to F32
  Tensor head = Tensor::empty(DType::kF16, dequant.shape());
  for (int64_t i = 0; i < dequant.numel(); ++i) store_from_f32(head.data(), DType::kF16, i, dequant.ptr<float>()[i]);
  SafetensorsWriter w;
  std::vector<Tensor> keep;
  for (const auto& n : in.names())
    if (n.rfind("lm_head.", 0) != 0) {
      keep.push_back(in.get(n));
      w.add(n, keep.back().view());
    }
  w.add("lm_head.weight", head.view());
  w.write((dir / "model.safetensors").string());
  std::ifstream cin(src / "config.json");
  json cfg = json::parse(cin);
  cfg["quantization_config"]["lm_head"] = false;
  cfg["quantization_config"].erase("dynamic");
  std::ofstream(dir / "config.json") << cfg.dump(2);

  ModelInfo m;
  const TokenTables tt = load_model_tables(dir.string(), {}, &m);
  EXPECT_EQ(m.quant_method, "gptq");
  EXPECT_EQ(m.head.format, ModelInfo::Format::kDense);
  EXPECT_EQ(m.head.dtype, DType::kF16);
  EXPECT_EQ(m.embedding.format, ModelInfo::Format::kDense);
  ASSERT_FALSE(tt.head.is_packed());
  const Tensor got = tt.head.to_dense_f32();
  EXPECT_EQ(std::memcmp(got.data(), dequant.data(), dequant.nbytes()), 0) << "head";
  const Tensor emb = tt.embedding.to_dense_f32();
  EXPECT_EQ(std::memcmp(emb.data(), e.get("embed_tokens").data(), emb.nbytes()), 0) << "embedding";

  ModelWriteOptions o;
  o.head_scheme = "w4g32";
  const std::string msg =
      qt::expect_error([&] { write_quantized_model(dir.string(), (t.path / "out").string(), o); },
                       ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("GPTQ-quantizes other modules"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gives its head and embedding"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(t.path / "out"));
}

INSTANTIATE_TEST_SUITE_P(
    Tools, GptqToolFixture,
    ::testing::Values(ToolFixture{"autoround_w4g32_asym", 4, 32, false, 1, false, 320},
                      ToolFixture{"autoround_w8pc_sym", 8, -1, true, 1, false, 160},
                      ToolFixture{"gptqmodel_w4g32_actorder_asym", 4, 32, false, 1, true, 320},
                      ToolFixture{"gptqmodel_w4g32_actorder_asym_v300", 4, 32, false, 1, true, 300},
                      ToolFixture{"gptqmodel_w8g64_sym_v2", 8, 64, true, 2, false, 160}),
    [](const ::testing::TestParamInfo<ToolFixture>& i) { return std::string(i.param.dir); });

// GPTQModel's `dynamic` rules decide the head's scheme; "-:" excludes it.
TEST(GptqDynamic, RulesOverrideAndExclude) {
  TempDir d;
  const GptqCase c{4, 32, true, 1, false, 50, 128};
  write_gptq_model(d.path, c, 21, [](json& cfg) {
    cfg["quantization_config"]["bits"] = 8;
    cfg["quantization_config"]["group_size"] = 128;
    cfg["quantization_config"]["dynamic"] = {{"+:.*lm_head.*", {{"bits", 4}, {"group_size", 32}}}};
  });
  const ModelInfo m = inspect_model(d.path.string());
  EXPECT_EQ(*m.head.scheme, (QuantScheme{4, 32, false, DType::kF16}));
  TempDir d2;
  write_gptq_model(d2.path, c, 21, [](json& cfg) { cfg["quantization_config"]["dynamic"] = {{"-:lm_head", json::object()}}; });
  expect_error([&] { inspect_model(d2.path.string()); }, ErrorCode::kInvalidFile, {"dynamic rules exclude lm_head"});
}

}  // namespace
}  // namespace qhead
