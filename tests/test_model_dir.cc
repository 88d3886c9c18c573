// Hugging Face model directories (include/qhead/model.h). The fixtures in
// tests/fixtures/ct_models were made by scripts/make_ct_model_fixtures.py with
// transformers 5.24.0 + compressed-tensors 0.20.0 (its own apply, qparams,
// ModelCompressor.compress_model, update_config and decompress); malformed
// directories are built here from them in a temporary directory.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "qhead/error.h"
#include "qhead/model.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"

namespace qhead {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture(const std::string& name) { return std::string(QHEAD_FIXTURE_DIR) + "/ct_models/" + name; }

struct Expect {
  const char* dir;
  bool tied;
  QuantScheme embedding, head;
};

QuantScheme scheme(int bits, int group, bool sym) { return QuantScheme{bits, group, sym, DType::kBF16}; }

const Expect kFixtures[] = {
    {"untied", false, scheme(4, 32, true), scheme(8, -1, false)},
    {"tied", true, scheme(4, 32, true), scheme(4, 32, true)},
    {"ignore_re", false, scheme(8, -1, true), scheme(4, 64, false)},
    {"sharded_untied", false, scheme(4, 32, true), scheme(8, -1, false)},
};

class ModelFixture : public ::testing::TestWithParam<Expect> {};

TEST_P(ModelFixture, ResolvesRolesTieAndSchemes) {
  const Expect& e = GetParam();
  const ModelInfo m = inspect_model(fixture(e.dir));
  EXPECT_EQ(m.architecture, "llama");
  EXPECT_EQ(m.vocab, 67);
  EXPECT_EQ(m.hidden, 64);
  EXPECT_EQ(m.tied, e.tied);
  EXPECT_TRUE(m.compressed_tensors);
  EXPECT_EQ(m.embedding.tensor, "model.embed_tokens.weight");
  EXPECT_EQ(m.head.tensor, "lm_head.weight");
  EXPECT_TRUE(m.embedding.packed);
  EXPECT_TRUE(m.head.packed);
  ASSERT_TRUE(m.embedding.scheme && m.head.scheme);
  EXPECT_EQ(*m.embedding.scheme, e.embedding) << m.embedding.scheme->name();
  EXPECT_EQ(*m.head.scheme, e.head) << m.head.scheme->name();
  EXPECT_EQ(m.embedding.dtype, DType::kBF16);
  EXPECT_GT(m.embedding.bytes, 0u);
  if (e.tied) EXPECT_EQ(m.table_bytes(), m.embedding.bytes);
  else EXPECT_EQ(m.table_bytes(), m.embedding.bytes + m.head.bytes);
}

// qhead dequantizes each role to what compressed-tensors' decompress() gives,
// exactly once rounded to the scale dtype (the library dequantizes in it; qhead
// in f32, which is exact), as tests/test_compressed_tensors.cc does per tensor.
TEST_P(ModelFixture, DequantizesToTheLibrarysValues) {
  const Expect& e = GetParam();
  ModelInfo m;
  const TokenTables t = load_model_tables(fixture(e.dir), {}, &m);
  EXPECT_EQ(t.tied(), e.tied);
  const SafetensorsFile ref = SafetensorsFile::open(fixture(e.dir) + "/reference.safetensors");
  for (const auto& [name, table] : {std::pair<const char*, const Table*>{"embedding", &t.embedding}, {"head", &t.head}}) {
    ASSERT_TRUE(table->is_packed()) << name;
    const Tensor r = ref.get(name);
    ASSERT_EQ(r.shape(), (Shape{67, 64})) << name;
    std::vector<float> row(64);
    int64_t mismatches = 0;
    for (int64_t v = 0; v < 67; ++v) {
      table->row_f32(v, row.data());
      for (int64_t j = 0; j < 64; ++j) {
        const float ours = round_through(row[size_t(j)], r.dtype());
        const float theirs = load_as_f32(r.data(), r.dtype(), v * 64 + j);
        if (ours != theirs && mismatches++ < 5)
          ADD_FAILURE() << e.dir << " " << name << " row " << v << " col " << j << ": " << ours << " vs " << theirs;
      }
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFixture, ::testing::ValuesIn(kFixtures),
                         [](const auto& info) { return std::string(info.param.dir); });

TEST(ModelDir, TiedIsOneTable) {
  const TokenTables t = load_model_tables(fixture("tied"));
  EXPECT_TRUE(t.embedding.same_storage(t.head));
  EXPECT_TRUE(t.tied());
  const TokenTables u = load_model_tables(fixture("untied"));
  EXPECT_FALSE(u.tied());
  EXPECT_EQ(u.head.packed().scheme, scheme(8, -1, false));
}

TEST(ModelDir, ShardedRolesComeFromTheirShards) {
  const ModelInfo m = inspect_model(fixture("sharded_untied"));
  EXPECT_NE(m.embedding.file.find("model-00001-of-00002.safetensors"), std::string::npos) << m.embedding.file;
  EXPECT_NE(m.head.file.find("model-00002-of-00002.safetensors"), std::string::npos) << m.head.file;
}

// ---- directories built in a temporary directory ---------------------------

class TempModel : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* ti = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("qhead_model_" + std::to_string(::getpid()) + "_" + ti->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A copy of fixture `name` (its files, flat).
  std::string copy(const std::string& name) {
    for (const auto& e : fs::directory_iterator(fixture(name))) fs::copy_file(e.path(), dir_ / e.path().filename());
    return dir_.string();
  }
  json read(const std::string& file) const {
    std::ifstream in(dir_ / file);
    return json::parse(in);
  }
  void write(const std::string& file, const json& j) const { std::ofstream(dir_ / file) << j.dump(2); }
  void edit_config(const std::function<void(json&)>& f) const {
    json j = read("config.json");
    f(j);
    write("config.json", j);
  }
  // Rewrites model.safetensors with only the tensors `keep` accepts.
  void filter_tensors(const std::function<bool(const std::string&)>& keep) const {
    const SafetensorsFile f = SafetensorsFile::open((dir_ / "model.safetensors").string());
    std::vector<Tensor> held;
    SafetensorsWriter w;
    for (const auto& n : f.names())
      if (keep(n)) {
        held.push_back(Tensor::copy_of(f.get(n).view()));
        w.add(n, held.back().view());
      }
    fs::remove(dir_ / "model.safetensors");
    w.write((dir_ / "model.safetensors").string());
  }
  std::string dir() const { return dir_.string(); }

  fs::path dir_;
};

// Expects `f` to throw qhead::Error with `code` and every fragment in its message.
void expect_error(const std::function<void()>& f, ErrorCode code, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << "'" << s << "' not in: " << e.what();
  }
}

TEST_F(TempModel, TiedStoredOnceLoadsOneTable) {
  copy("tied");
  filter_tensors([](const std::string& n) { return n.rfind("lm_head.", 0) != 0; });
  ModelInfo m;
  const TokenTables t = load_model_tables(dir(), {}, &m);
  EXPECT_TRUE(m.tied);
  EXPECT_FALSE(m.head.stored);
  EXPECT_EQ(m.head.tensor, "model.embed_tokens.weight");
  EXPECT_EQ(*m.head.scheme, scheme(4, 32, true));
  EXPECT_TRUE(t.tied());
}

TEST_F(TempModel, MissingConfig) {
  copy("untied");
  fs::remove(dir_ / "config.json");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "missing"});
}

TEST_F(TempModel, NoSafetensors) {
  copy("untied");
  fs::remove(dir_ / "model.safetensors");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"neither model.safetensors"});
}

TEST_F(TempModel, MissingShard) {
  copy("sharded_untied");
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile,
               {"model.safetensors.index.json", "shard model-00002-of-00002.safetensors", "missing"});
}

TEST_F(TempModel, IndexNamesATensorItsShardLacks) {
  copy("sharded_untied");
  json idx = read("model.safetensors.index.json");
  idx["weight_map"]["lm_head.bias"] = "model-00001-of-00002.safetensors";
  write("model.safetensors.index.json", idx);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile,
               {"lm_head.bias", "model-00001-of-00002.safetensors", "does not hold it"});
}

TEST_F(TempModel, ShapeMismatchWithConfig) {
  copy("untied");
  edit_config([](json& j) { j["vocab_size"] = 68; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile,
               {"model.embed_tokens.weight is [67, 64]", "vocab_size 68", "hidden_size 64"});
  edit_config([](json& j) { j["vocab_size"] = 67; j["hidden_size"] = 128; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"[67, 64]", "hidden_size 128"});
}

TEST_F(TempModel, TiedConfigWithDifferentTensors) {
  copy("untied");
  edit_config([](json& j) { j["tie_word_embeddings"] = true; });
  expect_error([&] { load_model_tables(dir()); }, ErrorCode::kInvalidFile,
               {"tie_word_embeddings is true", "different", "model.embed_tokens.weight", "lm_head.weight"});
}

TEST_F(TempModel, UntiedWithoutHead) {
  copy("untied");
  filter_tensors([](const std::string& n) { return n.rfind("lm_head.", 0) != 0; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"tie_word_embeddings is false", "lm_head.weight"});
}

TEST_F(TempModel, UnknownQuantMethod) {
  copy("untied");
  edit_config([](json& j) { j["quantization_config"]["quant_method"] = "awq"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"quant_method \"awq\"", "compressed-tensors", "gptq"});
  // A GPTQ config over compressed-tensors tensors: the tensors and the config disagree.
  edit_config([](json& j) { j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}}; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"weight_packed", "is GPTQ"});
}

TEST_F(TempModel, UnsupportedSchemes) {
  copy("untied");
  const json orig = read("config.json");
  auto with = [&](const std::function<void(json&)>& f) {
    json j = orig;
    f(j["quantization_config"]);
    write("config.json", j);
  };
  // group_1 (exact "lm_head") quantizes the head; group_0 ("Embedding") the embedding.
  const std::string head_group = orig["quantization_config"]["config_groups"]["group_0"]["targets"][0] == "lm_head" ? "group_0" : "group_1";
  with([&](json& q) { q["format"] = "marlin-24"; for (auto& [k, g] : q["config_groups"].items()) g.erase("format"); });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"model.embed_tokens.weight", "marlin-24", "pack-quantized"});
  with([&](json& q) { q["config_groups"][head_group]["weights"]["type"] = "float"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"lm_head.weight", "type is \"float\"", "type int"});
  with([&](json& q) { q["config_groups"][head_group]["weights"]["num_bits"] = 16; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"lm_head.weight", "num_bits is 16", "2..8"});
  with([&](json& q) { q["config_groups"][head_group]["weights"]["actorder"] = "group"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"lm_head.weight", "actorder", "\"weight\""});
  // actorder "weight"/"static" changed only the calibration order: the stored format is the plain one.
  for (const char* order : {"weight", "static"}) {
    with([&](json& q) { q["config_groups"][head_group]["weights"]["actorder"] = order; });
    EXPECT_EQ(*inspect_model(dir()).head.scheme, scheme(8, -1, false)) << order;
  }
  with([&](json& q) { q["config_groups"][head_group]["weights"]["strategy"] = "tensor"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"lm_head.weight", "strategy is \"tensor\""});
  // Wrong JSON types are a malformed config, not a crash or a foreign exception.
  with([&](json& q) { q["config_groups"][head_group]["weights"]["symmetric"] = "yes"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "unexpected type"});
  with([&](json& q) { q["config_groups"][head_group]["targets"] = "lm_head"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"targets is missing or not a list"});
}

// compressed-tensors matching: ignore entries (regex) win over targets; regexes
// are anchored at the start like Python's re.match; an exact name beats a class.
TEST_F(TempModel, IgnoreAndRegexTargets) {
  copy("untied");
  const json orig = read("config.json");
  // The head ignored by a regex: the checkpoint's packed lm_head disagrees.
  json j = orig;
  j["quantization_config"]["ignore"] = {"re:^lm_hea"};
  write("config.json", j);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"lm_head.weight_packed", "does not quantize lm_head"});
  // "re:head" does not match "lm_head" under re.match (no search from the middle).
  j = orig;
  for (auto& [k, g] : j["quantization_config"]["config_groups"].items())
    for (auto& t : g["targets"])
      if (t == "lm_head") t = "re:head";
  write("config.json", j);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"does not quantize lm_head"});
  // "re:lm_h" does (a prefix match), and a class target "Linear" in another group
  // loses to it.
  j = orig;
  for (auto& [k, g] : j["quantization_config"]["config_groups"].items())
    for (auto& t : g["targets"])
      if (t == "lm_head") t = "re:lm_h";
  j["quantization_config"]["config_groups"]["group_9"] = {
      {"targets", {"Linear"}}, {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 16}}}};
  write("config.json", j);
  EXPECT_EQ(*inspect_model(dir()).head.scheme, scheme(8, -1, false));
}

TEST_F(TempModel, UnknownArchitectureNeedsOverride) {
  copy("untied");
  edit_config([](json& j) { j["model_type"] = "mamba"; j["architectures"] = {"MambaForCausalLM"}; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported,
               {"MambaForCausalLM", "mamba", "--embedding-tensor", "--head-tensor"});
  const ModelInfo m = inspect_model(dir(), {"model.embed_tokens.weight", "lm_head.weight"});
  EXPECT_EQ(m.architecture, "MambaForCausalLM");
  EXPECT_EQ(*m.head.scheme, scheme(8, -1, false));
  const TokenTables t = load_model_tables(dir(), {"model.embed_tokens.weight", "lm_head.weight"});
  EXPECT_FALSE(t.tied());
  expect_error([&] { inspect_model(dir(), {"nope.weight", "lm_head.weight"}); }, ErrorCode::kInvalidFile, {"nope.weight"});
}

// Dense checkpoints of the other families, written here.
void write_dense(const fs::path& file, const std::vector<std::pair<std::string, Tensor>>& ts) {
  SafetensorsWriter w;
  for (const auto& [n, t] : ts) w.add(n, t.view());
  w.write(file.string());
}

Tensor ramp(int64_t v, int64_t h, float base) {
  Tensor t = Tensor::empty(DType::kF32, {v, h});
  for (int64_t i = 0; i < v * h; ++i) t.ptr<float>()[i] = base + 0.25f * float(i);
  return t;
}

TEST_F(TempModel, Gpt2TiedByDefaultDense) {
  write("config.json", {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 5}, {"n_embd", 4}});
  write_dense(dir_ / "model.safetensors", {{"wte.weight", ramp(5, 4, 0)}, {"wpe.weight", ramp(3, 4, 1)}});
  ModelInfo m;
  const TokenTables t = load_model_tables(dir(), {}, &m);
  EXPECT_TRUE(m.tied);
  EXPECT_EQ(m.embedding.tensor, "wte.weight");
  EXPECT_FALSE(m.embedding.packed);
  EXPECT_FALSE(m.embedding.scheme);
  EXPECT_EQ(m.embedding.dtype, DType::kF32);
  EXPECT_TRUE(t.tied());
  float row[4];
  t.head.row_f32(2, row);
  EXPECT_EQ(row[1], 0.25f * 9);
  // A config that quantizes the embedding while the checkpoint stores it dense.
  write("config.json", {{"model_type", "gpt2"}, {"vocab_size", 5}, {"n_embd", 4},
                        {"quantization_config",
                         {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
                          {"config_groups", {{"group_0", {{"targets", {"Embedding"}},
                                                          {"weights", {{"num_bits", 8}, {"type", "int"}, {"symmetric", true},
                                                                       {"strategy", "channel"}}}}}}}}}});
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"quantizes wte (config group group_0, w8)", "dense"});
}

TEST_F(TempModel, PythiaUntiedAndOptTiedWithCopies) {
  write("config.json", {{"model_type", "gpt_neox"}, {"vocab_size", 5}, {"hidden_size", 4}});
  write_dense(dir_ / "model.safetensors", {{"gpt_neox.embed_in.weight", ramp(5, 4, 0)}, {"embed_out.weight", ramp(5, 4, 7)}});
  ModelInfo m = inspect_model(dir());
  EXPECT_FALSE(m.tied);
  EXPECT_EQ(m.head.tensor, "embed_out.weight");
  EXPECT_FALSE(load_model_tables(dir()).tied());
  // OPT: tied by default; both stored identically is fine, different is not.
  write("config.json", {{"model_type", "opt"}, {"vocab_size", 5}, {"hidden_size", 8}, {"word_embed_proj_dim", 4}});
  fs::remove(dir_ / "model.safetensors");
  write_dense(dir_ / "model.safetensors", {{"model.decoder.embed_tokens.weight", ramp(5, 4, 0)}, {"lm_head.weight", ramp(5, 4, 0)}});
  m = inspect_model(dir());
  EXPECT_TRUE(m.tied);
  EXPECT_TRUE(m.head.stored);
  EXPECT_TRUE(load_model_tables(dir()).tied());
  fs::remove(dir_ / "model.safetensors");
  write_dense(dir_ / "model.safetensors", {{"model.decoder.embed_tokens.weight", ramp(5, 4, 0)}, {"lm_head.weight", ramp(5, 4, 1)}});
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"tie_word_embeddings is true", "different"});
}

TEST_F(TempModel, PackedWithoutQuantizationConfig) {
  copy("untied");
  edit_config([](json& j) { j.erase("quantization_config"); });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"weight_packed", "no quantization_config"});
}

TEST_F(TempModel, NotADirectoryOrBadJson) {
  expect_error([&] { inspect_model((dir_ / "absent").string()); }, ErrorCode::kIo, {"not a directory"});
  copy("untied");
  std::ofstream(dir_ / "config.json") << "{\"vocab_size\": ";
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "not valid JSON"});
}

// Every value of config.json and of the shard index replaced by values of other
// JSON types: inspect_model either resolves or throws qhead::Error, never
// anything else (the library does not abort or leak parser exceptions on input).
TEST_F(TempModel, EveryConfigValueOfTheWrongTypeIsAnError) {
  copy("sharded_untied");
  for (const char* file : {"config.json", "model.safetensors.index.json"}) {
    const json orig = read(file);
    const json flat = orig.flatten();
    int errors = 0, runs = 0;
    for (const auto& [path, value] : flat.items()) {
      for (const json& repl : {json(nullptr), json("x"), json(-1), json(true), json::array(), json::object(), json(1e300)}) {
        json j = orig;
        j[json::json_pointer(path)] = repl;
        write(file, j);
        ++runs;
        try {
          inspect_model(dir());
        } catch (const Error&) {
          ++errors;
        } catch (const std::exception& e) {
          ADD_FAILURE() << file << " " << path << " = " << repl.dump() << ": non-qhead exception " << e.what();
        }
      }
    }
    write(file, orig);
    EXPECT_GT(errors, 0) << file;
    EXPECT_GT(runs, 50) << file;
  }
  EXPECT_NO_THROW(inspect_model(dir()));
}

// ---- CLI --------------------------------------------------------------------

std::pair<int, std::string> run_cli(const std::string& args) {
  const std::string cmd = std::string(QHEAD_CLI_PATH) + " " + args + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(ModelDirCli, InspectJson) {
  const auto [status, out] = run_cli("inspect " + fixture("ignore_re") + " --json --scheme w4g32");
  ASSERT_EQ(status, 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["vocab"], 67);
  EXPECT_EQ(j["hidden"], 64);
  EXPECT_EQ(j["tied"], false);
  EXPECT_EQ(j["embedding"]["scheme"], "w8");
  EXPECT_EQ(j["head"]["scheme"], "w4g64a");
  EXPECT_EQ(j["head"]["symmetric"], false);
  EXPECT_EQ(j["target_scheme"], "w4g32");
  // w4g32 with BF16 scales: 67 x 8 words + 67 x 2 scales + the shape, per role.
  EXPECT_EQ(j["table_bytes_after"], 2 * (67 * 8 * 4 + 67 * 2 * 2 + 16));
  const auto [s2, text] = run_cli("inspect " + fixture("tied"));
  EXPECT_EQ(s2, 0);
  EXPECT_NE(text.find("tied"), std::string::npos) << text;
  const auto [s3, err] = run_cli("inspect " + fixture("tied") + " --scheme w4g48");
  EXPECT_NE(s3, 0) << err;
  // The override flags reach the library.
  const auto [s4, o4] = run_cli("inspect " + fixture("untied") + " --json --embedding-tensor model.embed_tokens.weight --head-tensor lm_head.weight");
  ASSERT_EQ(s4, 0) << o4;
  EXPECT_EQ(json::parse(o4)["head"]["scheme"], "w8a");
  const auto [s5, o5] = run_cli("inspect " + fixture("untied") + " --head-tensor nope.weight");
  EXPECT_EQ(s5, 1) << o5;  // invalid_file (README "Exit codes")
  EXPECT_NE(o5.find("nope.weight"), std::string::npos) << o5;
}

}  // namespace
}  // namespace qhead
