// qhead/checked.h — overflow-checked integer arithmetic for sizes computed
// from file data (dims, element counts, byte counts).
//
// Every size derived from a header (a safetensors shape, GGUF ne[], a GPTQ
// qweight shape) goes through these before it is used to allocate, index or
// compare, so a hostile file can only produce an error, never a wrapped value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <type_traits>

namespace qhead {

// a * b, or nullopt when the product does not fit in T.
template <class T>
constexpr std::optional<T> checked_mul(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r{};
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or nullopt when the sum does not fit in T.
template <class T>
constexpr std::optional<T> checked_add(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r{};
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of non-negative factors, or nullopt when a factor is negative or
// the product does not fit in int64 (a zero factor gives 0 whatever the rest).
constexpr std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  bool zero = false;
  for (int64_t f : factors) {
    if (f < 0) return std::nullopt;
    if (f == 0) zero = true;
  }
  if (zero) return 0;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  return r;
}

}  // namespace qhead
