// `qhead bench --device cuda`: every path a user has for the logits of a
// quantized head on the GPU, timed with CUDA events in one run, against
// ceilings measured in the same run:
//   copy    device-to-device copy bandwidth (bytes read + written)
//   read    a pure streaming read of exactly the packed table's bytes, 16-byte
//           loads, timed the same way as the kernels (the floor of a fused
//           GEMV): the fastest of a grid-stride, a contiguous-chunk and a
//           64 KiB-tile reader
//   matrix  cuBLAS dense f16 GEMM rate on a large square product
// Activations, scales and the dense table are f16, or bf16 with --act bf16
// (BenchConfig::act; the matrix ceiling stays f16, the same rate on Hopper).
// Paths: dense (cuBLAS GEMM on the unquantized f16/bf16 table), fallback
// (dequantize + cuBLAS), fused (Backend::kFused: the kernel the plan picks),
// fused_<kernel> (each other logits kernel that takes the shape, forced
// through LogitsOverrides: gemv_regring, gemv_staged, gemm_mma_sync,
// gemm_wgmma, gemm_wgmma_ws), fused_topk (qhead::topk kFused, k = 50, + lse:
// the fused epilogue where it applies), auto_topk (qhead::topk kAuto: the
// default path), tile_topk (tile select forced, where the default is another
// path and tile select takes the problem), logits_then_topk (logits into memory, then the separate
// slice selection and merge levels), sample / sample_top_k / sample_top_p (qhead::sample
// at T = 1 over the whole vocab, with top_k = 50, and at T = 0.7 with
// top_p = 0.9). Every row names the kernel that ran (`kernel`:
// the plan, src/cuda/plan.h).
// L2 (60 MB) is defeated by rotating among enough table copies that they
// total at least 4× the L2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "bench/bench.h"
#include "cuda/common.cuh"
#include "ops/ops_cuda.h"
#include "qhead/cuda.h"
#include "qhead/ops.h"

namespace qhead::bench {

using namespace qhead::cuda_detail;

namespace {

__global__ void fill_random_words(uint32_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    p[i] = uint32_t(x ^ (x >> 31));
  }
}

// Random values in [-1, 1)·amp as T (f16/bf16) — never zeros.
template <class T>
__global__ void fill_random_values(T* p, int64_t n, uint64_t seed, float amp) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    const float u = float((x ^ (x >> 31)) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = Act<T>::from_float((2.0f * u - 1.0f) * amp);
  }
}

// XOR of the 16-byte words p[i], p[i + step], … below `end`, four independent
// loads in flight: the body of the read-ceiling kernels (the XOR keeps the
// loads alive).
__device__ __forceinline__ uint32_t xor_words(const uint4* __restrict__ p, int64_t i, int64_t end, int64_t step) {
  uint32_t acc = 0;
  for (; i + 3 * step < end; i += 4 * step) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldg(p + i + u * step);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < end; i += step) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}
__device__ __forceinline__ void keep(uint32_t acc, uint32_t* sink) {
  if (acc == 0x12345678u) sink[0] = acc;  // practically never; prevents dead-code elimination
}

// The read ceiling: stream n16 16-byte words, three ways (each a pure read,
// no math beyond the XOR); the ceiling is the fastest. In a bench process
// that has allocated and freed earlier tables, the grid-stride reader
// measured up to 15 % slower on the larger tables than the same read alone
// (docs/tuning-notes.md, "The bench's ceilings and timing").
//   grid-stride: one thread's four loads lie a grid apart (megabytes);
__global__ void stream_read(const uint4* __restrict__ p, int64_t n16, uint32_t* sink) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  keep(xor_words(p, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, n16, stride), sink);
}
//   contiguous chunks: block b streams words [b·n16/G, (b+1)·n16/G);
__global__ void stream_read_chunks(const uint4* __restrict__ p, int64_t n16, uint32_t* sink) {
  const int64_t per = (n16 + gridDim.x - 1) / gridDim.x;
  const int64_t b0 = int64_t(blockIdx.x) * per, b1 = b0 + per < n16 ? b0 + per : n16;
  keep(xor_words(p, b0 + threadIdx.x, b1, blockDim.x), sink);
}
//   64 KiB tiles: in round i block b streams piece i·G + b, so the grid moves
//   through the buffer as one ~G·64 KiB window with each block on contiguous
//   lines, as the row-tiled GEMV kernels do.
__global__ void stream_read_tiles(const uint4* __restrict__ p, int64_t n16, uint32_t* sink) {
  constexpr int64_t kPiece = 4096;  // 16-byte words per piece (64 KiB)
  uint32_t acc = 0;
  for (int64_t piece = blockIdx.x; piece * kPiece < n16; piece += gridDim.x) {
    const int64_t b0 = piece * kPiece, b1 = b0 + kPiece < n16 ? b0 + kPiece : n16;
    acc ^= xor_words(p, b0 + threadIdx.x, b1, blockDim.x);
  }
  keep(acc, sink);
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { QHEAD_CUDA_CHECK(cudaEventCreate(&a)); QHEAD_CUDA_CHECK(cudaEventCreate(&b)); }
  ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
};

// The host side of the last median_us: the median µs that fn(i) itself took
// on the CPU (argument checks, dispatch, launches), which the event timing
// includes up to the first kernel's start.
double g_last_host_us = 0.0;

// Median µs of fn(i) over reps calls after warm-up; each call timed alone
// with a pair of events (the stream idle before each).
template <class F>
double median_us(F&& fn, int reps, int warmup = 3) {
  cudaStream_t s = current_stream();
  for (int i = 0; i < warmup; ++i) fn(i);
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t, h;
  Timer tm;
  for (int i = 0; i < reps; ++i) {
    QHEAD_CUDA_CHECK(cudaEventRecord(tm.a, s));
    const auto h0 = std::chrono::steady_clock::now();
    fn(i + warmup);
    h.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
    QHEAD_CUDA_CHECK(cudaEventRecord(tm.b, s));
    QHEAD_CUDA_CHECK(cudaEventSynchronize(tm.b));
    float ms = 0;
    QHEAD_CUDA_CHECK(cudaEventElapsedTime(&ms, tm.a, tm.b));
    t.push_back(ms * 1000.0);
  }
  std::sort(t.begin(), t.end());
  std::sort(h.begin(), h.end());
  g_last_host_us = h[h.size() / 2];
  return t[t.size() / 2];
}

// out[M, V] = x[M, H] · W[V, H]ᵀ, w and x of dtype t (f16 or bf16) → out in f32, or in t when
// `out_t`: the same cuBLAS call as the fallback.
void dense_gemm(const void* w, const void* x, DType t, void* out, int V, int H, int M, bool out_t = false) {
  const cudaDataType_t ct = t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  gemm_xwt(w, ct, x, ct, out, out_t ? ct : CUDA_R_32F, V, H, M, V);
}

int grid_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, int64_t(sm_count()) * 16)); }

// n random values in [-1, 1)·amp of dtype t (f16 or bf16) at p.
void fill_act(void* p, DType t, int64_t n, uint64_t seed, float amp, cudaStream_t s) {
  if (t == DType::kBF16)
    fill_random_values<__nv_bfloat16><<<grid_for(n), 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed, amp);
  else
    fill_random_values<__half><<<grid_for(n), 256, 0, s>>>(static_cast<__half*>(p), n, seed, amp);
}

}  // namespace

DeviceFacts describe_cuda() {
  int dev = 0, driver = 0, runtime = 0, clock_khz = 0, mem_clock_khz = 0;
  QHEAD_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  QHEAD_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  QHEAD_CUDA_CHECK(cudaDriverGetVersion(&driver));
  QHEAD_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  // Clocks as found (not locked): the SM and memory clocks the device reports.
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
  (void)cudaGetLastError();  // an attribute this runtime no longer reports stays 0
  auto ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  return {{"name", prop.name},
          {"compute_capability", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
          {"multiprocessors", std::to_string(prop.multiProcessorCount)},
          {"memory_gib", std::to_string(double(prop.totalGlobalMem) / double(1ull << 30))},
          {"l2_mib", std::to_string(prop.l2CacheSize >> 20)},
          {"driver", ver(driver)},
          {"runtime", ver(runtime)},
          {"sm_clock_mhz", clock_khz ? std::to_string(clock_khz / 1000) : "unknown"},
          {"memory_clock_mhz", mem_clock_khz ? std::to_string(mem_clock_khz / 1000) : "unknown"}};
}

std::vector<BenchRow> run_cuda_bench(const BenchConfig& cfg) {
  if (!cuda::available()) throw Error(ErrorCode::kUnsupported, "bench", "no CUDA device visible");
  cudaStream_t s = current_stream();
  std::vector<BenchRow> rows;
  const int reps = cfg.reps > 0 ? cfg.reps : 30;
  if (cfg.act != "f16" && cfg.act != "bf16")
    throw Error(ErrorCode::kInvalidArgument, "bench", "--act must be f16 or bf16, got '" + cfg.act + "'");
  const DType act = cfg.act == "bf16" ? DType::kBF16 : DType::kF16;
  cudaDeviceProp prop;
  QHEAD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double l2 = double(prop.l2CacheSize);

  // ---- ceilings ----------------------------------------------------------------------------
  double copy_gbps = 0, matrix_tflops = 0;
  {
    const size_t bytes = size_t(4) << 30;
    Tensor a = cuda::empty(DType::kU8, {int64_t(bytes)}), b = cuda::empty(DType::kU8, {int64_t(bytes)});
    const double us = median_us([&](int) { QHEAD_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s)); }, 10);
    copy_gbps = 2.0 * double(bytes) / (us * 1e3);
    BenchRow r;
    r.path = "ceiling";
    r.note = "copy bandwidth (read + write) of a 4 GiB device-to-device copy";
    r.us_median = us;
    r.gbps = copy_gbps;
    r.bw_fraction = 1.0;
    rows.push_back(r);
  }
  {
    const int n = 8192;
    Tensor a = cuda::empty(DType::kF16, {n, n}), b = cuda::empty(DType::kF16, {n, n}), c = cuda::empty(DType::kF32, {n, n});
    fill_random_values<__half><<<grid_for(int64_t(n) * n), 256, 0, s>>>(a.ptr<__half>(), int64_t(n) * n, 1, 1.0f);
    fill_random_values<__half><<<grid_for(int64_t(n) * n), 256, 0, s>>>(b.ptr<__half>(), int64_t(n) * n, 2, 1.0f);
    QHEAD_CUDA_CHECK_LAUNCH("fill_random_values");
    const double us = median_us([&](int) { dense_gemm(a.data(), b.data(), DType::kF16, c.data(), n, n, n); }, 10);
    matrix_tflops = 2.0 * double(n) * n * n / (us * 1e6);
    BenchRow r;
    r.path = "ceiling_matrix";
    r.note = "cuBLAS dense f16 GEMM 8192^3, f32 accumulate (TFLOP/s in gbps column)";
    r.us_median = us;
    r.gbps = matrix_tflops;
    rows.push_back(r);
  }

  for (const BenchCase& bc : cfg.cases) {
    const QuantScheme scheme = QuantScheme::parse(bc.scheme, act);
    const int64_t V = bc.vocab, H = bc.hidden;
    scheme.check_hidden(H, "bench", bc.scheme);
    const std::string shape = std::to_string(V) + "x" + std::to_string(H);
    const int64_t words = scheme.packed_cols(H), G = scheme.groups(H);
    const size_t table_bytes = size_t(V * words * 4 + V * G * 2 + (scheme.symmetric ? 0 : ((V * scheme.bits + 31) / 32) * G * 4));
    const size_t dense_bytes = size_t(V * H * 2);
    const int copies = int(std::max<double>(4.0, std::ceil(4.0 * l2 / double(table_bytes))));
    const int dense_copies = int(std::max<double>(4.0, std::ceil(4.0 * l2 / double(dense_bytes))));
    // Packed tables with random codes and positive random scales.
    std::vector<Table> tables;
    for (int c = 0; c < copies; ++c) {
      PackedTable p;
      p.scheme = scheme;
      p.vocab = V;
      p.hidden = H;
      p.packed = cuda::empty(DType::kI32, {V, words});
      p.scale = cuda::empty(act, {V, G});
      fill_random_words<<<grid_for(V * words), 256, 0, s>>>(p.packed.ptr<uint32_t>(), V * words, 100 + c);
      fill_act(p.scale.data(), act, V * G, 200 + c, 0.01f, s);
      if (!scheme.symmetric) {
        p.zero_point = cuda::empty(DType::kI32, {(V * scheme.bits + 31) / 32, G});
        fill_random_words<<<grid_for(p.zero_point.numel()), 256, 0, s>>>(p.zero_point.ptr<uint32_t>(), p.zero_point.numel(), 300 + c);
      }
      QHEAD_CUDA_CHECK_LAUNCH("fill");
      tables.push_back(Table::packed(std::move(p), "bench"));
    }
    std::vector<Tensor> dense;
    for (int c = 0; c < dense_copies; ++c) {
      dense.push_back(cuda::empty(act, {V, H}));
      fill_act(dense.back().data(), act, V * H, 400 + c, 0.05f, s);
    }
    // The read ceiling over exactly the table's bytes (its largest part: the packed codes + scales).
    Tensor sink_t = cuda::empty(DType::kU32, {1});
    uint32_t* sink = sink_t.ptr<uint32_t>();
    auto read_with = [&](auto kernel) {
      return median_us([&](int i) {
        const Table& t = tables[size_t(i) % tables.size()];
        const PackedTable& p = t.packed();
        // Packed codes + scales are separate tensors here, so read each (the kernel's own launches are two as well).
        kernel<<<prop.multiProcessorCount * 4, 512, 0, s>>>(static_cast<const uint4*>(p.packed.data()), int64_t(p.packed.nbytes() / 16), sink);
        kernel<<<prop.multiProcessorCount, 512, 0, s>>>(static_cast<const uint4*>(p.scale.data()), int64_t(p.scale.nbytes() / 16), sink);
      }, reps);
    };
    const double read_grid_us = read_with(stream_read), read_chunk_us = read_with(stream_read_chunks),
                 read_tile_us = read_with(stream_read_tiles);
    const double read_us = std::min({read_grid_us, read_chunk_us, read_tile_us});
    {
      BenchRow r;
      r.shape = shape;
      r.scheme = scheme.name();
      r.path = "read_ceiling";
      r.us_median = read_us;
      r.gbps = double(table_bytes) / (read_us * 1e3);
      r.bw_fraction = r.gbps / copy_gbps;
      r.host_us = g_last_host_us;
      r.note = "pure streaming read of the packed table's bytes (" + std::to_string(copies) +
               " copies rotated): the fastest of a grid-stride reader (" + std::to_string(read_grid_us) +
               " us), a contiguous-chunk reader (" + std::to_string(read_chunk_us) + " us) and a 64 KiB-tile reader (" +
               std::to_string(read_tile_us) + " us)";
      rows.push_back(r);
    }

    for (int64_t M : cfg.m) {
      Tensor x = cuda::empty(act, {M, H});
      fill_act(x.data(), act, M * H, 500 + M, 1.0f, s);
      Tensor out = cuda::empty(DType::kF32, {M, V});
      const int64_t k = std::min<int64_t>(cfg.k, V);
      Tensor tv = cuda::empty(DType::kF32, {M, k}), ti = cuda::empty(DType::kI32, {M, k}), tl = cuda::empty(DType::kF32, {M});
      const double flops = 2.0 * double(M) * double(V) * double(H);
      auto add = [&](const std::string& path, double us, double bytes, double dense_us, const std::string& note) {
        BenchRow r;
        r.shape = shape;
        r.scheme = scheme.name();
        r.m = M;
        r.path = path;
        r.us_median = us;
        r.gbps = bytes / (us * 1e3);
        r.bw_fraction = r.gbps / copy_gbps;
        r.speedup_vs_dense = dense_us > 0 ? dense_us / us : 0.0;
        r.read_ceiling_fraction = read_us / us;
        r.matrix_fraction = flops / (us * 1e6) / matrix_tflops;
        r.host_us = g_last_host_us;  // every add() follows the median_us of its path
        r.act = cfg.act;
        r.note = note;
        rows.push_back(r);
      };
      const double dense_us = median_us([&](int i) {
        dense_gemm(dense[size_t(i) % dense.size()].data(), x.data(), act, out.data(), int(V), int(H), int(M));
      }, reps);
      add("dense", dense_us, double(dense_bytes), dense_us,
          "cuBLAS " + cfg.act + " GEMM on the unquantized " + cfg.act + " table");
      // The same pair with the logits stored in the activations' dtype (as torch's F.linear
      // returns them): cuBLAS with a 16-bit output, and the fused kernel's 16-bit store.
      Tensor out_act = cuda::empty(act, {M, V});
      const double dense_act_us = median_us([&](int i) {
        dense_gemm(dense[size_t(i) % dense.size()].data(), x.data(), act, out_act.data(), int(V), int(H), int(M), true);
      }, reps);
      add("dense_act_out", dense_act_us, double(dense_bytes), dense_us,
          "cuBLAS " + cfg.act + " GEMM on the unquantized " + cfg.act + " table, logits stored as " + cfg.act);
      const double fb_us = median_us([&](int i) {
        logits(tables[size_t(i) % tables.size()], x.view(), out.view(), Backend::kFallbackBlas);
      }, std::min(reps, 10));
      add("fallback", fb_us, double(table_bytes), dense_us, "dequantize to " + cfg.act + " + cuBLAS");
      using cuda_plan::LogitsKernel;
      using cuda_plan::LogitsOverrides;
      // The plan's own choice, whatever the environment says; with --plan-env,
      // the environment's overrides (every row, the sample rows included).
      const LogitsOverrides defaults = cfg.plan_env ? cuda_plan::env_overrides() : LogitsOverrides{};
      auto timed_logits = [&](const LogitsOverrides& ov, cuda_plan::LogitsPlan& plan) {
        return median_us([&](int i) {
          plan = cuda_ops::run_logits(tables[size_t(i) % tables.size()], x.view(), out.view(), Backend::kFused, ov);
        }, reps);
      };
      cuda_plan::LogitsPlan fused_plan;
      const double fused_us = timed_logits(defaults, fused_plan);
      add("fused", fused_us, double(table_bytes), dense_us, "the fused kernel the plan picks (Backend::kFused): " +
          fused_plan.describe());
      rows.back().kernel = cuda_plan::logits_kernel_name(fused_plan.kernel);
      {
        cuda_plan::LogitsPlan plan;
        const double us = median_us([&](int i) {
          plan = cuda_ops::run_logits(tables[size_t(i) % tables.size()], x.view(), out_act.view(), Backend::kFused,
                                      defaults);
        }, reps);
        add("fused_act_out", us, double(table_bytes), dense_act_us,
            "the same plan, logits stored as " + cfg.act + " (rounded to nearest even): " + plan.describe());
        rows.back().kernel = cuda_plan::logits_kernel_name(plan.kernel);
      }
      // Every other fused kernel that takes this shape, forced, same run.
      for (LogitsKernel k : {LogitsKernel::kGemvRegRing, LogitsKernel::kGemvStaged, LogitsKernel::kGemmMmaSync,
                             LogitsKernel::kGemmWgmma, LogitsKernel::kGemmWgmmaWs}) {
        if (k == fused_plan.kernel) continue;
        LogitsOverrides ov = defaults;
        ov.kernel = k;
        const cuda_plan::LogitsPlan want = cuda_ops::plan_logits(tables[0], x.view(), Backend::kFused, ov);
        if (want.kernel != k) continue;  // the kernel cannot take this shape
        cuda_plan::LogitsPlan plan;
        const double us = timed_logits(ov, plan);
        add(std::string("fused_") + cuda_plan::logits_kernel_name(k), us, double(table_bytes), dense_us,
            "forced through LogitsOverrides: " + plan.describe());
        rows.back().kernel = cuda_plan::logits_kernel_name(plan.kernel);
      }
      // A top-k row: qhead::topk under `backend` and `ov`, the path and kernel that ran.
      cuda_plan::TopkPlan topk_plan;
      auto timed_topk = [&](const char* path, Backend backend, const LogitsOverrides& ov, const std::string& what) {
        const double us = median_us([&](int i) {
          topk_plan = cuda_ops::run_topk(tables[size_t(i) % tables.size()], x.view(), k, tv.view(), ti.view(),
                                         tl.view(), backend, ov);
        }, reps);
        add(path, us, double(table_bytes), dense_us, "k = " + std::to_string(k) + "; " + what + topk_plan.describe());
        rows.back().kernel = std::string(cuda_plan::topk_path_name(topk_plan.path)) + ":" +
                             cuda_plan::logits_kernel_name(topk_plan.main.kernel);
      };
      timed_topk("fused_topk", Backend::kFused, defaults, "qhead::topk (kFused) + lse: ");
      timed_topk("auto_topk", Backend::kAuto, defaults, "qhead::topk (kAuto, the default path) + lse: ");
      if (topk_plan.path != cuda_plan::TopkPath::kTileSelect) {  // tile select forced, where it applies
        LogitsOverrides tile = defaults;
        tile.topk_path = cuda_plan::TopkPath::kTileSelect;
        if (cuda_ops::plan_topk(tables[0], x.view(), k, Backend::kAuto, tile).path == cuda_plan::TopkPath::kTileSelect)
          timed_topk("tile_topk", Backend::kAuto, tile, "tile select forced: ");
      }
      LogitsOverrides separate = defaults;
      separate.topk_path = cuda_plan::TopkPath::kLogitsThenSelect;
      timed_topk("logits_then_topk", Backend::kAuto, separate,
                 "kAuto logits into [M, V], then slice selection + merge: ");
      // The sample op: T = 1 over the whole vocab (logits, then Gumbel-max
      // over column slices), T = 1 with top_k = 50 (the fused top-k, then
      // the draw) and T = 0.7 with top_p = 0.9 (logits, scaled, slice
      // selection of 1024 candidates, then the draw).
      Tensor sid = cuda::empty(DType::kI32, {M});
      struct SampleCase {
        const char* path;
        SampleParams p;
        const char* what;
      };
      SampleParams full, topk50, nucleus;
      topk50.top_k = std::min<int64_t>(50, V);
      nucleus.temperature = 0.7f;
      nucleus.top_p = 0.9f;
      for (const SampleCase& sc : {SampleCase{"sample", full, "T = 1, whole vocab: logits + Gumbel-max"},
                                   SampleCase{"sample_top_k", topk50, "T = 1, top_k = 50: fused top-k + draw"},
                                   SampleCase{"sample_top_p", nucleus,
                                              "T = 0.7, top_p = 0.9: logits, 1024 candidates + draw"}}) {
        SampleParams p = sc.p;
        const double us = median_us([&](int i) {
          p.offset = uint64_t(i);
          cuda_ops::run_sample(tables[size_t(i) % tables.size()], x.view(), p, sid.view(), Backend::kAuto, defaults);
        }, reps);
        add(sc.path, us, double(table_bytes), dense_us,
            std::string("qhead::sample ") + sc.what + (cfg.plan_env ? " (the environment's plan overrides)" : ""));
      }
    }
  }
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  return rows;
}

}  // namespace qhead::bench
