#pragma once
// The progress display of a sweep, on stderr. On a terminal: one live line for the running
// trials (epoch i/N, last test accuracy, s/epoch of each; ETA of the sweep), replaced in place.
// Otherwise (logs, CI, tests): one plain line per event, each naming its trial, so the lines of
// trials that run at once (--jobs) stay readable, e.g.
//   [2/4] lenet gpus=2 batch_size=512 lr=0.4 epoch 1/2 loss 0.912 train_acc 0.667 test_acc
//   0.781 9.8s
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "dpstore/store.hpp"

namespace dprun {

class Progress {
 public:
  /// `trials`: how many this run will train; `epochs`: their epochs in total (for the ETA).
  Progress(std::FILE* out, bool live, int trials, int64_t epochs);

  /// `index` (1-based position among the trials of this run) names the trial in what follows;
  /// `where`: the devices it was given ("" when it has the machine).
  void trial_started(int index, const std::string& name, int64_t epochs,
                     const std::string& where = "");
  /// The trial's process says where it runs (its start record): one line naming the backend
  /// and devices, so a `gpus=2` trial on the CPU backend is seen to be two CPU replicas; on
  /// CUDA also the layout and whether steps are captured, which "auto" settings resolve there.
  void trial_running(int index, const dps::TrialStart& start);
  void epoch(int index, const dps::EpochRow& row);
  void trial_finished(int index, dps::TrialStatus status, const std::string& message);
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
  struct Trial {
    std::string name;
    int64_t epochs = 0;
    int64_t epoch = 0;
    int64_t epochs_seen = 0;  // in this run (a resumed trial starts after its checkpoint)
    double last_test_acc = -1;
    double seconds = 0;              // the epochs' own seconds, summed
    double first_epoch_seconds = 0;  // the first includes warm-up; see mean_epoch_seconds()
    clock::time_point epoch_started;
    /// Seconds per epoch as the database's trial_summary counts them: the first epoch (of this
    /// run) left out when there are more, so the live line, the trial's last line and the
    /// summary agree.
    double mean_epoch_seconds() const;
  };
  void draw();
  void clear_line();
  std::string prefix(int index) const;

  std::FILE* out_;
  bool live_;
  int trials_;
  int64_t epochs_total_;
  int64_t epochs_finished_ = 0;   // epochs completed in this run, all trials
  double seconds_finished_ = 0;   // their wall time (train + eval), per trial
  std::map<int, Trial> running_;  // by index
  bool line_shown_ = false;
};

}  // namespace dprun
