#include "qhead/scheme.h"

#include <charconv>

#include "qhead/checked.h"
#include "qhead/error.h"

namespace qhead {

void QuantScheme::validate() const {
  if (bits < 2 || bits > 8)
    throw Error(ErrorCode::kInvalidArgument, "QuantScheme",
                "bits must be in 2..8, got " + std::to_string(bits));
  if (group_size == 0 || group_size < -1)
    throw Error(ErrorCode::kInvalidArgument, "QuantScheme",
                "group_size must be -1 (per row) or positive, got " + std::to_string(group_size));
  if (!is_float_dtype(scale_dtype))
    throw Error(ErrorCode::kInvalidArgument, "QuantScheme",
                std::string("scale dtype must be F16, BF16 or F32, got ") + dtype_name(scale_dtype));
}

void QuantScheme::check_hidden(int64_t h, const std::string& op, const std::string& tensor) const {
  if (h <= 0)
    throw Error(ErrorCode::kInvalidArgument, op, tensor + ": hidden size must be positive, got " + std::to_string(h));
  if (!per_row() && h % group_size != 0)
    throw Error(ErrorCode::kInvalidArgument, op,
                tensor + ": hidden size " + std::to_string(h) + " is not a multiple of group size " +
                    std::to_string(group_size) + " (scheme " + name() +
                    "); partial groups are not supported — pick a group size dividing H or per-row");
}

int64_t QuantScheme::table_bytes(int64_t v, int64_t h, const std::string& op, const std::string& tensor) const {
  const int64_t g = groups(h);
  const auto codes = checked_product({v, packed_cols(h), 4});
  const auto scales = checked_product({v, g, static_cast<int64_t>(dtype_size(scale_dtype))});
  const auto zeros = symmetric ? std::optional<int64_t>(0) : checked_product({zero_point_rows(v), g, 4});
  std::optional<int64_t> total;
  if (codes && scales && zeros)
    if (const auto cs = checked_add(*codes, *scales)) total = checked_add(*cs, *zeros);
  if (!total || v < 0 || h < 0 || g < 0)
    throw Error(ErrorCode::kInvalidArgument, op,
                tensor + ": a [" + std::to_string(v) + ", " + std::to_string(h) + "] table packed as " + name() +
                    " has a byte size that does not fit in 64 bits");
  return *total;
}

std::string QuantScheme::name() const {
  std::string s = "w" + std::to_string(bits);
  if (!per_row()) s += "g" + std::to_string(group_size);
  if (!symmetric) s += "a";
  return s;
}

QuantScheme QuantScheme::parse(std::string_view name, DType scale_dtype) {
  auto fail = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, "QuantScheme::parse",
                 "bad scheme name '" + std::string(name) + "': " + why +
                     " (expected w<bits>[g<32|64|128|256>][a], e.g. w4g64, w8, w4g128a)");
  };
  QuantScheme s;
  s.scale_dtype = scale_dtype;
  std::string_view r = name;
  if (r.empty() || r[0] != 'w') throw fail("must start with 'w'");
  r.remove_prefix(1);
  auto read_int = [&](int& out) {
    auto [p, ec] = std::from_chars(r.data(), r.data() + r.size(), out);
    if (ec != std::errc() || p == r.data()) return false;
    r.remove_prefix(static_cast<size_t>(p - r.data()));
    return true;
  };
  if (!read_int(s.bits)) throw fail("missing bit width");
  if (s.bits < 2 || s.bits > 8) throw fail("bits must be 2..8");
  if (!r.empty() && r[0] == 'g') {
    r.remove_prefix(1);
    if (!read_int(s.group_size)) throw fail("missing group size after 'g'");
    if (s.group_size != 32 && s.group_size != 64 && s.group_size != 128 && s.group_size != 256)
      throw fail("group size must be 32, 64, 128 or 256");
  }
  if (!r.empty() && r[0] == 'a') {
    s.symmetric = false;
    r.remove_prefix(1);
  }
  if (!r.empty()) throw fail("unexpected '" + std::string(r) + "'");
  s.validate();
  return s;
}

}  // namespace qhead
