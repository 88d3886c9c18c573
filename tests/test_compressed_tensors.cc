// Interoperability with the real compressed-tensors library: the fixtures in
// tests/fixtures/ct were made by scripts/make_ct_fixtures.py with
// compressed-tensors 0.20.0 (its own RTN, pack_to_int32 and decompress).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "qhead/error.h"
#include "qhead/quantize.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"
#include "test_util.h"

namespace qhead {
namespace {

const char* kCases[] = {"w4g64_bf16", "w4g32a_f16", "w8_f32", "w8g128a_bf16", "w4a_f16", "w3g32_bf16"};

std::string fixture(const std::string& name) { return std::string(QHEAD_FIXTURE_DIR) + "/ct/" + name + ".safetensors"; }

struct Case {
  std::string prefix;
  QuantScheme scheme;
};

Case read_case(const SafetensorsFile& f) {
  const auto& m = f.metadata();
  Case c;
  c.prefix = m.at("prefix");
  c.scheme.bits = std::stoi(m.at("num_bits"));
  c.scheme.group_size = std::stoi(m.at("group_size"));
  c.scheme.symmetric = m.at("symmetric") == "true";
  c.scheme.scale_dtype = f.get("dense.weight").dtype();
  return c;
}

using test::same_bytes;

class CompressedTensors : public ::testing::TestWithParam<const char*> {};

// qhead reads compressed-tensors' packed tensors to the values its own
// decompress() gives. compressed-tensors dequantizes in the scale dtype
// ((q - z) cast to it, times s, rounded), qhead in f32 (exact: (q - z) has at
// most 9 significant bits, s at most 24); so rounding qhead's value to the
// scale dtype must reproduce the library's bits exactly.
TEST_P(CompressedTensors, ReadsToTheSameValues) {
  const SafetensorsFile f = SafetensorsFile::open(fixture(GetParam()));
  const Case c = read_case(f);
  const Table t = load_packed(f, c.prefix, c.scheme);
  // Every width 2..8 is told apart by the packed width once H >= 32 (the fixtures' H).
  EXPECT_EQ(infer_scheme(f, c.prefix), c.scheme) << "scheme inferred from shapes";
  const Tensor ref = f.get("decompressed.weight");
  ASSERT_EQ(ref.shape(), (Shape{t.vocab(), t.hidden()}));
  std::vector<float> row(static_cast<size_t>(t.hidden()));
  int64_t mismatches = 0;
  for (int64_t v = 0; v < t.vocab(); ++v) {
    t.row_f32(v, row.data());
    for (int64_t j = 0; j < t.hidden(); ++j) {
      const float ours = round_through(row[static_cast<size_t>(j)], ref.dtype());
      const float theirs = load_as_f32(ref.data(), ref.dtype(), v * t.hidden() + j);
      if (ours != theirs && mismatches++ < 5)
        ADD_FAILURE() << GetParam() << " row " << v << " col " << j << ": qhead " << ours << " vs c-t " << theirs;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// qhead's RTN quantizer gives byte-identical packed codes, scales and zero
// points to compressed-tensors' calculate_qparams + compress on the same input.
TEST_P(CompressedTensors, QuantizesToIdenticalBytes) {
  const SafetensorsFile f = SafetensorsFile::open(fixture(GetParam()));
  const Case c = read_case(f);
  const Tensor dense = f.get("dense.weight");
  for (int threads : {1, 3}) {
    const PackedTable q = quantize_rtn(dense.view(), c.scheme, threads, "dense.weight");
    EXPECT_TRUE(same_bytes(q.packed, f.get(c.prefix + ".weight_packed"))) << GetParam() << " weight_packed";
    EXPECT_TRUE(same_bytes(q.scale, f.get(c.prefix + ".weight_scale"))) << GetParam() << " weight_scale";
    if (!c.scheme.symmetric)
      EXPECT_TRUE(same_bytes(q.zero_point, f.get(c.prefix + ".weight_zero_point"))) << GetParam() << " zero_point";
  }
}

// What qhead writes is byte-for-byte what compressed-tensors wrote, so the
// library reads it back identically.
TEST_P(CompressedTensors, WritesIdenticalTensors) {
  const SafetensorsFile f = SafetensorsFile::open(fixture(GetParam()));
  const Case c = read_case(f);
  const PackedTable q = quantize_rtn(f.get("dense.weight").view(), c.scheme, 2, "dense.weight");
  const auto dir = std::filesystem::temp_directory_path() / ("qhead_ct_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string out = (dir / (std::string(GetParam()) + ".safetensors")).string();
  {
    SafetensorsWriter w;
    Tensor shape;
    add_packed(w, c.prefix, q, shape);
    w.write(out);
  }
  const SafetensorsFile back = SafetensorsFile::open(out);
  for (const char* k : {".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape"}) {
    const std::string name = c.prefix + k;
    ASSERT_EQ(back.contains(name), f.contains(name)) << name;
    if (f.contains(name)) EXPECT_TRUE(same_bytes(back.get(name), f.get(name))) << GetParam() << " " << name;
  }
  const Table t = load_packed(back, c.prefix);  // the scheme comes from qhead's metadata, any bits
  EXPECT_EQ(t.packed().scheme, c.scheme);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CompressedTensors, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace qhead
