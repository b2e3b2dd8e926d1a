#pragma once
// Running one trial in this process: the child side of a sweep (`dprun __trial`) and the
// single-trial driver `dprun train`. Both go through run_trial(), which reports to a sink.
#include <string>
#include <vector>

#include "dp/trainer.hpp"
#include "process/trial_process.hpp"

namespace dprun {

/// Where run_trial reports. The child writes records; `dprun train` prints lines.
class TrialSink {
 public:
  virtual ~TrialSink() = default;
  /// rank_hosts: the host of each of the trial's processes, in rank order.
  virtual void start(const dps::TrialStart& start, const std::vector<std::string>& rank_hosts) = 0;
  /// Called after each finite epoch, before any DPRUN_FAULT action for that epoch.
  virtual void epoch(const dps::EpochRow& row, const dp::EpochReport& report) = 0;
  /// Called for each checkpoint file written after an epoch (process 0 only).
  virtual void checkpoint(const dps::CheckpointRow& row) = 0;
  /// Testing (DPRUN_FAULT=garble): reports the epoch as a line that is not a valid record.
  virtual void corrupt_epoch() {}
};

/// The child's sink: protocol records (on fd 3, or on a launched process 0's stdout).
class RecordSink : public TrialSink {
 public:
  explicit RecordSink(RecordWriter& w) : w_(w) {}
  void start(const dps::TrialStart& start, const std::vector<std::string>& rank_hosts) override;
  void epoch(const dps::EpochRow& row, const dp::EpochReport& report) override;
  void checkpoint(const dps::CheckpointRow& row) override;
  void corrupt_epoch() override;

 private:
  RecordWriter& w_;
};

/// `dprun train`'s sink: one line per epoch on stdout.
class PrintSink : public TrialSink {
 public:
  explicit PrintSink(const TrialRequest& r) : r_(r) {}
  void start(const dps::TrialStart& start, const std::vector<std::string>& rank_hosts) override;
  void epoch(const dps::EpochRow& row, const dp::EpochReport& report) override;
  void checkpoint(const dps::CheckpointRow& row) override;

 private:
  const TrialRequest& r_;
};

/// The sink of a trial's processes other than process 0: the trial reports once.
class SilentSink : public TrialSink {
 public:
  void start(const dps::TrialStart&, const std::vector<std::string>&) override {}
  void epoch(const dps::EpochRow&, const dp::EpochReport&) override {}
  void checkpoint(const dps::CheckpointRow&) override {}
};

/// How a trial ended (kind is done, diverged, skipped or error; message says why).
struct TrialResult {
  TrialRecord::Kind kind = TrialRecord::Kind::done;
  std::string message;
};

/// Loads the plugin, the dataset and the backend, trains, and reports to the sink. Never throws:
/// every failure becomes an error result. Honours DPRUN_FAULT (see fault_help()).
/// group: the trial's processes when it has processes > 1 (every process calls run_trial with
/// the same request; each reports to its own sink, and only process 0's should be heard).
TrialResult run_trial(const TrialRequest& request, TrialSink& sink,
                      dp::ProcessGroup* group = nullptr);

/// `dprun __trial --record-fd N`: reads the request (JSON) from stdin, runs it, writes records.
/// Exit status 0 when a final record other than error was written, else 1.
int trial_child_main(const std::vector<std::string>& args);

/// `dprun train`: runs the request in this process and prints one line per epoch to stdout.
/// Returns the exit status (0 done, 1 failed, diverged or skipped).
int run_train(const TrialRequest& request);

// The processes of one trial started by a launcher (trial_ranks.cpp).

/// `dprun __trial --records stdout` as one of `processes` processes started by mpirun or srun:
/// process 0 reads the request from stdin and passes it to the others, every process trains
/// its share, process 0 writes the records on its stdout (kRecordPrefix), and a process that
/// fails says so on stderr (launch.hpp's rank report) and ends the others (MPI_Abort).
int trial_process_of_many();

/// `dprun train` started by mpirun or srun with several processes: one trial of that many
/// processes (request.settings' processes is set to the count); process 0 prints.
int run_train_processes(TrialRequest request);

/// The DPRUN_FAULT documentation for --help.
const char* fault_help();

}  // namespace dprun
