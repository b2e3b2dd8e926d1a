#pragma once
// `dprun submit`: a sweep as Slurm job arrays. The trials a local run would run (new, failed,
// interrupted, ... as `dprun plan` says) become the tasks of one array per resource shape; each
// task gets its own database seeded with its trial's record (so a failed trial resumes from its
// checkpoint), and everything is recorded in the experiment's database before sbatch is asked.
// The command line is cli's (cli/cluster_commands.cpp).
#include <string>
#include <vector>

#include "experiment/experiment.hpp"
#include "slurm/slurm.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

/// `dprun submit --dry-run`: the plan, the sbatch command of each array and the job script;
/// nothing is submitted or written.
void print_submission_plan(const Experiment& e, const SweepOptions& o, const SlurmConfig& config,
                           const std::vector<std::string>& sbatch_args);

/// Submits the trials a run would run, one job array per resource shape. Returns the exit
/// status: 0 when every array was submitted (or nothing needed to be), 2 when sbatch refused
/// the first one (nothing submitted), 1 when some were submitted and a later one was refused.
int submit_sweep(const Experiment& e, const SweepOptions& o, const SlurmConfig& config,
                 const std::vector<std::string>& sbatch_args);

}  // namespace dprun
