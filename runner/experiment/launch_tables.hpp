#pragma once
// The [launch] and [launch.slurm] tables of an experiment file, as the input language has them:
// how a trial of several processes is started, and what `dprun submit` asks Slurm for. Plain
// values and the checks of what a user may write there; the code that acts on them lives with
// the launchers (process/launch.hpp) and Slurm (slurm/slurm.hpp). Neither table is part of any
// trial's identity: where a trial runs does not change what it computes.
#include <cstdint>
#include <string>
#include <vector>

namespace dprun {

/// [launch] of an experiment file, with the command line's overrides. Not part of any trial's
/// identity: where a trial runs does not change what it computes.
struct LaunchConfig {
  std::string launcher;           // "mpirun" | "srun" | "": see effective_launcher()
  std::string hostfile;           // mpirun --hostfile; "": the launcher's default hosts
  std::vector<std::string> args;  // more launcher arguments, before the program
};

/// The launchers dprun knows.
const std::vector<std::string>& known_launchers();

/// [launch.slurm] of an experiment file (or `[launch] slurm = {...}`): how `dprun submit` asks
/// for the tasks' resources. Not part of any trial's identity.
struct SlurmConfig {
  bool given = false;        // the table is in the file
  int64_t max_parallel = 0;  // tasks running at once (sbatch --array=...%P); 0: no cap
  std::string partition, time, account, qos, mem;  // sbatch's options of those names; "": none
  int64_t cpus_per_task = 0;  // per process; 0: one per replica on the CPU backend, else Slurm's
  std::vector<std::string> args;  // more sbatch arguments, before those of the command line
  /// How GPUs are asked for: false: --gpus-per-task=G (select/cons_tres); true: --gres=gpu:G,
  /// which counts per node, so a trial of P > 1 processes also asks for --nodes=P
  /// --ntasks-per-node=1 (clusters whose Slurm predates or does not use cons_tres).
  bool gres = false;
};

/// Why sbatch arguments from the user cannot be used, "" when they can: dprun sets --array,
/// --output, --ntasks and --parsable itself (its task databases and output files are named by
/// array index), and refuses --wrap, --clusters, --error and --chdir (short forms and long
/// abbreviations of 3 characters or more included). A bare word is accepted only as the value
/// of a short option before it ("-p debug"): else it would become sbatch's script, so a long
/// option's value is written --opt=value.
std::string sbatch_args_problem(const std::vector<std::string>& args);

}  // namespace dprun
