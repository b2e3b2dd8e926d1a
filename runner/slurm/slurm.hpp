#pragma once
// Talking to Slurm: the sbatch command of a job array whose tasks each run one trial, and what
// squeue, scontrol and slurmstepd say about its tasks (alive, or how they ended and why).
// Accounting (sacct) is not assumed: a cluster without slurmdbd answers none of its questions.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "experiment/launch_tables.hpp"

namespace dprun {

/// What every task of one array asks for: one job array per distinct shape.
struct TaskShape {
  int processes = 1;         // sbatch --ntasks (srun starts them inside the allocation)
  int gpus_per_process = 0;  // sbatch --gpus-per-task; 0 on the CPU backend
  int cpus_per_process = 0;  // sbatch --cpus-per-task; 0: Slurm's default
  bool operator<(const TaskShape& o) const {
    return std::tie(processes, gpus_per_process, cpus_per_process) <
           std::tie(o.processes, o.gpus_per_process, o.cpus_per_process);
  }
  /// "1 process, 2 CPUs" / "2 processes x 8 GPUs", for messages.
  std::string text() const;
};

/// The shape of a trial of `gpus` replicas in `processes` processes: GPUs per process unless it
/// runs on the CPU backend (`cpu`), where each replica is a thread and gets a core.
TaskShape task_shape(const SlurmConfig& config, int64_t gpus, int64_t processes, bool cpu);

/// sbatch --parsable --job-name=NAME --array=0-(count-1)[%P] --output=FOLDER/t%4a.out
///   --ntasks=P [--gpus-per-task=G | --gres=gpu:G [--nodes=P --ntasks-per-node=1]]
///   [--cpus-per-task=C] [the config's options and args]
///   [extra: the command line's sbatch arguments] SCRIPT
/// A % in FOLDER is written %%; a backslash in it is refused (dp::Error): it would turn off
/// sbatch's expansion of %a.
std::vector<std::string> sbatch_command(const SlurmConfig& config, const TaskShape& shape,
                                        int64_t count, const std::string& job_name,
                                        const std::string& folder,
                                        const std::vector<std::string>& extra,
                                        const std::string& script);

/// The job id in sbatch --parsable's answer ("12" or "12;cluster"); "" when there is none.
std::string parse_sbatch_job_id(const std::string& out);

/// The array tasks Slurm still holds as live, by job id then index, with their state (PENDING,
/// RUNNING, COMPLETING, ...), from `squeue -h -r -j IDS -o %F|%K|%T`. nullopt when Slurm cannot
/// be asked; `problem` says why, and `absent` is true when that is because there is no squeue at
/// all (not on PATH), false when squeue ran and failed (an exit status other than 0, no answer
/// in time, a line it printed that is not a task).
std::optional<std::map<std::string, std::map<int64_t, std::string>>> live_array_tasks(
    const std::vector<std::string>& job_ids, std::string& problem, bool& absent);
/// The parsing half of live_array_tasks: nullopt when a non-empty line is not `JOB|INDEX|STATE`
/// (`problem` quotes it).
std::optional<std::map<std::string, std::map<int64_t, std::string>>> parse_squeue(
    const std::string& out, std::string& problem);

/// How an ended array task finished, as scontrol remembers it (for MinJobAge after its end).
struct EndedTask {
  std::string state;      // COMPLETED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, ...
  std::string reason;     // Slurm's Reason field
  std::string exit_code;  // "0:0", "143:0", ...
  std::string node;       // BatchHost
};
/// `scontrol show job -o JOB_ID`: every task of the array that Slurm still remembers, by index.
/// Empty when it remembers none (or cannot be asked).
std::map<int64_t, EndedTask> ended_array_tasks(const std::string& job_id);
/// The parsing half of ended_array_tasks.
std::map<int64_t, EndedTask> parse_scontrol_jobs(const std::string& out);

/// What slurmstepd wrote in a task's output when Slurm ended it ("*** JOB 13 ON node1 CANCELLED
/// AT 2026-01-01T10:00:00 DUE TO TIME LIMIT ***"), as a cause for the trial's error: "cancelled by
/// Slurm (scancel)", "Slurm time limit reached", "preempted by Slurm", "node failure (Slurm)",
/// "requeued by Slurm", each followed by " (job 13 on node1)"; "" when `text` has no such line.
std::string cause_from_output(const std::string& text);
/// The cause an ended task's state gives, in the same words; "" for states that say nothing of
/// an outside cause (COMPLETED, FAILED, ...).
std::string cause_from_state(const EndedTask& task);

/// What an ended task's state says when cause_from_state has no outside cause: the signal that
/// killed the job script ("the task was killed by SIGKILL (Slurm state FAILED, exit code 0:9)"),
/// else Slurm's state and exit code.
std::string ended_task_text(const EndedTask& task);

}  // namespace dprun
