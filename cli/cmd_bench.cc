// qhead bench — measures every path on the same tables and prints them as a
// Markdown table (rows: shape × scheme × M; columns: paths) or, with --json,
// a JSON array with one object per (shape, scheme, m, path) plus the
// "ceiling" object. The measurements live in src/bench/ (CPU) and src/cuda/
// (CUDA); this file parses options and prints, for both devices.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench.h"
#include "commands.h"
#include "qhead/error.h"
#include "qhead/scheme.h"

namespace qhead::cli {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "bench", what); }

int64_t parse_positive(const std::string& s, const std::string& what) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    bad(what + " '" + s + "' is not a number");
  }
  if (used != s.size() || v <= 0) bad(what + " '" + s + "' must be a positive integer");
  return v;
}


void print_markdown(const bench::BenchConfig& cfg, const std::vector<bench::BenchRow>& rows) {
  std::vector<std::string> paths;  // columns, in order of first appearance
  for (const auto& r : rows)
    if (r.path != "ceiling" && r.path != "compute_ceiling" && std::find(paths.begin(), paths.end(), r.path) == paths.end()) paths.push_back(r.path);
  for (const auto& r : rows) {
    if (r.path == "ceiling")
      fmt::print("qhead bench --device {}: read ceiling {:.1f} GB/s ({})\n", cfg.device, r.gbps, r.note);
    if (r.path == "compute_ceiling") fmt::print("qhead bench --device {}: compute ceiling: {}\n", cfg.device, r.note);
  }
  fmt::print("\nCells: median µs per call (GB/s of table bytes, fraction of the read ceiling).\n\n");
  std::string head = "| shape | scheme | M |", rule = "|---|---|---:|";
  for (const auto& p : paths) {
    head += " " + p + " |";
    rule += "---:|";
  }
  head += " fused vs dense | fused_topk / fused | fused of FMA peak | CPU busy (fused) |";
  rule += "---:|---:|---:|---:|";
  const bool has_int8 = std::find(paths.begin(), paths.end(), "fused_int8") != paths.end();
  if (has_int8) {  // the opt-in int8 mode changes the arithmetic: show by how much
    head += " fused_int8 / fused | int8 max abs(Δlogit) (of max abs(logit)) |";
    rule += "---:|---:|";
  }
  fmt::print("{}\n{}\n", head, rule);
  // Rows keyed by (shape, scheme, m) in order of first appearance.
  std::vector<std::tuple<std::string, std::string, int64_t>> keys;
  std::map<std::tuple<std::string, std::string, int64_t, std::string>, const bench::BenchRow*> cell;
  for (const auto& r : rows) {
    if (r.path == "ceiling" || r.path == "compute_ceiling") continue;
    auto key = std::make_tuple(r.shape, r.scheme, r.m);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    cell[std::make_tuple(r.shape, r.scheme, r.m, r.path)] = &r;
  }
  for (const auto& [shape, scheme, m] : keys) {
    std::string line = fmt::format("| {} | {} | {} |", shape, scheme, m);
    for (const auto& p : paths) {
      auto it = cell.find(std::make_tuple(shape, scheme, m, p));
      line += it == cell.end() ? " – |"
                               : fmt::format(" {:.0f} ({:.1f}, {:.0f}%) |", it->second->us_median, it->second->gbps,
                                             100.0 * it->second->bw_fraction);
    }
    auto fused = cell.find(std::make_tuple(shape, scheme, m, std::string("fused")));
    auto topk = cell.find(std::make_tuple(shape, scheme, m, std::string("fused_topk")));
    line += fused == cell.end() ? " – |" : fmt::format(" {:.2f}× |", fused->second->speedup_vs_dense);
    line += (fused == cell.end() || topk == cell.end())
                ? " – |"
                : fmt::format(" {:.3f} |", topk->second->us_median / fused->second->us_median);
    line += (fused == cell.end() || !fused->second->matrix_fraction)
                ? " – |"
                : fmt::format(" {:.0f}% |", 100.0 * *fused->second->matrix_fraction);
    const size_t cpu_at = fused == cell.end() ? std::string::npos : fused->second->note.find("; cpu ");
    line += cpu_at == std::string::npos ? std::string(" – |")
                                        : fmt::format(" {} |", std::string_view(fused->second->note).substr(cpu_at + 6));
    if (has_int8) {
      auto i8 = cell.find(std::make_tuple(shape, scheme, m, std::string("fused_int8")));
      line += (fused == cell.end() || i8 == cell.end()) ? " – |"
                                                         : fmt::format(" {:.3f} |", i8->second->us_median / fused->second->us_median);
      line += (i8 == cell.end() || !i8->second->max_abs_err)
                  ? " – |"
                  : fmt::format(" {:.3g} ({:.1e}) |", *i8->second->max_abs_err,
                                *i8->second->max_abs_logit > 0 ? *i8->second->max_abs_err / *i8->second->max_abs_logit : 0.0);
    }
    fmt::print("{}\n", line);
  }
  // Notes: cache residency and caveats, once per (shape, scheme, path).
  std::set<std::string> seen;
  fmt::print("\nNotes:\n");
  for (const auto& r : rows) {
    if (r.path == "ceiling" || r.path == "compute_ceiling" || r.note.empty()) continue;
    // The CPU-busy part varies per M and is in the table; notes once per path.
    const std::string note = r.note.substr(0, r.note.find("; cpu "));
    const std::string n = fmt::format("- {} {} {}: {}", r.shape, r.scheme, r.path, note);
    if (seen.insert(n).second) fmt::print("{}\n", n);
  }
}

}  // namespace

nlohmann::json bench_row_json(const bench::BenchRow& r) {
  nlohmann::json j = {{"shape", r.shape},   {"scheme", r.scheme},       {"m", r.m},
                      {"path", r.path},     {"us_median", r.us_median}, {"gbps", r.gbps},
                      {"bw_fraction", r.bw_fraction}, {"speedup_vs_dense", r.speedup_vs_dense}};
  if (r.read_ceiling_fraction) j["read_ceiling_fraction"] = *r.read_ceiling_fraction;
  if (r.host_us) j["host_us"] = *r.host_us;
  if (!r.act.empty()) j["act"] = r.act;
  if (r.matrix_fraction) j["matrix_fraction"] = *r.matrix_fraction;
  if (r.max_abs_err) j["max_abs_err"] = *r.max_abs_err;
  if (r.max_abs_logit) j["max_abs_logit"] = *r.max_abs_logit;
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

int run_bench(const BenchArgs& a) {
  bench::BenchConfig cfg;
  cfg.device = a.device;
  cfg.threads = a.threads;
  cfg.k = a.k;
  cfg.reps = a.reps;
  cfg.json = a.json;
  if (!a.act.empty()) {
    if (a.device != "cuda") bad("--act is for --device cuda (the CPU bench takes f32 activations)");
    cfg.act = a.act;
  }
  if (!a.m.empty()) {
    cfg.m.clear();
    for (const auto& s : split(a.m, ',')) cfg.m.push_back(parse_positive(s, "--m"));
    if (cfg.m.empty()) bad("--m is empty");
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const auto& arg : a.shapes)
    for (const auto& s : split(arg, ',')) {
      const auto x = s.find('x');
      if (x == std::string::npos) bad("--shape '" + s + "' must be VxH, e.g. 151936x1024");
      shapes.emplace_back(parse_positive(s.substr(0, x), "--shape V"), parse_positive(s.substr(x + 1), "--shape H"));
    }
  std::vector<std::string> schemes;
  for (const auto& arg : a.schemes)
    for (const auto& s : split(arg, ',')) {
      (void)QuantScheme::parse(s);  // validates the name
      schemes.push_back(s);
    }
  if (shapes.empty() && schemes.empty()) {
    cfg.cases = bench::default_cases();
  } else if (shapes.empty()) {  // the default shapes with the given schemes
    for (const auto& c : bench::default_cases()) {
      const std::pair<int64_t, int64_t> s{c.vocab, c.hidden};
      if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
    }
  }
  if (cfg.cases.empty()) {
    if (schemes.empty()) schemes = {"w4g64"};
    for (const auto& [v, h] : shapes)
      for (const auto& s : schemes) cfg.cases.push_back({v, h, s});
  }
  std::vector<bench::BenchRow> rows;
  if (a.device == "cpu")
    rows = bench::run_cpu_bench(cfg);
  else if (a.device == "cuda")
    rows = bench::run_cuda_bench(cfg);
  else
    bad("--device must be cpu or cuda, got '" + a.device + "'");
  if (a.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : rows) arr.push_back(bench_row_json(r));
    fmt::print("{}\n", arr.dump(2));
  } else {
    print_markdown(cfg, rows);
  }
  return 0;
}

}  // namespace qhead::cli
