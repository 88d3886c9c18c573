// Closes a file descriptor on scope exit (internal to the readers in src/io).
#pragma once

#include <unistd.h>

namespace qhead::io {

struct FdGuard {
  int fd = -1;
  explicit FdGuard(int f) : fd(f) {}
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace qhead::io
