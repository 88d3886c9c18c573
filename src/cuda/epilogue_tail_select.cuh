// The staged GEMV's tail select (LogitsEpilogue::kTailSelect): the top-k and
// log-sum-exp of each column without a launch after the GEMV.
//
// Why. After the GEMV, a separate selection block costs its launch, the wait
// for the GEMV's grid (griddepcontrol.wait) and a chain of barriers and L2
// round trips on one multiprocessor: ~8 us at M = 1 on a 152k vocab, a
// quarter of the GEMV (docs/tuning-notes.md, "Top-k selection"). Here the
// GEMV's own warps leave what the selection needs, and the last CTA to
// finish selects while the grid drains:
//   1. every warp, as it finishes a 16-row tile, stores the tile's max per
//      column (tail_tmax, three xor-shuffles) and each lane folds its
//      logits into its running (max, Σ exp(l − max)) with that max as the
//      reference (no further shuffles); at the end each warp combines its
//      lanes' into one record per column, tail_rec[m, warp];
//   2. each CTA counts itself done on tail_ticket; the last one
//      (tail_select_run) reads the column's R records: the row's lse from
//      their (max, Σ exp); tau, a lower bound of the row's k-th logit — each
//      of its warps offers the Q largest of its threads' two largest record
//      maxima (Q rounds of a warp max), and tau is the k-th largest of those
//      8·Q, found by counting ranks. They are k different GEMV warps' maxima,
//      each a logit, so at least k logits reach tau, and every top-k entry is
//      >= tau and sits in a warp (record) whose max reaches it;
//   3. those warps' tiles (warp + j·R) whose max reaches tau are listed from
//      tail_tmax, their logits (just stored, in L2) >= tau gathered — about
//      k — and ranked by counting.
// Heavy ties defeat the bound: more than kTailHotMax hot warps or tiles, or
// kTailCands candidates, and the whole row is selected above tau instead
// (exact, slow: block_select_above over V logits).
#pragma once

#include "args.cuh"
#include "block_select.cuh"
#include "epilogue.cuh"

namespace qhead::cuda_detail {

using cuda_plan::kTailCands;
using cuda_plan::kTailHotMax;
using cuda_plan::kTailMaxRecords;

// A lane's running (max, Σ exp(l − max)) per column it holds: columns n·8 +
// 2t + e of the m16n8 C fragments (rows g, g + 8 of each 16-row tile).
template <int RT, int NT>
struct TailLse {
  float m[NT][2], s[NT][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        m[n][e] = -INFINITY;
        s[n][e] = 0.0f;
      }
  }

  // A finished tile: rows row0 + r·16 + {g, g + 8}. Its max per column (three xor-shuffles over g)
  // goes to tail_tmax and is the reference of the lane's running sum.
  __device__ __forceinline__ void add(const LogitsArgs& a, const float (&acc)[RT][NT][4], int64_t row0, int g, int t) {
    constexpr float kLog2e = 1.4426950408889634f;
    const bool whole = row0 + RT * 16 <= a.V;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (n * 8 + e >= a.M) continue;  // no lane holds a column < M here (warp-uniform)
        float tm = -INFINITY;
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (whole || row0 + r * 16 + h * 8 + g < a.V) tm = fmaxf(tm, acc[r][n][e + 2 * h]);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
        const int col = n * 8 + 2 * t + e;
        if (g == 0 && col < a.M) a.tail_tmax[int64_t(col) * a.tile_ld + row0 / (RT * 16)] = tm;
        const float mx = fmaxf(m[n][e], tm);
        if (mx == -INFINITY) continue;
        // The old sum rescaled (ex2(−inf) = 0 for the first tile), then the tile's terms.
        float sum = s[n][e] * ex2_ftz((m[n][e] - mx) * kLog2e);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (whole || row0 + r * 16 + h * 8 + g < a.V) sum += ex2_ftz((acc[r][n][e + 2 * h] - mx) * kLog2e);
        m[n][e] = mx;
        s[n][e] = sum;
      }
  }

  // The warp's record of each column: its lanes' combined over g (three xor-shuffles).
  __device__ __forceinline__ void store(const LogitsArgs& a, int64_t warp, int64_t R, int g, int t) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (n * 8 + e >= a.M) continue;
        float mx = m[n][e], sum = s[n][e];
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
          lse_merge(mx, sum, __shfl_xor_sync(0xffffffffu, mx, o), __shfl_xor_sync(0xffffffffu, sum, o));
        const int col = n * 8 + 2 * t + e;
        if (g == 0 && col < a.M) a.tail_rec[int64_t(col) * R + warp] = make_float2(mx, sum);
      }
  }
};

// The last CTA's shared memory (the GEMV's dynamic shared memory, free by then).
struct TailSmem {
  SelectSmem sel;                  // the whole-row / many-candidate fallback
  uint64_t items[kTailCands];      // the gathered candidates
  float rmax[kTailMaxRecords];     // each record's max
  int hot[kTailHotMax];            // the records whose max reaches tau
  int htile[kTailHotMax];          // their tiles whose max reaches tau
  uint32_t bound[256];             // the offered maxima (order keys; 0 = none)
  float2 wlse[32];                 // each warp's (max, Σ exp)
  uint32_t tau;
  unsigned nhot, ntile, ncand;
};
// The last-CTA flag sits past TailSmem (the kernel has no static shared memory: the launcher
// opts its dynamic shared memory in to the device's whole).
constexpr int kTailFlagOffset = cuda_plan::kTailSmem - 16;
static_assert(sizeof(TailSmem) <= kTailFlagOffset, "plan.h: kTailSmem");

// Counts the calling CTA done; true in the last one, after every other CTA's
// stores (the logits and the records) are visible to it. Every thread calls it,
// once it is done with the shared memory.
__device__ __forceinline__ bool tail_last_cta(const LogitsArgs& a, unsigned char* smem) {
  volatile unsigned* last = reinterpret_cast<volatile unsigned*>(smem + kTailFlagOffset);
  __threadfence();  // this thread's stores, before the count
  cta_sync();
  if (threadIdx.x == 0) {
    const bool l = atomicAdd(a.tail_ticket, 1u) == gridDim.x * gridDim.y - 1;
    if (l) *a.tail_ticket = 0;  // for the next call (the stream orders it)
    *last = l ? 1u : 0u;
  }
  cta_sync();
  if (!*last) return false;
  __threadfence();
  return true;
}

// The selection of every column by the last CTA: T threads (the GEMV's CTA),
// R records per column, the logits in a.out (16-row tiles; warp w's are
// w + j·R). Out of line: one copy per translation unit, not per kernel
// instance.
constexpr int kTailRows = 16;  // rows per warp tile (the staged GEMV's, one 16-row tile)
static __device__ __noinline__ void tail_select_run(const LogitsArgs& a, unsigned char* smem, int R) {
  constexpr int kRows = kTailRows;
  TailSmem& ts = *reinterpret_cast<TailSmem*>(smem);
  const int T = int(blockDim.x), NW = T >> 5;
  const int tid = int(threadIdx.x), lane = tid & 31, w = tid >> 5;
  constexpr int kPer = 16;  // records per thread, at most (R <= kTailMaxRecords, T >= 256)
  // Q maxima offered per warp: NB = NW·Q >= ~1.25 k (k <= kTopkGather <= NB at Q = 32, NW = 8).
  const int Q = a.k <= 51 ? 8 : a.k <= 102 ? 16 : 32;
  const int NB = NW * Q;
  const int64_t tiles = (a.V + kRows - 1) / kRows;
  const int ntiles = int((tiles + R - 1) / R);  // tiles per record, at most
  constexpr int kSlots = 8;                     // hot tiles' maxima read per thread, at most
  const unsigned below = (1u << lane) - 1u;
  for (int m = 0; m < a.M; ++m) {
    if (tid == 0) {
      ts.nhot = 0;
      ts.ntile = 0;
      ts.ncand = 0;
      ts.tau = 0;
    }
    const float2* rec = a.tail_rec + int64_t(m) * R;
    const float* tmax = a.tail_tmax + int64_t(m) * a.tile_ld;
    const float* lrow = a.out + int64_t(m) * a.ldo;
    // 1. The records: maxima to shared memory, the thread's (max, Σ exp) online and its two
    // largest maxima (order keys; 0 = none).
    float mx = -INFINITY, s = 0.0f;
    uint32_t k1 = 0, k2 = 0;
    {
      float2 v[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int j = tid + i * T;
        v[i] = j < R ? __ldcg(rec + j) : make_float2(-INFINITY, 0.0f);
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int j = tid + i * T;
        if (j < R) ts.rmax[j] = v[i].x;
        lse_merge(mx, s, v[i].x, v[i].y);
        const uint32_t key = v[i].x == -INFINITY ? 0u : order_key(v[i].x);
        k2 = key > k1 ? k1 : (key > k2 ? key : k2);
        k1 = key > k1 ? key : k1;
      }
    }
    {
      float wm = mx, wsum = s;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        lse_merge(wm, wsum, __shfl_xor_sync(0xffffffffu, wm, o), __shfl_xor_sync(0xffffffffu, wsum, o));
      if (lane == 0) ts.wlse[w] = make_float2(wm, wsum);
    }
    // 2. The warp's Q largest (ties kept: the lowest lane of a tie gives up its largest per round).
    for (int r = 0; r < Q; ++r) {
      const uint32_t top = __reduce_max_sync(0xffffffffu, k1);
      if (lane == 0) ts.bound[w * Q + r] = top;
      const unsigned tied = __ballot_sync(0xffffffffu, k1 == top);
      if (lane == __ffs(tied) - 1) {
        k1 = k2;
        k2 = 0;
      }
    }
    cta_sync();
    if (tid == 0) {
      float2 p = ts.wlse[0];
      for (int i = 1; i < NW; ++i) lse_merge(p.x, p.y, ts.wlse[i].x, ts.wlse[i].y);
      a.tail_lse[m] = p.x + logf(p.y);
    }
    if (tid < NB) {  // the offered value of rank k − 1 (ties by position): exactly one thread
      const uint32_t bi = ts.bound[tid];
      int r = 0;
#pragma unroll 4
      for (int j = 0; j < NB; ++j) {
        const uint32_t bj = ts.bound[j];
        r += (bj > bi || (bj == bi && j < tid)) ? 1 : 0;
      }
      if (r == a.k - 1) ts.tau = bi;
    }
    cta_sync();
    const uint32_t tau = ts.tau;  // 0 (fewer than k records hold a logit): every record, every logit
    const uint64_t tau_entry = uint64_t(tau) << 32;
    // 3a. The hot records (max >= tau), listed: one atomic per warp step.
    for (int j0 = 0; j0 < R; j0 += T) {
      const int j = j0 + tid;
      const bool hot = j < R && (ts.rmax[j] == -INFINITY ? 0u : order_key(ts.rmax[j])) >= tau;
      const unsigned hb = __ballot_sync(0xffffffffu, hot);
      if (hb == 0) continue;
      unsigned base = 0;
      if (lane == 0) base = atomicAdd(&ts.nhot, unsigned(__popc(hb)));
      base = __shfl_sync(0xffffffffu, base, 0);
      const unsigned pos = base + unsigned(__popc(hb & below));
      if (hot && pos < unsigned(kTailHotMax)) ts.hot[pos] = j;
    }
    cta_sync();
    const unsigned nhot = ts.nhot;
    auto emit = [&](int j, uint64_t e) {
      a.tail_values[int64_t(m) * a.k + j] = entry_value(e);
      a.tail_ids[int64_t(m) * a.k + j] = entry_id_or_last(e);
    };
    auto whole_row = [&]() {  // the whole row above tau
      const int64_t per = (a.V + T - 1) / T;
      auto for_each = [&](auto&& f) {
        for (int64_t j = 0; j < per; ++j) {
          const int64_t r = j * T + tid;
          f(r < a.V ? make_entry(__ldcg(lrow + r), r) : 0ull);
        }
      };
      block_select_above(for_each, tau_entry, a.k, emit, ts.sel);
    };
    if (nhot > unsigned(kTailHotMax)) {
      whole_row();
      continue;
    }
    // 3b. Their tiles whose max reaches tau, listed: slot i = hot record i / ntiles, its tile
    // i % ntiles; up to kSlots maxima in flight per thread.
    const int nslot = int(nhot) * ntiles;
    const float inv = 1.0f / float(ntiles);  // i / ntiles exactly: (i + 0.5) / ntiles is >= 0.5 / ntiles from an integer
    for (int s0 = 0; s0 < nslot; s0 += kSlots * T) {
      int mine[kSlots];
      float tmx[kSlots];
#pragma unroll
      for (int q = 0; q < kSlots; ++q) {
        const int i = s0 + tid + q * T;
        mine[q] = -1;
        if (i < nslot) {
          const int h = int((float(i) + 0.5f) * inv);
          const int64_t tile = ts.hot[h] + int64_t(i - h * ntiles) * R;
          if (tile < tiles) mine[q] = int(tile);
        }
        tmx[q] = mine[q] >= 0 ? __ldcg(tmax + mine[q]) : -INFINITY;
      }
#pragma unroll
      for (int q = 0; q < kSlots; ++q) {
        if (s0 + q * T >= nslot) break;  // block-uniform
        const bool take = mine[q] >= 0 && tmx[q] != -INFINITY && order_key(tmx[q]) >= tau;
        const unsigned tb = __ballot_sync(0xffffffffu, take);
        if (tb == 0) continue;
        unsigned base = 0;
        if (lane == 0) base = atomicAdd(&ts.ntile, unsigned(__popc(tb)));
        base = __shfl_sync(0xffffffffu, base, 0);
        const unsigned pos = base + unsigned(__popc(tb & below));
        if (take && pos < unsigned(kTailHotMax)) ts.htile[pos] = mine[q];
      }
    }
    cta_sync();
    const unsigned nt = ts.ntile;
    if (nt > unsigned(kTailHotMax)) {
      whole_row();
      continue;
    }
    // 3c. Their logits >= tau: row f % 16 of hot tile f / 16, eight loads in flight per thread;
    // one atomic per warp step.
    const int U = int(nt) * kRows;
    for (int f0 = 0; f0 < U; f0 += 8 * T) {
      float v[8];
      int64_t rr[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int f = f0 + i * T + tid;
        rr[i] = -1;
        if (f < U) {
          const int64_t row = int64_t(ts.htile[f / kRows]) * kRows + f % kRows;
          if (row < a.V) rr[i] = row;
        }
        v[i] = rr[i] >= 0 ? __ldcg(lrow + rr[i]) : -INFINITY;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (f0 + i * T >= U) break;  // block-uniform
        const bool take = rr[i] >= 0 && order_key(v[i]) >= tau;
        const unsigned tk = __ballot_sync(0xffffffffu, take);
        if (tk == 0) continue;
        unsigned base = 0;
        if (lane == 0) base = atomicAdd(&ts.ncand, unsigned(__popc(tk)));
        base = __shfl_sync(0xffffffffu, base, 0);
        const unsigned pos = base + unsigned(__popc(tk & below));
        if (take && pos < unsigned(kTailCands)) ts.items[pos] = make_entry(v[i], rr[i]);
      }
    }
    cta_sync();
    const unsigned c = ts.ncand;  // >= k, unless the row has fewer than k logits
    if (c > unsigned(kTailCands)) {
      whole_row();
      continue;
    }
    if (c > unsigned(T)) {  // the gathered ones, above tau
      auto for_each = [&](auto&& f) {
        for (int j = tid; j < int(c); j += T) f(ts.items[j]);
      };
      block_select_above(for_each, tau_entry, a.k, emit, ts.sel);
      continue;
    }
    // 3d. Rank by counting: candidate i's rank = the candidates above it (entries are distinct).
    if (tid < int(c)) {
      const uint64_t ei = ts.items[tid];
      int r = 0;
#pragma unroll 4
      for (int j = 0; j < int(c); ++j) r += ts.items[j] > ei ? 1 : 0;
      if (r < a.k) emit(r, ei);
    }
    for (int j = int(c) + tid; j < a.k; j += T) emit(j, 0ull);  // a row of fewer than k logits
    cta_sync();  // the next column reuses the shared memory
  }
}

}  // namespace qhead::cuda_detail
