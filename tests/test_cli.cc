// The qhead command line, run as a user runs it: exit codes, one-line errors,
// --help on every command, --json output, quantize → inspect round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "qhead/safetensors.h"
#include "qhead/table.h"
#include "test_util.h"

namespace qhead {
namespace {

namespace fs = std::filesystem;

using test::CliRun;

CliRun run(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("qhead_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return test::run_cli(args, dir);
}

std::string fixture(const std::string& name) { return std::string(QHEAD_FIXTURE_DIR) + "/ct/" + name + ".safetensors"; }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qhead_cli_t_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  // A one-line error: non-zero exit, "qhead: error: ..." on stderr, one newline.
  static void expect_one_line_error(const CliRun& r, const std::string& fragment) {
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(r.err.rfind("qhead: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << r.err;
  }
  fs::path dir_;
};

TEST_F(Cli, HelpOnEveryCommand) {
  for (const char* c : {"--help", "inspect --help", "quantize --help", "demo --help"}) {
    const CliRun r = run(c);
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << c << ": " << r.out;
  }
  EXPECT_NE(run("").status, 0) << "a subcommand is required";
  EXPECT_NE(run("frobnicate").status, 0);
}

TEST_F(Cli, InspectFixtureJson) {
  const CliRun r = run("inspect --json " + fixture("w4g32a_f16"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["packed"].size(), 1u);
  EXPECT_EQ(j["packed"][0]["prefix"], "lm_head");
  EXPECT_EQ(j["packed"][0]["scheme"], "w4g32a");
  EXPECT_EQ(j["packed"][0]["vocab"], 37);
  EXPECT_EQ(j["packed"][0]["hidden"], 128);
  EXPECT_EQ(j["packed"][0]["scale_dtype"], "F16");
  EXPECT_GT(j["packed"][0]["compression_ratio"].get<double>(), 2.0);
  const CliRun t = run("inspect " + fixture("w4g32a_f16"));
  EXPECT_EQ(t.status, 0);
  EXPECT_NE(t.out.find("w4g32a"), std::string::npos);
}

TEST_F(Cli, QuantizeThenInspect) {
  const std::string out = path("q.safetensors");
  const CliRun r = run("quantize " + fixture("w8_f32") + " --tensor dense.weight --scheme w4g32a --scale-dtype bf16 -o " +
                    out + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["scheme"], "w4g32a");
  EXPECT_EQ(j["prefix"], "dense");
  const SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_FALSE(f.contains("dense.weight")) << "the dense tensor is replaced by its packed form";
  EXPECT_TRUE(f.contains("decompressed.weight")) << "other tensors are copied unchanged";
  EXPECT_TRUE(f.contains("lm_head.weight_packed"));
  for (const char* k : {"dense.weight_packed", "dense.weight_scale", "dense.weight_zero_point", "dense.weight_shape"})
    EXPECT_TRUE(f.contains(k)) << k;
  const Table t = load_packed(f, "dense");
  EXPECT_EQ(t.packed().scheme.name(), "w4g32a");
  EXPECT_EQ(t.packed().scheme.scale_dtype, DType::kBF16);
  const CliRun i = run("inspect --json " + out);
  ASSERT_EQ(i.status, 0) << i.err;
  EXPECT_EQ(nlohmann::json::parse(i.out)["packed"].size(), 2u);
}

TEST_F(Cli, BadInputsFailWithOneLine) {
  const std::string in = fixture("w8_f32");
  expect_one_line_error(run("quantize " + in + " --tensor dense.weight --scheme w4g48 -o " + path("a")), "w4g48");
  expect_one_line_error(run("quantize " + in + " --tensor nope.weight --scheme w4g64 -o " + path("a")), "nope.weight");
  expect_one_line_error(run("quantize " + in + " --tensor dense.weight --scheme w4g64 -o " + path("a")),
                        "not a multiple of group size 64");  // H = 96
  expect_one_line_error(run("quantize " + in + " --tensor lm_head.weight_shape --scheme w4 -o " + path("a")),
                        "2-D");
  expect_one_line_error(run("inspect " + path("missing.safetensors")), "missing.safetensors");
  // The output is never the input.
  fs::copy_file(in, path("in.safetensors"));
  expect_one_line_error(run("quantize " + path("in.safetensors") + " --tensor dense.weight --scheme w8 -o " +
                            path("in.safetensors")),
                        "refusing to write over input");
  EXPECT_TRUE(fs::exists(path("in.safetensors")));
  // A truncated file.
  fs::copy_file(in, path("trunc.safetensors"));
  fs::resize_file(path("trunc.safetensors"), fs::file_size(in) - 10);
  expect_one_line_error(run("inspect " + path("trunc.safetensors")), "trunc.safetensors");
}

// `inspect` validates what it shows: a packed width that does not match
// weight_shape, or a NaN scale, is an error.
TEST_F(Cli, InspectRejectsInconsistentPackedTensors) {
  auto write = [&](const std::string& file, int64_t width, float scale0) {
    Tensor packed = Tensor::empty(DType::kI32, {4, width});
    for (int64_t i = 0; i < packed.numel(); ++i) packed.ptr<int32_t>()[i] = int32_t(0x12345678 + i);
    Tensor scale = Tensor::empty(DType::kF32, {4, 1});
    for (int i = 0; i < 4; ++i) scale.ptr<float>()[i] = 0.01f;
    scale.ptr<float>()[0] = scale0;
    Tensor shape = Tensor::empty(DType::kI64, {2});
    shape.ptr<int64_t>()[0] = 4;
    shape.ptr<int64_t>()[1] = 64;
    SafetensorsWriter w;
    w.add("lm_head.weight_packed", packed.view());
    w.add("lm_head.weight_scale", scale.view());
    w.add("lm_head.weight_shape", shape.view());
    w.write(file);
  };
  write(path("ok.safetensors"), 8, 0.01f);  // 64 x 4 bits = 8 words
  EXPECT_EQ(run("inspect " + path("ok.safetensors")).status, 0);
  write(path("width.safetensors"), 5, 0.01f);
  expect_one_line_error(run("inspect " + path("width.safetensors")), "weight_packed width 5");
  write(path("nan.safetensors"), 8, std::nanf(""));
  expect_one_line_error(run("inspect " + path("nan.safetensors")), "weight_scale[0, 0]");
}

// The README's main job end to end (151936 x 1024 table, ~6 s in Release):
// every check of `qhead demo` passes. Skipped in unoptimized/sanitizer builds.
TEST_F(Cli, MainJobDemoPasses) {
#ifdef QHEAD_SLOW_BUILD
  GTEST_SKIP() << "full-size demo runs in the Release build only";
#endif
  const CliRun r = run("demo --json --workdir " + path("demo"));
  ASSERT_EQ(r.status, 0) << r.err << r.out.substr(0, 2000);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["pass"].get<bool>());
  EXPECT_GE(j["checks"].size(), 9u);
  for (const auto& c : j["checks"]) EXPECT_TRUE(c["pass"].get<bool>()) << c["name"] << ": " << c["detail"];
}

}  // namespace
}  // namespace qhead
