// The case registry (tests/cases.h): names are valid gtest identifiers,
// unique in their list, spell the case's fields, and seed distinct inputs.
#include "cases.h"

#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <vector>

namespace {

namespace qt = qhead::test;
using qhead::DType;

bool is_identifier(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char ch : s)
    if (!std::isalnum(ch) && ch != '_') return false;
  return true;
}

template <class Case>
void expect_unique_identifiers(const std::vector<Case>& list, const char* what) {
  SCOPED_TRACE(what);
  std::set<std::string> names;
  std::set<uint64_t> seeds;
  for (const Case& c : list) {
    const std::string n = qt::case_name(c);
    EXPECT_TRUE(is_identifier(n)) << n;
    EXPECT_TRUE(names.insert(n).second) << "duplicate name " << n;
    EXPECT_TRUE(seeds.insert(qt::case_seed(c)).second) << "duplicate seed " << n;
  }
  EXPECT_FALSE(list.empty());
}

TEST(Cases, NamesSpellTheFields) {
  EXPECT_EQ(qt::case_name(qt::LogitsCase{4, 64, true, DType::kBF16, DType::kF16, 50257, 1024, 17}),
            "w4g64_bf16_V50257_H1024_M17");
  EXPECT_EQ(qt::case_name(qt::LogitsCase{8, 128, false, DType::kF16, DType::kF32, 3001, 1024, 64}),
            "w8g128a_f16_sf32_V3001_H1024_M64");
  EXPECT_EQ(qt::case_name(qt::LogitsCase{8, -1, true, DType::kF32, DType::kBF16, 1, 64, 3}), "w8_f32_sbf16_V1_H64_M3");
  qt::LogitsCase rtn{4, 32, false, DType::kF16, DType::kF16, 37, 128, 3};
  rtn.weights = qt::Weights::kRtn;
  EXPECT_EQ(qt::case_name(rtn), "w4g32a_f16_rtn_V37_H128_M3");
  qt::LogitsCase dense{0, -1, true, DType::kF32, DType::kBF16, 257, 64, 3};
  dense.weights = qt::Weights::kDense;
  EXPECT_EQ(qt::case_name(dense), "dense_bf16_f32_V257_H64_M3");
  qt::TopkCase t;
  t.V = 50257;
  t.M = 3;
  t.k = 50;
  EXPECT_EQ(qt::case_name(t), "w4g64_f16_V50257_H1024_M3_k50");
  EXPECT_EQ(qt::case_seed(std::string("w4g64_bf16_V50257_H1024_M17")),
            qt::case_seed(qt::LogitsCase{4, 64, true, DType::kBF16, DType::kF16, 50257, 1024, 17}));
}

TEST(Cases, ListsHaveUniqueIdentifierNames) {
  expect_unique_identifiers(qt::logits_cases(), "logits_cases");
  expect_unique_identifiers(qt::topk_cases(), "topk_cases");
  for (int mode = 0; mode < 4; ++mode) expect_unique_identifiers(qt::every_m_cases(mode), "every_m_cases");
  expect_unique_identifiers(qt::staged_gemv_cases(), "staged_gemv_cases");
  expect_unique_identifiers(qt::odd_stage_cases(), "odd_stage_cases");
  expect_unique_identifiers(qt::wgmma_ws_cases(), "wgmma_ws_cases");
  expect_unique_identifiers(qt::staged_large_x_cases(), "staged_large_x_cases");
}

// The CPU sweep: 48 schemes × dtypes at one small shape, 36 awkward shapes,
// 72 dense cases; the CUDA sweep: 192 schemes × dtypes × M, 24 vocabs, 30
// hidden sizes, 4 fallback shapes, less the cases both sweeps share.
TEST(Cases, SweepSizes) {
  const auto cpu = qt::logits_cases(qt::kCpuSweep), cuda = qt::logits_cases(qt::kCudaSweep);
  EXPECT_EQ(cpu.size(), 48u + 36u + 72u);
  EXPECT_EQ(cuda.size(), 192u + 24u + 30u + 4u);
  size_t both = 0;
  for (const auto& c : qt::logits_cases()) both += c.sweeps == (qt::kCpuSweep | qt::kCudaSweep) ? 1 : 0;
  EXPECT_EQ(qt::logits_cases().size(), cpu.size() + cuda.size() - both);
  for (const auto& c : cpu) EXPECT_TRUE(c.weights != qt::Weights::kRandomCodes || c.bits == 4 || c.bits == 8);
  size_t fused = 0, autos = 0;
  for (const auto& c : qt::topk_cases()) {
    fused += c.on_fused;
    autos += c.on_auto;
  }
  EXPECT_EQ(autos, 1u * 6 + 2u * 6 + 4u * 6 * 2);  // (V, M, k) combinations
  EXPECT_EQ(fused, 1u * 2 + 2u * 2 + 3u * 2 * 2);  // M <= 8, k <= 256
}

}  // namespace
