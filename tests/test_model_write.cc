// Writing compressed-tensors model directories (include/qhead/model_write.h):
// dense model directories built here (single file and sharded, tied and
// untied) and the compressed-tensors fixtures of tests/fixtures/ct_models go
// through write_quantized_model and are read back with inspect_model /
// load_model_tables; the roles must equal quantize_rtn on the same input, every
// other tensor and file must be byte-identical. The CLI's model mode is run as
// a user runs it at the end. (scripts/verify_ct_model.py checks the same
// outputs against the compressed-tensors library itself.)
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "qhead/error.h"
#include "qhead/model.h"
#include "qhead/model_write.h"
#include "qhead/quantize.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"
#include "test_util.h"

namespace qhead {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_error;
using test::random_tensor;

constexpr int64_t kV = 75, kH = 128;  // 75 rows: not a multiple of 8/32/64

std::string ct_fixture(const std::string& name) { return std::string(QHEAD_FIXTURE_DIR) + "/ct_models/" + name; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const fs::path& p) { return json::parse(slurp(p)); }

using test::same_bytes;

struct DenseModel {
  bool tied = false;
  bool head_stored = true;  // tied: also store lm_head.weight (an identical copy)
  bool sharded = false;
  DType dtype = DType::kBF16;
};

class ModelWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* ti = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / ("qhead_mw_" + std::to_string(::getpid()) + "_" + ti->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path path(const std::string& n) const { return root_ / n; }

  // A Llama-style dense model directory: the two roles, a norm (F32), an MLP
  // weight (the model's dtype), tokenizer files and a file in a subdirectory.
  // Sharded: embedding + layer in shard 1, lm_head in shard 2, norm alone in shard 3.
  std::string make_dense(const std::string& name, const DenseModel& m) {
    const fs::path d = path(name);
    fs::create_directories(d / "extra");
    held_.push_back(random_tensor(m.dtype, kV, kH, 1));
    const Tensor emb = held_.back();
    held_.push_back(m.tied ? emb : random_tensor(m.dtype, kV, kH, 2));
    const Tensor head = held_.back();
    held_.push_back(random_tensor(DType::kF32, 1, kH, 3));
    Tensor norm = held_.back();
    norm.view().shape = {kH};
    held_.push_back(random_tensor(m.dtype, 32, kH, 4));
    const Tensor mlp = held_.back();
    std::vector<std::pair<std::string, Tensor>> all = {{"model.embed_tokens.weight", emb},
                                                       {"model.layers.0.mlp.up_proj.weight", mlp},
                                                       {"model.norm.weight", norm}};
    if (!m.tied || m.head_stored) all.push_back({"lm_head.weight", head});
    auto shard_of = [&](const std::string& n) {
      if (!m.sharded) return std::string("model.safetensors");
      if (n.rfind("lm_head", 0) == 0) return std::string("model-00002-of-00003.safetensors");
      if (n == "model.norm.weight") return std::string("model-00003-of-00003.safetensors");
      return std::string("model-00001-of-00003.safetensors");
    };
    std::map<std::string, SafetensorsWriter> writers;
    json wm = json::object();
    size_t total = 0;
    for (const auto& [n, t] : all) {
      writers[shard_of(n)].add(n, t.view());
      wm[n] = shard_of(n);
      total += t.nbytes();
    }
    for (auto& [f, w] : writers) {
      w.set_metadata("format", "pt");
      w.write((d / f).string());
    }
    if (m.sharded)
      std::ofstream(d / "model.safetensors.index.json") << json{{"metadata", {{"total_size", total}}}, {"weight_map", wm}}.dump(2);
    json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", kV},
                {"hidden_size", kH}, {"tie_word_embeddings", m.tied}, {"torch_dtype", "bfloat16"},
                {"rms_norm_eps", 1e-6}};
    std::ofstream(d / "config.json") << cfg.dump(2);
    std::ofstream(d / "tokenizer.json") << R"({"version": "1.0", "model": {"type": "BPE"}})";
    std::ofstream(d / "extra" / "notes.txt") << "copied as it is\n";
    return d.string();
  }

  // The dense role tensor of a directory made by make_dense (a copy).
  static Tensor dense_role(const std::string& dir, const std::string& name) {
    const ModelInfo m = inspect_model(dir);
    const std::string file = name == "embedding" ? m.embedding.file : m.head.file;
    const std::string tensor = name == "embedding" ? m.embedding.tensor : m.head.tensor;
    return Tensor::copy_of(SafetensorsFile::open(file).get(tensor).view());
  }

  // Every tensor of a model directory by name (copies).
  static std::map<std::string, Tensor> all_tensors(const fs::path& d) {
    std::map<std::string, Tensor> out;
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string f = e.path().filename().string();
      if (e.path().extension() != ".safetensors" || f == "reference.safetensors") continue;
      const SafetensorsFile sf = SafetensorsFile::open(e.path().string());
      for (const auto& n : sf.names()) out.emplace(n, Tensor::copy_of(sf.get(n).view()));
    }
    return out;
  }

  // Checks a packed role of `out` equals quantize_rtn(input, scheme) byte for byte.
  static void expect_role_is_rtn(const Table& got, const TensorView& input, const QuantScheme& scheme) {
    ASSERT_TRUE(got.is_packed());
    const PackedTable want = quantize_rtn(input, scheme);
    const PackedTable& p = got.packed();
    EXPECT_EQ(p.scheme, scheme) << p.scheme.name();
    EXPECT_TRUE(same_bytes(p.packed, want.packed)) << "weight_packed";
    EXPECT_TRUE(same_bytes(p.scale, want.scale)) << "weight_scale";
    if (!scheme.symmetric) {
      EXPECT_TRUE(same_bytes(p.zero_point, want.zero_point)) << "weight_zero_point";
    }
  }

  // Rewrites in/model.safetensors (made by make_dense("in")) with the decoder's
  // up_proj packed w4g32 (compressed-tensors tensors) instead of dense.
  void pack_up_proj_w4g32() {
    const std::string f = path("in/model.safetensors").string();
    const SafetensorsFile sf = SafetensorsFile::open(f);
    std::vector<Tensor> keep;
    SafetensorsWriter w;
    for (const auto& n : sf.names())
      if (n != "model.layers.0.mlp.up_proj.weight") {
        keep.push_back(Tensor::copy_of(sf.get(n).view()));
        w.add(n, keep.back().view());
      }
    const PackedTable up =
        quantize_rtn(sf.get("model.layers.0.mlp.up_proj.weight").view(), QuantScheme::parse("w4g32", DType::kBF16));
    Tensor shape;
    add_packed(w, "model.layers.0.mlp.up_proj", up, shape);
    w.write(f);
  }

  fs::path root_;
  std::vector<Tensor> held_;
};

QuantScheme S(const char* name, DType d = DType::kBF16) { return QuantScheme::parse(name, d); }

// ---- dense -> packed round trips ------------------------------------------------------

TEST_F(ModelWrite, UntiedBothRolesRoundTrip) {
  const std::string in = make_dense("in", {});
  const std::string out = path("out").string();
  ModelWriteOptions o;
  o.embedding_scheme = "w4g32";
  o.head_scheme = "w8a";
  o.mixed_schemes = true;  // two schemes: refused by default (MixedSchemesRefusedByDefault)
  const ModelWriteReport r = write_quantized_model(in, out, o);
  EXPECT_TRUE(r.verified);
  EXPECT_FALSE(r.tied);
  EXPECT_EQ(r.embedding.action, "quantized");
  EXPECT_EQ(r.head.action, "quantized");
  EXPECT_EQ(r.embedding.before, "dense BF16");
  ASSERT_TRUE(r.embedding.scheme && r.head.scheme);
  EXPECT_EQ(*r.embedding.scheme, S("w4g32"));
  EXPECT_EQ(*r.head.scheme, S("w8a"));
  EXPECT_EQ(r.embedding.bytes_before, size_t(kV * kH * 2));
  EXPECT_LT(r.embedding.bytes_after, r.embedding.bytes_before);
  EXPECT_EQ(r.rewritten_files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(r.tensors_checked, 2 + 3 + 4);  // up_proj, norm + embed (3 parts) + lm_head (4 parts)

  ModelInfo m;
  const TokenTables t = load_model_tables(out, {}, &m);
  EXPECT_FALSE(m.tied);
  EXPECT_TRUE(m.compressed_tensors);
  ASSERT_TRUE(m.embedding.packed && m.head.packed);
  expect_role_is_rtn(t.embedding, dense_role(in, "embedding").view(), S("w4g32"));
  expect_role_is_rtn(t.head, dense_role(in, "head").view(), S("w8a"));

  // Everything else byte-identical; other files copied.
  const auto before = all_tensors(in), after = all_tensors(out);
  for (const char* n : {"model.layers.0.mlp.up_proj.weight", "model.norm.weight"}) {
    ASSERT_TRUE(after.count(n)) << n;
    EXPECT_TRUE(same_bytes(before.at(n), after.at(n))) << n;
  }
  EXPECT_FALSE(after.count("model.embed_tokens.weight"));
  EXPECT_FALSE(after.count("lm_head.weight"));
  EXPECT_TRUE(after.count("lm_head.weight_zero_point"));
  EXPECT_FALSE(after.count("model.embed_tokens.weight_zero_point"));
  EXPECT_EQ(slurp(path("in/tokenizer.json")), slurp(path("out/tokenizer.json")));
  EXPECT_EQ(slurp(path("in/extra/notes.txt")), slurp(path("out/extra/notes.txt")));
  EXPECT_EQ(SafetensorsFile::open(out + "/model.safetensors").metadata().at("format"), "pt");

  // config.json: the input's keys, tie preserved, the quantization_config compressed-tensors writes.
  const json ci = read_json(path("in/config.json")), co = read_json(path("out/config.json"));
  for (const auto& [k, v] : ci.items()) EXPECT_EQ(co.at(k), v) << k;
  const json& qc = co.at("quantization_config");
  EXPECT_EQ(qc["quant_method"], "compressed-tensors");
  EXPECT_EQ(qc["format"], "pack-quantized");
  EXPECT_EQ(qc["quantization_status"], "compressed");
  EXPECT_EQ(qc["ignore"], json::array());
  ASSERT_EQ(qc["config_groups"].size(), 2u);
  const json& g0 = qc["config_groups"]["group_0"];
  const json& g1 = qc["config_groups"]["group_1"];
  EXPECT_EQ(g0["targets"], json({"model.embed_tokens"}));
  EXPECT_EQ(g0["format"], "pack-quantized");
  EXPECT_EQ(g0["weights"], json({{"dynamic", false}, {"group_size", 32}, {"num_bits", 4}, {"strategy", "group"},
                                 {"symmetric", true}, {"type", "int"}}));
  EXPECT_EQ(g1["targets"], json({"lm_head"}));
  EXPECT_EQ(g1["weights"], json({{"dynamic", false}, {"group_size", nullptr}, {"num_bits", 8}, {"strategy", "channel"},
                                 {"symmetric", false}, {"type", "int"}}));
  EXPECT_TRUE(g1["input_activations"].is_null());
  // No temporary directory left beside the output.
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".qhead-"), std::string::npos) << e.path();
}

TEST_F(ModelWrite, OneRoleQuantizedTheOtherKept) {
  const std::string in = make_dense("in", {});
  ModelWriteOptions o;
  o.head_scheme = "w4g64a";
  o.scale_dtype = DType::kF32;
  const ModelWriteReport r = write_quantized_model(in, path("out").string(), o);
  EXPECT_EQ(r.embedding.action, "kept");
  EXPECT_FALSE(r.embedding.scheme);
  EXPECT_EQ(r.head.action, "quantized");
  ModelInfo m;
  const TokenTables t = load_model_tables(path("out").string(), {}, &m);
  EXPECT_FALSE(m.embedding.packed);
  EXPECT_TRUE(same_bytes(t.embedding.dense(), dense_role(in, "embedding")));
  expect_role_is_rtn(t.head, dense_role(in, "head").view(), S("w4g64a", DType::kF32));
  EXPECT_EQ(t.head.packed().scale.dtype(), DType::kF32);
  const json qc = read_json(path("out/config.json"))["quantization_config"];
  ASSERT_EQ(qc["config_groups"].size(), 1u);
  EXPECT_EQ(qc["config_groups"]["group_0"]["targets"], json({"lm_head"}));
}

TEST_F(ModelWrite, UntiedSameSchemeIsOneGroup) {
  const std::string in = make_dense("in", {});
  ModelWriteOptions o;
  o.embedding_scheme = o.head_scheme = "w4g64";
  write_quantized_model(in, path("out").string(), o);
  const json qc = read_json(path("out/config.json"))["quantization_config"];
  ASSERT_EQ(qc["config_groups"].size(), 1u);
  EXPECT_EQ(qc["config_groups"]["group_0"]["targets"], json({"model.embed_tokens", "lm_head"}));
  const ModelInfo m = inspect_model(path("out").string());
  EXPECT_EQ(*m.embedding.scheme, S("w4g64"));
  EXPECT_EQ(*m.head.scheme, S("w4g64"));
}

TEST_F(ModelWrite, TiedWritesOnePackedTensor) {
  for (const bool stored_twice : {false, true}) {
    SCOPED_TRACE(stored_twice ? "stored twice" : "stored once");
    const std::string name = stored_twice ? "in2" : "in1";
    const std::string in = make_dense(name, {.tied = true, .head_stored = stored_twice});
    const std::string out = path(name + "_out").string();
    ModelWriteOptions o;
    o.head_scheme = "w4g64";  // either flag alone applies to the shared table
    const ModelWriteReport r = write_quantized_model(in, out, o);
    EXPECT_TRUE(r.tied);
    EXPECT_EQ(r.embedding.action, "quantized");
    EXPECT_EQ(r.head.action, "shared");
    EXPECT_EQ(r.head.bytes_after, 0u);
    EXPECT_EQ(r.head.bytes_before, stored_twice ? size_t(kV * kH * 2) : 0u);
    ModelInfo m;
    const TokenTables t = load_model_tables(out, {}, &m);
    EXPECT_TRUE(m.tied);
    EXPECT_TRUE(t.tied());
    EXPECT_FALSE(m.head.stored);
    expect_role_is_rtn(t.embedding, dense_role(in, "embedding").view(), S("w4g64"));
    const auto after = all_tensors(out);
    for (const auto& [n, v] : after) EXPECT_NE(n.rfind("lm_head", 0), 0u) << "no head tensor in a tied output: " << n;
    const json co = read_json(fs::path(out) / "config.json");
    EXPECT_EQ(co["tie_word_embeddings"], true);
    EXPECT_EQ(co["quantization_config"]["config_groups"]["group_0"]["targets"], json({"model.embed_tokens"}));
    EXPECT_EQ(co["quantization_config"]["config_groups"].size(), 1u);
  }
}

TEST_F(ModelWrite, TiedWithTwoSchemesIsAnError) {
  const std::string in = make_dense("in", {.tied = true});
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  o.head_scheme = "w8";
  const std::string msg = expect_error([&] { write_quantized_model(in, path("out").string(), o); },
                                       ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("tied"), std::string::npos) << msg;
  EXPECT_NE(msg.find("w4g64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("w8"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path("out")));
  // The same scheme twice is fine.
  o.head_scheme = "w4g64";
  EXPECT_NO_THROW(write_quantized_model(in, path("out").string(), o));
}

// untie: a tied model written as two tables; the head under its own name
// (lm_head) with the chosen quantizer, the embedding kept or with its own
// scheme, tie_word_embeddings false, and readers see two roles.
TEST_F(ModelWrite, UntieWritesTheHeadApart) {
  for (const bool stored_twice : {false, true}) {
    SCOPED_TRACE(stored_twice ? "stored twice" : "stored once");
    const std::string name = stored_twice ? "in2" : "in1";
    const std::string in = make_dense(name, {.tied = true, .head_stored = stored_twice});
    const Tensor emb = dense_role(in, "embedding");
    // The head packed, the embedding kept dense: one config group.
    ModelWriteOptions o;
    o.head_scheme = "w4g64";
    o.untie = true;
    const std::string out = path(name + "_kept").string();
    const ModelWriteReport r = write_quantized_model(in, out, o);
    EXPECT_FALSE(r.tied);
    EXPECT_TRUE(r.untied);
    EXPECT_EQ(r.embedding.action, "kept");
    EXPECT_EQ(r.head.action, "quantized");
    EXPECT_EQ(r.head.module, "lm_head");
    EXPECT_EQ(r.head.bytes_before, stored_twice ? size_t(kV * kH * 2) : 0u);
    EXPECT_GT(r.head.bytes_after, 0u);
    ModelInfo m;
    const TokenTables t = load_model_tables(out, {}, &m);
    EXPECT_FALSE(m.tied);
    EXPECT_FALSE(t.tied());
    EXPECT_TRUE(m.head.stored);
    EXPECT_EQ(m.head.tensor, "lm_head.weight");
    ASSERT_FALSE(t.embedding.is_packed());
    EXPECT_TRUE(same_bytes(Tensor::copy_of(t.embedding.dense().view()), emb));  // the embedding as it was
    expect_role_is_rtn(t.head, emb.view(), S("w4g64"));               // the head from the same table
    const auto after = all_tensors(out);
    EXPECT_EQ(after.count("lm_head.weight"), 0u);
    EXPECT_EQ(after.count("lm_head.weight_packed"), 1u);
    const json co = read_json(fs::path(out) / "config.json");
    EXPECT_EQ(co["tie_word_embeddings"], false);
    EXPECT_EQ(co["quantization_config"]["config_groups"].size(), 1u);
    EXPECT_EQ(co["quantization_config"]["config_groups"]["group_0"]["targets"], json({"lm_head"}));

    // Two schemes: refused without mixed_schemes (transformers would misread one), written with it.
    o.embedding_scheme = "w8";
    const std::string msg = expect_error([&] { write_quantized_model(in, path(name + "_two").string(), o); },
                                         ErrorCode::kUnsupported);
    EXPECT_NE(msg.find("--mixed-schemes"), std::string::npos) << msg;
    o.mixed_schemes = true;
    const std::string out2 = path(name + "_two").string();
    const ModelWriteReport r2 = write_quantized_model(in, out2, o);
    EXPECT_TRUE(r2.untied);
    EXPECT_EQ(r2.embedding.action, "quantized");
    const TokenTables t2 = load_model_tables(out2, {}, &m);
    EXPECT_FALSE(m.tied);
    expect_role_is_rtn(t2.embedding, emb.view(), S("w8"));
    expect_role_is_rtn(t2.head, emb.view(), S("w4g64"));
  }
}

TEST_F(ModelWrite, UntieRules) {
  // The head needs a scheme.
  const std::string in = make_dense("in", {.tied = true, .head_stored = false});
  ModelWriteOptions o;
  o.embedding_scheme = "w8";
  o.untie = true;
  const std::string msg = expect_error([&] { write_quantized_model(in, path("out").string(), o); },
                                       ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("--head SCHEME"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path("out")));
  // With a GPTQ quantizer the head is calibrated and the embedding takes the quantizer's
  // identity-Hessian form (gptq-mse: mse).
  const Tensor emb = dense_role(in, "embedding");
  Tensor calib = random_tensor(DType::kF32, 96, kH, 9);
  o.head_scheme = "w4g64";
  o.mixed_schemes = true;
  o.quantizer = Quantizer::kGptqMse;
  o.calibration = calib.view();
  const std::string out = path("gptq").string();
  write_quantized_model(in, out, o);
  const TokenTables t = load_model_tables(out);
  QuantizeOptions qo;
  qo.quantizer = Quantizer::kGptqMse;
  qo.calibration = calib.view();
  const PackedTable head = quantize(emb.view(), S("w4g64"), qo);
  EXPECT_TRUE(same_bytes(t.head.packed().packed, head.packed));
  EXPECT_TRUE(same_bytes(t.head.packed().scale, head.scale));
  QuantizeOptions eo;
  eo.quantizer = Quantizer::kMse;
  const PackedTable embq = quantize(emb.view(), S("w8"), eo);
  EXPECT_TRUE(same_bytes(t.embedding.packed().packed, embq.packed));
  EXPECT_TRUE(same_bytes(t.embedding.packed().scale, embq.scale));
  // On an untied model untie changes nothing.
  const std::string un = make_dense("untied", {});
  ModelWriteOptions u;
  u.head_scheme = "w4g64";
  u.untie = true;
  const ModelWriteReport ru = write_quantized_model(un, path("untied_out").string(), u);
  EXPECT_FALSE(ru.tied);
  EXPECT_FALSE(ru.untied);
  EXPECT_EQ(ru.embedding.action, "kept");
}

TEST_F(ModelWrite, ShardedKeepsShardsAndRewritesTheIndex) {
  const std::string in = make_dense("in", {.sharded = true});
  const std::string out = path("out").string();
  ModelWriteOptions o;
  o.embedding_scheme = "w8g64";
  std::vector<std::string> copy_events;
  std::mutex mu;
  o.progress = [&](const ModelWriteProgress& p) {
    std::lock_guard<std::mutex> lock(mu);
    if (p.stage == ModelWriteProgress::Stage::kCopy && p.done == p.total) copy_events.push_back(p.what);
  };
  const ModelWriteReport r = write_quantized_model(in, out, o);
  EXPECT_EQ(r.rewritten_files, std::vector<std::string>{"model-00001-of-00003.safetensors"});
  // Shards without a role to change are copied byte for byte.
  for (const char* f : {"model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}) {
    EXPECT_EQ(slurp(path("in") / f), slurp(path("out") / f)) << f;
    EXPECT_NE(std::find(copy_events.begin(), copy_events.end(), f), copy_events.end()) << f;
  }
  const json idx = read_json(path("out/model.safetensors.index.json"));
  const json& wm = idx["weight_map"];
  EXPECT_FALSE(wm.contains("model.embed_tokens.weight"));
  for (const char* n : {"model.embed_tokens.weight_packed", "model.embed_tokens.weight_scale",
                        "model.embed_tokens.weight_shape"})
    EXPECT_EQ(wm.value(n, ""), "model-00001-of-00003.safetensors") << n;
  EXPECT_EQ(wm["lm_head.weight"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(wm["model.norm.weight"], "model-00003-of-00003.safetensors");
  size_t total = 0;
  for (const auto& [n, t] : all_tensors(out)) total += t.nbytes();
  EXPECT_EQ(idx["metadata"]["total_size"].get<size_t>(), total);
  ModelInfo m;
  const TokenTables t = load_model_tables(out, {}, &m);
  expect_role_is_rtn(t.embedding, dense_role(in, "embedding").view(), S("w8g64"));
  EXPECT_FALSE(m.head.packed);
  EXPECT_NE(m.head.file.find("model-00002-of-00003.safetensors"), std::string::npos);
}

// ---- already packed inputs (the compressed-tensors fixtures) --------------------------

TEST_F(ModelWrite, PackedRoleNeedsRequantize) {
  ModelWriteOptions o;
  o.head_scheme = "w4g64";
  const std::string msg = expect_error([&] { write_quantized_model(ct_fixture("untied"), path("out").string(), o); },
                                       ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("already quantized"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--requantize"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path("out")));
}

TEST_F(ModelWrite, RequantizeFromDequantizedValues) {
  for (const char* fx : {"untied", "sharded_untied"}) {
    SCOPED_TRACE(fx);
    const std::string out = path(std::string("out_") + fx).string();
    ModelWriteOptions o;
    o.head_scheme = "w4g64";
    o.requantize = true;
    o.mixed_schemes = true;  // the kept "Embedding" group is w4g32
    const ModelWriteReport r = write_quantized_model(ct_fixture(fx), out, o);
    EXPECT_EQ(r.head.action, "requantized");
    EXPECT_EQ(r.head.before, "w8a (BF16 scales)");
    EXPECT_EQ(r.embedding.action, "kept");
    const TokenTables in = load_model_tables(ct_fixture(fx));
    ModelInfo m;
    const TokenTables t = load_model_tables(out, {}, &m);
    expect_role_is_rtn(t.head, in.head.to_dense_f32().view(), S("w4g64"));
    // The kept embedding is the fixture's packed tensors, unchanged.
    EXPECT_EQ(*m.embedding.scheme, S("w4g32"));
    EXPECT_TRUE(same_bytes(t.embedding.packed().packed, in.embedding.packed().packed));
    // lm_head left group_1 (which only named it) for a group of its own; the
    // embedding is still selected by the class target.
    const json qc = read_json(fs::path(out) / "config.json")["quantization_config"];
    EXPECT_EQ(qc["config_groups"]["group_0"]["targets"], json({"Embedding"}));
    EXPECT_EQ(qc["config_groups"]["group_1"]["targets"], json({"lm_head"}));
    EXPECT_EQ(qc["config_groups"]["group_1"]["weights"]["group_size"], 64);
    EXPECT_EQ(qc["config_groups"].size(), 2u);
    EXPECT_EQ(qc["version"], "0.20.0");
  }
}

TEST_F(ModelWrite, RequantizeTiedFixtureDropsTheSecondCopy) {
  const std::string out = path("out").string();
  ModelWriteOptions o;
  o.embedding_scheme = "w8";
  o.requantize = true;
  const ModelWriteReport r = write_quantized_model(ct_fixture("tied"), out, o);
  EXPECT_EQ(r.embedding.action, "requantized");
  EXPECT_EQ(r.head.action, "shared");
  EXPECT_GT(r.head.bytes_before, 0u);
  const TokenTables in = load_model_tables(ct_fixture("tied"));
  ModelInfo m;
  const TokenTables t = load_model_tables(out, {}, &m);
  EXPECT_TRUE(t.tied());
  EXPECT_FALSE(m.head.stored);
  expect_role_is_rtn(t.embedding, in.embedding.to_dense_f32().view(), S("w8"));
  for (const auto& [n, v] : all_tensors(out)) EXPECT_NE(n.rfind("lm_head", 0), 0u) << n;
  const json qc = read_json(fs::path(out) / "config.json")["quantization_config"];
  // "lm_head" left the old group, whose remaining class target "Embedding" now
  // selects no packed module (the exact target outranks it): the group goes,
  // so the one left is the new scheme's (what loaders reading only the first
  // group need). Nothing selects lm_head, so it is not added to `ignore`
  // (which stays the library's list of the decoder's Linears).
  ASSERT_EQ(qc["config_groups"].size(), 1u);
  EXPECT_EQ(qc["config_groups"]["group_0"]["targets"], json({"model.embed_tokens"}));
  EXPECT_EQ(qc["config_groups"]["group_0"]["weights"]["num_bits"], 8);
  EXPECT_EQ(qc["ignore"], read_json(ct_fixture("tied") + "/config.json")["quantization_config"]["ignore"]);
}

TEST_F(ModelWrite, RequantizeKeepsOtherGroupsAndIgnores) {
  // ignore_re: the embedding by a "re:" target, the head by the class "Linear"
  // with the decoder's Linears ignored.
  const std::string out = path("out").string();
  ModelWriteOptions o;
  o.embedding_scheme = "w4g32a";
  o.head_scheme = "w8g64";
  o.requantize = true;
  o.mixed_schemes = true;
  write_quantized_model(ct_fixture("ignore_re"), out, o);
  const json qi = read_json(ct_fixture("ignore_re") + "/config.json")["quantization_config"];
  const json qc = read_json(fs::path(out) / "config.json")["quantization_config"];
  EXPECT_EQ(qc["ignore"], qi["ignore"]);
  // The regex and class groups selected only the roles, which exact targets now
  // take: they go. The decoder's Linears stay ignored.
  ASSERT_EQ(qc["config_groups"].size(), 2u);
  EXPECT_EQ(qc["config_groups"]["group_0"]["targets"], json({"model.embed_tokens"}));
  EXPECT_EQ(qc["config_groups"]["group_1"]["targets"], json({"lm_head"}));
  const ModelInfo m = inspect_model(out);
  EXPECT_EQ(*m.embedding.scheme, S("w4g32a"));
  EXPECT_EQ(*m.head.scheme, S("w8g64"));
}

TEST_F(ModelWrite, IgnoreEntriesNamingTheRole) {
  // A dense role named exactly in `ignore`: the entry goes. One matching it by
  // regex would have to change what it ignores: kUnsupported.
  const std::string in = make_dense("in", {});
  json cfg = read_json(path("in/config.json"));
  cfg["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
                                {"config_groups", {{"group_0", {{"targets", {"Embedding"}},
                                                                {"weights", {{"num_bits", 8}, {"type", "int"},
                                                                             {"symmetric", true}, {"strategy", "channel"}}}}}}},
                                {"ignore", {"model.embed_tokens", "model.layers.0.mlp.up_proj"}}};
  std::ofstream(path("in/config.json")) << cfg.dump(2);
  ASSERT_FALSE(inspect_model(in).embedding.scheme);
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  write_quantized_model(in, path("out").string(), o);
  const json qc = read_json(path("out/config.json"))["quantization_config"];
  EXPECT_EQ(qc["ignore"], json({"model.layers.0.mlp.up_proj"}));
  EXPECT_EQ(*inspect_model(path("out").string()).embedding.scheme, S("w4g64"));

  cfg["quantization_config"]["ignore"] = {"re:model\\..*"};
  std::ofstream(path("in/config.json")) << cfg.dump(2);
  const std::string msg = expect_error([&] { write_quantized_model(in, path("out2").string(), o); },
                                       ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("re:model"), std::string::npos) << msg;
}

TEST_F(ModelWrite, OtherPackedModulesKeepTheirGroups) {
  // A decoder Linear packed through a class target "Linear", the dense head
  // ignored by name. Quantizing the head: its ignore entry goes, it gets an
  // exact target, and the "Linear" group stays (it still selects up_proj).
  const std::string in = make_dense("in", {});
  pack_up_proj_w4g32();
  json cfg = read_json(path("in/config.json"));
  const json group = {{"format", "pack-quantized"}, {"input_activations", nullptr}, {"output_activations", nullptr},
                      {"targets", {"Linear"}},
                      {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"},
                                   {"group_size", 32}, {"dynamic", false}}}};
  cfg["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
                                {"config_groups", {{"group_0", group}}}, {"ignore", {"lm_head"}}};
  std::ofstream(path("in/config.json")) << cfg.dump(2);
  ASSERT_FALSE(inspect_model(in).head.scheme);
  ModelWriteOptions o;
  o.head_scheme = "w8";
  o.mixed_schemes = true;  // the "Linear" group is w4g32
  write_quantized_model(in, path("out").string(), o);
  const json qc = read_json(path("out/config.json"))["quantization_config"];
  EXPECT_EQ(qc["ignore"], json::array());
  EXPECT_EQ(qc["config_groups"]["group_0"], group);
  EXPECT_EQ(qc["config_groups"]["group_1"]["targets"], json({"lm_head"}));
  EXPECT_EQ(*inspect_model(path("out").string()).head.scheme, S("w8"));
  const auto before = all_tensors(in), after = all_tensors(path("out"));
  EXPECT_TRUE(same_bytes(before.at("model.layers.0.mlp.up_proj.weight_packed"),
                         after.at("model.layers.0.mlp.up_proj.weight_packed")));
}

// ---- GPTQ heads -------------------------------------------------------------------------

// A Llama-style directory whose head is GPTQ (v1 zeros, 4-bit, group 32,
// symmetric), optionally act-order; everything else dense.
std::string make_gptq(const fs::path& d, bool act_order, bool other_gptq_module, std::vector<Tensor>& held) {
  fs::create_directories(d);
  const int bits = 4, gs = 32, pack = 32 / bits, groups = kH / gs;
  test::Rng rng(21);
  Tensor qweight = Tensor::empty(DType::kI32, {kH / pack, kV});
  Tensor qzeros = Tensor::empty(DType::kI32, {groups, kV / pack + 1});  // ceil(75 / 8) = 10 words
  Tensor scales = Tensor::empty(DType::kF16, {groups, kV});
  Tensor g_idx = Tensor::empty(DType::kI32, {kH});
  for (int64_t k = 0; k < kH; ++k) {
    const int64_t col = act_order ? (k * 5) % kH : k;  // a permutation: every group keeps gs columns
    g_idx.ptr<int32_t>()[k] = static_cast<int32_t>(col / gs);
    for (int64_t v = 0; v < kV; ++v) {
      const uint32_t q = static_cast<uint32_t>(rng() % 16);
      uint32_t& w = reinterpret_cast<uint32_t&>(qweight.ptr<int32_t>()[(k / pack) * kV + v]);
      w |= q << ((k % pack) * bits);
    }
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t v = 0; v < kV; ++v) {
      uint32_t& w = reinterpret_cast<uint32_t&>(qzeros.ptr<int32_t>()[g * qzeros.size(1) + v / pack]);
      w |= 7u << ((v % pack) * bits);  // v1 stores z - 1; z = 8 is symmetric
      store_from_f32(scales.data(), DType::kF16, g * kV + v, 0.001f * float(1 + (g * kV + v) % 37));
    }
  held.push_back(random_tensor(DType::kBF16, kV, kH, 1));
  SafetensorsWriter w;
  w.add("model.embed_tokens.weight", held.back().view());
  for (const auto& [n, t] : std::vector<std::pair<std::string, Tensor>>{
           {"lm_head.qweight", qweight}, {"lm_head.qzeros", qzeros}, {"lm_head.scales", scales}, {"lm_head.g_idx", g_idx}}) {
    held.push_back(t);
    w.add(n, held.back().view());
  }
  if (other_gptq_module) {
    held.push_back(Tensor::empty(DType::kI32, {kH / pack, 32}));
    w.add("model.layers.0.mlp.up_proj.qweight", held.back().view());
  }
  w.write((d / "model.safetensors").string());
  const json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", kV},
                    {"hidden_size", kH}, {"tie_word_embeddings", false},
                    {"quantization_config", {{"quant_method", "gptq"}, {"bits", bits}, {"group_size", gs},
                                             {"desc_act", act_order}, {"sym", true}, {"lm_head", true},
                                             {"checkpoint_format", "gptq"}}}};
  std::ofstream(d / "config.json") << cfg.dump(2);
  std::ofstream(d / "quantize_config.json") << cfg["quantization_config"].dump(2);
  return d.string();
}

TEST_F(ModelWrite, GptqHeadConvertsWithRequantize) {
  for (const bool act_order : {false, true}) {
    SCOPED_TRACE(act_order ? "act-order" : "in order");
    const std::string in = make_gptq(path(act_order ? "gptq_act" : "gptq"), act_order, false, held_);
    ModelInfo mi;
    const TokenTables src = load_model_tables(in, {}, &mi);
    ASSERT_EQ(mi.head.format, ModelInfo::Format::kGptq);
    ModelWriteOptions o;
    o.embedding_scheme = "w8";
    o.mixed_schemes = true;  // the head gets w4g64 below
    // The GPTQ head must get a scheme ...
    std::string msg = expect_error([&] { write_quantized_model(in, path("x").string(), o); }, ErrorCode::kUnsupported);
    EXPECT_NE(msg.find("GPTQ"), std::string::npos) << msg;
    // ... and --requantize.
    o.head_scheme = "w4g64";
    msg = expect_error([&] { write_quantized_model(in, path("x").string(), o); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("--requantize"), std::string::npos) << msg;
    o.requantize = true;
    const std::string out = path(act_order ? "out_act" : "out").string();
    const ModelWriteReport r = write_quantized_model(in, out, o);
    EXPECT_EQ(r.head.action, "requantized");
    EXPECT_EQ(r.head.before, "GPTQ w4g32 (F16 scales)");
    ModelInfo m;
    const TokenTables t = load_model_tables(out, {}, &m);
    EXPECT_EQ(m.quant_method, "compressed-tensors");
    expect_role_is_rtn(t.head, src.head.to_dense_f32().view(), S("w4g64", DType::kF16));
    expect_role_is_rtn(t.embedding, src.embedding.dense().view(), S("w8"));
    for (const auto& [n, v] : all_tensors(out)) EXPECT_EQ(n.find(".q"), std::string::npos) << n;
    EXPECT_FALSE(fs::exists(fs::path(out) / "quantize_config.json"));
    const json qc = read_json(fs::path(out) / "config.json")["quantization_config"];
    EXPECT_EQ(qc["quant_method"], "compressed-tensors");
    EXPECT_FALSE(qc.contains("bits"));
  }
  // Other GPTQ modules cannot be carried.
  const std::string other = make_gptq(path("gptq_other"), false, true, held_);
  ModelWriteOptions o;
  o.head_scheme = "w4g64";
  o.requantize = true;
  const std::string msg = expect_error([&] { write_quantized_model(other, path("y").string(), o); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("model.layers.0.mlp.up_proj"), std::string::npos) << msg;
}

// ---- paths and inputs refused -------------------------------------------------------------

TEST_F(ModelWrite, OutputDirectoryRules) {
  const std::string in = make_dense("in", {});
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  // An existing empty directory is fine.
  fs::create_directories(path("empty"));
  EXPECT_NO_THROW(write_quantized_model(in, path("empty").string(), o));
  EXPECT_TRUE(fs::exists(path("empty/config.json")));
  // A non-empty one is refused and left alone, unless forced.
  fs::create_directories(path("full"));
  std::ofstream(path("full/keep.txt")) << "x";
  std::string msg = expect_error([&] { write_quantized_model(in, path("full").string(), o); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("--force"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(path("full/keep.txt")));
  EXPECT_FALSE(fs::exists(path("full/config.json")));
  o.force = true;
  EXPECT_NO_THROW(write_quantized_model(in, path("full").string(), o));
  EXPECT_FALSE(fs::exists(path("full/keep.txt")));
  EXPECT_TRUE(fs::exists(path("full/config.json")));
  // Never into the input: the same directory (by any name), or inside it.
  for (const std::string& bad : {in, in + "/", (path("in") / "." ).string(), (path("in") / "sub").string()}) {
    msg = expect_error([&] { write_quantized_model(in, bad, o); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("input"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_FALSE(fs::exists(path("in/sub")));
  // --force never replaces a directory holding the input.
  msg = expect_error([&] { write_quantized_model(in, root_.string(), o); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(fs::exists(path("in/config.json")));
  // A file where the directory should go.
  std::ofstream(path("afile")) << "x";
  expect_error([&] { write_quantized_model(in, path("afile").string(), o); }, ErrorCode::kInvalidArgument);
}

TEST_F(ModelWrite, InputsRefused) {
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  const std::string gguf = std::string(QHEAD_FIXTURE_DIR) + "/gguf/synthetic.gguf";
  std::string msg = expect_error([&] { write_quantized_model(gguf, path("out").string(), o); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("GGUF is not supported as a quantize input"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model directory"), std::string::npos) << msg;
  // The same file under another name is still recognized by its magic.
  fs::copy_file(gguf, path("model.bin"));
  expect_error([&] { write_quantized_model(path("model.bin").string(), path("out").string(), o); }, ErrorCode::kUnsupported);
  expect_error([&] { write_quantized_model(path("missing").string(), path("out").string(), o); }, ErrorCode::kIo);
  // No scheme at all; a bad scheme name; a group that does not divide H.
  const std::string in = make_dense("in", {});
  expect_error([&] { write_quantized_model(in, path("out").string(), {}); }, ErrorCode::kInvalidArgument);
  o.embedding_scheme = "w4g48";
  expect_error([&] { write_quantized_model(in, path("out").string(), o); }, ErrorCode::kInvalidArgument);
  o.embedding_scheme = "w4g256";  // H = 128
  msg = expect_error([&] { write_quantized_model(in, path("out").string(), o); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("256"), std::string::npos) << msg;
  // Another quantization method's checkpoint.
  json cfg = read_json(path("in/config.json"));
  cfg["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
  std::ofstream(path("in/config.json")) << cfg.dump(2);
  o.embedding_scheme = "w4g64";
  expect_error([&] { write_quantized_model(in, path("out").string(), o); }, ErrorCode::kUnsupported);
  EXPECT_FALSE(fs::exists(path("out")));
}

// ---- progress -------------------------------------------------------------------------------

TEST(QuantizeProgress, ReportsRowsAndLeavesTheResultAlone) {
  const Tensor w = random_tensor(DType::kF16, 3001, 64, 9);
  const QuantScheme s = S("w4g32a", DType::kF16);
  const PackedTable plain = quantize_rtn(w.view(), s, 4);
  // Workers finish their blocks in any order; the run is repeated so that an
  // out-of-order report (a worker that counted first reporting last) has many
  // chances to show.
  for (int rep = 0; rep < 40; ++rep) {
    SCOPED_TRACE("repeat " + std::to_string(rep));
    std::vector<std::pair<int64_t, int64_t>> calls;
    std::atomic<int> in_flight{0}, overlapped{0};
    const PackedTable tracked = quantize_rtn(w.view(), s, 4, "t", [&](int64_t done, int64_t total) {
      if (in_flight.fetch_add(1) != 0) overlapped.fetch_add(1);
      calls.push_back({done, total});
      in_flight.fetch_sub(1);
    });
    ASSERT_TRUE(same_bytes(plain.packed, tracked.packed));
    ASSERT_TRUE(same_bytes(plain.scale, tracked.scale));
    ASSERT_TRUE(same_bytes(plain.zero_point, tracked.zero_point));
    ASSERT_EQ(overlapped.load(), 0);
    ASSERT_FALSE(calls.empty());
    ASSERT_EQ(calls.back(), std::make_pair(int64_t(3001), int64_t(3001)));
    for (size_t i = 1; i < calls.size(); ++i) ASSERT_LT(calls[i - 1].first, calls[i].first) << "call " << i;
    for (const auto& c : calls) ASSERT_EQ(c.second, 3001);
  }
}

TEST_F(ModelWrite, QuantizeProgressReachesTheTotal) {
  const std::string in = make_dense("in", {});
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  o.head_scheme = "w8";
  o.mixed_schemes = true;
  std::map<std::string, std::pair<int64_t, int64_t>> last;
  o.progress = [&](const ModelWriteProgress& p) {
    if (p.stage == ModelWriteProgress::Stage::kQuantize) last[p.what] = {p.done, p.total};
  };
  write_quantized_model(in, path("out").string(), o);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last["embedding model.embed_tokens"], std::make_pair(kV, kV));
  EXPECT_EQ(last["head lm_head"], std::make_pair(kV, kV));
}

// ---- one weight scheme per output ------------------------------------------------------------

// transformers decompresses every module with the first config group's scheme:
// a w4g32 embedding with a w8 head loads the head with 4-bit codes and no error
// (scripts/check_transformers_load.py). Refused unless mixed_schemes; nothing
// is written.
TEST_F(ModelWrite, MixedSchemesRefusedByDefault) {
  const std::string in = make_dense("in", {});
  ModelWriteOptions o;
  o.embedding_scheme = "w4g32";
  o.head_scheme = "w8";
  std::string msg = expect_error([&] { write_quantized_model(in, path("out").string(), o); }, ErrorCode::kUnsupported);
  for (const char* f : {"group_0 (model.embed_tokens: w4g32)", "group_1 (lm_head: w8)", "transformers",
                        "first group's scheme", "--mixed-schemes"})
    EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  EXPECT_FALSE(fs::exists(path("out")));
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".qhead-"), std::string::npos) << e.path();
  // Symmetric and asymmetric of the same bits are different schemes too.
  o.head_scheme = "w4g32a";
  msg = expect_error([&] { write_quantized_model(in, path("out").string(), o); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("group_1 (lm_head: w4g32a)"), std::string::npos) << msg;
  // One scheme, one role, or mixed_schemes: written.
  o.head_scheme = "w4g32";
  EXPECT_TRUE(write_quantized_model(in, path("one").string(), o).verified);
  o.mixed_schemes = true;
  o.head_scheme = "w8";
  EXPECT_TRUE(write_quantized_model(in, path("mixed").string(), o).verified);
  EXPECT_EQ(*inspect_model(path("mixed").string()).head.scheme, S("w8"));
}

// A role requantized into a config that quantizes other modules: it must take
// their scheme. The untied fixture's "Embedding" group is w4g32.
TEST_F(ModelWrite, RequantizedRoleTakesTheKeptGroupsScheme) {
  ModelWriteOptions o;
  o.head_scheme = "w4g64";
  o.requantize = true;
  const std::string msg =
      expect_error([&] { write_quantized_model(ct_fixture("untied"), path("out").string(), o); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("group_0 (Embedding: w4g32) and group_1 (lm_head: w4g64)"), std::string::npos) << msg;
  o.head_scheme = "w4g32";
  write_quantized_model(ct_fixture("untied"), path("out").string(), o);
  const json qc = read_json(path("out/config.json"))["quantization_config"];
  ASSERT_EQ(qc["config_groups"].size(), 2u);
  EXPECT_EQ(qc["config_groups"]["group_0"]["weights"], qc["config_groups"]["group_1"]["weights"]);
  ModelInfo m;
  const TokenTables t = load_model_tables(path("out").string(), {}, &m);
  EXPECT_EQ(*m.head.scheme, S("w4g32"));
  expect_role_is_rtn(t.head, load_model_tables(ct_fixture("untied")).head.to_dense_f32().view(), S("w4g32"));
}

// Groups of other weight arguments that decompress alike (defaults spelled out
// or left out, observer settings) are one scheme; activation-only groups and
// "re:" expert groups are not compared.
TEST_F(ModelWrite, OneSchemeComparesDecompressionArguments) {
  const std::string in = make_dense("in", {});
  pack_up_proj_w4g32();  // so that its group is kept
  json cfg = read_json(path("in/config.json"));
  const json same = {{"num_bits", 4}, {"strategy", "group"}, {"group_size", 32}, {"observer", "minmax"}};
  cfg["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"config_groups",
       {{"group_0", {{"targets", {"re:.*mlp.up_proj$"}}, {"weights", same}}},
        {"group_1", {{"targets", {"re:.*experts.*"}}, {"weights", {{"num_bits", 8}, {"strategy", "channel"}}}}},
        {"group_2", {{"targets", {"re:.*self_attn.*"}}, {"weights", nullptr},
                     {"input_activations", {{"num_bits", 8}, {"type", "float"}, {"dynamic", true}}}}}}},
      {"ignore", json::array()}};
  std::ofstream(path("in/config.json")) << cfg.dump(2);
  ModelWriteOptions o;
  o.head_scheme = "w4g32";
  EXPECT_TRUE(write_quantized_model(in, path("out").string(), o).verified);
  o.head_scheme = "w4g64";
  const std::string msg = expect_error([&] { write_quantized_model(in, path("out2").string(), o); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("group_0 (re:.*mlp.up_proj$: w4g32) and group_3 (lm_head: w4g64)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("group_1"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("group_2"), std::string::npos) << msg;
}

// ---- the CLI's model mode -------------------------------------------------------------------

using test::CliRun;
using test::run_cli;

TEST_F(ModelWrite, CliModelMode) {
  const std::string in = make_dense("in", {.tied = true});
  const fs::path scratch = path("scratch");
  fs::create_directories(scratch);
  // --json: one object, nothing on stderr (no progress bar off a terminal).
  CliRun r = run_cli("quantize " + in + " --embedding w4g64 -o " + path("out").string() + " --json", scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const json j = json::parse(r.out);
  EXPECT_EQ(j["tied"], true);
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["output"], path("out").string());
  EXPECT_EQ(j["roles"]["embedding"]["action"], "quantized");
  EXPECT_EQ(j["roles"]["embedding"]["scheme"], "w4g64");
  EXPECT_EQ(j["roles"]["embedding"]["bytes_before"], kV * kH * 2);
  EXPECT_GT(j["roles"]["embedding"]["seconds"].get<double>(), 0.0);
  EXPECT_EQ(j["roles"]["head"]["action"], "shared");
  // Text output, not a terminal: a summary, no bar.
  r = run_cli("quantize " + in + " --head w8 -o " + path("out2").string(), scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("tied"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("w8"), std::string::npos) << r.out;
  // One-line errors.
  auto one_line = [&](const CliRun& e, const std::string& fragment) {
    EXPECT_NE(e.status, 0);
    EXPECT_EQ(e.err.rfind("qhead: error: ", 0), 0u) << e.err;
    EXPECT_EQ(std::count(e.err.begin(), e.err.end(), '\n'), 1) << e.err;
    EXPECT_NE(e.err.find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << e.err;
  };
  one_line(run_cli("quantize " + in + " --embedding w4g64 --head w8 -o " + path("o3").string(), scratch), "tied");
  one_line(run_cli("quantize " + in + " --embedding w4g64 -o " + path("out").string(), scratch), "--force");
  one_line(run_cli("quantize " + in + " --embedding w4g64 -o " + in, scratch), "input model directory");
  one_line(run_cli("quantize " + ct_fixture("untied") + " --head w4g64 -o " + path("o4").string(), scratch),
           "--requantize");
  one_line(run_cli("quantize " + std::string(QHEAD_FIXTURE_DIR) + "/gguf/synthetic.gguf --embedding w4g64 -o " +
                       path("o5").string(), scratch),
           "GGUF is not supported as a quantize input");
  one_line(run_cli("quantize " + in + " --tensor lm_head.weight --scheme w4g64 -o " + path("o6").string(), scratch),
           "--embedding");
  const std::string untied = make_dense("in_untied", {});
  one_line(run_cli("quantize " + untied + " --embedding w4g32 --head w8 -o " + path("o8").string(), scratch),
           "--mixed-schemes");
  r = run_cli("quantize " + untied + " --embedding w4g32 --head w8 --mixed-schemes --json -o " + path("o9").string(),
              scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(json::parse(r.out)["notes"].dump().find("--mixed-schemes"), std::string::npos) << r.out;
  // --requantize says so in the output.
  r = run_cli("quantize " + ct_fixture("untied") + " --head w4g64 --requantize --mixed-schemes -o " + path("o7").string(),
              scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("requantized from its dequantized values"), std::string::npos) << r.out;
  // File mode still needs --tensor and --scheme.
  one_line(run_cli("quantize " + in + "/model.safetensors --scheme w4g64 -o " + path("x.safetensors").string(), scratch),
           "--tensor");
}

// ---- inputs reached through links, non-regular files, killed runs ---------------------------

// Every regular file under `d` (links followed) by relative path -> content.
std::map<std::string, std::string> contents(const fs::path& d) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(d); it != fs::recursive_directory_iterator(); ++it)
    if (fs::is_regular_file(it->status())) out[it->path().lexically_relative(d).generic_string()] = slurp(it->path());
  return out;
}

// Hidden temporaries of ours left in `d`.
std::vector<std::string> leftover_temps(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().find(".qhead-") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// The layout of a Hugging Face hub cache: snapshots/<rev>/<file> is a relative
// link to ../../blobs/<n> (../../../blobs/<n> one directory deeper), one blob
// per file of `model`. Returns the snapshot directory.
fs::path make_hf_cache(const fs::path& model, const fs::path& repo) {
  fs::create_directories(repo / "blobs");
  const fs::path snap = repo / "snapshots" / "0123abcd";
  int n = 0;
  for (auto it = fs::recursive_directory_iterator(model); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path rel = it->path().lexically_relative(model);
    if (it->is_directory()) continue;
    const std::string blob = "blob" + std::to_string(n++);
    fs::copy_file(it->path(), repo / "blobs" / blob);
    fs::create_directories((snap / rel).parent_path());
    std::string up = "../..";
    for (auto c = rel.begin(); std::next(c) != rel.end(); ++c) up += "/..";
    fs::create_symlink(fs::path(up) / "blobs" / blob, snap / rel);
  }
  return snap;
}

// The output of a model directory reached through links holds regular files
// with the same bytes, and loads as written.
void expect_copied_by_content(const fs::path& out, const std::map<std::string, std::string>& in_files) {
  ASSERT_TRUE(fs::is_directory(out));
  for (auto it = fs::recursive_directory_iterator(out); it != fs::recursive_directory_iterator(); ++it)
    EXPECT_FALSE(fs::is_symlink(it->symlink_status())) << it->path() << " is a link";
  const auto got = contents(out);
  for (const char* f : {"tokenizer.json", "extra/notes.txt"}) {
    ASSERT_TRUE(got.count(f)) << f;
    EXPECT_EQ(got.at(f), in_files.at(f)) << f;
  }
  EXPECT_FALSE(got.count("QHEAD_INCOMPLETE"));
  EXPECT_TRUE(load_model_tables(out.string()).embedding.is_packed());
}

TEST_F(ModelWrite, HubCacheLinksAreReadNeverWritten) {
  for (const bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "single file");
    const fs::path model = make_dense(sharded ? "dense_sharded" : "dense", {.sharded = sharded});
    const fs::path repo = path(sharded ? "hub_sharded" : "hub");
    const fs::path snap = make_hf_cache(model, repo);
    fs::create_symlink(snap.filename(), snap.parent_path() / "main");  // a link to a sibling directory
    const auto blobs_before = contents(repo / "blobs");
    const auto files = contents(snap);
    ASSERT_GE(blobs_before.size(), 4u);
    ModelWriteOptions o;
    o.embedding_scheme = "w4g64";
    // The output beside the snapshot (its temporary directory too), the
    // snapshot through the sibling link, and an output elsewhere.
    const std::vector<std::pair<fs::path, fs::path>> runs = {
        {snap, snap.parent_path() / "quantized"},
        {snap.parent_path() / "main", snap.parent_path() / "main-w4g64"},
        {snap, path(sharded ? "elsewhere_sharded" : "elsewhere")}};
    for (const auto& [in, out] : runs) {
      SCOPED_TRACE(in.string() + " -> " + out.string());
      const ModelWriteReport r = write_quantized_model(in.string(), out.string(), o);
      EXPECT_TRUE(r.verified);
      EXPECT_TRUE(r.skipped_files.empty());
      EXPECT_EQ(contents(repo / "blobs"), blobs_before) << "an input blob changed";
      expect_copied_by_content(out, files);
      EXPECT_EQ(leftover_temps(out.parent_path()), std::vector<std::string>());
    }
  }
  // The same through the CLI, as a user runs it.
  const fs::path repo = path("hub_cli");
  const fs::path snap = make_hf_cache(make_dense("dense_cli", {.tied = true}), repo);
  const auto blobs_before = contents(repo / "blobs");
  const test::CliRun r = test::run_cli("quantize " + snap.string() + " --embedding w8 -o " +
                                           (snap.parent_path() / "w8").string(), root_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(contents(repo / "blobs"), blobs_before);
  expect_copied_by_content(snap.parent_path() / "w8", contents(snap));
}

TEST_F(ModelWrite, LinksLeavingTheModelAndOddFiles) {
  const fs::path in = make_dense("in", {});
  // A link to a file outside the model directory that the user can write.
  std::ofstream(path("victim.txt")) << "must stay as it is\n";
  fs::remove(in / "tokenizer.json");
  fs::create_symlink(path("victim.txt"), in / "tokenizer.json");
  // Files that cannot be copied: a FIFO (opening it would block), a link to a
  // character device, a broken link, a link loop, a link to a directory.
  ASSERT_EQ(::mkfifo((in / "pipe").c_str(), 0644), 0);
  fs::create_symlink("/dev/zero", in / "zeros.bin");
  fs::create_symlink(in / "missing.txt", in / "broken.txt");
  fs::create_symlink(in / "loop.txt", in / "loop.txt");
  fs::create_directories(path("outside_dir"));
  std::ofstream(path("outside_dir/x.txt")) << "x";
  fs::create_symlink(path("outside_dir"), in / "linked_dir");
  ModelWriteOptions o;
  o.head_scheme = "w8";
  const ModelWriteReport r = write_quantized_model(in.string(), path("out").string(), o);
  EXPECT_EQ(slurp(path("victim.txt")), "must stay as it is\n");
  EXPECT_EQ(slurp(path("out/tokenizer.json")), "must stay as it is\n");
  EXPECT_FALSE(fs::is_symlink(fs::symlink_status(path("out/tokenizer.json"))));
  std::map<std::string, std::string> skipped(r.skipped_files.begin(), r.skipped_files.end());
  EXPECT_EQ(skipped["pipe"], "a FIFO");
  EXPECT_EQ(skipped["zeros.bin"], "a link to a character device");
  EXPECT_EQ(skipped["broken.txt"], "a broken link");
  EXPECT_EQ(skipped["loop.txt"], "a link that loops");
  EXPECT_EQ(skipped["linked_dir"], "a link to a directory (not followed)");
  EXPECT_EQ(skipped.size(), 5u);
  for (const char* f : {"pipe", "zeros.bin", "broken.txt", "loop.txt", "linked_dir"})
    EXPECT_FALSE(fs::exists(fs::symlink_status(path("out") / f))) << f;
  // The CLI says so.
  const test::CliRun c = test::run_cli("quantize " + in.string() + " --head w8 -o " + path("out2").string(), root_);
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.out.find("pipe was not copied: it is a FIFO"), std::string::npos) << c.out;
}

TEST_F(ModelWrite, KilledRunsLeaveIncompleteTemporariesThatALaterRunRemoves) {
  const std::string in = make_dense("in", {});
  // While the files are copied, the temporary directory is marked and has no
  // config.json: a run killed at any point before the rename leaves nothing
  // that looks like a model.
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  const fs::path tmp = path(".out.qhead-tmp-" + std::to_string(::getpid()));
  int seen = 0;
  std::ofstream(fs::path(in) / "big.bin").close();
  fs::resize_file(fs::path(in) / "big.bin", int64_t(64) << 20);  // large enough for copy progress
  o.progress = [&](const ModelWriteProgress& p) {
    if (p.stage != ModelWriteProgress::Stage::kCopy) return;
    ++seen;
    EXPECT_TRUE(fs::exists(tmp / "QHEAD_INCOMPLETE"));
    EXPECT_FALSE(fs::exists(tmp / "config.json"));
  };
  write_quantized_model(in, path("out").string(), o);
  EXPECT_GT(seen, 0);
  EXPECT_FALSE(fs::exists(path("out/QHEAD_INCOMPLETE")));
  // What runs killed by SIGKILL leave: a temporary, and (killed between the
  // two renames of --force) the previous output set aside with out missing.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // a pid that is no longer alive
  const std::string dead = std::to_string(child);
  fs::rename(path("out"), path(".out.qhead-old-" + dead));
  fs::copy(path(".out.qhead-old-" + dead), path(".out.qhead-tmp-" + dead), fs::copy_options::recursive);
  std::ofstream(path(".out.qhead-tmp-" + dead) / "QHEAD_INCOMPLETE") << "x";
  // A live process's temporary (pid 1 always exists) is never touched.
  fs::create_directories(path(".out.qhead-tmp-1"));
  o.progress = nullptr;
  o.force = true;
  const ModelWriteReport r = write_quantized_model(in, path("out").string(), o);
  EXPECT_EQ(r.cleaned.size(), 2u);
  EXPECT_FALSE(fs::exists(path(".out.qhead-tmp-" + dead)));
  EXPECT_FALSE(fs::exists(path(".out.qhead-old-" + dead)));
  EXPECT_TRUE(fs::exists(path(".out.qhead-tmp-1")));
  EXPECT_TRUE(load_model_tables(path("out").string()).embedding.is_packed());
  // Restored, not removed: without --force the restored previous output stays.
  fs::rename(path("out"), path(".out.qhead-old-" + dead));
  o.force = false;
  const std::string msg = expect_error([&] { write_quantized_model(in, path("out").string(), o); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("--force"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(path("out/config.json")));
  EXPECT_FALSE(fs::exists(path(".out.qhead-old-" + dead)));
}

TEST_F(ModelWrite, ShardNamesAreFileNamesInsideTheDirectory) {
  const fs::path in = make_dense("in", {.sharded = true});
  std::ofstream(path("outside.safetensors")) << slurp(in / "model-00003-of-00003.safetensors");
  json idx = read_json(in / "model.safetensors.index.json");
  idx["weight_map"]["model.norm.weight"] = "../outside.safetensors";
  std::ofstream(in / "model.safetensors.index.json") << idx.dump(2);
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  EXPECT_THROW(write_quantized_model(in.string(), path("out").string(), o), Error);
  EXPECT_FALSE(fs::exists(path("out")));
  EXPECT_EQ(leftover_temps(root_), std::vector<std::string>());
}

TEST_F(ModelWrite, OutputThatIsALinkLoopIsAnError) {
  const std::string in = make_dense("in", {});
  fs::create_symlink(path("loop"), path("loop"));
  ModelWriteOptions o;
  o.embedding_scheme = "w4g64";
  const std::string msg = expect_error([&] { write_quantized_model(in, path("loop").string(), o); }, ErrorCode::kIo);
  EXPECT_NE(msg.find("loop"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(path("loop"))));
}

}  // namespace
}  // namespace qhead
