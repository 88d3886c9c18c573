// The version (the CMake project version) and git commit of this binary.
#pragma once

#include <string>

namespace qhead::cli {

const char* version();     // "0.1.0"
const char* git_commit();  // "59601fa1b2c3", with "-dirty" when built from modified files; "unknown" outside git
std::string version_line();  // "qhead 0.1.0 (commit 59601fa1b2c3)"

}  // namespace qhead::cli
