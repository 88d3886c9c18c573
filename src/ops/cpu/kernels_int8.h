// The int8-activation kernels (internal to kernels_impl.h), included once per
// integer dot product: inside namespace int8_vnni (VNNI vpdpbusd) and
// int8_madd (vpmaddubsw + vpmaddwd), each of which defines QHEAD_INT8_TARGET
// (the function attribute its instructions need, or nothing) and
// dot4x2(acc, u0, s0, u1, s1) / dot8(acc, u, s): acc + the sums of four
// products of unsigned codes u (< 16 / < 256) and signed activations s per
// int32 lane (dot4x2: of both pairs (u0, s0) and (u1, s1), eight products),
// exactly. No include guard: it is meant to be included twice.

// Row bytes of chunk k at q (the partial last chunk by a masked load, nothing
// past the row), after prefetching pf + off (PF; pf may be null otherwise):
// the row's share of the stream ahead.
template <bool PARTIAL, bool PF>
QHEAD_INT8_TARGET __attribute__((always_inline)) inline VI load_chunk(const uint8_t* q, const uint8_t* pf, int64_t off,
                                                                      const Int8X& x) {
  if constexpr (PF) _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
  if constexpr (PARTIAL)
    return vload_bytes_partial(q, x.tail_bytes);
  else
    return vload_i(q);
}

// A row's weight scale per lane (gi: each lane's group minus the chunk's
// first, into the row's scales s) and, with zero points, (-zc) in the low 16
// bits of each lane, 0 above: vpmaddwd's operand.
template <bool SYM>
QHEAD_INT8_TARGET __attribute__((always_inline)) inline void lane_scales(const float* s, const float* z, VI gi, VF& sg,
                                                                         VI& zl) {
  sg = vperm_f(vload(s), gi);
  if constexpr (!SYM) zl = vand_i(vsub_i(vzero_i(), vcvt_i(vperm_f(vload(z), gi))), vset_i(0xFFFF));
}

// ---- the row-quad form (blocks of 1 and 2 activation rows) ----
//
// Four table rows at a time: each row's dot instructions run on Int8X's lane
// layout (lane l: packed dword l against x's matching bytes), then
// sum_spans4 adds each 16-byte span's four lanes, so lane 4s + i of one
// vector holds the integer sum over span s of row i, and one epilogue (s_b of
// the span, s_g of row i's group picked from the four rows' scales by
// rowquad_scales) serves four rows. With zero points each row's dots start at its
// -zc·Σq per dword, so the span sums include them. The span sums and their
// epilogues are the quad form's, in its order, so a logit is the same bits
// whichever block of activation rows computed it. s / z: the four rows'
// scales and -zc (vpmaddwd's operand: an int32 with -zc in its low 16 bits),
// readable W values past the chunk's first group; st: with kRowQuadScalesT
// the quad's transposed scales (build_quad_scales); p: the four rows (a short
// last quad repeats its last row).
template <int BITS, int MB, bool SYM, bool PARTIAL, bool PF>
QHEAD_INT8_TARGET __attribute__((always_inline)) inline void rowquad_chunk(VF (&acc)[MB], const uint8_t* const (&p)[4],
                                                                           const float* const (&s)[4], const float* st,
                                                                           const int32_t* const (&z)[4], const Int8X& x,
                                                                           int64_t m0, int64_t k, const uint8_t* pf) {
  constexpr int CB = 4 * W;
  constexpr int CE = BITS == 4 ? 8 * W : 4 * W;
  const VI nib = vset_i8(0x0F);
  const int64_t g0 = x.g0[k];
  const VI gi = vload_i(x.gidxr + k * W);
  const VF sg = rowquad_scales(s, st, g0, gi);
  VI zl[SYM ? 1 : 4];  // zero points: row r's -zc per dword lane
  if constexpr (!SYM) {
    const VI gd = vload_i(x.gidx + k * W);
    QHEAD_UNROLL for (int r = 0; r < 4; ++r) zl[r] = vperm_i(load_chunk_groups(z[r] + g0), gd);
  }
  const int64_t at = k * x.m + m0;
  const int8_t* xq = x.q + at * CE;
  // The four rows' loads first, then each row's codes split and used at once
  // (one row's codes live at a time: AVX2 has 16 registers; splitting all
  // four first spilled there, 102 -> 125 µs at M = 1 in cache).
  VI d[MB][4], b4[4];
  QHEAD_UNROLL for (int r = 0; r < 4; ++r) b4[r] = load_chunk<PARTIAL, PF>(p[r] + k * CB, pf, k * CB * 4 + r * CB, x);
  QHEAD_UNROLL for (int r = 0; r < 4; ++r) {
    const VI b = b4[r];
    const VI u0 = BITS == 4 ? vand_i(b, nib) : b;
    const VI u1 = BITS == 4 ? vand_i(vsrl16_4(b), nib) : b;
    QHEAD_UNROLL for (int m = 0; m < MB; ++m) {
      // Start at -zc·Σq per dword: symmetric, prepared with x; zero points,
      // Σq (|.| <= 1016) times -zc (>= -255) in 16-bit lanes, exact.
      VI t0;
      if constexpr (SYM)
        t0 = vload_i(x.nt + (at + m) * W);
      else
        t0 = vmadd16(vload_i(x.t + (at + m) * W), zl[r]);
      if constexpr (BITS == 4)
        d[m][r] = dot4x2(t0, u0, vload_i(xq + m * CE), u1, vload_i(xq + m * CE + CB));
      else
        d[m][r] = dot8(t0, u0, vload_i(xq + m * CE));
    }
  }
  QHEAD_UNROLL for (int m = 0; m < MB; ++m) {
    VI q = sum_spans4(d[m][0], d[m][1], d[m][2], d[m][3]);
    acc[m] = vfma(vcvt(q), vmul(vload(x.sx + (at + m) * W), sg), acc[m]);
  }
}

// The block's scales transposed per quad of rows, t[(q·G + g)·4 + i] = row
// 4q + i's scale of group g (a short last quad repeats its last row): the
// AVX2 row-quad form reads a chunk's four rows' scales as one vector. 4×4
// SSE transposes, the rest (G mod 4 groups) by scalar copies.
inline void build_quad_scales(const float* sc, int64_t n, int64_t G, float* t) {
  for (int64_t i = 0; i < n; i += 4) {
    const float* s[4];
    for (int r = 0; r < 4; ++r) s[r] = sc + (i + r < n ? i + r : n - 1) * G;
    float* o = t + i * G;
    int64_t g = 0;
    for (; g + 4 <= G; g += 4) {
      __m128 r0 = _mm_loadu_ps(s[0] + g), r1 = _mm_loadu_ps(s[1] + g), r2 = _mm_loadu_ps(s[2] + g),
             r3 = _mm_loadu_ps(s[3] + g);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      _mm_storeu_ps(o + 4 * g, r0);
      _mm_storeu_ps(o + 4 * g + 4, r1);
      _mm_storeu_ps(o + 4 * g + 8, r2);
      _mm_storeu_ps(o + 4 * g + 12, r3);
    }
    for (; g < G; ++g)
      for (int r = 0; r < 4; ++r) o[4 * g + r] = s[r][g];
  }
}

// Rows [r0, r0 + n) of the block against activation rows m0 .. m0+MB-1. sc /
// zi: the block's scales and -zc as vpmaddwd's operand (row stride G); st:
// with kRowQuadScalesT, the scales transposed per quad (build_quad_scales).
template <int BITS, int MB, bool SYM>
QHEAD_INT8_TARGET void rows_rowquad(const PackedArgs& a, const Int8X& x, int64_t m0, int64_t r0, int64_t n,
                                    const float* sc, const float* st, const int32_t* zi, float* out, int64_t ldo) {
  const int64_t G = a.groups;
  const int64_t pf = m0 == 0 ? a.prefetch_bytes : 0;
  const bool partial = x.tail_bytes != 4 * W;
  const int64_t full = x.nch - (partial ? 1 : 0);
  for (int64_t i = 0; i < n; i += 4) {
    const uint8_t* p[4];
    const float* s[4];
    const int32_t* z[4];
    for (int r = 0; r < 4; ++r) {
      const int64_t row = i + r < n ? i + r : n - 1;
      p[r] = a.packed + (r0 + row) * a.row_bytes;
      s[r] = sc + row * G;
      z[r] = zi + row * G;
    }
    const float* t = st + i * G;  // the quad's transposed scales (kRowQuadScalesT)
    VF acc[MB];
    QHEAD_UNROLL for (int m = 0; m < MB; ++m) acc[m] = vzero();
    if (pf && i + 4 <= n) {
      const uint8_t* f = p[0] + pf;
      for (int64_t k = 0; k < full; ++k) rowquad_chunk<BITS, MB, SYM, false, true>(acc, p, s, t, z, x, m0, k, f);
      if (partial) rowquad_chunk<BITS, MB, SYM, true, true>(acc, p, s, t, z, x, m0, full, f);
    } else {
      for (int64_t k = 0; k < full; ++k) rowquad_chunk<BITS, MB, SYM, false, false>(acc, p, s, t, z, x, m0, k, nullptr);
      if (partial) rowquad_chunk<BITS, MB, SYM, true, false>(acc, p, s, t, z, x, m0, full, nullptr);
    }
    const int64_t nr = n - i < 4 ? n - i : 4;
    QHEAD_UNROLL for (int m = 0; m < MB; ++m) {
      alignas(16) float v[4];
      _mm_store_ps(v, sum_quads(acc[m]));
      for (int64_t r = 0; r < nr; ++r) out[(m0 + m) * ldo + i + r] = v[r];
    }
  }
}

// ---- the quad form (blocks of 8 and 4 activation rows, and 3 left over) ----
//
// Were each int32 lane to sum only the 8 (4-bit) or 4 (8-bit) products of one
// packed dword (Int8X's lane layout), the f32 epilogue (convert, s_b·s_g,
// FMA) would follow every one (8-bit) or two (4-bit) dot instructions. Here
// lane 4s + i of a vector belongs to the chunk's 16-byte span s and activation
// row i of a quad of four: the row's packed dword j of span s is repeated in
// the span's four lanes (vpshufd), and Int8X::qq holds the four activation
// rows' matching bytes. The four (4-bit: eight) dot instructions of a chunk
// then add into the same lanes, each lane holds a whole x block (4-bit) or
// half of one (8-bit) of one activation row, and one epilogue follows them
// all. The integers are exact sums of the products, in any order, so the
// mode's bound holds; the row-quad form above forms the same span sums.
template <int BITS, int RT, int NQ, bool SYM, bool PARTIAL, bool PF>
QHEAD_INT8_TARGET __attribute__((always_inline)) inline void quad_chunk(VF (&acc)[RT][NQ], const uint8_t* p0,
                                                                        int64_t rb, const float* sc, const float* zc,
                                                                        int64_t G, const Int8X& x, int64_t q0,
                                                                        int64_t k, const uint8_t* pf) {
  constexpr int CB = 4 * W;              // packed bytes per chunk and row
  constexpr int NV = BITS == 4 ? 8 : 4;  // x vectors per chunk and quad
  constexpr bool SPLIT = BITS == 4 || kQuadSplit8;
  const VI nib = vset_i8(0x0F);
  const VI gi = vload_i(x.gidxq + k * W);
  const int64_t g0 = x.g0[k];
  VI u[RT][8], zl[RT];
  VF sg[RT];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) {
    const VI b = load_chunk<PARTIAL, PF>(p0 + r * rb + k * CB, pf, k * CB * RT + r * CB, x);
    auto spread = [](VI c, VI (&o)[8], int at) {  // dword j of each span into the span's four lanes
      o[at] = spread_dword<0>(c);
      o[at + 1] = spread_dword<1>(c);
      o[at + 2] = spread_dword<2>(c);
      o[at + 3] = spread_dword<3>(c);
    };
    if constexpr (SPLIT) {
      spread(vand_i(b, nib), u[r], 0);
      spread(vand_i(vsrl16_4(b), nib), u[r], 4);
    } else {
      spread(b, u[r], 0);
    }
    lane_scales<SYM>(sc + r * G + g0, zc + r * G + g0, gi, sg[r], zl[r]);
  }
  QHEAD_UNROLL for (int qd = 0; qd < NQ; ++qd) {
    const int64_t at = k * x.nquads + q0 + qd;
    const int8_t* xq = x.qq + at * NV * CB;
    const VI t = vload_i((SYM ? x.ntq : x.tq) + at * W);
    QuadSum<BITS> d[RT];
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) d[r].start(SYM ? t : vmadd16(t, zl[r]));
    QHEAD_UNROLL for (int v = 0; v < NV; ++v) {
      VI xv = vload_i(xq + v * CB);
      // RT > 1: one load for the RT rows, not a memory operand each (AVX-512, M = 8
      // w4g64 in cache: 259 µs against 303 with memory operands); one row (AVX2):
      // a memory operand, one register fewer (447 µs against 484 with the load).
      if constexpr (RT > 1) __asm__("" : "+v"(xv));
      QHEAD_UNROLL for (int r = 0; r < RT; ++r) d[r].add(v, u[r], xv);
    }
    const VF sx = vload(x.sxq + at * W);
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) acc[r][qd] = vfma(vcvt(d[r].finish()), vmul(sx, sg[r]), acc[r][qd]);
  }
}

// R rows from row i of the block against the quads of activation rows from m0
// (a multiple of 4); the logits of activation rows m_end and on are not stored.
template <int BITS, int R, int NQ, bool SYM>
QHEAD_INT8_TARGET __attribute__((always_inline)) inline void quad_tile(const PackedArgs& a, const Int8X& x, int64_t m0,
                                                                       int64_t m_end, int64_t r0, int64_t i,
                                                                       const float* sc, const float* zc, float* out,
                                                                       int64_t ldo, int64_t pf, int64_t full,
                                                                       bool partial) {
  const int64_t G = a.groups, q0 = m0 / 4;
  const uint8_t* p = a.packed + (r0 + i) * a.row_bytes;
  const float* s = sc + i * G;
  const float* z = zc + i * G;
  VF acc[R][NQ];
  QHEAD_UNROLL for (int r = 0; r < R; ++r)
    QHEAD_UNROLL for (int qd = 0; qd < NQ; ++qd) acc[r][qd] = vzero();
  if (pf) {
    for (int64_t k = 0; k < full; ++k)
      quad_chunk<BITS, R, NQ, SYM, false, true>(acc, p, a.row_bytes, s, z, G, x, q0, k, p + pf);
    if (partial) quad_chunk<BITS, R, NQ, SYM, true, true>(acc, p, a.row_bytes, s, z, G, x, q0, full, p + pf);
  } else {
    for (int64_t k = 0; k < full; ++k) quad_chunk<BITS, R, NQ, SYM, false, false>(acc, p, a.row_bytes, s, z, G, x, q0, k, p);
    if (partial) quad_chunk<BITS, R, NQ, SYM, true, false>(acc, p, a.row_bytes, s, z, G, x, q0, full, p);
  }
  QHEAD_UNROLL for (int r = 0; r < R; ++r)
    QHEAD_UNROLL for (int qd = 0; qd < NQ; ++qd) {
      alignas(16) float v[4];
      _mm_store_ps(v, sum_quads(acc[r][qd]));
      for (int i4 = 0; i4 < 4; ++i4)
        if (m0 + 4 * qd + i4 < m_end) out[(m0 + 4 * qd + i4) * ldo + i + r] = v[i4];
    }
}

// Rows [r0, r0 + n) against activation rows m0 .. min(m0+4·NQ, m_total)-1
// (the rows of a last quad past M are zeros in Int8X::qq and not stored),
// two table rows at a time (AVX2: one).
template <int BITS, int NQ, bool SYM>
QHEAD_INT8_TARGET void rows_quad(const PackedArgs& a, const Int8X& x, int64_t m0, int64_t m_total, int64_t r0,
                                 int64_t n, const float* sc, const float* zc, float* out, int64_t ldo) {
  constexpr int RT = W == 16 ? 2 : 1;  // AVX2: 16 registers hold one row's 8 code vectors
  const int64_t pf = m0 == 0 ? a.prefetch_bytes : 0;
  const bool partial = x.tail_bytes != 4 * W;
  const int64_t full = x.nch - (partial ? 1 : 0), m_end = m0 + 4 * NQ < m_total ? m0 + 4 * NQ : m_total;
  int64_t i = 0;
  for (; i + RT <= n; i += RT) quad_tile<BITS, RT, NQ, SYM>(a, x, m0, m_end, r0, i, sc, zc, out, ldo, pf, full, partial);
  for (; i < n; ++i) quad_tile<BITS, 1, NQ, SYM>(a, x, m0, m_end, r0, i, sc, zc, out, ldo, pf, full, partial);
}

template <int BITS, bool SYM>
QHEAD_INT8_TARGET void logits_block_int8_t(const PackedArgs& a, const Int8X& x, int64_t m_total, int64_t r0,
                                           int64_t r1, float* out, int64_t ldo, float* scratch) {
  const int64_t n = r1 - r0;
  float* sc = scratch;
  float* zc = scratch + kBlockRows * a.groups + W;  // W floats of slack after each (the kernel reads past)
  int32_t* zi = reinterpret_cast<int32_t*>(scratch + 2 * (kBlockRows * a.groups + W));  // read by vector loads only
  float* st = scratch + 3 * (kBlockRows * a.groups + W);  // kRowQuadScalesT: read up to 4 floats past a quad
  prefetch_next_scales(a, r1);
  load_scales(a, r0, n, sc);
  // The activation rows end in a block of 1 or 2 (below): the row-quad form runs.
  const bool rowquad = m_total % 4 == 1 || m_total % 4 == 2;
  if (kRowQuadScalesT && rowquad) build_quad_scales(sc, n, a.groups, st);
  if constexpr (!SYM) {
    load_zero_codes(a, r0, n, zc);
    // The row-quad form's zero term: -zc in the low 16 bits, 0 above (vpmaddwd's operand).
    // Vector instructions: a scalar loop here cost a quarter of an M = 1 call in cache.
    if (rowquad) {
      for (int64_t j = 0; j < n * a.groups; j += W) {  // zc has W floats of slack, zi room for them
        const VI v = vand_i(vsub_i(vzero_i(), vcvt_i(vload(zc + j))), vset_i(0xFFFF));
        std::memcpy(zi + j, &v, sizeof v);
      }
    }
  }
  for (int64_t m = 0; m < m_total;) {
    // Three rows left: a quad with a row of zeros (in cache 4096x1024 w4g64,
    // AVX-512: the quad 151 µs against 171 for blocks of 2 and 1); two: the
    // row-quad form (94 µs; a half-empty quad would take about 151).
    const int64_t mb = m_total - m == 3 ? 3 : m_block(m_total - m);
    switch (mb) {
      case 8: rows_quad<BITS, 2, SYM>(a, x, m, m_total, r0, n, sc, zc, out, ldo); break;
      case 4:
      case 3: rows_quad<BITS, 1, SYM>(a, x, m, m_total, r0, n, sc, zc, out, ldo); break;
      case 2: rows_rowquad<BITS, 2, SYM>(a, x, m, r0, n, sc, st, zi, out, ldo); break;
      default: rows_rowquad<BITS, 1, SYM>(a, x, m, r0, n, sc, st, zi, out, ldo); break;
    }
    m += mb;
  }
}

QHEAD_INT8_TARGET void logits_block_int8(const PackedArgs& a, const Int8X& x, int64_t m, int64_t r0, int64_t r1,
                                         float* out, int64_t ldo, float* scratch) {
  const bool sym = a.zero_point == nullptr;
  if (a.bits == 4)
    sym ? logits_block_int8_t<4, true>(a, x, m, r0, r1, out, ldo, scratch)
        : logits_block_int8_t<4, false>(a, x, m, r0, r1, out, ldo, scratch);
  else
    sym ? logits_block_int8_t<8, true>(a, x, m, r0, r1, out, ldo, scratch)
        : logits_block_int8_t<8, false>(a, x, m, r0, r1, out, ldo, scratch);
}

