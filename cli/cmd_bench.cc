// qhead bench — measures every path on the same tables and prints them as a
// Markdown table (rows: shape × scheme × M; columns: paths) ending with one
// verdict line per (shape, scheme), or, with --json, one self-describing
// document (bench_document: version, commit, device, command, date) whose
// rows are one object per (shape, scheme, m, path) plus the "ceiling" objects
// and one "verdict" object per (shape, scheme). The measurements live in
// tools/bench/; this file parses options and prints, for both devices.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench.h"
#include "commands.h"
#include "qhead/cuda.h"
#include "qhead/error.h"
#include "qhead/ops.h"
#include "qhead/scheme.h"
#include "version.h"

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


using Key = std::tuple<std::string, std::string, int64_t>;  // shape, scheme, m

bool is_run_row(const bench::BenchRow& r) { return r.shape.empty(); }  // ceilings, unmeasured baselines

// The baselines a user would otherwise run: the dense tables and the
// dequantize + BLAS fallback.
bool is_dense(const std::string& path) { return path == "dense" || path.rfind("dense_", 0) == 0; }
bool is_baseline(const std::string& path) { return is_dense(path) || path == "fallback"; }

std::string baseline_label(const bench::BenchRow& r, const std::string& device) {
  const std::string blas = device == "cuda" ? "cuBLAS" : "OpenBLAS";
  if (r.path == "fallback") return "fallback: dequantize + " + blas;
  if (r.path == "dense") return "dense " + (r.act.empty() ? std::string("f32") : r.act) + " " + blas;
  return "dense " + r.path.substr(6) + " " + blas;  // dense_bf16 -> "dense bf16 OpenBLAS"
}

// The rows of a run, indexed by (shape, scheme, m) in order of first appearance.
struct Index {
  std::vector<Key> keys;
  std::map<std::pair<Key, std::string>, const bench::BenchRow*> cell;
  explicit Index(const std::vector<bench::BenchRow>& rows) {
    for (const auto& r : rows) {
      if (is_run_row(r) || !r.measured) continue;
      const Key key{r.shape, r.scheme, r.m};
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
      cell[{key, r.path}] = &r;
    }
  }
  const bench::BenchRow* at(const Key& k, const std::string& path) const {
    auto it = cell.find({k, path});
    return it == cell.end() ? nullptr : it->second;
  }
  // The fastest measured row of `key` whose path passes `pick`.
  template <class P>
  const bench::BenchRow* fastest(const Key& key, P&& pick) const {
    const bench::BenchRow* best = nullptr;
    for (const auto& [kp, r] : cell)
      if (kp.first == key && pick(kp.second) && (best == nullptr || r->us_median < best->us_median)) best = r;
    return best;
  }
};

// fused against the fastest dense baseline of its row: < 1 means slower.
double fused_vs_dense(const Index& ix, const Key& key) {
  const bench::BenchRow* f = ix.at(key, "fused");
  const bench::BenchRow* d = ix.fastest(key, is_dense);
  return f != nullptr && d != nullptr && f->us_median > 0 ? d->us_median / f->us_median : 0.0;
}

// The headline of one (shape, scheme): its M = 1 row (else its smallest M).
struct Verdict {
  Key key;
  const bench::BenchRow* fused = nullptr;
  const bench::BenchRow* best = nullptr;  // the fastest baseline
  double fraction = 0.0;      // of the read ceiling
  double ceiling_gbps = 0.0;  // the read ceiling
};

std::vector<Verdict> verdicts(const std::vector<bench::BenchRow>& rows, const Index& ix) {
  double ceiling = 0.0;
  for (const auto& r : rows)
    if (r.path == "ceiling") ceiling = r.gbps;
  std::vector<Verdict> out;
  for (const auto& key : ix.keys) {
    const bench::BenchRow* f = ix.at(key, "fused");
    if (f == nullptr) continue;
    auto same_case = [&](const Verdict& v) {
      return std::get<0>(v.key) == std::get<0>(key) && std::get<1>(v.key) == std::get<1>(key);
    };
    auto it = std::find_if(out.begin(), out.end(), same_case);
    if (it != out.end() && (std::get<2>(it->key) == 1 || std::get<2>(key) > std::get<2>(it->key))) continue;
    // The fraction of the measured memory-read ceiling: CUDA measures one
    // per table (read_ceiling_fraction; its "ceiling" row is a copy, read +
    // write), the CPU one per run.
    Verdict v{key, f, ix.fastest(key, is_baseline), f->bw_fraction, ceiling};
    if (f->read_ceiling_fraction && *f->read_ceiling_fraction > 0) {
      v.fraction = *f->read_ceiling_fraction;
      v.ceiling_gbps = f->gbps / v.fraction;
    }
    if (it != out.end()) *it = v; else out.push_back(v);
  }
  return out;
}

std::string verdict_line(const Verdict& v, const std::string& device) {
  std::string s = fmt::format("verdict: fused {} M={} ({}) reads at {:.2f} of the {:.1f} GB/s ceiling", std::get<1>(v.key),
                              std::get<2>(v.key), std::get<0>(v.key), v.fraction, v.ceiling_gbps);
  if (v.best == nullptr) return s + ", no baseline measured";
  const double x = v.best->us_median / v.fused->us_median;
  return s + fmt::format(", {:.1f}x {} than the best baseline ({})", x >= 1.0 ? x : 1.0 / x, x >= 1.0 ? "faster" : "slower",
                         baseline_label(*v.best, device));
}

void print_markdown(const bench::BenchConfig& cfg, const BenchContext& ctx, const std::vector<bench::BenchRow>& rows) {
  const Index ix(rows);
  fmt::print("qhead bench: {}; {}; {}\ncommand: {}\n", version_line(), ctx.device, ctx.date, ctx.command);
  std::vector<std::string> paths;  // columns, in order of first appearance
  std::vector<std::string> footnotes;
  for (const auto& r : rows)  // the measured paths of the cases, and the baselines no case could measure
    if ((!is_run_row(r) || !r.measured) && std::find(paths.begin(), paths.end(), r.path) == paths.end())
      paths.push_back(r.path);
  // The dense baselines first (dense, then the half-precision ones), then the rest in order.
  std::stable_sort(paths.begin(), paths.end(), [](const std::string& a, const std::string& b) {
    auto rank = [](const std::string& p) { return p == "dense" ? 0 : is_dense(p) ? 1 : 2; };
    return rank(a) < rank(b);
  });
  std::map<std::string, std::string> na;  // path -> footnote mark
  for (const auto& r : rows)
    if (!r.measured && !na.count(r.path)) {
      footnotes.push_back(fmt::format("[{}] {}: {}", footnotes.size() + 1, r.path, r.note));
      na[r.path] = fmt::format("n/a [{}]", footnotes.size());
    }
  for (const auto& r : rows) {
    if (!is_run_row(r) || !r.measured) continue;
    if (r.path == "ceiling")
      fmt::print("qhead bench --device {}: read ceiling {:.1f} GB/s ({})\n", cfg.device, r.gbps, r.note);
    else if (r.path == "compute_ceiling")
      fmt::print("qhead bench --device {}: compute ceiling: {}\n", cfg.device, r.note);
    else  // CUDA: ceiling_matrix
      fmt::print("qhead bench --device {}: {} {:.1f} ({})\n", cfg.device, r.path, r.gbps, r.note);
  }
  fmt::print("\nCells: median µs per call (GB/s of table bytes, fraction of the read ceiling).\n\n");
  std::string head = "| shape | scheme | M |", rule = "|---|---|---:|";
  for (const auto& p : paths) {
    head += " " + p + " |";
    rule += "---:|";
  }
  head += " fused vs best dense | fused_topk / fused | fused of FMA peak | CPU busy (fused) |";
  rule += "---:|---:|---:|---:|";
  const bool has_kernel = std::any_of(rows.begin(), rows.end(), [](const bench::BenchRow& r) { return !r.kernel.empty(); });
  if (has_kernel) {  // CUDA: the kernel the plan ran for fused and for fused_topk (src/cuda/plan.h)
    head += " fused kernel | fused_topk path:kernel |";
    rule += "---|---|";
  }
  const bool has_int8 = std::find(paths.begin(), paths.end(), "fused_int8") != paths.end();
  if (has_int8) {  // the opt-in int8 mode changes the arithmetic: show by how much
    head += " fused_int8 / fused | int8 max abs(Δlogit) (of max abs(logit)) |";
    rule += "---:|---:|";
  }
  fmt::print("{}\n{}\n", head, rule);
  int slower = 0, fused_rows = 0;
  for (const auto& key : ix.keys) {
    const auto& [shape, scheme, m] = key;
    std::string line = fmt::format("| {} | {} | {} |", shape, scheme, m);
    for (const auto& p : paths) {
      const bench::BenchRow* c = ix.at(key, p);
      line += na.count(p) ? " " + na[p] + " |"
              : c == nullptr ? " – |"
                             : fmt::format(" {:.0f} ({:.1f}, {:.0f}%) |", c->us_median, c->gbps, 100.0 * c->bw_fraction);
    }
    const bench::BenchRow* fused = ix.at(key, "fused");
    const bench::BenchRow* topk = ix.at(key, "fused_topk");
    const double vs = fused_vs_dense(ix, key);
    if (vs > 0) {
      ++fused_rows;
      if (vs < 1.0) ++slower;
    }
    line += vs <= 0 ? " – |" : fmt::format(" {:.2f}×{} |", vs, vs < 1.0 ? " slower" : "");
    line += (fused == nullptr || topk == nullptr) ? " – |" : fmt::format(" {:.3f} |", topk->us_median / fused->us_median);
    line += (fused == nullptr || !fused->matrix_fraction) ? " – |" : fmt::format(" {:.0f}% |", 100.0 * *fused->matrix_fraction);
    const size_t cpu_at = fused == nullptr ? std::string::npos : fused->note.find("; cpu ");
    line += cpu_at == std::string::npos ? std::string(" – |")
                                        : fmt::format(" {} |", std::string_view(fused->note).substr(cpu_at + 6));
    if (has_kernel) {
      line += fmt::format(" {} |", fused == nullptr || fused->kernel.empty() ? "–" : fused->kernel);
      line += fmt::format(" {} |", topk == nullptr || topk->kernel.empty() ? "–" : topk->kernel);
    }
    if (has_int8) {
      const bench::BenchRow* i8 = ix.at(key, "fused_int8");
      line += (fused == nullptr || i8 == nullptr) ? " – |" : fmt::format(" {:.3f} |", i8->us_median / fused->us_median);
      line += (i8 == nullptr || !i8->max_abs_err)
                  ? " – |"
                  : fmt::format(" {:.3g} ({:.1e}) |", *i8->max_abs_err,
                                *i8->max_abs_logit > 0 ? *i8->max_abs_err / *i8->max_abs_logit : 0.0);
    }
    fmt::print("{}\n", line);
  }
  for (const auto& f : footnotes) fmt::print("\n{}", f);
  if (!footnotes.empty()) fmt::print("\n");
  // Notes: cache residency and caveats, once per (shape, scheme, path).
  std::set<std::string> seen;
  fmt::print("\nNotes:\n");
  for (const auto& r : rows) {
    if (is_run_row(r) || r.note.empty()) continue;
    // The CPU-busy part varies per M and is in the table; notes once per path.
    const std::string note = r.note.substr(0, r.note.find("; cpu "));
    const std::string n = fmt::format("- {} {} {}: {}", r.shape, r.scheme, r.path, note);
    if (seen.insert(n).second) fmt::print("{}\n", n);
  }
  fmt::print("\nfused is slower than the best dense baseline in {} of {} rows{}\n", slower, fused_rows,
             slower ? " (marked \"slower\" in the fused vs best dense column)" : "");
  for (const auto& v : verdicts(rows, ix)) fmt::print("{}\n", verdict_line(v, cfg.device));
}

// "AMD EPYC 9454" from /proc/cpuinfo, or "" where it has none.
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string m = line.substr(line.find(':') + 1);
      m.erase(0, m.find_first_not_of(" \t"));
      return m;
    }
  return "";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

BenchContext bench_context(const BenchArgs& a) {
  BenchContext c;
  c.command = a.command;
  c.date = utc_now();
  if (a.device == "cuda") {
    const std::string name = cuda::available() ? cuda::device_name() : "";
    c.device = "cuda: " + (name.empty() ? std::string("no device") : name);
    if (cuda::available()) c.facts = bench::describe_cuda();
  } else {
    const std::string model = cpu_model();
    const int threads = a.threads > 0 ? a.threads : default_num_threads();
    c.device = fmt::format("cpu: {}, {} threads", model.empty() ? "unknown model" : model, threads);
    c.facts = bench::describe_cpu(threads);
    if (!a.isa.empty() && a.isa != "auto")  // the path the run is forced onto
      for (auto& f : c.facts)
        if (f.first == "isa") f.second = a.isa;
    c.facts.insert(c.facts.begin(), {"model", model.empty() ? "unknown" : model});
  }
  return c;
}

nlohmann::json bench_row_json(const bench::BenchRow& r) {
  nlohmann::json j = {{"shape", r.shape}, {"scheme", r.scheme}, {"m", r.m}, {"path", r.path}};
  if (r.measured) {
    j["us_median"] = r.us_median;
    j["gbps"] = r.gbps;
    j["bw_fraction"] = r.bw_fraction;
    j["speedup_vs_dense"] = r.speedup_vs_dense;
  } else {
    j["measured"] = false;
  }
  if (!r.kernel.empty()) j["kernel"] = r.kernel;
  if (r.read_ceiling_fraction) j["read_ceiling_fraction"] = *r.read_ceiling_fraction;
  if (r.host_us) j["host_us"] = *r.host_us;
  if (!r.act.empty()) j["act"] = r.act;
  if (r.matrix_fraction) j["matrix_fraction"] = *r.matrix_fraction;
  if (r.max_abs_err) j["max_abs_err"] = *r.max_abs_err;
  if (r.max_abs_logit) j["max_abs_logit"] = *r.max_abs_logit;
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

nlohmann::json bench_document(const BenchContext& ctx, nlohmann::json rows) {
  nlohmann::json device = nlohmann::json::object();
  device["summary"] = ctx.device;
  for (const auto& [k, v] : ctx.facts) device[k] = v;
  return {{"qhead", {{"version", version()}, {"commit", git_commit()}}},
          {"device", device},
          {"command", ctx.command},
          {"date", ctx.date},
          {"rows", std::move(rows)}};
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
  if (a.plan_env) {
    if (a.device != "cuda") bad("--plan-env is for --device cuda (the QHEAD_CUDA_* kernel-plan overrides)");
    cfg.plan_env = true;
  }
  if (!a.isa.empty()) {
    if (a.device != "cpu") bad("--isa is for --device cpu");
    cfg.isa = a.isa;
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
  const BenchContext ctx = bench_context(a);
  std::vector<bench::BenchRow> rows;
  if (a.device == "cpu")
    rows = bench::run_cpu_bench(cfg);
  else if (a.device == "cuda")
    rows = bench::run_cuda_bench(cfg);
  else
    bad("--device must be cpu or cuda, got '" + a.device + "'");
  if (a.json) {
    const Index ix(rows);
    nlohmann::json arr = nlohmann::json::array();
    int slower = 0, fused_rows = 0;
    for (const auto& r : rows) {
      nlohmann::json j = bench_row_json(r);
      if (r.path == "fused" && r.measured) {
        const double vs = fused_vs_dense(ix, {r.shape, r.scheme, r.m});
        if (vs > 0) {
          j["speedup_vs_best_dense"] = vs;
          j["slower_than_dense"] = vs < 1.0;
          ++fused_rows;
          slower += vs < 1.0;
        }
      }
      arr.push_back(j);
    }
    for (const auto& v : verdicts(rows, ix)) {
      bench::BenchRow vr;
      vr.shape = std::get<0>(v.key);
      vr.scheme = std::get<1>(v.key);
      vr.m = std::get<2>(v.key);
      vr.path = "verdict";
      vr.measured = false;  // a summary of other rows, no timing of its own
      nlohmann::json j = bench_row_json(vr);
      j.erase("measured");
      j["read_ceiling_fraction"] = v.fraction;
      j["ceiling_gbps"] = v.ceiling_gbps;
      j["best_baseline"] = v.best ? nlohmann::json(v.best->path) : nlohmann::json(nullptr);
      j["speedup_vs_best_baseline"] = v.best ? nlohmann::json(v.best->us_median / v.fused->us_median) : nlohmann::json(nullptr);
      j["fused_slower_than_dense_rows"] = slower;
      j["fused_rows"] = fused_rows;
      j["line"] = verdict_line(v, a.device);
      arr.push_back(j);
    }
    fmt::print("{}\n", bench_document(ctx, std::move(arr)).dump(2));
  } else {
    print_markdown(cfg, ctx, rows);
  }
  return 0;
}

}  // namespace qhead::cli
