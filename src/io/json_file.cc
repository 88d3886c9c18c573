#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "io/fd_guard.h"
#include "qhead/error.h"

namespace qhead::io {
namespace {

using nlohmann::json;

[[noreturn]] void invalid(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidFile, where, what);
}

std::string mib(size_t b) { return std::to_string(b >> 20) + " MiB"; }

// The bytes of `path`, a regular file of at most kMaxJsonFileBytes. The type
// is checked with stat before the open (opening a FIFO blocks) and again on
// the descriptor (the path may have changed in between).
std::string read_file_bounded(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) invalid(path, "is missing (or a link to nothing)");
    throw Error(ErrorCode::kIo, path, std::string("cannot be read: ") + std::strerror(e));
  }
  auto check = [&](const struct stat& s) {
    if (!S_ISREG(s.st_mode))
      invalid(path, std::string("is not a regular file (") +
                        (S_ISDIR(s.st_mode) ? "a directory" : S_ISFIFO(s.st_mode) ? "a FIFO"
                                                          : S_ISCHR(s.st_mode) || S_ISBLK(s.st_mode) ? "a device"
                                                          : S_ISSOCK(s.st_mode) ? "a socket" : "not a file") +
                        "); a JSON file of a model directory must be one");
    if (s.st_size < 0 || static_cast<uint64_t>(s.st_size) > kMaxJsonFileBytes)
      invalid(path, "is " + std::to_string(s.st_size) + " bytes; qhead reads JSON files of at most " +
                        mib(kMaxJsonFileBytes));
  };
  check(st);
  const FdGuard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.fd < 0) throw Error(ErrorCode::kIo, path, std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd.fd, &st) != 0) throw Error(ErrorCode::kIo, path, std::string("cannot stat: ") + std::strerror(errno));
  check(st);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() > kMaxJsonFileBytes) break;
      text.resize(std::min(kMaxJsonFileBytes + 1, text.size() + 4096));  // the file grew while being read
    }
    const ssize_t n = ::read(fd.fd, text.data() + got, text.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kIo, path, std::string("read failed: ") + std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > kMaxJsonFileBytes)
    invalid(path, "grew past " + mib(kMaxJsonFileBytes) + " while being read; qhead reads JSON files of at most " +
                      mib(kMaxJsonFileBytes));
  text.resize(got);
  return text;
}

std::string kind_of(nlohmann::detail::value_t t);

// nlohmann's SAX events -> a DOM, with the bounds checked as it grows. (The
// library's own callback parser rescans the parent object at every object end,
// quadratic in the members of an object holding objects, and ordered_json's
// operator[] searches linearly: neither is used here.)
template <class Json>
class BoundedDom {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;
  using object_t = typename Json::object_t;

  explicit BoundedDom(Json& root) : root_(root) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(number_integer_t v) { return put(v); }
  bool number_unsigned(number_unsigned_t v) { return put(v); }
  bool number_float(number_float_t v, const string_t&) { return put(v); }
  bool string(string_t& v) { return put(std::move(v)); }
  bool binary(binary_t&) { return refuse("holds a binary value"); }
  bool start_object(std::size_t) {
    if (!open(Json::object())) return false;
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) {
    if (!keys_.back().insert(k).second)
      return refuse("has duplicate key " + quote_bytes(k) + " in one object (readers disagree about which value counts)");
    object_t& obj = stack_.back()->template get_ref<object_t&>();
    // The key is new (checked above): append without the map's own search.
    if constexpr (std::is_same_v<Json, nlohmann::ordered_json>) {
      using base_t = std::vector<typename object_t::value_type>;  // ordered_map is a vector of pairs
      static_cast<base_t&>(obj).emplace_back(std::move(k), nullptr);
      slot_ = &obj.back().second;
    } else {
      slot_ = &obj.emplace(std::move(k), nullptr).first->second;
    }
    return true;
  }
  bool end_object() {
    keys_.pop_back();
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = "is not valid JSON (" + escape_bytes(e.what(), 400) + ")";
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool refuse(std::string why) {
    error_ = std::move(why);
    return false;
  }
  bool count() {
    if (++values_ <= kMaxJsonValues) return true;
    return refuse("holds more than " + std::to_string(kMaxJsonValues) + " values; qhead reads config files up to that many");
  }
  // Stores `v` where the next value goes; returns whether to go on.
  template <class V>
  Json* place(V&& v) {
    if (stack_.empty()) {
      root_ = Json(std::forward<V>(v));
      return &root_;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      auto& arr = top.template get_ref<typename Json::array_t&>();
      arr.emplace_back(std::forward<V>(v));
      return &arr.back();
    }
    *slot_ = Json(std::forward<V>(v));
    return slot_;
  }
  template <class V>
  bool put(V&& v) {
    if (!count()) return false;
    place(std::forward<V>(v));
    return true;
  }
  bool open(Json&& container) {
    // stack_.size() arrays and objects enclose this one.
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth))
      return refuse("nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) +
                    " levels; qhead reads config files up to that depth");
    if (!count()) return false;
    stack_.push_back(place(std::move(container)));
    return true;
  }

  Json& root_;
  std::vector<Json*> stack_;               // the open arrays and objects, outermost first
  std::vector<std::set<string_t>> keys_;   // the keys seen so far in each open object
  Json* slot_ = nullptr;                   // the member the next value of the innermost object goes to
  size_t values_ = 0;
  std::string error_;
};

template <class Json>
Json parse_bounded(const std::string& path, const std::string& text) {
  Json j;
  BoundedDom<Json> dom(j);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &dom, nlohmann::detail::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) invalid(path, dom.error().empty() ? std::string("is not valid JSON") : dom.error());
  return j;
}

template <class Json>
Json read_object(const std::string& path) {
  Json j = parse_bounded<Json>(path, read_file_bounded(path));
  if (!j.is_object()) invalid(path, "is not a JSON object (its top level is " + kind_of(j.type()) + ")");
  return j;
}

bool is_integral_float(double d) { return std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= 9007199254740992.0; }

std::string member(const std::string& path, const char* key) { return path.empty() ? std::string(key) : path + "." + key; }

}  // namespace

nlohmann::json read_json_object(const std::string& path) { return read_object<nlohmann::json>(path); }

nlohmann::ordered_json read_ordered_json_object(const std::string& path) {
  return read_object<nlohmann::ordered_json>(path);
}

std::string dump_json(const json& j, const std::string& path) {
  try {
    return j.dump(2);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInternal, path, std::string("cannot serialize JSON: ") + escape_bytes(e.what(), 400));
  }
}

std::string json_kind(const json& v) { return kind_of(v.type()); }

namespace {
std::string kind_of(nlohmann::detail::value_t t) {
  switch (t) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "a list";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a float";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "discarded";
  }
  return "a value";
}
}  // namespace

int64_t json_int(const json& v, const std::string& key, const std::string& file, int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  auto out_of_range = [&](const std::string& shown) {
    invalid(file, key + " is " + shown + ", outside the range " + range + " qhead accepts");
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo) out_of_range(std::to_string(u));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) out_of_range(std::to_string(i));
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!is_integral_float(d)) invalid(file, key + " is " + v.dump() + ", not an integer");
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) out_of_range(v.dump());
    return static_cast<int64_t>(d);
  }
  invalid(file, key + " has an unexpected type (" + json_kind(v) + "; expected an integer in " + range + ")");
}

std::optional<int64_t> json_opt_int(const json& obj, const std::string& path, const char* key, const std::string& file,
                                    int64_t lo, int64_t hi, bool null_is_absent) {
  if (!obj.is_object()) return std::nullopt;
  const auto it = obj.find(key);
  if (it == obj.end() || (null_is_absent && it->is_null())) return std::nullopt;
  return json_int(*it, member(path, key), file, lo, hi);
}

std::string json_opt_string(const json& obj, const std::string& path, const char* key, const std::string& file,
                            const std::string& dflt) {
  if (!obj.is_object()) return dflt;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_string())
    invalid(file, member(path, key) + " has an unexpected type (" + json_kind(*it) + "; expected a string)");
  return it->get<std::string>();
}

bool json_opt_bool(const json& obj, const std::string& path, const char* key, const std::string& file, bool dflt) {
  if (!obj.is_object()) return dflt;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean())
    invalid(file, member(path, key) + " has an unexpected type (" + json_kind(*it) + "; expected a boolean)");
  return it->get<bool>();
}

}  // namespace qhead::io
