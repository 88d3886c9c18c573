#include "io/pattern.h"

#include <re2/re2.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "qhead/error.h"

namespace qhead::io {
namespace {

// Compiled patterns by text; cleared when full (a checkpoint has few distinct
// patterns, each matched against one or two module names per read). Bounded
// by count and by the programs' instructions (~16 bytes each) held.
constexpr size_t kCacheEntries = 1024;
constexpr int64_t kCacheInstructions = int64_t(1) << 20;
int64_t cached_instructions = 0;  // guarded by cache_mutex()

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<std::string, std::shared_ptr<const RE2>>& cache() {
  static std::unordered_map<std::string, std::shared_ptr<const RE2>> c;
  return c;
}

std::shared_ptr<const RE2> compile(const std::string& pattern, const std::string& where, const std::string& what) {
  {
    const std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = cache().find(pattern);
    if (it != cache().end()) return it->second;
  }
  const std::string shown = what + " pattern " + quote_bytes(pattern);
  if (pattern.size() > kMaxPatternBytes)
    throw Error(ErrorCode::kUnsupported, where,
                shown + " is " + std::to_string(pattern.size()) + " bytes; qhead reads patterns of at most " +
                    std::to_string(kMaxPatternBytes) + " bytes");
  RE2::Options opt;
  opt.set_log_errors(false);  // an error is reported as an Error, never on stderr
  opt.set_max_mem(kMaxPatternMemory);
  opt.set_encoding(RE2::Options::EncodingUTF8);
  auto re = std::make_shared<const RE2>(pattern, opt);
  if (!re->ok())
    throw Error(ErrorCode::kUnsupported, where,
                shown + " is not a regular expression qhead can match (" + escape_bytes(re->error(), 200) +
                    "; backreferences and lookaround are not supported)");
  const std::lock_guard<std::mutex> lock(cache_mutex());
  const int64_t size = re->ProgramSize();
  if (size > kCacheInstructions) return re;  // used once, not kept
  if (cache().size() >= kCacheEntries || cached_instructions + size > kCacheInstructions) {
    cache().clear();
    cached_instructions = 0;
  }
  if (cache().emplace(pattern, re).second) cached_instructions += size;
  return re;
}

}  // namespace

bool pattern_match_start(const std::string& pattern, std::string_view name, const std::string& where,
                         const std::string& what) {
  const std::shared_ptr<const RE2> re = compile(pattern, where, what);
  return re->Match(re2::StringPiece(name.data(), name.size()), 0, name.size(), RE2::ANCHOR_START, nullptr, 0);
}

}  // namespace qhead::io
