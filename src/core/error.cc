#include "qhead/error.h"

namespace qhead {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kInvalidFile: return "invalid file";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal error";
  }
  return "error";
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kInvalidFile: return "invalid_file";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

Error::Error(ErrorCode code, const std::string& where, const std::string& what)
    : std::runtime_error(where + ": " + what), code_(code) {}

namespace {

// The escaped form of the first `max_bytes` bytes of `bytes`.
std::string escape_prefix(std::string_view bytes, size_t max_bytes) {
  static const char* const kHex = "0123456789abcdef";
  const size_t n = bytes.size() < max_bytes ? bytes.size() : max_bytes;
  std::string out;
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
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

std::string cut_note(std::string_view bytes) { return " (" + std::to_string(bytes.size()) + " bytes)"; }

}  // namespace

std::string escape_bytes(std::string_view bytes, size_t max_bytes) {
  std::string s = escape_prefix(bytes, max_bytes);
  if (bytes.size() > max_bytes) s += "\u2026" + cut_note(bytes);
  return s;
}

std::string quote_bytes(std::string_view bytes, size_t max_bytes) {
  const std::string s = escape_prefix(bytes, max_bytes);
  if (bytes.size() > max_bytes) return "\"" + s + "\u2026\"" + cut_note(bytes);
  return "\"" + s + "\"";
}

}  // namespace qhead
