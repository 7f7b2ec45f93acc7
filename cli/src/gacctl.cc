// The command line: finds the command, parses its flags and the global ones,
// builds the connection, runs the action and maps the result to an exit
// status. Help texts come from the command specs.
#include "gac/cli/gacctl.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "cli/src/commands.h"
#include "gac/base/file_util.h"

#ifndef GAC_VERSION
#define GAC_VERSION "unknown"
#endif

namespace gac::cli {
namespace {

constexpr const char* kDefaultAddress = "127.0.0.1:7070";

std::vector<FlagSpec> GlobalFlags() {
  return {
      {"address", "HOST:PORT", "gacd's gRPC address (default $GAC_ADDRESS, else 127.0.0.1:7070)"},
      {"token", "TOKEN", "bearer token (default $GAC_TOKEN)"},
      {"token-file", "FILE", "read the bearer token from FILE (the token alone; surrounding blanks ignored)"},
      {"tls", "", "talk TLS to gacd, verified with the system's root certificates"},
      {"tls-ca", "FILE", "talk TLS to gacd, verified with the PEM certificates in FILE"},
      {"tls-server-name", "NAME", "the name gacd's certificate must carry (default: the host of --address)"},
      {"timeout", "DURATION", "deadline of each call to gacd (default 10s; 500ms, 2m...)"},
      {"help", "", "this help", 'h'},
  };
}

std::vector<CommandSpec> AllCommands() {
  std::vector<CommandSpec> all;
  for (auto group : {RunCommands, StepCommands, ConfigCommands, ReplayCommands, BacktestCommands}) {
    for (CommandSpec& c : group()) all.push_back(std::move(c));
  }
  return all;
}

std::string FlagLine(const FlagSpec& f) {
  std::string left = "  ";
  left += f.short_name != 0 ? std::string("-") + f.short_name + ", " : "";
  left += "--" + f.name;
  if (!f.value_name.empty()) left += " " + f.value_name;
  if (left.size() < 30) left.append(30 - left.size(), ' ');
  else left += "  ";
  return left + f.help + "\n";
}

std::string GlobalHelp() {
  std::string text = "global flags (before or after the command):\n";
  for (const FlagSpec& f : GlobalFlags()) text += FlagLine(f);
  text +=
      "\nenvironment:\n"
      "  GAC_ADDRESS                 gacd's address when --address is not given\n"
      "  GAC_TOKEN                   the bearer token when neither --token nor --token-file is given\n"
      "\nexit status: 0 success; 1 gacd refused or failed the request, or cannot be reached\n"
      "(the gRPC status name and gacd's text on stderr); 2 usage error; 130 interrupted.\n";
  return text;
}

// "  steps RUN     export a run's step records..."
std::string SummaryLine(const CommandSpec& c) {
  std::string left = "  " + c.name + (c.args.empty() ? "" : " " + c.args);
  if (left.size() < 30) left.append(30 - left.size(), ' ');
  else left += "  ";
  return left + c.summary + "\n";
}

std::string TopHelp(const std::vector<CommandSpec>& commands) {
  std::string text =
      "gacctl: the command line of gacd, gac's telemetry and control server\n\n"
      "usage: gacctl COMMAND [ARGS] [flags]\n\ncommands:\n";
  for (const CommandSpec& c : commands) text += SummaryLine(c);
  text += "\n" + GlobalHelp() + "\n'gacctl COMMAND --help' describes a command, its flags and its output.\n";
  return text;
}

std::string CommandHelp(const CommandSpec& c) {
  std::string text = "gacctl " + c.name + ": " + c.summary + "\n\nusage: gacctl " + c.name +
                     (c.args.empty() ? "" : " " + c.args) + (c.flags.empty() ? "" : " [flags]") + "\n";
  if (!c.description.empty()) text += "\n" + c.description;
  if (!c.flags.empty()) {
    text += "\nflags:\n";
    for (const FlagSpec& f : c.flags) text += FlagLine(f);
  }
  text += "\n" + GlobalHelp();
  return text;
}

// The usage error of a command, with where to look.
int UsageError(std::ostream& err, const std::string& command, const std::string& message) {
  const std::string where = command.empty() ? "gacctl" : "gacctl " + command;
  err << where << ": " << message << " (see '" << where << " --help')\n";
  return kExitUsage;
}

// One line, whatever gacd or gRPC put in the text.
std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return text;
}

std::string Trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

base::StatusOr<ConnectionOptions> ConnectionFromFlags(const ParsedFlags& flags, const Environment& env) {
  ConnectionOptions c;
  if (const std::string* a = flags.Get("address")) {
    c.address = *a;
  } else if (auto a_env = env.getenv("GAC_ADDRESS"); a_env && !a_env->empty()) {
    c.address = *a_env;
  } else {
    c.address = kDefaultAddress;
  }
  if (c.address.empty()) return base::Status::InvalidArgument("--address must not be empty");
  if (flags.Has("token") && flags.Has("token-file")) {
    return base::Status::InvalidArgument("--token and --token-file exclude each other");
  }
  if (const std::string* t = flags.Get("token")) {
    c.token = *t;
  } else if (const std::string* f = flags.Get("token-file")) {
    base::StatusOr<std::string> text = base::ReadFileToString(*f, "token file");
    if (!text.ok()) return base::Status::InvalidArgument("--token-file: " + text.status().message());
    c.token = Trim(*text);
    if (c.token.empty()) return base::Status::InvalidArgument("--token-file: " + *f + " holds no token");
  } else if (auto t_env = env.getenv("GAC_TOKEN")) {
    c.token = Trim(*t_env);
  }
  if (c.token.find_first_of(" \t\r\n") != std::string::npos) {
    return base::Status::InvalidArgument("the token must not contain blanks");
  }
  c.tls = flags.Has("tls") || flags.Has("tls-ca");
  if (const std::string* ca = flags.Get("tls-ca")) {
    base::StatusOr<std::string> pem = base::ReadFileToString(*ca, "CA certificate file");
    if (!pem.ok()) return base::Status::InvalidArgument("--tls-ca: " + pem.status().message());
    if (pem->find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      return base::Status::InvalidArgument("--tls-ca: " + *ca + " holds no PEM certificate");
    }
    c.tls_ca_pem = *pem;
  }
  if (const std::string* name = flags.Get("tls-server-name")) {
    if (!c.tls) return base::Status::InvalidArgument("--tls-server-name needs --tls or --tls-ca");
    c.tls_server_name = *name;
  }
  if (const std::string* t = flags.Get("timeout")) {
    GAC_ASSIGN_OR_RETURN(std::chrono::milliseconds d, ParseDurationFlag("--timeout", *t));
    c.timeout = d;
  }
  return c;
}

bool IsGlobal(const std::vector<FlagSpec>& specs, const std::string& arg) {
  const std::string name = arg.substr(0, arg.find('='));
  for (const FlagSpec& f : specs) {
    if ("--" + f.name == name || (f.short_name != 0 && name == std::string("-") + f.short_name)) return true;
  }
  return false;
}

bool TakesValue(const std::vector<FlagSpec>& specs, const std::string& arg) {
  if (arg.rfind("--", 0) != 0 || arg.find('=') != std::string::npos) return false;
  for (const FlagSpec& f : specs) {
    if ("--" + f.name == arg) return !f.value_name.empty();
  }
  return false;
}

}  // namespace

std::vector<std::string> CommandNames() {
  std::vector<std::string> names;
  for (const CommandSpec& c : AllCommands()) names.push_back(c.name);
  return names;
}

namespace {

std::string ConfigOverview(const std::vector<CommandSpec>& commands) {
  std::string text = "gacctl config: a run's settings\n\n";
  for (const CommandSpec& c : commands) {
    if (c.name.rfind("config ", 0) == 0) text += SummaryLine(c);
  }
  return text;
}

// What the words before a command's flags say: the command and what
// follows it, or an exit status when they settle it alone (help, version,
// a usage error).
struct CommandLine {
  const CommandSpec* spec = nullptr;
  std::vector<std::string> rest;  // global flags before the command, then all after it
  std::optional<int> done;
};

CommandLine ReadCommand(const std::vector<std::string>& args, const std::vector<CommandSpec>& commands,
                        const std::vector<FlagSpec>& globals, std::ostream& out, std::ostream& err) {
  CommandLine line;
  auto done = [&line](int rc) {
    line.done = rc;
    return line;
  };
  // The command word comes first among the arguments that are not flags;
  // only global flags may come before it.
  std::string name;
  std::size_t i = 0;
  bool help = false;
  for (; i < args.size() && name.empty(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help = true;
    } else if (a == "--version") {
      out << "gacctl " << GAC_VERSION << "\n";
      return done(kExitOk);
    } else if (a.size() > 1 && a[0] == '-') {
      if (!IsGlobal(globals, a)) {
        return done(UsageError(err, "", "'" + a + "' before the command: a command's own flags go after it"));
      }
      line.rest.push_back(a);
      if (TakesValue(globals, a) && i + 1 < args.size()) line.rest.push_back(args[++i]);
    } else {
      name = a;
    }
  }
  if (name.empty()) {
    (help ? out : err) << TopHelp(commands);
    return done(help ? kExitOk : kExitUsage);
  }
  if (name == "help") {  // gacctl help [COMMAND [SUBCOMMAND]]
    name.clear();
    for (; i < args.size(); ++i) name += (name.empty() ? "" : " ") + args[i];
    if (name.empty() || name == "config") {
      out << (name.empty() ? TopHelp(commands) : ConfigOverview(commands));
      return done(kExitOk);
    }
    help = true;
  } else if (name == "config") {
    const bool sub = i < args.size() && !args[i].empty() && args[i][0] != '-';
    if (!sub && (help || (i < args.size() && (args[i] == "--help" || args[i] == "-h")))) {
      out << ConfigOverview(commands);
      return done(kExitOk);
    }
    if (!sub) return done(UsageError(err, "config", "expected get, set or history"));
    name += " " + args[i++];
  }
  for (const CommandSpec& c : commands) {
    if (c.name == name) line.spec = &c;
  }
  if (line.spec == nullptr) return done(UsageError(err, "", "unknown command '" + name + "'"));
  if (help) {
    out << CommandHelp(*line.spec);
    return done(kExitOk);
  }
  line.rest.insert(line.rest.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return line;
}

// The exit status of a finished action, with its one-line error.
int Finish(const base::Status& st, const Context& ctx, std::ostream& out, std::ostream& err) {
  out.flush();
  if (!st.ok()) {
    if (st.IsCancelled() && ctx.interrupted()) {
      err << "gacctl: interrupted\n";
      return kExitInterrupted;
    }
    err << "gacctl: " << OneLine(st.ToString()) << "\n";
    return kExitFailed;
  }
  if (!out) {
    err << "gacctl: cannot write the output\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

int RunGacctl(const std::vector<std::string>& args, const Environment& env, std::ostream& out, std::ostream& err) {
  const std::vector<CommandSpec> commands = AllCommands();
  const std::vector<FlagSpec> globals = GlobalFlags();
  const CommandLine line = ReadCommand(args, commands, globals, out, err);
  if (line.done) return *line.done;
  const CommandSpec& spec = *line.spec;

  std::vector<FlagSpec> specs = spec.flags;
  specs.insert(specs.end(), globals.begin(), globals.end());
  base::StatusOr<ParsedFlags> flags = ParseFlags(line.rest, specs);
  if (!flags.ok()) return UsageError(err, spec.name, flags.status().message());
  if (flags->Has("help")) {
    out << CommandHelp(spec);
    return kExitOk;
  }
  const std::vector<std::string>& positional = flags->positional();
  if (positional.size() < spec.positionals) return UsageError(err, spec.name, "expected " + spec.args);
  if (positional.size() > spec.positionals && !spec.more_positionals) {
    return UsageError(err, spec.name, "unexpected argument '" + positional[spec.positionals] + "'");
  }
  base::StatusOr<ConnectionOptions> connection = ConnectionFromFlags(*flags, env);
  if (!connection.ok()) return UsageError(err, spec.name, connection.status().message());
  base::StatusOr<Action> action = spec.prepare(*flags, positional);
  if (!action.ok()) return UsageError(err, spec.name, action.status().message());
  for (const std::string& note : flags->deprecation_notes()) err << "gacctl: note: " << note << "\n";

  Context ctx(env, out, err, std::move(*connection));
  const base::Status st = (*action)(ctx);
  ctx.EndProgress();
  return Finish(st, ctx, out, err);
}

}  // namespace gac::cli
