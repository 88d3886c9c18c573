#include "qhead/dtype.h"

#include "qhead/error.h"

namespace qhead {

namespace {
struct DTypeInfo {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8},        {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},          {DType::kU64, "U64", 8},
    {DType::kU32, "U32", 4},   {DType::kU16, "U16", 2},        {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};
}  // namespace

size_t dtype_size(DType t) { return kInfo[static_cast<int>(t)].size; }
const char* dtype_name(DType t) { return kInfo[static_cast<int>(t)].name; }

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& i : kInfo)
    if (s == i.name) return i.t;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));  // Inf/NaN
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return bits_to_f32(sign);  // ±0
  // Subnormal: value = man * 2^-24, exact in f32.
  const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  const uint32_t b = f32_to_bits(f);
  const uint16_t sign = uint16_t((b >> 16) & 0x8000u);
  const uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // quiet NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to ≥ 65520 → Inf
  if (abs >= 0x38800000u) {                                  // normal f16 range (≥ 2^-14)
    uint32_t v = abs - (112u << 23);                         // rebias exponent
    v += 0xfffu + ((v >> 13) & 1u);                          // RNE on the 13 dropped bits
    return uint16_t(sign | (v >> 13));
  }
  // Subnormal or zero: value in units of 2^-24, rounded to nearest even.
  if (abs < 0x33000000u) return sign;  // < 2^-25: rounds to 0 (2^-25 exactly ties to 0)
  const uint32_t e = abs >> 23;                 // biased f32 exponent, 102..112
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;              // so that result = m >> shift in 2^-24 units
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n) {
  if (!is_float_dtype(src_t) || !is_float_dtype(dst_t))
    throw Error(ErrorCode::kInvalidArgument, "convert",
                std::string("only F32/F16/BF16 convert, got ") + dtype_name(src_t) + " -> " +
                    dtype_name(dst_t));
  if (n <= 0) return;
  if (src_t == dst_t) {
    std::memcpy(dst, src, size_t(n) * dtype_size(src_t));
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_from_f32(dst, dst_t, i, load_as_f32(src, src_t, i));
}

}  // namespace qhead
