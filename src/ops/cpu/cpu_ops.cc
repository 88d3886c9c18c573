// CPU fast paths: run-time ISA choice (CPUID + XGETBV), the persistent thread
// pool, and the drivers that split the work over vocab rows and merge the
// per-thread top-k / log-sum-exp. Compiled WITHOUT ISA flags: the only code
// here that runs AVX2/AVX-512 instructions is reached through a KernelTable
// that was chosen because the CPU (and the OS) supports it.
#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/thread_pool.h"
#include "ops/ops_ref.h"
#include "ops/sample.h"
#include "qhead/error.h"
#include "core/parallel.h"

#if defined(QHEAD_HAVE_X86_KERNELS)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace qhead {

// ---- ISA detection and the public knobs (qhead/ops.h) ------------------------------

namespace {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C, with the OS saving YMM state
  bool avx512 = false;  // + AVX-512 F/BW/VL/DQ, with the OS saving ZMM/opmask state
  bool avx_vnni = false;     // AVX-VNNI (VEX vpdpbusd on ymm), with avx2
  bool avx512_vnni = false;  // AVX512_VNNI, with avx512
};

CpuFeatures detect() {
  CpuFeatures f;
#if defined(QHEAD_HAVE_X86_KERNELS)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool os_ymm = (xcr0_lo & 0x6u) == 0x6u;     // SSE + AVX state
  const bool os_zmm = (xcr0_lo & 0xe6u) == 0xe6u;   // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = (b >> 5) & 1;
  const bool avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);  // F DQ BW VL
  f.avx2 = os_ymm && avx2 && fma && f16c;
  f.avx512 = f.avx2 && os_zmm && avx512;
  f.avx512_vnni = f.avx512 && ((c >> 11) & 1);
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx_vnni = f.avx2 && ((a >> 4) & 1);
#endif
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

std::atomic<int> g_forced_isa{static_cast<int>(CpuIsa::kAuto)};
std::atomic<int> g_activations{static_cast<int>(CpuActivations::kExact)};

bool isa_available(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kReference: return true;
    case CpuIsa::kAvx2: return features().avx2;
    case CpuIsa::kAvx512: return features().avx512;
  }
  return false;
}

std::mutex g_pool_mu;
int g_threads = 0;  // 0: default_num_threads()
std::shared_ptr<cpu::ThreadPool> g_pool;

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kReference: return "reference";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

std::vector<CpuIsa> available_cpu_isas() {
  std::vector<CpuIsa> out{CpuIsa::kReference};
  if (isa_available(CpuIsa::kAvx2)) out.push_back(CpuIsa::kAvx2);
  if (isa_available(CpuIsa::kAvx512)) out.push_back(CpuIsa::kAvx512);
  return out;
}

void set_cpu_isa(CpuIsa isa) {
  if (!isa_available(isa))
    throw Error(ErrorCode::kUnsupported, "set_cpu_isa",
                std::string("this CPU (or this build) cannot run the ") + cpu_isa_name(isa) + " kernels");
  g_forced_isa.store(static_cast<int>(isa));
}

CpuIsa active_cpu_isa() {
  const auto forced = static_cast<CpuIsa>(g_forced_isa.load());
  if (forced != CpuIsa::kAuto) return forced;
  if (features().avx512) return CpuIsa::kAvx512;
  if (features().avx2) return CpuIsa::kAvx2;
  return CpuIsa::kReference;
}

void set_cpu_activations(CpuActivations a) { g_activations.store(static_cast<int>(a)); }

CpuActivations cpu_activations() { return static_cast<CpuActivations>(g_activations.load()); }

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_threads = std::max(0, n);
  g_pool.reset();  // rebuilt on next use; calls in flight keep their pool alive
}

int num_threads() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  return g_threads > 0 ? g_threads : default_num_threads();
}

namespace cpu {

namespace {

std::shared_ptr<ThreadPool> pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_shared<ThreadPool>(g_threads > 0 ? g_threads : default_num_threads());
  return g_pool;
}

const KernelTable* kernels() {
#if defined(QHEAD_HAVE_X86_KERNELS)
  switch (active_cpu_isa()) {
    case CpuIsa::kAvx512: return &avx512::kTable;
    case CpuIsa::kAvx2: return &avx2::kTable;
    default: return nullptr;
  }
#else
  return nullptr;
#endif
}

}  // namespace

const KernelTable* active_kernels() { return kernels(); }

namespace {

// The VNNI int8 kernel of k can run on this CPU.
bool vnni_runnable(const KernelTable* k) {
  if (k == nullptr || k->logits_block_int8 == nullptr) return false;
  return k->int8_vnni == 1 ? features().avx512_vnni : k->int8_vnni == 2 ? features().avx_vnni : false;
}

// The active kernels can run the int8 mode on this CPU (every ISA path has
// the vpmaddubsw kernel).
bool int8_runnable(const KernelTable* k) {
  return k != nullptr && (k->logits_block_int8_madd != nullptr || vnni_runnable(k));
}

std::atomic<int> g_int8_dot{0};  // Int8Dot

}  // namespace

void set_int8_dot(Int8Dot d) {
  if (d == Int8Dot::kVnni && !vnni_runnable(kernels()))
    throw Error(ErrorCode::kUnsupported, "set_int8_dot",
                std::string("the ") + cpu_isa_name(active_cpu_isa()) + " path has no VNNI int8 kernel on this CPU");
  g_int8_dot.store(static_cast<int>(d), std::memory_order_relaxed);
}

Int8Dot int8_dot() {
  const auto d = static_cast<Int8Dot>(g_int8_dot.load(std::memory_order_relaxed));
  if (d != Int8Dot::kAuto) return d;
  return vnni_runnable(kernels()) ? Int8Dot::kVnni : Int8Dot::kMaddubs;
}

const char* int8_dot_name(Int8Dot d) {
  switch (d) {
    case Int8Dot::kVnni: return "vnni";
    case Int8Dot::kMaddubs: return "maddubs";
    default: return "auto";
  }
}
}  // namespace cpu

bool cpu_int8_available() { return cpu::int8_runnable(cpu::kernels()); }

namespace cpu {

namespace {

int dtype_kind(DType t) { return t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2; }

// What the kernels read with full-width vector loads (activation panels, the
// int8 mode's arrays, scratch) is allocated on 64-byte boundaries. With the
// allocator's 16-byte alignment a buffer starts anywhere in a cache line, so
// every 64-byte load straddles two lines unless it happens to start on one,
// and every other 32-byte load does when it starts at an odd multiple of 16:
// the kernels' speed then changed from call to call (docs/tuning-notes.md).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const Aligned64<U>&) const { return true; }
};
template <class T>
using AVec = std::vector<T, Aligned64<T>>;

// The kernels' software-prefetch distance (kernels.h PackedArgs): 4 KiB for
// 4-bit, 8 KiB for 8-bit tables, measured on a 2-vCPU Intel Xeon
// (docs/tuning-notes.md, "CPU: prefetch"); any distance of 2-16 KiB was within noise there,
// none at all cost 1.6-2x. QHEAD_CPU_PREFETCH=<bytes> (0: off) overrides it,
// read once per process — a diagnostic knob for measuring other machines.
int64_t prefetch_distance(int bits) {
  static const int64_t env = [] {
    const char* e = std::getenv("QHEAD_CPU_PREFETCH");
    return e ? std::max<int64_t>(0, std::atoll(e)) : -1;
  }();
  if (env >= 0) return env;
  return bits == 4 ? 4096 : 8192;
}

// The kernels' view of a packed table; false if they do not take it.
bool packed_args(const Table& t, PackedArgs& a) {
  if (!t.is_packed() || t.device() != Device::kCPU) return false;
  const PackedTable& p = t.packed();
  const QuantScheme& s = p.scheme;
  if (s.bits != 4 && s.bits != 8) return false;
  const int64_t h = p.hidden, gl = s.group_len(h);
  if (h <= 0 || h % 32 != 0 || gl % 32 != 0) return false;
  a.packed = static_cast<const uint8_t*>(p.packed.data());
  a.row_bytes = 4 * s.packed_cols(h);
  a.scale = p.scale.data();
  a.scale_kind = dtype_kind(p.scale.dtype());
  a.zero_point = s.symmetric ? nullptr : p.zero_point.ptr<const int32_t>();
  a.bits = s.bits;
  a.vocab = p.vocab;
  a.hidden = h;
  a.groups = s.groups(h);
  a.group_len = gl;
  a.prefetch_bytes = prefetch_distance(a.bits);
  return true;
}

// The activations as f32, laid out as the kernel reads them (kernels.h,
// logits_block): per block of mb = m_block(M - m0, k.mb_max) rows, [H / ce][mb][ce]
// panels; for 4-bit tables each chunk of ce elements is permuted to the
// nibble order the kernel produces (the even elements, then the odd ones),
// or, for the blocks plane4_layout() names, to plane order (KernelTable::plane4).
// The weights are used as stored; the activations move instead (once per call).
AVec<float> prepare_x(const TensorView& x, const PackedArgs& a, const KernelTable& k) {
  const int bits = a.bits;
  const int64_t m = x.size(0), h = x.size(1);
  std::vector<float> xf(static_cast<size_t>(m * h));
  convert(x.data, x.dtype, xf.data(), DType::kF32, m * h);
  AVec<float> xp(xf.size());
  const int64_t ce = bits == 4 ? k.chunk4 : k.chunk8;
  const int64_t half = ce / 2;
  for (int64_t m0 = 0; m0 < m;) {
    const int64_t mb = m_block(m - m0, k.mb_max);
    float* panel = xp.data() + m0 * h;
    if (plane4_layout(bits, mb, a.group_len, a.zero_point == nullptr, k.plane4)) {
      const int64_t pc = k.plane4, lanes = pc / 8;
      for (int64_t c = 0; c < h / pc; ++c)
        for (int64_t i = 0; i < mb; ++i) {
          const float* src = xf.data() + (m0 + i) * h + c * pc;
          float* dst = panel + (c * mb + i) * pc;
          for (int64_t j = 0; j < 8; ++j)
            for (int64_t l = 0; l < lanes; ++l) dst[j * lanes + l] = src[8 * l + j];
        }
      m0 += mb;
      continue;
    }
    for (int64_t c = 0; c < h / ce; ++c)
      for (int64_t i = 0; i < mb; ++i) {
        const float* src = xf.data() + (m0 + i) * h + c * ce;
        float* dst = panel + (c * mb + i) * ce;
        if (bits == 4) {
          for (int64_t e = 0; e < half; ++e) {
            dst[e] = src[2 * e];
            dst[half + e] = src[2 * e + 1];
          }
        } else {
          std::copy(src, src + ce, dst);
        }
      }
    m0 += mb;
  }
  return xp;
}

// The int8 mode's activations (kernels.h Int8X): x quantized per block of 32
// elements, laid out per (row, chunk) in the order the VNNI kernel pairs them
// with the packed bytes, plus per-lane block scales, per-lane Σq (and its
// multiple by the symmetric offset) and the lanes' weight-group indices.
struct Int8Acts {
  AVec<int8_t> q, qq;
  AVec<float> sx, sxq;
  AVec<int32_t> t, nt, gidx, tq, ntq, gidxq, gidxr;
  std::vector<int64_t> g0;
  Int8X view;
};

Int8Acts prepare_x_int8(const TensorView& x, const PackedArgs& a, const KernelTable& k) {
  const int64_t m = x.size(0), h = x.size(1), lanes = k.lanes;
  const int64_t ce = a.bits == 4 ? k.chunk4_int8 : k.chunk8_int8;  // elements per chunk
  const int64_t per_lane = ce / lanes;                               // 8 (4-bit) or 4 (8-bit)
  const int64_t nch = (h + ce - 1) / ce;
  std::vector<float> xf(static_cast<size_t>(m * h));
  convert(x.data, x.dtype, xf.data(), DType::kF32, m * h);
  // Quantize: per block of 32, s = max|x| / 127, q = rint(x / s) (|q| <= 127
  // since |x / s| <= 127·(1 + 2^-24) < 127.5). A block of zeros has s = 0 and
  // q = 0; a block with a non-finite value gets s = NaN (its logits are NaN,
  // as the exact path's would be) and q = 0.
  std::vector<int8_t> qn(static_cast<size_t>(m * h));
  std::vector<float> sb(static_cast<size_t>(m * h / 32));
  for (int64_t b = 0; b < m * h / 32; ++b) {
    const float* xb = xf.data() + b * 32;
    float amax = 0.0f;
    for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(xb[e]));
    if (!std::isfinite(amax)) amax = std::numeric_limits<float>::quiet_NaN();
    const float s = amax / 127.0f;
    sb[static_cast<size_t>(b)] = s;
    // rint(v) for |v| <= 127.5: adding 1.5·2^23 rounds v to an integer (to
    // nearest, ties to even, in the default rounding mode) and subtracting it
    // back is exact. (std::nearbyint is a libm call here, 10x slower.)
    constexpr float kRound = 12582912.0f;
    for (int e = 0; e < 32; ++e)
      qn[static_cast<size_t>(b * 32 + e)] =
          s > 0.0f ? static_cast<int8_t>((xb[e] / s + kRound) - kRound) : static_cast<int8_t>(0);
  }
  Int8Acts r;
  r.q.assign(static_cast<size_t>(m * nch * ce), 0);
  r.sx.assign(static_cast<size_t>(m * nch * lanes), 0.0f);
  r.t.assign(static_cast<size_t>(m * nch * lanes), 0);
  r.nt.assign(static_cast<size_t>(m * nch * lanes), 0);
  const int32_t half = 1 << (a.bits - 1);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < nch; ++c) {
      const int64_t at = c * m + i, cs = c * ce;
      int8_t* dst = r.q.data() + at * ce;
      for (int64_t e = 0; e < ce && cs + e < h; ++e) {
        const int8_t v = qn[static_cast<size_t>(i * h + cs + e)];
        // 4-bit: the chunk's even elements first (paired with the low
        // nibbles), then the odd ones; 8-bit: in order.
        dst[a.bits == 4 ? (e % 2) * (ce / 2) + e / 2 : e] = v;
        const size_t l = static_cast<size_t>(at * lanes + e / per_lane);
        r.t[l] += v;
        r.sx[l] = sb[static_cast<size_t>((i * h + cs + e) / 32)];
      }
      for (int64_t l = 0; l < lanes; ++l) r.nt[static_cast<size_t>(at * lanes + l)] = -half * r.t[static_cast<size_t>(at * lanes + l)];
    }
  // The weight group of chunk c's element e (clamped to the row), minus the chunk's first.
  auto group_in_chunk = [&](int64_t c, int64_t e) {
    return static_cast<int32_t>(std::min((c * ce + e) / a.group_len, a.groups - 1) - c * ce / a.group_len);
  };
  const int64_t span = ce * 4 / lanes;  // elements per 16-byte span
  r.gidx.assign(static_cast<size_t>(nch * lanes), 0);
  r.gidxr.assign(static_cast<size_t>(nch * lanes), 0);
  r.g0.assign(static_cast<size_t>(nch), 0);
  for (int64_t c = 0; c < nch; ++c) {
    r.g0[static_cast<size_t>(c)] = c * ce / a.group_len;
    for (int64_t l = 0; l < lanes; ++l) {
      r.gidx[static_cast<size_t>(c * lanes + l)] = group_in_chunk(c, l * per_lane);
      // The row-quad form's scale index for table row `row` of four (kernels.h).
      const int32_t grp = group_in_chunk(c, (l / 4) * span), row = static_cast<int32_t>(l % 4);
      r.gidxr[static_cast<size_t>(c * lanes + l)] = lanes == 16 ? grp + 4 * row : grp * 4 + row;
    }
  }
  if (m >= 3) {
    // The quad form (kernels.h Int8X::qq): per chunk, lanes / 4 spans of
    // ce·4 / lanes elements; lane 4·span + i holds activation row 4·Q + i.
    const int64_t nv = a.bits == 4 ? 8 : 4, vb = 4 * lanes, nq = (m + 3) / 4;
    r.qq.assign(static_cast<size_t>(nch * nq * nv * vb), 0);
    r.sxq.assign(static_cast<size_t>(nch * nq * lanes), 0.0f);
    r.tq.assign(static_cast<size_t>(nch * nq * lanes), 0);
    r.ntq.assign(static_cast<size_t>(nch * nq * lanes), 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < nch; ++c) {
        const int64_t at = c * nq + i / 4;
        for (int64_t sp = 0; sp < lanes / 4; ++sp) {
          const int64_t e0 = c * ce + sp * span;  // the span's first element
          if (e0 >= h) break;                     // past H: zeros
          const int64_t lane = 4 * sp + i % 4;
          const size_t l = static_cast<size_t>(at * lanes + lane);
          for (int64_t v = 0; v < nv; ++v)
            for (int64_t b = 0; b < 4; ++b) {
              const int64_t j = v % 4, e = e0 + (a.bits == 4 ? 8 * j + 2 * b + v / 4 : 4 * j + b);
              if (e >= h) continue;
              const int8_t val = qn[static_cast<size_t>(i * h + e)];
              r.qq[static_cast<size_t>((at * nv + v) * vb + lane * 4 + b)] = val;
              r.tq[l] += val;
            }
          r.sxq[l] = sb[static_cast<size_t>((i * h + e0) / 32)];
          r.ntq[l] = -half * r.tq[l];
        }
      }
    r.gidxq.assign(static_cast<size_t>(nch * lanes), 0);
    for (int64_t c = 0; c < nch; ++c)
      for (int64_t l = 0; l < lanes; ++l) r.gidxq[static_cast<size_t>(c * lanes + l)] = group_in_chunk(c, (l / 4) * span);
    r.view.qq = r.qq.data();
    r.view.sxq = r.sxq.data();
    r.view.tq = r.tq.data();
    r.view.ntq = r.ntq.data();
    r.view.gidxq = r.gidxq.data();
    r.view.nquads = nq;
  }
  const int64_t tail = h - (nch - 1) * ce;  // elements of the last chunk
  r.view.q = r.q.data();
  r.view.t = r.t.data();
  r.view.nt = r.nt.data();
  r.view.gidx = r.gidx.data();
  r.view.sx = r.sx.data();
  r.view.gidxr = r.gidxr.data();
  r.view.g0 = r.g0.data();
  r.view.nch = nch;
  r.view.m = m;
  r.view.tail_bytes = tail * a.bits / 8;
  return r;
}

// One call's activations in the form the chosen kernel reads, and the call
// of that kernel on a row block.
struct PreparedX {
  const KernelTable* k = nullptr;
  bool int8 = false;
  bool vnni = false;  // int8 through VNNI vpdpbusd (else vpmaddubsw + vpmaddwd)
  AVec<float> xp;  // exact
  Int8Acts i8;     // int8
  int64_t scratch_floats = 0;

  PreparedX(const TensorView& x, const PackedArgs& a, const KernelTable* kt) : k(kt) {
    int8 = cpu_activations() == CpuActivations::kInt8 && int8_runnable(kt);
    vnni = int8 && int8_dot() == Int8Dot::kVnni && vnni_runnable(kt);
    if (int8)
      i8 = prepare_x_int8(x, a, *kt);
    else
      xp = prepare_x(x, a, *kt);
    scratch_floats = 4 * (kBlockRows * a.groups + kt->lanes);
  }
  void block(const PackedArgs& a, int64_t m, int64_t r0, int64_t r1, float* out, int64_t ldo, float* scratch) const {
    if (int8)
      (vnni ? k->logits_block_int8 : k->logits_block_int8_madd)(a, i8.view, m, r0, r1, out, ldo, scratch);
    else
      k->logits_block(a, xp.data(), m, r0, r1, out, ldo, scratch);
  }
};

int64_t n_blocks(int64_t v) { return (v + kBlockRows - 1) / kBlockRows; }

// How the vocab blocks are handed to the threads (thread_pool.h):
// contiguous shares with stealing, so each thread streams one long run of
// rows. QHEAD_CPU_SCHEDULE=shared (one counter, blocks interleaved between
// threads) is a diagnostic knob, read once per process.
ThreadPool::Schedule sched() {
  static const bool shared = [] {
    const char* e = std::getenv("QHEAD_CPU_SCHEDULE");
    return e && std::string(e) == "shared";
  }();
  return shared ? ThreadPool::Schedule::kShared : ThreadPool::Schedule::kContiguous;
}

// Larger value first, then lower id (the reference's order).
struct Cand {
  float value;
  int32_t id;
};
inline bool better(const Cand& a, const Cand& b) { return a.value > b.value || (a.value == b.value && a.id < b.id); }

// One pass over the table in blocks of kBlockRows rows, for the epilogues that
// never store the [M, V] logits: each block's logits land in a per-thread
// [M, kBlockRows] buffer and body(state, kernels, m, r0, n, logits) consumes
// them (row i's n logits at logits + i * kBlockRows, vocab ids r0 ...). A
// thread's State is made by init(state, m) before its first block; st holds
// one per worker (a worker that got no block keeps a default-constructed one).
// false: not a packed table these kernels take (the caller falls back).
template <class State, class Init, class Body>
bool block_pass(const Table& table, const TensorView& x, std::vector<State>& st, Init&& init, Body&& body) {
  const KernelTable* kt = kernels();
  PackedArgs a;
  if (kt == nullptr || !packed_args(table, a)) return false;
  const int64_t m = x.size(0), v = a.vocab;
  if (m == 0) return true;
  const PreparedX px(x, a, kt);
  auto p = pool();
  struct Buffers {
    AVec<float> scratch, logits;
  };
  std::vector<Buffers> bufs(static_cast<size_t>(p->size()));
  st.assign(static_cast<size_t>(p->size()), State{});
  p->run(n_blocks(v), [&](int64_t b, int w) {
    Buffers& bf = bufs[static_cast<size_t>(w)];
    State& state = st[static_cast<size_t>(w)];
    if (bf.logits.empty()) {
      bf.scratch.resize(static_cast<size_t>(px.scratch_floats));
      bf.logits.resize(static_cast<size_t>(m * kBlockRows));
      init(state, m);
    }
    const int64_t r0 = b * kBlockRows, r1 = std::min(v, r0 + kBlockRows);
    px.block(a, m, r0, r1, bf.logits.data(), kBlockRows, bf.scratch.data());
    body(state, *kt, m, r0, r1 - r0, bf.logits.data());
  }, sched());
  return true;
}

}  // namespace

namespace {
void to_bf16_plain(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}
void to_f16_plain(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
#if defined(QHEAD_HAVE_X86_KERNELS)
__attribute__((target("avx2"))) void to_bf16_avx2(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}
// f16 by F16C (vcvtps2ph, nearest even), 8 at a time.
__attribute__((target("avx,f16c"))) void to_f16_f16c(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
#endif

using RoundFn = void (*)(const float*, uint16_t*, int64_t);
// The fastest rounding into t (F16 or BF16) this CPU runs.
RoundFn round_fn(DType t) {
  RoundFn fn = t == DType::kBF16 ? to_bf16_plain : to_f16_plain;
#if defined(QHEAD_HAVE_X86_KERNELS)
  if (features().avx2) fn = t == DType::kBF16 ? to_bf16_avx2 : to_f16_f16c;  // AVX2 + FMA + F16C, OS YMM state
#endif
  return fn;
}
}  // namespace

void round_to_16bit(const float* src, uint16_t* dst, int64_t n, DType t) {
  const RoundFn fn = round_fn(t);
  constexpr int64_t kPerTask = 32768;
  if (n <= kPerTask) return fn(src, dst, n);
  pool()->run((n + kPerTask - 1) / kPerTask, [&](int64_t task, int) {
    const int64_t b = task * kPerTask;
    fn(src + b, dst + b, std::min(kPerTask, n - b));
  });
}

bool logits(const Table& table, const TensorView& x, const TensorView& out) {
  const KernelTable* k = kernels();
  PackedArgs a;
  if (k == nullptr || !packed_args(table, a)) return false;
  const int64_t m = x.size(0), v = a.vocab;
  if (m == 0) return true;
  const PreparedX px(x, a, k);
  auto p = pool();
  std::vector<AVec<float>> scratch(static_cast<size_t>(p->size()));
  // A 16-bit out: each block's f32 logits in a per-thread [m, kBlockRows] buffer, then rounded into out.
  const bool f32 = out.dtype == DType::kF32;
  const RoundFn round = f32 ? nullptr : round_fn(out.dtype);
  std::vector<AVec<float>> blocks(f32 ? 0 : static_cast<size_t>(p->size()));
  p->run(n_blocks(v), [&](int64_t b, int w) {
    auto& s = scratch[static_cast<size_t>(w)];
    if (s.empty()) s.resize(static_cast<size_t>(px.scratch_floats));
    const int64_t r0 = b * kBlockRows, r1 = std::min(v, r0 + kBlockRows);
    if (f32) return px.block(a, m, r0, r1, out.ptr<float>() + r0, v, s.data());
    auto& blk = blocks[static_cast<size_t>(w)];
    if (blk.empty()) blk.resize(static_cast<size_t>(m * kBlockRows));
    px.block(a, m, r0, r1, blk.data(), kBlockRows, s.data());
    for (int64_t i = 0; i < m; ++i) round(blk.data() + i * kBlockRows, out.ptr<uint16_t>() + i * v + r0, r1 - r0);
  }, sched());
  return true;
}

bool topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, float inv_temperature) {
  // Per thread and activation row: a k-heap (worst on top) plus an online
  // log-sum-exp (LseState: running max, Σ exp(l - max)).
  struct PerThread {
    std::vector<std::vector<Cand>> heap;
    std::vector<LseState> lse;
  };
  std::vector<PerThread> st;
  auto worse_on_top = [](const Cand& l, const Cand& r) { return better(l, r); };
  const auto init = [k](PerThread& t, int64_t m) {
    t.heap.resize(static_cast<size_t>(m));
    for (auto& h : t.heap) h.reserve(static_cast<size_t>(k));
    t.lse.assign(static_cast<size_t>(m), LseState{});
  };
  const auto body = [&](PerThread& t, const KernelTable& kt, int64_t m, int64_t r0, int64_t n, float* block) {
    if (inv_temperature != 1.0f)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) block[i * kBlockRows + j] *= inv_temperature;
    for (int64_t i = 0; i < m; ++i) {
      const float* l = block + i * kBlockRows;
      const size_t si = static_cast<size_t>(i);
      auto& heap = t.heap[si];
      const bool full = static_cast<int64_t>(heap.size()) == k;
      uint64_t ge;  // with a full heap: the block's logits >= its k-th best value, the only ones that can enter
      kt.topk_block(l, n, full ? heap.front().value : -std::numeric_limits<float>::infinity(), &t.lse[si], &ge);
      if (!full) {
        int64_t j = 0;
        for (; j < n && static_cast<int64_t>(heap.size()) < k; ++j) {  // filling the heap
          heap.push_back({l[j], static_cast<int32_t>(r0 + j)});
          std::push_heap(heap.begin(), heap.end(), worse_on_top);
        }
        ge = 0;
        for (; j < n; ++j) ge |= uint64_t{1} << j;  // the rest of the block: check them all
      }
      for (; ge != 0; ge &= ge - 1) {
        const int j = __builtin_ctzll(ge);
        const Cand c{l[j], static_cast<int32_t>(r0 + j)};
        if (!better(c, heap.front())) continue;
        std::pop_heap(heap.begin(), heap.end(), worse_on_top);
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), worse_on_top);
      }
    }
  };
  if (!block_pass(table, x, st, init, body)) return false;
  const int64_t m = x.size(0);

  // Merge: the k best of the per-thread candidates (a total order, so the
  // result does not depend on the thread count), and the log-sum-exps.
  std::vector<Cand> all;
  for (int64_t i = 0; i < m; ++i) {
    const size_t si = static_cast<size_t>(i);
    all.clear();
    double mx = -std::numeric_limits<double>::infinity();
    for (const auto& t : st) {
      if (t.heap.empty()) continue;
      all.insert(all.end(), t.heap[si].begin(), t.heap[si].end());
      mx = std::max(mx, static_cast<double>(t.lse[si].mx));
    }
    std::sort(all.begin(), all.end(), better);
    double sum = 0.0;
    for (const auto& t : st)
      if (!t.heap.empty()) {
        const double ts = t.lse[si].total();
        if (ts > 0.0) sum += ts * std::exp(static_cast<double>(t.lse[si].mx) - mx);
      }
    for (int64_t j = 0; j < k; ++j) {
      values.ptr<float>()[i * k + j] = all[static_cast<size_t>(j)].value;
      ids.ptr<int32_t>()[i * k + j] = all[static_cast<size_t>(j)].id;
    }
    lse.ptr<float>()[i] = static_cast<float>(mx + std::log(sum));
  }
  return true;
}

bool sample_gumbel(const Table& table, const TensorView& x, float inv_temperature, uint64_t seed, uint64_t offset,
                   const TensorView& ids) {
  // Per thread: each row's best (perturbed value, id). The noise of a column
  // depends on (seed, offset, row, column) only, so the result does not
  // depend on the thread count.
  struct PerThread {
    AVec<float> noise;
    std::vector<Cand> best;
  };
  std::vector<PerThread> st;
  const auto init = [](PerThread& t, int64_t m) {
    t.best.assign(static_cast<size_t>(m), Cand{-std::numeric_limits<float>::infinity(), -1});
    t.noise.resize(static_cast<size_t>(kBlockRows));
  };
  const auto body = [&](PerThread& t, const KernelTable& kt, int64_t m, int64_t r0, int64_t n, const float* block) {
    for (int64_t i = 0; i < m; ++i) {
      const float* l = block + i * kBlockRows;
      Cand& best = t.best[static_cast<size_t>(i)];
      float z[kBlockRows];
      float zmax = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        z[j] = l[j] * inv_temperature;
        zmax = std::max(zmax, z[j]);
      }
      if (best.id >= 0 && zmax + sampling::kGumbelBound < best.value) continue;  // no noise lifts any to the best
      // The block's noise, vectorized (r0 is a multiple of 4: whole groups).
      kt.gumbel_noise(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(i),
                      static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32) & ~sampling::kDrawStream,
                      static_cast<uint32_t>(r0 / 4), (n + 3) / 4, t.noise.data());
      for (int64_t j = 0; j < n; ++j) {
        const Cand c{z[j] + t.noise[static_cast<size_t>(j)], static_cast<int32_t>(r0 + j)};
        if (best.id < 0 || better(c, best)) best = c;
      }
    }
  };
  if (!block_pass(table, x, st, init, body)) return false;
  const int64_t m = x.size(0);
  for (int64_t i = 0; i < m; ++i) {
    Cand best{-std::numeric_limits<float>::infinity(), -1};
    for (const auto& t : st)
      if (!t.best.empty() && t.best[static_cast<size_t>(i)].id >= 0 &&
          (best.id < 0 || better(t.best[static_cast<size_t>(i)], best)))
        best = t.best[static_cast<size_t>(i)];
    ids.ptr<int32_t>()[i] = best.id;
  }
  return true;
}

bool embed(const Table& table, const TensorView& ids, const TensorView& out) {
  const KernelTable* k = kernels();
  PackedArgs a;
  if (k == nullptr || !packed_args(table, a)) return false;
  const int64_t n = ids.size(0), h = a.hidden;
  const size_t esz = dtype_size(out.dtype);
  auto gather = [&](int64_t b, int64_t e) {
    AVec<float> row(out.dtype == DType::kF32 ? 0 : static_cast<size_t>(h));
    for (int64_t i = b; i < e; ++i) {
      char* dst = static_cast<char*>(out.data) + static_cast<size_t>(i * h) * esz;
      if (out.dtype == DType::kF32) {
        k->dequant_row(a, ref::id_at(ids, i), reinterpret_cast<float*>(dst));
      } else {
        k->dequant_row(a, ref::id_at(ids, i), row.data());
        convert(row.data(), DType::kF32, dst, out.dtype, h);
      }
    }
  };
  constexpr int64_t kRowsPerTask = 64;
  if (n * h < (int64_t{1} << 16)) {
    gather(0, n);
  } else {
    pool()->run((n + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t, int) {
      gather(t * kRowsPerTask, std::min(n, (t + 1) * kRowsPerTask));
    });
  }
  return true;
}

bool rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids) {
  const KernelTable* kt = kernels();
  if (kt == nullptr || dense.is_packed() || dense.device() != Device::kCPU) return false;
  const int64_t m = x.size(0), h = x.size(1), k = candidates.size(1);
  const Tensor& w = dense.dense();
  const int kind = dtype_kind(w.dtype());
  const size_t row_bytes = static_cast<size_t>(h) * dtype_size(w.dtype());
  AVec<float> xf(static_cast<size_t>(h));
  std::vector<Cand> c(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    convert(static_cast<const char*>(x.data) + static_cast<size_t>(i * h) * dtype_size(x.dtype), x.dtype, xf.data(),
            DType::kF32, h);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = ref::id_at(candidates, i * k + j);
      const void* row = static_cast<const char*>(w.data()) + static_cast<size_t>(id) * row_bytes;
      c[static_cast<size_t>(j)] = {kt->dot_dense(xf.data(), row, kind, h), static_cast<int32_t>(id)};
    }
    std::sort(c.begin(), c.end(), better);
    for (int64_t j = 0; j < k; ++j) {
      values.ptr<float>()[i * k + j] = c[static_cast<size_t>(j)].value;
      ids.ptr<int32_t>()[i * k + j] = c[static_cast<size_t>(j)].id;
    }
  }
  return true;
}

}  // namespace cpu
}  // namespace qhead
