#pragma once
// One trial of a sweep being run by the runner: claimed in the store, its process (or its
// launcher) started on the devices the scheduler gave it, its records written as they arrive,
// its heartbeat and timeout kept, and its end decided and recorded. Several can be under way at
// once (--jobs); the runner's loop (sweep_runner.cpp) polls their descriptors and pumps them.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dpstore/store.hpp"
#include "experiment/experiment.hpp"
#include "process/trial_process.hpp"
#include "sweep/progress.hpp"
#include "sweep/scheduler.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

struct TrialOutcome {
  dps::TrialStatus status = dps::TrialStatus::failed;
  std::string message;
  int interrupted_by = 0;  // SIGINT / SIGTERM received by the runner
  bool taken = false;      // another dprun claimed or finished it since the plan: not run here
};

/// What every trial of one run shares: the database, the experiment and the options, the
/// progress display, and the runner's signal pipe.
struct SweepContext {
  dps::Store& store;
  const Experiment& experiment;
  const SweepOptions& options;
  Progress& progress;
  SignalPipe& signals;
};

class TrialRun {
 public:
  /// devices: what the scheduler gave the trial (exclusive: the whole machine, nothing set).
  /// stop_after: the epoch a [search] scheduler lets it run to (0: its epochs); the trial then
  /// ends pruned, to be promoted or not.
  TrialRun(const SweepContext& sweep, const TrialSpec& spec, const dps::TrialRow& row, int index,
           DeviceSet devices, int64_t stop_after = 0);
  ~TrialRun();
  TrialRun(const TrialRun&) = delete;
  TrialRun& operator=(const TrialRun&) = delete;

  /// Claims the trial in the store. False when another dprun has claimed or finished it since
  /// the plan (noted on the progress display; outcome() says taken).
  bool claim();
  /// Starts its process. A trial that cannot start here (no MPI, no launcher) is recorded failed
  /// at once, and done() is then true.
  void start();
  /// The descriptors to poll, and how long the runner may wait before calling pump() again.
  std::vector<int> poll_fds() const;
  double seconds_to_next_duty() const;
  /// Reads what arrived (records become epochs in the store), keeps the heartbeat and the
  /// timeout; once the process has ended, decides and records how the trial ended.
  void pump();
  bool done() const { return outcome_.has_value(); }
  const TrialOutcome& outcome() const { return *outcome_; }
  /// Stops the process (the runner got `sig`) and records the trial interrupted.
  void interrupt(int sig);

 private:
  using clock = std::chrono::steady_clock;
  TrialRequest request() const;
  /// Where its checkpoints go, and whether it resumes from one (see checkpoint.hpp).
  void prepare_checkpoints();
  std::optional<ResumePoint> find_resume_point(std::string& problem);
  void record_start(const TrialRecord* from_child);
  void handle(const TrialRecord& r);
  void decide(bool timed_out, TrialOutcome& out);
  /// The error of a trial stopped because the runner got `sig` (SweepOptions::interruption_cause).
  std::string interruption_message(int sig) const;
  void finish(TrialOutcome out);

  dps::Store& store_;
  const Experiment& experiment_;
  const SweepOptions& options_;
  Progress& progress_;
  SignalPipe& signals_;  // the parts of the SweepContext
  const TrialSpec& spec_;
  dps::TrialRow row_;
  int index_;
  DeviceSet devices_;
  int64_t stop_after_ = 0;
  std::string launch_text_;     // the command that started the trial process
  std::string checkpoint_dir_;  // "": none kept
  ResumePoint resume_;          // epoch 0: from scratch
  std::unique_ptr<TrialProcess> child_;
  clock::time_point started_at_, last_beat_;
  bool started_ = false;
  int64_t last_epoch_ = 0;
  std::vector<std::string> rank_hosts_;
  std::optional<TrialRecord> final_;
  std::string protocol_error_;
  std::optional<TrialOutcome> outcome_;
};

}  // namespace dprun
