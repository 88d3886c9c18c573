// gguf.cc — validated mmap reader for GGUF files and exact dequantization of
// the common ggml types.
//
// Reader: the whole file is mapped read-only once and parsed front to back by
// a bounds-checked cursor: every count or length is compared with the bytes
// left before anything is allocated or read, so a hostile header can neither
// read out of bounds nor make us allocate more than a small multiple of the
// file size. After open() returns, data() and the dequantizers only touch
// ranges that were checked.
//
// Dequantization reproduces ggml's reference dequantize_row_* (ggml-quants.c)
// and the gguf Python package's numpy port of it, operation for operation in
// f32: the block scale is widened from f16, multiplied by the (integer) code,
// and the min is added or subtracted afterwards — never fused (this file is
// compiled with -ffp-contract=off), so the results are bit-identical.

#include "qhead/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/printable.h"
#include "io/fd_guard.h"
#include "qhead/checked.h"
#include "qhead/dtype.h"
#include "qhead/error.h"
#include "core/parallel.h"

namespace qhead {

namespace {

constexpr const char* kWhere = "gguf.read";
// "GGUF" read as a little-endian u32.
constexpr uint32_t kMagic = 0x46554747u;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint64_t kMaxAlignment = uint64_t(1) << 30;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// Sane caps on the header counts (the file size bounds them more tightly for
// any file of ordinary size; these stop absurd values early).
constexpr uint64_t kMaxTensors = uint64_t(1) << 24;
constexpr uint64_t kMaxKeys = uint64_t(1) << 24;
constexpr int kMaxArrayDepth = 8;
// Smallest encodings, to bound counts by the bytes left: a KV is a key length
// (8) + value type (4) + at least a 1-byte value; a tensor info is a name
// length (8) + n_dims (4) + type (4) + offset (8).
constexpr uint64_t kMinKvBytes = 13;
constexpr uint64_t kMinTensorInfoBytes = 24;

[[noreturn]] void fail_file(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidFile, kWhere, path + ": " + what);
}
// Names and keys come from the file: escaped (printable()) for the message.
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name,
                              const std::string& what) {
  fail_file(path, "tensor '" + printable(name) + "': " + what);
}
[[noreturn]] void fail_key(const std::string& path, const std::string& key,
                           const std::string& what) {
  fail_file(path, "metadata key '" + printable(key) + "': " + what);
}

std::string errno_str(int err) { return std::strerror(err); }
std::string num(uint64_t v) { return std::to_string(v); }

using io::FdGuard;

uint16_t rd16(const unsigned char* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t rd32(const unsigned char* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
uint64_t rd64(const unsigned char* p) { return uint64_t(rd32(p)) | (uint64_t(rd32(p + 4)) << 32); }

// A bounds-checked reader over the mapping. `ctx` callables build the error
// context only when something fails (the tokenizer arrays hold ~10^5 strings).
struct Cursor {
  const unsigned char* base;
  uint64_t size;
  uint64_t pos;
  const std::string& path;

  uint64_t left() const { return size - pos; }

  template <class Ctx>
  void need(uint64_t n, const Ctx& ctx) const {
    if (n > left())
      fail_file(path, ctx() + ": needs " + num(n) + " bytes at offset " + num(pos) +
                          " but only " + num(left()) + " remain (file is " + num(size) +
                          " bytes; truncated?)");
  }
  template <class Ctx>
  uint32_t u32(const Ctx& ctx) {
    need(4, ctx);
    const uint32_t v = rd32(base + pos);
    pos += 4;
    return v;
  }
  template <class Ctx>
  uint64_t u64(const Ctx& ctx) {
    need(8, ctx);
    const uint64_t v = rd64(base + pos);
    pos += 8;
    return v;
  }
  template <class Ctx>
  std::string_view str(const Ctx& ctx) {
    const uint64_t at = pos;
    const uint64_t n = u64(ctx);
    if (n > left())
      fail_file(path, ctx() + ": string length " + num(n) + " at offset " + num(at) +
                          " runs past the end of the file (" + num(left()) + " bytes remain)");
    std::string_view s(reinterpret_cast<const char*>(base + pos), static_cast<size_t>(n));
    pos += n;
    return s;
  }
};

bool known_value_type(uint32_t t) { return t <= 12; }

// Bytes of one scalar of a fixed-size value type; 0 for string / array.
uint64_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    default: return 0;
  }
}
// Smallest encoding of one element of type t (bounds array counts).
uint64_t min_elem_size(GgufValueType t) {
  if (t == GgufValueType::kString) return 8;
  if (t == GgufValueType::kArray) return 12;
  return scalar_size(t);
}

void set_signed(GgufValue& v, int64_t x) {
  v.i = x;
  v.fits_i64 = true;
  v.fits_u64 = x >= 0;
  v.u = x >= 0 ? static_cast<uint64_t>(x) : 0;
  v.f = static_cast<double>(x);
}
void set_unsigned(GgufValue& v, uint64_t x) {
  v.u = x;
  v.fits_u64 = true;
  v.fits_i64 = x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  v.i = v.fits_i64 ? static_cast<int64_t>(x) : 0;
  v.f = static_cast<double>(x);
}

// Decodes one fixed-size scalar of type t at p (bounds already checked).
GgufValue decode_scalar(GgufValueType t, const unsigned char* p) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufValueType::kU8: set_unsigned(v, p[0]); break;
    case GgufValueType::kI8: set_signed(v, static_cast<int8_t>(p[0])); break;
    case GgufValueType::kU16: set_unsigned(v, rd16(p)); break;
    case GgufValueType::kI16: set_signed(v, static_cast<int16_t>(rd16(p))); break;
    case GgufValueType::kU32: set_unsigned(v, rd32(p)); break;
    case GgufValueType::kI32: set_signed(v, static_cast<int32_t>(rd32(p))); break;
    case GgufValueType::kU64: set_unsigned(v, rd64(p)); break;
    case GgufValueType::kI64: set_signed(v, static_cast<int64_t>(rd64(p))); break;
    case GgufValueType::kBool: set_unsigned(v, p[0] != 0 ? 1 : 0); break;
    case GgufValueType::kF32: v.f = bits_to_f32(rd32(p)); break;
    case GgufValueType::kF64: {
      const uint64_t b = rd64(p);
      std::memcpy(&v.f, &b, 8);
      break;
    }
    default: break;
  }
  return v;
}

// Parses one value of type t for metadata key `key` (depth = array nesting).
GgufValue parse_value(Cursor& c, GgufValueType t, const std::string& key, int depth) {
  auto ctx = [&] { return "metadata key '" + printable(key) + "'"; };
  if (t == GgufValueType::kString) {
    GgufValue v;
    v.type = t;
    v.str = c.str(ctx);
    return v;
  }
  if (t != GgufValueType::kArray) {
    const uint64_t n = scalar_size(t);
    c.need(n, ctx);
    GgufValue v = decode_scalar(t, c.base + c.pos);
    c.pos += n;
    return v;
  }
  if (depth >= kMaxArrayDepth)
    fail_key(c.path, key, "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  GgufValue v;
  v.type = GgufValueType::kArray;
  const uint32_t et = c.u32(ctx);
  if (!known_value_type(et))
    fail_key(c.path, key, "unknown array element type " + num(et));
  v.elem_type = static_cast<GgufValueType>(et);
  const uint64_t at = c.pos;
  v.count = c.u64(ctx);
  // Every element takes at least min_elem_size bytes: refuse counts that
  // cannot fit before allocating anything for them.
  const uint64_t min_size = min_elem_size(v.elem_type);
  if (v.count > c.left() / min_size)
    fail_key(c.path, key,
             "array count " + num(v.count) + " at offset " + num(at) + " of " +
                 gguf_value_type_name(v.elem_type) + " elements (>= " + num(min_size) +
                 " bytes each) cannot fit in the " + num(c.left()) + " bytes left in the file");
  if (v.elem_type == GgufValueType::kString) {
    v.strings.reserve(static_cast<size_t>(v.count));
    for (uint64_t i = 0; i < v.count; ++i)
      v.strings.push_back(c.str([&] { return ctx() + " element " + num(i); }));
  } else if (v.elem_type == GgufValueType::kArray) {
    v.items.reserve(static_cast<size_t>(v.count));
    for (uint64_t i = 0; i < v.count; ++i)
      v.items.push_back(parse_value(c, GgufValueType::kArray, key, depth + 1));
  } else {
    v.raw = c.base + c.pos;
    c.pos += v.count * min_size;  // checked above
  }
  return v;
}

// Type table: name, block size, bytes per block, dequantizable by qhead.
struct TypeRow {
  uint32_t id;
  GgmlTypeTraits traits;
};
constexpr TypeRow kTypes[] = {
    {0, {"F32", 1, 4, true}},         {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},      {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, true}},      {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},      {9, {"Q8_1", 32, 40, false}},
    {10, {"Q2_K", 256, 84, false}},   {11, {"Q3_K", 256, 110, false}},
    {12, {"Q4_K", 256, 144, true}},   {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}},   {15, {"Q8_K", 256, 292, false}},
    {16, {"IQ2_XXS", 256, 66, false}}, {17, {"IQ2_XS", 256, 74, false}},
    {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, false}},  {21, {"IQ3_S", 256, 110, false}},
    {22, {"IQ2_S", 256, 82, false}},  {23, {"IQ4_XS", 256, 136, false}},
    {24, {"I8", 1, 1, false}},        {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},       {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, false}},       {29, {"IQ1_M", 256, 56, false}},
    {30, {"BF16", 1, 2, true}},       {34, {"TQ1_0", 256, 54, false}},
    {35, {"TQ2_0", 256, 66, false}},  {39, {"MXFP4", 32, 17, false}},
};

std::string shape_text(const Shape& s) { return shape_str(s); }
std::string ne_str(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + num(ne[i]);
  return s + "]";
}

// JSON-ish quoting for dumps: escapes quotes, backslashes and control bytes.
std::string quoted(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  size_t n = 0;
  for (char ch : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string format_value(const GgufValue& v, size_t max_items) {
  switch (v.type) {
    case GgufValueType::kString: return quoted(v.str, 80);
    case GgufValueType::kBool: return v.u ? "true" : "false";
    case GgufValueType::kF32:
    case GgufValueType::kF64: {
      std::ostringstream os;
      os.precision(v.type == GgufValueType::kF32 ? 9 : 17);
      os << v.f;
      return os.str();
    }
    case GgufValueType::kArray: {
      std::string out = "[";
      const uint64_t n = std::min<uint64_t>(v.count, max_items);
      for (uint64_t i = 0; i < n; ++i) {
        if (i) out += ", ";
        out += format_value(v.at(i), max_items);
      }
      if (v.count > n) out += ", ... (" + num(v.count) + " total)";
      return out + "]";
    }
    default: return v.fits_i64 ? std::to_string(v.i) : num(v.u);
  }
}

std::string type_text(const GgufValue& v) {
  if (!v.is_array()) return gguf_value_type_name(v.type);
  std::string t = std::string("array<") +
                  (v.elem_type == GgufValueType::kArray && !v.items.empty() ? type_text(v.items[0])
                                                                           : gguf_value_type_name(v.elem_type));
  return t + ">[" + num(v.count) + "]";
}

// ---- dequantization kernels (one block run each) ------------------------------
//
// Each takes `nb` consecutive blocks at `x` and writes nb × block_size values
// to y. Block layouts (ggml-common.h), all little-endian:
//   Q4_0  {f16 d; u8 qs[16]}                 32 values: (q - 8)·d
//   Q4_1  {f16 d, m; u8 qs[16]}              32 values: q·d + m
//   Q5_0  {f16 d; u8 qh[4]; u8 qs[16]}       32 values: (q - 16)·d, q 5 bits
//   Q5_1  {f16 d, m; u8 qh[4]; u8 qs[16]}    32 values: q·d + m
//   Q8_0  {f16 d; i8 qs[32]}                 32 values: q·d
// In the 32-value blocks byte j holds value j (low nibble) and value j + 16
// (high nibble); the fifth bit of value j is bit j of qh (a u32).
//   Q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}           256 values
//   Q5_K  {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]} 256 values
//   Q6_K  {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}       256 values
// Q4_K/Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and min packed into
// `scales` (see scale_min_k4); value = (d·sc)·q − (dmin·m). Q6_K: 16
// sub-blocks of 16 with an int8 scale; value = (d·sc)·(q − 32).

float h2f(const unsigned char* p) { return f16_to_f32(rd16(p)); }

void deq_q4_0(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 18, y += 32) {
    const float d = h2f(x);
    const unsigned char* qs = x + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void deq_q4_1(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 20, y += 32) {
    const float d = h2f(x), m = h2f(x + 2);
    const unsigned char* qs = x + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

void deq_q5_0(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 22, y += 32) {
    const float d = h2f(x);
    const uint32_t qh = rd32(x + 2);
    const unsigned char* qs = x + 6;
    for (int j = 0; j < 16; ++j) {
      const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      y[j] = static_cast<float>(((qs[j] & 0x0F) | hi0) - 16) * d;
      y[j + 16] = static_cast<float>(((qs[j] >> 4) | hi1) - 16) * d;
    }
  }
}

void deq_q5_1(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 24, y += 32) {
    const float d = h2f(x), m = h2f(x + 2);
    const uint32_t qh = rd32(x + 4);
    const unsigned char* qs = x + 8;
    for (int j = 0; j < 16; ++j) {
      const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      y[j] = static_cast<float>((qs[j] & 0x0F) | hi0) * d + m;
      y[j + 16] = static_cast<float>((qs[j] >> 4) | hi1) * d + m;
    }
  }
}

void deq_q8_0(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 34, y += 32) {
    const float d = h2f(x);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(x[2 + j])) * d;
  }
}

// Scale and min of sub-block j (0..7) from the 12 packed bytes of a Q4_K/Q5_K
// block: sub-blocks 0..3 keep 6 bits in bytes j (scale) and j + 4 (min);
// sub-blocks 4..7 keep their low 4 bits in byte j + 4 (scale low nibble, min
// high nibble) and their top 2 bits in the top bits of bytes j − 4 (scale)
// and j (min).
void scale_min_k4(int j, const unsigned char* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void deq_q4_k(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 144) {
    const float d = h2f(x), dmin = h2f(x + 2);
    const unsigned char* scales = x + 4;
    const unsigned char* q = x + 16;
    // Four 64-value chunks; chunk c uses 32 bytes of qs: low nibbles are
    // sub-block 2c, high nibbles sub-block 2c + 1.
    for (int c = 0; c < 4; ++c, q += 32) {
      int sc, m;
      scale_min_k4(2 * c, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * c + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void deq_q5_k(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 176) {
    const float d = h2f(x), dmin = h2f(x + 2);
    const unsigned char* scales = x + 4;
    const unsigned char* qh = x + 16;
    const unsigned char* ql = x + 48;
    // As Q4_K; the fifth bit of value l of sub-block s is bit s of qh[l].
    for (int c = 0; c < 4; ++c, ql += 32) {
      int sc, m;
      scale_min_k4(2 * c, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * c + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      const int s1 = 2 * c, s2 = 2 * c + 1;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0x0F) | (((qh[l] >> s1) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) | (((qh[l] >> s2) & 1) << 4)) - m2;
    }
  }
}

void deq_q6_k(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 210) {
    const float d = h2f(x + 208);
    const unsigned char* ql = x;
    const unsigned char* qh = x + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
    // Two 128-value halves, each from 64 bytes of ql and 32 of qh: value
    // l + 32·k (k = 0..3) takes nibble (k / 2) of ql[l + 32·(k % 2)] and bits
    // 2k..2k+1 of qh[l]; sub-block of 16 values → scale sc[l / 16 + 2k].
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void deq_f32(const unsigned char* x, float* y, int64_t n) { std::memcpy(y, x, static_cast<size_t>(n) * 4); }
void deq_f16(const unsigned char* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(rd16(x + 2 * i));
}
void deq_bf16(const unsigned char* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(rd16(x + 2 * i));
}

using BlockFn = void (*)(const unsigned char*, float*, int64_t);
BlockFn block_fn(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: return deq_f32;
    case GgmlType::kF16: return deq_f16;
    case GgmlType::kBF16: return deq_bf16;
    case GgmlType::kQ4_0: return deq_q4_0;
    case GgmlType::kQ4_1: return deq_q4_1;
    case GgmlType::kQ5_0: return deq_q5_0;
    case GgmlType::kQ5_1: return deq_q5_1;
    case GgmlType::kQ8_0: return deq_q8_0;
    case GgmlType::kQ4_K: return deq_q4_k;
    case GgmlType::kQ5_K: return deq_q5_k;
    case GgmlType::kQ6_K: return deq_q6_k;
    default: return nullptr;
  }
}

std::string supported_list() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";
}

}  // namespace

// ============================================================================
// Types and values
// ============================================================================

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type) {
  for (const auto& row : kTypes)
    if (row.id == type) return row.traits;
  return std::nullopt;
}

std::string ggml_type_name(uint32_t type) {
  const auto t = ggml_type_traits(type);
  return t ? std::string(t->name) : "type " + num(type);
}

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "unknown";
}

GgufValue GgufValue::at(uint64_t idx) const {
  if (type != GgufValueType::kArray)
    throw Error(ErrorCode::kInvalidArgument, "gguf.metadata", "value is not an array");
  if (idx >= count)
    throw Error(ErrorCode::kInvalidArgument, "gguf.metadata",
                "index " + num(idx) + " out of range for an array of " + num(count));
  if (elem_type == GgufValueType::kString) {
    GgufValue v;
    v.type = GgufValueType::kString;
    v.str = strings[static_cast<size_t>(idx)];
    return v;
  }
  if (elem_type == GgufValueType::kArray) return items[static_cast<size_t>(idx)];
  return decode_scalar(elem_type, raw + idx * scalar_size(elem_type));
}

int64_t GgufFile::Info::rows() const {
  if (dims.empty()) return 1;
  int64_t r = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) r *= dims[i];  // validated: no overflow
  return r;
}
int64_t GgufFile::Info::cols() const { return dims.empty() ? 1 : dims.back(); }

// ============================================================================
// Reader
// ============================================================================

GgufFile GgufFile::open(const std::string& path) {
  // ---- map the file ---------------------------------------------------------
  // Anything but a regular file is refused before an open() that could block.
  struct stat st {};
  FdGuard fd(io::open_regular_file(path, kWhere, &st));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // magic + version + two u64 counts
  if (size < 24)
    fail_file(path, "file too small for a GGUF header: " + num(size) + " bytes, need at least 24");
  if (size > std::numeric_limits<size_t>::max())
    fail_file(path, "file of " + num(size) + " bytes does not fit in memory");
  const size_t map_len = static_cast<size_t>(size);
  void* addr = ::mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (addr == MAP_FAILED)
    throw Error(ErrorCode::kIo, kWhere, path + ": mmap failed: " + errno_str(errno));
  // As for safetensors: truncating the file while it is mapped raises SIGBUS
  // on access, which no validation can prevent.
  std::shared_ptr<const void> mapping(
      addr, [map_len](const void* p) { ::munmap(const_cast<void*>(p), map_len); });
  return from_bytes(std::move(mapping), map_len, path);
}

GgufFile GgufFile::from_bytes(std::shared_ptr<const void> bytes, size_t size_in, const std::string& path) {
  GgufFile f;
  f.path_ = path;
  const uint64_t size = size_in;
  if (size < 24 || bytes == nullptr)
    fail_file(path, "file too small for a GGUF header: " + num(size) + " bytes, need at least 24");
  f.file_size_ = size_in;
  f.mapping_ = std::move(bytes);
  const auto* base = static_cast<const unsigned char*>(f.mapping_.get());
  Cursor c{base, size, 0, path};

  // ---- header ---------------------------------------------------------------
  const uint32_t magic = c.u32([] { return std::string("magic"); });
  if (magic != kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "bad magic %02x %02x %02x %02x, expected \"GGUF\"", base[0],
                  base[1], base[2], base[3]);
    fail_file(path, buf);
  }
  f.version_ = c.u32([] { return std::string("version"); });
  if (f.version_ == 1)
    throw Error(ErrorCode::kUnsupported, kWhere,
                path + ": GGUF version 1 (32-bit counts) is not supported; re-convert with a "
                       "current llama.cpp (versions 2 and 3 are read)");
  if (f.version_ != 0 && (f.version_ & 0xFFFFu) == 0)
    throw Error(ErrorCode::kUnsupported, kWhere,
                path + ": big-endian GGUF (version field reads " + num(f.version_) +
                    ") is not supported");
  if (f.version_ == 0) fail_file(path, "version 0 is not a GGUF version");
  if (f.version_ > 3)
    throw Error(ErrorCode::kUnsupported, kWhere,
                path + ": GGUF version " + num(f.version_) + " is newer than this reader (2, 3)");
  const uint64_t n_tensors = c.u64([] { return std::string("tensor count"); });
  const uint64_t n_kv = c.u64([] { return std::string("metadata count"); });
  if (n_tensors > kMaxTensors || n_tensors > c.left() / kMinTensorInfoBytes)
    fail_file(path, "tensor count " + num(n_tensors) + " is impossible: the " + num(c.left()) +
                        " bytes after the header hold at most " +
                        num(std::min(kMaxTensors, c.left() / kMinTensorInfoBytes)) +
                        " tensor infos");
  if (n_kv > kMaxKeys || n_kv > c.left() / kMinKvBytes)
    fail_file(path, "metadata count " + num(n_kv) + " is impossible: the " + num(c.left()) +
                        " bytes after the header hold at most " +
                        num(std::min(kMaxKeys, c.left() / kMinKvBytes)) + " key-value pairs");

  // ---- metadata -------------------------------------------------------------
  f.keys_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key(c.str([&] { return "metadata key #" + num(k); }));
    if (key.empty()) fail_file(path, "metadata key #" + num(k) + " is empty");
    const uint32_t vt = c.u32([&] { return "metadata key '" + printable(key) + "' value type"; });
    if (!known_value_type(vt)) fail_key(path, key, "unknown value type " + num(vt));
    GgufValue v = parse_value(c, static_cast<GgufValueType>(vt), key, 0);
    if (!f.meta_.emplace(key, std::move(v)).second) fail_key(path, key, "duplicate key");
    f.keys_.push_back(key);
  }

  // general.alignment: a power of two (ggml requires u32; we take any unsigned integer).
  if (const GgufValue* a = f.find("general.alignment")) {
    const bool is_uint = a->type == GgufValueType::kU8 || a->type == GgufValueType::kU16 ||
                         a->type == GgufValueType::kU32 || a->type == GgufValueType::kU64;
    if (!is_uint)
      fail_key(path, "general.alignment",
               std::string("must be an unsigned integer, got ") + type_text(*a));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > kMaxAlignment)
      fail_key(path, "general.alignment",
               "must be a power of two in [1, 2^30], got " + num(a->u));
    f.alignment_ = a->u;
  } else {
    f.alignment_ = kDefaultAlignment;
  }

  // ---- tensor infos ---------------------------------------------------------
  struct Raw {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    uint64_t offset;
  };
  std::vector<Raw> raws;
  raws.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    Raw r;
    r.name = std::string(c.str([&] { return "tensor info #" + num(t) + " name"; }));
    if (r.name.empty()) fail_file(path, "tensor info #" + num(t) + " has an empty name");
    auto ctx = [&] { return "tensor '" + printable(r.name) + "' info"; };
    const uint32_t n_dims = c.u32(ctx);
    if (n_dims > kMaxDims)
      fail_tensor(path, r.name, "n_dims " + num(n_dims) + " exceeds the ggml maximum of 4");
    for (uint32_t d = 0; d < n_dims; ++d) r.ne.push_back(c.u64(ctx));
    r.type = c.u32(ctx);
    r.offset = c.u64(ctx);
    raws.push_back(std::move(r));
  }

  // ---- data section -----------------------------------------------------------
  const uint64_t info_end = c.pos;
  const uint64_t pad = (f.alignment_ - info_end % f.alignment_) % f.alignment_;
  f.data_start_ = info_end + pad;  // info_end <= size < 2^63, pad < 2^30: no overflow
  if (f.data_start_ > size) {
    if (n_tensors != 0)
      fail_file(path, "data section would start at offset " + num(f.data_start_) +
                          " (tensor infos end at " + num(info_end) + ", alignment " +
                          num(f.alignment_) + ") but the file is " + num(size) + " bytes");
    f.data_start_ = size;  // no tensors: the padding may be omitted
  }
  const uint64_t data_size = size - f.data_start_;

  for (const Raw& r : raws) {
    const auto traits = ggml_type_traits(r.type);
    if (!traits) fail_tensor(path, r.name, "unknown ggml type " + num(r.type));
    Info info;
    info.name = r.name;
    info.type = r.type;
    // Dims: each fits int64; the product of the non-zero dims fits int64.
    uint64_t prod = 1;
    for (uint64_t d : r.ne) {
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail_tensor(path, r.name, "dimension " + num(d) + " is negative as int64");
      if (d == 0) continue;
      const auto p = checked_mul(prod, d);
      if (!p || *p > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail_tensor(path, r.name, "element count of ggml ne " + ne_str(r.ne) + " overflows int64");
      prod = *p;
    }
    for (auto it = r.ne.rbegin(); it != r.ne.rend(); ++it) info.dims.push_back(static_cast<int64_t>(*it));
    const uint64_t ne0 = r.ne.empty() ? 1 : r.ne[0];
    if (ne0 % static_cast<uint64_t>(traits->block_size) != 0)
      fail_tensor(path, r.name,
                  std::string("row length ") + num(ne0) + " is not a multiple of the " +
                      traits->name + " block size " + num(traits->block_size));
    bool has_zero = false;
    for (uint64_t d : r.ne) has_zero |= d == 0;
    const uint64_t numel = has_zero ? 0 : prod;
    const auto nbytes_or = checked_mul(numel / static_cast<uint64_t>(traits->block_size),
                                       static_cast<uint64_t>(traits->type_size));
    if (!nbytes_or) fail_tensor(path, r.name, "byte size of ggml ne " + ne_str(r.ne) + " overflows");
    const uint64_t nbytes = *nbytes_or;
    info.nbytes = nbytes;
    info.offset = r.offset;
    if (r.offset % f.alignment_ != 0)
      fail_tensor(path, r.name, "data offset " + num(r.offset) + " is not a multiple of the alignment " +
                                    num(f.alignment_));
    if (r.offset > data_size || nbytes > data_size - r.offset)
      fail_tensor(path, r.name,
                  "data range [" + num(r.offset) + ", " + num(r.offset) + " + " + num(nbytes) +
                      ") runs past the end of the " + num(data_size) +
                      "-byte data section (file is " + num(size) + " bytes; truncated?)");
    info.file_offset = f.data_start_ + r.offset;
    if (f.index_.count(r.name)) fail_tensor(path, r.name, "duplicate tensor name");
    f.names_.push_back(r.name);
    f.index_.emplace(r.name, std::move(info));
  }

  // No two tensors share bytes (empty tensors take none).
  std::vector<const Info*> by_offset;
  for (const auto& [name, info] : f.index_)
    if (info.nbytes) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Info* a, const Info* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Info* prev = by_offset[i - 1];
    const Info* cur = by_offset[i];
    if (prev->offset + prev->nbytes > cur->offset)
      fail_tensor(path, cur->name,
                  "data range [" + num(cur->offset) + ", " + num(cur->offset + cur->nbytes) +
                      ") overlaps tensor '" + printable(prev->name) + "' at [" + num(prev->offset) + ", " +
                      num(prev->offset + prev->nbytes) + ")");
  }
  return f;
}

const GgufFile::Info& GgufFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw Error(ErrorCode::kInvalidArgument, kWhere, path_ + ": no tensor named '" + printable(name) + "'");
  return it->second;
}

const void* GgufFile::data(const std::string& name) const {
  return static_cast<const unsigned char*>(mapping_.get()) + info(name).file_offset;
}

Tensor GgufFile::view(const std::string& name) const {
  const Info& in = info(name);
  DType dt;
  switch (static_cast<GgmlType>(in.type)) {
    case GgmlType::kF32: dt = DType::kF32; break;
    case GgmlType::kF16: dt = DType::kF16; break;
    case GgmlType::kBF16: dt = DType::kBF16; break;
    default:
      throw Error(ErrorCode::kUnsupported, "gguf.view",
                  path_ + ": tensor '" + name + "' is " + ggml_type_name(in.type) +
                      "; only F32/F16/BF16 tensors can be viewed in place (use gguf_dequantize)");
  }
  const void* p = data(name);
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(dt) != 0)
    throw Error(ErrorCode::kUnsupported, "gguf.view",
                path_ + ": tensor '" + name + "' data is not aligned to its element size");
  return Tensor::borrow(mapping_, TensorView(const_cast<void*>(p), dt, in.dims));
}

// ---- metadata access ------------------------------------------------------------

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = meta_.find(key);
  return it == meta_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const char* want,
                             const GgufValue& v) {
  throw Error(ErrorCode::kInvalidFile, "gguf.metadata",
              path + ": metadata key '" + printable(key) + "' should be " + want + ", got " + type_text(v));
}
bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kU16:
    case GgufValueType::kI16: case GgufValueType::kU32: case GgufValueType::kI32:
    case GgufValueType::kU64: case GgufValueType::kI64: return true;
    default: return false;
  }
}
}  // namespace

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::kString) wrong_type(path_, key, "a string", *v);
  return std::string(v->str);
}

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer(v->type)) wrong_type(path_, key, "an integer", *v);
  if (!v->fits_i64)
    throw Error(ErrorCode::kInvalidFile, "gguf.metadata",
                path_ + ": metadata key '" + printable(key) + "' value " + num(v->u) + " does not fit int64");
  return v->i;
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::kF32 && v->type != GgufValueType::kF64 && !is_integer(v->type))
    wrong_type(path_, key, "a number", *v);
  return v->f;
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::kBool) wrong_type(path_, key, "a bool", *v);
  return v->u != 0;
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_array() || v->elem_type != GgufValueType::kString)
    wrong_type(path_, key, "an array of strings", *v);
  return std::vector<std::string>(v->strings.begin(), v->strings.end());
}

std::optional<uint64_t> GgufFile::get_array_length(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) wrong_type(path_, key, "an array", *v);
  return v->count;
}

std::string GgufFile::dump_metadata(size_t max_items) const {
  std::string out;
  for (const std::string& key : keys_) {
    const GgufValue& v = meta_.at(key);
    out += printable(key) + ": " + type_text(v) + " = " + format_value(v, max_items) + "\n";
  }
  return out;
}

// ============================================================================
// Dequantization
// ============================================================================

void gguf_dequantize_row(uint32_t type, const void* src, float* dst, int64_t n) {
  const auto traits = ggml_type_traits(type);
  const BlockFn fn = block_fn(type);
  if (!traits || !fn)
    throw Error(ErrorCode::kUnsupported, "gguf.dequantize",
                "ggml type " + ggml_type_name(type) + " cannot be dequantized (supported: " +
                    supported_list() + ")");
  if (n < 0 || n % traits->block_size != 0)
    throw Error(ErrorCode::kInvalidArgument, "gguf.dequantize",
                std::to_string(n) + " values is not a whole number of " + traits->name +
                    " blocks of " + std::to_string(traits->block_size));
  fn(static_cast<const unsigned char*>(src), dst, n / traits->block_size);
}

Tensor gguf_dequantize(const GgufFile& file, const std::string& name, int threads) {
  const GgufFile::Info& in = file.info(name);
  const auto traits = ggml_type_traits(in.type);  // known: validated at open
  const BlockFn fn = block_fn(in.type);
  if (!fn)
    throw Error(ErrorCode::kUnsupported, "gguf.dequantize",
                file.path() + ": tensor '" + name + "' has ggml type " + ggml_type_name(in.type) +
                    ", which qhead does not dequantize (supported: " + supported_list() + ")");
  const int64_t rows = in.rows(), cols = in.cols();
  Tensor out = Tensor::empty(DType::kF32, {rows, cols});
  if (rows == 0 || cols == 0) return out;
  const int64_t blocks_per_row = cols / traits->block_size;
  const int64_t row_bytes = blocks_per_row * traits->type_size;
  const auto* src = static_cast<const unsigned char*>(file.data(name));
  float* dst = out.ptr<float>();
  // Plain types pass values, not blocks, to their kernel.
  const int64_t units_per_row = traits->block_size == 1 ? cols : blocks_per_row;
  const int64_t min_rows = std::max<int64_t>(1, (int64_t(1) << 16) / cols);
  parallel_for(
      rows, min_rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) fn(src + r * row_bytes, dst + r * cols, units_per_row);
      },
      threads);
  return out;
}

// ============================================================================
// Roles
// ============================================================================

GgufRoles gguf_roles(const GgufFile& file) {
  static const std::string kEmbedding = "token_embd.weight", kHead = "output.weight";
  if (!file.contains(kEmbedding))
    throw Error(ErrorCode::kInvalidFile, "gguf.roles",
                file.path() + ": no tensor '" + kEmbedding + "' (the token embedding)");
  const GgufFile::Info& emb = file.info(kEmbedding);
  if (emb.dims.size() != 2)
    throw Error(ErrorCode::kInvalidFile, "gguf.roles",
                file.path() + ": tensor '" + kEmbedding + "' should be 2-D [vocab, hidden], got " +
                    shape_text(emb.dims));
  // The bounds a packed table's weight_shape is held to (table.cc): a table
  // beyond them (say [0, 2^62], which takes no bytes in the file) is no model's.
  if (emb.dims[0] > (int64_t(1) << 40) || emb.dims[1] > (int64_t(1) << 30))
    throw Error(ErrorCode::kInvalidFile, "gguf.roles",
                file.path() + ": tensor '" + kEmbedding + "' has implausible dims " + shape_text(emb.dims) +
                    " (a token table is at most [2^40, 2^30])");
  GgufRoles roles;
  roles.embedding = kEmbedding;
  roles.vocab = emb.dims[0];
  roles.hidden = emb.dims[1];
  if (file.contains(kHead)) {
    const GgufFile::Info& head = file.info(kHead);
    if (head.dims != emb.dims)
      throw Error(ErrorCode::kInvalidFile, "gguf.roles",
                  file.path() + ": tensor '" + kHead + "' has dims " + shape_text(head.dims) +
                      " but '" + kEmbedding + "' has " + shape_text(emb.dims));
    roles.head = kHead;
    roles.tied = false;
  } else {
    roles.head = kEmbedding;
    roles.tied = true;
  }
  return roles;
}

TokenTables gguf_load_tables(const GgufFile& file, const std::optional<QuantScheme>& scheme, int threads) {
  const GgufRoles roles = gguf_roles(file);
  auto load = [&](const std::string& name) {
    Table dense = Table::dense(gguf_dequantize(file, name, threads));
    if (!scheme) return dense;
    return quantize_table(dense, *scheme, threads, file.path() + ": " + name);
  };
  TokenTables t;
  t.embedding = load(roles.embedding);
  t.head = roles.tied ? t.embedding : load(roles.head);
  return t;
}

}  // namespace qhead
