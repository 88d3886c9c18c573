// The command line's contract with scripts (usage.h): exit codes, the names
// of error codes, argument checks and typo suggestions.
#include "usage.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

namespace qhead::cli {

int exit_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return kExitUsage;
    case ErrorCode::kInvalidFile:
    case ErrorCode::kUnsupported: return kExitFailed;
    case ErrorCode::kIo: return kExitIo;
    case ErrorCode::kInternal: return kExitInternal;
  }
  return kExitInternal;
}

int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  // d[i][j]: the distance between a[0, i) and b[0, j).
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  auto bare = [](const std::string& s) { return s.substr(std::min(s.find_first_not_of('-'), s.size())); };
  const std::string w = bare(word);
  std::string best;
  int best_d = std::numeric_limits<int>::max();
  for (const auto& c : candidates) {
    const std::string b = bare(c);
    if (b.size() < 2) continue;  // every one-letter name is one edit from every other
    const int d = edit_distance(w, b);
    // Plausible typos: 1 edit in a name of up to 3 letters, 2 up to 6, else 3.
    const size_t len = std::max(w.size(), b.size());
    const int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
    if (d <= limit && d < best_d) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

namespace {

bool is_number(const std::string& s) {  // "-1", "-0.5": a value, not an option
  return s.size() >= 2 && s[0] == '-' && (std::isdigit(static_cast<unsigned char>(s[1])) || s[1] == '.');
}

std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    for (const auto& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

bool known_option(const std::string& arg, const std::vector<std::string>& names) {
  if (arg.rfind("--", 0) == 0) {
    const std::string name = arg.substr(0, arg.find('='));
    return std::find(names.begin(), names.end(), name) != names.end();
  }
  // "-o", "-oFILE", "-n2": a short name, its value possibly attached.
  return std::find(names.begin(), names.end(), arg.substr(0, 2)) != names.end();
}

[[noreturn]] void unknown_option(const std::string& where, const std::string& arg, const std::vector<std::string>& names,
                                 const std::string& help) {
  const std::string name = arg.substr(0, arg.find('='));
  const std::string near = nearest(name, names);
  throw UsageError(where, "unknown option " + name +
                              (near.empty() ? " (see " + help + " --help)" : " (did you mean " + near + "?)"));
}

// The first argument that names a command (skipping qhead's own flags), or -1.
int command_index(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return -1;
    if (!a.empty() && a[0] == '-') continue;  // qhead's own flags take no value
    for (const CLI::App* s : app.get_subcommands({}))
      if (s->get_name() == a) return i;
    return -1;
  }
  return -1;
}

std::string join(const std::vector<std::string>& v, const std::string& sep, const std::string& last_sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? last_sep : sep) + v[i];
  return s;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (true) {
    const size_t e = s.find(',', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

// "" when s is an integer in [lo, hi], else what is wrong with it.
std::string check_int(const std::string& s, int64_t lo, int64_t hi, const std::string& note, int64_t* out = nullptr) {
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  std::string range = hi == std::numeric_limits<int64_t>::max() ? ">= " + std::to_string(lo)
                                                                : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!note.empty()) range += " (" + note + ")";
  if (s.empty() || p != s.data() + s.size() || (ec != std::errc() && ec != std::errc::result_out_of_range))
    return "expected an integer " + range + ", got '" + s + "'";
  if (ec == std::errc::result_out_of_range || v < lo || v > hi) return "expected an integer " + range + ", got " + s;
  if (out) *out = v;
  return "";
}

}  // namespace

void check_names(CLI::App& app, int argc, char** argv) {
  const std::vector<std::string> top = option_names(app);
  std::vector<std::string> commands;
  for (const CLI::App* s : app.get_subcommands({})) commands.push_back(s->get_name());
  bool help = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.size() > 1 && a[0] == '-') {
      if (known_option(a, top)) {
        help = true;  // --help / --version: CLI11 answers
        continue;
      }
      // A command's option before the command: say where it goes.
      std::vector<std::string> owners;
      for (const CLI::App* s : app.get_subcommands({}))
        if (known_option(a, option_names(*s))) owners.push_back(s->get_name());
      if (!owners.empty()) {
        const std::string name = a.substr(0, a.find('='));
        for (int j = i + 1; j < argc; ++j)
          if (std::find(owners.begin(), owners.end(), argv[j]) != owners.end())
            throw UsageError("qhead", name + " goes after the command: qhead " + argv[j] + " " + a + " ...");
        throw UsageError("qhead", name + " is an option of " + join(owners, ", ", " and ") + ": it goes after the command");
      }
      unknown_option("qhead", a, top, "qhead");
    }
    CLI::App* sub = nullptr;
    for (CLI::App* s : app.get_subcommands({}))
      if (s->get_name() == a) sub = s;
    if (sub == nullptr) {
      const std::string near = nearest(a, commands);
      throw UsageError("qhead", "unknown command '" + a + "'" +
                                    (near.empty() ? " (commands: " + join(commands, ", ", " and ") + ")"
                                                  : " (did you mean " + near + "?)"));
    }
    if (sub->get_prefix_command()) return;  // its arguments belong to another program (qhead generate)
    const std::vector<std::string> names = option_names(*sub);
    const std::string where = "qhead " + sub->get_name();
    for (int j = i + 1; j < argc; ++j) {
      const std::string b = argv[j];
      if (b == "--") break;
      if (b.size() > 1 && b[0] == '-' && !is_number(b) && !known_option(b, names)) unknown_option(where, b, names, where);
    }
    return;
  }
  if (!help) throw UsageError("qhead", "a command is required: " + join(commands, ", ", " or ") + " (qhead --help)");
}

bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") return false;
    if (a == "--json") return true;
  }
  return false;
}

UsageError usage_error(const CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  const int ci = command_index(app, argc, argv);
  const std::string where = ci < 0 ? "qhead" : "qhead " + std::string(argv[ci]);
  std::string msg = e.what();
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  // By type: CLI11 names some errors after the subcommand that raised them.
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {  // "--m: 1 required TEXT missing"
    const size_t colon = msg.find(':');
    if (msg.find(" missing") != std::string::npos && colon != std::string::npos) msg = msg.substr(0, colon) + " needs a value";
  } else if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {  // "The following argument was not expected: b"
    const size_t colon = msg.find(": ");
    if (colon != std::string::npos) msg = "unexpected argument " + msg.substr(colon + 2);
  } else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && msg.rfind("A subcommand", 0) == 0) {
    msg = "a command is required (qhead --help)";
  }
  return UsageError(where, msg);
}

CLI::Validator int_range(int64_t lo, int64_t hi, const std::string& note) {
  return CLI::Validator(
      [=](std::string& s) { return check_int(s, lo, hi, note); },
      hi == std::numeric_limits<int64_t>::max() ? ">=" + std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi),
      "int_range");
}

CLI::Validator int_list(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        for (const auto& piece : split_commas(s)) {
          if (piece.empty()) return "an empty entry in '" + s + "' (a comma-separated list of integers)";
          const std::string err = check_int(piece, lo, hi, "");
          if (!err.empty()) return err;
        }
        return "";
      },
      std::to_string(lo) + ".." + std::to_string(hi) + ",...", "int_list");
}

CLI::Validator shape_list() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const int64_t kMax = std::numeric_limits<int32_t>::max();
        for (const auto& piece : split_commas(s)) {
          const size_t x = piece.find('x');
          if (piece.empty() || x == std::string::npos)
            return "expected VxH (vocab x hidden, e.g. 151936x1024), got '" + piece + "'";
          int64_t v = 0, h = 0;
          std::string err = check_int(piece.substr(0, x), 1, kMax, "", &v);
          if (err.empty()) err = check_int(piece.substr(x + 1), 1, kMax, "", &h);
          if (!err.empty()) return "'" + piece + "': V and H must each be " + err.substr(err.find("an integer "));
          if (v > std::numeric_limits<int64_t>::max() / 4 / h)
            return "'" + piece + "': V x H x 4 bytes overflows a 64-bit size";
        }
        return "";
      },
      "VxH,...", "shape_list");
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                         "-_./=,:+@%") == std::string::npos;
    if (i) s += ' ';
    if (plain) {
      s += a;
    } else {
      s += '\'';
      for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
      s += '\'';
    }
  }
  return s;
}

}  // namespace qhead::cli
