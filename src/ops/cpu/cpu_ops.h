// The CPU fast paths of the ops (internal): ops.cc calls these for
// Backend::kAuto on CPU tables after checking every argument. Each returns
// false when it does not take the case (no usable ISA, a forced reference
// path, a dense table, bits other than 4 and 8, H or the group length not a
// multiple of 32); ops.cc then runs the scalar reference.
#pragma once

#include <cstdint>

#include "qhead/ops.h"

namespace qhead::cpu {

struct KernelTable;

// The integer dot product of the int8-activation mode: kAuto takes VNNI
// vpdpbusd where the active ISA path and the CPU have it, else vpmaddubsw +
// vpmaddwd; the others force one (tests, benchmarks; both give the same
// results bit for bit). set_int8_dot(kVnni) throws Error(kUnsupported)
// where VNNI cannot run. Process-wide; call it between ops.
enum class Int8Dot { kAuto, kVnni, kMaddubs };
void set_int8_dot(Int8Dot d);
Int8Dot int8_dot();  // what the int8 mode runs now (never kAuto)
const char* int8_dot_name(Int8Dot d);  // "auto", "vnni", "maddubs"
// The kernels kAuto runs now (null: the reference). For the benchmark.
const KernelTable* active_kernels();

// out: F32, or F16/BF16 (each block's f32 logits rounded to nearest even).
bool logits(const Table& table, const TensorView& x, const TensorView& out);
// inv_temperature: the top-k and log-sum-exp of the logits times it (the
// sample op's l / T; 1: the logits).
bool topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, float inv_temperature = 1.0f);
// The sample op's untruncated draw (Gumbel-max, src/ops/sample.h), fused
// into the logits pass: ids[m] = argmax_v l[m, v]·inv_temperature + G(m, v)
// (ties: lower id); ids I32 [M].
bool sample_gumbel(const Table& table, const TensorView& x, float inv_temperature, uint64_t seed, uint64_t offset,
                   const TensorView& ids);
bool embed(const Table& table, const TensorView& ids, const TensorView& out);
// dst[i] = src[i] rounded to nearest even into t (F16 or BF16; the values of
// f32_to_f16 / f32_to_bf16), n elements, over the worker pool.
void round_to_16bit(const float* src, uint16_t* dst, int64_t n, DType t);
bool rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids);

}  // namespace qhead::cpu
