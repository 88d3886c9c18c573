// The one reader of the JSON files of a model directory (config.json,
// model.safetensors.index.json, quantize_config.json), internal to src/io.
//
// Everything in such a file is untrusted. The reader
// - stats the path first and reads regular files only (a FIFO would block, a
//   link to /dev/zero would never end), at most kMaxJsonFileBytes of them;
// - parses with a nesting bound (kMaxJsonDepth: nlohmann's dump, copy and
//   comparison recurse, so a deeper value could overflow the stack later) and
//   a bound on the number of values (kMaxJsonValues: memory);
// - refuses a duplicate key in any object (nlohmann and Python's json keep
//   the last one; a reader keeping the first would see another config);
// and reports each as a qhead::Error naming the file. A value read this way
// and any part of it can be dumped, copied and compared without deep recursion.
//
// The typed getters below read a member of a parsed object and throw an
// Error naming the key and the file when it has another type or its number
// does not fit: a number is never truncated or wrapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace qhead::io {

constexpr size_t kMaxJsonFileBytes = size_t(64) << 20;  // 64 MiB: an index of 10^5 tensors is ~10 MiB
constexpr int kMaxJsonDepth = 64;                       // nesting levels of arrays and objects
constexpr size_t kMaxJsonValues = size_t(1) << 21;      // values of any kind, keys not counted

// Reads `path` as one JSON object (not an array or a scalar).
nlohmann::json read_json_object(const std::string& path);
// The same with the file's key order kept (GPTQ dynamic rules: the first match wins).
nlohmann::ordered_json read_ordered_json_object(const std::string& path);

// j.dump(2) of a value read by the reader above (or built from parts of one),
// as an Error naming `path` when it cannot be serialized.
std::string dump_json(const nlohmann::json& j, const std::string& path);

// The JSON type of `v` as a config's author would name it ("a string", "an object", ...).
std::string json_kind(const nlohmann::json& v);

// The integer `v` (its key `key`, e.g. "quantization_config.bits", in `file`)
// within [lo, hi]. Accepts integer literals and floats with no fraction
// (4.0); refuses other types, fractions and values outside the range.
int64_t json_int(const nlohmann::json& v, const std::string& key, const std::string& file, int64_t lo, int64_t hi);

// obj[key] through json_int, or nullopt when obj has no such key (or null
// when `null_is_absent`). `path` names the object in messages ("" = top level).
std::optional<int64_t> json_opt_int(const nlohmann::json& obj, const std::string& path, const char* key,
                                    const std::string& file, int64_t lo, int64_t hi, bool null_is_absent = false);

// obj[key] as a string, `dflt` when absent or null; another type is an Error.
std::string json_opt_string(const nlohmann::json& obj, const std::string& path, const char* key,
                            const std::string& file, const std::string& dflt);

// obj[key] as a bool, `dflt` when absent or null; another type is an Error.
bool json_opt_bool(const nlohmann::json& obj, const std::string& path, const char* key, const std::string& file,
                   bool dflt);

}  // namespace qhead::io
