// qhead/ops.h — the operations on a token table.
//
// Every op checks its arguments here and dispatches once (ops.cc) on device
// and table kind; the scalar reference (src/ops/ops_ref.cc) is the spec, the
// test oracle and the fallback for anything a fast path does not take.
//
// Shapes: table [V, H]; ids [N]; x [M, H]; logits [M, V]; top-k [M, k].
//
// Threads. The ops never write a table. On CPU tables they may be called
// from several threads at once, on the same or on different tables: the
// calls share the one worker pool (set_num_threads) and take turns on it,
// so they run one after another at full width, and each returns exactly
// what it returns alone (tests/test_ops.cc, ConcurrentCallsFromSeveralThreads).
// On CUDA tables they may be called from several threads too: the calls
// take turns on a process-wide lock (the kernels' scratch buffers and the
// cuBLAS handle are process-wide), enqueue on the one stream (cuda.h,
// set_stream) and may return before their kernels finish; each result is exactly
// what the call returns alone (tests/test_cuda.cc,
// ConcurrentCallsFromSeveralThreads). The set_* functions below and
// cuda::set_stream are process-wide settings: change them between ops.
#pragma once

#include <cstdint>
#include <vector>

#include "qhead/table.h"
#include "qhead/tensor.h"

namespace qhead {

// Which implementation runs. kAuto picks the fastest one available for the
// table, device and shape; the others force a path (tests, benchmarks):
//   kReference    the scalar reference (CPU); on CUDA there is none, and it
//                 runs as kAuto
//   kFallbackBlas dequantize + BLAS (OpenBLAS / cuBLAS)
//   kFused        the device's fused kernel even where kAuto would pick another
//                 path (tests and benchmarks of the kernel itself); on CUDA the
//                 kernel plan says which (docs/architecture.md#kernel-plan)
enum class Backend { kAuto, kReference, kFallbackBlas, kFused };

// embed: out[n, :] = row(ids[n]) dequantized.
//   ids: I32 or I64 [N], each in [0, V) — anything else throws, nothing is read.
//   out: F32/F16/BF16 [N, H], written.
void embed(const Table& table, const TensorView& ids, const TensorView& out,
           Backend backend = Backend::kAuto);
Tensor embed(const Table& table, const TensorView& ids, DType out_dtype = DType::kF32);

// logits: out[m, v] = Σ_j x[m, j] · w[v, j], accumulated in f32.
//   x: F32/F16/BF16 [M, H];  out: F32/F16/BF16 [M, V], written. A 16-bit out
//   holds the f32 logits rounded to nearest even (beyond the f16 range: ±inf),
//   stored so by the CUDA kernels' epilogues and by the CPU kernels per block
//   of vocab rows.
void logits(const Table& table, const TensorView& x, const TensorView& out,
            Backend backend = Backend::kAuto);
Tensor logits(const Table& table, const TensorView& x, DType out_dtype = DType::kF32);

// logits_fallback: dequantize the whole table to f32, then one dense SGEMM
// (OpenBLAS). The path the fused kernels replace; kept as a baseline.
void logits_fallback(const Table& table, const TensorView& x, const TensorView& out);

// topk: the k largest logits of each row, sorted descending (ties: lower id
// first), and the log-sum-exp of the whole row, without storing [M, V].
//   values: F32 [M, k];  ids: I32 [M, k];  lse: F32 [M].  1 <= k <= V.
struct TopK {
  Tensor values;
  Tensor ids;
  Tensor logsumexp;
};
void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values,
          const TensorView& ids, const TensorView& lse, Backend backend = Backend::kAuto);
TopK topk(const Table& table, const TensorView& x, int64_t k);

// rescore: exact logits of candidate ids from a dense (full-precision) table,
// re-sorted descending (ties: lower id first).
//   dense: a dense Table [V, H];  x: [M, H];  candidates: I32/I64 [M, k]
//   values: F32 [M, k];  ids: I32 [M, k].
void rescore(const Table& dense, const TensorView& x, const TensorView& candidates,
             const TensorView& values, const TensorView& ids);
struct Rescored {
  Tensor values;
  Tensor ids;
};
Rescored rescore(const Table& dense, const TensorView& x, const TensorView& candidates);

// sample: one token id per activation row, drawn from the distribution of
// that row's logits (those `logits` computes) at temperature T, truncated as
// asked, without storing [M, V]:
//   p(v) ∝ exp(l_v / T) over the tokens kept by
//     top_k > 0   the top_k largest logits (ties: lower id first), then
//     top_p < 1   the shortest prefix of those, sorted descending, whose
//                 probability (renormalized over the top_k kept; over the
//                 whole vocab without top_k) reaches top_p, and
//     min_p > 0   the tokens whose probability is at least min_p times the
//                 largest one (both cuts keep a prefix; the shorter wins).
//   temperature == 0: the argmax (ties: lower id), as topk(k = 1); top_k,
//   top_p and min_p are then ignored. temperature must be finite and >= 0,
//   top_k in [0, V], top_p in (0, 1], min_p in [0, 1).
// Randomness is Philox4x32-10 keyed by `seed` with a counter made of (row,
// offset, column): a call is reproducible, rows are independent streams, and
// a decode loop passes its step as `offset` so that steps differ. Every path
// (reference, CPU kernels, CUDA) uses the same random numbers, so paths agree
// draw for draw except where their logits' rounding decides a draw.
// Two exact mechanisms (docs/architecture.md#sampling):
//   untruncated (top_k = 0, top_p = 1, min_p = 0): Gumbel-max, argmax_v of
//     l_v/T + G_v with G_v = -log(-log u_v), u_v a 23-bit uniform of the
//     column's counter, fused into the logits pass on the CPU;
//   truncated: the sorted candidates (top-k of l/T with the log-sum-exp of
//     l/T), then the inverse CDF at one 53-bit uniform of the row's counter.
//   ids: I32 [M], written.
struct SampleParams {
  float temperature = 1.0f;
  int64_t top_k = 0;  // 0: no top-k cut
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};
void sample(const Table& table, const TensorView& x, const SampleParams& params, const TensorView& ids,
            Backend backend = Backend::kAuto);
Tensor sample(const Table& table, const TensorView& x, const SampleParams& params);

// ---- CPU fast paths (src/ops/cpu/) -------------------------------------------
// kAuto runs the fused CPU kernels of the best ISA this CPU has (CPUID, run
// time) for packed 4- and 8-bit tables whose H and group length are
// multiples of 32; everything else runs the reference.
enum class CpuIsa { kAuto, kReference, kAvx2, kAvx512 };
const char* cpu_isa_name(CpuIsa isa);  // "auto", "reference", "avx2", "avx512"
// The paths this build and CPU can run (kReference always).
std::vector<CpuIsa> available_cpu_isas();
// Forces the path kAuto takes, process-wide (tests, benchmarks); kAuto
// restores the default. Throws Error(kUnsupported) for an ISA this CPU lacks.
void set_cpu_isa(CpuIsa isa);
CpuIsa active_cpu_isa();  // what kAuto runs now
// The thread count qhead uses where none is given: QHEAD_NUM_THREADS when it
// starts with a positive integer, else the hardware threads (at least 1).
int default_num_threads();
// Worker threads of the CPU fast paths (the caller included), kept in a pool
// created once; n <= 0: default_num_threads(). Call it between ops, not
// during one.
void set_num_threads(int n);
int num_threads();

// Activation precision of the fused CPU logits and top-k, process-wide.
// kExact (the default): x is used as f32; the kernels' operands are the
// reference's and only the summation order differs (the f32 bound
// γ_H·Σ|x·w| holds). kInt8 (opt-in, llama.cpp-style): x is quantized per
// block of 32 elements to int8 (s_b = max|x|/127, q = rint(x/s_b)) and the
// dot products with the stored codes run in integers (VNNI vpdpbusd; the
// zero point is subtracted exactly in int32), then are scaled by s_b·s_w in
// f32. Its extra error is that of replacing x by s_b·q:
// |Δlogit| <= Σ_j |w_j|·s_b(j)/2 (+ the f32 bound). It runs on both ISA
// paths: with VNNI vpdpbusd where the CPU has it (AVX512_VNNI with the
// avx512 path, AVX-VNNI with the avx2 path), else with vpmaddubsw +
// vpmaddwd (llama.cpp's q4_0 · q8_0 dot), the same integers and so the same
// results bit for bit; with the reference path, kInt8 runs the exact
// reference. Embed and rescore are always exact. Call it between ops, not
// during one.
enum class CpuActivations { kExact, kInt8 };
void set_cpu_activations(CpuActivations a);
CpuActivations cpu_activations();
// Whether kInt8 takes effect with the active ISA path on this CPU.
bool cpu_int8_available();

}  // namespace qhead
