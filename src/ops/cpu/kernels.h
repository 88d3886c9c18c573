// The CPU fast-path kernels (internal): one source, kernels_impl.h, compiled
// once per ISA (kernels_avx2.cc, kernels_avx512.cc, each with its own compile
// flags and its own namespace), chosen at run time by cpu_ops.cc from CPUID.
//
// The kernels take raw pointers and plain structs only. Nothing here is a
// template or an inline function shared with other translation units: an
// inline function instantiated in an AVX-512 TU may be the copy the linker
// keeps for every TU, and then a CPU without AVX-512 would run it. So the ISA
// TUs use no std containers or algorithms on shared types, and no inline
// helpers from qhead's public headers; allocation, sorting and merging stay
// in cpu_ops.cc, which is compiled without ISA flags.
#pragma once

#include <cstdint>
#include <limits>

namespace qhead::cpu {

// A packed table as the kernels see it (see qhead/table.h for the layout).
struct PackedArgs {
  const uint8_t* packed = nullptr;  // weight_packed bytes, row r at packed + r * row_bytes
  int64_t row_bytes = 0;            // 4 * ceil(H * bits / 32)
  const void* scale = nullptr;      // weight_scale [V, G], dtype `scale_kind`
  int scale_kind = 0;               // 0: F32, 1: F16, 2: BF16
  const int32_t* zero_point = nullptr;  // I32 [ceil(V * bits / 32), G] packed along V; null: symmetric
  int bits = 4;                     // 4 or 8 (the kernels take nothing else)
  int64_t vocab = 0;                // V
  int64_t hidden = 0;               // H, a multiple of 32
  int64_t groups = 1;               // G (1 per row)
  int64_t group_len = 0;            // H / G, a multiple of 32
  // Software prefetch distance in bytes: while a tile of rows is read, the
  // kernel prefetches the bytes this far past it, spread evenly over the
  // tile's chunks (one prefetch per chunk), and the next block's scales at
  // the start of a block. 0: none. The distance is in bytes, not rows, so
  // that it covers the same memory latency for every row length.
  int64_t prefetch_bytes = 0;
};

// The activations of the int8 mode (cpu_ops.cc prepare_x_int8), per
// activation row m and chunk k of CE elements (CE = 8·lanes for 4-bit tables,
// 4·lanes for 8-bit; the last chunk of a row may be partial and is
// zero-padded). x is quantized per block of 32 consecutive elements:
// s_b = max|x| / 127 (f32), q = rint(x / s_b) in [-127, 127].
// The dot instructions sum 4 byte products into each dword lane; lane l of
// a chunk covers elements 8l .. 8l+7 (4-bit: the low nibbles of bytes
// 4l .. 4l+3 are elements 8l, 8l+2, 8l+4, 8l+6 and the high nibbles the odd
// ones) or 4l .. 4l+3 (8-bit): the lane layout of q and nt.
// Chunk-major ([nch][M][...]), so the MB rows of an m-block are adjacent
// for every chunk: the kernel addresses them with constant offsets.
struct Int8X {
  const int8_t* q = nullptr;    // [nch][M][CE] bytes; 4-bit: the chunk's even elements, then its odd ones
  // [nch][M][lanes] the lane's block scale s_b (0 in padding). A 16-byte span
  // of the table (4-bit: 32 elements; 8-bit: 16) lies in one x block and,
  // H being a multiple of 32, wholly inside or past H: its four lanes alike.
  const float* sx = nullptr;
  const int32_t* t = nullptr;   // [nch][M][lanes] Σ q over the lane's elements
  const int32_t* nt = nullptr;  // [nch][M][lanes] -2^(b-1) · t (the symmetric zero-point term)
  int64_t m = 0;                // M
  const int32_t* gidx = nullptr;  // [nch][lanes] the lane's weight group minus g0[k] (clamped to the row)
  const int64_t* g0 = nullptr;    // [nch] the first weight group of chunk k
  int64_t nch = 0;              // chunks per row: ceil(H / CE)
  int64_t tail_bytes = 0;       // packed bytes of the last chunk of a row (a full chunk: 4·lanes)
  // The quad form (blocks of 8 and 4 activation rows, and 3 left over, on
  // both ISA paths; prepared when M >= 3): lane 4s + i of a vector belongs to the chunk's 16-byte packed
  // span s (4-bit: one x block of 32 elements; 8-bit: 16 elements, half of
  // one) and activation row 4·Q + i of quad Q (rows past M are zeros).
  //   qq    [nch][nquads][NV][4·lanes] bytes: vector v pairs with packed
  //         dword j = v mod 4 of each span — 4-bit (NV = 8): v = 4h + j holds
  //         the span's elements 8j + 2b + h (h = 0 the low nibbles, 1 the
  //         high ones) in byte b = 0..3 of the lane; 8-bit (NV = 4): 4j + b;
  //   sxq   [nch][nquads][lanes] the span's block scale s_b (0 past H or M);
  //   tq    [nch][nquads][lanes] Σ q over the span; ntq: -2^(b-1) · tq;
  //   gidxq [nch][lanes] the span's weight group minus g0[k] (clamped to the row).
  // Null when the call has no such block.
  const int8_t* qq = nullptr;
  const float* sxq = nullptr;
  const int32_t* tq = nullptr;
  const int32_t* ntq = nullptr;
  const int32_t* gidxq = nullptr;
  int64_t nquads = 0;             // ceil(M / 4)
  // The row-quad form (blocks of 1 and 2 activation rows): q, sx, t and nt
  // in the lane layout above, the dot sums then added per span, so that lane
  // 4s + i of a vector belongs to span s and table row i of four (sx's lanes
  // 4s .. 4s+3 are alike, so it serves as is);
  //   gidxr [nch][lanes] rowquad_scales' index for lane 4s + i, from the
  //         span's weight group minus g0[k] (grp): AVX-512 grp + 4·i (the
  //         four rows' first four scales of the chunk, a row per 128-bit
  //         lane); AVX2 grp·4 + i (the quad's transposed scales).
  const int32_t* gidxr = nullptr;
};

// The rows a logits kernel call handles at most (the scratch it needs is
// sized by this): cpu_ops.cc splits the vocab into blocks of this many rows.
constexpr int64_t kBlockRows = 64;

namespace {
// The activation rows are processed in blocks of m_block(rows left, largest)
// = 8 (where largest allows), 4, 2 or 1; cpu_ops.cc lays the activations out
// in the same blocks (internal linkage: each TU has its own copy, so no
// ISA-compiled copy is shared).
constexpr int64_t m_block(int64_t left, int64_t largest = 8) {
  return left >= 8 && largest >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
}
// Whether a block of mb activation rows of a `bits` table reads its
// activations in nibble-plane order (KernelTable::plane4): 4-bit tables
// whose groups are whole plane chunks, single activation rows, and larger
// blocks of symmetric tables.
constexpr bool plane4_layout(int bits, int64_t mb, int64_t group_len, bool sym, int plane4) {
  return bits == 4 && plane4 > 0 && group_len % plane4 == 0 && (mb == 1 || sym);
}
}  // namespace

// One activation row's online log-sum-exp in the CPU top-k: Σ_i exp(l_i − mx)
// over the logits seen = sum + Σ acc[0, lanes). acc holds per-lane f32 sums of
// at most kLseFlush blocks (64 terms of at most 1 per lane at 16 lanes, a
// relative error below 64·2^-24 ≈ 4e-6 before the double fold).
constexpr int kLseFlush = 16;
struct LseState {
  alignas(64) float acc[16] = {};
  double sum = 0.0;
  float mx = -std::numeric_limits<float>::infinity();
  int pending = 0;  // blocks in acc
  double total() const {
    double t = sum;
    for (float a : acc) t += static_cast<double>(a);
    return t;
  }
};

// One ISA's kernels.
struct KernelTable {
  const char* name;  // "avx2", "avx512"
  // Elements per chunk of a 4-bit (two vectors) and an 8-bit (one vector)
  // row: the kernel consumes a chunk of every tile row at a time.
  int chunk4, chunk8;
  // The same for the int8 mode (8·lanes and 4·lanes: one vector of packed bytes).
  int chunk4_int8, chunk8_int8;
  // The 4-bit blocks plane4_layout() names: the kernel takes plane4 =
  // 8·lanes elements (one vector of packed bytes) at a time and reads each
  // activation row's chunk as [8][lanes], element plane4·c + 8·l + j at
  // [j][l] (the order of the nibbles in the packed dwords); the block's
  // panel is [H / plane4][mb][plane4]. 0: this ISA has no such kernel.
  int plane4;
  // The largest activation block of the exact kernels (m_block's `largest`):
  // 8 on AVX-512; 4 on AVX2, whose 16 registers hold a 2-row × 4-column tile
  // but only a 1-row × 8-column one.
  int mb_max;

  // out[m * ldo + (r - r0)] = Σ_j x[m, j] · w[r, j] for r in [r0, r1), m in
  // [0, M). r1 - r0 <= kBlockRows. xp: the activations as f32 in panels
  // (see cpu_ops.cc prepare_x): for each block of mb = m_block(M - m0, mb_max) rows
  // starting at m0, at xp + m0·H, [H / CE chunks][mb][CE] — so the kernel
  // reads one chunk of every activation row of the block from one base
  // pointer; for 4-bit tables each chunk's CE elements are in nibble order
  // (even elements, then odd), or, for a block that plane4_layout() names, in
  // plane order (plane4 above). scratch: at least
  // 2 * kBlockRows * G floats. Each (r, m) result depends only on the ISA, not
  // on the block split or the thread that computes it.
  void (*logits_block)(const PackedArgs& a, const float* xp, int64_t m, int64_t r0, int64_t r1,
                       float* out, int64_t ldo, float* scratch);
  // The int8-activation mode (qhead::CpuActivations::kInt8): as
  // logits_block, with x given as Int8X and the dot products in integers:
  // per lane Σ (c - zc)·q exactly in int32, then scaled by s_b · s_g in
  // f32. logits_block_int8 uses VNNI vpdpbusd: null when this ISA build has
  // none, usable only when CPUID reports `int8_vnni` (1: AVX512_VNNI, 2:
  // AVX_VNNI); logits_block_int8_madd uses vpmaddubsw + vpmaddwd and runs
  // wherever the ISA does. Both give the same results bit for bit.
  // scratch: at least 4 * (kBlockRows * G + lanes) floats.
  void (*logits_block_int8)(const PackedArgs& a, const Int8X& x, int64_t m, int64_t r0, int64_t r1, float* out,
                            int64_t ldo, float* scratch);
  int int8_vnni;
  void (*logits_block_int8_madd)(const PackedArgs& a, const Int8X& x, int64_t m, int64_t r0, int64_t r1,
                                 float* out, int64_t ldo, float* scratch);
  // The sample op's Gumbel noise (src/ops/sample.h) of columns 4·g0 ..
  // 4·(g0 + groups) - 1 of `row`: Philox4x32-10 with key (k0, k1) and counter
  // (g, row, c2, c3), then -log(-log u) with a vectorized log (< 2 ulp from
  // logf), into out[4 · groups] in column order.
  void (*gumbel_noise)(uint32_t k0, uint32_t k1, uint32_t row, uint32_t c2, uint32_t c3, uint32_t g0, int64_t groups,
                       float* out);
  // Row r dequantized into out[H] (natural order), exactly as the reference:
  // w = float(q - z) * s.
  void (*dequant_row)(const PackedArgs& a, int64_t r, float* out);
  // The top-k epilogue of a block of n <= kBlockRows logits of one activation
  // row: *ge = bitmask of l[i] >= thr (the only ones that can enter a full
  // heap), and the row's online log-sum-exp *st takes the block (st->mx rises
  // to the block's max when it is larger — the only case that reduces
  // across lanes — and the exps — a vectorized exp, |rel. error| < 4e-7 per term — are
  // added to st->acc per lane, folded into st->sum every kLseFlush blocks).
  void (*topk_block)(const float* l, int64_t n, float thr, LseState* st, uint64_t* ge);
  // Σ_j x[j] · row[j] in f32, row of dtype kind 0 F32 / 1 F16 / 2 BF16.
  float (*dot_dense)(const float* x, const void* row, int kind, int64_t h);
  // The benchmark's compute ceiling: `iters` rounds of 12 independent vector
  // FMAs (12 · iters · lanes lane-FMAs); returns a value to keep it alive.
  float (*fma_burn)(int64_t iters);
  // The benchmark's read ceiling: a sum over `bytes` (a multiple of 4·lanes·4)
  // at p read with full-width vector loads, software-prefetching `prefetch`
  // bytes ahead as the kernels do (0: none); returns a value to keep it alive.
  uint64_t (*read_sum)(const void* p, int64_t bytes, int64_t prefetch);
  int lanes;  // f32 lanes per vector
};

// Each ISA's table, defined in its TU (a constant: taking its address runs
// no code compiled for that ISA). Present when the build defines
// QHEAD_HAVE_X86_KERNELS (x86-64 with a compiler that takes the flags).
namespace avx2 { extern const KernelTable kTable; }
namespace avx512 { extern const KernelTable kTable; }

}  // namespace qhead::cpu
