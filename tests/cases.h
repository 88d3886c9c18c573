// The named cases of the logits and top-k tests, one registry for the CPU
// tests (test_ops.cc), the CUDA tests (test_cuda.cc) and the benchmark's
// default shapes. Header-only and free of gtest, so a benchmark tool can
// include it too.
//
// A case is its fields: the quantization scheme (bits, group, symmetric),
// the activation and scale dtypes, and the shape V × H × M. Its name
// (case_name) spells those fields, is a valid gtest identifier and is unique
// in its list, so `--gtest_filter='*w4g64_bf16_V50257_H1024_M17*'` reruns one
// case; the random inputs of a case are seeded from its name (case_seed), so
// a case rerun alone sees the same data as in the whole sweep.
//
// Each case says which sweeps run it (`sweeps`): the CPU sweep checks every
// logit against the float64 oracle, so it keeps to shapes whose oracle is
// cheap on a 2-core CI machine; the CUDA sweep samples rows of large vocabs
// and takes the large M that selects each kernel family.
//
// Where a list spreads cases over combinations instead of taking the full
// cross product (a scheme, a dtype or a vocab rotating with the case's index),
// the rotation is written out in the list and lands in the case's fields:
// nothing about a case is derived from its seed.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "qhead/dtype.h"

namespace qhead::test {

// Which sweep runs a case (a bit mask).
enum Sweep : unsigned {
  kCpuSweep = 1u,   // test_ops.cc: every backend of the CPU, every logit checked
  kCudaSweep = 2u,  // test_cuda.cc: kAuto, kFused and kFallbackBlas on the GPU
};

// How a case's table is made.
enum class Weights : uint8_t {
  kRandomCodes,  // random codes, scales and zero points (test_util.h random_packed): every code pattern
  kRtn,          // a random dense f32 table quantized by quantize_rtn (its row_f32 is checked too)
  kDense,        // a dense random table of dtype `scale` (bits, group and symmetric unused)
};

struct LogitsCase {
  int bits = 4;                            // 3, 4 or 8
  int group = 64;                          // group length along H; -1: one group per row
  bool symmetric = true;                   // false: zero points
  DType act = DType::kBF16;                // activation dtype
  DType scale = DType::kF16;               // scale dtype (kDense: the table's dtype)
  int64_t V = 0, H = 0, M = 0;             // table [V, H], activations [M, H]
  Weights weights = Weights::kRandomCodes;
  int64_t cpu_topk_k = 5;                  // CPU sweep: the one k of the reference topk on shapes too large
                                           // for every k (test_ops.cc, kTopkFullMacs)
  unsigned sweeps = kCpuSweep;             // Sweep bits
};

struct TopkCase {
  int bits = 4;
  int group = 64;
  bool symmetric = true;
  DType act = DType::kF16;
  DType scale = DType::kF16;
  int64_t V = 0, H = 1024, M = 0;
  int64_t k = 1;
  // The CUDA backends of the top-k sweep that run the case: kAuto (logits,
  // then the selection, or the list epilogue) and kFused where the fused
  // epilogue applies.
  bool on_auto = true, on_fused = false;
};

// ---- names -----------------------------------------------------------------------------------

inline const char* dtype_tag(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    default: return "x";
  }
}

// "w4g64", "w8a" (per row, zero points), as QuantScheme::name() spells it.
inline std::string scheme_tag(int bits, int group, bool symmetric) {
  std::string s = "w" + std::to_string(bits);
  if (group > 0) s += "g" + std::to_string(group);
  if (!symmetric) s += "a";
  return s;
}

// scheme _ act [_s<scale> when not F16] [_rtn] _V _H _M, e.g. w4g64_bf16_V50257_H1024_M17,
// w8g128a_f16_sf32_V3001_H1024_M64, dense_bf16_f32_V257_H64_M3 (a dense BF16 table, F32 x).
inline std::string case_name(const LogitsCase& c) {
  std::string s;
  if (c.weights == Weights::kDense) {
    s = std::string("dense_") + dtype_tag(c.scale) + "_" + dtype_tag(c.act);
  } else {
    s = scheme_tag(c.bits, c.group, c.symmetric) + "_" + dtype_tag(c.act);
    if (c.scale != DType::kF16) s += std::string("_s") + dtype_tag(c.scale);
    if (c.weights == Weights::kRtn) s += "_rtn";
  }
  return s + "_V" + std::to_string(c.V) + "_H" + std::to_string(c.H) + "_M" + std::to_string(c.M);
}

inline std::string case_name(const TopkCase& c) {
  std::string s = scheme_tag(c.bits, c.group, c.symmetric) + "_" + dtype_tag(c.act);
  if (c.scale != DType::kF16) s += std::string("_s") + dtype_tag(c.scale);
  return s + "_V" + std::to_string(c.V) + "_H" + std::to_string(c.H) + "_M" + std::to_string(c.M) + "_k" +
         std::to_string(c.k);
}

// A stable seed from a case's name (64-bit FNV-1a): the same on every
// platform and run, different for every name.
inline uint64_t case_seed(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}
inline uint64_t case_seed(const LogitsCase& c) { return case_seed(case_name(c)); }
inline uint64_t case_seed(const TopkCase& c) { return case_seed(case_name(c)); }

// ---- the CPU sweep ---------------------------------------------------------------------------

namespace cases_detail {

constexpr DType kFloatDtypes[3] = {DType::kF32, DType::kF16, DType::kBF16};

// A list of cases that merges a case added twice: the two are one case, run
// by the sweeps of both.
struct CaseList {
  std::vector<LogitsCase> cases;
  std::unordered_map<std::string, size_t> index;  // name -> position in cases
};
inline void add(CaseList& list, const LogitsCase& c) {
  const auto [it, added] = list.index.emplace(case_name(c), list.cases.size());
  if (added) list.cases.push_back(c);
  else list.cases[it->second].sweeps |= c.sweeps;
}

// (a) Every scheme and activation dtype at one small shape: bits {4, 8} ×
// group {32, 64, 128, per row} × symmetric or not × activation {F32, F16,
// BF16}, tables quantized by quantize_rtn (row_f32 checked against the
// tests' dequantizer), the scale dtype the activation's.
inline void cpu_small(CaseList& out) {
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false})
        for (DType act : kFloatDtypes) {
          LogitsCase c{bits, group, sym, act, act, 37, 128, 3};
          c.weights = Weights::kRtn;
          add(out, c);
        }
}

// The schemes the shape sweep rotates through; a scheme whose group does not
// divide H is passed over for that shape (Ops.QuantizerRefusesGroupsNotDividingH
// checks the refusal).
struct RotScheme {
  int bits, group;
  bool sym;
};
constexpr RotScheme kShapeSchemes[9] = {{4, 32, true},  {8, 64, false}, {4, 128, false},
                                        {8, -1, true},  {4, 64, true},  {8, 128, true},
                                        {4, -1, false}, {8, 32, false}, {4, 256, true}};

// (b) Awkward shapes: V ∈ {1, 3, 50257, 49152 + 64} × H ∈ {64, 576, 1024} ×
// M ∈ {1, 3, 17}; the scheme rotates through kShapeSchemes, the scale dtype
// through F32/F16/BF16, the activation dtype through F16/BF16/F32 every two
// cases, and the k of the large shapes' reference topk through 5, 50, 1.
inline void cpu_shapes(CaseList& out) {
  int i = 0, rot = 0;
  for (int64_t v : {1, 3, 50257, 49152 + 64})
    for (int64_t h : {64, 576, 1024})
      for (int64_t m : {1, 3, 17}) {
        RotScheme s;
        do s = kShapeSchemes[rot++ % 9];
        while (s.group > 0 && h % s.group != 0);
        LogitsCase c{s.bits, s.group, s.sym, kFloatDtypes[(i / 2 + 1) % 3], kFloatDtypes[i % 3], v, h, m};
        c.cpu_topk_k = std::array<int64_t, 3>{5, 50, 1}[static_cast<size_t>(i % 3)];
        ++i;
        add(out, c);
      }
}

// (c) Dense tables: table dtype {F32, F16, BF16} × V ∈ {1, 3, 257, 1000} ×
// H ∈ {64, 576} × M ∈ {1, 3, 17}, the activation dtype rotating.
inline void cpu_dense(CaseList& out) {
  int i = 0;
  for (DType wt : kFloatDtypes)
    for (int64_t v : {1, 3, 257, 1000})
      for (int64_t h : {64, 576})
        for (int64_t m : {1, 3, 17}) {
          LogitsCase c{0, -1, true, kFloatDtypes[i++ % 3], wt, v, h, m};
          c.weights = Weights::kDense;
          add(out, c);
        }
}

// ---- the CUDA sweep ---------------------------------------------------------------------------

inline LogitsCase cuda_case(int bits, int group, bool sym, DType act, DType scale, int64_t v, int64_t h,
                            int64_t m) {
  LogitsCase c{bits, group, sym, act, scale, v, h, m};
  c.sweeps = kCudaSweep;
  return c;
}

// Every scheme and activation dtype at every M that selects a kernel family:
// bits {4, 8} × group {32, 64, 128, per row} × symmetric or not × activation
// {F16, BF16} × M ∈ {1, 3, 16, 17, 64, 256} at V = 50257, H = 1024; the
// scale dtype is F32 for every third case, else the activation's.
inline void cuda_schemes(CaseList& out) {
  int i = 1;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false})
        for (DType act : {DType::kF16, DType::kBF16})
          for (int64_t m : {1, 3, 16, 17, 64, 256}) {
            const DType scale = (i++ % 3 == 0) ? DType::kF32 : act;
            add(out, cuda_case(bits, group, sym, act, scale, 50257, 1024, m));
          }
}

// Awkward vocabs: V ∈ {1, 3, 151936, 49152 + 64} × M ∈ {1, 3, 16, 17, 64,
// 256} at H = 1024, BF16 scales; bits, group, symmetry and activation dtype
// rotate (4/8-bit alternating, g64 twice then g128 twice, asymmetric every
// third case, BF16/F16 with the bits).
inline void cuda_vocabs(CaseList& out) {
  int i = 0;
  for (int64_t v : {1, 3, 151936, 49152 + 64})
    for (int64_t m : {1, 3, 16, 17, 64, 256}) {
      const bool even = i % 2 == 0;  // 8-bit with F16 activations, else 4-bit with BF16
      add(out, cuda_case(even ? 8 : 4, i % 4 < 2 ? 64 : 128, i % 3 != 0, even ? DType::kF16 : DType::kBF16,
                         DType::kBF16, v, 1024, m));
      ++i;
    }
}

// Hidden sizes of real models: H = 576 (SmolLM2), 640 (Gemma-3-270M), 2560
// (Gemma-3-4B), 4096 (Llama-3-8B) × every group dividing H × M ∈ {1, 17} at
// V = 4099, BF16 activations, F16 scales; bits alternate 8/4 and every third
// case is asymmetric (a counter from 4).
inline void cuda_hidden(CaseList& out) {
  int i = 4;
  for (int64_t h : {576, 640, 2560, 4096})
    for (int group : {32, 64, 128, -1}) {
      if (group > 0 && h % group) continue;
      for (int64_t m : {1, 17}) {
        add(out, cuda_case(i % 2 ? 4 : 8, group, i % 3 != 0, DType::kBF16, DType::kF16, 4099, h, m));
        ++i;
      }
    }
}

// Shapes the fused kernels do not take or that cuBLAS serves on kAuto
// (3-bit: no fused kernel, every backend takes cuBLAS), and the fallback at
// small and large M.
inline void cuda_fallback(CaseList& out) {
  add(out, cuda_case(4, 64, true, DType::kF16, DType::kF16, 3001, 1024, 5));
  add(out, cuda_case(4, 128, false, DType::kBF16, DType::kBF16, 3001, 1024, 200));
  add(out, cuda_case(8, -1, false, DType::kBF16, DType::kBF16, 3001, 512, 33));
  add(out, cuda_case(3, 32, true, DType::kBF16, DType::kBF16, 777, 256, 4));
}

}  // namespace cases_detail

// Every logits case of the registry, each with the sweeps that run it (built
// once per process).
inline const std::vector<LogitsCase>& logits_cases() {
  static const std::vector<LogitsCase> all = [] {
    cases_detail::CaseList l;
    cases_detail::cpu_small(l);
    cases_detail::cpu_shapes(l);
    cases_detail::cpu_dense(l);
    cases_detail::cuda_schemes(l);
    cases_detail::cuda_vocabs(l);
    cases_detail::cuda_hidden(l);
    cases_detail::cuda_fallback(l);
    return std::move(l.cases);
  }();
  return all;
}

// The cases one sweep runs, in registry order.
inline std::vector<LogitsCase> logits_cases(Sweep sweep) {
  std::vector<LogitsCase> out;
  for (const LogitsCase& c : logits_cases())
    if (c.sweeps & sweep) out.push_back(c);
  return out;
}

// ---- the CUDA kernel-family lists -------------------------------------------------------------
//
// The cases of the tests that force one kernel family (test_cuda.cc,
// LogitsGemmAndGemvAtEveryM, LogitsWgmmaWarpSpecialized,
// LogitsStagedLargeActivations). Symmetry, dtypes and vocab rotate with a
// counter n that each list starts at `phase`:
//   symmetric when n is even; activation F16 when n % 3 == 0, else BF16;
//   scale F32 when n % 5 == 0, F16 when n % 5 ∈ {1, 2}, else BF16.

namespace cases_detail {
struct Rot {
  int n;
  bool sym() const { return n % 2 == 0; }
  DType act() const { return n % 3 == 0 ? DType::kF16 : DType::kBF16; }
  DType scale() const { return n % 5 == 0 ? DType::kF32 : (n % 5 < 3 ? DType::kF16 : DType::kBF16); }
};
}  // namespace cases_detail

// Every family at every M: bits {4, 8} × group {32, 128, per row} × M ∈ {1,
// 3, 8, 16, 17, 33, 64, 65, 256}, H = 1024, V = 257 every fourth case, else
// 3001. `mode` (0..3, one per forced family) shifts the rotation so the four
// runs cover different combinations.
inline std::vector<LogitsCase> every_m_cases(int mode) {
  std::vector<LogitsCase> out;
  int n = 1700 + 54 * mode;
  for (int bits : {4, 8})
    for (int group : {32, 128, -1})
      for (int64_t m : {1, 3, 8, 16, 17, 33, 64, 65, 256}) {
        const cases_detail::Rot r{n++};
        out.push_back(cases_detail::cuda_case(bits, group, r.sym(), r.act(), r.scale(), r.n % 4 == 0 ? 257 : 3001,
                                              1024, m));
      }
  return out;
}

// The staged GEMV's configurations (M <= 32): 128-byte stages (H = 2560) and
// 64-byte ones (4-bit H = 640), one, two or four activation tiles, partial
// tiles (M = 2, 12, 20); at H = 2560, M = 20 its activations are built once
// per call (104 KB); at M = 32 (166 KB) they leave room for the four-tile
// plan's 2 stages per warp unless a tile's scale block is large (then the
// mma.sync GEMM runs).
inline std::vector<LogitsCase> staged_gemv_cases() {
  std::vector<LogitsCase> out;
  int n = 1916;
  for (int64_t h : {640, 2560})
    for (int bits : {4, 8})
      for (int group : {32, 64, 128, -1})
        for (int64_t m : {2, 9, 12, 20, 32}) {
          const cases_detail::Rot r{n++};
          out.push_back(cases_detail::cuda_case(bits, group, r.sym(), r.act(), r.scale(), 1001, h, m));
        }
  return out;
}

// H whose stage count is odd or whose group spans several stages (8-bit
// g128: 2 stages; per row), at M = 40 on kAuto.
inline std::vector<LogitsCase> odd_stage_cases() {
  std::vector<LogitsCase> out;
  int n = 1964;
  for (int64_t h : {640, 2560, 4096})
    for (int group : {64, 128, -1})
      for (int bits : {4, 8}) {
        if (group > 0 && h % group) continue;
        out.push_back(cases_detail::cuda_case(bits, group, n++ % 2 == 0, DType::kF16, DType::kBF16, 1000, h, 40));
      }
  return out;
}

// The warp-specialized wgmma GEMM: bits {4, 8} × group {32, 64, 128, per row}
// × M ∈ {65, 256} (V = 20011 at M = 256: a persistent grid whose CTAs take
// several units), then 8-bit rows of 576 bytes (not whole 128-byte stages).
inline std::vector<LogitsCase> wgmma_ws_cases() {
  std::vector<LogitsCase> out;
  int n = 2100;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (int64_t m : {65, 256}) {
        const cases_detail::Rot r{n++};
        out.push_back(cases_detail::cuda_case(bits, group, r.sym(), r.act(), r.scale(), m == 256 ? 20011 : 3001,
                                              1024, m));
      }
  out.push_back(cases_detail::cuda_case(8, 64, true, DType::kF16, DType::kF16, 3001, 576, 256));
  out.push_back(cases_detail::cuda_case(8, -1, false, DType::kBF16, DType::kBF16, 3001, 576, 70));
  return out;
}

// The staged GEMV with large activations: H ∈ {2560, 4096} × bits {4, 8} ×
// group {32, 128, per row} × M ∈ {7, 16}; V = 50257 for H = 2560 at M = 7,
// else 1001.
inline std::vector<LogitsCase> staged_large_x_cases() {
  std::vector<LogitsCase> out;
  int n = 1900;
  for (int64_t h : {2560, 4096})
    for (int bits : {4, 8})
      for (int group : {32, 128, -1})
        for (int64_t m : {7, 16}) {
          const cases_detail::Rot r{n++};
          out.push_back(cases_detail::cuda_case(bits, group, r.sym(), r.act(), r.scale(),
                                                h == 2560 && m == 7 ? 50257 : 1001, h, m));
        }
  return out;
}

// ---- top-k ------------------------------------------------------------------------------------

// The CUDA top-k sweep: V ∈ {1, 3, 50257, 151936} × M ∈ {1, 3, 16, 17, 64,
// 256} × k ∈ {1, 50, 200 (more than a CTA's tile step of 128 rows), 1000
// (beyond the fused epilogue's k)} (k ∈ {1, 3} for V = 3, k = 1 for V = 1),
// H = 1024, on kAuto and, where the fused epilogue applies (M <= 8,
// k <= 256), on kFused. The scheme cycles through the 32 of bits {4, 8} ×
// group {32, 64, 128, per row} × symmetric or not × activation {F16, BF16};
// the scale dtype is F32 for every third (backend, case) run, else the
// activation's — a case whose two runs differ in it is two cases, one per
// backend. (The CPU runs top-k on every CPU logits case, test_ops.cc.)
inline std::vector<TopkCase> topk_cases() {
  std::vector<TopkCase> out;
  std::unordered_map<std::string, size_t> index;  // name -> position in out
  int si = 0, run = 0;
  auto add = [&](TopkCase c, bool fused) {
    c.scale = run++ % 3 == 1 ? DType::kF32 : c.act;
    c.on_auto = !fused;
    c.on_fused = fused;
    const auto [it, added] = index.emplace(case_name(c), out.size());
    if (added) out.push_back(c);
    else out[it->second].on_fused |= fused;
  };
  for (int64_t v : {1, 3, 50257, 151936})
    for (int64_t m : {1, 3, 16, 17, 64, 256}) {
      const std::vector<int64_t> ks = v == 1   ? std::vector<int64_t>{1}
                                      : v == 3 ? std::vector<int64_t>{1, 3}
                                               : std::vector<int64_t>{1, 50, 200, 1000};
      for (int64_t k : ks) {
        const int sc = si++;
        TopkCase c;
        c.bits = (sc & 1) ? 8 : 4;
        c.group = std::array<int, 4>{32, 64, 128, -1}[static_cast<size_t>((sc >> 1) & 3)];
        c.symmetric = ((sc >> 3) & 1) == 0;
        c.act = ((sc >> 4) & 1) ? DType::kBF16 : DType::kF16;
        c.V = v;
        c.M = m;
        c.k = k;
        add(c, false);
        if (m <= 8 && k <= 256) add(c, true);
      }
    }
  return out;
}

// ---- the benchmark's default shapes -----------------------------------------------------------

// The default (shape, scheme) pairs of `qhead bench`: five real-model output
// heads — Qwen3-0.6B (w4g64, w8g128), Pythia-70M, Llama-3-8B, Gemma-3-270M.
struct BenchShape {
  int64_t V, H;
  const char* scheme;  // a `qhead quantize` scheme name
};
inline std::vector<BenchShape> bench_shapes() {
  return {{151936, 1024, "w4g64"}, {151936, 1024, "w8g128"}, {50304, 512, "w4g64"},
          {128256, 4096, "w4g128"}, {262144, 640, "w4g64"}};
}
// The activation rows per call `qhead bench` times by default.
inline std::vector<int64_t> bench_m() { return {1, 8, 32, 256}; }

}  // namespace qhead::test
