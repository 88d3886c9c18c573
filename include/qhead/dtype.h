// qhead/dtype.h — element types and the float conversions every path shares.
//
// The set is the safetensors dtype set (a file may hold any of them and must
// still be validated and copied through unchanged); the arithmetic types are
// f32, f16 and bf16. Conversions to f16/bf16 round to nearest, ties to even,
// keep NaN a NaN (quiet, sign kept) and Inf an Inf; f16 handles subnormals.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace qhead {

enum class DType : uint8_t {
  kF64, kF32, kF16, kBF16,
  kI64, kI32, kI16, kI8,
  kU64, kU32, kU16, kU8,
  kBool, kF8E4M3, kF8E5M2,
};

// Bytes per element.
size_t dtype_size(DType t);
// safetensors spelling ("F32", "BF16", "I32", ...).
const char* dtype_name(DType t);
// Parses a safetensors dtype string; nullopt for unknown spellings.
std::optional<DType> parse_dtype(std::string_view s);
inline bool is_float_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// ---- scalar conversions ----------------------------------------------------

inline float bits_to_f32(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t b = f32_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force quiet bit
    return uint16_t((b >> 16) | 0x0040u);
  }
  // Round to nearest even: add 0x7fff plus the lsb of the kept half.
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a float array of dtype t (f32/f16/bf16) as f32.
inline float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return 0.0f;  // callers check is_float_dtype first
  }
}
// Stores f32 value v as element i of an f32/f16/bf16 array.
inline void store_from_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    default: break;
  }
}
// Rounds v through dtype t and back (the value a store + load would give).
inline float round_through(float v, DType t) {
  switch (t) {
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(v));
    default: return v;
  }
}

// Converts n elements between float dtypes (src and dst may be any of
// f32/f16/bf16). Throws for other dtypes.
void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n);

}  // namespace qhead
