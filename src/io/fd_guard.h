// Closes a file descriptor on scope exit, and opens input files without ever
// blocking (internal to the readers in src/io).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "qhead/error.h"

namespace qhead::io {

struct FdGuard {
  int fd = -1;
  explicit FdGuard(int f) : fd(f) {}
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  // Gives up ownership (to close it explicitly and check the result).
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// What a stat mode is, for messages ("a FIFO").
inline std::string file_kind(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

// Opens `path` read-only for mapping, refusing anything that is not a regular
// file. A FIFO, socket or device is refused by stat() before open() is tried
// (open() of a FIFO blocks until a writer appears); the open itself uses
// O_NONBLOCK and fstat() re-checks the descriptor, so a path swapped for a
// FIFO in between cannot block either. Returns the descriptor and its stat;
// throws Error(kIo, where) naming the path.
inline int open_regular_file(const std::string& path, const char* where, struct stat* st) {
  auto fail = [&](const std::string& what) { throw Error(ErrorCode::kIo, where, path + ": " + what); };
  auto kind = [](mode_t m) { return file_kind(m); };
  if (::stat(path.c_str(), st) != 0) fail(std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st->st_mode)) fail("not a regular file (it is " + kind(st->st_mode) + ")");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(std::string("fstat failed: ") + std::strerror(err));
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    fail("not a regular file (it is " + kind(st->st_mode) + ")");
  }
  return fd;
}

}  // namespace qhead::io
