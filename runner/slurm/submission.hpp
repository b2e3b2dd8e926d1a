#pragma once
// A submission's folder: what `dprun submit` leaves for the tasks of one Slurm job array, and what
// each task (`dprun __slurm-task FOLDER`) reads. The tasks never open the experiment's database:
// it is SQLite, and SQLite must not be shared across hosts.
//
//   results/NAME.tasks/s0003/          one folder per submission (one job array)
//     submission.json                  the manifest below
//     experiment.toml                  the experiment file as it was submitted
//     job.sh                           the batch script: exec dprun __slurm-task FOLDER
//     t0000.db                         task 0's own database: its trial, seeded with what the
//                                      experiment's database held (epochs, checkpoints), then
//                                      written by the task alone
//     t0000.out                        task 0's output (sbatch --output)
//     t0000.checkpoints/trial-1/       the checkpoints task 0 writes
#include <cstdint>
#include <string>
#include <vector>

#include "process/run_options.hpp"

namespace dprun {

/// The version of submission.json this dprun writes and reads.
inline constexpr int kSubmissionFormatVersion = 1;

struct SubmittedTrial {
  int64_t index = 0;        // the array index
  std::string config_hash;  // which trial of the experiment file
  std::string database;     // the task's database, relative to the submission folder
  /// Under [search] scheduler = "asha": the rung the task runs its trial to, and that rung's
  /// epoch (the trial's epochs for the last). -1 / 0: no scheduler.
  int64_t rung = -1;
  int64_t stop_after = 0;
};

/// submission.json: what every task of the array needs besides its own database.
struct SubmissionManifest {
  std::string experiment;                // its name
  std::string file = "experiment.toml";  // relative to the submission folder
  RunOptions run;  // the options of `dprun submit` that decide how a trial runs (plugin folders
                   // absolute)
  /// The submission's --set overrides: the task applies them to the file as submit did, so it
  /// finds its trial among the same trials.
  std::vector<std::string> overrides;
  std::vector<SubmittedTrial> tasks;
};

/// Writes FOLDER/submission.json (atomically). Throws dp::Error naming the file.
void write_manifest(const std::string& folder, const SubmissionManifest& manifest);
/// Reads FOLDER/submission.json; throws dp::Error naming the file and what is wrong (a version
/// this dprun does not read included).
SubmissionManifest read_manifest(const std::string& folder);

/// FOLDER/job.sh: the batch script every task of the array runs. It only starts `dprun
/// __slurm-task FOLDER` (the array index comes from SLURM_ARRAY_TASK_ID): what a task runs is in
/// the manifest, so the script stays readable and holds no trial settings.
std::string job_script(const std::string& dprun_exe, const std::string& folder,
                       const std::string& experiment, size_t trials);

/// "t0007": the stem of task 7's files (t0007.db, t0007.out), as sbatch's --output=t%4a.out.
std::string task_stem(int64_t index);

}  // namespace dprun
