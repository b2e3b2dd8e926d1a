#pragma once
// A trial's checkpoints (the `checkpoint` setting): where they live, what process 0 of a trial
// writes after each epoch, and the state a failed or interrupted trial resumes from.
//
// Files, in the trial's folder <database folder>/<database name>.checkpoints/trial-<id>/:
//   last.safetensors            the model after the last completed epoch (none: not written)
//   last.optimizer.safetensors  the optimizer's state beside it (momentum, steps): resuming
//                               reads both
//   best.safetensors            checkpoint = "best": the model of the epoch with the highest
//                               test accuracy so far
//   epoch-0003.safetensors      checkpoint = "every": the model after each epoch
// A model file is PyTorch's state_dict of the model as safetensors (dp::Trainer::model_state):
// names, shapes and NCHW element order as torch.nn modules have them, whatever the layout the
// trial ran in. The database records each file (checkpoints table) with its sha256.
#include <cstdint>
#include <string>
#include <vector>

#include "dp/process_group.hpp"
#include "dp/trainer.hpp"
#include "dpstore/store.hpp"
#include "process/trial_process.hpp"

namespace dprun {

enum class CheckpointMode { none, last, best, every };
/// "none" | "last" | "best" | "every"; throws dp::Error naming the value otherwise.
CheckpointMode parse_checkpoint_mode(const std::string& text);

/// The folder of a trial's checkpoint files (absolute), from the database's path.
std::string trial_checkpoint_dir(const std::string& db_path, int64_t trial_id);
/// How the database records a file: relative to the database's folder when it is inside it
/// (the results folder can move), else absolute.
std::string stored_checkpoint_path(const std::string& db_path, const std::string& absolute);
/// The file a recorded path names (absolute).
std::string resolve_checkpoint_path(const std::string& db_path, const std::string& stored);
/// A path recorded in database `from_db`, as database `to_db` records the same file: relative
/// to its folder when the file is at most two folders above it (a Slurm task's database, in
/// results/NAME.tasks/s0001/, names the experiment's checkpoints as ../../NAME.checkpoints/...,
/// which holds wherever the shared file system is mounted), else absolute.
std::string rebase_checkpoint_path(const std::string& from_db, const std::string& stored,
                                   const std::string& to_db);

/// Hex sha256 of a file's bytes; throws dp::Error naming the file when it cannot be read.
std::string checkpoint_file_sha256(const std::string& path);

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
