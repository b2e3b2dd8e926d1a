// The Slurm commands: `dprun submit` (the work is slurm/submit.cpp's), `dprun status` (where a
// sweep submitted to Slurm stands) and `dprun merge` (collecting what its tasks wrote,
// slurm/merge.hpp).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "base/os.hpp"
#include "base/text.hpp"
#include "cli/commands.hpp"
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

std::string merge_line(const MergeSummary& m) {
  std::string line =
      "collected " + std::to_string(m.merged) + " task result" + (m.merged == 1 ? "" : "s");
  if (m.superseded) line += ", " + std::to_string(m.superseded) + " of older attempts (kept apart)";
  if (m.lost) line += ", " + std::to_string(m.lost) + " task(s) lost";
  line += "; " + std::to_string(m.waiting) + " task(s) still queued, running or left for later";
  return line;
}

// A trial's place in `dprun status`.
struct TrialLine {
  std::string name, state, epochs, why;
};

std::string live_state(const std::string& slurm_state) {
  if (slurm_state == "PENDING" || slurm_state == "REQUEUED" || slurm_state == "CONFIGURING" ||
      slurm_state == "REQUEUE_HOLD" || slurm_state == "REQUEUE_FED")
    return "queued";
  return "running";
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

// The trials of an experiment as (config hash, name): the file's in sweep order, else the
// database's.
std::vector<std::pair<std::string, std::string>> trials_of(dps::Store& store, int64_t experiment,
                                                           const Target& t) {
  std::vector<std::pair<std::string, std::string>> trials;
  if (t.experiment) {
    for (const auto& spec : t.experiment->trials)
      trials.emplace_back(spec.config_hash, trial_display_name(spec));
    return trials;
  }
  for (const auto& r : store.trials(experiment)) {
    const auto model = r.settings.find("model");
    trials.emplace_back(
        r.config_hash,
        "trial " + std::to_string(r.id) + " " +
            (model != r.settings.end() && std::holds_alternative<std::string>(model->second)
                 ? std::get<std::string>(model->second)
                 : std::string()));
  }
  return trials;
}

// Where one stored trial stands: its epochs, and its state from its newest Slurm task (queued,
// running, submitted but not collected, lost) or from its own status.
TrialLine trial_line(const std::string& name, const dps::TrialRow& r,
                     const std::map<int64_t, dps::TaskRow>& last_task, const MergeSummary& m) {
  TrialLine line{name, "not run", "-", ""};
  const auto setting = r.settings.find("epochs");
  line.epochs = std::to_string(r.epochs_done) + "/" +
                (setting != r.settings.end() && std::holds_alternative<int64_t>(setting->second)
                     ? std::to_string(std::get<int64_t>(setting->second))
                     : std::string("?"));
  auto task = last_task.find(r.id);
  if (task != last_task.end() && task->second.state == dps::TaskState::submitted) {
    auto live = m.live.find({task->second.submission_id, task->second.index});
    line.state = live != m.live.end() ? live_state(live->second) : "submitted";
    line.why = task_name(task->second) +
               (live != m.live.end() ? " " + live->second : ": result not collected yet");
  } else if (r.status == dps::TrialStatus::pending && task != last_task.end() &&
             task->second.state == dps::TaskState::lost) {
    line.state = "lost";
    line.why = task->second.error;
  } else {
    line.state = r.status == dps::TrialStatus::pending ? "not run" : dps::status_name(r.status);
    line.why = r.error;
  }
  return line;
}

// One experiment's `dprun status`: collects what ended, counts the trials by state and lists
// those not done.
void print_status(dps::Store& store, const dps::ExperimentRow& e, const Target& t) {
  static const std::vector<std::string> order = {"done",    "running",  "queued",      "submitted",
                                                 "failed",  "diverged", "interrupted", "lost",
                                                 "skipped", "not run"};
  const MergeSummary m = merge_tasks(store, e.id);
  std::map<std::string, dps::TrialRow> rows;
  for (auto& r : store.trials(e.id)) rows[r.config_hash] = r;
  // The newest task of each trial (tasks come oldest first).
  std::map<int64_t, dps::TaskRow> last_task;
  std::set<std::string> jobs;
  for (const auto& task : store.tasks(e.id, false)) {
    last_task[task.trial_id] = task;
    if (!task.job_id.empty()) jobs.insert(task.job_id);
  }
  const auto trials = trials_of(store, e.id, t);
  std::map<std::string, int> counts;
  std::vector<TrialLine> not_done;
  for (const auto& [hash, name] : trials) {
    auto row = rows.find(hash);
    const TrialLine line = row != rows.end() ? trial_line(name, row->second, last_task, m)
                                             : TrialLine{name, "not run", "-", ""};
    ++counts[line.state];
    if (line.state != "done" && line.state != "running" && line.state != "queued")
      not_done.push_back(line);
  }
  std::string count_text;
  for (const auto& state : order)
    if (counts[state] > 0)
      count_text += (count_text.empty() ? "" : ", ") + std::to_string(counts[state]) + " " + state;
  std::printf("experiment %s: %zu trial%s: %s\n", e.name.c_str(), trials.size(),
              trials.size() == 1 ? "" : "s", count_text.c_str());
  std::string job_list;
  for (const auto& j : jobs) job_list += (job_list.empty() ? "" : ", ") + j;
  if (!jobs.empty())
    std::printf("Slurm job%s %s; %s\n", jobs.size() == 1 ? "" : "s", job_list.c_str(),
                merge_line(m).c_str());
  for (const auto& note : m.notes) std::printf("  note: %s\n", note.c_str());
  if (not_done.empty()) return;
  std::vector<std::vector<std::string>> table{{"trial", "state", "epochs", "why"}};
  for (const auto& l : not_done) table.push_back({l.name, l.state, l.epochs, l.why});
  std::printf("trials not done:\n");
  std::fputs(format_aligned(table, "  ").c_str(), stdout);
  if (t.experiment)
    std::printf(
        "to run them (failed and interrupted ones resume from their last checkpoint): "
        "dprun submit %s\n",
        shell_quote(t.experiment->file).c_str());
}

}  // namespace

int status_command(const Invocation& in) {
  const Target t = target_of(in);
  dps::Store store = open_read_write(t);
  const auto experiments = experiments_of(store, t);
  if (experiments.empty()) {
    if (!t.experiment) {
      std::fprintf(stderr,
                   "dprun status: database %s holds no experiment; give the experiment file "
                   "(dprun status FILE.toml) or a database that has run or submitted one\n",
                   t.db.c_str());
      return 2;
    }
    std::printf("experiment %s: nothing submitted or run yet (database %s)\n",
                t.experiment->name.c_str(), t.db.c_str());
    return 0;
  }
  for (const auto& e : experiments) print_status(store, e, t);
  std::printf("database: %s\n", t.db.c_str());
  return 0;
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
