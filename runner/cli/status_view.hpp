#pragma once
// `dprun status`: where a sweep stands while it runs, local or on Slurm. status_view.cpp holds
// the arithmetic (time per epoch, ETAs) and the layout; status_read.cpp fills a SweepStatus from
// the experiment's database and, for trials running on Slurm, from their task databases (read
// only), and runs --watch.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dpstore/store.hpp"

namespace dprun {
struct Experiment;
struct MergeSummary;
}  // namespace dprun

namespace dprun::cli {

/// One trial in `dprun status`.
struct TrialProgress {
  int64_t id = 0;  // in the database; 0: not in it yet
  std::string name;
  /// done, stopped, pruned, running, stale (running, but its runner on this host is gone),
  /// queued, submitted, failed, diverged, interrupted, lost, skipped, not run
  std::string state;
  int64_t epoch = 0;                                    // epochs recorded
  int64_t epochs = 0;                                   // its epochs setting; 0: unknown
  std::optional<double> train_loss, test_acc, val_acc;  // of its last epoch
  /// Mean seconds of its epochs, epoch 1 (warm-up) excluded when there are more, as the views.
  std::optional<double> seconds_per_epoch;
  std::string devices;  // what it runs on ("" : not known)
  /// What sets its time per epoch (model, gpus, batch size, ...): trials of one shape lend
  /// their timing to those of the shape that have none of their own yet.
  std::string shape;
  std::string why;  // its error, its Slurm task, or why its progress cannot be read
};

/// One experiment of the database as `dprun status` shows it.
struct SweepStatus {
  std::string experiment;
  std::vector<TrialProgress> trials;     // in sweep order
  std::vector<std::string> slurm_lines;  // the Slurm jobs and what the merge did, then notes
  /// Something runs or waits to: a trial running, a Slurm task not collected, or a dprun run of
  /// this experiment alive on this host. `--watch` stops when nothing is.
  bool active = false;
  std::string rerun_command;  // what runs the trials not done ("": nothing to suggest)
};

/// A setting's value as text (2, 0.1, lenet; "" for NULL).
std::string stored_text(const dps::SqlValue& v);

/// Mean seconds per epoch from each epoch's seconds (in epoch order): epoch 1 excluded when
/// there are more (it carries the warm-up), as the trial_summary view; nullopt without epochs.
std::optional<double> mean_epoch_seconds(const std::vector<double>& seconds);

/// The settings that set a trial's time per epoch, as one key ("model=lenet gpus=2 ...").
std::string shape_of(const dps::SettingValues& settings);

/// Whether a trial in that state still has epochs to run in this sweep.
bool is_left(const std::string& state);

/// Mean seconds per epoch of each shape, over the trials of that shape that timed an epoch.
std::map<std::string, double> shape_seconds(const std::vector<TrialProgress>& trials);

/// Seconds until the trial ends: its remaining epochs x its own seconds per epoch, else those
/// of its shape. nullopt: not left to run, or no timing (never a guess).
std::optional<double> trial_eta(const TrialProgress& t,
                                const std::map<std::string, double>& by_shape);

/// The sweep's remaining time: the work of the trials left over as many trials at a time as
/// run now (at least 1), and never less than the longest running trial's.
struct SweepEta {
  std::optional<double> seconds;              // nullopt: unknown (some trial left has no timing)
  int left = 0;                               // trials with epochs to run
  int untimed = 0;                            // of which without timing
  int at_once = 1;                            // trials at a time it assumes
  int64_t epochs_done = 0, epochs_total = 0;  // over the trials with a known epoch count
};
SweepEta sweep_eta(const std::vector<TrialProgress>& trials);

/// "45s", "2m05s", "1h02m", "3d04h".
std::string format_duration(double seconds);

struct StatusLayout {
  size_t max_trials = 30;  // trial lines at most (0: every trial)
  size_t width = 0;        // cut every line to this many columns (0: never)
};

/// The text of one experiment: the counts by state, progress and ETA, the Slurm lines, and a
/// table of the trials (every one when they fit; else the running ones, the next to run, those
/// that failed with the reason, and the rest as room allows, saying how many are not shown).
std::string format_status(const SweepStatus& sweep, const StatusLayout& layout);

/// Reads one experiment's status from the database (`file`: the experiment file, or null): its
/// trials, and for trials whose Slurm task is not collected yet, their task database, opened
/// read only. `merge`: what merge_tasks did just before (Slurm's states of the live tasks).
SweepStatus read_status(dps::Store& store, const dps::ExperimentRow& experiment,
                        const Experiment* file, const MergeSummary& merge);

/// What a merge did, in one line ("collected 1 task result; 2 task(s) still queued, ...").
std::string merge_line(const MergeSummary& m);

/// A Slurm task's trial as its own database holds it, read while the task may still write it.
struct TaskProgress {
  std::optional<dps::TrialState> state;
  std::string problem;  // why there is no state: "not created yet", "cannot be read now (...)"
};
/// Opens the task's database (its path relative to `main_db`'s folder) read only.
TaskProgress read_task_progress(const std::string& main_db, const dps::TaskRow& task);

/// `dprun status`, once or (--watch) every `interval` seconds until nothing is active or
/// SIGINT. `db`: the database; `file`: the experiment file or null.
int show_status(const std::string& db, const Experiment* file, std::optional<double> interval,
                bool all);

}  // namespace dprun::cli
