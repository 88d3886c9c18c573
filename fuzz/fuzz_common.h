// Shared pieces of the libFuzzer targets: the fixture directory, a private
// temporary directory per fuzzing process, and the one rule every target
// applies — qhead::Error is the only outcome allowed besides success.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "qhead/error.h"
#include "qhead/model.h"

namespace qhead::fuzz {

namespace fs = std::filesystem;

// tests/fixtures: $QHEAD_FUZZ_FIXTURES, else the source tree the target was
// built from, else ./tests/fixtures (a copy of the repository run elsewhere).
inline fs::path fixture_dir() {
  if (const char* e = std::getenv("QHEAD_FUZZ_FIXTURES")) return e;
  if (fs::is_directory(QHEAD_FIXTURE_DIR)) return QHEAD_FIXTURE_DIR;
  return fs::path("tests") / "fixtures";
}

// A directory of this process's own, removed at exit (libFuzzer's -fork and
// -jobs workers are separate processes, each with its own).
inline const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    std::string tmpl = (fs::temp_directory_path() / "qhead-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("qhead fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch_dir(), ec);
    });
    return fs::path(tmpl);
  }();
  return dir;
}

inline void write_file(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "qhead fuzz: cannot write %s\n", p.c_str());
    std::abort();
  }
}

inline void copy_fixture(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    std::fprintf(stderr, "qhead fuzz: cannot copy %s: %s\n", from.c_str(), ec.message().c_str());
    std::abort();
  }
}

// The input in a 64-byte-aligned buffer of its own (as a file mapping would
// be page-aligned), so ASan sees every read past its end.
inline std::shared_ptr<const void> aligned_copy(const uint8_t* data, size_t size) {
  void* p = std::aligned_alloc(64, (size + 63) / 64 * 64 + 64);
  if (!p) std::abort();
  if (size) std::memcpy(p, data, size);
  return std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
}

// Runs `body`; a qhead::Error is the expected way to refuse an input. Any
// other exception escapes to libFuzzer, which reports it as a crash.
// With QHEAD_FUZZ_VERBOSE set, each refusal is printed (to see where seeds stop).
template <class F>
void expect_only_qhead_errors(F&& body) {
  static const bool verbose = std::getenv("QHEAD_FUZZ_VERBOSE") != nullptr;
  try {
    body();
  } catch (const qhead::Error& e) {
    if (verbose) std::fprintf(stderr, "qhead::Error: %s\n", e.what());
  }
}

// The model-directory targets: the input becomes `file` of the directory
// `dir` (the other files fixed), which is then inspected and loaded.
inline void run_model_dir_input(const fs::path& dir, const char* file, const uint8_t* data, size_t size) {
  write_file(dir / file, data, size);
  expect_only_qhead_errors([&] {
    (void)inspect_model(dir.string());
    (void)load_model_tables(dir.string());
  });
}

}  // namespace qhead::fuzz
