// safetensors.cc — validated mmap reader and atomic writer for safetensors.
//
// Reader: the whole file is mapped read-only once; every structural property
// is checked before open() returns, so get() is a pure lookup that can never
// produce a view outside the mapping. Writer: header + data go to a temporary
// file in the destination directory, which is fsync'ed and renamed into place.
//
// Layout reminder:  [u64 LE N][N bytes JSON header][data section]
// Offsets in the header are relative to the data section start (8 + N).

#include "qhead/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>

#include "core/printable.h"
#include "io/fd_guard.h"
#include "io/stale_temp.h"
#include "qhead/checked.h"
#include "qhead/error.h"

namespace qhead {

namespace {

using nlohmann::json;

// Largest header we accept; the reference implementation uses the same cap.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The writer aligns the data section start to this many bytes.
constexpr size_t kDataAlign = 8;
constexpr const char* kMetadataKey = "__metadata__";
// Deepest JSON nesting accepted in a header. A valid header nests 3 deep (the
// top object, a tensor entry, its shape array); the bound keeps hostile
// nesting from reaching recursive code (dump, comparisons) at all.
constexpr int kMaxJsonDepth = 16;

[[noreturn]] void fail_file(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidFile, "safetensors.read", path + ": " + what);
}

// `name` comes from the file: it is escaped (printable()) for the message.
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name,
                              const std::string& what) {
  fail_file(path, "tensor '" + printable(name) + "': " + what);
}

std::string errno_str(int err) { return std::strerror(err); }

using io::file_kind;

// A JSON value for an error message (ASCII only, non-ASCII as \uXXXX), cut
// short so a huge header stays readable. Nesting is bounded at parse time.
std::string short_dump(const nlohmann::json& v) {
  std::string s = printable(v.dump(-1, ' ', /*ensure_ascii=*/true), 120);
  return s;
}

std::string range_str(size_t begin, size_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

using io::FdGuard;

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads a JSON value that must be a non-negative integer (floats such as 2.0
// and negative numbers are rejected). nlohmann stores every non-negative
// integer literal as number_unsigned, so that type test is exactly the check.
bool as_unsigned(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

// Parses `text` as JSON and rejects duplicate keys in any object: nlohmann
// would silently keep the last one, and two parsers disagreeing about which
// tensor a name refers to is exactly the ambiguity validation must exclude.
// Nesting deeper than kMaxJsonDepth is refused: the callback discards such a
// value (nlohmann's parser itself is iterative, so the parse stays flat) and
// the header is rejected once parsing ends.
json parse_header(const std::string& path, const char* text, size_t n) {
  std::vector<std::set<std::string>> keys;  // one key set per open object
  std::string duplicate;
  bool too_deep = false;
  auto cb = [&](int depth, json::parse_event_t ev, json& v) {
    if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      too_deep = true;
      return false;  // not kept: nothing below it is stored
    }
    if (too_deep) return false;
    switch (ev) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && v.is_string() && !keys.back().insert(v.get<std::string>()).second &&
            duplicate.empty())
          duplicate = v.get<std::string>();
        break;
      default: break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, text + n, cb, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    // e.what() quotes the bytes last read: escape them.
    fail_file(path, "header is not valid JSON: " + printable(e.what(), 240));
  }
  if (too_deep)
    fail_file(path, "header JSON nests deeper than " + std::to_string(kMaxJsonDepth) +
                        " levels (a safetensors header nests 3: object, tensor entry, shape)");
  if (!duplicate.empty()) fail_file(path, "header has duplicate key \"" + printable(duplicate) + "\"");
  return j;
}

}  // namespace

// ============================================================================
// Reader
// ============================================================================

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // ---- map the file ---------------------------------------------------------
  // Directories, FIFOs and devices cannot be mapped as a file of known size;
  // they are refused before an open() that could block.
  struct stat st {};
  FdGuard fd(io::open_regular_file(path, "safetensors.read", &st));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // The 8-byte length prefix must be present (this also excludes mmap of 0 bytes).
  if (size < 8)
    fail_file(path, "file too small: " + std::to_string(size) + " bytes, need at least 8");
  if (size > std::numeric_limits<size_t>::max())
    fail_file(path, "file of " + std::to_string(size) + " bytes does not fit in memory");
  const size_t map_len = static_cast<size_t>(size);

  void* addr = ::mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (addr == MAP_FAILED)
    throw Error(ErrorCode::kIo, "safetensors.read", path + ": mmap failed: " + errno_str(errno));
  // The mapping outlives the descriptor; the last Tensor borrowing it unmaps.
  // Note: if another process truncates the file while it is mapped, touching
  // the lost pages raises SIGBUS — no user-space validation can prevent that.
  std::shared_ptr<const void> mapping(
      addr, [map_len](const void* p) { ::munmap(const_cast<void*>(p), map_len); });
  return from_bytes(std::move(mapping), map_len, path);
}

namespace {

// What a file that is not safetensors is, from its first bytes; empty when
// it is no format qhead recognizes.
std::string other_format(const unsigned char* p, size_t size) {
  if (size >= 4 && std::memcmp(p, "GGUF", 4) == 0)
    return "a GGUF file (read it as GGUF: qhead inspect FILE.gguf)";
  if (size >= 4 && std::memcmp(p, "PK\x03\x04", 4) == 0)
    return "a zip archive (a PyTorch checkpoint saved by torch.save?); convert it to safetensors first";
  if (size >= 2 && p[0] == 0x80 && p[1] >= 2 && p[1] <= 5)
    return "a Python pickle (a legacy PyTorch checkpoint?); convert it to safetensors first";
  return "";
}

// ---- from_bytes' phases ------------------------------------------------------

// What the file is. A safetensors header starts with '{' (the reference
// reader requires it). Without it, a file that starts like another format is
// named for it (a pickle's 0x80 0x02..0x05 is also the start of a valid
// header length). Returns whether the '{' is there.
bool check_format(const std::string& path, const unsigned char* base, size_t size) {
  const bool brace = size > 8 && base[8] == '{';
  if (!brace) {
    const std::string other = other_format(base, size);
    if (!other.empty()) fail_file(path, "is not a safetensors file: it is " + other);
  }
  return brace;
}

// The header length N, checked against the cap and the file's `size` (>= 8).
uint64_t header_length(const std::string& path, const unsigned char* base, uint64_t size, bool brace) {
  const uint64_t n = read_u64_le(base);
  // A header length that cannot be right, with no '{' after it, means this is
  // not a safetensors file at all: say so before the numbers.
  const std::string not_st =
      brace ? "" : "is not a safetensors file: its first 8 bytes are not a little-endian header length "
                   "followed by '{' (";
  const std::string not_st_end = brace ? "" : ")";
  // Refuse absurd headers before comparing with the file (a cheap DoS guard).
  if (n > kMaxHeaderBytes)
    fail_file(path, not_st + "header length " + std::to_string(n) + " exceeds the cap of " +
                        std::to_string(kMaxHeaderBytes) + " bytes" + not_st_end);
  // The header must fit after the prefix: 8 + N <= file size (no overflow: size >= 8).
  if (n > size - 8)
    fail_file(path, not_st + "header length " + std::to_string(n) + " exceeds the " +
                        std::to_string(size - 8) + " bytes after the length prefix (file is " +
                        std::to_string(size) + " bytes)" + not_st_end);
  return n;
}

// One tensor entry of the header, validated.
struct TensorRange {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin, end;  // relative to the data section
};

// __metadata__: a flat string -> string map (the format's rule).
void read_metadata(const std::string& path, const json& value, std::map<std::string, std::string>& out) {
  if (!value.is_object())
    fail_file(path, std::string("__metadata__ must be an object of strings, got ") + value.type_name());
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string())
      fail_file(path, "__metadata__ value for key \"" + printable(k) + "\" must be a string, got " + v.type_name());
    out[k] = v.get<std::string>();
  }
}

// dtype: one of the safetensors spellings.
DType entry_dtype(const std::string& path, const std::string& name, const json& jt) {
  if (!jt.is_string()) fail_tensor(path, name, std::string("dtype must be a string, got ") + jt.type_name());
  const auto dt = parse_dtype(jt.get<std::string>());
  if (!dt) fail_tensor(path, name, "unknown dtype \"" + printable(jt.get<std::string>()) + "\"");
  return *dt;
}

// shape: an array of non-negative integers, each representable as int64,
// whose element count (*numel) fits in int64.
Shape entry_shape(const std::string& path, const std::string& name, const json& js, uint64_t* numel) {
  if (!js.is_array())
    fail_tensor(path, name, std::string("shape must be an array of non-negative integers, got ") + js.type_name());
  Shape shape;
  for (const json& d : js) {
    uint64_t dim = 0;
    if (!as_unsigned(d, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(path, name, "shape must be an array of non-negative integers, got " + short_dump(js));
    shape.push_back(static_cast<int64_t>(dim));
  }
  // Element count: the product of the non-zero dims must fit in int64, so
  // that shape_numel() (which multiplies in order) can never overflow.
  uint64_t nonzero_product = 1;
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d == 0) {
      has_zero = true;
      continue;
    }
    const auto p = checked_mul(nonzero_product, static_cast<uint64_t>(d));
    if (!p || *p > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(path, name, "element count of shape " + shape_str(shape) + " overflows");
    nonzero_product = *p;
  }
  *numel = has_zero ? 0 : nonzero_product;
  return shape;
}

// A tensor entry: an object with exactly dtype, shape and data_offsets
// [begin, end] (0 <= begin <= end) holding exactly the shape's elements,
// inside the data section of `data_size` bytes.
TensorRange read_entry(const std::string& path, const std::string& name, const json& value, size_t data_size) {
  if (!value.is_object())
    fail_tensor(path, name, std::string("entry must be an object, got ") + value.type_name());
  for (const auto& [k, v] : value.items()) {
    (void)v;
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      fail_tensor(path, name, "unknown key \"" + printable(k) + "\" (expected dtype, shape, data_offsets)");
  }
  for (const char* required : {"dtype", "shape", "data_offsets"})
    if (!value.contains(required)) fail_tensor(path, name, std::string("missing \"") + required + "\"");

  TensorRange e{};
  e.name = name;
  e.dtype = entry_dtype(path, name, value.at("dtype"));
  uint64_t numel = 0;
  e.shape = entry_shape(path, name, value.at("shape"), &numel);
  const json& jo = value.at("data_offsets");
  uint64_t begin = 0, end = 0;
  if (!jo.is_array() || jo.size() != 2 || !as_unsigned(jo[0], &begin) || !as_unsigned(jo[1], &end))
    fail_tensor(path, name, "data_offsets must be an array of exactly two non-negative integers, got " + short_dump(jo));
  if (begin > end)
    fail_tensor(path, name, "data_offsets begin " + std::to_string(begin) + " > end " + std::to_string(end));
  // The byte range must hold exactly numel elements of dtype (overflow-checked).
  const auto need = checked_mul(numel, static_cast<uint64_t>(dtype_size(e.dtype)));
  if (!need || *need != end - begin)
    fail_tensor(path, name,
                "byte range " + range_str(begin, end) + " holds " + std::to_string(end - begin) + " bytes but shape " +
                    shape_str(e.shape) + " of " + dtype_name(e.dtype) + " needs " + std::to_string(numel) + " x " +
                    std::to_string(dtype_size(e.dtype)) + " bytes");
  // The range must lie inside the data section.
  if (end > data_size)
    fail_tensor(path, name,
                "byte range " + range_str(begin, end) + " lies beyond the data section of " +
                    std::to_string(data_size) + " bytes");
  e.begin = static_cast<size_t>(begin);
  e.end = static_cast<size_t>(end);
  return e;
}

// The header: a JSON object mapping tensor names (and __metadata__) to
// objects, each entry validated, in the header's key order.
struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorRange> tensors;
};

Header read_header(const std::string& path, const unsigned char* text, uint64_t n, size_t data_size) {
  const json header = parse_header(path, reinterpret_cast<const char*>(text), n);
  if (!header.is_object()) fail_file(path, std::string("header must be a JSON object, got ") + header.type_name());
  Header h;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) read_metadata(path, value, h.metadata);
    else h.tensors.push_back(read_entry(path, name, value, data_size));
  }
  return h;
}

// The ranges must tile [0, data_size) exactly: no overlap, no hole, no
// trailing bytes. Returns the tensor names in file order. Ordered by (begin,
// end, name): a zero-size tensor sorts before a non-empty one starting at the
// same offset, and ties are broken deterministically.
std::vector<std::string> tile_data_section(const std::string& path, const std::vector<TensorRange>& tensors,
                                           size_t data_size) {
  std::vector<const TensorRange*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorRange* a, const TensorRange* b) {
    if (a->begin != b->begin) return a->begin < b->begin;
    if (a->end != b->end) return a->end < b->end;
    return a->name < b->name;
  });
  std::vector<std::string> names;
  names.reserve(order.size());
  size_t expect = 0;                   // where the next tensor must begin
  const TensorRange* prev = nullptr;   // the tensor that ended at `expect`
  for (const TensorRange* e : order) {
    // Starting before the previous end means two tensors share bytes.
    if (e->begin < expect)
      fail_file(path, "tensors '" + printable(prev->name) + "' " + range_str(prev->begin, expect) + " and '" +
                          printable(e->name) + "' " + range_str(e->begin, e->end) + " overlap");
    // Starting after it leaves unaccounted bytes.
    if (e->begin > expect)
      fail_file(path, "hole of " + std::to_string(e->begin - expect) + " bytes in the data section " +
                          range_str(expect, e->begin) +
                          (prev ? " between '" + printable(prev->name) + "' and '" + printable(e->name) + "'"
                                : " before the first tensor '" + printable(e->name) + "'"));
    expect = e->end;
    prev = e;
    names.push_back(e->name);
  }
  // Bytes after the last tensor belong to nobody (the reference rejects them too).
  if (expect != data_size)
    fail_file(path, std::to_string(data_size - expect) + " trailing bytes in the data section" +
                        (prev ? " after the last tensor '" + printable(prev->name) + "'"
                              : std::string(" but the header declares no tensors")) +
                        " (data section is " + std::to_string(data_size) + " bytes, tensors end at " +
                        std::to_string(expect) + ")");
  return names;
}

}  // namespace

// The phases above, in order: what the file is, the header length, the
// header and its entries, the tiling of the data section.
SafetensorsFile SafetensorsFile::from_bytes(std::shared_ptr<const void> bytes, size_t size_in,
                                            const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const uint64_t size = size_in;
  if (size < 8 || bytes == nullptr)
    fail_file(path, "file too small: " + std::to_string(size) + " bytes, need at least 8");
  f.file_size_ = size_in;
  f.mapping_ = std::move(bytes);
  const auto* base = static_cast<const unsigned char*>(f.mapping_.get());
  const bool brace = check_format(path, base, f.file_size_);
  const uint64_t n = header_length(path, base, size, brace);
  f.data_start_ = 8 + static_cast<size_t>(n);
  const size_t data_size = f.file_size_ - f.data_start_;
  Header h = read_header(path, base + 8, n, data_size);
  f.metadata_ = std::move(h.metadata);
  for (TensorRange& t : h.tensors) f.index_.emplace(t.name, Entry{t.dtype, t.shape, t.begin, t.end});
  f.names_ = tile_data_section(path, h.tensors, data_size);
  return f;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw Error(ErrorCode::kInvalidArgument, "safetensors.get",
                path_ + ": no tensor named '" + printable(name) + "'");
  const Entry& e = it->second;
  // The mapping is PROT_READ: the view's pointer is non-const only because
  // TensorView is shared with writable tensors. Writing through it faults.
  // safetensors offsets are byte offsets: a tensor whose data is not aligned
  // for its dtype (possible in files other writers made) is copied to an
  // aligned buffer, so every consumer may read it through a typed pointer.
  const char* p = static_cast<const char*>(mapping_.get()) + data_start_ + e.begin;
  TensorView view(const_cast<char*>(p), e.dtype, e.shape);
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) != 0) return Tensor::copy_of(view);
  return Tensor::borrow(mapping_, view);
}

// ============================================================================
// Writer
// ============================================================================

namespace {

[[noreturn]] void fail_arg(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "safetensors.write", what);
}

// Writes all of [p, p + n), retrying on EINTR and short writes.
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    // Linux caps a single write at ~2 GiB; chunk to stay well under it.
    const size_t chunk = std::min<size_t>(n, size_t(1) << 30);
    const ssize_t w = ::write(fd, c, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

void SafetensorsWriter::add(const std::string& name, const TensorView& t) {
  // The reserved key cannot name a tensor.
  if (name == kMetadataKey) fail_arg("tensor name \"__metadata__\" is reserved");
  for (const auto& [n, v] : tensors_) {
    (void)v;
    if (n == name) fail_arg("duplicate tensor name '" + name + "'");
  }
  // The data is copied from host memory at write() time.
  if (t.device != Device::kCPU)
    fail_arg("tensor '" + name + "' is on " + device_name(t.device) + ", expected cpu");
  if (!t.is_contiguous())
    fail_arg("tensor '" + name + "' of shape " + shape_str(t.shape) + " is not contiguous");
  // Shapes must be non-negative and their byte size representable.
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0) fail_arg("tensor '" + name + "' has negative dim in shape " + shape_str(t.shape));
    const auto p = checked_mul(numel, static_cast<uint64_t>(d));
    if (!p) fail_arg("tensor '" + name + "' element count of shape " + shape_str(t.shape) + " overflows");
    numel = *p;
  }
  const auto bytes_or = checked_mul(numel, static_cast<uint64_t>(dtype_size(t.dtype)));
  const uint64_t bytes = bytes_or.value_or(0);
  if (!bytes_or || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail_arg("tensor '" + name + "' byte size of shape " + shape_str(t.shape) + " overflows");
  if (bytes > 0 && t.data == nullptr) fail_arg("tensor '" + name + "' has null data");
  tensors_.emplace_back(name, t);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path, const std::vector<std::string>& forbid,
                              const std::function<void(const std::string&)>& check) const {
  // ---- only a regular file (or nothing) is replaced ----------------------------
  // rename() would replace a FIFO, a socket or a device node with a regular
  // file; a link is replaced itself, so its target must be a regular file too.
  // (A directory there makes the rename fail, after the temporary is written.)
  struct stat out_lst {};
  if (::lstat(path.c_str(), &out_lst) == 0) {
    struct stat tgt {};
    const bool link = S_ISLNK(out_lst.st_mode);
    if (!link && !S_ISREG(out_lst.st_mode) && !S_ISDIR(out_lst.st_mode))
      fail_arg(path + " exists and is " + file_kind(out_lst.st_mode) + ", not a regular file: refusing to replace it");
    if (link && ::stat(path.c_str(), &tgt) == 0 && !S_ISREG(tgt.st_mode) && !S_ISDIR(tgt.st_mode))
      fail_arg(path + " is a link to " + file_kind(tgt.st_mode) + ", not a regular file: refusing to replace it");
  }
  // ---- never replace an input, whatever name it is reached by ----------------
  struct stat out_st {};
  if (::stat(path.c_str(), &out_st) == 0) {
    for (const std::string& f : forbid) {
      struct stat in_st {};
      if (::stat(f.c_str(), &in_st) != 0) continue;  // absent inputs cannot be overwritten
      if (in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
        fail_arg("refusing to write over input " + f + " (output path " + path + ")");
    }
  }

  // ---- header ----------------------------------------------------------------
  // ordered_json keeps __metadata__ first and the tensors in file order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  // Layout order: by element size, largest first (stable: the order added within
  // a size). The data section starts 8-aligned and every size is a power of two,
  // so every tensor lands aligned for its dtype and readers may use it in place.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors_[a].second.dtype) > dtype_size(tensors_[b].second.dtype);
  });
  uint64_t offset = 0;  // back to back, in layout order
  for (size_t i : order) {
    const auto& [name, t] = tensors_[i];
    const uint64_t bytes = t.nbytes();  // validated non-overflowing in add()
    header[name] = {{"dtype", dtype_name(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    fail_arg(path + ": cannot encode header: " + e.what());
  }
  // Pad with spaces so the data section starts on an 8-byte boundary.
  text.append((kDataAlign - (8 + text.size()) % kDataAlign) % kDataAlign, ' ');
  if (text.size() > kMaxHeaderBytes)
    fail_arg(path + ": header of " + std::to_string(text.size()) + " bytes exceeds the cap of " +
             std::to_string(kMaxHeaderBytes) + " bytes");
  unsigned char prefix8[8];
  for (int i = 0; i < 8; ++i) prefix8[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  // ---- temp file, fsync, check, rename ----------------------------------------
  // The temporary is `.NAME.qhead-tmp-PID` beside `path` (hidden, and named
  // for the stale-temporary rule of stale_temp.h: those of killed writers of
  // the same output are removed here).
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string prefix = "." + base + ".qhead-tmp-";
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> stale;
    while (const dirent* e = ::readdir(d))
      if (io::stale_temp_pid(e->d_name, prefix)) stale.push_back(dir + "/" + e->d_name);
    ::closedir(d);
    for (const std::string& f : stale) ::unlink(f.c_str());  // unlink removes a name, never truncates
  }
  const std::string tmp = dir + "/" + prefix + std::to_string(::getpid());
  auto fail_io = [&](const std::string& step, int err, int fd) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIo, "safetensors.write", path + ": " + step + ": " + errno_str(err));
  };
  // A file of our own pid's name is an earlier process's leftover (that
  // process is gone: we have its pid). O_EXCL | O_NOFOLLOW: the temporary is
  // always a new file, never an existing file or a link's target.
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    const int err = errno;
    throw Error(ErrorCode::kIo, "safetensors.write",
                path + ": cannot create " + tmp + ": " + errno_str(err));
  }
  if (!write_all(fd, prefix8, sizeof prefix8) || !write_all(fd, text.data(), text.size()))
    fail_io("write failed", errno, fd);
  for (size_t i : order) {
    const auto& [name, t] = tensors_[i];
    (void)name;
    if (t.nbytes() > 0 && !write_all(fd, t.data, t.nbytes())) fail_io("write failed", errno, fd);
  }
  if (::fsync(fd) != 0) fail_io("fsync failed", errno, fd);
  if (::close(fd) != 0) fail_io("close failed", errno, -1);
  if (check) {
    try {
      check(tmp);
    } catch (...) {
      ::unlink(tmp.c_str());  // `path` is left as it was
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail_io("rename failed", errno, -1);

  // Best effort: persist the rename itself by syncing the directory entry.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace qhead
