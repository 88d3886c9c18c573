// Writes a Hugging Face model directory with the token table's roles quantized
// to compressed-tensors pack-quantized. See include/qhead/model_write.h for
// the contract. write_quantized_model (at the end) runs the phases below in
// order over one WritePlan: check_request, check_paths, load_input (the
// roles, inspect_model's rules), plan_schemes, plan_jobs, plan_quant_config,
// quantize_jobs, plan_files (which safetensors files change), make_temp_dir,
// write_temp (everything into a temporary directory beside out_dir),
// verify_temp (re-open and check it), name_actions, commit (rename it into
// place).
#include "qhead/model_write.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "io/fd_guard.h"
#include "io/stale_temp.h"
#include "io/json_file.h"
#include "io/pattern.h"
#include "qhead/error.h"
#include "qhead/quantize.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"

namespace qhead {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using io::FdGuard;

constexpr const char* kOp = "quantize model";
const char* const kPackedParts[] = {".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape"};
const char* const kGptqParts[] = {".qweight", ".qzeros", ".scales", ".g_idx"};
using Format = ModelInfo::Format;

[[noreturn]] void fail(ErrorCode c, const std::string& where, const std::string& what) { throw Error(c, where, what); }

std::string errno_text(int e) { return std::strerror(e); }

// The bounded reader of src/io/json_file.h (file type, size, depth, duplicate keys).
json read_json(const fs::path& p) { return io::read_json_object(p.string()); }

// HF writes its JSON files with indent 2 and sorted keys; nlohmann's default
// object is a std::map, so dump(2) sorts them the same way. `j` is built from
// values read by read_json plus a few levels of qhead's own, so its depth (and
// with it the dump's recursion and the indentation, which grows with the
// square of the depth) stays within the reader's bound.
void write_json(const fs::path& p, const json& j) {
  const std::string text = io::dump_json(j, p.string());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text << "\n";
  out.close();
  if (!out) fail(ErrorCode::kIo, p.string(), "cannot write");
}

bool has_gguf_magic(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::memcmp(m, "GGUF", 4) == 0;
}

// Copies the content of `from` (a link is followed: its target's bytes are
// copied, never the link) into a NEW file `to`, in 8 MiB chunks, calling
// `tick(done, total)` after each. `to` must not exist (O_EXCL, O_NOFOLLOW): an
// existing file, or a link planted at its name, is never opened for writing,
// so no input can be truncated whatever the paths resolve to. `from` is
// opened without blocking (a FIFO would block in open()) and must be a
// regular file.
void copy_file_chunked(const fs::path& from, const fs::path& to,
                       const std::function<void(int64_t, int64_t)>& tick) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (in < 0) fail(ErrorCode::kIo, from.string(), "cannot open: " + errno_text(errno));
  FdGuard in_guard(in);
  struct stat in_st {};
  if (::fstat(in, &in_st) != 0) fail(ErrorCode::kIo, from.string(), "cannot stat: " + errno_text(errno));
  if (!S_ISREG(in_st.st_mode)) fail(ErrorCode::kInvalidFile, from.string(), "is not a regular file");
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (out < 0) fail(ErrorCode::kIo, to.string(), "cannot create: " + errno_text(errno));
  FdGuard out_guard(out);
  struct stat out_st {};
  if (::fstat(out, &out_st) != 0) fail(ErrorCode::kIo, to.string(), "cannot stat: " + errno_text(errno));
  if (out_st.st_dev == in_st.st_dev && out_st.st_ino == in_st.st_ino)  // cannot happen after O_EXCL; never rely on it
    fail(ErrorCode::kInternal, to.string(), "is the input " + from.string());
  const int64_t total = static_cast<int64_t>(in_st.st_size);
  std::vector<char> buf(8u << 20);
  int64_t done = 0;
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::kIo, from.string(), "read failed: " + errno_text(errno));
    }
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = ::write(out, buf.data() + off, static_cast<size_t>(n - off));
      if (w < 0) {
        if (errno == EINTR) continue;
        fail(ErrorCode::kIo, to.string(), "write failed: " + errno_text(errno));
      }
      off += w;
    }
    done += n;
    if (tick) tick(done, total);
  }
  if (::fsync(out) != 0) fail(ErrorCode::kIo, to.string(), "fsync failed: " + errno_text(errno));
  if (::close(out_guard.release()) != 0) fail(ErrorCode::kIo, to.string(), "close failed: " + errno_text(errno));
}

// ---- the input's safetensors files ----------------------------------------------

struct InputFiles {
  std::vector<std::string> names;            // file names within the directory, in index order
  std::vector<SafetensorsFile> files;        // same order
  std::map<std::string, size_t> where;       // tensor -> index into files
  bool sharded = false;
};

InputFiles open_inputs(const fs::path& dir) {
  InputFiles f;
  const fs::path index = dir / "model.safetensors.index.json";
  auto add_file = [&](const std::string& name) {
    f.names.push_back(name);
    f.files.push_back(SafetensorsFile::open((dir / name).string()));
    for (const auto& t : f.files.back().names()) f.where.emplace(t, f.files.size() - 1);
  };
  if (fs::exists(index)) {
    // inspect_model has validated the index; here only the file list is needed.
    f.sharded = true;
    const json j = read_json(index);
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : j.at("weight_map").items()) {
      (void)tensor;
      const std::string s = shard.get<std::string>();
      if (seen.insert(s).second) add_file(s);
    }
  } else {
    add_file("model.safetensors");
  }
  return f;
}

// ---- compressed-tensors quantization_config ------------------------------------

// The weights args compressed-tensors 0.20 serializes for an int weight scheme
// (QuantizationArgs.model_dump: actorder/block_structure/scale_dtype/observer/
// zp_dtype/observer_kwargs omitted when not set).
json weights_args(const QuantScheme& s) {
  json w = {{"dynamic", false}, {"num_bits", s.bits}, {"symmetric", s.symmetric}, {"type", "int"}};
  if (s.per_row()) {
    w["strategy"] = "channel";
    w["group_size"] = nullptr;
  } else {
    w["strategy"] = "group";
    w["group_size"] = s.group_size;
  }
  return w;
}

json group_json(const QuantScheme& s, const std::vector<std::string>& targets) {
  return {{"format", "pack-quantized"},
          {"input_activations", nullptr},
          {"output_activations", nullptr},
          {"targets", targets},
          {"weights", weights_args(s)}};
}

// Python re.match (compressed-tensors' match_name): anchored at the start,
// not the end. A pattern RE2 refuses is an Error naming it and `cfg_path`.
bool regex_match_start(const std::string& pattern, const std::string& name, const std::string& cfg_path) {
  return io::pattern_match_start(pattern, name, cfg_path, "quantization_config");
}

// True when `target` selects module `name` of class `cls` (compressed-tensors
// is_match: exact name, "re:" regex from the start, or class name).
bool target_matches(const std::string& target, const std::string& name, const std::string& cls,
                    const std::string& cfg_path) {
  if (target.rfind("re:", 0) == 0) return regex_match_start(target.substr(3), name, cfg_path);
  return target == name || target == cls || target == "Module";
}

struct NewRole {
  std::string module;
  std::string cls;  // "Embedding" | "Linear"
  QuantScheme scheme;
};

// The quantization_config of the output. `existing`: the input's (null: none).
// `newly`: the roles quantized here, each in a group of its scheme; `unassign`:
// modules taken out of the existing groups' targets (the roles quantized here,
// and a tied head's dropped copy); `dropped_head`: a tied head module not
// stored in the output (kept out of every group through `ignore` if the config
// would still match it). `kept_packed`: the roles stored packed as they were
// (module -> class); `others_packed`: whether any other module is packed.
json make_quant_config(const json* existing, const std::vector<NewRole>& newly, const std::set<std::string>& unassign,
                       const std::string& dropped_head, const std::map<std::string, std::string>& kept_packed,
                       bool others_packed, const std::string& cfg_path) {
  json qc;
  if (existing) {
    qc = *existing;
    if (!qc.contains("config_groups") || !qc["config_groups"].is_object()) qc["config_groups"] = json::object();
    // Other modules keep their groups; each role quantized here leaves its old group.
    const std::string old_format = qc.value("format", std::string("pack-quantized"));
    json groups = json::object();
    for (auto& [g, grp] : qc["config_groups"].items()) {
      if (!grp.is_object() || !grp.contains("targets") || !grp["targets"].is_array())
        fail(ErrorCode::kInvalidFile, cfg_path, "quantization_config.config_groups." + escape_bytes(g, 100) + ".targets is missing or not a list");
      json targets = json::array();
      for (const auto& t : grp["targets"]) {
        if (!(t.is_string() && unassign.count(t.get<std::string>()))) targets.push_back(t);
      }
      if (targets.empty()) continue;  // the group only named roles requantized here
      json ng = grp;
      ng["targets"] = targets;
      if (old_format != "pack-quantized" && !ng.contains("format")) ng["format"] = old_format;
      groups[g] = ng;
    }
    // A weight-only group left selecting no packed module (it only served roles
    // that now have groups of their own, e.g. a class target "Embedding" whose
    // module an exact target now takes) goes: loaders such as transformers
    // 5.24 read the first group's scheme for every module. Decidable only when
    // the roles are the only packed modules (the classes of others are unknown).
    if (!others_packed) {
      std::set<std::string> used;
      for (const auto& [mod, cls] : kept_packed) {
        // compressed-tensors' order: exact names, then regexes (sorted), then classes.
        std::vector<std::pair<std::string, std::string>> tg;  // (target, group)
        for (const auto& [g, grp] : groups.items())
          for (const auto& t : grp["targets"])
            if (t.is_string()) tg.push_back({t.get<std::string>(), g});
        std::stable_sort(tg.begin(), tg.end(), [](const auto& a, const auto& b) {
          const bool ra = a.first.find("re:") != std::string::npos, rb = b.first.find("re:") != std::string::npos;
          return ra != rb ? !ra : a.first < b.first;
        });
        std::string hit;
        for (const auto& [t, g] : tg)
          if (hit.empty() && (t.rfind("re:", 0) == 0 ? regex_match_start(t.substr(3), mod, cfg_path) : t == mod)) hit = g;
        for (const auto& [t, g] : tg)
          if (hit.empty() && (t == cls || t == "Module")) hit = g;
        if (!hit.empty()) used.insert(hit);
      }
      json pruned = json::object();
      for (const auto& [g, grp] : groups.items()) {
        const bool weight_only = grp.contains("weights") && grp["weights"].is_object() &&
                                 grp.value("input_activations", json()).is_null() &&
                                 grp.value("output_activations", json()).is_null();
        if (!weight_only || used.count(g)) pruned[g] = grp;
      }
      groups = pruned;
    }
    qc["config_groups"] = groups;
    if (old_format != "pack-quantized") qc["format"] = "mixed-precision";
    // An ignore entry naming a role exactly goes; one matching it otherwise would
    // have to go too, which changes what it ignores for other modules.
    if (qc.contains("ignore") && qc["ignore"].is_array()) {
      json ig = json::array();
      for (const auto& e : qc["ignore"]) {
        if (!e.is_string()) {
          ig.push_back(e);
          continue;
        }
        const std::string s = e.get<std::string>();
        bool drop = false;
        for (const auto& r : newly) {
          if (s == r.module) {
            drop = true;
          } else if (target_matches(s, r.module, r.cls, cfg_path)) {
            fail(ErrorCode::kUnsupported, cfg_path,
                 "quantization_config.ignore entry " + quote_bytes(s) + " matches " + r.module +
                     ", which is to be quantized; qhead removes exact-name entries only (removing this one "
                     "would change what it ignores for other modules): edit the ignore list first");
          }
        }
        if (!drop) ig.push_back(e);
      }
      qc["ignore"] = ig;
    }
  } else {
    qc = {{"config_groups", json::object()},
          {"format", "pack-quantized"},
          {"global_compression_ratio", nullptr},
          {"ignore", json::array()},
          {"kv_cache_scheme", nullptr},
          {"moe_sparsity_config", nullptr},
          {"sparsity_config", json::object()},
          {"transform_config", json::object()}};
  }
  // One group per distinct scheme, named as compressed-tensors names them.
  std::vector<std::pair<QuantScheme, std::vector<std::string>>> by_scheme;
  for (const auto& r : newly) {
    QuantScheme key = r.scheme;
    key.scale_dtype = DType::kF32;  // the config does not carry the scale dtype
    auto it = std::find_if(by_scheme.begin(), by_scheme.end(), [&](const auto& p) { return p.first == key; });
    if (it == by_scheme.end()) by_scheme.push_back({key, {r.module}});
    else it->second.push_back(r.module);
  }
  int next = 0;
  for (const auto& [s, modules] : by_scheme) {
    while (qc["config_groups"].contains("group_" + std::to_string(next))) ++next;
    qc["config_groups"]["group_" + std::to_string(next)] = group_json(s, modules);
  }
  // A tied head that is no longer stored must not be matched by a group (the
  // library would expect its packed tensors): ignore it explicitly.
  if (!dropped_head.empty()) {
    bool matched = false;
    for (const auto& [g, grp] : qc["config_groups"].items()) {
      (void)g;
      for (const auto& t : grp["targets"])
        if (t.is_string() && target_matches(t.get<std::string>(), dropped_head, "Linear", cfg_path)) matched = true;
    }
    bool ignored = false;
    if (qc.contains("ignore") && qc["ignore"].is_array())
      for (const auto& e : qc["ignore"])
        if (e.is_string() && target_matches(e.get<std::string>(), dropped_head, "Linear", cfg_path)) ignored = true;
    if (matched && !ignored) {
      if (!qc.contains("ignore") || !qc["ignore"].is_array()) qc["ignore"] = json::array();
      qc["ignore"].push_back(dropped_head);
    }
  }
  qc["quant_method"] = "compressed-tensors";
  qc["quantization_status"] = "compressed";
  if (!qc.contains("format")) qc["format"] = "pack-quantized";
  if (!qc.contains("version")) qc["version"] = "0.20.0";  // the layout and config of compressed-tensors 0.20
  return qc;
}

// ---- one weight scheme per output -------------------------------------------------

// The arguments compressed-tensors' decompression reads from a group's weights
// (QuantizationArgs: type, num_bits, symmetric, strategy, group_size for the
// group strategies, block_structure for blocks), with the library's defaults.
json decompress_args(const json& w) {
  if (!w.is_object()) return json();
  auto get = [&](const char* k, const json& dflt) { return w.contains(k) && !w[k].is_null() ? w[k] : dflt; };
  json a = {{"type", get("type", "int")}, {"num_bits", get("num_bits", 8)}, {"symmetric", get("symmetric", true)},
            {"strategy", get("strategy", "tensor")}};
  if (a["strategy"] == "group" || a["strategy"] == "tensor_group") a["group_size"] = get("group_size", json());
  if (a["strategy"] == "block") a["block_structure"] = get("block_structure", json());
  return a;
}

// A JSON value as message text: a string as it is, anything else dumped.
std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "w4g32", "w8a", "float 8-bit (tensor)": a group's weights for a message.
std::string weights_name(const json& w) {
  const json a = decompress_args(w);
  if (a.is_null()) return "no weights";
  const std::string bits = text(a["num_bits"]), strategy = text(a["strategy"]);
  if (a["type"] != "int") return text(a["type"]) + " " + bits + "-bit (" + strategy + ")";
  std::string s = "w" + bits;
  if (strategy == "group") s += "g" + text(a["group_size"]);
  else if (strategy != "channel") s += " (" + strategy + ")";
  if (a["symmetric"] == false) s += "a";
  return s;
}

// transformers 5.24 (integrations/compressed_tensors.py) decompresses every
// dense module with ONE group's scheme, get_dense_scheme's: the first config
// group, in the file's order, without a "re:" target naming experts (those
// have their own, get_experts_scheme). A group whose weights decompress
// differently is misread: a shape or zero-point error at best, values read
// with the wrong bits and no error where the shapes fit. So every other group
// with weights must decompress as that one (same arguments, same format).
void check_one_weight_scheme(const json& qc, const std::string& where) {
  if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty()) return;
  const json& groups = qc["config_groups"];  // sorted by name: the order write_json writes them in
  auto experts = [](const json& g) {
    if (g.is_object() && g.contains("targets") && g["targets"].is_array())
      for (const auto& t : g["targets"])
        if (t.is_string() && text(t).rfind("re:", 0) == 0 && text(t).find("experts") != std::string::npos) return true;
    return false;
  };
  const std::string top_format = qc.contains("format") && qc["format"].is_string() ? qc["format"].get<std::string>()
                                                                                   : std::string("pack-quantized");
  auto format = [&](const json& g) {
    return g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : top_format;
  };
  auto weights = [](const json& g) { return g.is_object() && g.contains("weights") ? g["weights"] : json(); };
  auto targets = [](const json& g) {
    std::string t;
    if (g.is_object() && g.contains("targets") && g["targets"].is_array())
      for (const auto& x : g["targets"]) t += (t.empty() ? "" : ", ") + text(x);
    return t;
  };
  std::string dense;
  for (const auto& [name, g] : groups.items())
    if (!experts(g)) {
      dense = name;
      break;
    }
  if (dense.empty()) return;  // experts only: each read with get_experts_scheme
  const json& d = groups[dense];
  std::string differ;
  for (const auto& [name, g] : groups.items()) {
    if (name == dense || experts(g) || weights(g).is_null()) continue;  // activation-only groups keep dense weights
    if (decompress_args(weights(g)) == decompress_args(weights(d)) && format(g) == format(d)) continue;
    differ += (differ.empty() ? "" : ", ") + name + " (" + targets(g) + ": " + weights_name(weights(g)) +
              (format(g) != format(d) ? ", format " + format(g) : std::string()) + ")";
  }
  if (differ.empty()) return;
  const std::string first = weights_name(weights(d));
  fail(ErrorCode::kUnsupported, where,
       "the output's quantization_config would have config groups with different weight schemes: " + dense + " (" +
           targets(d) + ": " + first + ") and " + differ +
           "; transformers decompresses every module with the first group's scheme (" + dense +
           "'s) and fails on the others or, where the shapes fit, loads them wrong without an error. Give the "
           "roles quantized here the scheme of the other groups (" + first +
           "; an embedding and a head of different schemes cannot both be quantized), or pass --mixed-schemes "
           "to write it anyway for loaders that read each group's scheme (compressed-tensors' ModelCompressor)");
}

// ---- paths -----------------------------------------------------------------------

bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty() && std::next(o) == outer.end()) return true;  // trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

fs::path canonical_any(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  if (ec) c = fs::absolute(p).lexically_normal();
  if (c.filename().empty()) c = c.parent_path();  // "out/" -> "out"
  return c;
}

// Removes a directory tree on scope exit unless released.
struct TempDir {
  fs::path path;
  bool keep = false;
  ~TempDir() {
    if (!keep && !path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
};

std::string describe(const ModelInfo::Role& r) {
  if (r.format == Format::kDense) return std::string("dense ") + dtype_name(r.dtype);
  return (r.format == Format::kGptq ? "GPTQ " : "") + r.scheme->name() + " (" + dtype_name(r.dtype) + " scales)";
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

size_t packed_bytes(const PackedTable& p) {
  return p.packed.nbytes() + p.scale.nbytes() + (p.scheme.symmetric ? 0 : p.zero_point.nbytes()) + 2 * sizeof(int64_t);
}

// ---- temporaries and the files copied as they are ------------------------------------

// Inside the temporary directory until it is renamed into place.
constexpr const char* kIncompleteMarker = "QHEAD_INCOMPLETE";

// ".NAME.qhead-tmp-" (the output being written) / ".NAME.qhead-old-" (the
// previous output, moved aside while the new one is renamed in), then a pid.
std::string temp_prefix(const std::string& out_name, const char* kind) {
  return "." + out_name + ".qhead-" + kind + "-";
}

// Removes the temporaries that killed runs for the same output left in
// `parent` (stale_temp.h: their process is gone). A set-aside previous output
// goes back to `out` when `out` is missing (the run died between the two
// renames), else it is removed. Returns what was cleaned, for the report.
std::vector<std::string> clean_stale_temps(const fs::path& parent, const std::string& out_name, const fs::path& out) {
  std::vector<std::string> cleaned;
  std::error_code ec;
  fs::directory_iterator it(parent, ec);
  if (ec) return cleaned;  // unreadable: nothing of ours can be there
  const std::string tmp_prefix = temp_prefix(out_name, "tmp"), old_prefix = temp_prefix(out_name, "old");
  std::vector<fs::path> tmps, olds;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (io::stale_temp_pid(name, tmp_prefix)) tmps.push_back(it->path());
    if (io::stale_temp_pid(name, old_prefix)) olds.push_back(it->path());
  }
  for (const fs::path& p : tmps) {
    fs::remove_all(p, ec);
    if (ec) fail(ErrorCode::kIo, p.string(), "cannot remove the stale temporary directory of a killed run: " + ec.message());
    cleaned.push_back(p.string());
  }
  for (const fs::path& p : olds) {
    if (fs::symlink_status(out, ec).type() == fs::file_type::not_found) {
      fs::rename(p, out, ec);
      if (ec) fail(ErrorCode::kIo, p.string(), "cannot restore the previous output of a killed run: " + ec.message());
      cleaned.push_back(p.string() + " (restored to " + out.string() + ")");
    } else {
      fs::remove_all(p, ec);
      if (ec) fail(ErrorCode::kIo, p.string(), "cannot remove the previous output a killed run set aside: " + ec.message());
      cleaned.push_back(p.string());
    }
  }
  return cleaned;
}

// What a directory entry is, for a "left out" note.
std::string kind_of(fs::file_type t) {
  switch (t) {
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block: return "a block device";
    case fs::file_type::character: return "a character device";
    case fs::file_type::directory: return "a directory";
    case fs::file_type::not_found: return "missing";
    default: return "not a regular file";
  }
}

// Copies every file of `dir` that `skip` does not claim into `to`, under the
// same relative path (taken lexically from the walk, never by resolving links:
// a link's resolved path can point anywhere, even back at an input). A
// symbolic link to a regular file is copied by content, wherever it points (a
// Hugging Face cache snapshot is made of links into ../../blobs); the output
// holds a regular file. Links to directories are not followed; they, broken
// links, links that loop, FIFOs, sockets and devices are left out and listed in
// `rep.skipped_files` with the reason.
void copy_other_files(const fs::path& dir, const fs::path& to, const std::function<bool(const std::string&)>& skip,
                      const ModelWriteOptions& o, ModelWriteReport& rep) {
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  if (ec) fail(ErrorCode::kIo, dir.string(), "cannot list: " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) fail(ErrorCode::kIo, dir.string(), "cannot list: " + ec.message());
    const fs::path rel = it->path().lexically_relative(dir);
    if (rel.empty() || rel.is_absolute() || *rel.begin() == "..")
      fail(ErrorCode::kInternal, it->path().string(), "is not inside " + dir.string());
    const std::string rs = rel.generic_string();
    const fs::file_status ls = it->symlink_status(ec);
    if (ec) fail(ErrorCode::kIo, it->path().string(), "cannot stat: " + ec.message());
    if (fs::is_directory(ls)) {
      fs::create_directory(to / rel, ec);
      if (ec) fail(ErrorCode::kIo, (to / rel).string(), "cannot create: " + ec.message());
      continue;
    }
    if (skip(rs)) continue;
    if (fs::is_symlink(ls)) {
      const fs::file_status ts = fs::status(it->path(), ec);
      if (ec || !fs::is_regular_file(ts)) {
        const std::string why = ec ? (ec == std::errc::too_many_symbolic_link_levels ? "a link that loops"
                                      : ec == std::errc::no_such_file_or_directory ? "a broken link"
                                                                                   : "a link: " + ec.message())
                                   : "a link to " + kind_of(ts.type()) + (fs::is_directory(ts) ? " (not followed)" : "");
        rep.skipped_files.push_back({rs, why});
        ec.clear();
        continue;
      }
    } else if (!fs::is_regular_file(ls)) {
      rep.skipped_files.push_back({rs, kind_of(ls.type())});
      continue;
    }
    std::error_code sec;
    const int64_t size = static_cast<int64_t>(fs::file_size(it->path(), sec));
    auto tick = [&](int64_t done, int64_t total) {
      if (o.progress && !sec && size >= (int64_t(64) << 20)) o.progress({ModelWriteProgress::Stage::kCopy, rs, done, total});
    };
    copy_file_chunked(it->path(), to / rel, tick);
    rep.copied_files.push_back(rs);
  }
}

// A GPTQ checkpoint that GPTQ-quantizes modules besides the token-table roles
// (every GPTQ / AutoRound export quantizes the decoder's Linears) cannot be
// written so that the usual loaders read it: config.json holds ONE
// quantization_config. Kept as GPTQ, the config cannot describe a
// pack-quantized head (the GPTQ loaders read qweight/qzeros/scales only), and
// compressed-tensors 0.20 has no format for GPTQ's tensors (its
// CompressionFormat list: dense, int-/float-/naive-/pack-quantized, the
// sparse, marlin-24, nv/mx-fp formats). A head written back in GPTQ form is
// read by GPTQModel, but transformers' GPTQ loader (optimum 2.3's
// GPTQQuantizer.convert_model) replaces only the Linears inside the decoder
// blocks: it reports lm_head.qweight ... as unexpected and initializes lm_head
// at random. So: kUnsupported, naming the modules and what the user can do;
// inspect_model / load_model_tables read such checkpoints as they are.
void refuse_gptq_modules(const InputFiles& in, const ModelInfo& info, const std::string& dir_s) {
  std::vector<std::string> others;
  for (const auto& [n, i] : in.where) {
    (void)i;
    if (!ends_with(n, ".qweight")) continue;
    const std::string mod = n.substr(0, n.size() - std::strlen(".qweight"));
    if (mod != packed_prefix(info.embedding.tensor) && mod != packed_prefix(info.head.tensor)) others.push_back(mod);
  }
  if (others.empty()) return;
  std::string list;
  for (size_t i = 0; i < others.size() && i < 3; ++i) list += (i ? ", " : "") + others[i] + ".qweight";
  if (others.size() > 3) list += ", ... (" + std::to_string(others.size()) + " modules)";
  const std::string head = info.head.format == Format::kGptq ? "its GPTQ head" : "its head";
  fail(ErrorCode::kUnsupported, dir_s,
       "GPTQ-quantizes other modules besides the token table (" + list +
           "); qhead quantize cannot write it loadably: config.json holds one quantization_config, a GPTQ one "
           "cannot describe a compressed-tensors head, compressed-tensors has no format for the other modules' GPTQ "
           "tensors, and a head written back in GPTQ form is dropped by transformers' GPTQ loader (it quantizes "
           "only the decoder blocks' Linears and initializes lm_head at random). qhead reads this checkpoint as it "
           "is (qhead inspect; the library's load_model_tables gives " + head +
           " and embedding as tables); to get a compressed-tensors head, run qhead quantize on the unquantized model");
}

// ---- the phases of write_quantized_model ------------------------------------------

// One role quantized here: its scheme, its module name and, once quantized,
// its packed tensors.
struct Job {
  const ModelInfo::Role* role;
  const Table* table;
  QuantScheme scheme;
  std::string module;
  PackedTable q;
  ModelWriteReport::Role* report;
};

// What write_quantized_model learns and decides, filled phase by phase in the
// order of the members. It stays on the caller's stack for the whole call and
// is never copied: jobs point into info, tables and rep, added into jobs,
// added_views into the jobs' tensors and shape_stores. tmp removes the
// temporary directory when the call fails.
struct WritePlan {
  std::string dir_s, out_s;
  fs::path dir, out;
  // check_paths
  fs::path cin, cout;                // canonical input and output
  std::vector<std::string> cleaned;  // temporaries of killed runs removed
  bool out_exists = false;
  // load_input
  fs::path cfg_path;
  ModelInfo info;
  TokenTables tables;
  json cfg;                           // the input's config.json
  const json* existing_qc = nullptr;  // its compressed-tensors quantization_config (in cfg); null: none
  bool gptq = false;                  // a GPTQ checkpoint (its config is replaced)
  InputFiles in;
  // plan_schemes
  std::optional<QuantScheme> se, sh;  // embedding / head scheme (tied: the same one)
  // plan_jobs
  ModelWriteReport rep;
  std::vector<Job> jobs;
  bool drop_head_copy = false;  // a tied head's second stored copy is dropped
  bool untie = false;           // a tied input written as two tables (options.untie)
  bool tied_out = false;        // the output's roles are one table
  // plan_quant_config
  json out_qc;
  // plan_files
  std::set<std::string> removed;                    // input tensors not written
  std::map<size_t, std::vector<const Job*>> added;  // file index -> roles packed into it
  // make_temp_dir, write_temp
  TempDir tmp;
  std::map<std::string, const TensorView*> added_views;  // tensor name -> what we wrote (for the check)
  std::map<std::string, std::string> added_file;         // tensor name -> file it was written to
  std::vector<std::unique_ptr<Tensor>> shape_stores;
  std::map<std::string, size_t> out_bytes;  // file -> data bytes (for the index's total_size)
};

// The input is a directory (a GGUF or other file is refused, saying what to
// give instead), and there is a scheme and an output.
void check_request(const WritePlan& p, const ModelWriteOptions& o) {
  std::error_code kind_ec;
  const fs::file_status kind = fs::status(p.dir, kind_ec);
  if (kind_ec && kind_ec != std::errc::no_such_file_or_directory && kind_ec != std::errc::not_a_directory)
    fail(ErrorCode::kIo, p.dir_s, "cannot be read: " + kind_ec.message());
  if (!fs::exists(kind)) fail(ErrorCode::kIo, p.dir_s, "does not exist");
  if (!fs::is_directory(kind)) {
    if (p.dir.extension() == ".gguf" || has_gguf_magic(p.dir))
      fail(ErrorCode::kUnsupported, p.dir_s,
           "GGUF is not supported as a quantize input (qhead reads GGUF tables but writes compressed-tensors "
           "checkpoints only from safetensors): give a Hugging Face model directory (config.json + "
           "model.safetensors, or model.safetensors.index.json + shards), or one .safetensors file with --tensor");
    fail(ErrorCode::kInvalidArgument, p.dir_s,
         "is not a model directory (expected config.json + model.safetensors or model.safetensors.index.json)");
  }
  if (!o.embedding_scheme && !o.head_scheme)
    fail(ErrorCode::kInvalidArgument, kOp, "no scheme given for the embedding or the head: nothing to quantize");
  if (p.out_s.empty()) fail(ErrorCode::kInvalidArgument, kOp, "no output directory given");
}

// Never into the input, never over a non-empty directory unless forced.
// Temporaries of killed runs for this output are cleaned first: a previous
// output one of them had set aside goes back to out_dir before out_dir is
// looked at.
void check_paths(WritePlan& p, const ModelWriteOptions& o) {
  p.cin = canonical_any(p.dir);
  p.cout = canonical_any(p.out);
  // The same directory by another name that the paths do not show (a bind
  // mount): compared by device and inode.
  struct stat in_st {}, out_st {};
  const bool same_inode = ::stat(p.dir.c_str(), &in_st) == 0 && ::stat(p.out.c_str(), &out_st) == 0 &&
                          in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino;
  if (p.cin == p.cout || same_inode || is_within(p.cout, p.cin))
    fail(ErrorCode::kInvalidArgument, kOp,
         "refusing to write into the input model directory " + p.dir_s + " (output " + p.out_s + ")");
  p.cleaned = clean_stale_temps(p.cout.parent_path(), p.cout.filename().string(), p.out);
  std::error_code oec;
  const fs::file_status ost = fs::status(p.out, oec);
  if (oec && oec != std::errc::no_such_file_or_directory)
    fail(ErrorCode::kIo, p.out_s, "cannot be read: " + oec.message());  // a link that loops, a denied parent
  if (fs::exists(ost)) {
    if (!fs::is_directory(ost)) fail(ErrorCode::kInvalidArgument, p.out_s, "exists and is not a directory");
    p.out_exists = true;
    const bool empty = fs::is_empty(p.out, oec);
    if (oec) fail(ErrorCode::kIo, p.out_s, "cannot be listed: " + oec.message());
    if (!empty) {
      if (!o.force)
        fail(ErrorCode::kInvalidArgument, p.out_s, "exists and is not empty (pass --force to replace it)");
      if (is_within(p.cin, p.cout))
        fail(ErrorCode::kInvalidArgument, p.out_s, "contains the input " + p.dir_s + "; refusing to replace it");
    }
  }
}

// Loads the roles (inspect_model's rules), config.json and the safetensors
// files. qhead writes compressed-tensors only: a GPTQ checkpoint converts only
// when its roles are all it quantizes (its GPTQ config is then replaced by a
// fresh compressed-tensors one; with other GPTQ modules no output is loadable,
// refuse_gptq_modules says why); any other quantization method is refused.
void load_input(WritePlan& p, const ModelWriteOptions& o) {
  p.cfg_path = p.dir / "config.json";
  p.tables = load_model_tables(p.dir_s, o.overrides, &p.info);
  p.cfg = read_json(p.cfg_path);
  p.gptq = p.info.quant_method == "gptq";
  p.in = open_inputs(p.dir);
  if (p.gptq) refuse_gptq_modules(p.in, p.info, p.dir_s);
  if (p.cfg.contains("quantization_config") && !p.cfg["quantization_config"].is_null() && !p.gptq) {
    const json& qc = p.cfg["quantization_config"];
    const std::string method = qc.is_object() && qc.contains("quant_method") && qc["quant_method"].is_string()
                                   ? qc["quant_method"].get<std::string>() : std::string();
    if (method != "compressed-tensors")
      fail(ErrorCode::kUnsupported, p.cfg_path.string(),
           "quantization_config.quant_method \"" + method +
               "\": its other quantized layers cannot be carried into a compressed-tensors config; qhead quantize "
               "takes dense, compressed-tensors or GPTQ-head model directories");
    p.existing_qc = &qc;
  }
}

// The embedding's and the head's schemes, parsed and checked against the
// model: one scheme for a tied table, a quantized role only with requantize,
// a GPTQ role only converted (it cannot be kept).
void plan_schemes(WritePlan& p, const ModelWriteOptions& o) {
  const ModelInfo& info = p.info;
  auto scheme_for = [&](const std::optional<std::string>& name, const ModelInfo::Role& r) -> std::optional<QuantScheme> {
    if (!name) return std::nullopt;
    QuantScheme s = QuantScheme::parse(*name, o.scale_dtype ? *o.scale_dtype : r.dtype);
    s.check_hidden(info.hidden, kOp, r.tensor);
    return s;
  };
  std::optional<QuantScheme>& se = p.se;
  std::optional<QuantScheme>& sh = p.sh;
  se = scheme_for(o.embedding_scheme, info.embedding);
  sh = scheme_for(o.head_scheme, info.head);
  p.untie = info.tied && o.untie;
  p.tied_out = info.tied && !p.untie;
  if (p.untie) {
    if (!sh)
      fail(ErrorCode::kInvalidArgument, p.dir_s,
           "untie: the model is tied and untying it writes the head as a table of its own: give the head a scheme "
           "(--head SCHEME)");
    if (info.head_name.empty() || info.head_name == info.embedding.tensor)
      fail(ErrorCode::kInvalidArgument, p.dir_s,
           "untie: the head's weight name is not known for architecture " + info.architecture +
               " (its head shares " + info.embedding.tensor + "); name it with --head-tensor NAME");
  }
  if (p.tied_out) {
    if (se && sh && !(*se == *sh))
      fail(ErrorCode::kInvalidArgument, p.dir_s,
           "the model is tied (one table serves " + info.embedding.tensor + " and the head) but the embedding scheme " +
               se->name() + " and the head scheme " + sh->name() + " differ; give one scheme (either flag applies to the shared table)");
    if (!se) se = sh;
    sh = se;
  }
  auto check_packed = [&](const std::optional<QuantScheme>& s, const ModelInfo::Role& r, const char* role) {
    if (s && r.packed && !o.requantize)
      fail(ErrorCode::kInvalidArgument, p.dir_s,
           std::string(role) + " " + packed_prefix(r.tensor) + " is already quantized (" + describe(r) + " in " +
               fs::path(r.file).filename().string() + "); pass --requantize to quantize it to " + s->name() +
               " again from its dequantized values");
  };
  check_packed(se, info.embedding, "the embedding");
  if (!p.tied_out) check_packed(sh, info.head, "the head");
  if (p.gptq) {
    for (const auto* r : {&info.embedding, &info.head}) {
      const auto& s = r == &info.embedding ? se : sh;
      if (r->stored && r->format == Format::kGptq && !s)
        fail(ErrorCode::kUnsupported, p.dir_s,
             packed_prefix(r->tensor) + " is GPTQ-quantized (" + describe(*r) +
                 "); a compressed-tensors directory cannot carry GPTQ tensors as they are: give it a scheme "
                 "(with --requantize) to convert it");
    }
  }
}

// One job per role quantized here (a tied table: one, the embedding's), and
// the report's model fields.
void plan_jobs(WritePlan& p) {
  const ModelInfo& info = p.info;
  ModelWriteReport& rep = p.rep;
  rep.input_dir = p.dir_s;
  rep.output_dir = p.out_s;
  rep.architecture = info.architecture;
  rep.vocab = info.vocab;
  rep.hidden = info.hidden;
  rep.tied = p.tied_out;
  rep.untied = p.untie;
  if (p.se)
    p.jobs.push_back({&info.embedding, &p.tables.embedding, *p.se, packed_prefix(info.embedding.tensor), {}, &rep.embedding});
  if (p.sh && !p.tied_out)
    p.jobs.push_back({&info.head, &p.tables.head, *p.sh, packed_prefix(p.untie ? info.head_name : info.head.tensor), {},
                      &rep.head});
  // A tied head stored as a second copy is dropped when the shared table is quantized.
  p.drop_head_copy = p.tied_out && p.se && info.head.stored && info.head.tensor != info.embedding.tensor;
}

// The output's quantization_config, decided (and checked: one weight scheme
// unless mixed_schemes) before anything is quantized or written.
void plan_quant_config(WritePlan& p, const ModelWriteOptions& o) {
  const ModelInfo& info = p.info;
  std::vector<NewRole> newly;
  std::set<std::string> unassign;
  for (const Job& j : p.jobs) {
    newly.push_back({j.module, j.role == &info.embedding ? "Embedding" : "Linear", j.scheme});
    unassign.insert(j.module);
  }
  // A tied head is not stored in the output (unless it is the embedding tensor itself).
  std::string dropped_head;
  if (p.tied_out && info.head.tensor != info.embedding.tensor) dropped_head = packed_prefix(info.head.tensor);
  if (p.drop_head_copy) unassign.insert(dropped_head);
  // Roles kept packed, and whether anything else is packed.
  std::map<std::string, std::string> kept_packed;
  if (!p.se && info.embedding.format == Format::kPackQuantized)
    kept_packed[packed_prefix(info.embedding.tensor)] = "Embedding";
  if (!p.sh && info.head.format == Format::kPackQuantized && info.head.stored)
    kept_packed[packed_prefix(info.head.tensor)] = "Linear";
  bool others_packed = false;
  const std::string suffix = ".weight_packed";
  for (const auto& [n, i] : p.in.where) {
    (void)i;
    if (n.size() <= suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string mod = n.substr(0, n.size() - suffix.size());
    if (mod != packed_prefix(info.embedding.tensor) && mod != packed_prefix(info.head.tensor)) others_packed = true;
  }
  p.out_qc = make_quant_config(p.existing_qc, newly, unassign, dropped_head, kept_packed, others_packed,
                               p.cfg_path.string());
  if (!o.mixed_schemes) check_one_weight_scheme(p.out_qc, p.dir_s);
}

// Quantizes every job's table (a packed one from the values it holds now,
// dequantized exactly to f32), timing each for the report.
void quantize_jobs(WritePlan& p, const ModelWriteOptions& o) {
  for (Job& j : p.jobs) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string label = std::string(j.role == &p.info.embedding ? "embedding " : "head ") + j.module;
    QuantizeProgress tick;
    if (o.progress)
      tick = [&](int64_t done, int64_t total) { o.progress({ModelWriteProgress::Stage::kQuantize, label, done, total}); };
    const std::string name = p.dir_s + ": " + j.role->tensor;
    QuantizeOptions qo;
    qo.quantizer = o.quantizer;
    // An untied embedding has no activations to calibrate on: the GPTQ
    // quantizers become what they are with an identity Hessian, and the MSE
    // search is not weighted by the head's inputs.
    const bool own_embedding = j.role == &p.info.embedding && !p.tied_out;
    if (own_embedding)
      qo.quantizer = o.quantizer == Quantizer::kGptq ? Quantizer::kRtn
                     : o.quantizer == Quantizer::kGptqMse ? Quantizer::kMse : o.quantizer;
    qo.threads = o.threads;
    qo.name = name;
    qo.progress = tick;
    qo.damp = o.damp;
    if (qo.quantizer != Quantizer::kRtn && !own_embedding) qo.calibration = o.calibration;
    if (j.table->is_packed()) {
      const Tensor dense = j.table->to_dense_f32();  // the values it holds now, exactly
      j.q = quantize(dense.view(), j.scheme, qo);
    } else {
      j.q = quantize(j.table->dense().view(), j.scheme, qo);
    }
    j.report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

// Which input tensors are not written (the quantized roles' old tensors, a
// tied head's dropped copy) and which file each job's packed tensors go to
// (the one that held the role).
void plan_files(WritePlan& p) {
  auto remove_role = [&](const ModelInfo::Role& r) {
    if (!r.stored) return;
    const std::string mod = packed_prefix(r.tensor);
    if (r.format == Format::kDense) {
      p.removed.insert(r.tensor);
      return;
    }
    for (const char* k : r.format == Format::kGptq ? kGptqParts : kPackedParts)
      if (p.in.where.count(mod + k)) p.removed.insert(mod + k);
  };
  auto holder_of = [](const ModelInfo::Role& r) {
    const std::string mod = packed_prefix(r.tensor);
    return r.format == Format::kDense ? r.tensor : r.format == Format::kGptq ? mod + ".qweight" : mod + ".weight_packed";
  };
  for (const Job& j : p.jobs) {
    remove_role(*j.role);
    // An untied head that was not stored goes into the embedding's file.
    const std::string holder = holder_of(j.role->stored ? *j.role : p.info.embedding);
    p.added[p.in.where.at(holder)].push_back(&j);
  }
  if (p.drop_head_copy) remove_role(p.info.head);
}

// The temporary directory beside out_dir. Its name starts with a dot and it
// holds a QHEAD_INCOMPLETE marker until the moment it is renamed into place.
void make_temp_dir(WritePlan& p) {
  const fs::path parent = p.cout.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) fail(ErrorCode::kIo, parent.string(), "cannot create: " + ec.message());
  p.rep.cleaned = p.cleaned;
  const fs::path tmp_path = parent / (temp_prefix(p.cout.filename().string(), "tmp") + std::to_string(::getpid()));
  if (fs::symlink_status(tmp_path, ec).type() != fs::file_type::not_found) {
    // Our own pid's name: left by an earlier process of the same id (not alive
    // now, as we are it). remove_all removes a link itself, never its target.
    fs::remove_all(tmp_path, ec);
    if (ec) fail(ErrorCode::kIo, tmp_path.string(), "cannot remove a stale temporary directory: " + ec.message());
  }
  if (!fs::create_directory(tmp_path, ec) || ec)
    fail(ErrorCode::kIo, tmp_path.string(), "cannot create the temporary directory: " + (ec ? ec.message() : "it exists"));
  p.tmp.path = tmp_path;
  const fs::path marker = p.tmp.path / kIncompleteMarker;
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail(ErrorCode::kIo, marker.string(), "cannot create: " + errno_text(errno));
  FdGuard g(fd);
  const std::string text = "This directory is an unfinished output of qhead quantize (" + p.dir_s + " -> " + p.out_s +
                           "); it is not a model. A later run for the same output removes it.\n";
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    fail(ErrorCode::kIo, marker.string(), "write failed: " + errno_text(errno));
}

// The safetensors files into the temporary directory: a file the plan does
// not change is copied byte for byte; the others are rewritten with their
// other tensors as they were, their metadata, and the jobs' packed tensors.
void write_shards(WritePlan& p, const ModelWriteOptions& o) {
  ModelWriteReport& rep = p.rep;
  for (size_t i = 0; i < p.in.files.size(); ++i) {
    const SafetensorsFile& f = p.in.files[i];
    const std::string& fname = p.in.names[i];
    if (fname.empty() || fs::path(fname).filename().string() != fname || fname == "." || fname == "..")
      fail(ErrorCode::kInvalidFile, (p.dir / "model.safetensors.index.json").string(),
           "weight_map names the shard \"" + fname + "\", which is not a file name inside the model directory");
    bool rewrite = p.added.count(i) != 0;
    for (const auto& n : f.names())
      if (p.removed.count(n)) rewrite = true;
    size_t bytes = 0;
    if (!rewrite) {
      auto tick = [&](int64_t done, int64_t total) {
        if (o.progress) o.progress({ModelWriteProgress::Stage::kCopy, fname, done, total});
      };
      copy_file_chunked(p.dir / fname, p.tmp.path / fname, tick);
      for (const auto& n : f.names()) bytes += f.get(n).nbytes();
      rep.copied_files.push_back(fname);
    } else {
      SafetensorsWriter w;
      for (const auto& n : f.names()) {
        if (p.removed.count(n)) continue;
        const Tensor t = f.get(n);
        w.add(n, t.view());  // a view into the input's mapping (f outlives write())
        bytes += t.nbytes();
      }
      for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
      if (p.added.count(i))
        for (const Job* j : p.added[i]) {
          p.shape_stores.push_back(std::make_unique<Tensor>());
          add_packed(w, j->module, j->q, *p.shape_stores.back());
          j->report->file = fname;
          j->report->bytes_after = packed_bytes(j->q);
          bytes += j->report->bytes_after;
          p.added_views[j->module + ".weight_packed"] = &j->q.packed.view();
          p.added_views[j->module + ".weight_scale"] = &j->q.scale.view();
          if (!j->q.scheme.symmetric) p.added_views[j->module + ".weight_zero_point"] = &j->q.zero_point.view();
          p.added_views[j->module + ".weight_shape"] = &p.shape_stores.back()->view();
          for (const auto& [n, v] : p.added_views) {
            (void)v;
            if (!p.added_file.count(n)) p.added_file[n] = fname;
          }
        }
      w.write((p.tmp.path / fname).string(), {(p.dir / fname).string()});
      rep.rewritten_files.push_back(fname);
    }
    p.out_bytes[fname] = bytes;
  }
}

// A sharded input's index, with the new names and total_size.
void write_index(const WritePlan& p) {
  if (!p.in.sharded) return;
  json idx = read_json(p.dir / "model.safetensors.index.json");
  json& wm = idx["weight_map"];
  for (const auto& n : p.removed) wm.erase(n);
  for (const auto& [name, file] : p.added_file) wm[name] = file;
  size_t total = 0;
  for (const auto& [f, b] : p.out_bytes) total += b;
  if (!idx.contains("metadata") || !idx["metadata"].is_object()) idx["metadata"] = json::object();
  idx["metadata"]["total_size"] = total;
  write_json(p.tmp.path / "model.safetensors.index.json", idx);
}

// Everything into the temporary directory: the safetensors files, the index,
// every other file (tokenizer, generation config, ..., subdirectories
// included, by content: see copy_other_files), and config.json with the new
// quantization_config, written last so that a run killed before it leaves no
// loadable directory.
void write_temp(WritePlan& p, const ModelWriteOptions& o) {
  write_shards(p, o);
  write_index(p);
  const std::set<std::string> model_files(p.in.names.begin(), p.in.names.end());
  copy_other_files(p.dir, p.tmp.path, [&](const std::string& rs) {
    return rs == "config.json" || rs == "model.safetensors.index.json" || model_files.count(rs) ||
           (p.gptq && rs == "quantize_config.json");  // replaced by the compressed-tensors config
  }, o, p.rep);
  p.cfg["quantization_config"] = p.out_qc;
  if (p.untie) {
    // Two tables now: every loader must see them apart.
    p.cfg["tie_word_embeddings"] = false;
    if (p.cfg.contains("text_config") && p.cfg["text_config"].is_object() &&
        p.cfg["text_config"].contains("tie_word_embeddings"))
      p.cfg["text_config"]["tie_word_embeddings"] = false;
  }
  write_json(p.tmp.path / "config.json", p.cfg);
}

[[noreturn]] void read_back_failed(const std::string& what) {
  fail(ErrorCode::kInternal, kOp, "the written directory does not read back as written: " + what);
}

// The roles as a reader loads them from the temporary directory (`got`,
// `back`): the tie as it was, each job's packed tensors equal to what was
// quantized, kept roles as they were.
void check_roles_read_back(const WritePlan& p, const ModelInfo& got, const TokenTables& back) {
  const ModelInfo& info = p.info;
  if (got.tied != p.tied_out) read_back_failed(p.untie ? "the untied roles read back tied" : "tie changed");
  if (back.tied() != (p.tables.tied() && !p.untie)) read_back_failed("tied tables are not one table");
  for (const Job& j : p.jobs) {
    const Table& t = j.role == &info.embedding ? back.embedding : back.head;
    const ModelInfo::Role& r = j.role == &info.embedding ? got.embedding : got.head;
    if (!t.is_packed() || !r.scheme || !(*r.scheme == j.scheme))
      read_back_failed(j.module + " does not load as " + j.scheme.name() + " (" + describe(r) + ")");
    const PackedTable& pt = t.packed();
    if (!same_bytes(pt.packed.view(), j.q.packed.view()) || !same_bytes(pt.scale.view(), j.q.scale.view()) ||
        (!j.scheme.symmetric && !same_bytes(pt.zero_point.view(), j.q.zero_point.view())))
      read_back_failed(j.module + "'s packed tensors differ from what was quantized");
  }
  // Kept roles load as they did.
  auto kept_same = [&](const ModelInfo::Role& a, const ModelInfo::Role& b) {
    return a.packed == b.packed && a.scheme == b.scheme && a.dtype == b.dtype;
  };
  if (!p.se && !kept_same(info.embedding, got.embedding)) read_back_failed("the kept embedding changed");
  if (!p.sh && !kept_same(info.head, got.head)) read_back_failed("the kept head changed");
}

// Every tensor of the temporary directory: either one we added, equal to
// what was written, or byte-identical to the input's; none missing, none
// extra. Counts them into the report.
void check_tensors_read_back(WritePlan& p) {
  const InputFiles outf = open_inputs(p.tmp.path);
  std::set<std::string> expect_names;
  for (const auto& [n, i] : p.in.where) {
    (void)i;
    if (!p.removed.count(n)) expect_names.insert(n);
  }
  for (const auto& [n, v] : p.added_views) {
    (void)v;
    expect_names.insert(n);
  }
  std::set<std::string> got_names;
  for (const auto& [n, i] : outf.where) {
    got_names.insert(n);
    const Tensor t = outf.files[i].get(n);
    auto a = p.added_views.find(n);
    if (a != p.added_views.end()) {
      if (!same_bytes(t.view(), *a->second)) read_back_failed(n + " differs from what was quantized");
    } else {
      auto w = p.in.where.find(n);
      if (w == p.in.where.end()) read_back_failed("unexpected tensor " + n);
      if (!same_bytes(t.view(), p.in.files[w->second].get(n).view())) read_back_failed(n + " differs from the input");
    }
    ++p.rep.tensors_checked;
  }
  if (got_names != expect_names) read_back_failed("the set of tensor names is not the expected one");
}

// The report's roles from what is stored now (`got`): names, what they were,
// sizes before and after, file, scheme. A tied head is not stored apart.
void fill_role_reports(WritePlan& p, const ModelInfo& got) {
  const ModelInfo& info = p.info;
  ModelWriteReport& rep = p.rep;
  auto fill = [&](ModelWriteReport::Role& rr, const ModelInfo::Role& before, const ModelInfo::Role& after,
                  const char* role) {
    rr.role = role;
    rr.tensor = before.tensor;
    rr.module = packed_prefix(before.tensor);
    rr.before = describe(before);
    rr.bytes_before = before.stored ? before.bytes : 0;
    rr.bytes_after = after.stored ? after.bytes : 0;
    rr.file = after.stored ? fs::path(after.file).filename().string() : std::string();
    rr.scheme = after.scheme;
  };
  fill(rep.embedding, info.embedding, got.embedding, "embedding");
  fill(rep.head, info.head, got.head, "head");
  if (info.tied) {
    rep.head.bytes_before = info.head.tensor != info.embedding.tensor && info.head.stored ? info.head.bytes : 0;
    if (p.tied_out) {
      rep.head.bytes_after = 0;
      rep.head.file.clear();
    } else {
      rep.head.tensor = info.head_name;  // untied: the head now stored under its own name
      rep.head.module = packed_prefix(info.head_name);
    }
  }
}

// Re-opens the temporary directory as a reader would (load_model_tables),
// checks the roles and every tensor, and fills the report from what is
// stored now.
void verify_temp(WritePlan& p, const ModelWriteOptions& o) {
  ModelInfo got;
  const TokenTables back = load_model_tables(p.tmp.path.string(), o.overrides, &got);
  check_roles_read_back(p, got, back);
  check_tensors_read_back(p);
  p.rep.verified = true;
  fill_role_reports(p, got);
}

// What happened to each role: quantized / requantized / kept / shared.
void name_actions(WritePlan& p) {
  ModelWriteReport& rep = p.rep;
  for (const Job& j : p.jobs) j.report->action = j.role->packed ? "requantized" : "quantized";
  if (rep.embedding.action.empty()) rep.embedding.action = "kept";
  if (p.tied_out) {
    rep.head.action = "shared";
    rep.head.seconds = 0;
  } else if (rep.head.action.empty()) {
    rep.head.action = "kept";
  }
}

// Into place. The marker goes first: from here on the directory is complete
// and checked. A previous output is moved aside (".NAME.qhead-old-PID", put
// back if the rename fails) and removed once the new one is in place.
void commit(WritePlan& p) {
  const fs::path marker = p.tmp.path / kIncompleteMarker;
  if (::unlink(marker.c_str()) != 0) fail(ErrorCode::kIo, marker.string(), "cannot remove: " + errno_text(errno));
  std::error_code ec;
  if (p.out_exists && !fs::is_empty(p.out, ec)) {
    const fs::path old =
        p.cout.parent_path() / (temp_prefix(p.cout.filename().string(), "old") + std::to_string(::getpid()));
    fs::remove_all(old, ec);
    fs::rename(p.out, old, ec);
    if (ec) fail(ErrorCode::kIo, p.out_s, "cannot move the existing directory aside: " + ec.message());
    fs::rename(p.tmp.path, p.out, ec);
    if (ec) {
      std::error_code ec2;
      fs::rename(old, p.out, ec2);
      fail(ErrorCode::kIo, p.out_s, "cannot rename " + p.tmp.path.string() + " into place: " + ec.message());
    }
    fs::remove_all(old, ec);
  } else {
    fs::rename(p.tmp.path, p.out, ec);  // replaces an empty directory
    if (ec) fail(ErrorCode::kIo, p.out_s, "cannot rename " + p.tmp.path.string() + " into place: " + ec.message());
  }
  p.tmp.keep = true;
}

}  // namespace

ModelWriteReport write_quantized_model(const std::string& dir_s, const std::string& out_s, const ModelWriteOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  WritePlan p;
  p.dir_s = dir_s;
  p.out_s = out_s;
  p.dir = dir_s;
  p.out = out_s;
  check_request(p, o);
  check_paths(p, o);
  load_input(p, o);
  plan_schemes(p, o);
  plan_jobs(p);
  plan_quant_config(p, o);
  quantize_jobs(p, o);
  plan_files(p);
  make_temp_dir(p);
  write_temp(p, o);
  verify_temp(p, o);
  name_actions(p);
  commit(p);
  p.rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return std::move(p.rep);
}

}  // namespace qhead
