// GGUF models into qhead Tables, and `qhead inspect MODEL.gguf`, on the
// slices of the two real models (tests/fixtures/gguf, made by
// scripts/make_gguf_fixtures.py from SmolLM2-135M and Gemma-3-270M).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

#include "qhead/gguf.h"
#include "qhead/ops.h"

namespace qhead {
namespace {

std::string fixture(const std::string& name) { return std::string(QHEAD_FIXTURE_DIR) + "/gguf/" + name; }

// Tied models: one Table for both roles, equal to gguf's dequantization (dense)
// or within the RTN bound of it (quantized).
TEST(GgufTables, TiedSliceLoadsAsOneTable) {
  for (const char* name : {"smollm2_slice.gguf", "gemma3_slice.gguf"}) {
    SCOPED_TRACE(name);
    const GgufFile f = GgufFile::open(fixture(name));
    const GgufRoles r = gguf_roles(f);
    ASSERT_TRUE(r.tied);
    const Tensor ref = gguf_dequantize(f, r.embedding);
    const TokenTables dense = gguf_load_tables(f);
    EXPECT_TRUE(dense.tied());
    EXPECT_FALSE(dense.head.is_packed());
    ASSERT_EQ(dense.head.vocab(), r.vocab);
    ASSERT_EQ(dense.head.hidden(), r.hidden);
    EXPECT_EQ(std::memcmp(dense.head.dense().data(), ref.data(), ref.nbytes()), 0);

    const TokenTables q = gguf_load_tables(f, QuantScheme::parse("w4g64", DType::kBF16));
    EXPECT_TRUE(q.tied());
    ASSERT_TRUE(q.head.is_packed());
    const PackedTable& p = q.head.packed();
    std::vector<float> row(static_cast<size_t>(r.hidden));
    for (int64_t v = 0; v < r.vocab; ++v) {
      q.head.row_f32(v, row.data());
      for (int64_t j = 0; j < r.hidden; ++j) {
        const float s = load_as_f32(p.scale.data(), p.scale.dtype(), v * p.scheme.groups(r.hidden) + j / 64);
        // RTN error s/2, widened by compressed-tensors' rounding of s and x/s to
        // the scale dtype (BF16: 2·7.5·2^-8, see the quantizer's comment).
        ASSERT_LE(std::fabs(row[size_t(j)] - ref.ptr<float>()[v * r.hidden + j]), s / 2 * (1 + 2 * 7.5 / 256) + 1e-12)
            << "row " << v << " col " << j;
      }
    }
    // The one table serves embed and logits.
    Tensor ids = Tensor::empty(DType::kI32, {2});
    ids.ptr<int32_t>()[0] = 0;
    ids.ptr<int32_t>()[1] = int32_t(r.vocab - 1);
    const Tensor e = embed(q.embedding, ids.view());
    q.head.row_f32(r.vocab - 1, row.data());
    EXPECT_EQ(std::memcmp(e.ptr<float>() + r.hidden, row.data(), size_t(r.hidden) * 4), 0);
  }
}

TEST(GgufTables, InspectGgufJson) {
  const std::string cmd = std::string(QHEAD_CLI_PATH) + " inspect --json " + fixture("smollm2_slice.gguf");
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["tied"], true);
  EXPECT_EQ(j["hidden"], 576);
  EXPECT_EQ(j["embedding"]["ggml_type"], "Q8_0");
  EXPECT_GT(j["table_bytes"].get<double>(), j["table_bytes_after"].get<double>());
}

}  // namespace
}  // namespace qhead
