// One process per rank: fork + execve with the rank's environment, wait for
// all, take the others down when one fails (POSIX; no NCCL, no CUDA here —
// the children initialize those themselves, so nothing is inherited across
// fork).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "qhead/dist.h"
#include "qhead/error.h"

extern char** environ;

namespace qhead::dist {

namespace {

[[noreturn]] void fail(ErrorCode c, const std::string& what) { throw Error(c, "dist.launch", what); }

// argv[0] as execve needs it: as given when it holds a '/', else the first
// executable of that name on PATH.
std::string resolve(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t b = 0;
  while (b <= p.size()) {
    const size_t e = p.find(':', b);
    std::string dir = p.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (dir.empty()) dir = ".";
    const std::string cand = dir + "/" + prog;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    if (e == std::string::npos) break;
    b = e + 1;
  }
  fail(ErrorCode::kInvalidArgument, "'" + prog + "' was not found on PATH");
}

bool overridden(const char* kv) {
  static const char* keys[] = {"QHEAD_TP_RANK=", "QHEAD_TP_WORLD=", "QHEAD_TP_DEVICE=", "QHEAD_TP_ID_FILE=",
                               "NCCL_NVLS_ENABLE="};
  for (const char* k : keys)
    if (std::strncmp(kv, k, std::strlen(k)) == 0) return true;
  return false;
}

}  // namespace

// Set by launch for every rank (and read by Comm::from_env).
bool Comm::in_launched_process() { return std::getenv("QHEAD_TP_RANK") != nullptr; }

std::vector<int> launch(int n, const std::vector<std::string>& argv, const LaunchOptions& opt) {
  if (n < 1) fail(ErrorCode::kInvalidArgument, "the number of ranks must be >= 1, got " + std::to_string(n));
  if (argv.empty() || argv[0].empty()) fail(ErrorCode::kInvalidArgument, "no command to run");
  if (!opt.devices.empty() && int(opt.devices.size()) != n)
    fail(ErrorCode::kInvalidArgument, std::to_string(opt.devices.size()) + " devices given for " + std::to_string(n) +
                                          " ranks");
  const std::string exe = resolve(argv[0]);

  // A private directory for the NCCL unique id that rank 0 publishes.
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/qhead-tp-XXXXXX";
  std::vector<char> tbuf(templ.begin(), templ.end());
  tbuf.push_back('\0');
  if (!::mkdtemp(tbuf.data())) fail(ErrorCode::kIo, "mkdtemp(" + templ + ") failed: " + std::strerror(errno));
  const std::string dir = tbuf.data();
  const std::string id_file = dir + "/nccl_id";

  // Everything the children need is built before fork: after it, only
  // async-signal-safe calls (execve, _exit, write).
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e)
    if (!overridden(*e)) base.emplace_back(*e);
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& env = envs[size_t(r)];
    env = base;
    env.push_back("QHEAD_TP_RANK=" + std::to_string(r));
    env.push_back("QHEAD_TP_WORLD=" + std::to_string(n));
    env.push_back("QHEAD_TP_DEVICE=" + std::to_string(opt.devices.empty() ? r : opt.devices[size_t(r)]));
    env.push_back("QHEAD_TP_ID_FILE=" + id_file);
    env.push_back("NCCL_NVLS_ENABLE=0");  // NVLink multicast stays off (device README)
  }
  auto cvec = [](const std::vector<std::string>& v) {
    std::vector<char*> p;
    for (const auto& s : v) p.push_back(const_cast<char*>(s.c_str()));
    p.push_back(nullptr);
    return p;
  };
  std::vector<char*> cargv = cvec(argv);
  std::vector<std::vector<char*>> cenv;
  for (const auto& e : envs) cenv.push_back(cvec(e));
  const std::string exec_fail = "qhead tp-run: execve(" + exe + ") failed\n";

  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(static_cast<size_t>(n), -1);
  std::vector<int> status(static_cast<size_t>(n), -1);
  int started = 0;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(exe.c_str(), cargv.data(), cenv[size_t(r)].data());
      ssize_t ignored = ::write(2, exec_fail.data(), exec_fail.size());
      (void)ignored;
      ::_exit(127);
    }
    if (pid < 0) break;
    pids[size_t(r)] = pid;
    ++started;
  }

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  bool stopping = started < n;  // a fork failed: take the started ones down
  auto kill_at = clock::now();
  bool killed = false;
  if (stopping)
    for (int r = 0; r < n; ++r)
      if (pids[size_t(r)] > 0) ::kill(pids[size_t(r)], SIGTERM);
  int alive = started;
  while (alive > 0) {
    bool reaped = false;
    for (int r = 0; r < n; ++r) {
      if (pids[size_t(r)] <= 0 || status[size_t(r)] >= 0) continue;
      int st = 0;
      const pid_t w = ::waitpid(pids[size_t(r)], &st, WNOHANG);
      if (w == 0) continue;
      if (w < 0) {
        status[size_t(r)] = 255;
      } else {
        status[size_t(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
      }
      --alive;
      reaped = true;
      if (status[size_t(r)] != 0 && !stopping) {
        stopping = true;
        kill_at = clock::now() + std::chrono::seconds(5);
        for (int o = 0; o < n; ++o)
          if (pids[size_t(o)] > 0 && status[size_t(o)] < 0) ::kill(pids[size_t(o)], SIGTERM);
      }
    }
    if (alive == 0) break;
    if (!stopping && opt.timeout_s > 0 && clock::now() - t0 > std::chrono::seconds(opt.timeout_s)) {
      std::fprintf(stderr, "qhead tp-run: timeout of %d s reached; stopping every rank\n", opt.timeout_s);
      stopping = true;
      kill_at = clock::now() + std::chrono::seconds(5);
      for (int o = 0; o < n; ++o)
        if (pids[size_t(o)] > 0 && status[size_t(o)] < 0) ::kill(pids[size_t(o)], SIGTERM);
    }
    if (stopping && !killed && clock::now() > kill_at) {
      killed = true;
      for (int o = 0; o < n; ++o)
        if (pids[size_t(o)] > 0 && status[size_t(o)] < 0) ::kill(pids[size_t(o)], SIGKILL);
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (started < n) fail(ErrorCode::kIo, "fork failed after " + std::to_string(started) + " of " + std::to_string(n) + " ranks");
  return status;
}

}  // namespace qhead::dist
