// qhead inspect FILE: validate a safetensors file and show its tensors, the
// packed tables it holds (scheme, bytes, compression ratio).
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "commands.h"
#include "qhead/safetensors.h"
#include "qhead/table.h"

namespace qhead::cli {

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

}  // namespace

int run_inspect(const InspectArgs& a) {
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

}  // namespace qhead::cli
