#pragma once
// What the command table of cli.cpp hands the commands: options, parsed arguments, and the
// handlers themselves (commands.cpp).
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dprun::cli {

struct Opt {
  std::string name;     // "--db"
  std::string metavar;  // "PATH"; "" for a flag
  std::string help;
};

/// The arguments of one command line, after the command name.
struct Args {
  std::map<std::string, std::vector<std::string>> values;  // by option name
  std::vector<std::string> positional;

  bool flag(const std::string& name) const { return values.count(name) > 0; }
  std::optional<std::string> last(const std::string& name) const {
    auto it = values.find(name);
    if (it == values.end() || it->second.empty()) return std::nullopt;
    return it->second.back();
  }
  std::vector<std::string> all(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }
};

/// What a handler is given: its command's name, the parsed arguments and the raw command line.
struct Invocation {
  std::string command;
  Args args;
  int argc;
  char** argv;
};

}  // namespace dprun::cli

namespace dprun {
struct SweepOptions;
}

namespace dprun::cli {

/// The options of a command that runs an experiment file (run, plan, submit): the file, --db,
/// --backend, --filter, ... Throws UsageError.
SweepOptions sweep_options(const Invocation& in);

/// The metavar of an option that takes every argument after it (submit's --slurm: sbatch's).
inline constexpr const char* kRestMetavar = "[SBATCH_OPTION]...";

// The commands; each returns the exit status and throws UsageError for a bad command line.
int run_command(const Invocation& in);
int plan_command(const Invocation& in);
int plugins_command(const Invocation& in);
int query_command(const Invocation& in);
int report_command(const Invocation& in);
int train_command(const Invocation& in);
int export_command(const Invocation& in);
int settings_command(const Invocation& in);
int submit_command(const Invocation& in);
int status_command(const Invocation& in);
int merge_command(const Invocation& in);
// annotate_commands.cpp: the user's words about trials, and forgetting trials.
int tag_command(const Invocation& in);
int note_command(const Invocation& in);
int forget_command(const Invocation& in);

/// The database a results command reads: --db, else the only results/*.db here; a UsageError
/// when it does not exist.
std::string results_database(const Args& a, const std::string& command);

/// The options of `dprun train`: one per experiment-file key, from the table of settings.
std::vector<Opt> train_options();

}  // namespace dprun::cli
