// The version and commit this binary was built from: `qhead --version`, and
// the self-describing rows of `qhead bench --json`.
#include "qhead_build_info.h"  // QHEAD_GIT_COMMIT, written at build time (cmake/build_info.cmake)
#include "version.h"

#ifndef QHEAD_VERSION
#error "QHEAD_VERSION (the CMake project version) must be defined"
#endif

namespace qhead::cli {

const char* version() { return QHEAD_VERSION; }
const char* git_commit() { return QHEAD_GIT_COMMIT; }
std::string version_line() { return std::string("qhead ") + version() + " (commit " + git_commit() + ")"; }

}  // namespace qhead::cli
