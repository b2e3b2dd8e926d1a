#pragma once
// Process 0's side of a trial's checkpoints: the files it writes after each epoch, and the state
// a failed or interrupted trial resumes from. Where they live: process/checkpoint_files.hpp.
#include <string>
#include <vector>

#include "dp/process_group.hpp"
#include "dp/trainer.hpp"
#include "dpstore/store.hpp"
#include "process/checkpoint_files.hpp"
#include "process/trial_process.hpp"

namespace dprun {

/// Process 0's side: after each epoch, writes the files its mode keeps and says what it wrote.
class CheckpointWriter {
 public:
  /// dir "" or mode none: writes nothing. resume: the best epoch so far when continuing.
  CheckpointWriter(CheckpointMode mode, std::string dir, const ResumePoint& resume);
  bool enabled() const { return mode_ != CheckpointMode::none && !dir_.empty(); }
  /// Writes this epoch's files (each atomically) in the order every, last, best, so a crash
  /// in between never leaves a recorded best or epoch file later than the last one. Returns
  /// one row per file written (paths absolute, trial_id 0), in that order.
  std::vector<dps::CheckpointRow> after_epoch(const dp::Trainer& trainer,
                                              const dp::EpochReport& report);

 private:
  CheckpointMode mode_;
  std::string dir_;
  int64_t best_epoch_ = 0;
  double best_test_acc_ = 0;
};

/// Restores the trainer to the resume point: process 0 reads both files and checks their
/// sha256 against the recorded ones, then passes the bytes to the other processes (which need
/// not see the folder). Throws dp::Error naming the file, what is wrong and what to do.
void load_resume_point(dp::Trainer& trainer, const ResumePoint& resume, dp::ProcessGroup* group);

}  // namespace dprun
