// qhead/error.h — the one error type of the library.
//
// Library code never aborts on input (docs/architecture.md, Decisions): malformed files,
// bad shapes, ids out of range, NaN scales all throw qhead::Error, whose
// message names the op, the tensor, the shape and the file where they are
// known. Only the CLI turns an Error into an exit status.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace qhead {

// Broad category, so callers (and tests) can branch without parsing text.
enum class ErrorCode {
  kInvalidArgument,  // bad shape, dtype, scheme, id out of range
  kInvalidFile,      // malformed safetensors / checkpoint content
  kIo,               // open/read/write/rename failed
  kUnsupported,      // valid input we do not handle (yet)
  kInternal,
};

const char* to_string(ErrorCode code);
// The code as an identifier: "invalid_argument", "invalid_file", "io",
// "unsupported", "internal" (the CLI's JSON errors, the Python exceptions' .code).
const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  // `where` is the op or file-level context ("safetensors.read", "embed"),
  // `what` a sentence saying what was found and what was expected.
  Error(ErrorCode code, const std::string& where, const std::string& what);

  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Bytes from a file (a tensor name, a JSON key, a pattern) made safe to put
// into a message: in double quotes, `"` and `\` escaped, every byte outside
// printable ASCII written \xNN, and a string longer than `max_bytes` cut
// there with "…" and its full length appended.
std::string quote_bytes(std::string_view bytes, size_t max_bytes = 200);

// The same escaping without the quotes (for text that quotes file bytes
// itself, such as a JSON parser's message).
std::string escape_bytes(std::string_view bytes, size_t max_bytes = 200);

}  // namespace qhead
