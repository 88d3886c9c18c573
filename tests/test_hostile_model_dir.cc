// Hostile model directories: every count, length, key, pattern and file type
// in config.json, model.safetensors.index.json and quantize_config.json is
// untrusted. Each test builds one bad directory from a fixture (in a temporary
// directory) and expects a qhead::Error naming the file and the problem: never
// a crash, a hang, a foreign exception or a silently truncated number.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "qhead/error.h"
#include "qhead/model.h"
#include "qhead/model_write.h"
#include "test_util.h"

namespace qhead {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class HostileModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* ti = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / ("qhead_hostile_" + std::to_string(::getpid()) + "_" + ti->name());
    fs::remove_all(root_);
    dir_ = root_ / "model";
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // A flat copy of a fixture: "ct_models/untied", "gptq/gptqmodel_w4g32_actorder_asym", ...
  void copy(const std::string& name) {
    for (const auto& e : fs::directory_iterator(std::string(QHEAD_FIXTURE_DIR) + "/" + name))
      fs::copy_file(e.path(), dir_ / e.path().filename());
  }
  json read(const std::string& file) const {
    std::ifstream in(dir_ / file);
    return json::parse(in);
  }
  void write_text(const std::string& file, const std::string& text) const {
    fs::remove(dir_ / file);
    std::ofstream(dir_ / file, std::ios::binary) << text;
  }
  void write(const std::string& file, const json& j) const { write_text(file, j.dump(2)); }
  void edit(const std::string& file, const std::function<void(json&)>& f) const {
    json j = read(file);
    f(j);
    write(file, j);
  }
  // config.json's text with `raw` (JSON text) as the value of a new top-level key.
  void add_raw_to_config(const std::string& key, const std::string& raw) const {
    std::string t = read("config.json").dump();
    t.insert(1, "\"" + key + "\": " + raw + ",");
    write_text("config.json", t);
  }
  std::string dir() const { return dir_.string(); }

  fs::path root_, dir_;
};

// Expects `f` to throw qhead::Error with `code` and every fragment in its
// message, which must be one line of printable text. Returns the message.
std::string expect_error(const std::function<void()>& f, ErrorCode code, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), code) << m;
    for (const auto& s : fragments) EXPECT_NE(m.find(s), std::string::npos) << "'" << s << "' not in: " << m;
    for (const char c : m)
      EXPECT_FALSE(c == '\n' || c == '\x1b' || c == '\0') << "raw control byte in: " << m;
    return m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a qhead::Error: " << e.what();
  }
  return {};
}

std::string nested_arrays(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

// ---- 1. nesting, file types and sizes of the JSON files -----------------------------

TEST_F(HostileModelDir, DeeplyNestedJsonIsRefusedInEveryFile) {
  copy("ct_models/sharded_untied");
  // 10^5 levels: a recursive parse, copy or dump of this overflows the stack.
  const std::string deep = nested_arrays(100000);
  add_raw_to_config("x", deep);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "deeper than 64 levels"});
  // Inside quantization_config too.
  fs::remove(dir_ / "config.json");
  fs::copy_file(fs::path(QHEAD_FIXTURE_DIR) / "ct_models/sharded_untied/config.json", dir_ / "config.json");
  std::string t = read("config.json").dump();
  const size_t at = t.find("\"quantization_config\":{") + std::strlen("\"quantization_config\":{");
  t.insert(at, "\"deep\": " + deep + ",");
  write_text("config.json", t);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "deeper than 64 levels"});
  fs::remove(dir_ / "config.json");
  fs::copy_file(fs::path(QHEAD_FIXTURE_DIR) / "ct_models/sharded_untied/config.json", dir_ / "config.json");
  // The index.
  std::string idx = read("model.safetensors.index.json").dump();
  idx.insert(1, "\"deep\": " + deep + ",");
  write_text("model.safetensors.index.json", idx);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"model.safetensors.index.json", "deeper than 64 levels"});
}

TEST_F(HostileModelDir, DeeplyNestedGptqConfigsAreRefused) {
  // quantize_config.json (no quantization_config in config.json).
  copy("gptq/gptqmodel_w4g32_actorder_asym");
  edit("config.json", [](json& c) { c.erase("quantization_config"); });
  std::string q = read("quantize_config.json").dump();
  q.insert(1, "\"deep\": " + nested_arrays(100000) + ",");
  write_text("quantize_config.json", q);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"quantize_config.json", "deeper than 64 levels"});
  // A dynamic rule nested deeply inside config.json's quantization_config.
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  copy("gptq/gptqmodel_w4g32_actorder_asym");
  std::string c = read("config.json").dump();
  const size_t at = c.find("\"dynamic\":{") + std::strlen("\"dynamic\":{");
  ASSERT_NE(at, std::string::npos);
  c.insert(at, "\"-:zzz\": {\"x\": " + nested_arrays(100000) + "},");
  write_text("config.json", c);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "deeper than 64 levels"});
}

// Nesting up to the bound is read, written by quantize and read back; the
// written config.json (indent 2: its size grows with the square of the depth)
// stays small.
TEST_F(HostileModelDir, NestingAtTheBoundIsReadAndWritten) {
  copy("ct_models/untied");
  add_raw_to_config("x", nested_arrays(63));  // the top-level object is level 1
  EXPECT_NO_THROW(inspect_model(dir()));
  ModelWriteOptions o;
  o.embedding_scheme = "w4g32";
  o.requantize = true;
  o.mixed_schemes = true;  // the fixture's head keeps its w8a group
  const std::string out = (root_ / "out").string();
  const ModelWriteReport r = write_quantized_model(dir(), out, o);
  EXPECT_TRUE(r.verified);
  EXPECT_LT(fs::file_size(fs::path(out) / "config.json"), 64u << 10);
  add_raw_to_config("y", nested_arrays(64));
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "deeper than 64 levels"});
}

TEST_F(HostileModelDir, ConfigMustBeABoundedRegularFile) {
  copy("ct_models/untied");
  // A FIFO: opening it for reading would block until a writer comes.
  fs::remove(dir_ / "config.json");
  ASSERT_EQ(::mkfifo((dir_ / "config.json").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "not a regular file", "FIFO"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // A link to /dev/zero: reading it never ends.
  fs::remove(dir_ / "config.json");
  fs::create_symlink("/dev/zero", dir_ / "config.json");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "not a regular file", "device"});
  // A directory.
  fs::remove(dir_ / "config.json");
  fs::create_directory(dir_ / "config.json");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "not a regular file", "directory"});
  // Larger than the bound (sparse: no disk used).
  fs::remove(dir_ / "config.json");
  { std::ofstream(dir_ / "config.json") << "{}"; }
  fs::resize_file(dir_ / "config.json", (64u << 20) + 1);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "67108865 bytes", "at most 64 MiB"});
}

TEST_F(HostileModelDir, TooManyJsonValuesAreRefused) {
  copy("ct_models/untied");
  const json orig = read("config.json");
  // More values than the reader takes (each a small allocation: memory).
  std::string zeros = "[0";
  for (size_t i = 1; i <= (size_t(1) << 21); ++i) zeros += ",0";
  zeros += "]";
  std::string t = orig.dump();
  t.insert(1, "\"x\": " + zeros + ",");
  write_text("config.json", t);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "more than 2097152 values"});
  // 5000 groups fit the reader but not the config-group bound.
  std::string groups = "{";
  for (int i = 0; i < 5000; ++i) groups += (i ? ",\"g" : "\"g") + std::to_string(i) + "\":{\"targets\":[\"x\"]}";
  groups += "}";
  json c = orig;
  c["quantization_config"]["config_groups"] = json::parse(groups);
  write("config.json", c);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"config.json", "config_groups has 5000 groups", "at most 4096"});
}

// ---- 2. patterns from the checkpoint --------------------------------------------------

TEST_F(HostileModelDir, BacktrackingPatternsDoNotHang) {
  copy("ct_models/untied");
  // Exponential for a backtracking engine on an 18-byte name (hours), linear for RE2.
  const std::string evil = "re:(.*.*.*.*.*.*.*.*.*.*)*Z";
  edit("config.json", [&](json& c) { c["quantization_config"]["ignore"] = {evil}; });
  const auto t0 = std::chrono::steady_clock::now();
  const ModelInfo m = inspect_model(dir());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  ASSERT_TRUE(m.embedding.scheme && m.head.scheme);  // no ignore entry matched
  EXPECT_EQ(m.head.scheme->bits, 8);
  // The same in a target: still matched with re.match semantics.
  edit("config.json", [&](json& c) {
    for (auto& [k, g] : c["quantization_config"]["config_groups"].items())
      for (auto& t : g["targets"])
        if (t == "lm_head") t = "re:(l|l?)*(m|m?)*_h(e|a|d)*$";
    c["quantization_config"]["ignore"] = json::array();
  });
  EXPECT_EQ(inspect_model(dir()).head.scheme->bits, 8);
}

TEST_F(HostileModelDir, DeeplyNestedAndOversizedPatternsAreRefused) {
  copy("ct_models/untied");
  // 32000 nested groups around "lm_head" (a recursive regex compiler
  // overflows its stack): compiled, and it matches, so the head is ignored.
  const std::string nested = "re:" + std::string(32000, '(') + "lm_head" + std::string(32000, ')');
  edit("config.json", [&](json& c) { c["quantization_config"]["ignore"] = {nested}; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"lm_head.weight_packed", "does not quantize lm_head"});
  // Longer than the pattern bound: refused, the pattern shown truncated.
  edit("config.json", [&](json& c) { c["quantization_config"]["ignore"] = {"re:" + std::string(100000, 'a')}; });
  const std::string m = expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported,
                                     {"config.json", "quantization_config.ignore pattern \"aaaa", "\u2026\" (100000 bytes)",
                                      "is 100000 bytes", "at most 65536 bytes"});
  EXPECT_LT(m.size(), 1000u);
  // Many patterns within the per-pattern bound, too many bytes together.
  edit("config.json", [&](json& c) {
    json ig = json::array();
    for (int i = 0; i < 20; ++i) ig.push_back("re:" + std::to_string(i) + std::string(60000, 'a'));
    c["quantization_config"]["ignore"] = ig;
  });
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"config.json", "re: patterns add up to 1200", "at most 1048576"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // A counted repetition that compiles to a huge program.
  edit("config.json", [&](json& c) { c["quantization_config"]["ignore"] = {"re:((a{1000}){1000}){1000}"}; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"config.json", "a{1000}"});
}

TEST_F(HostileModelDir, PatternsRe2CannotExpressAreRefused) {
  copy("ct_models/untied");
  for (const char* p : {"re:(l)\\1", "re:(?=lm)lm_head", "re:(?<!x)lm_head"}) {
    edit("config.json", [&](json& c) {
      for (auto& [k, g] : c["quantization_config"]["config_groups"].items())
        for (auto& t : g["targets"])
          if (t == "lm_head" || (t.is_string() && t.get<std::string>().rfind("re:", 0) == 0)) t = p;
    });
    expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported,
                 {"config.json", std::string(p).substr(3, 3), "backreferences and lookaround are not supported"});
  }
}

TEST_F(HostileModelDir, GptqDynamicPatternsAreBoundedAndRefused) {
  copy("gptq/gptqmodel_w4g32_actorder_asym");
  auto set_dynamic = [&](const json& d) {
    std::string c = read("config.json").dump();
    json j = json::parse(c);
    j["quantization_config"]["dynamic"] = d;
    write("config.json", j);
  };
  // A backtracking rule first (it must not hang), then the real one.
  json d = json::object();
  d["-:(.*.*.*.*.*.*.*.*.*.*)*Z"] = json::object();
  d["lm_head"] = {{"bits", 4}, {"group_size", 32}};
  set_dynamic(d);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(inspect_model(dir()).head.scheme->bits, 4);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // A lookahead: refused, naming the pattern.
  set_dynamic({{"-:(?!lm_head)", json::object()}});
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"config.json", "dynamic pattern", "(?!lm_head)"});
  // Patterns too large together.
  d = json::object();
  for (int i = 0; i < 20; ++i) d["-:" + std::to_string(i) + std::string(60000, 'x')] = json::object();
  set_dynamic(d);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"config.json", "dynamic patterns add up to", "at most 1048576"});
  // A huge pattern.
  set_dynamic({{"+:" + std::string(70000, 'x'), json::object()}});
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"config.json", "at most 65536 bytes"});
}

// ---- 3. integers are range-checked, never truncated ---------------------------------------

TEST_F(HostileModelDir, IntegersAreRangeCheckedNotTruncated) {
  copy("ct_models/untied");
  const json orig = read("config.json");
  auto with = [&](const std::function<void(json&)>& f) {
    json j = orig;
    f(j);
    write("config.json", j);
  };
  auto head_weights = [](json& c) -> json& {
    for (auto& [k, g] : c["quantization_config"]["config_groups"].items())
      if (g["targets"][0] == "lm_head") return g["weights"];
    throw std::runtime_error("no lm_head group");
  };
  // 2^32 + 8 would read as 8 through a 32-bit get.
  with([&](json& c) { head_weights(c)["num_bits"] = (uint64_t(1) << 32) + 8; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "weights.num_bits is 4294967304", "outside the range"});
  // 2^64 - 1 would read as -1 through a signed get.
  with([&](json& c) { c["vocab_size"] = UINT64_MAX; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "vocab_size is 18446744073709551615", "outside the range"});
  with([&](json& c) { c["hidden_size"] = 0; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "hidden_size is 0", "outside the range"});
  with([&](json& c) { c["hidden_size"] = "64"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "hidden_size has an unexpected type (a string"});
  with([&](json& c) { c["vocab_size"] = 67.5; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "vocab_size is 67.5, not an integer"});
  with([&](json& c) { c["vocab_size"] = 1e300; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "vocab_size is", "not an integer"});
  with([&](json& c) { c["hidden_size"] = int64_t(1) << 62; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"hidden_size 4611686018427387904", "expected ["});
  with([&](json& c) {
    for (auto& [k, g] : c["quantization_config"]["config_groups"].items())
      if (g["weights"]["strategy"] == "group") g["weights"]["group_size"] = -(int64_t(1) << 40);
  });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"weights.group_size is -1099511627776", "outside the range"});
  // An integral float is the integer it spells.
  with([&](json& c) { head_weights(c)["num_bits"] = 8.0; c["vocab_size"] = 67.0; });
  EXPECT_EQ(inspect_model(dir()).head.scheme->bits, 8);
}

TEST_F(HostileModelDir, GptqIntegersAreRangeChecked) {
  copy("gptq/gptqmodel_w4g32_actorder_asym");
  const json orig = read("config.json");
  auto with = [&](const std::function<void(json&)>& f) {
    json j = orig;
    f(j["quantization_config"]);
    write("config.json", j);
  };
  with([](json& q) { q["bits"] = (uint64_t(1) << 32) + 4; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "bits is 4294967300", "outside the range"});
  with([](json& q) { q["group_size"] = (uint64_t(1) << 32) + 32; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "group_size is 4294967328", "outside the range"});
  with([](json& q) { q["dynamic"]["lm_head"]["group_size"] = (uint64_t(1) << 32) + 32; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "dynamic[\"lm_head\"].group_size is 4294967328"});
  with([](json& q) { q["lm_head"] = "yes"; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "lm_head has an unexpected type (a string"});
  with([](json& q) { q["dynamic"] = json::array({"lm_head"}); });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "dynamic is not an object"});
  with([](json& q) { q["dynamic"]["lm_head"]["bits"] = 4.5; });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "dynamic[\"lm_head\"].bits is 4.5, not an integer"});
}

// ---- 4. duplicate keys ----------------------------------------------------------------

TEST_F(HostileModelDir, DuplicateKeysAreRefused) {
  copy("ct_models/sharded_untied");
  std::string t = read("config.json").dump();
  t.insert(1, "\"vocab_size\": 1000000,");
  write_text("config.json", t);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"config.json", "duplicate key \"vocab_size\""});
  // In a nested object.
  t = read("model.safetensors.index.json").dump();
  fs::remove(dir_ / "config.json");
  fs::copy_file(fs::path(QHEAD_FIXTURE_DIR) / "ct_models/sharded_untied/config.json", dir_ / "config.json");
  const size_t at = t.find("\"weight_map\":{") + std::strlen("\"weight_map\":{");
  t.insert(at, "\"lm_head.weight_packed\":\"model-00001-of-00002.safetensors\",");
  write_text("model.safetensors.index.json", t);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile,
               {"model.safetensors.index.json", "duplicate key \"lm_head.weight_packed\""});
}

// ---- 5. link loops ----------------------------------------------------------------------

TEST_F(HostileModelDir, SymlinkLoopsAreOneLineErrors) {
  copy("ct_models/sharded_untied");
  auto loop = [&](const std::string& name) {
    fs::remove(dir_ / name);
    fs::create_symlink(name, dir_ / name);
  };
  loop("model-00002-of-00002.safetensors");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kIo, {"model-00002-of-00002.safetensors", "symbolic links"});
  loop("model.safetensors.index.json");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kIo, {"model.safetensors.index.json", "symbolic links"});
  loop("config.json");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kIo, {"config.json", "symbolic links"});
  // The model directory itself.
  const fs::path d = root_ / "loop";
  fs::create_symlink("loop", d);
  expect_error([&] { inspect_model(d.string()); }, ErrorCode::kIo, {"loop", "symbolic links"});
  expect_error([&] { load_model_tables(d.string()); }, ErrorCode::kIo, {"loop", "symbolic links"});
  ModelWriteOptions o;
  o.head_scheme = "w4g32";
  expect_error([&] { write_quantized_model(d.string(), (root_ / "out").string(), o); }, ErrorCode::kIo,
               {"loop", "symbolic links"});
  // The CLI reports them as I/O errors (exit 4), in one line.
  for (const std::string& cmd : std::vector<std::string>{"inspect ", "quantize --head w4g32 --output " + (root_ / "out").string() + " "}) {
    const test::CliRun r = test::run_cli(cmd + d.string(), root_);
    EXPECT_EQ(r.status, 4) << cmd << r.err;
    EXPECT_NE(r.err.find("symbolic links"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  const test::CliRun r = test::run_cli("inspect " + dir(), root_);
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.err.find("config.json: cannot be read: Too many levels of symbolic links"), std::string::npos) << r.err;
  // quantize_config.json of a GPTQ directory.
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  copy("gptq/gptqmodel_w4g32_actorder_asym");
  edit("config.json", [](json& c) { c.erase("quantization_config"); });
  loop("quantize_config.json");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kIo, {"quantize_config.json", "symbolic links"});
}

// ---- 6. file bytes in messages are escaped ------------------------------------------------

TEST_F(HostileModelDir, FileBytesInMessagesAreEscaped) {
  copy("ct_models/sharded_untied");
  edit("model.safetensors.index.json", [](json& j) { j["weight_map"]["evil\x1b[2J\nname"] = "model-00001-of-00002.safetensors"; });
  std::string m = expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile,
                               {"model.safetensors.index.json", "\"evil\\x1b[2J\\x0aname\"", "does not hold it"});
  const std::string longname(100000, 'n');
  edit("model.safetensors.index.json", [&](json& j) {
    j["weight_map"].erase("evil\x1b[2J\nname");
    j["weight_map"][longname] = "model-00001-of-00002.safetensors";
  });
  m = expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"\u2026\" (100000 bytes)"});
  EXPECT_LT(m.size(), 2000u);
  // An unknown architecture name from config.json.
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  copy("ct_models/untied");
  edit("config.json", [](json& c) {
    c["model_type"] = "x\x07y";
    c["architectures"] = {"Evil\x1b]0;title\x07"};
  });
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kUnsupported, {"\"Evil\\x1b]0;title\\x07\"", "\"x\\x07y\""});
  EXPECT_EQ(quote_bytes("a\"b\\c\xff"), "\"a\\\"b\\\\c\\xff\"");
  EXPECT_EQ(quote_bytes("abcdef", 3), "\"abc\u2026\" (6 bytes)");
}

// ---- 7. mutated directories ---------------------------------------------------------------

TEST_F(HostileModelDir, ShardNamesMustBePlainFilesInTheDirectory) {
  copy("ct_models/sharded_untied");
  const json orig = read("model.safetensors.index.json");
  fs::create_directory(dir_ / "sub");
  fs::copy_file(dir_ / "model-00002-of-00002.safetensors", root_ / "outside.safetensors");
  for (const std::string& bad : std::vector<std::string>{"../outside.safetensors", "/etc/passwd", "sub/x.safetensors", "..",
                                                         ".", "", std::string("model-00002-of-00002.safetensors\0x", 34)}) {
    json j = orig;
    j["weight_map"]["lm_head.weight_packed"] = bad;
    write("model.safetensors.index.json", j);
    expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile,
                 {"model.safetensors.index.json", "weight_map[\"lm_head.weight_packed\"]", "not a plain file name"});
  }
  json j = orig;
  j["weight_map"]["lm_head.weight_packed"] = "sub";
  write("model.safetensors.index.json", j);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"\"sub\", which is not a regular file"});
  // One file under two shard names (a link): refused, not opened twice.
  fs::create_symlink("model-00002-of-00002.safetensors", dir_ / "again.safetensors");
  j = orig;
  j["weight_map"]["lm_head.weight_scale"] = "again.safetensors";
  write("model.safetensors.index.json", j);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"are the same file"});
  // weight_map of the wrong type, and a shard name of the wrong type.
  for (const json& wm : {json::array(), json("x"), json(nullptr)}) {
    j = orig;
    j["weight_map"] = wm;
    write("model.safetensors.index.json", j);
    expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"model.safetensors.index.json", "no object \"weight_map\""});
  }
  j = orig;
  j["weight_map"]["lm_head.weight_packed"] = 7;
  write("model.safetensors.index.json", j);
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"is an integer, not a file name"});
  write_text("model.safetensors.index.json", "[1, 2]");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"model.safetensors.index.json", "not a JSON object"});
  write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"\xff\xfe\"}}");
  expect_error([&] { inspect_model(dir()); }, ErrorCode::kInvalidFile, {"model.safetensors.index.json", "not valid JSON"});
}

TEST_F(HostileModelDir, WrongTypesAtEveryLevelOfTheConfig) {
  copy("ct_models/untied");
  const json orig = read("config.json");
  auto expect_bad = [&](const std::function<void(json&)>& f, ErrorCode code, std::initializer_list<std::string> frag) {
    json j = orig;
    f(j);
    write("config.json", j);
    expect_error([&] { inspect_model(dir()); }, code, frag);
  };
  const ErrorCode bad = ErrorCode::kInvalidFile;
  expect_bad([](json& c) { c["tie_word_embeddings"] = "yes"; }, bad, {"tie_word_embeddings is not a boolean"});
  expect_bad([](json& c) {
    c["text_config"] = {{"tie_word_embeddings", 1}, {"vocab_size", 67}, {"hidden_size", 64}};
    c.erase("vocab_size");
    c.erase("tie_word_embeddings");
  }, bad, {"text_config.tie_word_embeddings is not a boolean"});
  expect_bad([](json& c) {
    c["text_config"] = {{"vocab_size", -67}, {"hidden_size", 64}};
    c.erase("vocab_size");
  }, bad, {"text_config.vocab_size is -67", "outside the range"});
  expect_bad([](json& c) { c["model_type"] = 5; }, bad, {"model_type has an unexpected type (an integer"});
  expect_bad([](json& c) { c["quantization_config"] = json::array(); }, bad, {"quantization_config is not an object"});
  expect_bad([](json& c) { c["quantization_config"]["quant_method"] = json::object(); }, bad, {"quant_method has an unexpected type"});
  expect_bad([](json& c) { c["quantization_config"]["format"] = 4; }, bad, {"quantization_config.format has an unexpected type"});
  expect_bad([](json& c) { c["quantization_config"]["ignore"] = "lm_head"; }, bad, {"quantization_config.ignore is a string"});
  expect_bad([](json& c) { c["quantization_config"]["ignore"] = {1}; }, bad, {"quantization_config.ignore holds an integer"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"] = json::array({1}); }, bad,
             {"quantization_config.config_groups is a list"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_0"] = 3; }, bad, {"group_0 is not an object"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_0"]["targets"] = {json::array()}; }, bad,
             {"group_0.targets holds a non-string (a list)"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_1"]["weights"] = "int8"; }, bad,
             {"group_1.weights is not an object"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_1"]["weights"]["type"] = 1; }, bad,
             {"group_1.weights.type has an unexpected type"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_1"]["weights"]["strategy"] = true; }, bad,
             {"group_1.weights.strategy has an unexpected type"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_1"]["weights"]["num_bits"] = "8"; }, bad,
             {"group_1.weights.num_bits has an unexpected type"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_1"]["weights"]["symmetric"] = 0; }, bad,
             {"group_1.weights.symmetric has an unexpected type"});
  expect_bad([](json& c) { c["quantization_config"]["config_groups"]["group_0"]["format"] = 1; }, bad,
             {"group_0.format has an unexpected type"});
  // Too many targets in all.
  expect_bad([](json& c) {
    json t = json::array();
    for (int i = 0; i < 70000; ++i) t.push_back("m" + std::to_string(i));
    c["quantization_config"]["config_groups"]["group_0"]["targets"] = t;
  }, ErrorCode::kUnsupported, {"more than 65536 targets"});
}

// quantize reads the config through the same reader: a hostile pattern in the
// input's config fails as an Error there too.
TEST_F(HostileModelDir, QuantizeRefusesHostileConfigs) {
  copy("ct_models/untied");
  const json orig = read("config.json");
  ModelWriteOptions o;
  o.head_scheme = "w4g32";
  o.requantize = true;
  json j = orig;
  j["quantization_config"]["ignore"] = {"re:(?=x)"};
  write("config.json", j);
  expect_error([&] { write_quantized_model(dir(), (root_ / "out").string(), o); }, ErrorCode::kUnsupported,
               {"config.json", "(?=x)"});
  std::string t = orig.dump();
  t.insert(1, "\"hidden_size\": 64,");
  write_text("config.json", t);
  expect_error([&] { write_quantized_model(dir(), (root_ / "out").string(), o); }, ErrorCode::kInvalidFile,
               {"config.json", "duplicate key \"hidden_size\""});
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

}  // namespace
}  // namespace qhead
