// The command line's contract with scripts: exit codes, one-line (or JSON)
// errors, argument checks with clear messages, and the nearest valid name for
// a mistyped option or command.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "qhead/error.h"

namespace qhead::cli {

// Exit statuses (README "Exit codes"). `qhead tp-run` exits with the first
// failing rank's own status instead.
enum Exit : int {
  kExitOk = 0,
  kExitFailed = 1,    // the work failed: a library error (invalid file, unsupported input) or a failed check
  kExitUsage = 2,     // a usage error: unknown command or option, a missing or invalid value (invalid_argument)
  kExitInternal = 3,  // an internal error: a bug, out of memory, any exception that is not a qhead::Error
  kExitIo = 4,        // a file or directory that cannot be opened, read or written (stdout included)
};

// The status and the JSON "code" of a library error.
int exit_status(ErrorCode code);

// A usage error found by the CLI itself: `where` is "qhead" or "qhead <command>".
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& where, const std::string& what) : std::runtime_error(where + ": " + what) {}
};

// Edit distance with adjacent transpositions (optimal string alignment):
// "--shceme" is 1 from "--scheme".
int edit_distance(const std::string& a, const std::string& b);
// The candidate nearest to `word` if it is close enough to be a plausible
// typo (1 edit in names of up to 3 letters, 2 up to 6, else 3; leading dashes
// not counted; one-letter names never suggested), else "".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// Before CLI11 parses: the first unknown option of the command (or of qhead
// itself), an unknown command, or a missing command, as a UsageError naming
// the nearest valid name. Runs first so that a mistyped option is what the
// user hears about, not the required option it kept from being seen.
// Arguments after "--" are not looked at.
void check_names(CLI::App& app, int argc, char** argv);

// Whether the command line asks for JSON output (`--json` before any "--").
bool json_requested(int argc, char** argv);

// A CLI11 parse error as the one-line message of a UsageError.
UsageError usage_error(const CLI::App& app, int argc, char** argv, const CLI::ParseError& e);

// Validators with messages that name what is expected:
//   int_range(0, 1024, "0: all cores")  an integer in [lo, hi] (`note` says what a special value means)
//   int_list(1, 65536)                  comma-separated integers, each in [lo, hi]
//   shape_list()                        comma-separated VxH, V and H in [1, 2^31 - 1], V x H x 4 bytes
//                                       within the int64 range
// (Scheme names are checked where they are used, by QuantScheme::parse: an
// invalid_argument error, exit status 2 like every usage error.)
CLI::Validator int_range(int64_t lo, int64_t hi, const std::string& note = "");
CLI::Validator int_list(int64_t lo, int64_t hi);
CLI::Validator shape_list();

// The process's command line, each argument shell-quoted where needed.
std::string command_line(int argc, char** argv);

}  // namespace qhead::cli
