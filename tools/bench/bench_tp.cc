// The tensor-parallel benchmark: the sharded top-k step against the same
// table on one GPU, with the communication timed on its own. Timing: before
// every timed call all ranks meet at a barrier (a one-word all-reduce + a
// stream sync), each rank times the call with CUDA events, and a step's time
// is the slowest rank's; medians over the reps. L2 (60 MB on the H200) is
// defeated as in `qhead bench --device cuda`: each rank rotates among copies
// of its shard totalling at least 4× L2.
#include "bench/bench_tp.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dist/ops_internal.h"
#include "qhead/cuda.h"
#include "qhead/dtype.h"
#include "qhead/error.h"
#include "qhead/ops.h"
#include "core/parallel.h"
#include "qhead/scheme.h"

namespace qhead::dist {

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorCode::kInternal, "bench.tp", std::string(what) + ": " + cudaGetErrorString(e));
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A deterministic random packed table (the same on every rank): random codes,
// positive scales in [2^-6, 2^-4), random zero points when asymmetric.
Table make_table(int64_t V, int64_t H, const QuantScheme& s, uint64_t seed) {
  PackedTable p;
  p.scheme = s;
  p.vocab = V;
  p.hidden = H;
  const int64_t cols = s.packed_cols(H), G = s.groups(H);
  p.packed = Tensor::empty(DType::kI32, {V, cols});
  p.scale = Tensor::empty(s.scale_dtype, {V, G});
  const int64_t tail = (H * s.bits) % 32;
  const uint32_t mask = tail ? (1u << tail) - 1u : 0xffffffffu;
  uint32_t* w = p.packed.ptr<uint32_t>();
  parallel_for(V, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = uint32_t(mix(seed ^ uint64_t(r * cols + c) * 0x100000001b3ull));
      w[r * cols + cols - 1] &= mask;
      for (int64_t g = 0; g < G; ++g) {
        const double u = double(mix(seed * 31 + 7 + uint64_t(r * G + g)) >> 11) * 0x1.0p-53;
        store_from_f32(p.scale.data(), s.scale_dtype, r * G + g, float((1.0 + 3.0 * u) / 64.0));
      }
    }
  });
  if (!s.symmetric) {
    std::vector<int8_t> z(static_cast<size_t>(V * G));
    for (int64_t i = 0; i < V * G; ++i) z[size_t(i)] = int8_t(s.qmin() + int(mix(seed * 17 + uint64_t(i)) % uint64_t(1 << s.bits)));
    p.zero_point = Tensor::empty(DType::kI32, {(V * s.bits + 31) / 32, G});
    pack_zero_points(z.data(), V, G, s.bits, p.zero_point.ptr<int32_t>());
  }
  return Table::packed(std::move(p), "bench.tp");
}

Tensor random_x(int64_t M, int64_t H, uint64_t seed) {
  Tensor h = Tensor::empty(DType::kF16, {M, H});
  for (int64_t i = 0; i < M * H; ++i)
    store_from_f32(h.data(), DType::kF16, i, float(double(mix(seed + uint64_t(i)) >> 11) * 0x1.0p-52 - 1.0));
  return cuda::to_device(h.view());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Events {
  cudaEvent_t a{}, b{};
  Events() {
    ck(cudaEventCreate(&a), "cudaEventCreate");
    ck(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

// Median over reps of the slowest rank's µs for fn(i); every rank after a barrier.
template <class F>
double step_us(const Comm& comm, F&& fn, int reps, int warmup = 3) {
  cudaStream_t s = static_cast<cudaStream_t>(cuda::stream());
  for (int i = 0; i < warmup; ++i) fn(i);
  ck(cudaStreamSynchronize(s), "warm-up");
  Events ev;
  Tensor mine = Tensor::empty(DType::kF32, {reps});
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    ck(cudaEventRecord(ev.a, s), "cudaEventRecord");
    fn(i + warmup);
    ck(cudaEventRecord(ev.b, s), "cudaEventRecord");
    ck(cudaEventSynchronize(ev.b), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    mine.ptr<float>()[i] = ms * 1000.0f;
  }
  Tensor d = cuda::to_device(mine.view()), all = cuda::empty(DType::kF32, {int64_t(comm.world()) * reps});
  comm.all_gather(d.view(), all.view());
  const Tensor h = cuda::to_host(all.view());
  std::vector<double> worst(static_cast<size_t>(reps), 0.0);
  for (int r = 0; r < comm.world(); ++r)
    for (int i = 0; i < reps; ++i) worst[size_t(i)] = std::max(worst[size_t(i)], double(h.ptr<float>()[r * reps + i]));
  return median(worst);
}

// Median µs of fn(i) on this GPU alone (no barrier).
template <class F>
double alone_us(F&& fn, int reps, int warmup = 3) {
  cudaStream_t s = static_cast<cudaStream_t>(cuda::stream());
  for (int i = 0; i < warmup; ++i) fn(i);
  ck(cudaStreamSynchronize(s), "warm-up");
  Events ev;
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    ck(cudaEventRecord(ev.a, s), "cudaEventRecord");
    fn(i + warmup);
    ck(cudaEventRecord(ev.b, s), "cudaEventRecord");
    ck(cudaEventSynchronize(ev.b), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    t.push_back(ms * 1000.0);
  }
  return median(t);
}

std::string fmt2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

}  // namespace

std::vector<bench::BenchRow> run_tp_bench(const bench::BenchConfig& cfg, const Comm& comm) {
  if (!comm.valid()) throw Error(ErrorCode::kInvalidArgument, "bench.tp", "no communicator");
  const int world = comm.world(), rank = comm.rank();
  const int reps = cfg.reps > 0 ? cfg.reps : 30;
  cudaStream_t s = static_cast<cudaStream_t>(cuda::stream());
  int l2 = 0;
  ck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, comm.device()), "cudaDeviceGetAttribute");
  std::vector<bench::BenchRow> rows;
  const std::string gpus = " (" + std::to_string(world) + " GPU" + (world > 1 ? "s" : "") + ", NCCL " +
                           std::to_string(comm.nccl_version()) + ")";

  double copy_gbps = 0;
  {
    const size_t bytes = size_t(1) << 30;
    Tensor a = cuda::empty(DType::kU8, {int64_t(bytes)}), b = cuda::empty(DType::kU8, {int64_t(bytes)});
    const double us = alone_us([&](int) { ck(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s), "copy"); }, 10);
    copy_gbps = 2.0 * double(bytes) / (us * 1e3);
    bench::BenchRow r;
    r.path = "ceiling";
    r.us_median = us;
    r.gbps = copy_gbps;
    r.bw_fraction = 1.0;
    r.note = "copy bandwidth (read + write) of a 1 GiB device-to-device copy on rank 0's GPU" + gpus;
    rows.push_back(r);
  }

  for (const bench::BenchCase& bc : cfg.cases) {
    const QuantScheme scheme = QuantScheme::parse(bc.scheme, DType::kF16);
    scheme.check_hidden(bc.hidden, "bench", bc.scheme);
    const int64_t V = bc.vocab, H = bc.hidden;
    const std::string shape = std::to_string(V) + "x" + std::to_string(H);
    const Table host = make_table(V, H, scheme, 0x5eed + uint64_t(V) * 131 + uint64_t(H));
    const double table_bytes = double(host.nbytes());
    const ShardedTable sh = shard(host, rank, world);
    const double shard_bytes = double(sh.table.nbytes());
    const int copies = int(std::max(2.0, std::ceil(4.0 * l2 / shard_bytes)));
    std::vector<ShardedTable> shards;
    for (int c = 0; c < copies; ++c) shards.push_back(to_device(sh));
    std::vector<Table> full;  // rank 0: the whole table, for the one-GPU baseline
    if (rank == 0) {
      const int fc = int(std::max(2.0, std::ceil(4.0 * l2 / table_bytes)));
      for (int c = 0; c < fc; ++c) full.push_back(cuda::to_device(host));
    }
    for (int64_t M : cfg.m) {
      const int64_t k = std::min<int64_t>(cfg.k, V);
      const Tensor x = random_x(M, H, 0xabc + uint64_t(M));
      Tensor tv = cuda::empty(DType::kF32, {M, k}), ti = cuda::empty(DType::kI32, {M, k}), tl = cuda::empty(DType::kF32, {M});
      auto add = [&](const std::string& path, double us, double bytes, double ceiling_gbps, const std::string& note) {
        bench::BenchRow r;
        r.shape = shape;
        r.scheme = scheme.name();
        r.m = M;
        r.path = path;
        r.us_median = us;
        r.gbps = bytes > 0 ? bytes / (us * 1e3) : 0.0;
        r.bw_fraction = ceiling_gbps > 0 ? r.gbps / ceiling_gbps : 0.0;
        r.note = note;
        rows.push_back(r);
      };

      // The baseline on rank 0 alone; the others wait at the barrier after it.
      double single_us = 0;
      Tensor single_ids;
      if (rank == 0) {
        Tensor sv = cuda::empty(DType::kF32, {M, k}), si = cuda::empty(DType::kI32, {M, k}), sl = cuda::empty(DType::kF32, {M});
        single_us = alone_us([&](int i) {
          topk(full[size_t(i) % full.size()], x.view(), k, sv.view(), si.view(), sl.view(), Backend::kAuto);
        }, reps);
        topk(full[0], x.view(), k, sv.view(), si.view(), sl.view(), Backend::kAuto);
        single_ids = cuda::to_host(si.view());
        add("single_gpu_topk", single_us, table_bytes, copy_gbps,
            "k = " + std::to_string(k) + "; qhead::topk (kAuto) on the whole table on one GPU (" +
                std::to_string(full.size()) + " copies rotated)");
      }
      comm.barrier();

      int64_t kl = 0;
      const double local_us = step_us(comm, [&](int i) {
        kl = internal::local_topk(comm, shards[size_t(i) % shards.size()], x.view(), k, Backend::kAuto);
      }, reps);
      const double exch_us = step_us(comm, [&](int i) {
        internal::exchange_topk(comm, shards[size_t(i) % shards.size()], M, kl, k, tv.view(), ti.view(), tl.view());
      }, reps);
      const double step = step_us(comm, [&](int i) {
        topk(comm, shards[size_t(i) % shards.size()], x.view(), k, tv.view(), ti.view(), tl.view(), Backend::kAuto);
      }, reps);
      topk(comm, shards[0], x.view(), k, tv.view(), ti.view(), tl.view(), Backend::kAuto);
      const Tensor tp_ids = cuda::to_host(ti.view());

      // The engines' way for comparison: every logit to every rank.
      Tensor local = cuda::empty(DType::kF32, {M, sh.range.size()}), fullv = cuda::empty(DType::kF32, {M, V});
      const double gather_us = step_us(comm, [&](int i) {
        const ShardedTable& t = shards[size_t(i) % shards.size()];
        logits(t, x.view(), local.view(), Backend::kAuto);
        all_gather_logits(comm, t, local.view(), fullv.view());
      }, reps);
      const double gather_comm_us = step_us(comm, [&](int) {
        all_gather_logits(comm, shards[0], local.view(), fullv.view());
      }, reps);

      if (rank == 0) {
        int64_t differ = 0;
        for (int64_t i = 0; i < M * k; ++i) differ += tp_ids.ptr<int32_t>()[i] != single_ids.ptr<int32_t>()[i];
        const double agg = double(world) * copy_gbps;
        const std::string shards_note = std::to_string(world) + " shards of <= " + std::to_string(sh.stride) +
                                        " rows, " + std::to_string(copies) + " copies rotated per rank";
        add("tp_local_topk", local_us, table_bytes, agg,
            "qhead::topk on each shard (k_local = " + std::to_string(kl) + "), slowest rank per step; " + shards_note);
        add("tp_exchange", exch_us, 0, 0,
            "communication: pack + one ncclAllGather of M*(k+1) = " + std::to_string(M * (k + 1)) +
                " 8-byte words per rank + merge kernel" + gpus);
        const double speedup = single_us / step;
        add("tp_topk", step, table_bytes, agg,
            "the whole sharded step (dist::topk); speedup vs 1 GPU " + fmt2(speedup) + "x (issue target >= " +
                fmt2(0.8 * world) + "x); ids equal to single_gpu_topk: " +
                (differ == 0 ? std::string("all ") + std::to_string(M * k)
                             : std::to_string(M * k - differ) + " of " + std::to_string(M * k)));
        add("tp_logits_allgather", gather_us, table_bytes, agg,
            "for comparison, what engines do: logits of each slice + all-gather of the [M, V] f32 logits (no top-k yet)");
        add("tp_allgather_logits_comm", gather_comm_us, 0, 0,
            "that all-gather alone: M*S*4 = " + std::to_string(M * sh.stride * 4) + " bytes per rank");
      }
    }
    comm.barrier();
  }
  return rows;
}

}  // namespace qhead::dist
