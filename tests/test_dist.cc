// The vocab-parallel head (qhead/dist.h).
//
// CPU (always): shard ranges at awkward V, shards re-joined equal the table
// (zero points repacked at boundaries that split a packed word), the
// candidate merge against a brute-force top-k over the concatenated logits
// (ties across shards, k larger than a shard, N = 1, 2, 4), the launcher.
// One GPU, no NCCL: the merge kernel against the host merge.
// NCCL on GPUs: DistGpu.* start N ranks of this binary (DistWorker.*) through
// dist::launch; each compares the sharded top-k / logits / embed with the
// single-GPU ops on the whole table. A case needing more GPUs than visible
// skips, naming the count.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dist/kernels.h"
#include "qhead/cuda.h"
#include "qhead/dist.h"
#include "qhead/ops.h"
#include "test_util.h"

namespace qhead {
namespace {

using namespace qhead::test;

// A random permutation of 0..h-1 as an I32 tensor.
Tensor random_perm(int64_t h, uint64_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(h));
  std::iota(p.begin(), p.end(), 0);
  Rng rng(seed);
  std::shuffle(p.begin(), p.end(), rng);
  Tensor t = Tensor::empty(DType::kI32, {h});
  std::copy(p.begin(), p.end(), t.ptr<int32_t>());
  return t;
}

// ---- shard ranges --------------------------------------------------------------------

TEST(DistShard, RangesCoverAnyVocabOnlyTheLastShort) {
  for (int64_t V : {1, 7, 100, 50257, 151936, 262144})
    for (int N : {1, 2, 3, 4, 8}) {
      if (V < N * 2 && N > 1) continue;
      SCOPED_TRACE("V=" + std::to_string(V) + " N=" + std::to_string(N));
      const auto r = dist::shard_ranges(V, N);
      ASSERT_EQ(int(r.size()), N);
      const int64_t S = (V + N - 1) / N;
      for (int i = 0; i < N; ++i) {
        EXPECT_EQ(r[size_t(i)].begin, i * S);
        EXPECT_GT(r[size_t(i)].size(), 0);
        if (i + 1 < N) {
          EXPECT_EQ(r[size_t(i)].size(), S);
          EXPECT_EQ(r[size_t(i)].end, r[size_t(i + 1)].begin);
        }
      }
      EXPECT_EQ(r.back().end, V);
    }
  // The awkward vocab 50257 (GPT-2's): 3 and 4 shards of uneven size.
  const auto r3 = dist::shard_ranges(50257, 3);
  EXPECT_EQ(r3[2].begin, 33506);
  EXPECT_EQ(r3[2].size(), 16751);
  const auto r4 = dist::shard_ranges(50257, 4);
  EXPECT_EQ(r4[3].begin, 37695);
  EXPECT_EQ(r4[3].size(), 12562);
  // Aligned shards (multiples of 64 rows), the last one the rest.
  const auto a = dist::shard_ranges(50257, 4, 64);
  EXPECT_EQ(a[1].begin, 12608);
  EXPECT_EQ(a[3].end, 50257);
}

TEST(DistShard, RangesRejectEmptyShards) {
  const std::string msg = expect_error([] { dist::shard_ranges(5, 4); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("V = 5"), std::string::npos) << msg;
  expect_error([] { dist::shard_ranges(100, 4, 64); }, ErrorCode::kInvalidArgument);
  expect_error([] { dist::shard_ranges(100, 0); }, ErrorCode::kInvalidArgument);
  expect_error([] { dist::shard_ranges(0, 1); }, ErrorCode::kInvalidArgument);
  expect_error([] { dist::shard_ranges(100, 2, 0); }, ErrorCode::kInvalidArgument);
}

// ---- shards of a table -------------------------------------------------------------------

// Every row of every shard equals the table's row (bit for bit), and the
// shard's zero points are the table's at the same global rows.
void check_rejoin(const Table& host, int N, const std::string& what) {
  SCOPED_TRACE(what + " N=" + std::to_string(N));
  const int64_t V = host.vocab(), H = host.hidden();
  std::vector<float> a(static_cast<size_t>(H)), b(static_cast<size_t>(H));
  int64_t next = 0;
  for (int r = 0; r < N; ++r) {
    const dist::ShardedTable s = dist::shard(host, r, N);
    ASSERT_EQ(s.range.begin, next);
    ASSERT_EQ(s.table.vocab(), s.range.size());
    ASSERT_EQ(s.vocab, V);
    ASSERT_EQ(s.hidden, H);
    next = s.range.end;
    for (int64_t v = s.range.begin; v < s.range.end; ++v) {
      host.row_f32(v, a.data());
      s.table.row_f32(v - s.range.begin, b.data());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "global row " << v << " (shard " << r << ")";
    }
    if (!host.is_packed()) continue;
    const PackedTable& hp = host.packed();
    const PackedTable& sp = s.table.packed();
    // Codes and scales are views, not copies.
    EXPECT_EQ(sp.packed.data(), hp.packed.ptr<int32_t>() + s.range.begin * hp.packed.size(1));
    EXPECT_EQ(static_cast<const char*>(sp.scale.data()),
              static_cast<const char*>(hp.scale.data()) + size_t(s.range.begin * hp.scale.size(1)) * dtype_size(hp.scale.dtype()));
    EXPECT_EQ(sp.col_perm.defined(), hp.col_perm.defined());
    if (hp.col_perm.defined()) {
      EXPECT_EQ(sp.col_perm.data(), hp.col_perm.data());
    }
    if (!hp.scheme.symmetric) {
      const int64_t G = hp.scheme.groups(H);
      const int bits = hp.scheme.bits;
      ASSERT_EQ(sp.zero_point.shape(), (Shape{(s.range.size() * bits + 31) / 32, G}));
      for (int64_t v = 0; v < s.range.size(); ++v)
        for (int64_t g = 0; g < G; ++g)
          ASSERT_EQ(zero_point_at(sp.zero_point.ptr<int32_t>(), G, v, g, bits),
                    zero_point_at(hp.zero_point.ptr<int32_t>(), G, s.range.begin + v, g, bits))
              << "zero point of global row " << s.range.begin + v << " group " << g;
      // The shard's padding bits (past its last row) are zero, as pack_zero_points writes them.
      const int64_t used = s.range.size() * bits, words = sp.zero_point.size(0);
      if (used % 32)
        for (int64_t g = 0; g < G; ++g) {
          const uint32_t last = uint32_t(sp.zero_point.ptr<int32_t>()[(words - 1) * G + g]);
          EXPECT_EQ(last >> (used % 32), 0u);
        }
    }
  }
  EXPECT_EQ(next, V);
}

TEST(DistShard, PackedShardsRejoinToTheTable) {
  // 50257 = the GPT-2 vocab: S = 16753 (3 ways) and 12565 (4 ways) are odd,
  // so every boundary splits a 4-bit zero-point word (8 rows per word).
  struct C {
    int bits, group;
    bool sym;
    DType scale;
  };
  for (const C c : {C{4, 32, false, DType::kBF16}, C{4, 64, true, DType::kF16}, C{8, -1, false, DType::kF32},
                    C{2, 32, false, DType::kF16}, C{3, 32, false, DType::kF16}}) {
    const QuantScheme s = make_scheme(c.bits, c.group, c.sym, c.scale);
    const Table host = Table::packed(random_packed(50257, 64, s, 11 + uint64_t(c.bits)));
    for (int N : {1, 2, 3, 4}) check_rejoin(host, N, s.name());
  }
}

TEST(DistShard, ColumnOrderIsSharedByEveryShard) {
  PackedTable p = random_packed(1001, 128, make_scheme(4, 32, false), 5);
  p.col_perm = random_perm(128, 6);
  const Table host = Table::packed(std::move(p));
  ASSERT_TRUE(host.has_col_perm());
  for (int N : {2, 3}) check_rejoin(host, N, "w4g32a act-order");
  EXPECT_TRUE(dist::shard(host, 1, 3).table.has_col_perm());
}

TEST(DistShard, DenseShardsRejoinToTheTable) {
  const Table host = Table::dense(random_tensor(DType::kF16, 1001, 48, 9));
  for (int N : {1, 3, 4}) check_rejoin(host, N, "dense f16");
}

TEST(DistShard, BadRowsAndRanksAreErrors) {
  const Table host = Table::packed(random_packed(100, 32, make_scheme(4, 32, true), 1));
  expect_error([&] { dist::shard_rows(host, 10, 10); }, ErrorCode::kInvalidArgument);
  expect_error([&] { dist::shard_rows(host, 90, 101); }, ErrorCode::kInvalidArgument);
  expect_error([&] { dist::shard_rows(host, -1, 5); }, ErrorCode::kInvalidArgument);
  expect_error([&] { dist::shard(host, 4, 4); }, ErrorCode::kInvalidArgument);
  expect_error([&] { dist::shard(host, -1, 4); }, ErrorCode::kInvalidArgument);
}

// ---- the candidate format and the merge ------------------------------------------------

TEST(DistMerge, CandidateWordsOrderAsTopkDoes) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, 1.5f, -3.25f, inf, -inf, 1e-40f, -1e30f})
    for (int64_t id : {int64_t(0), int64_t(1), int64_t(262143), int64_t(2147483646)}) {
      const uint64_t w = dist::candidate_word(v, id);
      EXPECT_NE(w, 0u);
      EXPECT_EQ(f32_to_bits(dist::candidate_value(w)), f32_to_bits(v));
      EXPECT_EQ(dist::candidate_id(w), id);
    }
  EXPECT_GT(dist::candidate_word(2.0f, 9), dist::candidate_word(1.0f, 0));      // larger value first
  EXPECT_GT(dist::candidate_word(1.0f, 3), dist::candidate_word(1.0f, 4));      // tie: lower id first
  EXPECT_GT(dist::candidate_word(-inf, 7), uint64_t(0));                        // −inf is still a candidate
  EXPECT_GT(dist::candidate_word(-1.0f, 0), dist::candidate_word(-2.0f, 0));
  EXPECT_EQ(dist::candidate_id(0), -1);
  EXPECT_EQ(dist::candidate_value(0), -inf);
}

TEST(DistMerge, CombineLogSumExpIsStable) {
  const float inf = std::numeric_limits<float>::infinity();
  const float big[] = {1000.0f, 1000.0f};
  EXPECT_NEAR(dist::combine_logsumexp(big, 2), 1000.0f + std::log(2.0f), 1e-3);
  const float small[] = {-1000.0f, -1001.0f, -inf};
  EXPECT_NEAR(dist::combine_logsumexp(small, 3), -1000.0 + std::log1p(std::exp(-1.0)), 1e-3);
  const float none[] = {-inf, -inf};
  EXPECT_EQ(dist::combine_logsumexp(none, 2), -inf);
  const float one_inf[] = {3.0f, inf};
  EXPECT_EQ(dist::combine_logsumexp(one_inf, 2), inf);
  const float nan[] = {3.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(std::isnan(dist::combine_logsumexp(nan, 2)));
  EXPECT_EQ(dist::combine_logsumexp(big, 0), -inf);
}

// Brute-force top-k of one row: value descending, ties to the lower id.
void brute_topk(const float* l, int64_t n, int64_t k, float* v, int32_t* id, int64_t id0 = 0) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  for (int64_t j = 0; j < k; ++j) {
    v[j] = l[order[size_t(j)]];
    id[j] = int32_t(id0 + order[size_t(j)]);
  }
}
double lse_f64(const float* l, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(l[i]));
  if (!std::isfinite(mx)) return mx;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(l[i]) - mx);
  return mx + std::log(s);
}

// Logits [M, V] with many ties (a few distinct values), some −inf.
std::vector<float> tie_logits(int64_t M, int64_t V, uint64_t seed, int distinct) {
  Rng rng(seed);
  std::uniform_int_distribution<int> d(0, distinct - 1);
  std::vector<float> l(static_cast<size_t>(M * V));
  for (auto& x : l) {
    const int c = d(rng);
    x = c == 0 ? -std::numeric_limits<float>::infinity() : 0.25f * float(c) - 2.0f;
  }
  return l;
}

// Each shard's local top-k and lse, packed, laid end to end as the all-gather delivers.
std::vector<uint64_t> gathered_messages(const std::vector<float>& l, int64_t M, int64_t V,
                                        const std::vector<dist::ShardRange>& shards, int64_t k) {
  const int N = int(shards.size());
  std::vector<uint64_t> g(static_cast<size_t>(N * M * (k + 1)));
  for (int r = 0; r < N; ++r) {
    const int64_t b = shards[size_t(r)].begin, n = shards[size_t(r)].size(), kl = std::min(k, n);
    std::vector<float> v(static_cast<size_t>(M * kl)), lse(static_cast<size_t>(M));
    std::vector<int32_t> id(static_cast<size_t>(M * kl));
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t m = 0; m < M; ++m) {
      std::copy(l.begin() + m * V + b, l.begin() + m * V + b + n, row.begin());
      brute_topk(row.data(), n, kl, v.data() + m * kl, id.data() + m * kl);  // local ids
      lse[size_t(m)] = float(lse_f64(row.data(), n));
    }
    dist::pack_candidates(v.data(), id.data(), lse.data(), M, kl, k, b, g.data() + size_t(r) * size_t(M * (k + 1)));
  }
  return g;
}

TEST(DistMerge, MergeEqualsBruteForceTopkOverTheConcatenatedLogits) {
  for (int N : {1, 2, 4})
    for (int64_t V : {7, 100, 1000, 50257})
      for (int64_t k : {1, 5, 50, 300})
        for (int distinct : {3, 40, 100000}) {
          if (k > V || (V < 2 * N && N > 1)) continue;
          const int64_t M = 3;
          SCOPED_TRACE("N=" + std::to_string(N) + " V=" + std::to_string(V) + " k=" + std::to_string(k) +
                       " distinct=" + std::to_string(distinct));
          const std::vector<float> l = tie_logits(M, V, uint64_t(V * 7 + k + N + distinct), distinct);
          const auto shards = dist::shard_ranges(V, N);
          const auto g = gathered_messages(l, M, V, shards, k);
          std::vector<float> v(static_cast<size_t>(M * k)), lse(static_cast<size_t>(M));
          std::vector<int32_t> id(static_cast<size_t>(M * k));
          dist::merge_candidates(g.data(), N, M, k, v.data(), id.data(), lse.data());
          std::vector<float> ev(static_cast<size_t>(k));
          std::vector<int32_t> eid(static_cast<size_t>(k));
          for (int64_t m = 0; m < M; ++m) {
            brute_topk(l.data() + m * V, V, k, ev.data(), eid.data());
            for (int64_t j = 0; j < k; ++j) {
              ASSERT_EQ(id[size_t(m * k + j)], eid[size_t(j)]) << "row " << m << " position " << j;
              ASSERT_EQ(f32_to_bits(v[size_t(m * k + j)]), f32_to_bits(ev[size_t(j)]));
            }
            const double e = lse_f64(l.data() + m * V, V);
            if (std::isfinite(e)) {
              EXPECT_NEAR(lse[size_t(m)], e, 4e-7 * std::max(1.0, std::fabs(e)));
            } else {
              EXPECT_EQ(double(lse[size_t(m)]), e);
            }
          }
        }
}

TEST(DistMerge, KLargerThanEveryShard) {
  // 4 shards of 25 rows, k = 60 and k = V: every shard sends all its rows plus padding.
  const int64_t V = 100, M = 2;
  const auto shards = dist::shard_ranges(V, 4);
  for (int64_t k : {60, 100}) {
    const std::vector<float> l = tie_logits(M, V, 77 + uint64_t(k), 6);
    const auto g = gathered_messages(l, M, V, shards, k);
    std::vector<float> v(static_cast<size_t>(M * k)), lse(static_cast<size_t>(M));
    std::vector<int32_t> id(static_cast<size_t>(M * k));
    dist::merge_candidates(g.data(), 4, M, k, v.data(), id.data(), lse.data());
    std::vector<float> ev(static_cast<size_t>(k));
    std::vector<int32_t> eid(static_cast<size_t>(k));
    for (int64_t m = 0; m < M; ++m) {
      brute_topk(l.data() + m * V, V, k, ev.data(), eid.data());
      for (int64_t j = 0; j < k; ++j) ASSERT_EQ(id[size_t(m * k + j)], eid[size_t(j)]);
    }
  }
  // Fewer candidates than k in all (k > V) is an error, not garbage.
  const std::vector<float> l = tie_logits(1, V, 3, 6);
  const auto g = gathered_messages(l, 1, V, shards, 101);
  std::vector<float> v(101), lse(1);
  std::vector<int32_t> id(101);
  expect_error([&] { dist::merge_candidates(g.data(), 4, 1, 101, v.data(), id.data(), lse.data()); },
               ErrorCode::kInvalidArgument);
}

// ---- the merge kernel (one GPU, no NCCL) ------------------------------------------------

TEST(DistMergeCuda, KernelEqualsHostMerge) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  for (int N : {1, 2, 4, 8})
    for (int64_t k : {1, 7, 50, 256}) {
      const int64_t V = 4 * k * N + 13, M = 5;
      SCOPED_TRACE("N=" + std::to_string(N) + " k=" + std::to_string(k));
      const std::vector<float> l = tie_logits(M, V, uint64_t(N * 1000 + k), 9);
      const auto shards = dist::shard_ranges(V, N);
      const auto g = gathered_messages(l, M, V, shards, k);
      std::vector<float> hv(static_cast<size_t>(M * k)), hl(static_cast<size_t>(M));
      std::vector<int32_t> hi(static_cast<size_t>(M * k));
      dist::merge_candidates(g.data(), N, M, k, hv.data(), hi.data(), hl.data());

      Tensor gh = Tensor::empty(DType::kU8, {int64_t(g.size() * 8)});
      std::memcpy(gh.data(), g.data(), g.size() * 8);
      const Tensor gd = cuda::to_device(gh.view());
      Tensor dv = cuda::empty(DType::kF32, {M, k}), di = cuda::empty(DType::kI32, {M, k}), dl = cuda::empty(DType::kF32, {M});
      dist::kernels::merge_candidates(static_cast<const uint64_t*>(gd.data()), N, M, k, dv.ptr<float>(),
                                      di.ptr<int32_t>(), dl.ptr<float>(), cuda::stream());
      cuda::synchronize();
      const Tensor v = cuda::to_host(dv.view()), i = cuda::to_host(di.view()), ls = cuda::to_host(dl.view());
      for (int64_t j = 0; j < M * k; ++j) {
        ASSERT_EQ(i.ptr<int32_t>()[j], hi[size_t(j)]) << j;
        ASSERT_EQ(f32_to_bits(v.ptr<float>()[j]), f32_to_bits(hv[size_t(j)])) << j;
      }
      for (int64_t m = 0; m < M; ++m) EXPECT_FLOAT_EQ(ls.ptr<float>()[m], hl[size_t(m)]);

      // The pack kernel writes the host's words.
      const int64_t kl = std::min<int64_t>(k, shards.back().size());
      std::vector<float> lv(static_cast<size_t>(M * kl), 0.5f), lls(static_cast<size_t>(M), 2.0f);
      std::vector<int32_t> lid(static_cast<size_t>(M * kl));
      for (int64_t j = 0; j < M * kl; ++j) lid[size_t(j)] = int32_t(j % kl);
      std::vector<uint64_t> hp(static_cast<size_t>(M * (k + 1)));
      dist::pack_candidates(lv.data(), lid.data(), lls.data(), M, kl, k, shards.back().begin, hp.data());
      auto up = [](const void* p, size_t bytes) {
        Tensor h = Tensor::empty(DType::kU8, {int64_t(bytes)});
        std::memcpy(h.data(), p, bytes);
        return cuda::to_device(h.view());
      };
      const Tensor a = up(lv.data(), lv.size() * 4), b = up(lid.data(), lid.size() * 4), c = up(lls.data(), lls.size() * 4);
      Tensor out = cuda::empty(DType::kU8, {int64_t(hp.size() * 8)});
      dist::kernels::pack_candidates(static_cast<const float*>(a.data()), static_cast<const int32_t*>(b.data()),
                                     static_cast<const float*>(c.data()), M, kl, k, shards.back().begin,
                                     static_cast<uint64_t*>(out.data()), cuda::stream());
      const Tensor oh = cuda::to_host(out.view());
      EXPECT_EQ(0, std::memcmp(oh.data(), hp.data(), hp.size() * 8));
    }
}

// ---- the launcher (no GPU) -------------------------------------------------------------

TEST(DistLaunch, EveryRankGetsItsEnvironment) {
  const auto st = dist::launch(
      3, {"/bin/sh", "-c",
          "test \"$QHEAD_TP_WORLD\" = 3 && test \"$NCCL_NVLS_ENABLE\" = 0 && test \"$QHEAD_TP_DEVICE\" = \"$QHEAD_TP_RANK\" "
          "&& test -n \"$QHEAD_TP_ID_FILE\" && test \"$QHEAD_TP_RANK\" -ge 0 && test \"$QHEAD_TP_RANK\" -lt 3"});
  EXPECT_EQ(st, (std::vector<int>{0, 0, 0}));
  dist::LaunchOptions o;
  o.devices = {0, 0};
  EXPECT_EQ(dist::launch(2, {"sh", "-c", "test \"$QHEAD_TP_DEVICE\" = 0"}, o), (std::vector<int>{0, 0}));
}

TEST(DistLaunch, OneFailingRankStopsTheOthers) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = dist::launch(3, {"/bin/sh", "-c", "if [ \"$QHEAD_TP_RANK\" = 1 ]; then exit 3; fi; exec sleep 30"});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st, (std::vector<int>{128 + SIGTERM, 3, 128 + SIGTERM}));
  EXPECT_LT(s, 10.0);
  dist::LaunchOptions o;
  o.timeout_s = 1;
  EXPECT_EQ(dist::launch(1, {"/bin/sh", "-c", "exec sleep 30"}, o), (std::vector<int>{128 + SIGTERM}));
}

TEST(DistLaunch, BadArgumentsAreErrors) {
  expect_error([] { dist::launch(0, {"true"}); }, ErrorCode::kInvalidArgument);
  expect_error([] { dist::launch(1, {}); }, ErrorCode::kInvalidArgument);
  expect_error([] { dist::launch(1, {"qhead-no-such-program-on-path"}); }, ErrorCode::kInvalidArgument);
  dist::LaunchOptions o;
  o.devices = {0};
  expect_error([&] { dist::launch(2, {"true"}, o); }, ErrorCode::kInvalidArgument);
  // A program that cannot be executed: the rank exits 127.
  EXPECT_EQ(dist::launch(1, {"/dev/null"}), (std::vector<int>{127}));
}

// ---- without NCCL --------------------------------------------------------------------

TEST(DistComm, WithoutNcclEveryCommunicatorCallIsUnsupported) {
  if (dist::nccl_available()) GTEST_SKIP() << "built with NCCL (the stub is not linked)";
  const std::string msg = expect_error([] { dist::Comm::from_env(); }, ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("NCCL"), std::string::npos) << msg;
  expect_error([] { dist::Comm::new_unique_id(); }, ErrorCode::kUnsupported);
}

// ---- NCCL on GPUs: N ranks of this binary --------------------------------------------------

// Tolerance of two f32 logits of the same row computed by the GPU kernels
// (derived as in test_cuda.cc): γ_{H+G+1}(2^-23)·Σ|x_j w_j| each, bounded
// with max|w|.
double logit_bound(const std::vector<float>& x, int64_t m, int64_t H, int64_t G, double wmax) {
  double s = 0;
  for (int64_t j = 0; j < H; ++j) s += std::fabs(double(x[size_t(m * H + j)]));
  return 2.0 * gamma_n(H + G + 1, 2.0 * kU32) * s * wmax + 1e-30;
}

struct WorkerCase {
  int64_t V, H;
  QuantScheme scheme;
  bool act_order;
  DType act;
  int64_t M, k;
};

void run_worker_case(const dist::Comm& comm, const WorkerCase& c, uint64_t seed) {
  const int64_t V = c.V, H = c.H, M = c.M, k = c.k, G = c.scheme.groups(H);
  SCOPED_TRACE(c.scheme.name() + (c.act_order ? " act-order" : "") + " V=" + std::to_string(V) + " H=" +
               std::to_string(H) + " M=" + std::to_string(M) + " k=" + std::to_string(k) + " rank " +
               std::to_string(comm.rank()) + " of " + std::to_string(comm.world()));
  PackedTable p = random_packed(V, H, c.scheme, seed);
  if (c.act_order) p.col_perm = random_perm(H, seed + 1);
  const Table host = Table::packed(std::move(p));
  const Tensor dense = host.to_dense_f32();
  double wmax = 0;
  for (int64_t i = 0; i < V * H; ++i) wmax = std::max(wmax, std::fabs(double(dense.ptr<float>()[i])));
  const dist::ShardedTable sh = dist::to_device(dist::shard(host, comm.rank(), comm.world()));
  const Table full = cuda::to_device(host);
  const Tensor xh = random_tensor(c.act, M, H, seed + 2);
  const std::vector<float> xf = to_f32(xh.view());
  const Tensor x = cuda::to_device(xh.view());

  // top-k: the sharded step against the whole table on one GPU (k + 1 there,
  // to see the value just past the cut).
  const int64_t k1 = std::min(k + 1, V);
  const TopK one = topk(full, x.view(), k1);
  const TopK tp = dist::topk(comm, sh, x.view(), k);
  cuda::synchronize();
  const Tensor ov = cuda::to_host(one.values.view()), oi = cuda::to_host(one.ids.view()), ol = cuda::to_host(one.logsumexp.view());
  const Tensor tv = cuda::to_host(tp.values.view()), ti = cuda::to_host(tp.ids.view()), tl = cuda::to_host(tp.logsumexp.view());
  for (int64_t m = 0; m < M; ++m) {
    const double tol = logit_bound(xf, m, H, G, wmax);
    auto one_v = [&](int64_t j) { return double(ov.ptr<float>()[m * k1 + j]); };
    for (int64_t j = 0; j < k; ++j) {
      const double a = tv.ptr<float>()[m * k + j], b = one_v(j);
      EXPECT_NEAR(a, b, tol) << "row " << m << " position " << j;
      if (ti.ptr<int32_t>()[m * k + j] != oi.ptr<int32_t>()[m * k1 + j]) {
        // Only a near-tie (within the bound) may order two ids differently.
        const bool near = (j > 0 && std::fabs(one_v(j) - one_v(j - 1)) <= 2 * tol) ||
                          (j + 1 < k1 && std::fabs(one_v(j) - one_v(j + 1)) <= 2 * tol);
        EXPECT_TRUE(near) << "row " << m << " position " << j << ": id " << ti.ptr<int32_t>()[m * k + j]
                          << " sharded vs " << oi.ptr<int32_t>()[m * k1 + j] << " on one GPU";
      }
    }
    const double la = tl.ptr<float>()[m], lb = ol.ptr<float>()[m];
    EXPECT_NEAR(la, lb, 1e-5 * std::max(1.0, std::fabs(lb)) + tol) << "logsumexp of row " << m;
  }

  // logits: the rank's slice, and every slice gathered, against one GPU.
  const Tensor lone = cuda::to_host(logits(full, x.view()).view());
  const Tensor slice = dist::logits(sh, x.view());
  const Tensor lall = cuda::to_host(dist::all_gather_logits(comm, sh, slice.view()).view());
  const Tensor ls = cuda::to_host(slice.view());
  ASSERT_EQ(count_nan(lall.view()), 0);
  for (int64_t m = 0; m < M; ++m) {
    const double tol = logit_bound(xf, m, H, G, wmax);
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(lall.ptr<float>()[m * V + v], lone.ptr<float>()[m * V + v], tol) << "row " << m << " logit " << v;
    for (int64_t j = 0; j < sh.range.size(); ++j)
      ASSERT_EQ(f32_to_bits(ls.ptr<float>()[m * sh.range.size() + j]), f32_to_bits(lall.ptr<float>()[m * V + sh.range.begin + j]));
  }

  // embed: ids over the whole vocab incl. every shard boundary, I32 and I64,
  // F32 and BF16 out: bit-identical to one GPU (exactly one rank contributes).
  std::vector<int64_t> idv = {0, V - 1};
  for (const auto& r : dist::shard_ranges(V, comm.world())) {
    idv.push_back(r.begin);
    idv.push_back(r.end - 1);
  }
  Rng rng(seed + 3);
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  for (int i = 0; i < 40; ++i) idv.push_back(d(rng));
  const int64_t n = int64_t(idv.size());
  for (DType it : {DType::kI32, DType::kI64})
    for (DType ot : {DType::kF32, DType::kBF16}) {
      Tensor ih = Tensor::empty(it, {n});
      for (int64_t i = 0; i < n; ++i) {
        if (it == DType::kI32) ih.ptr<int32_t>()[i] = int32_t(idv[size_t(i)]);
        else ih.ptr<int64_t>()[i] = idv[size_t(i)];
      }
      const Tensor ids = cuda::to_device(ih.view());
      const Tensor a = cuda::to_host(dist::embed(comm, sh, ids.view(), ot).view());
      const Tensor b = cuda::to_host(embed(full, ids.view(), ot).view());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes())) << "embed ids " << dtype_name(it) << " out " << dtype_name(ot);
    }
  // An id out of range throws on every rank (same ids everywhere), before any
  // collective, so the communicator stays usable.
  Tensor bad = Tensor::empty(DType::kI32, {2});
  bad.ptr<int32_t>()[0] = 0;
  bad.ptr<int32_t>()[1] = int32_t(V);
  const Tensor badd = cuda::to_device(bad.view());
  expect_error([&] { dist::embed(comm, sh, badd.view(), DType::kF32); }, ErrorCode::kInvalidArgument);
  comm.barrier();
}

TEST(DistWorker, ShardedMatchesSingleGpu) {
  if (!std::getenv("QHEAD_DIST_TEST_WORKER")) GTEST_SKIP() << "a rank of DistGpu.* (started by it, not on its own)";
  const dist::Comm comm = dist::Comm::from_env();
  const std::vector<WorkerCase> cases = {
      {50257, 256, make_scheme(4, 128, false, DType::kBF16), false, DType::kBF16, 3, 50},
      {50257, 256, make_scheme(4, 64, true), false, DType::kF16, 1, 1},
      {101, 64, make_scheme(4, 32, false), false, DType::kF16, 2, 60},  // k > every shard at N = 2, 4
      {4099, 128, make_scheme(4, 32, false), true, DType::kF16, 5, 20},  // act-order: col_perm on every shard
      {3001, 128, make_scheme(8, 128, true, DType::kBF16), false, DType::kBF16, 70, 10},  // M > 64: the fallback path
      {1000, 96, make_scheme(8, -1, false, DType::kF32), false, DType::kF16, 4, 1000},   // k = V
  };
  uint64_t seed = 100;
  for (const auto& c : cases) run_worker_case(comm, c, seed += 10);
}

std::string self_exe() {
  char b[4096];
  const ssize_t n = ::readlink("/proc/self/exe", b, sizeof b - 1);
  return n > 0 ? std::string(b, size_t(n)) : std::string();
}

void run_ranks(int N) {
  if (!dist::nccl_available()) GTEST_SKIP() << "built without NCCL (QHEAD_NCCL=OFF)";
  const int have = dist::device_count();
  if (have < N)
    GTEST_SKIP() << "needs " << N << " GPU(s) (one rank per GPU: NCCL refuses two ranks of one communicator on one GPU), "
                 << have << " visible";
  ::setenv("QHEAD_DIST_TEST_WORKER", "1", 1);
  dist::LaunchOptions o;
  o.timeout_s = 300;
  const auto st = dist::launch(N, {self_exe(), "--gtest_filter=DistWorker.ShardedMatchesSingleGpu"}, o);
  ::unsetenv("QHEAD_DIST_TEST_WORKER");
  EXPECT_EQ(st, std::vector<int>(size_t(N), 0)) << "every rank's own test output is above";
}

TEST(DistGpu, ShardedEqualsSingleGpuN1) { run_ranks(1); }
TEST(DistGpu, ShardedEqualsSingleGpuN2) { run_ranks(2); }
TEST(DistGpu, ShardedEqualsSingleGpuN4) { run_ranks(4); }

}  // namespace
}  // namespace qhead
