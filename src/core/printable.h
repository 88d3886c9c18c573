// File-supplied bytes (tensor names, keys, dtype strings) made safe to put in
// an error message: every byte outside printable ASCII is written as \xNN
// (and a backslash as \\), so a hostile name cannot emit terminal escapes or
// line breaks, and the text is cut after `max_bytes` input bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qhead {

inline std::string printable(std::string_view s, size_t max_bytes = 160) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() < max_bytes ? s.size() : max_bytes);
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == max_bytes) {
      out += "... (" + std::to_string(s.size()) + " bytes)";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace qhead
