// gguf.cc — validated mmap reader for GGUF files, the ggml type table, and
// the dequantization and token-table entry points.
//
// Reader: the whole file is mapped read-only once and parsed front to back by
// a bounds-checked cursor: every count or length is compared with the bytes
// left before anything is allocated or read, so a hostile header can neither
// read out of bounds nor make us allocate more than a small multiple of the
// file size. After open() returns, data() and the dequantizers only touch
// ranges that were checked.
//
// Dequantization: the type table below holds each type's kernel
// (gguf_dequant.cc, which reproduces ggml's reference dequantize_row_*
// bit for bit); gguf_dequantize runs it over the rows.

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
#include "io/gguf_dequant.h"
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

// The type table, one row per ggml type: id, name, values per block, bytes
// per block, and the dequantizer (gguf_dequant.cc; nullptr: a type qhead
// reads the geometry of but does not dequantize).
struct TypeRow {
  uint32_t id;
  const char* name;
  int64_t block_size;
  int64_t type_size;
  io::GgufDequantFn dequant;
};
constexpr TypeRow kTypes[] = {
    {0, "F32", 1, 4, io::deq_f32},          {1, "F16", 1, 2, io::deq_f16},
    {2, "Q4_0", 32, 18, io::deq_q4_0},      {3, "Q4_1", 32, 20, io::deq_q4_1},
    {6, "Q5_0", 32, 22, io::deq_q5_0},      {7, "Q5_1", 32, 24, io::deq_q5_1},
    {8, "Q8_0", 32, 34, io::deq_q8_0},      {9, "Q8_1", 32, 40, nullptr},
    {10, "Q2_K", 256, 84, nullptr},         {11, "Q3_K", 256, 110, nullptr},
    {12, "Q4_K", 256, 144, io::deq_q4_k},   {13, "Q5_K", 256, 176, io::deq_q5_k},
    {14, "Q6_K", 256, 210, io::deq_q6_k},   {15, "Q8_K", 256, 292, nullptr},
    {16, "IQ2_XXS", 256, 66, nullptr},      {17, "IQ2_XS", 256, 74, nullptr},
    {18, "IQ3_XXS", 256, 98, nullptr},      {19, "IQ1_S", 256, 50, nullptr},
    {20, "IQ4_NL", 32, 18, nullptr},        {21, "IQ3_S", 256, 110, nullptr},
    {22, "IQ2_S", 256, 82, nullptr},        {23, "IQ4_XS", 256, 136, nullptr},
    {24, "I8", 1, 1, nullptr},              {25, "I16", 1, 2, nullptr},
    {26, "I32", 1, 4, nullptr},             {27, "I64", 1, 8, nullptr},
    {28, "F64", 1, 8, nullptr},             {29, "IQ1_M", 256, 56, nullptr},
    {30, "BF16", 1, 2, io::deq_bf16},       {34, "TQ1_0", 256, 54, nullptr},
    {35, "TQ2_0", 256, 66, nullptr},        {39, "MXFP4", 32, 17, nullptr},
};

const TypeRow* type_row(uint32_t type) {
  for (const auto& row : kTypes)
    if (row.id == type) return &row;
  return nullptr;
}

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

// The dequantizable types, for messages: "F32, F16, Q4_0, ...".
std::string supported_list() {
  std::string s;
  for (const auto& row : kTypes)
    if (row.dequant) s += (s.empty() ? "" : ", ") + std::string(row.name);
  return s;
}

}  // namespace

// ============================================================================
// Types and values
// ============================================================================

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type) {
  const TypeRow* row = type_row(type);
  if (!row) return std::nullopt;
  return GgmlTypeTraits{row->name, row->block_size, row->type_size, row->dequant != nullptr};
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

namespace {

// ---- from_bytes' phases ------------------------------------------------------

// The magic and the version: 2 and 3 are read; 1 (32-bit counts), big-endian
// files and newer versions are kUnsupported.
uint32_t read_version(Cursor& c) {
  const std::string& path = c.path;
  const uint32_t magic = c.u32([] { return std::string("magic"); });
  if (magic != kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "bad magic %02x %02x %02x %02x, expected \"GGUF\"", c.base[0], c.base[1],
                  c.base[2], c.base[3]);
    fail_file(path, buf);
  }
  const uint32_t version = c.u32([] { return std::string("version"); });
  if (version == 1)
    throw Error(ErrorCode::kUnsupported, kWhere,
                path + ": GGUF version 1 (32-bit counts) is not supported; re-convert with a "
                       "current llama.cpp (versions 2 and 3 are read)");
  if (version != 0 && (version & 0xFFFFu) == 0)
    throw Error(ErrorCode::kUnsupported, kWhere,
                path + ": big-endian GGUF (version field reads " + num(version) + ") is not supported");
  if (version == 0) fail_file(path, "version 0 is not a GGUF version");
  if (version > 3)
    throw Error(ErrorCode::kUnsupported, kWhere,
                path + ": GGUF version " + num(version) + " is newer than this reader (2, 3)");
  return version;
}

// The tensor and key counts, each bounded by a cap and by the bytes left.
struct Counts {
  uint64_t tensors, kv;
};
Counts read_counts(Cursor& c) {
  const std::string& path = c.path;
  const uint64_t n_tensors = c.u64([] { return std::string("tensor count"); });
  const uint64_t n_kv = c.u64([] { return std::string("metadata count"); });
  if (n_tensors > kMaxTensors || n_tensors > c.left() / kMinTensorInfoBytes)
    fail_file(path, "tensor count " + num(n_tensors) + " is impossible: the " + num(c.left()) +
                        " bytes after the header hold at most " +
                        num(std::min(kMaxTensors, c.left() / kMinTensorInfoBytes)) + " tensor infos");
  if (n_kv > kMaxKeys || n_kv > c.left() / kMinKvBytes)
    fail_file(path, "metadata count " + num(n_kv) + " is impossible: the " + num(c.left()) +
                        " bytes after the header hold at most " + num(std::min(kMaxKeys, c.left() / kMinKvBytes)) +
                        " key-value pairs");
  return {n_tensors, n_kv};
}

// The n_kv key-value pairs: non-empty keys, known value types, no duplicates.
void read_metadata(Cursor& c, uint64_t n_kv, std::vector<std::string>& keys,
                   std::map<std::string, GgufValue>& meta) {
  const std::string& path = c.path;
  keys.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key(c.str([&] { return "metadata key #" + num(k); }));
    if (key.empty()) fail_file(path, "metadata key #" + num(k) + " is empty");
    const uint32_t vt = c.u32([&] { return "metadata key '" + printable(key) + "' value type"; });
    if (!known_value_type(vt)) fail_key(path, key, "unknown value type " + num(vt));
    GgufValue v = parse_value(c, static_cast<GgufValueType>(vt), key, 0);
    if (!meta.emplace(key, std::move(v)).second) fail_key(path, key, "duplicate key");
    keys.push_back(key);
  }
}

// general.alignment: a power of two (ggml requires u32; we take any unsigned
// integer); absent, the default.
uint64_t read_alignment(const std::string& path, const std::map<std::string, GgufValue>& meta) {
  const auto it = meta.find("general.alignment");
  if (it == meta.end()) return kDefaultAlignment;
  const GgufValue* a = &it->second;
  const bool is_uint = a->type == GgufValueType::kU8 || a->type == GgufValueType::kU16 ||
                       a->type == GgufValueType::kU32 || a->type == GgufValueType::kU64;
  if (!is_uint) fail_key(path, "general.alignment", std::string("must be an unsigned integer, got ") + type_text(*a));
  if (a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > kMaxAlignment)
    fail_key(path, "general.alignment", "must be a power of two in [1, 2^30], got " + num(a->u));
  return a->u;
}

// A tensor info as stored (checked against the data section later).
struct RawInfo {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the row length
  uint64_t offset;
};

// The n_tensors tensor infos: a non-empty name, at most 4 dims, type, offset.
std::vector<RawInfo> read_tensor_infos(Cursor& c, uint64_t n_tensors) {
  const std::string& path = c.path;
  std::vector<RawInfo> raws;
  raws.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    RawInfo r;
    r.name = std::string(c.str([&] { return "tensor info #" + num(t) + " name"; }));
    if (r.name.empty()) fail_file(path, "tensor info #" + num(t) + " has an empty name");
    auto ctx = [&] { return "tensor '" + printable(r.name) + "' info"; };
    const uint32_t n_dims = c.u32(ctx);
    if (n_dims > kMaxDims) fail_tensor(path, r.name, "n_dims " + num(n_dims) + " exceeds the ggml maximum of 4");
    for (uint32_t d = 0; d < n_dims; ++d) r.ne.push_back(c.u64(ctx));
    r.type = c.u32(ctx);
    r.offset = c.u64(ctx);
    raws.push_back(std::move(r));
  }
  return raws;
}

// Where the data section starts: the end of the tensor infos, padded to the
// alignment (a file without tensors may omit the padding).
uint64_t data_section_start(const std::string& path, uint64_t info_end, uint64_t alignment, uint64_t size,
                            uint64_t n_tensors) {
  const uint64_t pad = (alignment - info_end % alignment) % alignment;
  const uint64_t start = info_end + pad;  // info_end <= size < 2^63, pad < 2^30: no overflow
  if (start <= size) return start;
  if (n_tensors != 0)
    fail_file(path, "data section would start at offset " + num(start) + " (tensor infos end at " + num(info_end) +
                        ", alignment " + num(alignment) + ") but the file is " + num(size) + " bytes");
  return size;  // no tensors: the padding may be omitted
}

// One tensor, checked: a known type, dims that fit int64 (and their product),
// whole blocks per row, an aligned offset and a byte range inside the data
// section of `data_size` bytes starting at `data_start` in a file of `size`.
GgufFile::Info check_tensor(const std::string& path, const RawInfo& r, uint64_t alignment, uint64_t data_start,
                            uint64_t data_size, uint64_t size) {
  const TypeRow* traits = type_row(r.type);
  if (!traits) fail_tensor(path, r.name, "unknown ggml type " + num(r.type));
  GgufFile::Info info;
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
                std::string("row length ") + num(ne0) + " is not a multiple of the " + traits->name +
                    " block size " + num(traits->block_size));
  bool has_zero = false;
  for (uint64_t d : r.ne) has_zero |= d == 0;
  const uint64_t numel = has_zero ? 0 : prod;
  const auto nbytes_or =
      checked_mul(numel / static_cast<uint64_t>(traits->block_size), static_cast<uint64_t>(traits->type_size));
  if (!nbytes_or) fail_tensor(path, r.name, "byte size of ggml ne " + ne_str(r.ne) + " overflows");
  const uint64_t nbytes = *nbytes_or;
  info.nbytes = nbytes;
  info.offset = r.offset;
  if (r.offset % alignment != 0)
    fail_tensor(path, r.name, "data offset " + num(r.offset) + " is not a multiple of the alignment " + num(alignment));
  if (r.offset > data_size || nbytes > data_size - r.offset)
    fail_tensor(path, r.name,
                "data range [" + num(r.offset) + ", " + num(r.offset) + " + " + num(nbytes) +
                    ") runs past the end of the " + num(data_size) + "-byte data section (file is " + num(size) +
                    " bytes; truncated?)");
  info.file_offset = data_start + r.offset;
  return info;
}

// No two tensors share bytes (empty tensors take none).
void check_no_overlap(const std::string& path, const std::map<std::string, GgufFile::Info>& index) {
  using Info = GgufFile::Info;
  std::vector<const Info*> by_offset;
  for (const auto& [name, info] : index)
    if (info.nbytes) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(), [](const Info* a, const Info* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Info* prev = by_offset[i - 1];
    const Info* cur = by_offset[i];
    if (prev->offset + prev->nbytes > cur->offset)
      fail_tensor(path, cur->name,
                  "data range [" + num(cur->offset) + ", " + num(cur->offset + cur->nbytes) + ") overlaps tensor '" +
                      printable(prev->name) + "' at [" + num(prev->offset) + ", " +
                      num(prev->offset + prev->nbytes) + ")");
  }
}

}  // namespace

// The phases above, front to back: header (magic, version, counts),
// metadata and alignment, tensor infos, the data section, each tensor's
// range, no overlaps.
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
  f.version_ = read_version(c);
  const Counts n = read_counts(c);
  read_metadata(c, n.kv, f.keys_, f.meta_);
  f.alignment_ = read_alignment(path, f.meta_);
  const std::vector<RawInfo> raws = read_tensor_infos(c, n.tensors);
  f.data_start_ = data_section_start(path, c.pos, f.alignment_, size, n.tensors);
  const uint64_t data_size = size - f.data_start_;
  for (const RawInfo& r : raws) {
    Info info = check_tensor(path, r, f.alignment_, f.data_start_, data_size, size);
    if (f.index_.count(r.name)) fail_tensor(path, r.name, "duplicate tensor name");
    f.names_.push_back(r.name);
    f.index_.emplace(r.name, std::move(info));
  }
  check_no_overlap(path, f.index_);
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
  const TypeRow* traits = type_row(type);
  const io::GgufDequantFn fn = traits ? traits->dequant : nullptr;
  if (!fn)
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
  const TypeRow* traits = type_row(in.type);  // known: validated at open
  const io::GgufDequantFn fn = traits->dequant;
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
