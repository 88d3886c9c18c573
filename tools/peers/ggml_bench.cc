// ggml_bench: times ggml's CPU mul_mat as an LM head, logits = W x, on the
// shapes, M and thread count of `qhead bench --device cpu`, so the two can be
// compared row by row (scripts/bench_llamacpp.sh runs both).
//
// For each shape VxH, ggml type and M:
//   W  [ne0 = H, ne1 = V] of the type: seeded uniform [-1, 1) f32 values,
//      quantized by ggml_quantize_chunk (no importance matrix);
//   x  [ne0 = H, ne1 = M] f32;
//   y = ggml_mul_mat(W, x)  [ne0 = V, ne1 = M] f32, on the CPU backend, N
//      threads, in two layouts of W, one row each:
//   "plain":    W as ggml allocates it in a CPU context (block rows in order;
//               ggml_graph_plan + ggml_graph_compute);
//   "repacked": W allocated in the CPU backend's extra buffer type that
//               llama.cpp would pick for this mul_mat (the first of
//               ggml_backend_dev_get_extra_bufts whose supports_op takes it,
//               usually CPU_REPACK), and set with ggml_backend_tensor_set, which
//               repacks it into the interleaved format (q4_0 / q4_K / iq4_nl
//               8x8 on AVX2); computed with ggml_backend_cpu_init +
//               ggml_backend_graph_compute, which dispatch to that buffer
//               type's GEMV / GEMM. This is what llama.cpp runs by default for
//               such a weight on the CPU. A (type, shape) no extra buffer type
//               takes gets a "repacked" row saying so, untimed.
//
// Check before timing, in both layouts: y against a float64 product of ggml's
// own dequantization of the plain W (type traits' to_float) and the f32 x. For
// the quantized types ggml quantizes x to its vec_dot type (q8_0, q8_K) inside
// mul_mat, so the check is relative: max |y - ref| / max |ref| <= 2e-2. A row
// that fails is not timed and the tool exits 1.
//
// Timing: copies of W whose bytes total >= 2x the last-level cache (so every
// call reads W from memory; repacked copies each in their own buffer), one
// graph per copy built once, 2 warm-up calls, then timed calls rotating over
// the copies, steady clock, median reported.
// --reps N: N timed calls; default: at least 5, about 1 s, at most 50.
//
// Usage: ggml_bench [--shape VxH[,..]] [--type q4_0,q4_K,q8_0,f16,iq4_nl] [--m 1,8]
//                   [--threads N] [--reps N] [--json]

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

struct Shape {
  int64_t V;  // vocab rows of W (output logits)
  int64_t H;  // hidden size (dot length)
};

struct Config {
  std::vector<Shape> shapes;
  std::vector<ggml_type> types;
  std::vector<int64_t> ms;
  int threads = 0;
  int reps = 0;  // 0: auto
  bool json = false;
};

// One output row: a timed (shape, type, m) or a skipped / failed one.
struct Row {
  std::string shape, type;
  std::string layout;         // "plain" or "repacked"
  std::string buffer_type;    // repacked rows: the extra buffer type's name
  std::string repack_format;  // repacked rows: the interleaved format CPU_REPACK logged, e.g. q4_0_8x8
  int64_t m = 0;
  int threads = 0;
  double us_median = 0, gbps = 0;
  size_t weight_bytes = 0;
  int copies = 0, reps = 0;
  double check_max_rel_err = -1;
  bool check_ok = false;
  std::string skipped;  // non-empty: not timed, and why
};

constexpr double kTolerance = 2e-2;
constexpr uint64_t kSeed = 0x9E3779B97F4A7C15ull;

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "ggml_bench: %s\n", msg.c_str());
  std::fprintf(stderr,
               "usage: ggml_bench [--shape VxH[,..]] [--type q4_0,q4_K,q8_0,f16,iq4_nl] [--m 1,8] [--threads N] "
               "[--reps N] [--json]\n");
  std::exit(2);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    std::string piece = s.substr(start, pos == std::string::npos ? std::string::npos : pos - start);
    if (!piece.empty()) out.push_back(piece);
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

int64_t parse_int(const std::string& s, const char* what, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi)
    usage_error(std::string(what) + " '" + s + "' must be an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "]");
  return v;
}

ggml_type parse_type(const std::string& s) {
  if (s == "q4_0") return GGML_TYPE_Q4_0;
  if (s == "q4_K") return GGML_TYPE_Q4_K;
  if (s == "q8_0") return GGML_TYPE_Q8_0;
  if (s == "f16") return GGML_TYPE_F16;
  if (s == "iq4_nl") return GGML_TYPE_IQ4_NL;
  usage_error("--type '" + s + "': expected q4_0, q4_K, q8_0, f16 or iq4_nl");
}

Config parse_args(int argc, char** argv) {
  Config cfg;
  std::string shapes = "151936x1024,50304x512,128256x4096,262144x640";
  std::string types = "q4_0,q4_K,q8_0,f16";
  std::string ms = "1,8";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--shape") shapes = value();
    else if (a == "--type") types = value();
    else if (a == "--m") ms = value();
    else if (a == "--threads") cfg.threads = static_cast<int>(parse_int(value(), "--threads", 1, 1024));
    else if (a == "--reps") cfg.reps = static_cast<int>(parse_int(value(), "--reps", 1, 1000000));
    else if (a == "--json") cfg.json = true;
    else if (a == "-h" || a == "--help") {
      std::printf(
          "ggml_bench: time ggml's CPU mul_mat (logits = W x) per shape, type and M, checked first against a "
          "float64 reference on ggml's dequantized W\n"
          "  --shape VxH[,..]   default 151936x1024,50304x512,128256x4096,262144x640\n"
          "  --type  LIST       of q4_0,q4_K,q8_0,f16,iq4_nl (default q4_0,q4_K,q8_0,f16)\n"
          "  --m     LIST       activation rows per call (default 1,8)\n"
          "  --threads N        default: all cores\n"
          "  --reps N           timed calls (default: at least 5, about 1 s, at most 50)\n"
          "  --json             a JSON array, one object per (shape, type, layout, m)\n");
      std::exit(0);
    } else usage_error("unknown argument '" + a + "'");
  }
  for (const std::string& s : split(shapes, ',')) {
    const size_t x = s.find('x');
    if (x == std::string::npos) usage_error("--shape '" + s + "' must be VxH, e.g. 151936x1024");
    const Shape sh{parse_int(s.substr(0, x), "--shape V", 1, int64_t{1} << 31),
                   parse_int(s.substr(x + 1), "--shape H", 1, int64_t{1} << 20)};
    bool dup = false;
    for (const Shape& o : cfg.shapes) dup |= (o.V == sh.V && o.H == sh.H);
    if (!dup) cfg.shapes.push_back(sh);
  }
  for (const std::string& t : split(types, ',')) cfg.types.push_back(parse_type(t));
  for (const std::string& m : split(ms, ',')) cfg.ms.push_back(parse_int(m, "--m", 1, 65536));
  if (cfg.shapes.empty() || cfg.types.empty() || cfg.ms.empty()) usage_error("empty --shape, --type or --m");
  if (cfg.threads == 0) cfg.threads = std::max(1u, std::thread::hardware_concurrency());
  return cfg;
}

// Last-level cache size: the largest level-3 cache of cpu0 in sysfs, else 32 MiB.
int64_t llc_bytes() {
  int64_t best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::ifstream level(dir + "/level"), size(dir + "/size");
    int lv = 0;
    std::string sz;
    if (!(level >> lv) || !(size >> sz) || lv != 3) continue;
    char* end = nullptr;
    int64_t v = std::strtoll(sz.c_str(), &end, 10);
    if (*end == 'K') v <<= 10;
    else if (*end == 'M') v <<= 20;
    else if (*end == 'G') v <<= 30;
    best = std::max(best, v);
  }
  return best > 0 ? best : int64_t{32} << 20;
}

// Deterministic uniform [-1, 1) values: splitmix64 of (seed, stream, index),
// so any split of the work over threads gives the same numbers.
inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
void fill_uniform(float* dst, int64_t n, uint64_t stream) {
  uint64_t s = splitmix64(kSeed ^ splitmix64(stream));
  for (int64_t i = 0; i < n; ++i) {
    s = splitmix64(s);
    dst[i] = static_cast<float>(static_cast<double>(s >> 40) * 0x1p-23 - 1.0);  // 24 bits in [-1, 1)
  }
}

// Runs body(lo, hi) over [0, n) split into `threads` contiguous ranges.
template <class F>
void parallel_rows(int64_t n, int threads, F&& body) {
  const int t = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::vector<std::thread> pool;
  for (int i = 0; i < t; ++i) {
    const int64_t lo = n * i / t, hi = n * (i + 1) / t;
    pool.emplace_back([&body, lo, hi] { body(lo, hi); });
  }
  for (std::thread& th : pool) th.join();
}

// Why ggml cannot take this (type, H), or "" if it can.
std::string unsupported(ggml_type type, int64_t H) {
  const int64_t blck = ggml_blck_size(type);
  if (H % blck != 0)
    return std::string(ggml_type_name(type)) + " needs H a multiple of " + std::to_string(blck) + ", H = " +
           std::to_string(H);
  if (ggml_quantize_requires_imatrix(type)) return std::string(ggml_type_name(type)) + " needs an importance matrix";
  return "";
}

struct Ctx {
  ggml_context* ctx = nullptr;
  explicit Ctx(size_t bytes) {
    ggml_init_params p{bytes, nullptr, false};
    ctx = ggml_init(p);
    if (!ctx) {
      std::fprintf(stderr, "ggml_bench: ggml_init(%zu bytes) failed\n", bytes);
      std::exit(1);
    }
  }
  ~Ctx() { ggml_free(ctx); }
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;
};

// One timed graph: y = mul_mat(W copy, x). Plain W: computed with its own plan
// and work buffer; W in an extra buffer type: through the CPU backend.
struct Graph {
  ggml_cgraph* graph = nullptr;
  ggml_tensor* y = nullptr;
  ggml_cplan plan{};
  std::vector<uint8_t> work;
  ggml_backend_t backend = nullptr;  // non-null: ggml_backend_graph_compute
  void compute() {
    const ggml_status st = backend ? ggml_backend_graph_compute(backend, graph) : ggml_graph_compute(graph, &plan);
    if (st != GGML_STATUS_SUCCESS) {
      std::fprintf(stderr, "ggml_bench: %s failed (status %d)\n",
                   backend ? "ggml_backend_graph_compute" : "ggml_graph_compute", static_cast<int>(st));
      std::exit(1);
    }
  }
};

// The CPU device and backend, and the device's extra buffer types in the order
// llama.cpp tries them for a weight before the plain CPU buffer type.
struct CpuBackend {
  ggml_backend_dev_t dev = nullptr;
  ggml_backend_t backend = nullptr;
  std::vector<ggml_backend_buffer_type_t> extra;
  explicit CpuBackend(int threads) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    dev = ggml_backend_reg_dev_get(reg, 0);
    backend = ggml_backend_cpu_init();
    if (!dev || !backend) {
      std::fprintf(stderr, "ggml_bench: ggml_backend_cpu_init failed\n");
      std::exit(1);
    }
    ggml_backend_cpu_set_n_threads(backend, threads);
    auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    if (get_extra)
      for (ggml_backend_buffer_type_t* p = get_extra(dev); p && *p; ++p) extra.push_back(*p);
  }
  ~CpuBackend() { ggml_backend_free(backend); }
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;
};

// The extra buffer type llama.cpp would put W [type, ne0 = H, ne1 = V] in for a
// mul_mat: the first whose device supports_op takes mul_mat(W, x f32 [H, 512])
// with W in a zero-size buffer of it (llama-model-loader's weight_buft_supported).
// Null if none, with *why saying so.
ggml_backend_buffer_type_t pick_extra_buft(const CpuBackend& cpu, ggml_type type, const Shape& s, std::string* why) {
  if (cpu.extra.empty()) {
    *why = "this ggml build has no CPU extra buffer type (GGML_CPU_REPACK off?)";
    return nullptr;
  }
  for (ggml_backend_buffer_type_t buft : cpu.extra) {
    ggml_init_params p{4 * ggml_tensor_overhead(), nullptr, true};
    ggml_context* ctx = ggml_init(p);
    if (!ctx) break;
    ggml_tensor* w = ggml_new_tensor_2d(ctx, type, s.H, s.V);
    ggml_tensor* op = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, s.H, 512));
    w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
    const bool ok = w->buffer && ggml_backend_dev_supports_op(cpu.dev, op);
    if (w->buffer) ggml_backend_buffer_free(w->buffer);
    ggml_free(ctx);
    if (ok) return buft;
  }
  std::string names;
  for (ggml_backend_buffer_type_t buft : cpu.extra) names += (names.empty() ? "" : ", ") + std::string(ggml_backend_buft_name(buft));
  *why = "no CPU extra buffer type (" + names + ") takes mul_mat of " + ggml_type_name(type) + " [" +
         std::to_string(s.V) + " x " + std::to_string(s.H) + "] on this CPU";
  return nullptr;
}

// ggml's log: CPU_REPACK reports the format it converts a tensor to at debug
// level ("repack: repack tensor <name> with q4_0_8x8"); that is kept in
// g_repack_format, other debug lines are dropped, the rest go to stderr.
std::string g_repack_format;
void log_callback(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_DEBUG) {
    const char* with = std::strstr(text, "repack tensor ") ? std::strstr(text, " with ") : nullptr;
    if (with) {
      g_repack_format = with + 6;
      while (!g_repack_format.empty() && std::isspace(static_cast<unsigned char>(g_repack_format.back())))
        g_repack_format.pop_back();
    }
    return;
  }
  std::fputs(text, stderr);
}

// One copy of W in its own buffer of an extra buffer type.
struct BufferW {
  ggml_context* ctx = nullptr;
  ggml_backend_buffer_t buf = nullptr;
  ggml_tensor* t = nullptr;
  ~BufferW() {
    if (buf) ggml_backend_buffer_free(buf);
    if (ctx) ggml_free(ctx);
  }
};

// max |y - ref| / max |ref|, ref = float64 (dequantized W) x, x f32 [M, H].
double check_error(const ggml_tensor* w, const std::vector<float>& x, const float* y, int64_t V, int64_t H,
                   int64_t M, int threads) {
  const ggml_to_float_t to_float = ggml_get_type_traits(w->type)->to_float;
  const size_t row_bytes = ggml_row_size(w->type, H);
  std::vector<double> max_err(threads, 0.0), max_ref(threads, 0.0);
  const int t = static_cast<int>(std::min<int64_t>(threads, V));
  std::vector<std::thread> pool;
  for (int i = 0; i < t; ++i) {
    pool.emplace_back([&, i] {
      std::vector<float> row(H);
      for (int64_t v = V * i / t; v < V * (i + 1) / t; ++v) {
        to_float(static_cast<const uint8_t*>(w->data) + v * row_bytes, row.data(), H);
        for (int64_t m = 0; m < M; ++m) {
          const float* xm = x.data() + m * H;
          double acc = 0;
          for (int64_t h = 0; h < H; ++h) acc += static_cast<double>(row[h]) * xm[h];
          max_ref[i] = std::max(max_ref[i], std::fabs(acc));
          const double e = std::fabs(static_cast<double>(y[m * V + v]) - acc);
          max_err[i] = std::isfinite(e) ? std::max(max_err[i], e) : HUGE_VAL;  // NaN (unwritten) fails
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  const double err = *std::max_element(max_err.begin(), max_err.end());
  const double ref = *std::max_element(max_ref.begin(), max_ref.end());
  return ref > 0 ? err / ref : err;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One M of one layout: one graph per copy of W (w), checks copy 0's output
// (NaN-poisoned first) against the float64 reference on the plain W (w_plain),
// then times calls rotating over the copies; appends r, filled in.
void bench_m(const Config& cfg, const Shape& s, int64_t M, const ggml_tensor* w_plain,
             const std::vector<ggml_tensor*>& w, ggml_backend_t backend, Row r, std::vector<Row>& rows) {
  const int copies = static_cast<int>(w.size());
  std::vector<float> x(static_cast<size_t>(M * s.H));
  fill_uniform(x.data(), M * s.H, ~uint64_t{0} - static_cast<uint64_t>(M));

  const size_t y_bytes = static_cast<size_t>(s.V * M) * sizeof(float);
  const size_t per_graph = ggml_graph_overhead_custom(4, false) + ggml_tensor_overhead() + y_bytes + 1024;
  Ctx gctx(copies * per_graph + ggml_tensor_overhead() + x.size() * sizeof(float) + 1024);
  ggml_tensor* xt = ggml_new_tensor_2d(gctx.ctx, GGML_TYPE_F32, s.H, M);
  std::memcpy(xt->data, x.data(), x.size() * sizeof(float));
  std::vector<Graph> graphs(copies);
  for (int c = 0; c < copies; ++c) {
    Graph& g = graphs[c];
    g.y = ggml_mul_mat(gctx.ctx, w[c], xt);
    g.graph = ggml_new_graph_custom(gctx.ctx, 4, false);
    ggml_build_forward_expand(g.graph, g.y);
    g.backend = backend;
    if (!backend) {
      g.plan = ggml_graph_plan(g.graph, cfg.threads, nullptr);
      g.work.resize(g.plan.work_size);
      g.plan.work_data = g.work.empty() ? nullptr : g.work.data();
    }
  }

  // Checking every copy's graph would be redundant (same values); check copy 0.
  std::fill_n(static_cast<float*>(graphs[0].y->data), s.V * M, std::nanf(""));
  graphs[0].compute();
  r.check_max_rel_err = check_error(w_plain, x, static_cast<const float*>(graphs[0].y->data), s.V, s.H, M, cfg.threads);
  r.check_ok = std::isfinite(r.check_max_rel_err) && r.check_max_rel_err <= kTolerance;
  if (!r.check_ok) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "check failed: max rel err %.3g > %.0e", r.check_max_rel_err, kTolerance);
    r.skipped = buf;
    rows.push_back(r);
    return;
  }

  for (int i = 0; i < 2; ++i) graphs[i % copies].compute();  // warm-up
  std::vector<double> us;
  double total = 0;
  for (int i = 0;; ++i) {
    Graph& g = graphs[i % copies];
    const auto t0 = std::chrono::steady_clock::now();
    g.compute();
    const auto t1 = std::chrono::steady_clock::now();
    const double sec = std::chrono::duration<double>(t1 - t0).count();
    us.push_back(sec * 1e6);
    total += sec;
    const int done = i + 1;
    if (cfg.reps > 0 ? done >= cfg.reps : (done >= 5 && (total > 1.0 || done >= 50))) break;
  }
  r.reps = static_cast<int>(us.size());
  r.us_median = median(us);
  r.gbps = static_cast<double>(r.weight_bytes) / (r.us_median * 1e-6) / 1e9;
  rows.push_back(r);
}

// Benchmarks one (shape, type) over every M, plain then repacked; appends one
// row per (layout, M).
void bench_shape_type(const Config& cfg, const CpuBackend& cpu, const Shape& s, ggml_type type, int64_t llc,
                      std::vector<Row>& rows) {
  const std::string shape = std::to_string(s.V) + "x" + std::to_string(s.H);
  auto row = [&](const char* layout, int64_t m) {
    Row r;
    r.shape = shape, r.type = ggml_type_name(type), r.layout = layout, r.m = m, r.threads = cfg.threads;
    return r;
  };
  const std::string why = unsupported(type, s.H);
  if (!why.empty()) {
    for (const char* layout : {"plain", "repacked"})
      for (int64_t m : cfg.ms) {
        Row r = row(layout, m);
        r.skipped = why;
        rows.push_back(r);
      }
    return;
  }
  const size_t row_bytes = ggml_row_size(type, s.H);
  const size_t w_bytes = row_bytes * static_cast<size_t>(s.V);
  const int copies = static_cast<int>(std::min<int64_t>(64, std::max<int64_t>(1, (2 * llc + w_bytes - 1) / w_bytes)));

  // Plain W: quantized once into copy 0, then duplicated (distinct addresses, same values).
  std::vector<std::unique_ptr<Ctx>> wctx;
  std::vector<ggml_tensor*> w;
  for (int c = 0; c < copies; ++c) {
    wctx.push_back(std::make_unique<Ctx>(w_bytes + ggml_tensor_overhead() + 1024));
    w.push_back(ggml_new_tensor_2d(wctx.back()->ctx, type, s.H, s.V));
  }
  ggml_quantize_init(type);
  parallel_rows(s.V, cfg.threads, [&](int64_t lo, int64_t hi) {
    constexpr int64_t kChunk = 64;  // rows per ggml_quantize_chunk call
    std::vector<float> src(kChunk * s.H);
    for (int64_t r0 = lo; r0 < hi; r0 += kChunk) {
      const int64_t n = std::min(kChunk, hi - r0);
      for (int64_t r = 0; r < n; ++r) fill_uniform(src.data() + r * s.H, s.H, static_cast<uint64_t>(r0 + r));
      // start is an element offset into dst; src is this chunk only, so offset dst instead.
      ggml_quantize_chunk(type, src.data(), static_cast<uint8_t*>(w[0]->data) + r0 * row_bytes, 0, n, s.H, nullptr);
    }
    for (int c = 1; c < copies; ++c)
      std::memcpy(static_cast<uint8_t*>(w[c]->data) + lo * row_bytes,
                  static_cast<const uint8_t*>(w[0]->data) + lo * row_bytes, (hi - lo) * row_bytes);
  });

  for (int64_t M : cfg.ms) {
    Row r = row("plain", M);
    r.weight_bytes = w_bytes, r.copies = copies;
    bench_m(cfg, s, M, w[0], w, nullptr, r, rows);
  }

  // Repacked W: each copy in its own buffer of the extra buffer type;
  // ggml_backend_tensor_set of the plain bytes converts them.
  std::string why_r;
  ggml_backend_buffer_type_t buft = pick_extra_buft(cpu, type, s, &why_r);
  std::string repack_format;
  std::vector<std::unique_ptr<BufferW>> bw;
  std::vector<ggml_tensor*> wr;
  for (int c = 0; buft && c < copies; ++c) {
    auto b = std::make_unique<BufferW>();
    ggml_init_params p{ggml_tensor_overhead() + 1024, nullptr, true};
    b->ctx = ggml_init(p);
    if (!b->ctx) {
      why_r = "ggml_init failed";
      break;
    }
    b->t = ggml_new_tensor_2d(b->ctx, type, s.H, s.V);
    b->buf = ggml_backend_alloc_ctx_tensors_from_buft(b->ctx, buft);
    if (!b->buf) {
      why_r = "allocating " + std::to_string(w_bytes) + " bytes of " + ggml_backend_buft_name(buft) + " failed";
      break;
    }
    ggml_backend_buffer_set_usage(b->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    // CPU_REPACK's init_tensor leaves extra null when it has no format for the
    // tensor, and its set_tensor would then fault: do not call it.
    if (std::strcmp(ggml_backend_buft_name(buft), "CPU_REPACK") == 0 && b->t->extra == nullptr) {
      why_r = "CPU_REPACK chose no repacked format for this tensor";
      break;
    }
    g_repack_format.clear();
    ggml_backend_tensor_set(b->t, w[0]->data, 0, w_bytes);
    repack_format = g_repack_format;
    wr.push_back(b->t);
    bw.push_back(std::move(b));
  }
  for (int64_t M : cfg.ms) {
    Row r = row("repacked", M);
    if (!buft || static_cast<int>(wr.size()) != copies) {
      r.skipped = why_r;
      rows.push_back(r);
      continue;
    }
    r.buffer_type = ggml_backend_buft_name(buft), r.repack_format = repack_format;
    r.weight_bytes = ggml_backend_buffer_get_size(bw[0]->buf), r.copies = copies;
    bench_m(cfg, s, M, w[0], wr, cpu.backend, r, rows);
  }
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\', o += ch;
    else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      o += buf;
    } else o += ch;
  }
  return o;
}

void print_json(const std::vector<Row>& rows, int64_t llc) {
  std::printf("[\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("  {\"peer\":\"ggml\",\"ggml_version\":\"%s\",\"ggml_commit\":\"%s\",\"shape\":\"%s\",\"type\":\"%s\","
                "\"layout\":\"%s\",\"m\":%lld,\"threads\":%d",
                json_escape(ggml_version()).c_str(), json_escape(ggml_commit()).c_str(), r.shape.c_str(),
                r.type.c_str(), r.layout.c_str(), static_cast<long long>(r.m), r.threads);
    if (!r.buffer_type.empty()) std::printf(",\"buffer_type\":\"%s\"", json_escape(r.buffer_type).c_str());
    if (!r.repack_format.empty()) std::printf(",\"repack_format\":\"%s\"", json_escape(r.repack_format).c_str());
    if (r.weight_bytes) std::printf(",\"weight_bytes\":%zu,\"copies\":%d,\"llc_bytes\":%lld", r.weight_bytes, r.copies,
                                    static_cast<long long>(llc));
    if (r.check_max_rel_err >= 0 || std::isnan(r.check_max_rel_err))
      std::printf(",\"check_max_rel_err\":%.6g,\"check_ok\":%s",
                  std::isfinite(r.check_max_rel_err) ? r.check_max_rel_err : 1e300, r.check_ok ? "true" : "false");
    if (r.skipped.empty())
      std::printf(",\"us_median\":%.3f,\"gbps\":%.3f,\"reps\":%d", r.us_median, r.gbps, r.reps);
    else std::printf(",\"skipped\":\"%s\"", json_escape(r.skipped).c_str());
    std::printf("}%s\n", i + 1 < rows.size() ? "," : "");
  }
  std::printf("]\n");
}

void print_table(const std::vector<Row>& rows, int64_t llc) {
  std::printf("ggml %s (%s), CPU backend, LLC %lld MiB\n", ggml_version(), ggml_commit(),
              static_cast<long long>(llc >> 20));
  std::printf("%-13s %-6s %-8s %5s %4s %12s %8s %10s %6s %10s  %s\n", "shape", "type", "layout", "m", "thr",
              "us_median", "GB/s", "weight_MB", "copies", "check_err", "note");
  for (const Row& r : rows) {
    std::printf("%-13s %-6s %-8s %5lld %4d ", r.shape.c_str(), r.type.c_str(), r.layout.c_str(),
                static_cast<long long>(r.m), r.threads);
    if (r.skipped.empty())
      std::printf("%12.1f %8.2f %10.1f %6d %10.2e  %s\n", r.us_median, r.gbps, r.weight_bytes / 1e6, r.copies,
                  r.check_max_rel_err, (r.buffer_type + (r.repack_format.empty() ? "" : " " + r.repack_format)).c_str());
    else std::printf("%12s %8s %10s %6s %10s  %s\n", "-", "-", "-", "-", "-", r.skipped.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Config cfg = parse_args(argc, argv);
  ggml_log_set(log_callback, nullptr);
  ggml_cpu_init();
  const int64_t llc = llc_bytes();
  std::vector<Row> rows;
  {
    const CpuBackend cpu(cfg.threads);
    for (const Shape& s : cfg.shapes)
      for (ggml_type t : cfg.types) bench_shape_type(cfg, cpu, s, t, llc, rows);
  }
  if (cfg.json) print_json(rows, llc);
  else print_table(rows, llc);
  bool failed = false;
  for (const Row& r : rows)
    if (r.weight_bytes && !r.check_ok) {
      std::fprintf(stderr, "ggml_bench: %s %s %s m=%lld: %s\n", r.shape.c_str(), r.type.c_str(), r.layout.c_str(),
                   static_cast<long long>(r.m), r.skipped.c_str());
      failed = true;
    }
  ggml_quantize_free();
  return failed ? 1 : 0;
}
