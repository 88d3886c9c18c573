// Tests for qhead/safetensors.h: round trip, writer safety, a corpus of
// malformed files (each with the expected error code and message), and a
// seeded mutation fuzz of the header.

#include "qhead/safetensors.h"

#include <algorithm>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "qhead/error.h"

namespace fs = std::filesystem;
using qhead::DType;
using qhead::Error;
using qhead::ErrorCode;
using qhead::SafetensorsFile;
using qhead::SafetensorsWriter;
using qhead::Shape;
using qhead::TensorView;

namespace {

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("qhead_st_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<unsigned char> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& p, const std::vector<unsigned char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<unsigned char> le64(uint64_t v) {
  std::vector<unsigned char> b(8);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  return b;
}

// Raw file: u64 LE length of `header`, the header, then `data_size` bytes.
std::vector<unsigned char> raw_file(const std::string& header, size_t data_size) {
  std::vector<unsigned char> b = le64(header.size());
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + data_size, 0xAB);
  return b;
}

// Expects open(p) to throw Error with `code` and a message containing `needle`.
void expect_open_error(const std::string& p, ErrorCode code, const std::string& needle) {
  try {
    SafetensorsFile::open(p);
    ADD_FAILURE() << "open(" << p << ") succeeded, expected error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
        << "message does not name the file: " << e.what();
  }
}

template <class F>
void expect_error(F&& f, ErrorCode code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error thrown, expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// Random bytes for a tensor of `shape` × `t`.
std::vector<unsigned char> random_data(std::mt19937& rng, DType t, const Shape& shape) {
  std::vector<unsigned char> b(static_cast<size_t>(qhead::shape_numel(shape)) * qhead::dtype_size(t));
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  return b;
}

struct Spec {
  std::string name;
  DType dtype;
  Shape shape;
};

// A small valid file used by several tests.
void write_small_valid(const std::string& p) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<int32_t> b = {7, 8, 9};
  SafetensorsWriter w;
  w.add("a", TensorView(a.data(), DType::kF32, {2, 3}));
  w.add("b", TensorView(b.data(), DType::kI32, {3}));
  w.set_metadata("format", "pt");
  w.write(p);
}

std::vector<std::string> tmp_leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".qhead-tmp-") != std::string::npos)
      out.push_back(e.path().string());
  return out;
}

// ============================================================================
// Round trip
// ============================================================================

TEST_F(SafetensorsTest, RoundTripAllDtypesAndAwkwardShapes) {
  std::mt19937 rng(1234);
  const std::vector<Spec> specs = {
      {"f32.weight", DType::kF32, {3, 5, 7}},
      {"f16", DType::kF16, {13}},
      {"bf16", DType::kBF16, {2, 1, 3}},
      {"i32.empty", DType::kI32, {0, 4}},  // zero-size
      {"i64.scalar", DType::kI64, {}},     // scalar
      {"u8", DType::kU8, {1, 1, 1, 11}},   // odd byte count: later tensors unaligned
      {"i8", DType::kI8, {5, 3}},
      {"f32.tail", DType::kF32, {1}},
  };
  std::vector<std::vector<unsigned char>> data;
  SafetensorsWriter w;
  for (const auto& s : specs) {
    data.push_back(random_data(rng, s.dtype, s.shape));
    w.add(s.name, TensorView(data.back().data(), s.dtype, s.shape));
  }
  w.set_metadata("format", "pt");
  w.set_metadata("note", "ünïcode ✓ and \"quotes\"");
  w.set_metadata("empty", "");
  const std::string p = path("model.safetensors");
  w.write(p);

  // The data section starts on an 8-byte boundary; padding is spaces.
  const auto raw = read_bytes(p);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | raw[static_cast<size_t>(i)];
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_LE(8 + n, raw.size());
  EXPECT_EQ(raw[8], '{');

  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.file_size(), raw.size());
  // Names come back in data-offset order: the writer lays tensors out by
  // element size, largest first (stable within a size), so each is aligned
  // for its dtype and usable in place.
  ASSERT_EQ(f.names().size(), specs.size());
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return qhead::dtype_size(specs[a].dtype) > qhead::dtype_size(specs[b].dtype);
  });
  size_t total = 0;
  const unsigned char* first = nullptr;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const auto& s = specs[i];
    EXPECT_EQ(f.names()[k], s.name);
    ASSERT_TRUE(f.contains(s.name));
    const auto t = f.get(s.name);
    EXPECT_EQ(t.dtype(), s.dtype) << s.name;
    EXPECT_EQ(t.shape(), s.shape) << s.name;
    ASSERT_EQ(t.nbytes(), data[i].size()) << s.name;
    if (!data[i].empty()) {
      EXPECT_EQ(std::memcmp(t.data(), data[i].data(), data[i].size()), 0) << s.name;
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % qhead::dtype_size(s.dtype), 0u) << s.name;
    // The view points into the mapping, tensors back to back in layout order.
    if (k == 0) first = static_cast<const unsigned char*>(t.data());
    EXPECT_EQ(static_cast<const unsigned char*>(t.data()), first + total) << s.name;
    total += data[i].size();
  }
  EXPECT_EQ(raw.size(), 8 + n + total);
  EXPECT_EQ(f.metadata().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "ünïcode ✓ and \"quotes\"");
  EXPECT_EQ(f.metadata().at("empty"), "");
  EXPECT_TRUE(tmp_leftovers(dir_).empty());
}

TEST_F(SafetensorsTest, TensorKeepsMappingAliveAfterFileIsGone) {
  const std::string p = path("small.safetensors");
  write_small_valid(p);
  qhead::Tensor t;
  {
    const auto f = SafetensorsFile::open(p);
    t = f.get("a");
  }
  fs::remove(p);  // the mapping survives unlink as well
  ASSERT_EQ(t.numel(), 6);
  float v[6];
  std::memcpy(v, t.data(), sizeof v);  // memcpy: the view may be unaligned in general
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[5], 6.0f);
}

TEST_F(SafetensorsTest, HeaderOnlyFileIsValid) {
  const std::string p = path("empty.safetensors");
  SafetensorsWriter().write(p);
  const auto f = SafetensorsFile::open(p);
  EXPECT_TRUE(f.names().empty());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.file_size() % 8, 0u);

  // Also a hand-made one: "{}" with metadata and no data section.
  write_bytes(p, raw_file(R"({"__metadata__":{"k":"v"}})", 0));
  const auto g = SafetensorsFile::open(p);
  EXPECT_TRUE(g.names().empty());
  EXPECT_EQ(g.metadata().at("k"), "v");
}

TEST_F(SafetensorsTest, ZeroSizeTensorsBetweenOthers) {
  // Zero-size tensors at the start, between two tensors and at the end.
  const std::string p = path("z.safetensors");
  write_bytes(p, raw_file(R"({"z0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                          R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("z1":{"dtype":"I64","shape":[3,0],"data_offsets":[2,2]},)"
                          R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},)"
                          R"("z2":{"dtype":"BF16","shape":[0,7],"data_offsets":[3,3]}})",
                          3));
  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"z0", "a", "z1", "b", "z2"}));
  EXPECT_EQ(f.get("z1").numel(), 0);
  EXPECT_EQ(f.get("z1").shape(), (Shape{3, 0}));
}

TEST_F(SafetensorsTest, GetAbsentNameIsInvalidArgument) {
  const std::string p = path("small.safetensors");
  write_small_valid(p);
  const auto f = SafetensorsFile::open(p);
  EXPECT_FALSE(f.contains("nope"));
  expect_error([&] { f.get("nope"); }, ErrorCode::kInvalidArgument, "nope");
  expect_error([&] { f.get("nope"); }, ErrorCode::kInvalidArgument, p);
}

TEST_F(SafetensorsTest, MissingFileIsIo) {
  expect_open_error(path("does_not_exist.safetensors"), ErrorCode::kIo, "cannot open");
  expect_open_error(dir_.string(), ErrorCode::kIo, "not a regular file");
}

// ============================================================================
// Writer safety
// ============================================================================

TEST_F(SafetensorsTest, WriterRefusesToOverwriteForbiddenInput) {
  const std::string in = path("in.safetensors");
  write_small_valid(in);
  const auto before = read_bytes(in);

  SafetensorsWriter w;
  std::vector<float> x = {42};
  w.add("x", TensorView(x.data(), DType::kF32, {1}));

  // Same spelling.
  expect_error([&] { w.write(in, {in}); }, ErrorCode::kInvalidArgument,
               "refusing to write over input " + in);
  // A different spelling of the same path.
  const std::string dotted = (dir_ / "." / "in.safetensors").string();
  expect_error([&] { w.write(dotted, {in}); }, ErrorCode::kInvalidArgument,
               "refusing to write over input");
  expect_error([&] { w.write(in, {dotted}); }, ErrorCode::kInvalidArgument,
               "refusing to write over input");
  // A hard link to the input.
  const std::string link = path("link.safetensors");
  ASSERT_EQ(::link(in.c_str(), link.c_str()), 0);
  expect_error([&] { w.write(link, {in}); }, ErrorCode::kInvalidArgument,
               "refusing to write over input");
  // A symlink to the input.
  const std::string sym = path("sym.safetensors");
  fs::create_symlink(in, sym);
  expect_error([&] { w.write(sym, {in}); }, ErrorCode::kInvalidArgument,
               "refusing to write over input");

  // Nothing was touched, nothing was left behind.
  EXPECT_EQ(read_bytes(in), before);
  EXPECT_TRUE(tmp_leftovers(dir_).empty());

  // Forbidding something else (or a missing file) does not block the write.
  const std::string out = path("out.safetensors");
  w.write(out, {in, path("missing.safetensors")});
  write_small_valid(out);  // overwrite an existing, non-forbidden file
  w.write(out, {in});
  EXPECT_EQ(SafetensorsFile::open(out).names(), std::vector<std::string>{"x"});
  EXPECT_EQ(read_bytes(in), before);
  EXPECT_TRUE(tmp_leftovers(dir_).empty());
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  std::vector<float> x(6, 1.0f);
  SafetensorsWriter w;
  w.add("x", TensorView(x.data(), DType::kF32, {2, 3}));
  expect_error([&] { w.add("x", TensorView(x.data(), DType::kF32, {6})); },
               ErrorCode::kInvalidArgument, "duplicate tensor name 'x'");
  expect_error([&] { w.add("__metadata__", TensorView(x.data(), DType::kF32, {6})); },
               ErrorCode::kInvalidArgument, "__metadata__");
  TensorView strided(x.data(), DType::kF32, {3, 2});
  strided.strides = {1, 3};  // a transposed view
  expect_error([&] { w.add("t", strided); }, ErrorCode::kInvalidArgument, "not contiguous");
  TensorView gpu(x.data(), DType::kF32, {6}, qhead::Device::kCUDA);
  expect_error([&] { w.add("g", gpu); }, ErrorCode::kInvalidArgument, "expected cpu");
  expect_error([&] { w.add("n", TensorView(x.data(), DType::kF32, {-1})); },
               ErrorCode::kInvalidArgument, "negative dim");

  // The failed adds left the writer usable with just "x".
  const std::string p = path("ok.safetensors");
  w.write(p);
  EXPECT_EQ(SafetensorsFile::open(p).names(), std::vector<std::string>{"x"});
}

TEST_F(SafetensorsTest, WriterIoFailureIsKIoAndLeavesNoTemp) {
  SafetensorsWriter w;
  std::vector<float> x = {1};
  w.add("x", TensorView(x.data(), DType::kF32, {1}));
  const std::string p = (dir_ / "no_such_dir" / "out.safetensors").string();
  expect_error([&] { w.write(p); }, ErrorCode::kIo, p);
  // Rename onto an existing directory fails after the temp file was written.
  const std::string d = path("a_directory");
  fs::create_directories(d / fs::path("child"));
  expect_error([&] { w.write(d); }, ErrorCode::kIo, "rename failed");
  EXPECT_TRUE(tmp_leftovers(dir_).empty());
}

// ============================================================================
// Malformed corpus
// ============================================================================

// Valid entry for tensor `name`: F32 of `n` elements at byte offset `begin`.
std::string f32_entry(const std::string& name, int n, int begin) {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) +
         "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(begin + 4 * n) +
         "]}";
}

TEST_F(SafetensorsTest, MalformedCorpus) {
  struct Case {
    const char* label;
    std::vector<unsigned char> bytes;
    std::string needle;
  };
  auto hdr = [](const std::string& h, size_t data) { return raw_file(h, data); };
  std::vector<unsigned char> huge_len = le64(uint64_t(1) << 40);
  huge_len.resize(64, ' ');
  std::vector<unsigned char> long_len = le64(1000);
  long_len.resize(20, ' ');

  const std::vector<Case> cases = {
      {"empty file", {}, "file too small"},
      {"5-byte file", {1, 0, 0, 0, 0}, "file too small"},
      {"header length larger than file", long_len, "header length 1000 exceeds the 12 bytes"},
      {"header length over the cap", huge_len, "exceeds the cap of 100000000"},
      {"header not JSON", hdr("{not json", 0), "header is not valid JSON"},
      {"empty header", hdr("", 0), "header is not valid JSON"},
      {"header is an array", hdr("[1,2,3]", 0), "header must be a JSON object, got array"},
      {"unknown dtype",
       hdr(R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", 4),
       "tensor 'w': unknown dtype \"F7\""},
      {"dtype not a string",
       hdr(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
       "tensor 'w': dtype must be a string"},
      {"negative shape",
       hdr(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})", 4),
       "tensor 'w': shape must be an array of non-negative integers"},
      {"float in shape",
       hdr(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4),
       "tensor 'w': shape must be an array of non-negative integers"},
      {"shape not array",
       hdr(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4),
       "tensor 'w': shape must be an array"},
      {"shape element count overflows",
       hdr(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", 0),
       "tensor 'w': element count of shape"},
      {"data_offsets with 3 items",
       hdr(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4),
       "tensor 'w': data_offsets must be an array of exactly two non-negative integers"},
      {"negative data_offsets",
       hdr(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
       "tensor 'w': data_offsets must be an array of exactly two"},
      {"begin > end",
       hdr(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 8),
       "tensor 'w': data_offsets begin 8 > end 4"},
      {"byte range size != shape x dtype",
       hdr(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
       "tensor 'w': byte range [0, 12) holds 12 bytes but shape [2, 2] of F32 needs"},
      {"byte count overflows",
       hdr(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
       "tensor 'w': byte range [0, 0) holds 0 bytes"},
      {"range beyond the data section",
       hdr(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8),
       "tensor 'w': byte range [4, 12) lies beyond the data section of 8 bytes"},
      {"two overlapping tensors",
       hdr("{" + f32_entry("first", 2, 0) + "," + f32_entry("second", 2, 4) + "}", 12),
       "tensors 'first' [0, 8) and 'second' [4, 12) overlap"},
      {"zero-size tensor inside another",
       hdr("{" + f32_entry("big", 2, 0) + "," + f32_entry("inner", 0, 4) + "}", 8),
       "and 'inner' [4, 4) overlap"},
      {"hole between tensors",
       hdr("{" + f32_entry("first", 1, 0) + "," + f32_entry("second", 1, 8) + "}", 12),
       "hole of 4 bytes in the data section [4, 8) between 'first' and 'second'"},
      {"hole at the start",
       hdr("{" + f32_entry("only", 1, 4) + "}", 8),
       "hole of 4 bytes in the data section [0, 4) before the first tensor 'only'"},
      {"trailing unused bytes",
       hdr("{" + f32_entry("only", 1, 0) + "}", 9),
       "5 trailing bytes in the data section after the last tensor 'only'"},
      {"data section but no tensors", hdr("{}", 3), "3 trailing bytes"},
      {"__metadata__ with non-string value",
       hdr(R"({"__metadata__":{"a":"b","n":1}})", 0),
       "__metadata__ value for key \"n\" must be a string"},
      {"__metadata__ not an object", hdr(R"({"__metadata__":"x"})", 0),
       "__metadata__ must be an object"},
      {"tensor entry missing dtype",
       hdr(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), "tensor 'w': missing \"dtype\""},
      {"tensor entry missing data_offsets",
       hdr(R"({"w":{"dtype":"F32","shape":[1]}})", 4), "tensor 'w': missing \"data_offsets\""},
      {"tensor entry with unknown key",
       hdr(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4),
       "tensor 'w': unknown key \"extra\""},
      {"tensor entry not an object", hdr(R"({"w":[1]})", 0),
       "tensor 'w': entry must be an object"},
      {"duplicate tensor name",
       hdr("{" + f32_entry("w", 1, 0) + "," + f32_entry("w", 1, 4) + "}", 8),
       "duplicate key \"w\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    const std::string p = path("bad_" + std::to_string(i) + ".safetensors");
    write_bytes(p, cases[i].bytes);
    expect_open_error(p, ErrorCode::kInvalidFile, cases[i].needle);
  }
}

// ============================================================================
// Fuzz
// ============================================================================

TEST_F(SafetensorsTest, FuzzHeaderMutationsNeverCrash) {
  // A valid file with several dtypes, a scalar, a zero-size tensor, metadata.
  const std::string src = path("seed.safetensors");
  {
    std::mt19937 rng(7);
    std::vector<std::vector<unsigned char>> keep;
    SafetensorsWriter w;
    const std::vector<Spec> specs = {{"a", DType::kF32, {2, 3}}, {"b", DType::kBF16, {5}},
                                     {"c", DType::kI64, {}},     {"d", DType::kU8, {0, 3}},
                                     {"e", DType::kI8, {7}}};
    for (const auto& s : specs) {
      keep.push_back(random_data(rng, s.dtype, s.shape));
      w.add(s.name, TensorView(keep.back().data(), s.dtype, s.shape));
    }
    w.set_metadata("k", "v");
    w.write(src);
  }
  const auto good = read_bytes(src);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | good[static_cast<size_t>(i)];
  const size_t header_end = static_cast<size_t>(8 + n);

  std::mt19937_64 rng(20240601);
  const std::string p = path("fuzz.safetensors");
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<unsigned char> b = good;
    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations && !b.empty(); ++m) {
      const size_t span = std::min(header_end, b.size());
      switch (rng() % 7) {
        case 0:  // flip one bit in the length prefix or header
          b[rng() % span] ^= static_cast<unsigned char>(1u << (rng() % 8));
          break;
        case 1:  // replace one header byte with a structural JSON character
          if (span > 8)
            b[8 + rng() % (span - 8)] =
                static_cast<unsigned char>("{}[]\",:-0123456789 \\"[rng() % 20]);
          break;
        case 2:  // random byte anywhere in prefix/header
          b[rng() % span] = static_cast<unsigned char>(rng());
          break;
        case 3:  // truncate
          b.resize(rng() % (b.size() + 1));
          break;
        case 4: {  // a random (often small) header length
          if (b.size() >= 8) {
            const uint64_t v = (rng() % 2) ? rng() % (good.size() + 16) : rng();
            for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
          }
          break;
        }
        case 5:  // append bytes after the data
          b.resize(b.size() + 1 + rng() % 16, static_cast<unsigned char>(rng()));
          break;
        case 6: {  // a meaning-preserving edit: whitespace after ',' or ':', N += 1
          if (b.size() < 8) break;
          uint64_t cur = 0;
          for (int i = 7; i >= 0; --i) cur = (cur << 8) | b[static_cast<size_t>(i)];
          if (cur > b.size() - 8 || cur == 0) break;
          std::vector<size_t> seps;
          for (size_t i = 8; i < 8 + cur; ++i)
            if (b[i] == ',' || b[i] == ':') seps.push_back(i);
          if (seps.empty()) break;
          const size_t at = seps[rng() % seps.size()];
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(at) + 1, ' ');
          ++cur;
          for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<unsigned char>(cur >> (8 * i));
          break;
        }
      }
    }
    write_bytes(p, b);
    try {
      const auto f = SafetensorsFile::open(p);
      ++opened;
      // Accepted: the views must tile exactly the data section of these bytes
      // (so none reaches outside the mapping), and every byte must be readable.
      uint64_t hn = 0;
      for (int i = 7; i >= 0; --i) hn = (hn << 8) | b[static_cast<size_t>(i)];
      ASSERT_EQ(f.file_size(), b.size());
      const size_t data_size = b.size() - 8 - static_cast<size_t>(hn);
      const unsigned char* start = nullptr;
      size_t total = 0;
      unsigned sum = 0;
      for (const auto& name : f.names()) {
        const auto t = f.get(name);
        // A view into the mapping, or an aligned copy when the bytes are not
        // aligned for the dtype: either way the same bytes, in order.
        const auto* c = static_cast<const unsigned char*>(t.data());
        if (!start) start = b.data() + 8 + hn;
        ASSERT_EQ(std::memcmp(c, start + total, t.nbytes()), 0) << name;
        ASSERT_EQ(t.nbytes(), static_cast<size_t>(t.numel()) * qhead::dtype_size(t.dtype()));
        for (size_t i = 0; i < t.nbytes(); ++i) sum += c[i];
        total += t.nbytes();
      }
      ASSERT_EQ(total, data_size);
      (void)sum;
    } catch (const Error& e) {
      ++rejected;
      EXPECT_TRUE(e.code() == ErrorCode::kInvalidFile || e.code() == ErrorCode::kIo) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-qhead exception: " << e.what();
    } catch (...) {
      FAIL() << "iteration " << iter << ": unknown exception";
    }
  }
  EXPECT_EQ(opened + rejected, 300);
  EXPECT_GT(opened, 0);
  EXPECT_GT(rejected, 0);
}

TEST_F(SafetensorsTest, WriterReplacesOnlyRegularFiles) {
  SafetensorsWriter w;
  std::vector<float> x = {1, 2};
  w.add("x", TensorView(x.data(), DType::kF32, {2}));
  // A FIFO at the output path (or a link to one, or to a device) is refused
  // and stays what it is; nothing is opened on it (which would block).
  const std::string fifo = path("out.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_error([&] { w.write(fifo); }, ErrorCode::kInvalidArgument, "a FIFO");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  fs::create_symlink(fifo, path("to_fifo"));
  expect_error([&] { w.write(path("to_fifo")); }, ErrorCode::kInvalidArgument, "link to a FIFO");
  fs::create_symlink("/dev/null", path("to_null"));
  expect_error([&] { w.write(path("to_null")); }, ErrorCode::kInvalidArgument, "character device");
  EXPECT_TRUE(tmp_leftovers(dir_).empty());
}

TEST_F(SafetensorsTest, WriterCheckRunsBeforeTheRename) {
  const std::string p = path("out.safetensors");
  write_small_valid(p);
  const std::string before = [&] {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  SafetensorsWriter w;
  std::vector<float> x = {1, 2};
  w.add("x", TensorView(x.data(), DType::kF32, {2}));
  // A failing check: the output keeps its previous content, no temporary is left.
  std::string seen;
  expect_error([&] {
    w.write(p, {}, [&](const std::string& written) {
      seen = written;
      EXPECT_TRUE(SafetensorsFile::open(written).contains("x"));  // complete when checked
      throw Error(ErrorCode::kInternal, "check", "does not read back");
    });
  }, ErrorCode::kInternal, "does not read back");
  EXPECT_NE(seen, p);
  {
    std::ifstream in(p, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), before);
  }
  EXPECT_TRUE(tmp_leftovers(dir_).empty());
  // A passing check: renamed into place.
  w.write(p, {}, [](const std::string&) {});
  EXPECT_TRUE(SafetensorsFile::open(p).contains("x"));
}

TEST_F(SafetensorsTest, WriterRemovesTemporariesOfKilledWriters) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // no longer alive
  const std::string dead = path(".out.safetensors.qhead-tmp-" + std::to_string(child));
  const std::string live = path(".out.safetensors.qhead-tmp-1");  // pid 1 always exists
  write_small_valid(path("scratch.safetensors"));
  fs::copy_file(path("scratch.safetensors"), dead);
  fs::copy_file(path("scratch.safetensors"), live);
  write_small_valid(path("out.safetensors"));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
}

}  // namespace
