// A one-line progress bar on stderr for long CLI conversions. It draws only
// when enabled (the caller passes isatty(stderr) && !json) and at most ~10
// times a second; `done` ends the line. Not thread-safe: callers serialize
// (the library's progress callbacks never overlap).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace qhead::cli {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  ~ProgressBar() { done(); }

  // True when stderr is a terminal (the only place a bar is drawn).
  static bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

  // `label`: what is in progress; `unit`: "rows" or "bytes" (bytes shown in MB).
  void update(const std::string& label, int64_t done, int64_t total, const char* unit) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (label != label_) {
      done_line();
      label_ = label;
    } else if (done < total && now - last_ < std::chrono::milliseconds(100)) {
      return;
    }
    last_ = now;
    constexpr int kWidth = 30;
    const double f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int fill = static_cast<int>(f * kWidth);
    std::string bar(static_cast<size_t>(fill), '#');
    bar.append(static_cast<size_t>(kWidth - fill), ' ');
    const bool bytes = std::string(unit) == "bytes";
    const double scale = bytes ? 1e-6 : 1.0;
    std::fprintf(stderr, "\r  %-40.40s [%s] %3d%%  %.*f/%.*f %s", label.c_str(), bar.c_str(),
                 static_cast<int>(f * 100.0), bytes ? 1 : 0, static_cast<double>(done) * scale, bytes ? 1 : 0,
                 static_cast<double>(total) * scale, bytes ? "MB" : unit);
    std::fflush(stderr);
    open_ = true;
  }
  // Ends the current line (if one is drawn).
  void done() { done_line(); }

 private:
  void done_line() {
    if (open_) std::fputc('\n', stderr);
    open_ = false;
  }
  bool enabled_;
  bool open_ = false;
  std::string label_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace qhead::cli
