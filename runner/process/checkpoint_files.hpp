#pragma once
// A trial's checkpoint files as both sides of the process boundary name them (the `checkpoint`
// setting): the runner finds them (resume, merge, export, submit), the trial process writes
// them (trial/checkpoint_writer.hpp).
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
// trial ran in. The database records each file (checkpoints table) with its sha256, and records
// paths relative to its own folder where it can, so a results folder can move.
#include <cstdint>
#include <string>

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

/// A file's bytes; throws dp::Error naming the file when it cannot be read.
std::string read_checkpoint_file(const std::string& path);
/// Hex sha256 of a file's bytes; throws dp::Error naming the file when it cannot be read.
std::string checkpoint_file_sha256(const std::string& path);

}  // namespace dprun
