#pragma once
// Asynchronous successive halving ([search] scheduler = "asha"; Li et al., "A System for
// Massively Parallel Hyperparameter Tuning", 2018). Rungs at epochs r, r*eta, r*eta^2, ... below
// a trial's own epochs (r = min_epochs). Every trial first runs to the first rung and pauses
// there (status pruned, its checkpoint kept); whenever a device is free, the highest rung with a
// paused trial in the top 1/eta of the trials that reached that rung promotes it to the next rung
// (resumed from its checkpoint, so it computes the bits of a trial that ran straight through),
// else a trial not started yet starts. Each decision reads the database, so several runners on
// one database share the work; a promotion is claimed like a trial (pruned -> running), so it
// happens once.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dpstore/store.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

/// The rungs' epochs: min_epochs * eta^k for k = 0, 1, ... while below max_epochs.
std::vector<int64_t> rung_epochs(int64_t min_epochs, int64_t eta, int64_t max_epochs);

/// One trial as the scheduler sees it.
struct AshaTrial {
  int64_t epochs = 0;  // its own epochs: the last rung ends there
  dps::TrialStatus status = dps::TrialStatus::pending;
  int64_t rung = -1;  // the rung it may run to; -1: the scheduler has not started it
  std::map<int64_t, double> metric;  // the ranking metric by epoch (finite values only)
  bool busy = false;  // running here or in another runner, or waiting here to start
};

/// What to run next: trial `trial` (an index into the trials given) up to rung `rung`, which
/// ends at epoch `stop_after` (the trial's own epochs for the last rung).
struct AshaJob {
  size_t trial = 0;
  int64_t rung = 0;
  int64_t stop_after = 0;
  enum class Kind { resume, promotion, start } kind = Kind::start;
  /// The trial's status the decision was made on: the job claims the trial only if it still has
  /// it (another runner may have run or promoted it since).
  dps::TrialStatus expected = dps::TrialStatus::pending;
};

/// The next job, or none, in this order: a trial that was already sent to a rung and did not get
/// there (failed, interrupted) resumes towards it; then promotions, from the highest rung down:
/// at rung k the trials with a value at its epoch are ranked (best first, earlier trial on ties),
/// and a pruned trial at rung k among the first floor(n / eta) is promoted to k + 1; then the
/// first trial never started, or diverged or skipped before (from the start again, as a run
/// without a scheduler does), starts towards rung 0. Done and stopped trials are never run; the
/// values of every trial count in the rankings.
std::optional<AshaJob> next_asha_job(const std::vector<AshaTrial>& trials, int64_t min_epochs,
                                     int64_t eta, bool higher_is_better);

/// Whether a trial that ended in this run (status: how it ended; taken: another dprun claimed it
/// first, so it did not run here) stays out of this run's jobs from now on. A failed, diverged or
/// skipped trial is run once per run, as a run without a scheduler runs it. A taken one is not
/// given up: it runs in the other dprun, and when it pauses at a rung it is ranked and promoted
/// like any other, by whichever runner is still there to do it (a runner that gave it up was
/// found, once, to exit last with a top-third trial left unpromoted).
bool asha_gives_up(dps::TrialStatus status, bool taken);

/// The scheduler over the trials of one run: reads their state from the database.
class AshaDriver {
 public:
  /// plan: every trial of the experiment (all count in the rankings); work: those this run may
  /// start, in plan order (their indices are the runner's work indices).
  AshaDriver(dps::Store& store, const SearchConfig& config, const std::vector<PlannedTrial>& plan,
             const std::vector<const PlannedTrial*>& work);
  /// The next job, its trial given as a work index; busy: work indices this runner has started
  /// or queued and not yet seen end.
  std::optional<AshaJob> next(const std::set<int>& busy);

 private:
  dps::Store& store_;
  SearchConfig config_;
  const std::vector<PlannedTrial>& plan_;
  std::map<const PlannedTrial*, int> work_index_;
};

}  // namespace dprun
