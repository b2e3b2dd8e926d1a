#pragma once
// Running a short external command and reading what it says: sbatch, squeue, scontrol.
#include <string>
#include <vector>

namespace dprun {

struct CommandOutput {
  bool started = false;    // false: the program could not be started (see error)
  bool not_found = false;  // it could not be started because it is not on PATH
  bool timed_out = false;
  int exit_code = -1;  // when it exited normally
  int term_signal = 0;
  std::string out, err;
  std::string error;  // why it could not be started

  bool ok() const { return started && !timed_out && exit_code == 0; }
  /// "exit status 1: <the first line of stderr>", "killed after 30 s", ... for messages.
  std::string failure() const;
};

/// Runs argv (argv[0] a path or a name on PATH) with stdin from /dev/null, collecting stdout and
/// stderr, for at most timeout_seconds (then SIGKILL), in this process's environment less the
/// variables named in `unset_env`. Never throws for the command's failures.
CommandOutput run_captured(const std::vector<std::string>& argv, double timeout_seconds,
                           const std::vector<std::string>& unset_env = {});

}  // namespace dprun
