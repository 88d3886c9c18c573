// Closes a file descriptor on scope exit (internal to the readers in src/io).
#pragma once

#include <unistd.h>

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

}  // namespace qhead::io
