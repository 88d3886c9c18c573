// qhead/error.h — the one error type of the library.
//
// Library code never aborts on input (DESIGN.md, decision 4): malformed files,
// bad shapes, ids out of range, NaN scales all throw qhead::Error, whose
// message names the op, the tensor, the shape and the file where they are
// known. Only the CLI turns an Error into an exit status.
#pragma once

#include <stdexcept>
#include <string>

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

class Error : public std::runtime_error {
 public:
  // `where` is the op or file-level context ("safetensors.read", "embed"),
  // `what` a sentence saying what was found and what was expected.
  Error(ErrorCode code, const std::string& where, const std::string& what);

  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace qhead
