// qhead tp-run and qhead bench --tp: the vocab-parallel head over several
// GPUs (qhead/dist.h). `tp-run -n N -- CMD...` starts CMD once per rank with
// the rank's environment; `bench --device cuda --tp N` starts itself under
// that launcher when it is not already inside it, and rank 0 prints.
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "bench/bench_tp.h"
#include "qhead/dist.h"
#include "qhead/error.h"
#include "qhead/scheme.h"

namespace qhead::cli {

namespace {

[[noreturn]] void bad(const char* where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, where, what);
}

int64_t parse_int(const char* where, const std::string& s, const std::string& what, int64_t min) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    bad(where, what + " '" + s + "' is not a number");
  }
  if (used != s.size() || v < min) bad(where, what + " '" + s + "' must be an integer >= " + std::to_string(min));
  return v;
}

// This process's own command line, argv[0] replaced by the executable's path.
std::vector<std::string> self_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  size_t b = 0;
  while (b < all.size()) {
    const size_t e = all.find('\0', b);
    argv.push_back(all.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0 || argv.empty()) throw Error(ErrorCode::kIo, "bench.tp", "cannot read this process's command line from /proc/self");
  argv[0] = std::string(exe, size_t(n));
  return argv;
}

int report(const std::vector<int>& status) {
  int rc = 0;
  for (size_t r = 0; r < status.size(); ++r)
    if (status[r] != 0) {
      std::fprintf(stderr, "qhead tp-run: rank %zu exited with status %d%s\n", r, status[r],
                   status[r] > 128 ? " (killed by a signal)" : "");
      if (rc == 0) rc = status[r];
    }
  return rc;
}


void print_markdown(int tp, int64_t k, const std::vector<bench::BenchRow>& rows) {
  for (const auto& r : rows)
    if (r.path == "ceiling") fmt::print("qhead bench --device cuda --tp {}: copy ceiling {:.1f} GB/s per GPU ({})\n", tp, r.gbps, r.note);
  fmt::print("\nCells: median µs per step (a step's time is the slowest rank's). k = {}.\n\n", k);
  fmt::print("| shape | scheme | M | 1 GPU top-k | TP local top-k | TP exchange (comm) | TP top-k step | speedup vs 1 GPU "
             "| target | TP logits + all-gather [M,V] | its all-gather alone |\n");
  fmt::print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::tuple<std::string, std::string, int64_t>> keys;
  std::map<std::tuple<std::string, std::string, int64_t, std::string>, const bench::BenchRow*> cell;
  for (const auto& r : rows) {
    if (r.path == "ceiling") continue;
    const auto key = std::make_tuple(r.shape, r.scheme, r.m);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    cell[std::make_tuple(r.shape, r.scheme, r.m, r.path)] = &r;
  }
  auto us = [&](const std::tuple<std::string, std::string, int64_t>& key, const char* path) -> double {
    auto it = cell.find(std::make_tuple(std::get<0>(key), std::get<1>(key), std::get<2>(key), std::string(path)));
    return it == cell.end() ? 0.0 : it->second->us_median;
  };
  for (const auto& key : keys) {
    const double one = us(key, "single_gpu_topk"), step = us(key, "tp_topk");
    fmt::print("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f}× | ≥ {:.2f}× | {:.1f} | {:.1f} |\n",
               std::get<0>(key), std::get<1>(key), std::get<2>(key), one, us(key, "tp_local_topk"),
               us(key, "tp_exchange"), step, step > 0 ? one / step : 0.0, 0.8 * tp, us(key, "tp_logits_allgather"),
               us(key, "tp_allgather_logits_comm"));
  }
  std::set<std::string> seen;
  fmt::print("\nNotes:\n");
  for (const auto& r : rows) {
    if (r.path == "ceiling" || r.note.empty()) continue;
    const std::string n = fmt::format("- {} {} M={} {}: {}", r.shape, r.scheme, r.m, r.path, r.note);
    if (seen.insert(n).second) fmt::print("{}\n", n);
  }
}

}  // namespace

int run_tp(const TpRunArgs& a) {
  if (a.n < 1) bad("tp-run", "-n must be >= 1");
  if (a.command.empty()) bad("tp-run", "no command given (qhead tp-run -n N -- CMD ARGS...)");
  dist::LaunchOptions opt;
  for (const auto& d : split(a.devices, ',')) opt.devices.push_back(int(parse_int("tp-run", d, "--devices entry", 0)));
  opt.timeout_s = a.timeout_s;
  return report(dist::launch(a.n, a.command, opt));
}

int run_bench_tp(const BenchArgs& a) {
  const char* where = "bench";
  if (a.device != "cuda") bad(where, "--tp needs --device cuda");
  if (a.tp < 1) bad(where, "--tp must be >= 1");
  if (!a.act.empty() && a.act != "f16") bad(where, "--tp runs f16 activations and scales; --act " + a.act + " is for the one-GPU bench");
  if (!dist::nccl_available())
    throw Error(ErrorCode::kUnsupported, where, "--tp needs a build with NCCL (QHEAD_NCCL=ON)");
  if (a.tp > 1 && !dist::Comm::in_launched_process()) return report(dist::launch(a.tp, self_argv()));

  bench::BenchConfig cfg;
  cfg.device = "cuda";
  cfg.k = a.k;
  cfg.reps = a.reps;
  cfg.json = a.json;
  cfg.m = {1};
  if (!a.m.empty()) {
    cfg.m.clear();
    for (const auto& s : split(a.m, ',')) cfg.m.push_back(parse_int(where, s, "--m", 1));
  }
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const auto& arg : a.shapes)
    for (const auto& s : split(arg, ',')) {
      const auto x = s.find('x');
      if (x == std::string::npos) bad(where, "--shape '" + s + "' must be VxH, e.g. 262144x2560");
      shapes.emplace_back(parse_int(where, s.substr(0, x), "--shape V", 1), parse_int(where, s.substr(x + 1), "--shape H", 1));
    }
  std::vector<std::string> schemes;
  for (const auto& arg : a.schemes)
    for (const auto& s : split(arg, ',')) {
      (void)QuantScheme::parse(s);
      schemes.push_back(s);
    }
  // Default: Gemma-3-4B's table (262144 x 2560), the largest of the real-model shapes
  // (docs/architecture.md, Decisions).
  if (shapes.empty()) shapes = {{262144, 2560}};
  if (schemes.empty()) schemes = {"w4g128"};
  for (const auto& [v, h] : shapes)
    for (const auto& s : schemes) cfg.cases.push_back({v, h, s});

  const dist::Comm comm = dist::Comm::from_env();
  if (comm.world() != a.tp)
    bad(where, "--tp " + std::to_string(a.tp) + " but this process is rank " + std::to_string(comm.rank()) + " of " +
                   std::to_string(comm.world()));
  const auto rows = dist::run_tp_bench(cfg, comm);
  if (comm.rank() != 0) return 0;
  if (a.json) {
    nlohmann::json arr = nlohmann::json::array();
    const BenchContext ctx = bench_context(a);
    for (const auto& r : rows) arr.push_back(bench_row_json(r));
    fmt::print("{}\n", bench_document(ctx, std::move(arr)).dump(2));
  } else {
    print_markdown(a.tp, cfg.k, rows);
  }
  return 0;
}

}  // namespace qhead::cli
