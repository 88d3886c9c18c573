// Names of the temporary files and directories the writers leave beside their
// output while they work, and how a later run tells that one is stale (its
// writer was killed): internal to src/io.
//
// A writer's temporary name is `<prefix><pid>`, with the writer's process id.
// A temporary is stale when no process of that id exists any more. A live
// process of that id (the writer itself, or an unrelated process that reused
// the id) keeps it: a stale temporary is sometimes kept, a live one is never
// removed.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <optional>
#include <string>

namespace qhead::io {

// The writer's pid when `name` is `prefix` followed by decimal digits and that
// process no longer exists; nullopt otherwise (another name, or a live writer).
inline std::optional<pid_t> stale_temp_pid(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 9) return std::nullopt;  // pid_t is at most 2^22 on Linux
  long pid = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    pid = pid * 10 + (c - '0');
  }
  if (pid <= 0) return std::nullopt;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return std::nullopt;  // alive (or not ours to see)
  return static_cast<pid_t>(pid);
}

}  // namespace qhead::io
