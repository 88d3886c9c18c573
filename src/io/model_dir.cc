// Hugging Face model directories: config.json + safetensors (single or
// sharded), the two roles of the token table, tie, and compressed-tensors
// quantization_config. See include/qhead/model.h for the rules.
#include "qhead/model.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <vector>

#include "qhead/checked.h"
#include "io/json_file.h"
#include "io/pattern.h"
#include "qhead/error.h"
#include "core/parallel.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"

namespace qhead {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void invalid(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidFile, where, what);
}
[[noreturn]] void unsupported(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kUnsupported, where, what);
}

json read_json(const fs::path& p) { return io::read_json_object(p.string()); }

// Whether `p` exists (a dangling link counts as absent), as an Error for
// what stat cannot tell (a link loop, a name too long, no permission): never
// a std::filesystem exception.
bool path_exists(const fs::path& p) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw Error(ErrorCode::kIo, p.string(), "cannot be read: " + ec.message());
  return fs::exists(st);
}

// At most this many distinct shards in an index (the largest published
// checkpoints have a few hundred): each is mapped and its header parsed.
constexpr size_t kMaxShards = 16384;

// ---- the tensors of a directory (one file or shards) -------------------------

struct Files {
  std::vector<SafetensorsFile> files;
  std::map<std::string, size_t> where;  // tensor name -> index into files

  bool contains(const std::string& n) const { return where.count(n) != 0; }
  const SafetensorsFile& file_of(const std::string& n) const { return files[where.at(n)]; }
  Tensor get(const std::string& n) const { return file_of(n).get(n); }
};

Files open_files(const fs::path& dir) {
  Files f;
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (path_exists(index)) {
    const std::string iw = index.string();
    const json j = read_json(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      invalid(iw, "has no object \"weight_map\"" +
                      (j.contains("weight_map") ? " (it is " + io::json_kind(j["weight_map"]) + ")" : std::string()));
    std::map<std::string, size_t> shard_ix;
    std::map<std::pair<dev_t, ino_t>, std::string> shard_files;  // (device, inode) -> shard name
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      const std::string entry = "weight_map[" + quote_bytes(tensor) + "]";
      if (!shard.is_string())
        invalid(iw, entry + " is " + io::json_kind(shard) + ", not a file name");
      const std::string s = shard.get<std::string>();
      // A plain file name inside the directory: no path, no parent, no NUL
      // (the name would end there when opened), no control characters.
      const bool plain = !s.empty() && s != "." && s != ".." &&
                         std::none_of(s.begin(), s.end(), [](char c) { return c == '/' || static_cast<unsigned char>(c) < 0x20; });
      if (!plain)
        invalid(iw, entry + " names " + quote_bytes(s) + ", not a plain file name in the directory");
      auto it = shard_ix.find(s);
      if (it == shard_ix.end()) {
        const fs::path sp = dir / s;
        struct stat st {};
        if (::stat(sp.c_str(), &st) != 0) {
          const int e = errno;
          if (e == ENOENT)
            invalid(iw, "shard " + escape_bytes(s) + " (holding " + quote_bytes(tensor) + ") is missing from " + dir.string());
          throw Error(ErrorCode::kIo, sp.string(), std::string("cannot be read (") + entry + "): " + std::strerror(e));
        }
        if (!S_ISREG(st.st_mode))
          invalid(iw, entry + " names " + quote_bytes(s) + ", which is not a regular file");
        const auto [fit, fresh] = shard_files.emplace(std::make_pair(st.st_dev, st.st_ino), s);
        if (!fresh)
          invalid(iw, "shards " + quote_bytes(fit->second) + " and " + quote_bytes(s) + " are the same file; each shard must be its own file");
        if (shard_ix.size() >= kMaxShards)
          unsupported(iw, "names more than " + std::to_string(kMaxShards) + " shards; qhead reads at most that many");
        it = shard_ix.emplace(s, f.files.size()).first;
        f.files.push_back(SafetensorsFile::open(sp.string()));
      }
      const SafetensorsFile& sf = f.files[it->second];
      if (!sf.contains(tensor))
        invalid(iw, "names tensor " + quote_bytes(tensor) + " in shard " + quote_bytes(s) + ", but " + sf.path() + " does not hold it");
      f.where[tensor] = it->second;
    }
    // Tensors a shard holds beyond the index are still usable.
    for (size_t i = 0; i < f.files.size(); ++i)
      for (const auto& n : f.files[i].names()) f.where.emplace(n, i);
  } else if (path_exists(single)) {
    f.files.push_back(SafetensorsFile::open(single.string()));
    for (const auto& n : f.files[0].names()) f.where[n] = 0;
  } else {
    invalid(dir.string(), "has neither model.safetensors nor model.safetensors.index.json");
  }
  return f;
}

// ---- architectures -------------------------------------------------------------

struct Family {
  const char* name;
  std::vector<std::string> model_types;
  std::vector<std::string> embedding;  // candidate weight names, first present wins
  std::vector<std::string> head;
  bool tied_default;
};

const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      {"llama", {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "phi", "smollm3"},
       {"model.embed_tokens.weight"}, {"lm_head.weight"}, false},
      {"gemma", {"gemma", "gemma2", "gemma3", "gemma3_text"},
       {"model.embed_tokens.weight", "model.language_model.embed_tokens.weight"}, {"lm_head.weight"}, true},
      {"gpt2", {"gpt2"}, {"transformer.wte.weight", "wte.weight"}, {"lm_head.weight"}, true},
      {"gpt_neox", {"gpt_neox"}, {"gpt_neox.embed_in.weight"}, {"embed_out.weight"}, false},
      {"opt", {"opt"}, {"model.decoder.embed_tokens.weight", "decoder.embed_tokens.weight"}, {"lm_head.weight"}, true},
  };
  return f;
}

// Architecture class names (config `architectures`) for configs without model_type.
const Family* family_of(const std::string& model_type, const std::string& arch) {
  for (const auto& f : families())
    for (const auto& t : f.model_types)
      if (t == model_type) return &f;
  static const std::vector<std::pair<std::string, std::string>> by_arch = {
      {"Llama", "llama"}, {"Mistral", "llama"}, {"Mixtral", "llama"}, {"Qwen2", "llama"}, {"Qwen3", "llama"},
      {"Phi", "llama"},   {"Gemma", "gemma"},   {"GPT2", "gpt2"},     {"GPTNeoX", "gpt_neox"}, {"OPT", "opt"}};
  for (const auto& [prefix, fam] : by_arch)
    if (arch.rfind(prefix, 0) == 0)
      for (const auto& f : families())
        if (fam == f.name) return &f;
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const auto& f : families())
    for (const auto& t : f.model_types) s += (s.empty() ? "" : ", ") + t;
  return s;
}

// ---- compressed-tensors matching --------------------------------------------

std::string module_of(const std::string& weight) { return packed_prefix(weight); }

bool is_regex(const std::string& t) { return t.rfind("re:", 0) == 0; }

// Python re.match (compressed-tensors' match_name, GPTQModel's dynamic rules):
// anchored at the start, not the end. `what` names the key holding the pattern.
bool regex_match_start(const std::string& pattern, const std::string& name, const std::string& where,
                       const std::string& what) {
  return io::pattern_match_start(pattern, name, where, what);
}

bool name_matches(const std::string& target, const std::string& name, const std::string& where, const std::string& what) {
  return is_regex(target) ? regex_match_start(target.substr(3), name, where, what) : target == name;
}

// At most this many config groups, and ignore entries plus targets, in a
// compressed-tensors config (real ones have a handful of groups).
constexpr size_t kMaxConfigGroups = 4096;
constexpr size_t kMaxTargets = 65536;

bool class_matches(const std::string& target, const std::string& cls) {
  return target == cls || target == "Module";
}

struct CtGroup {
  std::string name;
  json scheme;
};

// The group (if any) that quantizes `module` of class `cls`, as
// compressed-tensors' apply_quantization_config picks it.
std::optional<CtGroup> match_group(const json& qc, const std::string& module, const std::string& cls,
                                   const std::string& where) {
  const std::string ignore_key = "quantization_config.ignore";
  if (qc.contains("ignore") && !qc["ignore"].is_null()) {
    if (!qc["ignore"].is_array())
      invalid(where, ignore_key + " is " + io::json_kind(qc["ignore"]) + ", expected a list of strings");
    if (qc["ignore"].size() > kMaxTargets)
      unsupported(where, ignore_key + " has " + std::to_string(qc["ignore"].size()) + " entries; qhead reads at most " +
                             std::to_string(kMaxTargets));
    for (const auto& ig : qc["ignore"]) {
      if (!ig.is_string()) invalid(where, ignore_key + " holds " + io::json_kind(ig) + ", expected strings");
      const std::string t = ig.get<std::string>();
      if (name_matches(t, module, where, ignore_key) || class_matches(t, cls)) return std::nullopt;
    }
  }
  if (!qc.contains("config_groups") || qc["config_groups"].is_null()) return std::nullopt;
  if (!qc["config_groups"].is_object())
    invalid(where, "quantization_config.config_groups is " + io::json_kind(qc["config_groups"]) + ", expected an object");
  if (qc["config_groups"].size() > kMaxConfigGroups)
    unsupported(where, "quantization_config.config_groups has " + std::to_string(qc["config_groups"].size()) +
                           " groups; qhead reads at most " + std::to_string(kMaxConfigGroups));
  // All the patterns together are bounded (compiling costs time per byte).
  size_t pattern_bytes = 0;
  auto add_pattern_bytes = [&](const json& list) {
    if (!list.is_array()) return;
    for (const auto& t : list)
      if (t.is_string() && is_regex(t.get_ref<const std::string&>())) pattern_bytes += t.get_ref<const std::string&>().size();
  };
  if (qc.contains("ignore")) add_pattern_bytes(qc["ignore"]);
  for (const auto& [g, s] : qc["config_groups"].items())
    if (s.is_object() && s.contains("targets")) add_pattern_bytes(s["targets"]);
  if (pattern_bytes > io::kMaxPatternBytesTotal)
    unsupported(where, "quantization_config's re: patterns add up to " + std::to_string(pattern_bytes) +
                           " bytes; qhead reads at most " + std::to_string(io::kMaxPatternBytesTotal));
  // target -> group; a later group naming the same target wins (an OrderedDict update).
  std::vector<std::string> order;
  std::map<std::string, std::string> target_group;
  size_t n_targets = 0;
  for (const auto& [g, s] : qc["config_groups"].items()) {
    const std::string key = "quantization_config.config_groups." + escape_bytes(g, 100);
    if (!s.is_object()) invalid(where, key + " is not an object");
    if (!s.contains("targets") || !s["targets"].is_array())
      invalid(where, key + ".targets is missing or not a list");
    n_targets += s["targets"].size();
    if (n_targets > kMaxTargets)
      unsupported(where, "quantization_config.config_groups name more than " + std::to_string(kMaxTargets) +
                             " targets; qhead reads at most that many");
    for (const auto& t : s["targets"]) {
      if (!t.is_string()) invalid(where, key + ".targets holds a non-string (" + io::json_kind(t) + ")");
      const std::string ts = t.get<std::string>();
      if (!target_group.count(ts)) order.push_back(ts);
      target_group[ts] = g;
    }
  }
  std::vector<std::string> sorted = order;
  std::sort(sorted.begin(), sorted.end(), [](const std::string& a, const std::string& b) {
    const bool ra = a.find("re:") != std::string::npos, rb = b.find("re:") != std::string::npos;
    return ra != rb ? !ra : a < b;
  });
  std::optional<std::string> hit;
  for (const auto& t : sorted)
    if (name_matches(t, module, where, "quantization_config.config_groups.*.targets")) { hit = t; break; }
  if (!hit)
    for (const auto& t : sorted)
      if (class_matches(t, cls)) { hit = t; break; }
  if (!hit) return std::nullopt;
  const std::string g = target_group.at(*hit);
  return CtGroup{g, qc["config_groups"][g]};
}

// The QuantScheme a matched group gives `tensor` (scale dtype filled in later).
std::optional<QuantScheme> scheme_of(const json& qc, const CtGroup& grp, const std::string& tensor,
                                     const std::string& where) {
  const std::string key = "quantization_config.config_groups." + escape_bytes(grp.name, 100);
  std::string format = io::json_opt_string(qc, "quantization_config", "format", where, "pack-quantized");
  format = io::json_opt_string(grp.scheme, key, "format", where, format);
  const json w = grp.scheme.contains("weights") ? grp.scheme["weights"] : json();
  if (w.is_null()) return std::nullopt;  // activation-only group: weights stay dense
  if (!w.is_object()) invalid(where, key + ".weights is not an object");
  const std::string supported =
      "qhead reads compressed-tensors format pack-quantized with weights type int, num_bits 2..8, "
      "strategy group or channel, actorder none or \"weight\"";
  if (format != "pack-quantized")
    unsupported(where, tensor + " is quantized by " + key + " in format " + quote_bytes(format) + "; " + supported);
  const std::string type = io::json_opt_string(w, key + ".weights", "type", where, "int");
  if (type != "int") unsupported(where, tensor + ": " + key + ".weights.type is " + quote_bytes(type) + "; " + supported);
  if (!w.contains("num_bits") || w["num_bits"].is_null()) invalid(where, key + ".weights.num_bits is missing");
  const int bits = static_cast<int>(io::json_int(w["num_bits"], key + ".weights.num_bits", where, INT32_MIN, INT32_MAX));
  if (bits < 2 || bits > 8)
    unsupported(where, tensor + ": " + key + ".weights.num_bits is " + std::to_string(bits) + "; " + supported);
  // actorder "weight" (alias "static") only changed the calibration order: the
  // stored format is the plain one. "group" (alias "dynamic") needs a g_idx.
  if (w.contains("actorder") && !w["actorder"].is_null() && w["actorder"] != false &&
      w["actorder"] != "weight" && w["actorder"] != "static")
    unsupported(where, tensor + ": " + key + ".weights.actorder is " + quote_bytes(w["actorder"].dump()) + "; " + supported);
  if (w.value("dynamic", json(false)) != json(false))
    unsupported(where, tensor + ": " + key + ".weights.dynamic is " + quote_bytes(w["dynamic"].dump()) + "; " + supported);
  const std::string strategy = io::json_opt_string(w, key + ".weights", "strategy", where, "tensor");
  QuantScheme s;
  s.bits = bits;
  s.symmetric = io::json_opt_bool(w, key + ".weights", "symmetric", where, true);
  if (strategy == "group") {
    if (!w.contains("group_size") || w["group_size"].is_null())
      invalid(where, key + ".weights.group_size must be a positive integer for strategy group");
    s.group_size = static_cast<int>(io::json_int(w["group_size"], key + ".weights.group_size", where, 1, INT32_MAX));
  } else if (strategy == "channel") {
    s.group_size = -1;
  } else {
    unsupported(where, tensor + ": " + key + ".weights.strategy is " + quote_bytes(strategy) + "; " + supported);
  }
  return s;
}

// ---- role resolution -----------------------------------------------------------

struct Resolved {
  ModelInfo info;
  Files files;
};

bool has_weight(const Files& f, const std::string& weight) {
  return f.contains(weight) || f.contains(module_of(weight) + ".weight_packed") ||
         f.contains(module_of(weight) + ".qweight");
}

const char* kPackedParts[] = {".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape"};
const char* kGptqParts[] = {".qweight", ".qzeros", ".scales", ".g_idx"};

using Format = ModelInfo::Format;

size_t stored_bytes(const Files& f, const std::string& weight, Format format) {
  if (format == Format::kDense) return f.get(weight).nbytes();
  size_t b = 0;
  for (const char* k : format == Format::kGptq ? kGptqParts : kPackedParts)
    if (f.contains(module_of(weight) + k)) b += f.get(module_of(weight) + k).nbytes();
  return b;
}

// ---- GPTQ ----------------------------------------------------------------------

// What a GPTQ quantization config says (quantization_config or quantize_config.json).
struct GptqConfig {
  std::string where;  // the file it came from
  int bits = 4;
  int group_size = 128;  // -1: one group per row
  int version = 1;       // 1: zeros stored z − 1; 2: stored z
  bool lm_head = false;  // whether the config claims the head is quantized
  bool lm_head_given = false;
  // GPTQModel/AutoRound per-module overrides, in file order: a pattern
  // ("+:" optional, "-:" = not quantized) matched with Python's re.match
  // against the module name; the first match wins.
  std::vector<std::pair<std::string, json>> dynamic;

  // The config for `module` after the dynamic overrides; nullopt when a "-:"
  // rule excludes it.
  std::optional<GptqConfig> for_module(const std::string& module) const;
};

std::optional<GptqConfig> GptqConfig::for_module(const std::string& module) const {
  for (const auto& [pattern, rule] : dynamic) {
    const bool negative = pattern.rfind("-:", 0) == 0;
    const std::string re = (negative || pattern.rfind("+:", 0) == 0) ? pattern.substr(2) : pattern;
    const std::string key = "dynamic[" + quote_bytes(pattern) + "]";
    if (!regex_match_start(re, module, where, "dynamic")) continue;
    if (negative) return std::nullopt;
    GptqConfig c = *this;
    c.dynamic.clear();
    if (!rule.is_object()) invalid(where, key + " is not an object");
    if (rule.contains("bits")) {
      c.bits = static_cast<int>(io::json_int(rule["bits"], key + ".bits", where, INT32_MIN, INT32_MAX));
      if (c.bits != 2 && c.bits != 4 && c.bits != 8)
        unsupported(where, "GPTQ bits " + std::to_string(c.bits) + " for " + quote_bytes(module) + " (" + key +
                               "); qhead reads GPTQ bits 2, 4 or 8");
    }
    if (rule.contains("group_size")) {
      c.group_size = static_cast<int>(io::json_int(rule["group_size"], key + ".group_size", where, INT32_MIN, INT32_MAX));
      if (c.group_size == 0 || c.group_size < -1) invalid(where, key + ".group_size is " + std::to_string(c.group_size));
    }
    return c;
  }
  return *this;
}

// The "dynamic" rules of a quantization config in file order (nlohmann::json
// sorts object keys; the first matching rule must win as in GPTQModel).
// At most this many dynamic rules (one per module of a large model is a few thousand).
constexpr size_t kMaxDynamicRules = 65536;

std::vector<std::pair<std::string, json>> dynamic_rules(const fs::path& file, bool nested) {
  const nlohmann::ordered_json j = io::read_ordered_json_object(file.string());
  std::vector<std::pair<std::string, json>> out;
  const nlohmann::ordered_json* q = &j;
  if (nested) {
    if (!j.contains("quantization_config")) return out;
    q = &j["quantization_config"];
  }
  if (!q->is_object() || !q->contains("dynamic") || (*q)["dynamic"].is_null()) return out;
  const nlohmann::ordered_json& d = (*q)["dynamic"];
  if (!d.is_object()) invalid(file.string(), "dynamic is not an object (pattern -> overrides)");
  if (d.size() > kMaxDynamicRules)
    unsupported(file.string(), "dynamic has " + std::to_string(d.size()) + " rules; qhead reads at most " +
                                   std::to_string(kMaxDynamicRules));
  size_t pattern_bytes = 0;
  for (const auto& [k, v] : d.items()) pattern_bytes += k.size();
  if (pattern_bytes > io::kMaxPatternBytesTotal)
    unsupported(file.string(), "the dynamic patterns add up to " + std::to_string(pattern_bytes) + " bytes; qhead reads at most " +
                                   std::to_string(io::kMaxPatternBytesTotal));
  // Each rule's value is at most kMaxJsonDepth deep (the reader's bound), so
  // the dump and parse below stay shallow.
  for (const auto& [k, v] : d.items()) out.emplace_back(k, json::parse(v.dump()));
  return out;
}

GptqConfig parse_gptq_config(const json& qc, const std::string& where) {
  GptqConfig g;
  g.where = where;
  const std::string supported = "qhead reads GPTQ checkpoints with bits 2, 4 or 8, group_size -1 or a positive "
                                "divisor of the hidden size, checkpoint_format gptq (v1) or gptq_v2";
  if (!qc.contains("bits") || qc["bits"].is_null()) invalid(where, "quantization config has no integer \"bits\"");
  g.bits = static_cast<int>(io::json_int(qc["bits"], "bits", where, INT32_MIN, INT32_MAX));
  if (g.bits != 2 && g.bits != 4 && g.bits != 8)
    unsupported(where, "GPTQ bits " + std::to_string(g.bits) + " (3-bit GPTQ packs across words); " + supported);
  if (qc.contains("group_size")) {
    g.group_size = static_cast<int>(io::json_int(qc["group_size"], "group_size", where, INT32_MIN, INT32_MAX));
    if (g.group_size == 0 || g.group_size < -1) invalid(where, "\"group_size\" is " + std::to_string(g.group_size));
  }
  // The zero-point convention: GPTQModel writes checkpoint_format (older
  // configs: "format"); AutoGPTQ and AutoRound's GPTQ export write v1.
  std::string fmt = "gptq";
  for (const char* k : {"checkpoint_format", "format"})
    if (qc.contains(k) && qc[k].is_string()) { fmt = qc[k].get<std::string>(); break; }
  if (fmt == "gptq") g.version = 1;
  else if (fmt == "gptq_v2") g.version = 2;
  else unsupported(where, "GPTQ checkpoint_format " + quote_bytes(fmt) + "; " + supported);
  if (qc.contains("lm_head") && !qc["lm_head"].is_null()) {
    g.lm_head = io::json_opt_bool(qc, "", "lm_head", where, false);
    g.lm_head_given = true;
  }
  return g;
}

// Validates a GPTQ module's tensors and fills the role's scheme from them.
// Reads qzeros (to tell symmetric from asymmetric) and g_idx (act-order).
void inspect_gptq(const Files& f, const GptqConfig& c, const std::string& mod, ModelInfo::Role& role) {
  const std::string file = role.file;
  for (const char* k : {".qzeros", ".scales"})
    if (!f.contains(mod + k)) invalid(file, "GPTQ module " + mod + " has " + mod + ".qweight but no " + mod + k);
  if (f.contains(mod + ".bias")) unsupported(file, mod + ".bias: qhead's head has no bias term");
  const Tensor qw = f.get(mod + ".qweight"), qz = f.get(mod + ".qzeros"), sc = f.get(mod + ".scales");
  const int pack = 32 / c.bits;
  if (qw.dtype() != DType::kI32 || qw.shape().size() != 2)
    invalid(file, mod + ".qweight is " + dtype_name(qw.dtype()) + " " + shape_str(qw.shape()) + ", expected I32 [H*bits/32, V]");
  // Sizes from the file's shapes, overflow-checked: a zero-size qweight may carry a huge dim.
  const auto h_or = checked_mul(qw.size(0), static_cast<int64_t>(pack));
  if (!h_or || *h_or > (int64_t(1) << 30) || qw.size(1) > (int64_t(1) << 40))
    invalid(file, mod + ".qweight " + shape_str(qw.shape()) + " gives an implausible table [" +
                      std::to_string(qw.size(1)) + ", " + (h_or ? std::to_string(*h_or) : "overflow") +
                      "] (at most [2^40, 2^30])");
  const int64_t v = qw.size(1), h = *h_or;
  if (c.group_size > 0 && h % c.group_size != 0)
    unsupported(file, mod + ": hidden size " + std::to_string(h) + " is not a multiple of group_size " +
                          std::to_string(c.group_size) + " (from " + c.where + ")");
  const int64_t g = c.group_size > 0 ? h / c.group_size : 1;
  if (!is_float_dtype(sc.dtype()) || sc.shape() != Shape{g, v})
    invalid(file, mod + ".scales is " + dtype_name(sc.dtype()) + " " + shape_str(sc.shape()) + ", expected F16 " +
                      shape_str({g, v}) + " (bits " + std::to_string(c.bits) + ", group_size " +
                      std::to_string(c.group_size) + " from " + c.where + ")");
  QuantScheme packing;
  packing.bits = c.bits;
  const int64_t zcols = packing.packed_cols(v);  // ceil(v·bits / 32) without forming v·bits
  if (qz.dtype() != DType::kI32 || qz.shape() != Shape{g, zcols})
    invalid(file, mod + ".qzeros is " + dtype_name(qz.dtype()) + " " + shape_str(qz.shape()) + ", expected I32 " +
                      shape_str({g, zcols}));
  // Zero points: z = stored + (v1 ? 1 : 0) must be a b-bit code.
  const int mid = 1 << (c.bits - 1), top = (1 << c.bits) - 1;
  bool all_mid = true;
  const int32_t* zp = qz.ptr<int32_t>();
  for (int64_t gi = 0; gi < g; ++gi)
    for (int64_t n = 0; n < v; ++n) {
      const int z = static_cast<int>(stored_code_at(zp + gi * zcols, n, c.bits)) + (c.version == 1 ? 1 : 0);
      if (z > top)
        unsupported(file, mod + ".qzeros[" + std::to_string(gi) + ", row " + std::to_string(n) +
                              "]: a v1 zero point stored as " + std::to_string(top) + " means z = " + std::to_string(z) +
                              ", outside the " + std::to_string(c.bits) + "-bit range qhead's layout holds");
      all_mid = all_mid && z == mid;
    }
  // g_idx: the group of each input column.
  role.act_order = false;
  if (f.contains(mod + ".g_idx")) {
    const Tensor gi = f.get(mod + ".g_idx");
    if (gi.dtype() != DType::kI32 || gi.shape() != Shape{h})
      invalid(file, mod + ".g_idx is " + dtype_name(gi.dtype()) + " " + shape_str(gi.shape()) + ", expected I32 [" +
                        std::to_string(h) + "]");
    const int32_t* gp = gi.ptr<int32_t>();
    std::vector<int64_t> count(static_cast<size_t>(g), 0);
    const int64_t gl = c.group_size > 0 ? c.group_size : h;
    for (int64_t k = 0; k < h; ++k) {
      if (gp[k] < 0 || gp[k] >= g)
        invalid(file, mod + ".g_idx[" + std::to_string(k) + "] = " + std::to_string(gp[k]) + " is not a group in [0, " +
                          std::to_string(g) + ")");
      ++count[static_cast<size_t>(gp[k])];
      if (gp[k] != k / gl) role.act_order = true;
    }
    for (int64_t gi2 = 0; gi2 < g; ++gi2)
      if (count[static_cast<size_t>(gi2)] != gl)
        unsupported(file, mod + ".g_idx puts " + std::to_string(count[static_cast<size_t>(gi2)]) +
                              " columns in group " + std::to_string(gi2) + "; qhead needs exactly group_size = " +
                              std::to_string(gl) + " per group");
  }
  QuantScheme s;
  s.bits = c.bits;
  s.group_size = c.group_size > 0 ? c.group_size : -1;
  s.symmetric = all_mid;
  s.scale_dtype = sc.dtype();
  role.scheme = s;
  role.dtype = sc.dtype();
  role.gptq_version = c.version;
}

// GPTQ tensors -> the native packed table (see model.h). Row blocks in parallel.
Table convert_gptq(const Files& f, const ModelInfo::Role& role) {
  const std::string mod = module_of(role.tensor);
  const QuantScheme s = *role.scheme;
  const int bits = s.bits, pack = 32 / bits;
  const Tensor qw = f.get(mod + ".qweight"), qz = f.get(mod + ".qzeros"), sc = f.get(mod + ".scales");
  const int64_t v = qw.size(1), h = qw.size(0) * pack, g = s.groups(h);
  const int64_t zcols = qz.size(1), cols = s.packed_cols(h);  // cols == H / pack == qweight rows
  PackedTable p;
  p.scheme = s;
  p.vocab = v;
  p.hidden = h;
  p.packed = Tensor::empty(DType::kI32, {v, cols});
  p.scale = Tensor::empty(sc.dtype(), {v, g});
  std::vector<int32_t> perm;
  if (role.act_order) {  // columns sorted by group, stably: group gi holds stored columns [gi·gs, (gi+1)·gs)
    const int32_t* gp = f.get(mod + ".g_idx").ptr<int32_t>();
    perm.resize(static_cast<size_t>(h));
    for (int64_t k = 0; k < h; ++k) perm[static_cast<size_t>(k)] = static_cast<int32_t>(k);
    std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return gp[a] < gp[b]; });
    p.col_perm = Tensor::empty(DType::kI32, {h});
    std::memcpy(p.col_perm.data(), perm.data(), perm.size() * 4);
  }
  const uint32_t* q = qw.ptr<uint32_t>();
  uint32_t* out = p.packed.ptr<uint32_t>();
  const size_t es = dtype_size(sc.dtype());
  const char* scs = static_cast<const char*>(sc.data());
  char* scd = static_cast<char*>(p.scale.data());
  const uint32_t mask = (1u << bits) - 1u;
  parallel_for(v, 64, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      uint32_t* row = out + n * cols;
      if (perm.empty()) {
        // Both layouts pack `pack` consecutive columns per word, low bits first,
        // and the stored code is q itself: a transpose of words.
        for (int64_t i = 0; i < cols; ++i) row[i] = q[i * v + n];
      } else {
        for (int64_t i = 0; i < cols; ++i) {
          uint32_t w = 0;
          for (int j = 0; j < pack; ++j) {
            const int64_t k = perm[static_cast<size_t>(i * pack + j)];
            w |= ((q[(k / pack) * v + n] >> (bits * (k % pack))) & mask) << (bits * j);
          }
          row[i] = w;
        }
      }
      for (int64_t gi = 0; gi < g; ++gi) std::memcpy(scd + (n * g + gi) * es, scs + (gi * v + n) * es, es);
    }
  });
  if (!s.symmetric) {
    const int32_t* zp = qz.ptr<int32_t>();
    const int off = role.gptq_version == 1 ? 1 : 0, mid = 1 << (bits - 1);
    std::vector<int8_t> z(static_cast<size_t>(v * g));
    for (int64_t gi = 0; gi < g; ++gi)
      for (int64_t n = 0; n < v; ++n)
        z[static_cast<size_t>(n * g + gi)] =
            static_cast<int8_t>(static_cast<int>(stored_code_at(zp + gi * zcols, n, bits)) + off - mid);
    p.zero_point = Tensor::empty(DType::kI32, {s.zero_point_rows(v), g});
    pack_zero_points(z.data(), v, g, bits, p.zero_point.ptr<int32_t>());
  }
  return Table::packed(std::move(p), role.file + ": " + mod + " (converted from GPTQ)");
}

bool same_tensor_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// True when the two roles' stored tensors are byte-identical (dense or packed alike).
bool same_stored(const Files& f, const ModelInfo::Role& a, const ModelInfo::Role& b) {
  if (a.format != b.format) return false;
  if (a.format == Format::kDense) return same_tensor_bytes(f.get(a.tensor), f.get(b.tensor));
  for (const char* k : a.format == Format::kGptq ? kGptqParts : kPackedParts) {
    const std::string na = module_of(a.tensor) + k, nb = module_of(b.tensor) + k;
    if (f.contains(na) != f.contains(nb)) return false;
    if (f.contains(na) && !same_tensor_bytes(f.get(na), f.get(nb))) return false;
  }
  return true;
}

// {rows, cols} of a stored role (weight_shape when packed).
std::pair<int64_t, int64_t> stored_shape(const Files& f, const ModelInfo::Role& r) {
  if (r.format == Format::kGptq) {
    const Tensor qw = f.get(module_of(r.tensor) + ".qweight");
    return {qw.size(1), qw.size(0) * (32 / r.scheme->bits)};
  }
  if (!r.packed) {
    const Tensor t = f.get(r.tensor);
    if (t.shape().size() != 2)
      invalid(r.file, r.tensor + " has shape " + shape_str(t.shape()) + ", expected [vocab, hidden]");
    return {t.size(0), t.size(1)};
  }
  const std::string sn = module_of(r.tensor) + ".weight_shape";
  if (!f.contains(sn)) invalid(r.file, "packed " + module_of(r.tensor) + " has no " + sn);
  const Tensor s = f.get(sn);
  if (s.numel() != 2 || (s.dtype() != DType::kI64 && s.dtype() != DType::kI32))
    invalid(f.file_of(sn).path(), sn + " is " + dtype_name(s.dtype()) + " " + shape_str(s.shape()) + ", expected I64 [2]");
  if (s.dtype() == DType::kI64) return {s.ptr<int64_t>()[0], s.ptr<int64_t>()[1]};
  return {s.ptr<int32_t>()[0], s.ptr<int32_t>()[1]};
}

// The first of `keys` that `cfg` has (not null), read as a positive integer:
// a size key of another type or out of range is an Error, never skipped.
std::optional<int64_t> int_key(const json& cfg, std::initializer_list<const char*> keys, std::string* which,
                               const std::string& path, const std::string& file) {
  for (const char* k : keys) {
    if (cfg.contains(k) && !cfg[k].is_null()) {
      *which = k;
      return io::json_int(cfg[k], path + k, file, 1, INT64_MAX);
    }
  }
  return std::nullopt;
}

// ---- resolve: the phases over one directory ------------------------------------

// What resolve_impl reads from config.json (and quantize_config.json), filled
// phase by phase in the order of the members. Never copied: cfg points into
// cfg_top.
struct DirConfig {
  std::string dir_s;
  fs::path dir;
  std::string cfgw;            // config.json's path, for messages
  json cfg_top;                // config.json
  const json* cfg = nullptr;   // where the sizes are: cfg_top, or its text_config (multimodal wrappers)
  std::string cfg_key;         // "text_config." or "": the prefix of cfg's keys in messages
  const Family* fam = nullptr; // the known architecture, or null
  std::string emb_name, head_name;  // the roles' weight names (head: "" when none is known)
  json qc;                     // the quantization config (null: none)
  std::string qc_where;        // the file it came from
  std::optional<GptqConfig> gptq;
  bool head_present = false;   // the head is stored as a tensor of its own
};

// The directory and its config.json.
void read_config(DirConfig& c, const std::string& dir_s) {
  c.dir_s = dir_s;
  c.dir = dir_s;
  std::error_code ec;
  const bool is_dir = fs::is_directory(c.dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw Error(ErrorCode::kIo, dir_s, "cannot be read: " + ec.message());
  if (!is_dir) throw Error(ErrorCode::kIo, dir_s, "is not a directory");
  const fs::path cfg_path = c.dir / "config.json";
  if (!path_exists(cfg_path)) invalid(cfg_path.string(), "is missing (a model directory needs config.json)");
  c.cfgw = cfg_path.string();
  c.cfg_top = read_json(cfg_path);
}

// model_type, the architecture, where the sizes are, and the family.
void read_architecture(DirConfig& c, ModelInfo& info) {
  const json& cfg_top = c.cfg_top;
  info.dir = c.dir_s;
  info.model_type = io::json_opt_string(cfg_top, "", "model_type", c.cfgw, "");
  if (cfg_top.contains("architectures") && cfg_top["architectures"].is_array() && !cfg_top["architectures"].empty() &&
      cfg_top["architectures"][0].is_string())
    info.architecture = cfg_top["architectures"][0].get<std::string>();
  else
    info.architecture = info.model_type;
  // Multimodal wrappers (Gemma 3) keep the text model's sizes in text_config.
  const bool in_text = !cfg_top.contains("vocab_size") && cfg_top.contains("text_config") && cfg_top["text_config"].is_object();
  c.cfg = in_text ? &cfg_top["text_config"] : &cfg_top;
  c.cfg_key = in_text ? "text_config." : "";
  c.fam = family_of(info.model_type, info.architecture);
}

// The roles' weight names: the overrides, else the family's first candidate
// the checkpoint holds (an unknown architecture needs the embedding named).
void name_roles(DirConfig& c, const Files& files, const ModelInfo& info, const ModelOverrides& ov) {
  auto pick = [&](const std::vector<std::string>& cands) -> std::string {
    for (const auto& cand : cands)
      if (has_weight(files, cand)) return cand;
    return cands.front();
  };
  c.emb_name = ov.embedding_tensor;
  c.head_name = ov.head_tensor;
  if (c.emb_name.empty()) {
    if (!c.fam)
      unsupported(c.cfgw, "architecture " + quote_bytes(info.architecture) + " (model_type " + quote_bytes(info.model_type) +
                              ") is not known; known model types: " + supported_architectures() +
                              "; name the tensors with --embedding-tensor NAME --head-tensor NAME");
    c.emb_name = pick(c.fam->embedding);
  }
  if (c.head_name.empty() && c.fam) c.head_name = pick(c.fam->head);
}

// The quantization method: compressed-tensors and GPTQ are read; anything
// else stores tensors qhead does not know, so say so before looking for them.
void read_quant_method(DirConfig& c, ModelInfo& info) {
  const json& cfg_top = c.cfg_top;
  c.qc_where = c.cfgw;
  if (cfg_top.contains("quantization_config") && !cfg_top["quantization_config"].is_null()) {
    c.qc = cfg_top["quantization_config"];
    if (!c.qc.is_object()) invalid(c.cfgw, "quantization_config is not an object");
  } else if (path_exists(c.dir / "quantize_config.json")) {  // AutoGPTQ's own file
    c.qc_where = (c.dir / "quantize_config.json").string();
    c.qc = read_json(c.dir / "quantize_config.json");
    if (!c.qc.contains("quant_method")) c.qc["quant_method"] = "gptq";
  }
  if (c.qc.is_null()) return;
  const std::string method = io::json_opt_string(c.qc, "quantization_config", "quant_method", c.qc_where, "");
  info.quant_method = method;
  if (method == "gptq") {
    c.gptq = parse_gptq_config(c.qc, c.qc_where);
    c.gptq->dynamic = dynamic_rules(c.qc_where, c.qc_where == c.cfgw);
  } else if (method != "compressed-tensors") {
    unsupported(c.qc_where, "quantization_config.quant_method " + quote_bytes(method) + " is not supported (tensors " +
                                quote_bytes(c.emb_name) +
                                (c.head_name.empty() ? std::string() : ", " + quote_bytes(c.head_name)) +
                                "); qhead reads quant_method compressed-tensors (format pack-quantized) and gptq");
  }
}

// tie_word_embeddings (top level, else text_config), else the family's default.
void read_tie(const DirConfig& c, ModelInfo& info) {
  const json& cfg_top = c.cfg_top;
  const json& cfg = *c.cfg;
  if (cfg_top.contains("tie_word_embeddings") && !cfg_top["tie_word_embeddings"].is_null()) {
    if (!cfg_top["tie_word_embeddings"].is_boolean()) invalid(c.cfgw, "tie_word_embeddings is not a boolean");
    info.tied = cfg_top["tie_word_embeddings"].get<bool>();
  } else if (&cfg != &cfg_top && cfg.contains("tie_word_embeddings") && !cfg["tie_word_embeddings"].is_null()) {
    if (!cfg["tie_word_embeddings"].is_boolean()) invalid(c.cfgw, "text_config.tie_word_embeddings is not a boolean");
    info.tied = cfg["tie_word_embeddings"].get<bool>();
  } else {
    info.tied = c.fam ? c.fam->tied_default : false;
  }
}

// One stored role: its format (GPTQ, pack-quantized or dense), file, dtype
// (a packed role's scale dtype) and bytes.
void fill_role(const DirConfig& c, const Files& files, ModelInfo::Role& role, const std::string& name) {
  role.tensor = name;
  const std::string mod = module_of(name);
  if (files.contains(mod + ".qweight")) {
    role.packed = true;
    role.format = Format::kGptq;
    role.file = files.file_of(mod + ".qweight").path();
    if (!c.gptq)
      invalid(role.file, "the checkpoint stores GPTQ tensors " + mod + ".qweight ... but " + c.cfgw +
                             " has no GPTQ quantization_config (nor is there a quantize_config.json) giving bits and group_size");
    const std::optional<GptqConfig> mc = c.gptq->for_module(mod);
    if (!mc)
      invalid(role.file, "the checkpoint stores " + mod + ".qweight but " + c.qc_where +
                             "'s dynamic rules exclude " + mod + " from quantization");
    inspect_gptq(files, *mc, mod, role);
  } else if (files.contains(mod + ".weight_packed")) {
    role.packed = true;
    role.format = Format::kPackQuantized;
    role.file = files.file_of(mod + ".weight_packed").path();
    if (!files.contains(mod + ".weight_scale")) invalid(role.file, "packed " + mod + " has no " + mod + ".weight_scale");
    role.dtype = files.get(mod + ".weight_scale").dtype();
  } else {
    role.file = files.file_of(name).path();
    role.dtype = files.get(name).dtype();
  }
  role.stored = true;
  role.bytes = stored_bytes(files, name, role.format);
}

// The embedding (never GPTQ), and the head: its own tensor, or the
// embedding's when tied. A tied pair stored twice must be one table.
void find_roles(DirConfig& c, const Files& files, ModelInfo& info) {
  const std::string& emb_name = c.emb_name;
  const std::string& head_name = c.head_name;
  if (!has_weight(files, emb_name))
    invalid(c.dir_s, "no embedding tensor " + emb_name + " (nor " + module_of(emb_name) + ".weight_packed) in the checkpoint");
  fill_role(c, files, info.embedding, emb_name);
  if (info.embedding.format == Format::kGptq)
    unsupported(info.embedding.file, module_of(emb_name) + " is stored GPTQ-quantized (" + module_of(emb_name) +
                                         ".qweight); GPTQ quantizes Linear layers only and qhead reads a GPTQ head, not a GPTQ embedding");
  c.head_present = !head_name.empty() && head_name != emb_name && has_weight(files, head_name);
  info.head_name = head_name;
  if (c.head_present) {
    fill_role(c, files, info.head, head_name);
  } else if (info.tied) {
    info.head = info.embedding;  // the same stored tensor serves the head
    info.head.stored = head_name == emb_name;
    if (!info.head.stored) info.head.bytes = 0;
  } else {
    invalid(c.dir_s, "config.json says tie_word_embeddings is false but there is no head tensor " +
                         (head_name.empty() ? std::string("(none named: pass --head-tensor)") : head_name) +
                         " (nor its .weight_packed) in the checkpoint");
  }
  if (info.tied && c.head_present && info.head.format == Format::kGptq)
    invalid(c.dir_s, "config.json says tie_word_embeddings is true but " + module_of(info.head.tensor) +
                         " is stored GPTQ-quantized while " + info.embedding.tensor +
                         " is dense: a tied model must store one table (set tie_word_embeddings to false if the "
                         "head was quantized on its own)");
  if (info.tied && c.head_present && !same_stored(files, info.embedding, info.head))
    invalid(c.dir_s, "config.json says tie_word_embeddings is true but the checkpoint stores different " +
                         info.embedding.tensor + " and " + info.head.tensor + " (a tied model must store one table, or two identical ones)");
}

// vocab_size and hidden_size (or the family's name for it) from the config,
// and every stored role's shape against them.
void check_shapes(const DirConfig& c, const Files& files, ModelInfo& info) {
  const json& cfg = *c.cfg;
  std::string vkey, hkey;
  const auto vocab = int_key(cfg, {"vocab_size"}, &vkey, c.cfg_key, c.cfgw);
  const auto hidden = info.model_type == "opt" ? int_key(cfg, {"word_embed_proj_dim", "hidden_size"}, &hkey, c.cfg_key, c.cfgw)
                                               : int_key(cfg, {"hidden_size", "n_embd", "d_model"}, &hkey, c.cfg_key, c.cfgw);
  if (!vocab) invalid(c.cfgw, "has no integer vocab_size");
  if (!hidden) invalid(c.cfgw, "has no integer hidden_size (nor n_embd, d_model)");
  info.vocab = *vocab;
  info.hidden = *hidden;
  for (const ModelInfo::Role* role : {&info.embedding, &info.head}) {
    if (role == &info.head && !c.head_present) continue;
    const auto [rows, cols] = stored_shape(files, *role);
    if (rows != info.vocab || cols != info.hidden)
      invalid(role->file, role->tensor + " is [" + std::to_string(rows) + ", " + std::to_string(cols) + "] but " + c.cfgw +
                              " says " + vkey + " " + std::to_string(info.vocab) + ", " + hkey + " " +
                              std::to_string(info.hidden) + " (expected [" + std::to_string(info.vocab) + ", " +
                              std::to_string(info.hidden) + "])");
  }
}

// A GPTQ config: no compressed-tensors role, and lm_head as the config says.
void check_gptq_roles(const DirConfig& c, const ModelInfo& info) {
  for (const ModelInfo::Role* role : {&info.embedding, &info.head}) {
    if (role->format == Format::kPackQuantized)
      invalid(role->file, "the checkpoint stores compressed-tensors " + module_of(role->tensor) +
                              ".weight_packed but its quantization config (" + c.qc_where + ") is GPTQ");
  }
  if (c.head_present && info.head.format == Format::kGptq && c.gptq->lm_head_given && !c.gptq->lm_head)
    invalid(info.head.file, "the checkpoint stores " + module_of(info.head.tensor) + ".qweight but " + c.qc_where +
                                " says lm_head: false");
  if (c.head_present && info.head.format == Format::kDense && c.gptq->lm_head_given && c.gptq->lm_head)
    invalid(info.head.file, c.qc_where + " says lm_head: true but the checkpoint stores " + info.head.tensor +
                                " dense (no " + module_of(info.head.tensor) + ".qweight)");
}

// A compressed-tensors config: each role's scheme from the group that
// targets it, which must agree with how the role is stored.
void read_ct_schemes(const DirConfig& c, ModelInfo& info) {
  const json& qc = c.qc;
  const std::string& cfgw = c.cfgw;
  info.compressed_tensors = true;
  // Read whether or not a group matches a role (quantize carries the format over).
  (void)io::json_opt_string(qc, "quantization_config", "format", cfgw, "");
  auto decide = [&](ModelInfo::Role& role, const char* cls) {
    const auto grp = match_group(qc, module_of(role.tensor), cls, cfgw);
    std::optional<QuantScheme> s = grp ? scheme_of(qc, *grp, role.tensor, cfgw) : std::nullopt;
    if (s && !role.packed)
      invalid(role.file, cfgw + " quantizes " + module_of(role.tensor) + " (config group " + escape_bytes(grp->name, 100) + ", " +
                             s->name() + ") but the checkpoint stores it dense as " + role.tensor);
    if (!s && role.packed)
      invalid(role.file, "the checkpoint stores " + module_of(role.tensor) + ".weight_packed but " + cfgw +
                             "'s quantization_config does not quantize " + module_of(role.tensor) +
                             " (no config group targets it, or it is ignored)");
    if (s) {
      s->scale_dtype = role.dtype;
      if (!is_float_dtype(role.dtype))
        invalid(role.file, module_of(role.tensor) + ".weight_scale is " + dtype_name(role.dtype) + ", expected F16, BF16 or F32");
      role.scheme = s;
    }
  };
  decide(info.embedding, "Embedding");
  if (c.head_present) {
    decide(info.head, "Linear");
    if (info.tied && info.head.scheme != info.embedding.scheme)
      invalid(cfgw, "tie_word_embeddings is true but the quantization_config gives " + info.embedding.tensor + " " +
                        (info.embedding.scheme ? info.embedding.scheme->name() : "none") + " and " + info.head.tensor +
                        " " + (info.head.scheme ? info.head.scheme->name() : "none"));
  } else {
    info.head.scheme = info.embedding.scheme;
  }
}

// The roles against the quantization config: GPTQ, compressed-tensors, or
// none (then nothing may be stored packed).
void check_quant_config(const DirConfig& c, ModelInfo& info) {
  if (c.gptq) {
    check_gptq_roles(c, info);
  } else if (!c.qc.is_null()) {
    read_ct_schemes(c, info);
  } else {
    for (const ModelInfo::Role* role : {&info.embedding, &info.head})
      if (role->stored && role->format == Format::kPackQuantized)
        invalid(role->file, "the checkpoint stores " + module_of(role->tensor) + ".weight_packed but " + c.cfgw +
                                " has no quantization_config (qhead needs its scheme)");
  }
}

Resolved resolve_impl(const std::string& dir_s, const ModelOverrides& ov) {
  DirConfig c;
  read_config(c, dir_s);
  Resolved r{ModelInfo{}, open_files(c.dir)};
  read_architecture(c, r.info);
  name_roles(c, r.files, r.info, ov);
  read_quant_method(c, r.info);
  read_tie(c, r.info);
  find_roles(c, r.files, r.info);
  check_shapes(c, r.files, r.info);
  check_quant_config(c, r.info);
  return r;
}

// A config value of an unexpected JSON type (e.g. "symmetric": "yes") surfaces
// from nlohmann::json as its own exception; it is a malformed config.json.
Resolved resolve(const std::string& dir, const ModelOverrides& ov) {
  try {
    return resolve_impl(dir, ov);
  } catch (const json::exception& e) {
    invalid((fs::path(dir) / "config.json").string(), "a value has an unexpected type (" + escape_bytes(e.what(), 400) + ")");
  }
}

Table load_role(const Files& f, const ModelInfo::Role& role) {
  if (role.format == Format::kDense) return Table::dense(f.get(role.tensor));
  if (role.format == Format::kGptq) return convert_gptq(f, role);
  const std::string mod = module_of(role.tensor);
  // All parts in one file: load_packed validates and views them in place.
  const SafetensorsFile& first = f.file_of(mod + ".weight_packed");
  bool one_file = true;
  for (const char* k : kPackedParts)
    if (f.contains(mod + k) && &f.file_of(mod + k) != &first) one_file = false;
  if (one_file) return load_packed(first, mod, role.scheme);
  // A sharded checkpoint split the parts over files: assemble the same views.
  const QuantScheme s = *role.scheme;
  const Tensor shape = f.get(mod + ".weight_shape");
  PackedTable p;
  p.scheme = s;
  p.vocab = shape.dtype() == DType::kI64 ? shape.ptr<int64_t>()[0] : shape.ptr<int32_t>()[0];
  p.hidden = shape.dtype() == DType::kI64 ? shape.ptr<int64_t>()[1] : shape.ptr<int32_t>()[1];
  p.packed = f.get(mod + ".weight_packed");
  p.scale = f.get(mod + ".weight_scale");
  if (!s.symmetric) {
    if (!f.contains(mod + ".weight_zero_point"))
      invalid(first.path(), "asymmetric scheme " + s.name() + " but no tensor " + mod + ".weight_zero_point");
    p.zero_point = f.get(mod + ".weight_zero_point");
  } else if (f.contains(mod + ".weight_zero_point")) {
    invalid(first.path(), "symmetric scheme " + s.name() + " but the checkpoint has " + mod + ".weight_zero_point");
  }
  return Table::packed(std::move(p), first.path() + ": " + mod);
}

}  // namespace

size_t ModelInfo::table_bytes() const {
  return embedding.bytes + ((tied || !head.stored) ? 0 : head.bytes);
}

ModelInfo inspect_model(const std::string& dir, const ModelOverrides& overrides) {
  return resolve(dir, overrides).info;
}

TokenTables load_model_tables(const std::string& dir, const ModelOverrides& overrides, ModelInfo* info) {
  Resolved r = resolve(dir, overrides);
  TokenTables t;
  t.embedding = load_role(r.files, r.info.embedding);
  t.head = r.info.tied ? t.embedding : load_role(r.files, r.info.head);
  if (info) *info = r.info;
  return t;
}

}  // namespace qhead
