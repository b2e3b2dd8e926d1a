#pragma once
// Running a sweep: load the plugins and the experiment, reconcile its trials with the store,
// then run the trials that need it, one child process each (trial_process.hpp; a launcher for a
// trial of several processes), one after another or several at once on their own devices
// (scheduler.hpp), writing every epoch as it arrives. Also the read-only plan (`dprun plan`,
// `dprun run --dry-run`).
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/usage_error.hpp"
#include "dpstore/store.hpp"
#include "experiment/experiment.hpp"
#include "process/run_options.hpp"

namespace dprun {

struct SweepOptions {
  std::string file;
  std::string db;  // "" : [experiment].database, else results/<name>.db
  /// How its trials run (also what a Slurm task takes over from a submission).
  RunOptions run;
  bool dry_run = false;
  bool force = false;                                        // allow more than 1000 trials
  std::vector<std::pair<std::string, std::string>> filters;  // KEY=VALUE, see trial_matches
  std::vector<std::string> overrides;  // --set KEY=VALUE (ParseOptions::overrides)
  /// Trials at once, each on its own devices (scheduler.hpp); 0: as many as the devices allow
  /// (--jobs auto); 1: one after another, each with the whole machine.
  int jobs = 1;
  double heartbeat_seconds = 10;
  double stale_seconds = 120;  // a `running` trial whose heartbeat is older is interrupted
  std::string command_line;    // how we were started, for the resume hint
  /// The settings experiment files may set; null: this dprun's (tests give a later dprun's).
  const SettingTable* settings = nullptr;
  /// How the database journals its writes: rollback for a Slurm task's own database, which is
  /// on a cluster's shared file system (see dps::Store::Journal).
  dps::Store::Journal journal = dps::Store::Journal::wal;
  /// A Slurm task's asha job: the rung its one trial runs to and that rung's epoch (the
  /// submission decided it; the task does not decide again). rung -1: none.
  int64_t task_rung = -1;
  int64_t task_stop_after = 0;
  /// The error of a trial stopped because the runner got `sig`; unset: "interrupted by SIGTERM".
  /// A Slurm task asks Slurm why it was stopped (cancelled, time limit, preemption).
  std::function<std::string(int sig)> interruption_cause;
};

/// What a run would do with one trial.
enum class TrialAction { run, skip };
struct PlannedTrial {
  const TrialSpec* spec = nullptr;
  std::optional<dps::TrialRow> row;  // the stored trial, when there is one
  TrialAction action = TrialAction::run;
  std::string why;  // "new", "done", "failed", "filtered out", ...
  /// Not filtered out and not held by a Slurm task: a [search] scheduler may run it (whatever
  /// the action, which is what a run without a scheduler would do).
  bool eligible = true;
  /// "run", "skip: done", "restart: interrupted", "rerun: failed", "resume after epoch 3:
  /// failed", ...
  std::string describe() const;
};

/// Decides for each trial of `experiment` given what the store holds (rows by config hash).
/// elsewhere: trials a Slurm task has queued or running (by config hash: "Slurm job 12_3"),
/// which are skipped.
std::vector<PlannedTrial> plan_trials(const Experiment& experiment,
                                      const std::map<std::string, dps::TrialRow>& stored,
                                      const SweepOptions& options,
                                      const std::map<std::string, std::string>& elsewhere = {});

/// Every setting of a trial by column and by key as text ("gpus" -> "2", "lr" -> "0.4",
/// "bn" and "bn_mode" -> "per-replica", "option.hidden" -> "128"), for --filter.
std::map<std::string, std::string> trial_setting_values(const TrialSpec& spec);

/// True when the trial matches every filter key (several values for one key: any of them).
/// Key `tag`: the stored trial has that tag (dprun tag); a trial the database does not hold
/// (stored null) has none. Throws UsageError for a key that is not a setting name or `tag`, and
/// for a value of `tag` that is not a tag name.
bool trial_matches(const TrialSpec& spec,
                   const std::vector<std::pair<std::string, std::string>>& filters,
                   const dps::TrialRow* stored = nullptr);

/// "lenet gpus=2 batch_size=512 lr=0.4": the model (unless the label names it) and the label.
std::string trial_display_name(const TrialSpec& spec);

/// The database path for an experiment under these options.
std::string database_path(const Experiment& experiment, const SweepOptions& options);

/// Loads the plugins (plugin errors become warnings on stderr) and parses the experiment.
/// Throws ConfigErrors on a bad file.
Experiment load_sweep(const SweepOptions& options);

/// Trials that run elsewhere, by config hash, with where ("Slurm job 12_3 (RUNNING)"): a run
/// skips them. The sweep itself never asks a cluster: `dprun run` collects what its Slurm tasks
/// finished, and names those still queued or running, before it starts the sweep
/// (slurm/merge.hpp's collect_before_run).
using HeldElsewhere = std::map<std::string, std::string>;

/// Runs the trials of an experiment already loaded that need it (a Slurm task keeps only its
/// own trial of it): returns the exit status (0, 1, 130 / 143 when interrupted).
int run_experiment(const Experiment& experiment, const SweepOptions& options,
                   const HeldElsewhere& elsewhere = {});

/// The stored trials of an experiment by config hash; empty when the database or the experiment
/// does not exist. Read-only: the trials of tasks not collected yet are listed in `submitted`
/// ("Slurm job 12_3, not collected yet"), as they stand in the database (Slurm is not asked).
std::map<std::string, dps::TrialRow> stored_trials_read_only(
    const std::string& db, const std::string& experiment,
    std::map<std::string, std::string>& submitted);

/// `dprun plan` / `--dry-run`: prints the trials and what a run would do; reads the database
/// when it exists, never creates or changes it. Returns 0.
int plan_sweep(const SweepOptions& options);

}  // namespace dprun
