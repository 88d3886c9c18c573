// qhead inspect FILE: validate a safetensors file and show its tensors, the
// packed tables it holds (scheme, bytes, compression ratio).
// qhead inspect DIR: a Hugging Face model directory's embedding and head
// (qhead/model.h): architecture, vocab x hidden, tie, storage, bytes now and
// under --scheme.
// qhead inspect MODEL.gguf: the same for a GGUF model's two roles.
//
// --json: the three share their field names. Top level: "format"
// ("safetensors" | "model_dir" | "gguf") and "file"; a model directory and a
// GGUF file also "architecture", "vocab", "hidden", "tied", "embedding",
// "head", "table_bytes", "target_scheme", "table_bytes_after". Every table (a
// role, or an entry of a safetensors file's "packed" list): "tensor" (the
// weight name, "lm_head.weight"), "file" (the file holding it), "vocab",
// "hidden", "format" ("dense" | "pack-quantized" | "gptq" | "gguf"), "dtype"
// (the dense dtype; the scale dtype when quantized; a GGUF tensor's ggml type),
// "scheme" (its qhead scheme, null when it has none) and "bytes" (its stored
// bytes, 0 for a tied head that is not stored); the rest is per kind.
#include <fmt/format.h>

#include <filesystem>
#include <system_error>
#include <nlohmann/json.hpp>
#include <set>

#include "commands.h"
#include "qhead/error.h"
#include "qhead/gguf.h"
#include "qhead/model.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"

namespace qhead::cli {

// The non-empty pieces of s between separators ("1,,8" -> {"1", "8"}).
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = s.find(sep, b);
    std::string part = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!part.empty()) out.push_back(part);
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000.0 && u < 4) {
    b /= 1000.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.2f} {}", b, units[u]);
}

namespace {



const std::string kPackedSuffix = ".weight_packed";

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Bytes a [V, H] table takes packed under `s` (codes, scales, zero points, shape);
// an Error naming `tensor` when the size overflows (dims come from the file).
size_t packed_bytes(int64_t v, int64_t h, const QuantScheme& s, const std::string& tensor) {
  return static_cast<size_t>(s.table_bytes(v, h, "inspect", tensor)) + 16;
}

// qhead inspect MODEL_DIR: the two roles of a Hugging Face model directory.
int inspect_model_dir(const InspectArgs& a) {
  const ModelInfo m = inspect_model(a.file, {a.embedding_tensor, a.head_tensor});
  const QuantScheme target = QuantScheme::parse(a.scheme);
  // The table under `target`, with the scale dtype each role has now (RTN keeps it).
  auto after = [&](const ModelInfo::Role& r) {
    QuantScheme s = target;
    s.scale_dtype = is_float_dtype(r.dtype) ? r.dtype : DType::kF16;
    s.check_hidden(m.hidden, "inspect", r.tensor);
    return packed_bytes(m.vocab, m.hidden, s, r.tensor);
  };
  const size_t now = m.table_bytes();
  const size_t later = after(m.embedding) + (m.tied ? 0 : after(m.head));
  auto storage = [](const ModelInfo::Role& r) {
    if (!r.packed) return fmt::format("dense {}", dtype_name(r.dtype));
    if (r.format == ModelInfo::Format::kGptq)
      return fmt::format("GPTQ v{} {}{} (scales {})", r.gptq_version, r.scheme->name(), r.act_order ? " act-order" : "",
                         dtype_name(r.dtype));
    return fmt::format("packed {} (scales {})", r.scheme->name(), dtype_name(r.dtype));
  };
  auto format_name = [](ModelInfo::Format f) {
    return f == ModelInfo::Format::kGptq ? "gptq" : f == ModelInfo::Format::kPackQuantized ? "pack-quantized" : "dense";
  };
  if (a.json) {
    nlohmann::json j;
    j["format"] = "model_dir";
    j["file"] = m.dir;
    j["architecture"] = m.architecture;
    j["model_type"] = m.model_type;
    j["vocab"] = m.vocab;
    j["hidden"] = m.hidden;
    j["tied"] = m.tied;
    j["compressed_tensors"] = m.compressed_tensors;
    j["quant_method"] = m.quant_method;
    for (const auto* r : {&m.embedding, &m.head}) {
      nlohmann::json rj = {{"tensor", r->tensor},  {"file", r->file},     {"vocab", m.vocab},
                           {"hidden", m.hidden},   {"stored", r->stored}, {"packed", r->packed},
                           {"format", format_name(r->format)}, {"dtype", dtype_name(r->dtype)}, {"bytes", r->bytes}};
      if (r->format == ModelInfo::Format::kGptq) {
        rj["gptq_version"] = r->gptq_version;
        rj["act_order"] = r->act_order;
      }
      if (r->scheme) {
        rj["scheme"] = r->scheme->name();
        rj["bits"] = r->scheme->bits;
        rj["group_size"] = r->scheme->group_size;
        rj["symmetric"] = r->scheme->symmetric;
        rj["scale_dtype"] = dtype_name(r->dtype);
      } else {
        rj["scheme"] = nullptr;
      }
      j[r == &m.embedding ? "embedding" : "head"] = rj;
    }
    j["table_bytes"] = now;
    j["target_scheme"] = target.name();
    j["table_bytes_after"] = later;
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("{}: {} (model_type {}), vocab {} x hidden {}, {}\n", m.dir, m.architecture, m.model_type, m.vocab,
             m.hidden, m.tied ? "tied (one table serves both roles)" : "untied");
  fmt::print("  embedding  {:<40} {:<32} {}\n", m.embedding.tensor, storage(m.embedding), human_bytes(double(m.embedding.bytes)));
  if (m.tied && !m.head.stored)
    fmt::print("  head       (tied: shares {})\n", m.embedding.tensor);
  else
    fmt::print("  head       {:<40} {:<32} {}{}\n", m.head.tensor, storage(m.head), human_bytes(double(m.head.bytes)),
               m.tied ? " (identical copy, loaded once)" : "");
  fmt::print("  token table now: {}; under {}: {}\n", human_bytes(double(now)), target.name(), human_bytes(double(later)));
  return 0;
}

// qhead inspect MODEL.gguf: the two roles of a GGUF model (llama.cpp names).
int inspect_gguf(const InspectArgs& a) {
  const GgufFile f = GgufFile::open(a.file);
  const GgufRoles r = gguf_roles(f);
  QuantScheme target = QuantScheme::parse(a.scheme, DType::kBF16);
  target.check_hidden(r.hidden, "inspect", r.embedding);
  const auto& ei = f.info(r.embedding);
  const size_t now = ei.nbytes + (r.tied ? 0 : f.info(r.head).nbytes);
  const size_t later = packed_bytes(r.vocab, r.hidden, target, r.embedding) * (r.tied ? 1 : 2);
  const std::string arch = f.get_string("general.architecture").value_or("");
  // The fields a model directory's roles have (a GGUF tensor has no
  // pack-quantized scheme: its ggml type is its dtype), plus ggml_type.
  auto role_json = [&](const std::string& name, bool stored) {
    const auto& i = f.info(name);
    return nlohmann::json{{"tensor", name},        {"file", a.file},     {"vocab", r.vocab},
                          {"hidden", r.hidden},    {"stored", stored},   {"format", "gguf"},
                          {"dtype", ggml_type_name(i.type)}, {"ggml_type", ggml_type_name(i.type)},
                          {"scheme", nullptr},     {"bytes", stored ? i.nbytes : 0}};
  };
  if (a.json) {
    nlohmann::json j = {{"file", a.file},         {"format", "gguf"},
                        {"gguf_version", f.version()}, {"architecture", arch},
                        {"vocab", r.vocab},       {"hidden", r.hidden},
                        {"tied", r.tied},         {"embedding", role_json(r.embedding, true)},
                        {"head", role_json(r.head, !r.tied)}, {"table_bytes", now},
                        {"target_scheme", target.name()}, {"table_bytes_after", later}};
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("{}: GGUF v{}, architecture {}, {} tensors, valid\n", a.file, f.version(), arch.empty() ? "?" : arch,
             f.names().size());
  fmt::print("  token table [{} x {}], {}\n", r.vocab, r.hidden,
             r.tied ? "tied (no output.weight: the head reuses token_embd)" : "untied");
  fmt::print("  embedding {} : {} ({})\n", r.embedding, ggml_type_name(ei.type), human_bytes(double(ei.nbytes)));
  if (!r.tied)
    fmt::print("  head      {} : {} ({})\n", r.head, ggml_type_name(f.info(r.head).type),
               human_bytes(double(f.info(r.head).nbytes)));
  fmt::print("  token tables now {}; as {} (pack-quantized, bf16 scales{}) {}\n", human_bytes(double(now)),
             target.name(), r.tied ? ", one copy" : "", human_bytes(double(later)));
  return 0;
}

}  // namespace

int run_inspect(const InspectArgs& a) {
  if (is_directory_checked(a.file)) return inspect_model_dir(a);
  if (ends_with(a.file, ".gguf")) return inspect_gguf(a);
  const SafetensorsFile f = SafetensorsFile::open(a.file);

  // Packed tables: every "<prefix>.weight_packed", loaded (and so validated:
  // widths against weight_shape, scale shapes, finite scales).
  struct PackedInfo {
    std::string prefix;
    Table table;
  };
  std::vector<PackedInfo> packed;
  std::set<std::string> owned;  // tensor names that belong to a packed table
  for (const auto& name : f.names()) {
    if (!ends_with(name, kPackedSuffix)) continue;
    const std::string prefix = name.substr(0, name.size() - kPackedSuffix.size());
    packed.push_back({prefix, load_packed(f, prefix)});
    for (const char* k : {".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape"})
      if (f.contains(prefix + k)) owned.insert(prefix + k);
  }

  size_t total = 0;
  for (const auto& n : f.names()) total += f.get(n).nbytes();

  if (a.json) {
    nlohmann::json j;
    j["format"] = "safetensors";
    j["file"] = a.file;
    j["file_bytes"] = f.file_size();
    j["tensor_bytes"] = total;
    j["metadata"] = f.metadata();
    j["tensors"] = nlohmann::json::array();
    for (const auto& n : f.names()) {
      const Tensor t = f.get(n);
      j["tensors"].push_back({{"name", n}, {"dtype", dtype_name(t.dtype())}, {"shape", t.shape()},
                              {"bytes", t.nbytes()}, {"packed_part", owned.count(n) != 0}});
    }
    j["packed"] = nlohmann::json::array();
    for (const auto& p : packed) {
      const PackedTable& pt = p.table.packed();
      const double dense = double(pt.vocab) * double(pt.hidden) * double(dtype_size(pt.scheme.scale_dtype));
      j["packed"].push_back({{"prefix", p.prefix},
                             {"tensor", p.prefix + ".weight"},
                             {"file", a.file},
                             {"format", "pack-quantized"},
                             {"dtype", dtype_name(pt.scheme.scale_dtype)},
                             {"vocab", pt.vocab},
                             {"hidden", pt.hidden},
                             {"scheme", pt.scheme.name()},
                             {"bits", pt.scheme.bits},
                             {"group_size", pt.scheme.group_size},
                             {"symmetric", pt.scheme.symmetric},
                             {"scale_dtype", dtype_name(pt.scheme.scale_dtype)},
                             {"bytes", pt.nbytes()},
                             {"dense_bytes", dense},
                             {"compression_ratio", pt.nbytes() ? dense / double(pt.nbytes()) : 0.0}});
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }

  fmt::print("{}: {} tensors, {} of tensor data, valid safetensors\n", a.file, f.names().size(), human_bytes(double(total)));
  for (const auto& [k, v] : f.metadata())
    fmt::print("  metadata {} = {}\n", k, v.size() > 120 ? v.substr(0, 117) + "..." : v);
  fmt::print("\n  {:<48} {:>6} {:>20} {:>12}\n", "tensor", "dtype", "shape", "bytes");
  for (const auto& n : f.names()) {
    const Tensor t = f.get(n);
    fmt::print("  {:<48} {:>6} {:>20} {:>12}\n", n, dtype_name(t.dtype()), shape_str(t.shape()), human_bytes(double(t.nbytes())));
  }
  if (!packed.empty()) {
    fmt::print("\n  packed tables (compressed-tensors pack-quantized):\n");
    for (const auto& p : packed) {
      const PackedTable& pt = p.table.packed();
      const double dense = double(pt.vocab) * double(pt.hidden) * double(dtype_size(pt.scheme.scale_dtype));
      fmt::print("  {:<32} [{} x {}] scheme {} ({}-bit, {}, {}, scales {}): {} vs {} dense {} = {:.2f}x smaller\n",
                 p.prefix, pt.vocab, pt.hidden, pt.scheme.name(), pt.scheme.bits,
                 pt.scheme.per_row() ? std::string("per row") : fmt::format("group {}", pt.scheme.group_size),
                 pt.scheme.symmetric ? "symmetric" : "asymmetric", dtype_name(pt.scheme.scale_dtype),
                 human_bytes(double(pt.nbytes())), dtype_name(pt.scheme.scale_dtype), human_bytes(dense),
                 pt.nbytes() ? dense / double(pt.nbytes()) : 0.0);
    }
  }
  return 0;
}

// Whether `p` is a directory; a path stat cannot resolve (a link loop, no
// permission) is a qhead::Error, not a std::filesystem exception.
bool is_directory_checked(const std::string& p) {
  std::error_code ec;
  const bool d = std::filesystem::is_directory(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
    throw qhead::Error(qhead::ErrorCode::kIo, p, "cannot be read: " + ec.message());
  return d;
}

}  // namespace qhead::cli
