// The Slurm commands: `dprun submit` (the work is slurm/submit.cpp's), `dprun status` (where a
// sweep stands, local or on Slurm: status_view.hpp) and `dprun merge` (collecting what its tasks
// wrote, slurm/merge.hpp).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "base/os.hpp"
#include "cli/commands.hpp"
#include "cli/status_view.hpp"
#include "report/report.hpp"
#include "slurm/merge.hpp"
#include "slurm/submit.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun::cli {

namespace {

namespace fs = std::filesystem;

// The database a command works on, and the experiment file when one was given.
struct Target {
  std::string db;
  std::optional<Experiment> experiment;
};

Target target_of(const Invocation& in) {
  const Args& a = in.args;
  Target t;
  if (a.positional.size() > 1)
    throw UsageError("dprun " + in.command + " takes at most one experiment file (see dprun " +
                     in.command + " --help)");
  if (a.positional.size() == 1) {
    SweepOptions o;
    o.file = a.positional[0];
    o.db = a.last("--db").value_or("");
    o.run.plugin_dirs = a.all("--plugins");
    t.experiment = load_sweep(o);
    t.db = database_path(*t.experiment, o);
    if (!fs::exists(t.db))
      throw UsageError(t.db + ": no such database (nothing was submitted or run with " +
                       t.experiment->file + " yet)");
  } else {
    t.db = results_database(a, in.command);
  }
  return t;
}

// The experiments to work on: the file's, else every one in the database.
std::vector<dps::ExperimentRow> experiments_of(dps::Store& store, const Target& t) {
  if (!t.experiment) return store.experiments();
  auto found = store.find_experiment(t.experiment->name);
  return found ? std::vector<dps::ExperimentRow>{*found} : std::vector<dps::ExperimentRow>{};
}

dps::Store open_read_write(const Target& t) {
  return dps::Store(
      t.db, dps::Store::Mode::read_write,
      t.experiment ? t.experiment->settings->store_columns() : std::vector<dps::SettingColumn>{});
}

}  // namespace

int merge_command(const Invocation& in) {
  const Target t = target_of(in);
  dps::Store store = open_read_write(t);
  for (const auto& e : experiments_of(store, t)) {
    const MergeSummary m = merge_tasks(store, e.id);
    std::printf("experiment %s: %s\n", e.name.c_str(), merge_line(m).c_str());
    for (const auto& note : m.notes) std::printf("  %s\n", note.c_str());
  }
  return 0;
}

namespace {

// --watch [SECONDS]: every 2 s when no value is given.
double watch_interval(const std::optional<std::string>& value) {
  if (!value) return 2;
  char* end = nullptr;
  const double seconds = std::strtod(value->c_str(), &end);
  // At least 0.5 s: each refresh reads every trial (and asks Slurm's squeue, when tasks are out).
  if (value->empty() || *end != '\0' || !(seconds >= 0.5) || seconds > 86400)
    throw UsageError("--watch " + *value +
                     ": expected the seconds between refreshes, 0.5 to 86400 (e.g. 2 or 0.5)");
  return seconds;
}

}  // namespace

int status_command(const Invocation& in) {
  const Target t = target_of(in);
  std::optional<double> interval;
  if (in.args.flag("--watch")) interval = watch_interval(in.args.last("--watch"));
  return show_status(t.db, t.experiment ? &*t.experiment : nullptr, interval,
                     in.args.flag("--all"));
}

int submit_command(const Invocation& in) {
  const Args& a = in.args;
  const bool slurm = a.flag("--slurm");
  std::vector<std::string> sbatch_args = a.all("--slurm");
  // "--slurm -- --time=10": the "--" only separates; sbatch would end its options there.
  if (!sbatch_args.empty() && sbatch_args.front() == "--") sbatch_args.erase(sbatch_args.begin());
  if (a.positional.empty())
    for (const auto& s : sbatch_args)
      if (s.size() > 5 && s.substr(s.size() - 5) == ".toml")
        throw UsageError(
            "dprun submit: give the experiment file before --slurm (everything after "
            "--slurm goes to sbatch): dprun submit " +
            s + " --slurm ...");
  if (const std::string problem = sbatch_args_problem(sbatch_args); !problem.empty())
    throw UsageError("--slurm: " + problem);
  SweepOptions o = sweep_options(in);
  const Experiment e = load_sweep(o);
  if (!slurm && !e.slurm.given)
    throw UsageError("dprun submit needs --slurm [sbatch options] or a [launch.slurm] table in " +
                     o.file +
                     " (e.g. [launch.slurm] partition = \"gpu\", time = \"2:00:00\"); "
                     "Slurm is the scheduler dprun submits to");
  SlurmConfig config = e.slurm;
  if (auto n = a.last("--max-parallel")) {
    char* end = nullptr;
    const long long v = std::strtoll(n->c_str(), &end, 10);
    if (n->empty() || *end != '\0' || v < 1)
      throw UsageError("--max-parallel " + *n + ": expected a positive integer");
    config.max_parallel = v;
  }
  if (o.dry_run) {
    print_submission_plan(e, o, config, sbatch_args);
    return 0;
  }
  if (find_executable("sbatch").empty())
    throw UsageError(
        "sbatch is not on PATH: dprun submit hands the sweep to Slurm, so run it where Slurm's "
        "commands are (a cluster's login node; Debian: slurm-client), or run the sweep here with "
        "dprun run " +
        o.file);
  return submit_sweep(e, o, config, sbatch_args);
}

}  // namespace dprun::cli
