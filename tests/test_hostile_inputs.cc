// Hostile safetensors / GGUF files and scheme arithmetic: each case is an
// input class a fuzzer (or a mutation of a real file) produced, reduced to the
// bytes that matter. Every one must end in a qhead::Error — no crash, no stack
// overflow, no blocking open, no wrapped size, no raw file bytes in the message.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/types.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <string>
#include <vector>

#include "qhead/gguf.h"
#include "qhead/quantize.h"
#include "qhead/safetensors.h"
#include "qhead/scheme.h"
#include "qhead/table.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace qhead;
using qhead::test::expect_error;

namespace {

class HostileInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("qhead_hostile_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  fs::path dir_;
};

std::string le64(uint64_t v) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  return b;
}
std::string le32(uint32_t v) {
  std::string b(4, '\0');
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  return b;
}

// A safetensors file: u64 LE header length, the header, `data` zero bytes.
std::string st_file(const std::string& header, size_t data = 0) {
  return le64(header.size()) + header + std::string(data, '\0');
}

std::string gguf_str(const std::string& s) { return le64(s.size()) + s; }

// A GGUF v3 file of one tensor `name` with ggml ne `ne` and type `type`, no
// data bytes beyond the aligned header (`data` zero bytes appended), and the
// key-value pairs in `kv` (already encoded).
std::string gguf_file(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, size_t data = 0,
                      const std::string& kv = "", uint64_t n_kv = 0) {
  std::string b = "GGUF" + le32(3) + le64(1) + le64(n_kv) + kv;
  b += gguf_str(name) + le32(static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) b += le64(d);
  b += le32(type) + le64(0);
  b.resize((b.size() + 31) / 32 * 32, '\0');
  return b + std::string(data, '\0');
}

// ---- safetensors: nesting and __metadata__ --------------------------------------

TEST_F(HostileInputs, DeeplyNestedSafetensorsHeaderIsRefused) {
  // 200000 nested arrays: recursive parsing or dumping of this overflows the stack.
  const int n = 200000;
  const std::string deep = std::string(n, '[') + std::string(n, ']');
  const std::string objects = [&] {
    std::string o;
    for (int i = 0; i < n; ++i) o += "{\"k\":";
    return o + "0" + std::string(n, '}');
  }();
  for (const std::string& header :
       {"{\"w\":" + deep + "}", "{\"__metadata__\":{\"k\":" + deep + "}}", "{\"w\":" + objects + "}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":" + deep + ",\"data_offsets\":[0,0]}}"}) {
    const std::string p = write("deep.safetensors", st_file(header));
    const std::string msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
    EXPECT_NE(msg.find("header JSON nests deeper than 16 levels"), std::string::npos) << msg.substr(0, 300);
    EXPECT_LT(msg.size(), 1000u) << "the message must not carry the header";
  }
}

TEST_F(HostileInputs, NestingJustInsideTheBoundIsOnlyAShapeError) {
  // 16 levels in all (the top object, the entry, 14 nested arrays) parse; the
  // shape is then refused as such.
  const std::string deep = std::string(14, '[') + std::string(14, ']');
  const std::string p =
      write("d.safetensors", st_file("{\"w\":{\"dtype\":\"F32\",\"shape\":" + deep + ",\"data_offsets\":[0,0]}}"));
  const std::string msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("shape must be an array of non-negative integers"), std::string::npos) << msg;
}

TEST_F(HostileInputs, MetadataMustMapStringsToStrings) {
  const struct {
    std::string meta, needle;
  } cases[] = {
      {R"({"a":"b","nested":{"x":"y"}})", "__metadata__ value for key \"nested\" must be a string, got object"},
      {R"({"list":["x"]})", "__metadata__ value for key \"list\" must be a string, got array"},
      {R"({"n":null})", "__metadata__ value for key \"n\" must be a string, got null"},
      {R"(["x"])", "__metadata__ must be an object of strings, got array"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.meta);
    const std::string p = write("m.safetensors", st_file("{\"__metadata__\":" + c.meta + "}"));
    const std::string msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
}

// ---- safetensors: integers are range-checked, never truncated ---------------------

TEST_F(HostileInputs, SafetensorsIntegersOutOfRangeAreRefused) {
  const struct {
    std::string entry, needle;
  } cases[] = {
      // 2^63 does not fit int64 (a dim); 2^64 is no uint64 (parsed as a float).
      {R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]})", "shape must be an array"},
      {R"({"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551617]})", "data_offsets must be an array"},
      {R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]})", "shape must be an array"},
      {R"({"dtype":"U8","shape":[-1],"data_offsets":[0,0]})", "shape must be an array"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.entry);
    const std::string p = write("i.safetensors", st_file("{\"w\":" + c.entry + "}", 1));
    const std::string msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
}

TEST_F(HostileInputs, SchemeMetadataIntegersAreNotTruncated) {
  // num_bits 2^32 + 4 would read back as 4 if narrowed to int.
  SafetensorsWriter w;
  Tensor packed = Tensor::empty(DType::kI32, {2, 4}), scale = Tensor::empty(DType::kF16, {2, 1});
  Tensor shape = Tensor::empty(DType::kI64, {2});
  shape.ptr<int64_t>()[0] = 2;
  shape.ptr<int64_t>()[1] = 32;
  w.add("t.weight_packed", packed.view());
  w.add("t.weight_scale", scale.view());
  w.add("t.weight_shape", shape.view());
  w.set_metadata("qhead.scheme.t", R"({"num_bits":4294967300,"group_size":-1,"symmetric":true})");
  const std::string p = path("s.safetensors");
  w.write(p);
  const SafetensorsFile f = SafetensorsFile::open(p);
  const std::string msg = expect_error([&] { infer_scheme(f, "t"); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
}

// ---- safetensors: what a file is not --------------------------------------------------

TEST_F(HostileInputs, OtherFormatsAreNamed) {
  const struct {
    std::string bytes, needle;
  } cases[] = {
      {gguf_file("token_embd.weight", {32, 2}, 0, 256), "is not a safetensors file: it is a GGUF file"},
      {std::string("PK\x03\x04", 4) + std::string(60, '\0'), "is not a safetensors file: it is a zip archive (a PyTorch"},
      {std::string("\x80\x02}q\x00(X\x05\x00\x00\x00", 12) + std::string(40, 'x'),
       "is not a safetensors file: it is a Python pickle"},
      {"this is a plain text file, no model in it\n",
       "is not a safetensors file: its first 8 bytes are not a little-endian header length followed by '{'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.needle);
    const std::string p = write("x.safetensors", c.bytes);
    const std::string msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
}

// ---- file-supplied bytes in messages ------------------------------------------------------

TEST_F(HostileInputs, NamesInMessagesAreEscapedAndCut) {
  // A tensor name with an escape sequence, a newline and non-ASCII, then a very long one.
  const std::string evil = "w\\u001b[31m\\nred\\u00ff";
  std::string p = write("e.safetensors",
                        st_file("{\"" + evil + "\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1));
  std::string msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'w\\x1b[31m\\x0ared\\xc3\\xbf'"), std::string::npos) << msg;

  const std::string long_name(100000, 'n');
  p = write("l.safetensors",
            st_file("{\"" + long_name + "\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1));
  msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
  EXPECT_LT(msg.size(), 600u);
  EXPECT_NE(msg.find("(100000 bytes)"), std::string::npos) << msg;

  // The JSON parser's own message quotes the bytes it last read.
  p = write("j.safetensors", st_file(std::string("{\"a\":\x1b\x07}", 8)));
  msg = expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kInvalidFile);
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\x07'), std::string::npos) << msg;
}

TEST_F(HostileInputs, GgufNamesInMessagesAreEscaped) {
  const std::string p = write("e.gguf", gguf_file(std::string("t\x1b[2J\n", 6), {32, 1}, 99, 128));
  const std::string msg = expect_error([&] { GgufFile::open(p); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("tensor 't\\x1b[2J\\x0a': unknown ggml type 99"), std::string::npos) << msg;
}

// ---- non-regular files ---------------------------------------------------------------------

TEST_F(HostileInputs, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = path("model.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (int reader = 0; reader < 2; ++reader) {
    SCOPED_TRACE(reader == 0 ? "safetensors" : "gguf");
    auto result = std::async(std::launch::async, [&] {
      return expect_error(
          [&] {
            if (reader == 0)
              SafetensorsFile::open(fifo);
            else
              GgufFile::open(fifo);
          },
          ErrorCode::kIo);
    });
    if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      // Unblock the reader (a writer end appears) so the test can end, then fail.
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
      ADD_FAILURE() << "open() of a FIFO blocked";
      result.wait();
      continue;
    }
    const std::string msg = result.get();
    EXPECT_NE(msg.find("not a regular file (it is a FIFO)"), std::string::npos) << msg;
  }
}

TEST_F(HostileInputs, DirectoryAndDeviceAreRefused) {
  for (const std::string& p : {dir_.string(), std::string("/dev/null")}) {
    SCOPED_TRACE(p);
    EXPECT_NE(expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kIo).find("not a regular file"),
              std::string::npos);
    EXPECT_NE(expect_error([&] { GgufFile::open(p); }, ErrorCode::kIo).find("not a regular file"),
              std::string::npos);
  }
}

// ---- GGUF: huge dims ----------------------------------------------------------------------

TEST_F(HostileInputs, GgufZeroSizeTableWithHugeDimsIsRefused) {
  // token_embd.weight of ggml ne [2^62, 0]: zero bytes in the file, so the
  // reader accepts it, but [0, 2^62] is no token table.
  const std::string p = write("h.gguf", gguf_file("token_embd.weight", {uint64_t(1) << 62, 0}, 0));
  const GgufFile f = GgufFile::open(p);
  EXPECT_EQ(f.info("token_embd.weight").dims, (Shape{0, int64_t(1) << 62}));
  const std::string msg = expect_error([&] { gguf_roles(f); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("tensor 'token_embd.weight' has implausible dims [0, 4611686018427387904]"), std::string::npos)
      << msg;
  EXPECT_THROW(gguf_load_tables(f), Error);
}

TEST_F(HostileInputs, GgufDimsWhoseByteSizeOverflowsAreRefused) {
  // ne [2^62, 1] F32: 2^62 elements fit int64, 2^64 bytes do not fit uint64.
  const std::string p = write("o.gguf", gguf_file("token_embd.weight", {uint64_t(1) << 62, 1}, 0));
  const std::string msg = expect_error([&] { GgufFile::open(p); }, ErrorCode::kInvalidFile);
  EXPECT_NE(msg.find("tensor 'token_embd.weight': byte size of ggml ne [4611686018427387904, 1] overflows"),
            std::string::npos)
      << msg;
}

// ---- scheme arithmetic ---------------------------------------------------------------------

TEST(HostileSchemeArithmetic, PackedColsNeverOverflows) {
  for (int bits = 2; bits <= 8; ++bits) {
    QuantScheme s;
    s.bits = bits;
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(31), int64_t(32), int64_t(33), int64_t(96),
                      int64_t(1) << 40, int64_t(1) << 62, std::numeric_limits<int64_t>::max()}) {
      const __int128 want = (static_cast<__int128>(n) * bits + 31) / 32;
      EXPECT_EQ(static_cast<__int128>(s.packed_cols(n)), want) << "bits " << bits << " n " << n;
      EXPECT_EQ(static_cast<__int128>(s.zero_point_rows(n)), want);
    }
  }
}

TEST(HostileSchemeArithmetic, TableBytesIsCheckedAndNamesTheTensor) {
  const QuantScheme w4 = QuantScheme::parse("w4g64a");
  // [V, H] = [3, 128]: 3·16·4 code bytes + 3·2·2 scale bytes + 1·2·4 zero-point bytes.
  EXPECT_EQ(w4.table_bytes(3, 128, "op", "t"), 3 * 16 * 4 + 3 * 2 * 2 + 1 * 2 * 4);
  EXPECT_EQ(w4.table_bytes(0, int64_t(1) << 62, "op", "t"), 0);
  const std::string msg =
      expect_error([&] { w4.table_bytes(int64_t(1) << 40, int64_t(1) << 30, "inspect", "lm_head.weight"); },
                   ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("lm_head.weight: a [1099511627776, 1073741824] table packed as w4g64a"), std::string::npos)
      << msg;
  EXPECT_THROW(w4.table_bytes(-1, 64, "op", "t"), Error);
}

TEST(HostileSchemeArithmetic, TensorEmptyRefusesAnOverflowingByteSize) {
  const std::string msg =
      expect_error([] { Tensor::empty(DType::kF32, {int64_t(1) << 40, int64_t(1) << 40}); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("does not fit in 64 bits"), std::string::npos) << msg;
  EXPECT_EQ(Tensor::empty(DType::kF32, {int64_t(1) << 62, 0, int64_t(1) << 62}).numel(), 0);
}

// ---- every bit width the scheme parser accepts can be read back ----------------------------

TEST_F(HostileInputs, EveryBitWidthIsInferredFromShapes) {
  // A table quantized at each width 2..8, written WITHOUT qhead's scheme
  // metadata (as another writer would): the packed width alone gives the bits.
  const Tensor dense = qhead::test::random_tensor(DType::kF32, 5, 96, 7);
  for (int bits = 2; bits <= 8; ++bits) {
    SCOPED_TRACE(bits);
    const QuantScheme s = QuantScheme::parse("w" + std::to_string(bits) + "g32");
    const PackedTable q = quantize_rtn(dense.view(), s, 1, "t");
    SafetensorsWriter w;
    Tensor shape = Tensor::empty(DType::kI64, {2});
    shape.ptr<int64_t>()[0] = 5;
    shape.ptr<int64_t>()[1] = 96;
    w.add("t.weight_packed", q.packed.view());
    w.add("t.weight_scale", q.scale.view());
    w.add("t.weight_shape", shape.view());
    const std::string p = path("b" + std::to_string(bits) + ".safetensors");
    w.write(p);
    const SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(infer_scheme(f, "t"), s);
    EXPECT_EQ(load_packed(f, "t").packed().scheme, s);
  }
}

}  // namespace

namespace {

// ---- GGUF import: a NaN in a table to be quantized -------------------------------------------

TEST_F(HostileInputs, GgufTableWithNanIsRefusedByTheQuantizer) {
  // token_embd.weight F32 [2, 32] with a NaN and an Inf: RTN quantization must
  // refuse it (the fuzzer found NaN codes converted to int8, undefined behaviour).
  std::string data;
  for (int i = 0; i < 64; ++i) {
    const float v = i == 5 ? std::numeric_limits<float>::quiet_NaN()
                           : i == 40 ? std::numeric_limits<float>::infinity() : 0.25f * static_cast<float>(i % 7);
    data.append(reinterpret_cast<const char*>(&v), 4);
  }
  std::string b = gguf_file("token_embd.weight", {32, 2}, 0);
  b += data;
  const GgufFile f = GgufFile::open(write("nan.gguf", b));
  const TokenTables dense = gguf_load_tables(f);  // dense import keeps the values as they are
  EXPECT_TRUE(std::isnan(dense.embedding.dense().ptr<float>()[5]));
  for (const char* scheme : {"w4g32a", "w8", "w3g32"}) {
    SCOPED_TRACE(scheme);
    const std::string msg =
        expect_error([&] { gguf_load_tables(f, QuantScheme::parse(scheme), 1); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("row 0 holds a NaN or Inf"), std::string::npos) << msg;
  }
}

}  // namespace
