#pragma once
// Collecting the results of Slurm tasks: each task wrote its own database (one trial, one
// attempt); a merge folds those of tasks that have ended into the experiment's database.
//
// A task's database is opened only once Slurm no longer lists the task (no reading of a file
// another host is writing), except where there is no squeue: then a database whose trial
// reached a final status is merged, since that status is the task's last write. Where squeue
// fails, no task database is opened: every task is left for later. A database that
// cannot be opened, or whose trial is still `running` while its task lives, is left for later.
// A task that ended without its trial's end (killed hard: SIGKILL, node failure) is recorded
// interrupted with the cause Slurm gives; one that ended before its trial started is closed as
// lost, with that cause, and its trial keeps what it had. Merging is idempotent: a task is
// collected once (see dps::Store::merge_task).
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dpstore/store.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

struct MergeSummary {
  int merged = 0;             // results folded in
  int superseded = 0;         // results of attempts older than one already merged: recorded only
  int lost = 0;               // tasks closed without a result
  int waiting = 0;            // tasks left for later
  bool slurm_known = true;    // squeue answered
  std::string slurm_problem;  // why it did not
  /// Slurm's state of each task still live, by (submission id, array index): PENDING, RUNNING...
  std::map<std::pair<int64_t, int64_t>, std::string> live;
  /// One line per task left for later for a reason to fix, or closed as lost.
  std::vector<std::string> notes;
};

/// Merges the results of the experiment's tasks that have ended into `store` (read-write).
MergeSummary merge_tasks(dps::Store& store, int64_t experiment_id);

/// Before a local run or a submission: merges what ended (notes on stderr) and returns the trials
/// whose task is still queued or running, by config hash ("Slurm job 12_3 (RUNNING)"): they must
/// not run a second time elsewhere. Nothing is asked of Slurm when no task is open.
std::map<std::string, std::string> merge_before_running(dps::Store& store, int64_t experiment_id);

/// Before `dprun run` starts its sweep: opens the experiment's database (creating it, and the
/// experiment in it, when new), merges what its Slurm tasks finished and returns the trials
/// whose task is still queued or running (merge_before_running), which the sweep then skips.
std::map<std::string, std::string> collect_before_run(const Experiment& experiment,
                                                      const SweepOptions& options);

/// Before reading a database (dprun report): when one of its experiments has tasks not collected
/// yet, merges them (notes on stderr). A database without any is only read, never changed.
void merge_if_needed(const std::string& db);

/// "Slurm job 12_3", or "task 3 of submission 2" before Slurm gave the job an id.
std::string task_name(const dps::TaskRow& task);

}  // namespace dprun
