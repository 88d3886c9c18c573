// CPU fast paths: run-time ISA choice (CPUID + XGETBV), the persistent thread
// pool, and the drivers that split the work over vocab rows and merge the
// per-thread top-k / log-sum-exp. Compiled WITHOUT ISA flags: the only code
// here that runs AVX2/AVX-512 instructions is reached through a KernelTable
// that was chosen because the CPU (and the OS) supports it.
#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/thread_pool.h"
#include "ops/ops_ref.h"
#include "qhead/error.h"
#include "qhead/parallel.h"

#if defined(QHEAD_HAVE_X86_KERNELS)
#include <cpuid.h>
#endif

namespace qhead {

// ---- ISA detection and the public knobs (qhead/ops.h) ------------------------------

namespace {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C, with the OS saving YMM state
  bool avx512 = false;  // + AVX-512 F/BW/VL/DQ, with the OS saving ZMM/opmask state
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
#endif
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

std::atomic<int> g_forced_isa{static_cast<int>(CpuIsa::kAuto)};

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

int dtype_kind(DType t) { return t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2; }

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
  return true;
}

// The activations as f32, laid out as the kernel reads them (kernels.h,
// logits_block): per block of mb = m_block(M - m0) rows, [H / ce][mb][ce]
// panels; for 4-bit tables each chunk of ce elements is permuted to the
// nibble order the kernel produces (the even elements, then the odd ones).
// The weights are used as stored; the activations move instead (once per call).
std::vector<float> prepare_x(const TensorView& x, int bits, const KernelTable& k) {
  const int64_t m = x.size(0), h = x.size(1);
  std::vector<float> xf(static_cast<size_t>(m * h));
  convert(x.data, x.dtype, xf.data(), DType::kF32, m * h);
  std::vector<float> xp(xf.size());
  const int64_t ce = bits == 4 ? k.chunk4 : k.chunk8;
  const int64_t half = ce / 2;
  for (int64_t m0 = 0; m0 < m;) {
    const int64_t mb = m_block(m - m0);
    float* panel = xp.data() + m0 * h;
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

int64_t n_blocks(int64_t v) { return (v + kBlockRows - 1) / kBlockRows; }

// Larger value first, then lower id (the reference's order).
struct Cand {
  float value;
  int32_t id;
};
inline bool better(const Cand& a, const Cand& b) { return a.value > b.value || (a.value == b.value && a.id < b.id); }

}  // namespace

bool logits(const Table& table, const TensorView& x, const TensorView& out) {
  const KernelTable* k = kernels();
  PackedArgs a;
  if (k == nullptr || !packed_args(table, a)) return false;
  const int64_t m = x.size(0), v = a.vocab;
  if (m == 0) return true;
  const std::vector<float> xp = prepare_x(x, a.bits, *k);
  auto p = pool();
  std::vector<std::vector<float>> scratch(static_cast<size_t>(p->size()));
  float* o = out.ptr<float>();
  p->run(n_blocks(v), [&](int64_t b, int w) {
    auto& s = scratch[static_cast<size_t>(w)];
    if (s.empty()) s.resize(static_cast<size_t>(2 * kBlockRows * a.groups));
    const int64_t r0 = b * kBlockRows, r1 = std::min(v, r0 + kBlockRows);
    k->logits_block(a, xp.data(), m, r0, r1, o + r0, v, s.data());
  });
  return true;
}

bool topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse) {
  const KernelTable* kt = kernels();
  PackedArgs a;
  if (kt == nullptr || !packed_args(table, a)) return false;
  const int64_t m = x.size(0), v = a.vocab;
  if (m == 0) return true;
  const std::vector<float> xp = prepare_x(x, a.bits, *kt);
  auto p = pool();

  // Per thread: a [M, kBlockRows] logits buffer (the [M, V] logits are never
  // stored), and per activation row a k-heap (worst on top) plus an online
  // log-sum-exp (running max, Σ exp(l - max) in double).
  struct PerThread {
    std::vector<float> scratch, buf;
    std::vector<std::vector<Cand>> heap;
    std::vector<float> mx;
    std::vector<double> sum;
  };
  std::vector<PerThread> st(static_cast<size_t>(p->size()));
  auto worse_on_top = [](const Cand& l, const Cand& r) { return better(l, r); };
  p->run(n_blocks(v), [&](int64_t b, int w) {
    PerThread& t = st[static_cast<size_t>(w)];
    if (t.buf.empty()) {
      t.scratch.resize(static_cast<size_t>(2 * kBlockRows * a.groups));
      t.buf.resize(static_cast<size_t>(m * kBlockRows));
      t.heap.resize(static_cast<size_t>(m));
      for (auto& h : t.heap) h.reserve(static_cast<size_t>(k));
      t.mx.assign(static_cast<size_t>(m), -std::numeric_limits<float>::infinity());
      t.sum.assign(static_cast<size_t>(m), 0.0);
    }
    const int64_t r0 = b * kBlockRows, r1 = std::min(v, r0 + kBlockRows), n = r1 - r0;
    kt->logits_block(a, xp.data(), m, r0, r1, t.buf.data(), kBlockRows, t.scratch.data());
    for (int64_t i = 0; i < m; ++i) {
      const float* l = t.buf.data() + i * kBlockRows;
      const size_t si = static_cast<size_t>(i);
      const float bm = kt->max(l, n);
      if (bm > t.mx[si]) {
        t.sum[si] *= std::exp(static_cast<double>(t.mx[si]) - static_cast<double>(bm));
        t.mx[si] = bm;
      }
      if (t.mx[si] > -std::numeric_limits<float>::infinity()) t.sum[si] += kt->sum_exp(l, n, t.mx[si]);
      auto& heap = t.heap[si];
      for (int64_t j = 0; j < n; ++j) {
        const Cand c{l[j], static_cast<int32_t>(r0 + j)};
        if (static_cast<int64_t>(heap.size()) < k) {
          heap.push_back(c);
          std::push_heap(heap.begin(), heap.end(), worse_on_top);
        } else if (c.value >= heap.front().value && better(c, heap.front())) {
          std::pop_heap(heap.begin(), heap.end(), worse_on_top);
          heap.back() = c;
          std::push_heap(heap.begin(), heap.end(), worse_on_top);
        }
      }
    }
  });

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
      mx = std::max(mx, static_cast<double>(t.mx[si]));
    }
    std::sort(all.begin(), all.end(), better);
    double sum = 0.0;
    for (const auto& t : st)
      if (!t.heap.empty() && t.sum[si] > 0.0) sum += t.sum[si] * std::exp(static_cast<double>(t.mx[si]) - mx);
    for (int64_t j = 0; j < k; ++j) {
      values.ptr<float>()[i * k + j] = all[static_cast<size_t>(j)].value;
      ids.ptr<int32_t>()[i * k + j] = all[static_cast<size_t>(j)].id;
    }
    lse.ptr<float>()[i] = static_cast<float>(mx + std::log(sum));
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
    std::vector<float> row(out.dtype == DType::kF32 ? 0 : static_cast<size_t>(h));
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
  std::vector<float> xf(static_cast<size_t>(h));
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
