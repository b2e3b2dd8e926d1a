#pragma once
// Running one trial in this process: the child side of a sweep (`dprun __trial`) and the
// single-trial driver `dprun train`. Both go through run_trial(), which reports to a sink.
#include <string>
#include <vector>

#include "dp/trainer.hpp"
#include "trial_process.hpp"

namespace dprun {

/// Where run_trial reports. The child writes records; `dprun train` prints lines.
class TrialSink {
 public:
  virtual ~TrialSink() = default;
  virtual void start(const dps::TrialStart& start) = 0;
  /// Called after each finite epoch, before any DPRUN_FAULT action for that epoch.
  virtual void epoch(const dps::EpochRow& row, const dp::EpochReport& report) = 0;
  /// Testing (DPRUN_FAULT=garble): reports the epoch as a line that is not a valid record.
  virtual void corrupt_epoch() {}
};

/// How a trial ended (kind is done, diverged, skipped or error; message says why).
struct TrialResult {
  TrialRecord::Kind kind = TrialRecord::Kind::done;
  std::string message;
};

/// Loads the plugin, the dataset and the backend, trains, and reports to the sink. Never throws:
/// every failure becomes an error result. Honours DPRUN_FAULT (see fault_help()).
TrialResult run_trial(const TrialRequest& request, TrialSink& sink);

/// `dprun __trial --record-fd N`: reads the request (JSON) from stdin, runs it, writes records.
/// Exit status 0 when a final record other than error was written, else 1.
int trial_child_main(const std::vector<std::string>& args);

/// `dprun train`: runs the request in this process and prints one line per epoch to stdout.
/// Returns the exit status (0 done, 1 failed, diverged or skipped).
int run_train(const TrialRequest& request);

/// The DPRUN_FAULT documentation for --help.
const char* fault_help();

}  // namespace dprun
