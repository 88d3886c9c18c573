// io/gguf_dequant.h — ggml's block dequantizers, one per type qhead
// dequantizes (gguf_dequant.cc). The type table in gguf.cc holds each in its
// type's row; a row without one is a type qhead does not dequantize.
#pragma once

#include <cstdint>

namespace qhead::io {

// Dequantizes `n` units at `x` into y: for a block type, n consecutive blocks
// (n × block_size values); for a plain type (F32, F16, BF16), n values.
using GgufDequantFn = void (*)(const unsigned char* x, float* y, int64_t n);

void deq_f32(const unsigned char* x, float* y, int64_t n);
void deq_f16(const unsigned char* x, float* y, int64_t n);
void deq_bf16(const unsigned char* x, float* y, int64_t n);
void deq_q4_0(const unsigned char* x, float* y, int64_t nb);
void deq_q4_1(const unsigned char* x, float* y, int64_t nb);
void deq_q5_0(const unsigned char* x, float* y, int64_t nb);
void deq_q5_1(const unsigned char* x, float* y, int64_t nb);
void deq_q8_0(const unsigned char* x, float* y, int64_t nb);
void deq_q4_k(const unsigned char* x, float* y, int64_t nb);
void deq_q5_k(const unsigned char* x, float* y, int64_t nb);
void deq_q6_k(const unsigned char* x, float* y, int64_t nb);

}  // namespace qhead::io
