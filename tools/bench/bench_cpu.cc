// run_cpu_bench: every CPU path on the same tables, against the memory read
// bandwidth measured in the same run.
//
//   ceiling     a STREAM-like read over a buffer of 4x the largest f32 table
//               of the run up to 1 GiB, and at least 4x the last-level cache,
//               on the same thread count — the fastest of a scalar
//               loop of 64-bit adds and full-width vector loads without /
//               with software prefetch (the fused kernels' access); and
//               the f32 FMA rate of the active ISA on all threads (the
//               compute ceiling: `matrix_fraction` of each row is its
//               multiply-adds per second over that rate)
//   dense       OpenBLAS SGEMV (M = 1) / SGEMM on the f32 table
//   dense_bf16  OpenBLAS SBGEMV / SBGEMM on a bf16 copy of the table (bf16
//               activations, f32 output) — what a user who keeps the dense
//               table in bf16 runs — where the OpenBLAS loaded exports them
//               (looked up at run time: Debian's 0.3.21 declares them in
//               cblas.h but is built without BUILD_BFLOAT16); otherwise one
//               run-level row, measured = false, says why
//   dense_f16   always such a row: OpenBLAS has no f16 GEMM/GEMV, and
//               converting to f32 first is the dense row's work plus a copy
//   fallback    qhead::logits_fallback: dequantize the whole table + SGEMM
//   fused       qhead::logits (kAuto: the fused kernels of the best ISA)
//   fused_act_out  the same into a bf16 out (each block's logits rounded)
//   fused_topk  qhead::topk, k = cfg.k (the [M, V] logits are never written)
//   sample, sample_top_k, sample_top_p  qhead::sample at T = 1 (whole vocab),
//               with top_k = 50, and at T = 0.7 with top_p = 0.9
//   fused_int8  qhead::logits with set_cpu_activations(kInt8) (opt-in int8
//               activations: VNNI vpdpbusd where the CPU has it, else
//               vpmaddubsw + vpmaddwd);
//               the row also reports its largest |logit - fused logit| on
//               the same table and x (max_abs_err) and whether the top-1 id
//               agrees, per activation row
//
// Each path: 2 warm-up calls, then timed calls (cfg.reps, or >= 5 and about
// 1 s, at most 50), median reported; fused and fused_topk are timed
// alternately (their ratio is a target, and two separate measurements drift
// apart by more than the top-k's cost on a shared machine). Per case the
// qhead paths of every M run first, then the BLAS ones: OpenBLAS worker
// threads spin for a while after each call and would take cores from the
// fused kernels, so the fused paths wait 300 ms after the last BLAS call
// (once per case, not per M). Every call uses the next of N copies of its
// table, N chosen so that the copies total >= 2x the LLC; when memory
// forbids that, the row's note says the table may be cache-resident.
//
// Fixed costs scale with the problem: the read-ceiling buffer with the
// largest table (a 1000x256 run reads 4x the LLC, not 1 GiB: 15 passes per
// reader instead of 7), the FMA burn is ~30 ms per call, and a small shape's
// paths stop at 50 calls.
#include <cblas.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <tuple>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "cases.h"  // tests/: the shapes the tests and the bench share
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"
#include "qhead/dtype.h"
#include "qhead/error.h"
#include "qhead/ops.h"
#include "core/parallel.h"
#include "qhead/quantize.h"

namespace qhead::bench {

// Five real-model shapes: Qwen3-0.6B (w4g64, w8g128), Pythia-70M, Llama-3-8B,
// Gemma-3-270M — the list the tests share (tests/cases.h, bench_shapes).
std::vector<BenchCase> default_cases() {
  std::vector<BenchCase> out;
  for (const test::BenchShape& s : test::bench_shapes()) out.push_back({s.V, s.H, s.scheme});
  return out;
}

std::vector<int64_t> default_m() { return test::bench_m(); }

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Last-level cache size from sysfs (the largest cache level listed), or 32 MiB.
int64_t llc_bytes() {
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(f >> s) || s.empty()) continue;
    int64_t v = std::atoll(s.c_str());
    if (s.back() == 'K') v <<= 10;
    if (s.back() == 'M') v <<= 20;
    best = std::max(best, v);
  }
  return best > 0 ? best : (int64_t{32} << 20);
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The timed calls' stopping rule: cfg.reps when given, else at least 5 and
// about `budget` seconds (at most 50).
bool timed_enough(int reps, int done, double seconds, double budget) {
  return reps > 0 ? done >= reps : (done >= 5 && (seconds > budget || done >= 50));
}

// Median seconds of call(i) over the timed calls, after two warm-up calls.
// *cpu_util (optional): process CPU seconds per wall second over the timed
// calls — below the thread count when other work takes the cores.
template <class F>
double time_median(int reps, F&& call, double* cpu_util = nullptr) {
  call(0);
  call(1);
  std::vector<double> t;
  double total = 0.0;
  const double c0 = cpu_seconds();
  for (int i = 0;; ++i) {
    const auto t0 = Clock::now();
    call(i + 2);
    const double dt = seconds_since(t0);
    t.push_back(dt);
    total += dt;
    if (timed_enough(reps, i + 1, total, 1.0)) break;
  }
  if (cpu_util) *cpu_util = (cpu_seconds() - c0) / total;
  return median(t);
}

// time_median for two calls timed alternately (a, b, a, b, …; each call gets
// the next index, so with rotating copies neither meets a copy the other just
// read): their ratio is then not moved by drift of the machine between two
// separate measurements. Returns {median a, median b}.
template <class A, class B>
std::pair<double, double> time_median_pair(int reps, A&& a, B&& b, double* util_a, double* util_b) {
  a(0);
  b(1);
  struct Side {
    std::vector<double> t;
    double cpu = 0.0, wall = 0.0;
  } sa, sb;
  auto timed = [](Side& side, auto& call, int i) {  // one timed call; returns its seconds
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    call(i);
    const double dt = seconds_since(t0);
    side.cpu += cpu_seconds() - c0;
    side.wall += dt;
    side.t.push_back(dt);
    return dt;
  };
  double total = 0.0;
  for (int i = 0;; ++i) {
    total += timed(sa, a, 2 * i + 2);
    total += timed(sb, b, 2 * i + 3);
    if (timed_enough(reps, i + 1, total, 2.0)) break;  // about 1 s each
  }
  if (util_a) *util_a = sa.cpu / sa.wall;
  if (util_b) *util_b = sb.cpu / sb.wall;
  return {median(sa.t), median(sb.t)};
}

// The size of the read-ceiling buffer: 4x the largest f32 table of the run
// (the most any path streams) up to 1 GiB, and never less than 4x the
// last-level cache (STREAM's rule, so the ceiling is memory, not cache).
int64_t read_buffer_bytes(const std::vector<BenchCase>& cases, int64_t llc) {
  int64_t largest = 0;
  for (const auto& c : cases) largest = std::max(largest, c.vocab * c.hidden * 4);
  const int64_t cap = int64_t{1} << 30;
  return std::max(largest > cap / 4 ? cap : 4 * largest, 4 * llc) / 4096 * 4096;
}

// The read ceiling: bytes / median time of a full pass over a buffer of
// `bytes` (read_buffer_bytes), the fastest of three readers: a scalar loop of
// 64-bit adds (what the hardware prefetchers alone give), and full-width
// vector loads of the active ISA without and with software prefetch 4 KiB
// ahead (what the fused kernels do). A kernel can then not look better than
// the memory by reading it in a way the ceiling does not. *how: which reader
// won.
double measure_read_gbps(int threads, int64_t bytes, double* us, std::string* how = nullptr) {
  const int64_t words = bytes / 8;
  std::unique_ptr<uint64_t[]> buf(new uint64_t[static_cast<size_t>(words)]);
  // Touch every page with non-zero data (untouched zero pages all map to one
  // physical page and would read from cache).
  parallel_for(words, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[static_cast<size_t>(i)] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  }, threads);
  volatile uint64_t sink = 0;
  const cpu::KernelTable* k = cpu::active_kernels();
  double best = 0.0;
  // 7 passes of a 1 GiB buffer; more of a smaller one (up to 15, about 1 GiB
  // read per reader), so that a pass shorter than a scheduler time slice
  // does not make the median.
  const int passes = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 30) / bytes, 7, 15));
  for (int reader = 0; reader < (k != nullptr ? 3 : 1); ++reader) {
    const double s = time_median(passes, [&](int) {
      std::vector<uint64_t> part(static_cast<size_t>(std::max(1, threads)) * 8, 0);
      const int64_t chunk = (words + threads - 1) / threads / 64 * 64;  // a multiple of 512 bytes per thread
      parallel_for(threads, 1, [&](int64_t tb, int64_t te) {
        for (int64_t t = tb; t < te; ++t) {
          const uint64_t* p = buf.get() + t * chunk;
          const int64_t n = t == threads - 1 ? (words - t * chunk) / 64 * 64 : chunk;
          if (reader > 0) {
            part[static_cast<size_t>(t) * 8] = k->read_sum(p, n * 8, reader == 2 ? 4096 : 0);
            continue;
          }
          uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          for (int64_t i = 0; i + 4 <= n; i += 4) {
            a0 += p[i];
            a1 += p[i + 1];
            a2 += p[i + 2];
            a3 += p[i + 3];
          }
          part[static_cast<size_t>(t) * 8] = a0 + a1 + a2 + a3;
        }
      }, threads);
      uint64_t total = 0;
      for (uint64_t v : part) total += v;
      sink = sink + total;
    });
    const double gbps = static_cast<double>(bytes) / s / 1e9;
    if (gbps > best) {
      best = gbps;
      *us = s * 1e6;
      if (how) *how = reader == 0 ? "scalar 64-bit loads" : reader == 1 ? "vector loads" : "vector loads + prefetch";
    }
  }
  return best;
}

// Counter-based values: the same table on every run and thread count. Each
// row gets a scale in [0.5, 1.5] x 0.02, values roughly N(0, 1) x that.
uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float unit(uint64_t x) { return static_cast<float>(splitmix(x) >> 40) * 0x1.0p-24f; }

Tensor make_dense(int64_t v, int64_t h, int threads) {
  Tensor t = Tensor::empty(DType::kF32, {v, h});
  float* p = t.ptr<float>();
  parallel_for(v, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float rs = 0.02f * (0.5f + unit(static_cast<uint64_t>(r) ^ 0xabcdefull));
      for (int64_t j = 0; j < h; ++j) {
        const uint64_t key = static_cast<uint64_t>(r * h + j) * 3;
        p[r * h + j] = (unit(key) + unit(key + 1) + unit(key + 2) - 1.5f) * 2.0f * rs;
      }
    }
  }, threads);
  return t;
}

Table copy_packed(const Table& t) {
  const PackedTable& p = t.packed();
  PackedTable c;
  c.scheme = p.scheme;
  c.vocab = p.vocab;
  c.hidden = p.hidden;
  c.packed = Tensor::copy_of(p.packed.view());
  c.scale = Tensor::copy_of(p.scale.view());
  if (p.zero_point.defined()) c.zero_point = Tensor::copy_of(p.zero_point.view());
  return Table::packed(std::move(c), "bench copy");
}

// Copies needed so that they total >= 2x the LLC, at most `cap`.
int copies_for(size_t bytes, int64_t llc, int cap) {
  const int64_t need = (2 * llc + static_cast<int64_t>(bytes) - 1) / static_cast<int64_t>(bytes);
  return static_cast<int>(std::clamp<int64_t>(need, 1, cap));
}

std::string residency_note(int copies, size_t bytes, int64_t llc) {
  const double total_mb = static_cast<double>(copies) * static_cast<double>(bytes) / 1e6;
  char buf[160];
  if (static_cast<double>(copies) * static_cast<double>(bytes) >= 2.0 * static_cast<double>(llc))
    std::snprintf(buf, sizeof buf, "rotating %d cop%s, %.0f MB >= 2x LLC", copies, copies == 1 ? "y" : "ies", total_mb);
  else
    std::snprintf(buf, sizeof buf, "FITS IN CACHE: %d cop%s = %.0f MB < 2x LLC (%.0f MB)", copies,
                  copies == 1 ? "y" : "ies", total_mb, 2.0 * static_cast<double>(llc) / 1e6);
  return buf;
}

// Lane-FMAs per second of the active kernels on `threads` threads (0 without kernels).
double measure_fma_rate(int threads) {
  const cpu::KernelTable* k = cpu::active_kernels();
  if (k == nullptr) return 0.0;
  // ~30 ms per call at 10 G lane-FMAs/s per thread (AVX2, 8 lanes): the
  // median of 5 is stable to about 1%.
  const int64_t iters = 4'000'000;
  volatile float sink = 0.0f;
  const double s = time_median(5, [&](int) {
    parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) sink = sink + k->fma_burn(iters);
    }, threads);
  });
  return 12.0 * static_cast<double>(iters) * k->lanes * threads / s;
}

std::string shape_name(int64_t v, int64_t h) { return std::to_string(v) + "x" + std::to_string(h); }

// OpenBLAS's bf16 GEMV / GEMM (bf16 matrix and vector, f32 output) where the
// library loaded exports them: looked up at run time, so that a build against
// a cblas.h that declares them still links to an OpenBLAS without them.
struct Bf16Blas {
  decltype(&cblas_sbgemv) gemv = nullptr;
  decltype(&cblas_sbgemm) gemm = nullptr;
  bool available() const { return gemv != nullptr && gemm != nullptr; }
};

Bf16Blas find_bf16_blas() {
  Bf16Blas b;
  void* gemv = dlsym(RTLD_DEFAULT, "cblas_sbgemv");
  void* gemm = dlsym(RTLD_DEFAULT, "cblas_sbgemm");
  static_assert(sizeof(gemv) == sizeof(b.gemv));
  if (gemv != nullptr && gemm != nullptr) {  // object to function pointer: by its bytes (POSIX guarantees the form)
    std::memcpy(&b.gemv, &gemv, sizeof gemv);
    std::memcpy(&b.gemm, &gemm, sizeof gemm);
  }
  return b;
}

// The activations of one M, the same on every run: values in [-1, 1).
Tensor make_x(int64_t m, int64_t h) {
  Tensor x = Tensor::empty(DType::kF32, {m, h});
  for (int64_t i = 0; i < m * h; ++i) x.ptr<float>()[i] = 2.0f * unit(0x51ull * static_cast<uint64_t>(i) + 7) - 1.0f;
  return x;
}

std::vector<uint16_t> to_bf16(const float* p, int64_t n) {
  std::vector<uint16_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = f32_to_bf16(p[i]);
  return out;
}

}  // namespace


std::vector<BenchRow> run_cpu_bench(const BenchConfig& cfg) {
  const int threads = cfg.threads > 0 ? cfg.threads : default_num_threads();
  if (cfg.threads > 0) {
    // The fallback's dequantization uses parallel_for's default thread count.
    setenv("QHEAD_NUM_THREADS", std::to_string(cfg.threads).c_str(), 1);
  }
  set_num_threads(threads);
  openblas_set_num_threads(threads);
  // The ISA path (set_cpu_isa throws Error(kUnsupported) for one this CPU
  // lacks); restored when the run ends.
  struct IsaScope {
    explicit IsaScope(const std::string& name) {
      if (name == "avx2") set_cpu_isa(CpuIsa::kAvx2);
      else if (name == "avx512") set_cpu_isa(CpuIsa::kAvx512);
      else if (name == "reference") set_cpu_isa(CpuIsa::kReference);
    }
    ~IsaScope() { set_cpu_isa(CpuIsa::kAuto); }
  } isa_scope(cfg.isa);
  const int64_t llc = llc_bytes();
  const int64_t read_bytes = read_buffer_bytes(cfg.cases, llc);
  std::vector<BenchRow> rows;

  // The ceilings are measured before the first case and again after each
  // one; the fractions use the largest value seen in the run (on a shared
  // machine a single measurement may land in a busy moment and flatter every
  // fraction).
  double ceil_us = 0.0;
  std::string ceil_how;
  double bw = measure_read_gbps(threads, read_bytes, &ceil_us, &ceil_how);
  int n_ceiling = 1;
  {
    BenchRow r;
    r.path = "ceiling";
    r.us_median = ceil_us;
    r.gbps = bw;
    r.bw_fraction = 1.0;
    r.note = "STREAM-like read of " + std::to_string(read_bytes >> 20) + " MiB (4x the largest f32 table up to 1 GiB, >= 4x LLC), " +
             std::to_string(threads) + " threads, LLC " + std::to_string(llc >> 20) +
             " MiB, fastest of scalar / vector / vector+prefetch readers; CPU path " + cpu_isa_name(active_cpu_isa());
    rows.push_back(r);
  }
  double fma_rate = measure_fma_rate(threads);
  if (fma_rate > 0) {
    BenchRow r;
    r.path = "compute_ceiling";
    r.gbps = 0.0;
    r.matrix_fraction = 1.0;
    char buf[160];
    std::snprintf(buf, sizeof buf, "f32 FMA rate %.1f G multiply-adds/s (%s, %d threads)", fma_rate / 1e9,
                  cpu_isa_name(active_cpu_isa()), threads);
    r.note = buf;
    rows.push_back(r);
  }
  const size_t ceiling_row = 0, fma_row = fma_rate > 0 ? 1 : 0;

  // The half-precision dense baselines OpenBLAS offers, or why not.
  const Bf16Blas bf16 = find_bf16_blas();
  const std::string blas = openblas_get_config();
  if (!bf16.available()) {
    BenchRow r;
    r.path = "dense_bf16";
    r.measured = false;
    r.note = "n/a: the OpenBLAS loaded (" + blas +
             ") does not export cblas_sbgemv / cblas_sbgemm (built without BUILD_BFLOAT16)";
    rows.push_back(r);
  }
  {
    BenchRow r;
    r.path = "dense_f16";
    r.measured = false;
    r.note = "n/a: OpenBLAS has no f16 GEMV / GEMM (" + blas +
             "); converting the table to f32 first would be the dense row's work plus a copy, not a baseline";
    rows.push_back(r);
  }

  Clock::time_point last_blas{};
  bool blas_ran = false;
  for (const BenchCase& c : cfg.cases) {
    const QuantScheme scheme = QuantScheme::parse(c.scheme, DType::kBF16);
    scheme.check_hidden(c.hidden, "bench", "--shape");
    const std::string shape = shape_name(c.vocab, c.hidden);
    const int64_t v = c.vocab, h = c.hidden;
    // The f32 table (kept for the dense path) and its quantized copies.
    Tensor dense = make_dense(v, h, threads);
    const size_t dense_bytes = dense.nbytes();
    const Table packed0 = Table::packed(quantize_rtn(dense.view(), scheme, threads, shape));
    const size_t packed_bytes = packed0.nbytes();
    std::vector<Table> packed{packed0};
    const int n_packed = copies_for(packed_bytes, llc, 64);
    for (int i = 1; i < n_packed; ++i) packed.push_back(copy_packed(packed0));
    // Dense copies: as many as fit the same rule, but never more than 4 GB in all.
    auto dense_copies_for = [&](size_t bytes) {
      return copies_for(bytes, llc,
                        std::clamp<int>(static_cast<int>((int64_t{4} << 30) / static_cast<int64_t>(bytes)), 1, 64));
    };
    const int n_dense = dense_copies_for(dense_bytes);
    std::vector<Tensor> dense_copies;
    dense_copies.push_back(std::move(dense));
    for (int i = 1; i < n_dense; ++i) dense_copies.push_back(Tensor::copy_of(dense_copies[0].view()));
    // bf16 copies of the same table (rounded to nearest even), where OpenBLAS has bf16.
    std::vector<std::vector<uint16_t>> bf16_copies;
    const size_t bf16_bytes = dense_bytes / 2;
    if (bf16.available()) {
      bf16_copies.push_back(to_bf16(dense_copies[0].ptr<float>(), v * h));
      for (int i = 1; i < dense_copies_for(bf16_bytes); ++i) bf16_copies.push_back(bf16_copies[0]);
    }
    const std::string packed_note = residency_note(n_packed, packed_bytes, llc);
    const std::string dense_note = residency_note(n_dense, dense_bytes, llc);
    const std::string bf16_note =
        bf16.available() ? residency_note(static_cast<int>(bf16_copies.size()), bf16_bytes, llc) : std::string();
    const std::string fast = cpu::active_kernels() != nullptr && (scheme.bits == 4 || scheme.bits == 8) &&
                                     h % 32 == 0 && scheme.group_len(h) % 32 == 0
                                 ? std::string(cpu_isa_name(active_cpu_isa())) + " kernels"
                                 : std::string("REFERENCE path (no fused kernel for this case)");
    const bool int8 = cpu_int8_available() && (scheme.bits == 4 || scheme.bits == 8) && h % 32 == 0 &&
                      scheme.group_len(h) % 32 == 0;
    const int64_t k = std::min<int64_t>(cfg.k, v);

    // Per M: median seconds and CPU use of each path.
    struct Result {
      double t_fused = 0, t_topk = 0, t_int8 = 0, t_dense = 0, t_bf16 = 0, t_fallback = 0;
      double u_fused = 0, u_topk = 0, u_int8 = 0, u_dense = 0, u_bf16 = 0, u_fallback = 0;
      double t_gumbel = 0, t_nucleus = 0, t_topk50 = 0, u_gumbel = 0, u_nucleus = 0, u_topk50 = 0;
      double t_bf16_out = 0, u_bf16_out = 0;
      double int8_err = 0, int8_max = 0, bf16_err = 0, bf16_max = 0;
      int64_t int8_top1 = 0;
    };
    std::vector<Result> res(cfg.m.size());

    // The qhead paths of every M first, 300 ms after the last BLAS call of
    // the run (OpenBLAS worker threads spin for a while after each call).
    if (blas_ran) {
      const double wait = 0.3 - seconds_since(last_blas);
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
    for (size_t mi = 0; mi < cfg.m.size(); ++mi) {
      const int64_t m = cfg.m[mi];
      Result& r = res[mi];
      const Tensor x = make_x(m, h);
      Tensor out = Tensor::empty(DType::kF32, {m, v});
      Tensor vals = Tensor::empty(DType::kF32, {m, k}), ids = Tensor::empty(DType::kI32, {m, k}),
             lse = Tensor::empty(DType::kF32, {m});
      // Logits and top-k alternately: fused_topk / fused is a target ratio.
      std::tie(r.t_fused, r.t_topk) = time_median_pair(
          cfg.reps,
          [&](int i) { logits(packed[static_cast<size_t>(i) % packed.size()], x.view(), out.view()); },
          [&](int i) {
            topk(packed[static_cast<size_t>(i) % packed.size()], x.view(), k, vals.view(), ids.view(), lse.view());
          },
          &r.u_fused, &r.u_topk);
      // The same logits stored as bf16 (a torch model's head returns its activations' dtype).
      {
        Tensor out16 = Tensor::empty(DType::kBF16, {m, v});
        r.t_bf16_out = time_median(cfg.reps, [&](int i) {
          logits(packed[static_cast<size_t>(i) % packed.size()], x.view(), out16.view());
        }, &r.u_bf16_out);
      }
      // The sample op: full-vocabulary sampling at T = 1 (Gumbel-max fused
      // into the logits pass) and T = 0.7 with top_p = 0.9 (the candidates'
      // top-k, then the draw), alternately.
      {
        Tensor sid = Tensor::empty(DType::kI32, {m});
        SampleParams full, nucleus;
        nucleus.temperature = 0.7f;
        nucleus.top_p = 0.9f;
        std::tie(r.t_gumbel, r.t_nucleus) = time_median_pair(
            cfg.reps,
            [&](int i) {
              full.offset = static_cast<uint64_t>(i);
              sample(packed[static_cast<size_t>(i) % packed.size()], x.view(), full, sid.view());
            },
            [&](int i) {
              nucleus.offset = static_cast<uint64_t>(i);
              sample(packed[static_cast<size_t>(i) % packed.size()], x.view(), nucleus, sid.view());
            },
            &r.u_gumbel, &r.u_nucleus);
        SampleParams top50;
        top50.top_k = std::min<int64_t>(50, v);
        r.t_topk50 = time_median(cfg.reps, [&](int i) {
          top50.offset = static_cast<uint64_t>(i);
          sample(packed[static_cast<size_t>(i) % packed.size()], x.view(), top50, sid.view());
        }, &r.u_topk50);
      }
      // The opt-in int8-activation mode, and its difference from the exact
      // fused path on the first copy.
      if (int8) {
        Tensor exact = Tensor::empty(DType::kF32, {m, v});
        logits(packed[0], x.view(), exact.view());
        set_cpu_activations(CpuActivations::kInt8);
        try {
          r.t_int8 = time_median(cfg.reps, [&](int i) {
            logits(packed[static_cast<size_t>(i) % packed.size()], x.view(), out.view());
          }, &r.u_int8);
          logits(packed[0], x.view(), out.view());
        } catch (...) {
          set_cpu_activations(CpuActivations::kExact);
          throw;
        }
        set_cpu_activations(CpuActivations::kExact);
        for (int64_t i = 0; i < m; ++i) {
          const float* e = exact.ptr<float>() + i * v;
          const float* q = out.ptr<float>() + i * v;
          for (int64_t j = 0; j < v; ++j) {
            r.int8_err = std::max(r.int8_err, static_cast<double>(std::fabs(q[j] - e[j])));
            r.int8_max = std::max(r.int8_max, static_cast<double>(std::fabs(e[j])));
          }
          if (std::max_element(e, e + v) - e == std::max_element(q, q + v) - q) ++r.int8_top1;
        }
      }
    }
    // Then the BLAS paths of every M.
    for (size_t mi = 0; mi < cfg.m.size(); ++mi) {
      const int64_t m = cfg.m[mi];
      Result& r = res[mi];
      const Tensor x = make_x(m, h);
      Tensor out = Tensor::empty(DType::kF32, {m, v});
      const int iv = static_cast<int>(v), ih = static_cast<int>(h), im = static_cast<int>(m);
      r.t_dense = time_median(cfg.reps, [&](int i) {
        const float* w = dense_copies[static_cast<size_t>(i) % dense_copies.size()].ptr<float>();
        if (m == 1)
          cblas_sgemv(CblasRowMajor, CblasNoTrans, iv, ih, 1.0f, w, ih, x.ptr<float>(), 1, 0.0f, out.ptr<float>(), 1);
        else
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, im, iv, ih, 1.0f, x.ptr<float>(), ih, w, ih, 0.0f,
                      out.ptr<float>(), iv);
      }, &r.u_dense);
      if (bf16.available()) {
        // The f32 dense logits (every copy holds the same values): the bf16
        // row shows its largest difference from them.
        const Tensor ref = Tensor::copy_of(out.view());
        const std::vector<uint16_t> xb = to_bf16(x.ptr<float>(), m * h);
        auto call = [&](int i) {
          const uint16_t* w = bf16_copies[static_cast<size_t>(i) % bf16_copies.size()].data();
          if (m == 1)
            bf16.gemv(CblasRowMajor, CblasNoTrans, iv, ih, 1.0f, w, ih, xb.data(), 1, 0.0f, out.ptr<float>(), 1);
          else
            bf16.gemm(CblasRowMajor, CblasNoTrans, CblasTrans, im, iv, ih, 1.0f, xb.data(), ih, w, ih, 0.0f,
                      out.ptr<float>(), iv);
        };
        r.t_bf16 = time_median(cfg.reps, call, &r.u_bf16);
        for (int64_t i = 0; i < m * v; ++i) {
          r.bf16_err = std::max(r.bf16_err, static_cast<double>(std::fabs(out.ptr<float>()[i] - ref.ptr<float>()[i])));
          r.bf16_max = std::max(r.bf16_max, static_cast<double>(std::fabs(ref.ptr<float>()[i])));
        }
      }
      r.t_fallback = time_median(cfg.reps, [&](int i) {
        logits_fallback(packed[static_cast<size_t>(i) % packed.size()], x.view(), out.view());
      }, &r.u_fallback);
      last_blas = Clock::now();
      blas_ran = true;
    }

    // The rows, per M: dense, dense_bf16, fallback, fused, fused_act_out, fused_topk, fused_int8.
    for (size_t mi = 0; mi < cfg.m.size(); ++mi) {
      const int64_t m = cfg.m[mi];
      const Result& q = res[mi];
      const double macs = static_cast<double>(m) * static_cast<double>(v) * static_cast<double>(h);
      auto row = [&](const char* path, double s, size_t bytes, double util, const std::string& note) {
        BenchRow r;
        r.shape = shape;
        r.scheme = c.scheme;
        r.m = m;
        r.path = path;
        r.us_median = s * 1e6;
        r.gbps = static_cast<double>(bytes) / s / 1e9;
        r.speedup_vs_dense = q.t_dense / s;
        if (fma_rate > 0) r.matrix_fraction = macs / s;  // divided by the run's largest FMA rate at the end
        char u[64];
        std::snprintf(u, sizeof u, "; cpu %.2f of %d threads", util, threads);
        r.note = note + u;
        return r;
      };
      rows.push_back(row("dense", q.t_dense, dense_bytes, q.u_dense,
                         std::string(m == 1 ? "OpenBLAS sgemv" : "OpenBLAS sgemm") + " on the f32 table; " + dense_note));
      if (bf16.available()) {
        char buf[160];
        std::snprintf(buf, sizeof buf, " on a bf16 copy, bf16 x, f32 out: max |logit - dense| = %.3g (%.2g of max |logit|); ",
                      q.bf16_err, q.bf16_max > 0 ? q.bf16_err / q.bf16_max : 0.0);
        rows.push_back(row("dense_bf16", q.t_bf16, bf16_bytes, q.u_bf16,
                           std::string(m == 1 ? "OpenBLAS sbgemv" : "OpenBLAS sbgemm") + buf + bf16_note));
      }
      rows.push_back(row("fallback", q.t_fallback, packed_bytes, q.u_fallback,
                         "dequantize to f32 + OpenBLAS; " + packed_note));
      rows.push_back(row("fused", q.t_fused, packed_bytes, q.u_fused, fast + "; " + packed_note));
      rows.push_back(row("fused_act_out", q.t_bf16_out, packed_bytes, q.u_bf16_out,
                         fast + ", logits stored as bf16 (rounded to nearest even per block of vocab rows); " +
                             packed_note));
      rows.push_back(row("fused_topk", q.t_topk, packed_bytes, q.u_topk,
                         fast + ", k = " + std::to_string(k) + "; " + packed_note));
      rows.push_back(row("sample", q.t_gumbel, packed_bytes, q.u_gumbel,
                         fast + ", qhead::sample T = 1 over the whole vocab (Gumbel-max in the logits pass); " +
                             packed_note));
      rows.push_back(row("sample_top_k", q.t_topk50, packed_bytes, q.u_topk50,
                         fast + ", qhead::sample T = 1, top_k = 50 (the fused top-k, then the draw); " + packed_note));
      rows.push_back(row("sample_top_p", q.t_nucleus, packed_bytes, q.u_nucleus,
                         fast + ", qhead::sample T = 0.7, top_p = 0.9 (top-1024 candidates, then the draw; rows whose "
                                "cut lies past them from their whole row); " + packed_note));
      if (int8) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%s kernels, int8 activations (opt-in, per-32 block scales, %s dot): max |logit - fused| = %.3g "
                      "(%.2g of max |logit| %.3g), top-1 id same in %lld of %lld rows; %s",
                      cpu_isa_name(active_cpu_isa()), cpu::int8_dot() == cpu::Int8Dot::kVnni ? "VNNI vpdpbusd" : "vpmaddubsw + vpmaddwd", q.int8_err, q.int8_max > 0 ? q.int8_err / q.int8_max : 0.0,
                      q.int8_max, static_cast<long long>(q.int8_top1), static_cast<long long>(m), packed_note.c_str());
        BenchRow r = row("fused_int8", q.t_int8, packed_bytes, q.u_int8, buf);
        r.max_abs_err = q.int8_err;
        r.max_abs_logit = q.int8_max;
        rows.push_back(r);
      }
    }
    // Measure the ceilings again (the case's tables are still allocated: the
    // read buffer is separate).
    double us = 0.0;
    std::string how;
    const double bw_now = measure_read_gbps(threads, read_bytes, &us, &how);
    if (bw_now > bw) {
      bw = bw_now;
      ceil_us = us;
      ceil_how = how;
    }
    fma_rate = std::max(fma_rate, measure_fma_rate(threads));
    ++n_ceiling;
  }
  // Final fractions against the largest ceilings of the run.
  for (auto& r : rows) {
    if (r.path == "ceiling" || r.path == "compute_ceiling" || !r.measured) continue;
    r.bw_fraction = r.gbps / bw;
    if (r.matrix_fraction) r.matrix_fraction = *r.matrix_fraction / fma_rate;  // was multiply-adds per second
  }
  rows[ceiling_row].gbps = bw;
  rows[ceiling_row].us_median = ceil_us;
  rows[ceiling_row].note += "; the largest of " + std::to_string(n_ceiling) + " measurements in this run (" + ceil_how + ")";
  if (fma_row) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "f32 FMA rate %.1f G multiply-adds/s (%s, %d threads; the largest of %d measurements)",
                  fma_rate / 1e9, cpu_isa_name(active_cpu_isa()), threads, n_ceiling);
    rows[fma_row].note = buf;
  }
  return rows;
}

DeviceFacts describe_cpu(int threads) {
  return {{"isa", cpu_isa_name(active_cpu_isa())}, {"threads", std::to_string(threads)}};
}

}  // namespace qhead::bench
