// The list top-k's kernels: the threshold of each row from a sample's
// logits, and the merge of the list epilogue's candidate lists.
#include "cuda/epilogue_topk_lists.cuh"
#include "ops/cuda/select.cuh"

namespace qhead::cuda_ops {

using namespace cuda_detail;

namespace {

// The list top-k's threshold of each row from its sample's logits [M, n]
// (n <= kSlice, one block per row): thr[m] = a lower bound of the row's k-th
// largest logit — the k-th largest of the block's sub-maxima (kThrSub per
// thread, each the largest of kSelPer / kThrSub logits), to 24 bits, lowered
// by list_margin; −inf when that is not a number. k distinct logits reach
// it, so it is <= the sample's k-th logit, and the caller has n >= k logits,
// so with k <= kSelThreads at least k sub-maxima exist. With 1024 sub-maxima
// for 8192 logits it lets through ~1.02× (k = 50) to ~1.1× (k = 256) the
// candidates of the exact k-th, for three radix passes over four keys per
// thread instead of a selection (which also summed exps the threshold does
// not need).
constexpr int kThrSub = 4;
__global__ void __launch_bounds__(kSelThreads) list_threshold_kernel(const float* __restrict__ logits, int n, int k,
                                                                     float* __restrict__ thr) {
  __shared__ SelectSmem sm;
  constexpr int kPerSub = kSelPer / kThrSub;
  const float* row = logits + int64_t(blockIdx.x) * n;
  const int tid = threadIdx.x;
  float v[kSelPer];
#pragma unroll
  for (int j = 0; j < kSelPer; ++j) {  // all loads in flight at once
    const int i = j * kSelThreads + tid;
    v[j] = i < n ? row[i] : -INFINITY;
  }
  uint64_t key[kThrSub];  // 0 = no logit
#pragma unroll
  for (int r = 0; r < kThrSub; ++r) {
    float mx = v[r * kPerSub];
#pragma unroll
    for (int j = 1; j < kPerSub; ++j) mx = fmaxf(mx, v[r * kPerSub + j]);
    key[r] = r * kPerSub * kSelThreads + tid < n ? uint64_t(order_key(mx)) << 32 : 0ull;
  }
  auto keys = [&](auto&& f) {
#pragma unroll
    for (int r = 0; r < kThrSub; ++r) f(key[r]);
  };
  uint64_t tau = 0;
  unsigned need = unsigned(k);
  float t = -INFINITY;
  if (radix_pass(keys, 56, tau, need, sm)) {  // then the next two passes find their digit too
    radix_pass(keys, 48, tau, need, sm);
    radix_pass(keys, 40, tau, need, sm);
    t = list_margin(key_value(uint32_t(tau >> 32)));
    if (!(t > -INFINITY && t < INFINITY)) t = -INFINITY;
  }
  if (tid == 0) thr[blockIdx.x] = t;
}

struct ListsArgs {
  TopkLists in;      // the main kernel's lists and sums
  const float* thr;  // [M] the thresholds they were made with, or nullptr (none)
  int k;
  float* values;  // [M, k]
  int* ids;       // [M, k]
  float* lse;     // [M]
};
constexpr int64_t kListChunk = kSlice - kTopkGather;  // new entries per selection round

// Entry i (< the row's total) of block m's row of lists; base[s] = list s's
// first position in the row (shared memory, nseg + 1 entries, non-decreasing).
__device__ __forceinline__ uint64_t list_entry(const TopkLists& in, const unsigned* base, int64_t i) {
  int lo = 0, hi = in.nseg;  // base[lo] <= i < base[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (base[mid] <= i) lo = mid;
    else hi = mid;
  }
  return in.list[(int64_t(blockIdx.x) * in.nseg + lo) * in.seg_cap + (i - base[lo])];
}

// One block per row m: the exact top-k of the row's candidate lists — in
// rounds of up to kListChunk entries plus the best k so far, so that any
// total fits (all logits tied: every logit is a candidate) — and the lse:
// the candidates' exps plus the kernel's sums below the threshold.
// Each thread loads entries spread over the whole row (list_entry), so that
// its loads are independent of each other and all in flight at once.
__global__ void __launch_bounds__(kSelThreads) topk_lists_kernel(const ListsArgs a) {
  __shared__ SelectSmem sm;
  __shared__ uint64_t keep[kTopkGather];
  __shared__ double dred[kSelThreads / 32];
  extern __shared__ __align__(16) unsigned char sel_items[];
  uint64_t* items = reinterpret_cast<uint64_t*>(sel_items);     // [kSlice], item i = j·T + thread
  unsigned* base = reinterpret_cast<unsigned*>(items + kSlice);  // [nseg + 1] each list's first position in the row
  const TopkLists& in = a.in;
  const int m = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = kSelThreads / 32;
  // Every global read that does not depend on another one is issued here, at the start: the
  // threshold, and with the list lengths the sums below the threshold (step 3).
  const float thr = a.thr ? a.thr[m] : -INFINITY;
  // 1. The lists' positions: thread tid takes the contiguous segments [s0, s1); a block-wide exclusive scan.
  const uint32_t* cnt = in.count + int64_t(m) * in.nseg;
  const float* ssum = in.sum + int64_t(m) * in.nseg;
  const int per = (in.nseg + kSelThreads - 1) / kSelThreads;
  const int s0 = min(in.nseg, tid * per), s1 = min(in.nseg, s0 + per);
  unsigned c = 0;
  double below = 0.0;  // Σ (sum − count) over the thread's segments: each listed logit added exactly 1
  for (int s = s0; s < s1; ++s) {
    const uint32_t n = cnt[s];
    c += n;
    below += fmax(double(ssum[s]) - double(n), 0.0);
  }
  unsigned total;
  unsigned off = block_exclusive_scan(c, total, sm);
  for (int s = s0; s < s1; ++s) {
    base[s] = off;
    off += cnt[s];
  }
  if (tid == kSelThreads - 1) base[in.nseg] = total;
  __syncthreads();
  // 2. Selection rounds: items = the best k so far, then this round's entries, then empty.
  const int k = a.k;
  int nkeep = 0, per_round = 1;
  bool one_round = true;
  for (int64_t lo = 0;; lo += kListChunk) {
    const int64_t hi = min(int64_t(total), lo + kListChunk);
    const int fill = nkeep + int(hi - lo);
    per_round = max(1, (fill + kSelThreads - 1) / kSelThreads);  // items per thread this round
#pragma unroll 4
    for (int i = tid; i < per_round * kSelThreads; i += kSelThreads)
      items[i] = i < nkeep ? keep[i] : i < fill ? list_entry(in, base, lo + (i - nkeep)) : 0ull;
    __syncthreads();
    const int pr = per_round;
    auto for_each = [&](auto&& f) {
#pragma unroll 4
      for (int j = 0; j < pr; ++j) f(items[j * kSelThreads + tid]);
    };
    uint64_t my_max = 0;
    for_each([&](uint64_t e) { my_max = e > my_max ? e : my_max; });
    block_select(for_each, my_max, k, [&](int j, uint64_t e) { keep[j] = e; }, sm);  // ends with a barrier
    nkeep = k;
    if (hi >= int64_t(total)) break;
    one_round = false;
  }
  for (int j = tid; j < k; j += kSelThreads) {
    a.values[int64_t(m) * k + j] = entry_value(keep[j]);
    a.ids[int64_t(m) * k + j] = entry_id_or_last(keep[j]);
  }
  // 3. lse = mx + log(Σ_candidates exp(l − mx) + exp(thr − mx) · Σ_lists (sum − count)),
  // mx = max(best, thr): the candidates' exps in f32 per thread (what the selection path's
  // partial sums do), the block's sum in double.
  const float mx = fmaxf(entry_value(keep[0]), thr);  // an empty keep[0] reads −inf
  float tc = 0.0f;
  auto add = [&](uint64_t e) {
    if (e) tc += expf(entry_value(e) - mx);
  };
  if (one_round) {  // every candidate is still in items
    for (int j = 0; j < per_round; ++j) add(items[j * kSelThreads + tid]);
  } else {
#pragma unroll 4
    for (int64_t i = tid; i < int64_t(total); i += kSelThreads) add(list_entry(in, base, i));
  }
  double t = tc;
  if (thr != -INFINITY) t += below * exp(double(thr) - double(mx));
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  if (lane == 0) dred[w] = t;
  __syncthreads();
  if (tid == 0) {
    double u = 0.0;
    for (int i = 0; i < nw; ++i) u += dred[i];
    a.lse[m] = float(double(mx) + log(u));
  }
}

}  // namespace

void list_thresholds(const float* sample, int64_t M, int n, int k, float* thr) {
  list_threshold_kernel<<<unsigned(M), kSelThreads, 0, current_stream()>>>(sample, n, k, thr);  // n <= kSlice
  QHEAD_CUDA_CHECK_LAUNCH("list_threshold_kernel");
}

void merge_lists(const TopkLists& lists, const float* thr, int64_t M, int64_t k, float* values, int* ids, float* lse) {
  ListsArgs la;
  la.in = lists;
  la.thr = thr;
  la.k = int(k);
  la.values = values;
  la.ids = ids;
  la.lse = lse;
  // Dynamic shared memory: the items and the list positions (sized once for the most segments).
  const int smem = int(kSlice * 8) + (8 * sm_count() + 1) * 4;
  allow_dynamic_smem<topk_lists_kernel>(smem);
  topk_lists_kernel<<<unsigned(M), kSelThreads, smem, current_stream()>>>(la);
  QHEAD_CUDA_CHECK_LAUNCH("topk_lists_kernel");
}

}  // namespace qhead::cuda_ops
