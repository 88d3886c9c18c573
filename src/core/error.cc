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

Error::Error(ErrorCode code, const std::string& where, const std::string& what)
    : std::runtime_error(where + ": " + what), code_(code) {}

}  // namespace qhead
