// Regular expressions from checkpoint files (compressed-tensors "re:" targets
// and ignore entries, GPTQModel "dynamic" rules), internal to src/io.
//
// Both tools match with Python's re.match: anchored at the start of the
// module name, not at its end. A pattern comes from an untrusted file, so it
// is compiled by RE2 (linear-time matching, no recursion on the pattern's
// nesting, a bounded program size) rather than a backtracking engine. What RE2
// cannot express (backreferences, lookahead/lookbehind) is refused with an
// Error naming the pattern and the file, never matched differently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qhead::io {

constexpr size_t kMaxPatternBytes = size_t(64) << 10;  // longer patterns are refused
constexpr int64_t kMaxPatternMemory = int64_t(4) << 20;  // RE2 max_mem per compiled pattern
// The patterns of one config together (compiling costs ~1 ms per KiB): the
// readers refuse a config whose patterns add up to more.
constexpr size_t kMaxPatternBytesTotal = size_t(1) << 20;

// Python re.match(pattern, name) is not None. `where` (the file) and `what`
// (the key holding the pattern, e.g. "quantization_config.ignore") name it in
// an Error when the pattern is refused. Compiled patterns are cached.
bool pattern_match_start(const std::string& pattern, std::string_view name, const std::string& where,
                         const std::string& what);

}  // namespace qhead::io
