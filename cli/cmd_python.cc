// qhead generate / qhead agree: the commands the Python package implements
// (python -m qhead.generate, python -m qhead.agree: they need torch and
// transformers). The process becomes that Python (execvp): the arguments
// reach it unchanged, its output and exit status are the command's own.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "usage.h"

namespace qhead::cli {

namespace {

// What the Python runs: `-m MODULE` as runpy does it, except that a module
// that cannot be imported (qhead not installed in this Python, or too old to
// have the module) is reported with Python's own message and one qhead line
// saying what to do, exit status 1. argv[1] of the -c program is the module,
// argv[2] the command's name; sys.argv is then what `-m MODULE ARGS` gives.
constexpr const char* kBootstrap = R"PY(import sys
mod, cmd = sys.argv[1], sys.argv[2]
try:
    import importlib.util
    spec = importlib.util.find_spec(mod)
    why = None if spec is not None else f"No module named {mod!r}"
except ImportError as e:
    why = str(e)
if why is not None:
    print(f"{sys.executable}: {why}", file=sys.stderr)
    print(f"qhead: error: qhead {cmd} runs the Python package: install it (pip install .) into the Python named by QHEAD_PYTHON", file=sys.stderr)
    sys.exit(1)
import runpy
del sys.argv[1:3]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
)PY";

}  // namespace

int run_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args) {
  const char* env = std::getenv("QHEAD_PYTHON");
  const std::string py = env != nullptr && *env != '\0' ? env : "python3";
  std::vector<std::string> strs = {py, "-c", kBootstrap, module, command};
  strs.insert(strs.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strs) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  ::execvp(py.c_str(), argv.data());
  // Only reached when the exec failed.
  const int err = errno;
  std::fprintf(stderr,
               "qhead %s: error: cannot run %s (%s): qhead %s runs the Python package: install it (pip install .) "
               "into the Python named by QHEAD_PYTHON (default: python3 on PATH)\n",
               command.c_str(), py.c_str(), std::strerror(err), command.c_str());
  return kExitFailed;
}

}  // namespace qhead::cli
