#pragma once
// How a trial of several processes is started and how its failures are read. The runner starts
// such a trial with a launcher, Open MPI's mpirun or Slurm's srun, whose command line follows
// from the experiment's [launch] table and the command line; every process of the trial then
// reports its own failure on stderr in one fixed form, and the runner reads those reports and
// the launcher's own messages to say which process failed, where, and why.
#include <optional>
#include <string>
#include <vector>

#include "experiment/launch_tables.hpp"

namespace dprun {

/// The launcher a trial uses: the configured one; else mpirun when a hostfile is given; else
/// srun inside a Slurm allocation (slurm_job: SLURM_JOB_ID is set), where it uses the
/// allocation's nodes; else mpirun (the local host, or the hosts of an allocation Open MPI
/// detects itself).
std::string effective_launcher(const LaunchConfig& config, bool slurm_job);

/// The command that starts `processes` processes of `program` (dprun __trial ...):
///   mpirun -np N --bind-to none [--hostfile F] [-x NAME]... ARGS... PROGRAM...
///   srun --ntasks=N --kill-on-bad-exit=1 --input=0 ARGS... PROGRAM...
/// --bind-to none: Open MPI binds each process to one core by default, which would confine the
/// replica threads of a process to it. -x passes the named variables of the runner's
/// environment on to processes on other hosts (srun passes the whole environment).
/// --input=0: srun gives stdin (the trial request) to process 0 only, as mpirun does.
std::vector<std::string> launch_command(const LaunchConfig& config, const std::string& launcher,
                                        int processes, const std::vector<std::string>& program,
                                        const std::vector<std::string>& exported);

/// The names of the variables of this environment that processes on other hosts need
/// (DPRUN_COMM_TIMEOUT_S, DPRUN_DATA, DPRUN_FAULT, DPRUN_PLUGIN_PATH when set).
std::vector<std::string> exported_variables();

/// Why a trial of `processes` processes cannot be launched here, "" when it can (a failed trial
/// records this reason): a dprun built without MPI, a launcher that is not installed.
std::string launch_problem(int processes, bool mpi_compiled, const std::string& launcher,
                           const std::string& launcher_path);

/// Hosts of the processes in rank order, grouped: "nodeA x2, nodeB x2"; one process: "nodeA".
std::string group_hosts(const std::vector<std::string>& rank_hosts);

/// How every process of a trial reports its failure on stderr, the form of
/// dp::ProcessGroup::abort(): "dprun: process R of N on HOST: MESSAGE".
struct RankReport {
  int rank = 0, size = 0;
  std::string host, message;
};
std::string rank_report_line(const RankReport& report);
std::optional<RankReport> parse_rank_report(const std::string& line);

/// True for a line of a launcher's output that says a process failed: a rank report, or
/// mpirun's "noticed that process rank R ..." or srun's "error: NODE: task R: ..." line.
bool is_failure_line(const std::string& line);

/// What the failure lines of a trial's output say, in one sentence, or "" when they say nothing:
/// the process that was noticed dying (mpirun, srun), with `when` ("after epoch 3") after it,
/// else the first process that reported an error of its own, as it said it.
std::string launcher_failure(const std::vector<std::string>& failure_lines,
                             const std::string& when);

/// An error of process `reporter` that says it waited for the others past the communicator
/// timeout gets the processes that did not report the same (they hang or died), with their
/// hosts, in front: "process 1 on nodeB (of 2) stopped responding (hangs or died): ...". Other
/// messages come back unchanged.
std::string explain_timeout(const std::string& message, int processes,
                            const std::vector<std::string>& failure_lines,
                            const std::vector<std::string>& rank_hosts, int reporter = 0);

}  // namespace dprun
