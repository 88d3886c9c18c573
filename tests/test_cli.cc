// The qhead command line, run as a user runs it: exit codes, one-line errors,
// --help on every command, --json output, quantize → inspect round trip; the
// contract scripts rely on (README "Exit codes"): usage errors exit 2 with one
// line naming the nearest valid name, --version, JSON error objects, the
// field names the three kinds of `inspect --json` share, the bench verdict.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
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
  // A usage error: exit 2, nothing on stdout, one line "qhead[ CMD]: ..." on stderr.
  static void expect_usage_error(const CliRun& r, const std::string& fragment, const std::string& args) {
    EXPECT_EQ(r.status, 2) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(r.err.rfind("qhead", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_LT(r.err.size(), 300u) << args << ": " << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << args << ": expected '" << fragment << "' in: " << r.err;
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

// A mistyped option is named with the nearest option of the same command,
// before any "required" complaint it hid; likewise a mistyped command.
TEST_F(Cli, MistypedNamesSuggestTheNearest) {
  const CliRun r = run("quantize --shceme w4g64");
  expect_usage_error(r, "", "quantize --shceme w4g64");
  EXPECT_EQ(r.err, "qhead quantize: unknown option --shceme (did you mean --scheme?)\n");
  const std::string in = fixture("w8_f32");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"quantize " + in + " --tensor dense.weight --shceme=w4 -o " + path("o"), "(did you mean --scheme?)"},
           {"bench --thraeds 2", "unknown option --thraeds (did you mean --threads?)"},
           {"bench --jsno", "(did you mean --json?)"},
           {"inspect " + in + " --embeding-tensor x", "(did you mean --embedding-tensor?)"},
           {"tp-run -n 1 --timout 5 -- true", "(did you mean --timeout?)"},
           {"bench --zzzzzzzz", "unknown option --zzzzzzzz (see qhead bench --help)"},
           {"benhc --shape 64x64", "qhead: unknown command 'benhc' (did you mean bench?)"},
           {"inspetc " + in, "(did you mean inspect?)"},
           {"frobnicate",
            "unknown command 'frobnicate' (commands: inspect, quantize, demo, bench, tp-run, generate and agree)"},
           {"generat --model smollm2", "qhead: unknown command 'generat' (did you mean generate?)"},
           {"", "a command is required"},
           {"--threads 2 bench", "qhead: --threads goes after the command: qhead bench --threads ..."},
           {"inspect " + in + " extra", "unexpected argument extra"},
           {"bench --m", "--m needs a value"},
           {"quantize " + in + " --tensor dense.weight --scheme w4", "--output is required"},
       })
    expect_usage_error(run(args), want, args);
  // The options of another command are not valid here.
  expect_usage_error(run("inspect " + in + " --threads 2"), "unknown option --threads", "inspect --threads");
}

// Every numeric option is range-checked, with the range in the message.
TEST_F(Cli, BadValuesExitTwo) {
  const std::string in = fixture("w8_f32");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"bench --threads -1", "--threads: expected an integer in [0, 1024] (0: all cores), got -1"},
           {"bench --threads abc", "--threads: expected an integer in [0, 1024] (0: all cores), got 'abc'"},
           {"bench --threads 1.5", "got '1.5'"},
           {"bench --threads 99999999999999999999", "--threads"},
           {"quantize " + in + " --tensor dense.weight --scheme w4 --threads -3 -o " + path("o"), "--threads"},
           {"demo --threads 5000", "--threads"},
           {"bench --k 0", "--k: expected an integer in [1, 2147483647], got 0"},
           {"bench --reps 0", "--reps"},
           {"bench --reps -5", "--reps"},
           {"bench --m 0", "--m"},
           {"bench --m 1,-8", "--m"},
           {"bench --m 1,,8", "an empty entry"},
           {"bench --m 1,x", "got 'x'"},
           {"bench --shape 0x64", "--shape: '0x64'"},
           {"bench --shape 64", "expected VxH"},
           {"bench --shape 64x-1", "'64x-1'"},
           {"bench --shape 2147483648x64", "'2147483648x64'"},
           {"bench --shape 2147483647x2147483647", "overflows"},
           {"bench --shape 64x64,12y3", "'12y3'"},
           {"bench --tp 0", "--tp"},
           {"bench --device tpu", "--device"},
           {"bench --plan-env --shape 64x64", "--plan-env is for --device cuda"},
           {"tp-run -n 0 -- true", "-n"},
           {"tp-run -n 1 --timeout -1 -- true", "--timeout"},
           {"tp-run -n 1 --devices 0,-1 -- true", "--devices"},
       })
    expect_usage_error(run(args), want, args);
  // A scheme name is checked by the library (QuantScheme::parse): an
  // invalid_argument error, also exit 2.
  expect_one_line_error(run("quantize " + in + " --tensor dense.weight --scheme w9 -o " + path("o")), "'w9'");
  EXPECT_EQ(run("quantize " + in + " --tensor dense.weight --scheme w9 -o " + path("o")).status, 2);
  const CliRun b = run("bench --shape 64x64 --scheme w9 --m 1");
  expect_one_line_error(b, "bits must be 2..8");
  EXPECT_EQ(b.status, 2);
  EXPECT_FALSE(fs::exists(path("o")));
}

TEST_F(Cli, VersionAndHelpExitZero) {
  const CliRun v = run("--version");
  EXPECT_EQ(v.status, 0) << v.err;
  EXPECT_TRUE(std::regex_match(v.out, std::regex(R"(qhead \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,40}(-dirty)?|unknown)\)\n)")))
      << v.out;
  EXPECT_EQ(v.err, "");
  for (const char* c : {"bench --help", "tp-run --help", "-h", "inspect -h"}) {
    const CliRun r = run(c);
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << c;
  }
  EXPECT_NE(run("--help").out.find("--version"), std::string::npos);
}

// qhead generate / agree become the Python named by QHEAD_PYTHON, running the
// module (python -m qhead.generate / qhead.agree) with every argument after the
// command as given, and exit with its status. The stand-in "Python" here checks
// that it was given a -c program, prints the arguments after it and exits 7.
TEST_F(Cli, PythonCommandsPassArgumentsAndStatusThrough) {
  const std::string py = path("python-stand-in");
  {
    std::ofstream f(py);
    f << "#!/bin/sh\n[ \"$1\" = -c ] || exit 9\nshift 2\nfor a in \"$@\"; do printf '[%s]' \"$a\"; done\necho\nexit 7\n";
  }
  fs::permissions(py, fs::perms::owner_all);
  const char* had = std::getenv("QHEAD_PYTHON");
  const std::string saved = had ? had : "";
  ::setenv("QHEAD_PYTHON", py.c_str(), 1);
  const CliRun g = run("generate --model smollm2 --json 'a b' --help --shceme -- --x");
  EXPECT_EQ(g.status, 7) << g.err;
  EXPECT_EQ(g.out, "[qhead.generate][generate][--model][smollm2][--json][a b][--help][--shceme][--][--x]\n");
  EXPECT_EQ(g.err, "");
  const CliRun a = run("agree --n 5 --version");
  EXPECT_EQ(a.status, 7) << a.err;
  EXPECT_EQ(a.out, "[qhead.agree][agree][--n][5][--version]\n");
  // A Python that cannot be run: one line saying what to install where, exit 1.
  ::setenv("QHEAD_PYTHON", path("no-such-python").c_str(), 1);
  const CliRun m = run("generate --json out.json");
  EXPECT_EQ(m.status, 1);
  EXPECT_EQ(m.out, "");
  EXPECT_EQ(std::count(m.err.begin(), m.err.end(), '\n'), 1) << m.err;
  EXPECT_NE(m.err.find("qhead generate: error: cannot run " + path("no-such-python") + " (No such file or directory)"),
            std::string::npos) << m.err;
  EXPECT_NE(m.err.find("install it (pip install .) into the Python named by QHEAD_PYTHON"), std::string::npos) << m.err;
  if (had) ::setenv("QHEAD_PYTHON", saved.c_str(), 1);
  else ::unsetenv("QHEAD_PYTHON");
  const CliRun h = run("--help");
  EXPECT_NE(h.out.find("\n  generate "), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("\n  agree "), std::string::npos) << h.out;
}

// Under --json every error is one object {"error": {"code", "message"}} on
// stdout, stderr stays empty, and the exit status is the same as without.
TEST_F(Cli, JsonErrorObjects) {
  auto expect_error = [](const CliRun& r, int status, const std::string& code, const std::string& fragment) {
    EXPECT_EQ(r.status, status) << r.out << r.err;
    EXPECT_EQ(r.err, "");
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
    ASSERT_TRUE(j.contains("error")) << r.out;
    EXPECT_EQ(j.size(), 1u);
    EXPECT_EQ(j["error"].size(), 2u);
    EXPECT_EQ(j["error"]["code"], code) << r.out;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(fragment), std::string::npos) << r.out;
  };
  const CliRun missing = run("inspect --json " + path("missing.safetensors"));
  expect_error(missing, 4, "io", "missing.safetensors");
  const CliRun text = run("inspect " + path("missing.safetensors"));
  EXPECT_EQ(text.status, 4);  // the same status without --json
  EXPECT_EQ(text.out, "");
  fs::copy_file(fixture("w8_f32"), path("trunc.safetensors"));
  fs::resize_file(path("trunc.safetensors"), fs::file_size(fixture("w8_f32")) - 10);
  expect_error(run("inspect --json " + path("trunc.safetensors")), 1, "invalid_file", "trunc.safetensors");
  expect_error(run("bench --json --threads -1"), 2, "invalid_argument", "--threads");
  expect_error(run("quantize --json --shceme w4"), 2, "invalid_argument", "did you mean --scheme?");
  expect_error(run("bench --json --shape 64x64 --scheme w4g48"), 2, "invalid_argument", "w4g48");
  expect_error(run("quantize " + fixture("w8_f32") + " --json --tensor dense.weight --scheme w4 -o " + fixture("w8_f32")),
               2, "invalid_argument", "refusing to write over input");
  // Output that cannot be written (a full disk) is an I/O error, not a success;
  // the JSON error then goes to stderr, the one stream left.
  if (fs::exists("/dev/full")) {
    const CliRun full = run("inspect " + fixture("w8_f32") + " >/dev/full");
    EXPECT_EQ(full.status, 4) << full.err;
    EXPECT_EQ(full.err.rfind("qhead: error: stdout: cannot write the output", 0), 0u) << full.err;
    EXPECT_EQ(run("inspect --json " + fixture("w8_f32") + " >/dev/full").status, 4);
#ifndef QHEAD_SLOW_BUILD  // a bench run: ~1 s in Release, ~20 s under the sanitizers
    // Larger than stdio's buffer: the write fails inside fmt::print.
    const CliRun big = run("bench --json --shape 256x64 --m 1 --reps 3 >/dev/full");
    EXPECT_EQ(big.status, 4) << big.err;
    EXPECT_EQ(big.err.rfind("qhead: error: stdout: cannot write the output", 0), 0u) << big.err;
#endif
  }
  // After "--" the arguments belong to tp-run's command, --json included.
  const CliRun tp = run("tp-run -n 0 -- true --json");
  EXPECT_EQ(tp.status, 2);
  EXPECT_EQ(tp.out, "");
}

// inspect --json of a safetensors file, a model directory and a GGUF file
// name the same things the same way.
TEST_F(Cli, InspectFieldNamesAgree) {
  const std::string fx = QHEAD_FIXTURE_DIR;
  const std::string st = fixture("w4g32a_f16"), dir = fx + "/ct_models/ignore_re", gguf = fx + "/gguf/smollm2_slice.gguf";
  auto inspect = [&](const std::string& f) {
    const CliRun r = run("inspect --json " + f);
    EXPECT_EQ(r.status, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto js = inspect(st), jd = inspect(dir), jg = inspect(gguf);
  EXPECT_EQ(js["format"], "safetensors");
  EXPECT_EQ(jd["format"], "model_dir");
  EXPECT_EQ(jg["format"], "gguf");
  EXPECT_EQ(js["file"], st);
  EXPECT_EQ(jd["file"], dir);
  EXPECT_EQ(jg["file"], gguf);
  for (const auto* j : {&jd, &jg})
    for (const char* k : {"architecture", "vocab", "hidden", "tied", "embedding", "head", "table_bytes", "target_scheme",
                          "table_bytes_after"})
      EXPECT_TRUE(j->contains(k)) << (*j)["format"] << " lacks " << k;
  // Every table: the same fields, the same types.
  std::vector<std::pair<std::string, nlohmann::json>> tables = {
      {"safetensors packed[0]", js["packed"][0]}, {"model_dir embedding", jd["embedding"]}, {"model_dir head", jd["head"]},
      {"gguf embedding", jg["embedding"]},       {"gguf head", jg["head"]}};
  for (const auto& [what, t] : tables) {
    for (const char* k : {"tensor", "file", "format", "dtype"}) EXPECT_TRUE(t[k].is_string()) << what << " " << k << ": " << t;
    for (const char* k : {"vocab", "hidden", "bytes"}) EXPECT_TRUE(t[k].is_number_integer()) << what << " " << k << ": " << t;
    EXPECT_TRUE(t.contains("scheme") && (t["scheme"].is_string() || t["scheme"].is_null())) << what << ": " << t;
  }
  const auto& sp = js["packed"][0];
  EXPECT_EQ(sp["tensor"], "lm_head.weight");
  EXPECT_EQ(sp["file"], st);
  EXPECT_EQ(sp["format"], "pack-quantized");
  EXPECT_EQ(sp["dtype"], "F16");  // the scale dtype, as a packed model-directory role reports it
  EXPECT_EQ(sp["scheme"], "w4g32a");
  EXPECT_EQ(jd["head"]["tensor"], "lm_head.weight");
  EXPECT_EQ(jd["head"]["format"], "pack-quantized");
  EXPECT_EQ(jd["head"]["vocab"], 67);
  EXPECT_EQ(jd["head"]["dtype"], jd["head"]["scale_dtype"]);
  EXPECT_EQ(jg["embedding"]["tensor"], "token_embd.weight");
  EXPECT_EQ(jg["embedding"]["dtype"], "Q8_0");
  EXPECT_EQ(jg["embedding"]["format"], "gguf");
  EXPECT_EQ(jg["embedding"]["vocab"], jg["vocab"]);
  EXPECT_TRUE(jg["embedding"]["scheme"].is_null());
  // A tied head that is not stored: 0 bytes, in both kinds.
  EXPECT_EQ(jg["tied"], true);
  EXPECT_EQ(jg["head"]["stored"], false);
  EXPECT_EQ(jg["head"]["bytes"], 0);
  const auto jt = inspect(fx + "/ct_models/tied");
  EXPECT_EQ(jt["tied"], true);
  if (jt["head"]["stored"] == false) EXPECT_EQ(jt["head"]["bytes"], 0);
}

// The bench on a tiny shape: every row self-describing, the half-precision
// baselines present or marked n/a with a reason, rows where fused is slower
// than dense counted, and the verdict line last. (No timing assertions.)
TEST_F(Cli, BenchVerdictOnTinyShape) {
  const CliRun t = run("bench --shape 256x64 --m 1,2 --reps 3 --threads 2");
  ASSERT_EQ(t.status, 0) << t.err;
  const std::string& o = t.out;
  EXPECT_NE(o.find("| dense | dense_bf16 | dense_f16 | fallback | fused |"), std::string::npos) << o;
  EXPECT_NE(o.find("dense_f16: n/a: OpenBLAS has no f16"), std::string::npos) << o;
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(\nfused is slower than the best dense baseline in \d of 2 rows)"))) << o;
  const std::regex verdict(R"(\nverdict: fused w4g64 M=1 \(256x64\) reads at \d+\.\d\d of the \d+\.\d GB/s ceiling, )"
                           R"(\d+\.\dx (faster|slower) than the best baseline \((dense (f32|bf16) OpenBLAS|fallback: dequantize \+ OpenBLAS)\)\n$)");
  EXPECT_TRUE(std::regex_search(o, verdict)) << o;
  EXPECT_NE(o.find("qhead bench: qhead "), std::string::npos);
  EXPECT_NE(o.find("command: "), std::string::npos);

  const CliRun j = run("bench --json --shape 256x64 --m 1 --reps 3 --threads 2");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  for (const char* k : {"version", "commit"})
    EXPECT_TRUE(doc["qhead"][k].is_string() && !doc["qhead"][k].get<std::string>().empty()) << k << ": " << doc["qhead"];
  for (const char* k : {"command", "date"})
    EXPECT_TRUE(doc[k].is_string() && !doc[k].get<std::string>().empty()) << k;
  for (const char* k : {"summary", "model", "isa", "threads"})
    EXPECT_TRUE(doc["device"][k].is_string() && !doc["device"][k].get<std::string>().empty()) << k << ": " << doc["device"];
  EXPECT_EQ(doc["device"]["threads"], "2");
  EXPECT_NE(doc["command"].get<std::string>().find("bench --json --shape 256x64"), std::string::npos);
  const auto& a = doc["rows"];
  std::set<std::string> paths;
  for (const auto& r : a) {
    paths.insert(r["path"].get<std::string>());
    if (r.contains("measured")) {
      EXPECT_FALSE(r.contains("us_median")) << r;
      EXPECT_EQ(r["note"].get<std::string>().rfind("n/a: ", 0), 0u) << r;
    }
    if (r["path"] == "fused") EXPECT_TRUE(r["slower_than_dense"].is_boolean()) << r;
  }
  for (const char* p : {"ceiling", "dense", "dense_bf16", "dense_f16", "fallback", "fused", "fused_topk", "verdict"})
    EXPECT_TRUE(paths.count(p)) << p;
  const auto& v = a.back();
  EXPECT_EQ(v["path"], "verdict");
  EXPECT_EQ(v["m"], 1);
  EXPECT_GT(v["speedup_vs_best_baseline"].get<double>(), 0.0);
  EXPECT_GT(v["read_ceiling_fraction"].get<double>(), 0.0);
  EXPECT_GT(v["ceiling_gbps"].get<double>(), 0.0);
  EXPECT_EQ(v["fused_rows"], 1);
  EXPECT_EQ(v["line"].get<std::string>().rfind("verdict: fused w4g64 M=1 (256x64)", 0), 0u);
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
