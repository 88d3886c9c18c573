// Tests for qhead/gguf.h: every dequantizable type against the gguf Python
// package's own dequantization (fixtures made by scripts/make_gguf_fixtures.py,
// two of them rows of the real SmolLM2-135M and Gemma-3-270M files), metadata
// of every value type, tensor dims, role mapping, a corpus of malformed files
// built here (each with its error code and message), a truncation sweep and a
// seeded byte-mutation fuzz, and — when scripts/fetch_models.sh has run — the
// two real models themselves.

#include "qhead/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "qhead/error.h"
#include "qhead/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using qhead::Error;
using qhead::ErrorCode;
using qhead::GgmlType;
using qhead::GgufFile;
using qhead::GgufValueType;
using qhead::Tensor;
using qhead::test::expect_error;

namespace {

std::string fixture(const std::string& name) {
  return std::string(QHEAD_FIXTURE_DIR) + "/gguf/" + name;
}

uint32_t T(GgmlType t) { return static_cast<uint32_t>(t); }

// Bit-for-bit comparison of a dequantized tensor with gguf's reference.
void expect_bits_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(want.dtype(), qhead::DType::kF32) << what;
  const auto* g = got.ptr<const uint32_t>();
  const auto* w = want.ptr<const uint32_t>();
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (g[i] != w[i] && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " (row " << i / want.size(1) << ", col "
                    << i % want.size(1) << ") is " << qhead::bits_to_f32(g[i]) << " (0x" << std::hex
                    << g[i] << "), gguf says " << qhead::bits_to_f32(w[i]) << " (0x" << w[i]
                    << std::dec << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.numel() << " values differ";
}

// Dequantizes every tensor of `gguf_name` and compares with its .ref.safetensors.
// Returns the set of ggml types seen.
std::set<uint32_t> check_against_reference(const std::string& gguf_name, int threads) {
  const GgufFile f = GgufFile::open(fixture(gguf_name));
  const std::string ref_name = gguf_name.substr(0, gguf_name.size() - 5) + ".ref.safetensors";
  const auto ref = qhead::SafetensorsFile::open(fixture(ref_name));
  std::set<uint32_t> types;
  EXPECT_EQ(f.names().size(), ref.names().size());
  for (const std::string& name : f.names()) {
    SCOPED_TRACE(gguf_name + ": " + name);
    EXPECT_TRUE(ref.contains(name));
    if (!ref.contains(name)) continue;
    const auto& in = f.info(name);
    types.insert(in.type);
    const Tensor got = qhead::gguf_dequantize(f, name, threads);
    expect_bits_equal(got, ref.get(name),
                      gguf_name + " " + name + " (" + qhead::ggml_type_name(in.type) + ")");
  }
  return types;
}

// ---- a small GGUF writer for the malformed corpus ---------------------------------------

struct Bytes {
  std::vector<unsigned char> b;
  Bytes& u8(uint8_t v) { b.push_back(v); return *this; }
  Bytes& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
    return *this;
  }
  Bytes& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
    return *this;
  }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<unsigned char>& v) {
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
};

// A GGUF file described field by field, so each test can break one field.
struct Spec {
  struct Kv {
    std::string key;
    std::vector<unsigned char> typed_value;  // u32 type + value, already encoded
  };
  struct Ti {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type = 0;
    uint64_t offset = 0;
    uint32_t n_dims_override = UINT32_MAX;
  };
  uint32_t magic = 0x46554747u;
  uint32_t version = 3;
  uint64_t n_tensors_override = UINT64_MAX, n_kv_override = UINT64_MAX;
  std::vector<Kv> kvs;
  std::vector<Ti> tensors;
  uint64_t alignment = 32;
  uint64_t data_size = 0;  // bytes of data section written (0xAB filler)

  std::vector<unsigned char> encode() const {
    Bytes o;
    o.u32(magic).u32(version);
    o.u64(n_tensors_override != UINT64_MAX ? n_tensors_override : tensors.size());
    o.u64(n_kv_override != UINT64_MAX ? n_kv_override : kvs.size());
    for (const Kv& kv : kvs) o.str(kv.key).raw(kv.typed_value);
    for (const Ti& t : tensors) {
      o.str(t.name).u32(t.n_dims_override != UINT32_MAX ? t.n_dims_override
                                                          : static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) o.u64(d);
      o.u32(t.type).u64(t.offset);
    }
    while (o.b.size() % alignment) o.u8(0);
    o.b.resize(o.b.size() + data_size, 0xAB);
    return o.b;
  }
};

std::vector<unsigned char> kv_u32(uint32_t v) { return Bytes().u32(4).u32(v).b; }
std::vector<unsigned char> kv_str(const std::string& s) { return Bytes().u32(8).str(s).b; }

// A valid file: two Q8_0 tensors [3, 64] (2 blocks/row = 68 bytes/row, 204
// bytes each; the second at offset 224), an F32 [4], an architecture key and
// a string array.
Spec valid_spec() {
  Spec s;
  s.kvs.push_back({"general.architecture", kv_str("llama")});
  s.kvs.push_back({"tokenizer.ggml.tokens", Bytes().u32(9).u32(8).u64(3).str("a").str("b").str("c").b});
  s.tensors.push_back({"token_embd.weight", {64, 3}, T(GgmlType::kQ8_0), 0});
  s.tensors.push_back({"output.weight", {64, 3}, T(GgmlType::kQ8_0), 224});
  s.tensors.push_back({"norm", {4}, T(GgmlType::kF32), 448});
  s.data_size = 448 + 16;
  return s;
}

class GgufFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("qhead_gguf_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::vector<unsigned char>& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  // Expects open() of `bytes` to throw `code` with a message containing `needle`.
  void expect_open_error(const std::vector<unsigned char>& bytes, ErrorCode code,
                         const std::string& needle) {
    const std::string p = write("case.gguf", bytes);
    const std::string msg = expect_error([&] { GgufFile::open(p); }, code);
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    EXPECT_NE(msg.find(p), std::string::npos) << "message does not name the file: " << msg;
  }
  fs::path dir_;
};

std::vector<unsigned char> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ---- exactness against the gguf package -------------------------------------------------

TEST(Gguf, EveryTypeMatchesGgufPackageBitExactly) {
  const std::set<uint32_t> types = check_against_reference("synthetic.gguf", 0);
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                     GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                     GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K})
    EXPECT_TRUE(types.count(T(t))) << "synthetic.gguf lacks " << qhead::ggml_type_name(T(t));
}

TEST(Gguf, SmolLM2RowsMatchGgufPackage) {
  const std::set<uint32_t> types = check_against_reference("smollm2_slice.gguf", 0);
  EXPECT_EQ(types, (std::set<uint32_t>{T(GgmlType::kQ8_0), T(GgmlType::kQ4_1), T(GgmlType::kF32)}));
}

TEST(Gguf, Gemma3RowsMatchGgufPackage) {
  const std::set<uint32_t> types = check_against_reference("gemma3_slice.gguf", 0);
  EXPECT_EQ(types, (std::set<uint32_t>{T(GgmlType::kQ8_0), T(GgmlType::kQ5_0), T(GgmlType::kQ4_K),
                                       T(GgmlType::kQ6_K), T(GgmlType::kF32)}));
}

TEST(Gguf, ThreadCountsGiveIdenticalResults) {
  const GgufFile f = GgufFile::open(fixture("synthetic.gguf"));
  for (const std::string& name : f.names()) {
    const Tensor one = qhead::gguf_dequantize(f, name, 1);
    for (int threads : {2, 3, 7}) {
      const Tensor many = qhead::gguf_dequantize(f, name, threads);
      ASSERT_EQ(one.shape(), many.shape());
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.nbytes()), 0) << name << " threads " << threads;
    }
  }
}

TEST(Gguf, DequantizeRowMatchesWholeTensor) {
  const GgufFile f = GgufFile::open(fixture("gemma3_slice.gguf"));
  const auto& in = f.info("blk.0.ffn_down.weight");  // Q6_K [8, 2048]
  const Tensor all = qhead::gguf_dequantize(f, in.name);
  std::vector<float> row(static_cast<size_t>(in.cols()));
  const auto traits = qhead::ggml_type_traits(in.type);
  const int64_t row_bytes = in.cols() / traits->block_size * traits->type_size;
  const auto* src = static_cast<const unsigned char*>(f.data(in.name));
  qhead::gguf_dequantize_row(in.type, src + 5 * row_bytes, row.data(), in.cols());
  EXPECT_EQ(std::memcmp(row.data(), all.ptr<float>() + 5 * in.cols(), row.size() * 4), 0);
  expect_error([&] { qhead::gguf_dequantize_row(in.type, src, row.data(), 100); },
               ErrorCode::kInvalidArgument);
  expect_error([&] { qhead::gguf_dequantize_row(T(GgmlType::kQ2_K), src, row.data(), 256); },
               ErrorCode::kUnsupported);
}

// ---- header, dims, metadata -------------------------------------------------------------

TEST(Gguf, HeaderAndDims) {
  const GgufFile f = GgufFile::open(fixture("synthetic.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  const auto& d3 = f.info("dense.3d");
  EXPECT_EQ(d3.dims, (qhead::Shape{2, 3, 32}));  // ggml ne [32, 3, 2], outermost first
  EXPECT_EQ(d3.rows(), 6);
  EXPECT_EQ(d3.cols(), 32);
  EXPECT_EQ(d3.nbytes, 6u * 32 * 4);
  EXPECT_EQ(d3.file_offset, f.data_offset() + d3.offset);
  const auto& k6 = f.info("quant.q6_k");
  EXPECT_EQ(k6.dims, (qhead::Shape{7, 768}));
  EXPECT_EQ(k6.type, T(GgmlType::kQ6_K));
  EXPECT_EQ(k6.nbytes, 7u * 3 * 210);
  EXPECT_EQ(qhead::gguf_dequantize(f, "dense.3d").shape(), (qhead::Shape{6, 32}));
  EXPECT_TRUE(f.contains("quant.q4_k"));
  EXPECT_FALSE(f.contains("nope"));
  const std::string msg = expect_error([&] { f.info("nope"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("nope"), std::string::npos);
  EXPECT_EQ(qhead::ggml_type_name(T(GgmlType::kQ5_K)), "Q5_K");
  EXPECT_EQ(qhead::ggml_type_name(77), "type 77");
}

TEST(Gguf, ViewOfDenseTensorsIsZeroCopy) {
  const GgufFile f = GgufFile::open(fixture("synthetic.gguf"));
  const Tensor v = f.view("dense.f16");
  EXPECT_EQ(v.dtype(), qhead::DType::kF16);
  EXPECT_EQ(v.shape(), (qhead::Shape{5, 33}));
  EXPECT_EQ(v.data(), f.data("dense.f16"));
  const Tensor deq = qhead::gguf_dequantize(f, "dense.f16");
  for (int64_t i = 0; i < v.numel(); ++i)
    EXPECT_EQ(qhead::f32_to_bits(qhead::load_as_f32(v.data(), v.dtype(), i)),
              qhead::f32_to_bits(deq.ptr<float>()[i]));
  const std::string msg = expect_error([&] { f.view("quant.q4_0"); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("Q4_0"), std::string::npos);
}

TEST(Gguf, MetadataOfEveryValueType) {
  const GgufFile f = GgufFile::open(fixture("synthetic.gguf"));
  EXPECT_EQ(f.get_string("general.architecture"), "qhead-synthetic");
  EXPECT_EQ(f.get_int("test.u8"), 200);
  EXPECT_EQ(f.get_int("test.i8"), -100);
  EXPECT_EQ(f.get_int("test.u16"), 60000);
  EXPECT_EQ(f.get_int("test.i16"), -30000);
  EXPECT_EQ(f.get_int("test.u32"), 4000000000LL);
  EXPECT_EQ(f.get_int("test.i32"), -2000000000);
  EXPECT_EQ(f.get_int("test.i64"), -9000000000000000000LL);
  EXPECT_EQ(f.find("test.u64")->u, 18000000000000000000ULL);
  expect_error([&] { f.get_int("test.u64"); }, ErrorCode::kInvalidFile);  // does not fit int64
  EXPECT_EQ(f.get_float("test.f32"), 0.15625);
  EXPECT_EQ(f.get_float("test.f64"), -2.5e-300);
  EXPECT_EQ(f.get_bool("test.bool"), true);
  EXPECT_EQ(f.get_string("test.string"), "h\xc3\xa9llo, gguf");
  const auto* a = f.find("test.array_i32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->elem_type, GgufValueType::kI32);
  ASSERT_EQ(a->count, 3u);
  EXPECT_EQ(a->at(1).i, -2);
  EXPECT_EQ(f.find("test.array_f32")->at(1).f, -1.25);
  EXPECT_EQ(f.get_string_array("test.array_str"), (std::vector<std::string>{"a", "", "ccc"}));
  const auto* nested = f.find("test.nested_str");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->elem_type, GgufValueType::kArray);
  ASSERT_EQ(nested->count, 2u);
  EXPECT_EQ(nested->at(0).at(1).str, "yy");
  EXPECT_EQ(nested->at(1).at(0).str, "zzz");
  EXPECT_EQ(f.get_array_length("tokenizer.ggml.tokens"), 37u);
  expect_error([&] { nested->at(2); }, ErrorCode::kInvalidArgument);
  // Absent keys are nullopt; present keys of another type are errors naming the key.
  EXPECT_FALSE(f.get_string("no.such.key").has_value());
  const std::string msg = expect_error([&] { f.get_string("test.u8"); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("test.u8"), std::string::npos);
  expect_error([&] { f.get_string_array("test.array_i32"); }, ErrorCode::kInvalidFile);
  // Keys in file order; the dump has one line per key.
  EXPECT_EQ(f.keys().front(), "general.architecture");
  const std::string dump = f.dump_metadata();
  EXPECT_NE(dump.find("test.u8: u8 = 200\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("test.nested_str: array<array<string>[2]>[2] = [[\"x\", \"yy\"], [\"zzz\"]]"),
            std::string::npos) << dump;
  EXPECT_NE(dump.find("tokenizer.ggml.tokens: array<string>[37] = [\"<t0>\""), std::string::npos);
  EXPECT_NE(dump.find("... (37 total)]"), std::string::npos);
}

TEST(Gguf, SliceMetadataMatchesTheirModels) {
  const GgufFile s = GgufFile::open(fixture("smollm2_slice.gguf"));
  EXPECT_EQ(s.get_string("general.architecture"), "llama");
  EXPECT_EQ(s.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(s.get_int("qhead.source_vocab_size"), 49152);
  // The slice's vocabulary is its 24 kept rows.
  EXPECT_EQ(s.get_array_length("tokenizer.ggml.tokens"), 24u);
  EXPECT_EQ(s.info("token_embd.weight").dims, (qhead::Shape{24, 576}));
  const GgufFile g = GgufFile::open(fixture("gemma3_slice.gguf"));
  EXPECT_EQ(g.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(g.get_int("gemma3.embedding_length"), 640);
  EXPECT_EQ(g.get_int("qhead.source_vocab_size"), 262144);
  EXPECT_EQ(g.find("qhead.source_rows")->at(23).i, 262143);
  EXPECT_EQ(g.info("token_embd.weight").dims, (qhead::Shape{24, 640}));
}

// ---- roles --------------------------------------------------------------------------------

TEST(Gguf, RolesTiedWhenNoOutputWeight) {
  const GgufFile s = GgufFile::open(fixture("smollm2_slice.gguf"));
  const auto r = qhead::gguf_roles(s);
  EXPECT_TRUE(r.tied);
  EXPECT_EQ(r.embedding, "token_embd.weight");
  EXPECT_EQ(r.head, "token_embd.weight");
  EXPECT_EQ(r.vocab, 24);
  EXPECT_EQ(r.hidden, 576);
  EXPECT_TRUE(qhead::gguf_roles(GgufFile::open(fixture("gemma3_slice.gguf"))).tied);
}

TEST(Gguf, RolesUntiedWithOutputWeight) {
  const auto r = qhead::gguf_roles(GgufFile::open(fixture("synthetic.gguf")));
  EXPECT_FALSE(r.tied);
  EXPECT_EQ(r.embedding, "token_embd.weight");
  EXPECT_EQ(r.head, "output.weight");
  EXPECT_EQ(r.vocab, 37);
  EXPECT_EQ(r.hidden, 64);
}

TEST_F(GgufFileTest, RolesErrors) {
  Spec s = valid_spec();
  s.tensors[1].ne = {32, 6};  // output.weight [6, 32] vs token_embd.weight [3, 64]
  const GgufFile f = GgufFile::open(write("mismatch.gguf", s.encode()));
  std::string msg = expect_error([&] { qhead::gguf_roles(f); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("output.weight"), std::string::npos) << msg;
  Spec none = valid_spec();
  none.tensors[0].name = "tok_embeddings.weight";
  const GgufFile g = GgufFile::open(write("none.gguf", none.encode()));
  msg = expect_error([&] { qhead::gguf_roles(g); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("token_embd.weight"), std::string::npos) << msg;
}

TEST_F(GgufFileTest, UnsupportedTypeNamesTensorAndType) {
  Spec s = valid_spec();
  s.tensors[1].type = T(GgmlType::kQ2_K);  // 256 per 84 bytes: ne0 must be a multiple of 256
  s.tensors[1].ne = {256, 2};
  const GgufFile f = GgufFile::open(write("q2k.gguf", s.encode()));
  const std::string msg =
      expect_error([&] { qhead::gguf_dequantize(f, "output.weight"); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("output.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Q2_K"), std::string::npos) << msg;
}

// ---- malformed corpus ------------------------------------------------------------------------

TEST_F(GgufFileTest, ValidSpecOpens) {
  const GgufFile f = GgufFile::open(write("ok.gguf", valid_spec().encode()));
  EXPECT_EQ(f.names().size(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.info("output.weight").nbytes, 204u);
  EXPECT_EQ(f.info("norm").dims, (qhead::Shape{4}));
  EXPECT_EQ(qhead::gguf_dequantize(f, "norm").shape(), (qhead::Shape{1, 4}));
}

TEST_F(GgufFileTest, MalformedHeader) {
  Spec s = valid_spec();
  s.magic = 0x46554746u;  // "FGUF"
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "bad magic");
  expect_open_error({'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0}, ErrorCode::kInvalidFile,
                    "file too small for a GGUF header");
  expect_open_error({}, ErrorCode::kInvalidFile, "file too small");
  s = valid_spec();
  s.version = 0;
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "version 0");
  s.version = 1;
  expect_open_error(s.encode(), ErrorCode::kUnsupported, "version 1");
  s.version = 0x03000000u;  // a big-endian file's version read little-endian
  expect_open_error(s.encode(), ErrorCode::kUnsupported, "big-endian");
  s.version = 4;
  expect_open_error(s.encode(), ErrorCode::kUnsupported, "version 4");
  s = valid_spec();
  s.version = 2;  // v2 has the same layout
  EXPECT_EQ(GgufFile::open(write("v2.gguf", s.encode())).version(), 2u);
}

TEST_F(GgufFileTest, HugeCounts) {
  Spec s = valid_spec();
  s.n_tensors_override = uint64_t(1) << 62;
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "tensor count 4611686018427387904 is impossible");
  s = valid_spec();
  s.n_kv_override = ~uint64_t(0) - 1;
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "metadata count");
  s = valid_spec();
  s.n_kv_override = 5;  // more than written: the parser runs into the tensor infos
  const std::string p = write("kv5.gguf", s.encode());
  expect_error([&] { GgufFile::open(p); }, ErrorCode::kInvalidFile);
}

TEST_F(GgufFileTest, StringsAndArrays) {
  Spec s = valid_spec();
  s.kvs[0].typed_value = Bytes().u32(8).u64(uint64_t(1) << 40).b;  // string length past EOF
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "string length 1099511627776");
  s = valid_spec();
  s.kvs[0].key = "";
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "is empty");
  s = valid_spec();
  s.kvs[0].typed_value = Bytes().u32(13).u32(0).b;  // unknown value type
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "unknown value type 13");
  s = valid_spec();
  s.kvs[1].typed_value = Bytes().u32(9).u32(42).u64(1).b;  // unknown element type
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "unknown array element type 42");
  s = valid_spec();
  s.kvs[1].typed_value = Bytes().u32(9).u32(8).u64(uint64_t(1) << 59).b;  // huge string array
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "array count 576460752303423488");
  s = valid_spec();
  s.kvs[1].typed_value = Bytes().u32(9).u32(10).u64(uint64_t(1) << 61).b;  // u64 array: count·8 overflows
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "cannot fit");
  s = valid_spec();
  // A string element whose length runs past the end.
  s.kvs[1].typed_value = Bytes().u32(9).u32(8).u64(2).str("a").u64(uint64_t(1) << 50).b;
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "element 1");
  // Arrays nested 9 deep.
  Bytes deep;
  deep.u32(9);
  for (int i = 0; i < 9; ++i) deep.u32(9).u64(1);
  deep.u32(0).u64(0);
  s = valid_spec();
  s.kvs[1].typed_value = deep.b;
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "nested deeper than 8");
  s = valid_spec();
  s.kvs.push_back({"general.architecture", kv_str("again")});
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "'general.architecture': duplicate key");
}

TEST_F(GgufFileTest, Alignment) {
  Spec s = valid_spec();
  s.kvs.push_back({"general.alignment", kv_u32(48)});
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "power of two");
  s = valid_spec();
  s.kvs.push_back({"general.alignment", kv_u32(0)});
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "power of two");
  s = valid_spec();
  s.kvs.push_back({"general.alignment", kv_str("32")});
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "must be an unsigned integer");
  s = valid_spec();
  s.kvs.push_back({"general.alignment", kv_u32(64)});
  s.alignment = 64;  // offsets 224, 448 are not multiples of 64
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "not a multiple of the alignment 64");
  s.tensors[1].offset = 256;
  s.tensors[2].offset = 512;
  s.data_size = 528;
  EXPECT_EQ(GgufFile::open(write("a64.gguf", s.encode())).alignment(), 64u);
}

TEST_F(GgufFileTest, TensorInfos) {
  Spec s = valid_spec();
  s.tensors[1].type = 31;  // a retired id
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "tensor 'output.weight': unknown ggml type 31");
  s = valid_spec();
  s.tensors[0].ne = {64, 3, 1, 1, 1};
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "n_dims 5");
  s = valid_spec();
  s.tensors[0].ne = {64, uint64_t(1) << 63};  // negative as int64
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "is negative");
  s = valid_spec();
  s.tensors[0].ne = {uint64_t(1) << 32, uint64_t(1) << 32};  // 2^64 elements
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "overflows int64");
  s = valid_spec();
  s.tensors[0].ne = {48, 3};  // Q8_0 rows must be multiples of 32
  expect_open_error(s.encode(), ErrorCode::kInvalidFile,
                    "tensor 'token_embd.weight': row length 48 is not a multiple of the Q8_0 block size 32");
  s = valid_spec();
  s.tensors[1].offset = 208;  // 208 % 32 != 0
  expect_open_error(s.encode(), ErrorCode::kInvalidFile,
                    "tensor 'output.weight': data offset 208 is not a multiple of the alignment 32");
  s = valid_spec();
  s.tensors[1].offset = 192;  // [192, 396) overlaps token_embd.weight [0, 204)
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "overlaps tensor 'token_embd.weight'");
  s = valid_spec();
  s.tensors[2].offset = 480;  // [480, 496) past the 464-byte data section
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "tensor 'norm': data range [480, 480 + 16)");
  s = valid_spec();
  s.tensors[2].offset = ~uint64_t(0) - 31;  // offset + size overflows
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "runs past the end");
  s = valid_spec();
  s.tensors[2].name = "output.weight";
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "tensor 'output.weight': duplicate tensor name");
  s = valid_spec();
  s.tensors[2].name = "";
  expect_open_error(s.encode(), ErrorCode::kInvalidFile, "empty name");
  s = valid_spec();
  s.tensors[2].n_dims_override = 3;  // claims 3 dims, 1 written: the fields shift
  const std::string p = write("shift.gguf", s.encode());
  expect_error([&] { GgufFile::open(p); }, ErrorCode::kInvalidFile);
}

// Every strict prefix of a valid file is rejected with kInvalidFile, never a crash.
TEST_F(GgufFileTest, EveryTruncationIsRejected) {
  const std::vector<unsigned char> full = valid_spec().encode();
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string p = write("trunc.gguf", std::vector<unsigned char>(full.begin(), full.begin() + n));
    try {
      GgufFile::open(p);
      ADD_FAILURE() << "prefix of " << n << " bytes opened";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidFile) << n << ": " << e.what();
    }
  }
}

// Seeded byte mutations of a real fixture: open either throws qhead::Error or
// succeeds, and then every tensor dequantizes (or throws kUnsupported) without
// touching memory outside the mapping (the ASan build checks that).
TEST_F(GgufFileTest, MutationFuzz) {
  const std::vector<unsigned char> base = read_bytes(fixture("smollm2_slice.gguf"));
  ASSERT_GT(base.size(), 1000u);
  // The header region (before the data section) is where structure lives.
  const size_t header_end = static_cast<size_t>(GgufFile::open(fixture("smollm2_slice.gguf")).data_offset());
  std::mt19937_64 rng(4);
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<unsigned char> b = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % header_end;
      switch (rng() % 3) {
        case 0: b[at] ^= static_cast<unsigned char>(1u << (rng() % 8)); break;
        case 1: b[at] = static_cast<unsigned char>(rng()); break;
        default: b[at] = (rng() & 1) ? 0xFF : 0x00; break;
      }
    }
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    const std::string p = write("fuzz.gguf", b);
    try {
      const GgufFile f = GgufFile::open(p);
      ++opened;
      for (const std::string& name : f.names()) {
        try {
          (void)qhead::gguf_dequantize(f, name, 1);
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
        }
      }
      (void)f.dump_metadata();
    } catch (const Error& e) {
      ++rejected;
      EXPECT_TRUE(e.code() == ErrorCode::kInvalidFile || e.code() == ErrorCode::kUnsupported) << e.what();
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(opened, 0);
}

// ---- the real models (scripts/fetch_models.sh) -------------------------------------------------

std::string model_cache() {
  if (const char* c = std::getenv("QHEAD_MODEL_CACHE")) return c;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/qhead/models";
}

// Checks the real model at `file` against its committed slice: same type,
// dims, tied-ness, tokenizer length, and the same dequantized rows.
void check_real_model(const std::string& file, const std::string& slice, int64_t vocab,
                      int64_t hidden, const std::string& arch) {
  const std::string path = model_cache() + "/" + file;
  if (!fs::exists(path)) GTEST_SKIP() << path << " not cached; run scripts/fetch_models.sh";
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), arch);
  EXPECT_EQ(f.get_array_length("tokenizer.ggml.tokens"), static_cast<uint64_t>(vocab));
  const auto roles = qhead::gguf_roles(f);
  EXPECT_TRUE(roles.tied);
  EXPECT_EQ(roles.vocab, vocab);
  EXPECT_EQ(roles.hidden, hidden);
  const auto& emb = f.info("token_embd.weight");
  EXPECT_EQ(emb.dims, (qhead::Shape{vocab, hidden}));
  // The slice's rows (the first 12 and the last 12 ids), dequantized from the
  // full file, equal gguf's reference for the slice.
  const auto ref = qhead::SafetensorsFile::open(fixture(slice + ".ref.safetensors"));
  const Tensor want = ref.get("token_embd.weight");
  ASSERT_EQ(want.shape(), (qhead::Shape{24, hidden}));
  const auto traits = qhead::ggml_type_traits(emb.type);
  const int64_t row_bytes = hidden / traits->block_size * traits->type_size;
  const auto* src = static_cast<const unsigned char*>(f.data(emb.name));
  std::vector<float> row(static_cast<size_t>(hidden));
  for (int64_t k = 0; k < 24; ++k) {
    const int64_t id = k < 12 ? k : vocab - 24 + k;
    qhead::gguf_dequantize_row(emb.type, src + id * row_bytes, row.data(), hidden);
    EXPECT_EQ(std::memcmp(row.data(), want.ptr<float>() + k * hidden, row.size() * 4), 0)
        << file << " token_embd row " << id;
  }
}

TEST(GgufRealModels, SmolLM2_135M) {
  check_real_model("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2_slice", 49152, 576, "llama");
}

TEST(GgufRealModels, Gemma3_270M) {
  check_real_model("gemma-3-270m-q4_k_m.gguf", "gemma3_slice", 262144, 640, "gemma3");
}

}  // namespace
