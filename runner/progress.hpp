#pragma once
// The progress display of a sweep, on stderr. On a terminal: one live line for the running
// trial (epoch i/N, last test accuracy, s/epoch, ETA of the sweep), replaced in place. Otherwise
// (logs, CI, tests): one plain line per event, e.g.
//   [2/4] lenet gpus=2 batch_size=512 lr=0.4 epoch 1/2 loss 0.912 train_acc 0.667 test_acc
//   0.781 9.8s
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "dpstore/store.hpp"

namespace dprun {

class Progress {
 public:
  /// `trials`: how many this run will train; `epochs`: their epochs in total (for the ETA).
  Progress(std::FILE* out, bool live, int trials, int64_t epochs);

  void trial_started(int index, const std::string& name, int64_t epochs);
  void epoch(const dps::EpochRow& row);
  void trial_finished(dps::TrialStatus status, const std::string& message);
  /// Any other message (a skip, a warning), printed on its own line.
  void note(const std::string& text);
  /// Refreshes the live line (elapsed time moves even when no epoch arrived).
  void tick();
  /// Removes the live line (before the summary is printed).
  void finish();

  /// "1h02m", "3m12s", "9.8s".
  static std::string duration(double seconds);

 private:
  using clock = std::chrono::steady_clock;
  void draw();
  void clear_line();
  std::string prefix() const;

  std::FILE* out_;
  bool live_;
  int trials_;
  int64_t epochs_total_;
  int64_t epochs_finished_ = 0;  // epochs completed in this run, all trials
  double seconds_finished_ = 0;  // their wall time (train + eval)
  int index_ = 0;
  std::string name_;
  int64_t trial_epochs_ = 0;
  int64_t epoch_ = 0;
  double last_test_acc_ = -1;
  double trial_seconds_ = 0;
  double first_epoch_seconds_ = 0;  // epoch 1 includes warm-up; see mean_epoch_seconds()
  /// Seconds per epoch as the database's trial_summary counts them: epoch 1 left out when
  /// there are more, so the live line, the trial's last line and the summary agree.
  double mean_epoch_seconds() const;
  clock::time_point epoch_started_;
  bool line_shown_ = false;
};

}  // namespace dprun
