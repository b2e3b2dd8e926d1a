#pragma once
// The entry point of one task of a Slurm job array made by `dprun submit`.
#include <string>
#include <vector>

namespace dprun {

/// `dprun __slurm-task FOLDER [--index N]`: runs the trial of task N (default:
/// $SLURM_ARRAY_TASK_ID) of the submission in FOLDER into the task's own database, as `dprun run`
/// runs a trial. A trial stopped by Slurm is recorded interrupted with Slurm's reason (cancelled,
/// time limit, preemption). Returns the exit status of dprun run (0, 1, 143), 2 when the task
/// cannot start.
int slurm_task_main(const std::vector<std::string>& args);

}  // namespace dprun
