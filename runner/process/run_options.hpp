#pragma once
// How trials run, whoever runs them: the options of `dprun run` and `dprun submit` that a Slurm
// task takes over from its submission (submission.json) and a trial process from its runner
// (the trial request). Declared once, here, with one codec: adding an option is one field and
// one row of kRunOptionFields (run_options.cpp), plus its use.
#include <string>
#include <utility>
#include <vector>

#include "base/json.hpp"
#include "experiment/launch_tables.hpp"
#include "settings/settings.hpp"

namespace dprun {

struct RunOptions {
  /// "": as each trial's backend setting says; else auto | cpu | cuda for every trial (--backend).
  /// In a trial request: the backend the trial uses (auto | cpu | cuda), already decided.
  std::string backend;
  std::vector<std::string> plugin_dirs;  // --plugins
  int threads = 0;                       // CPU threads per trial (0: all)
  bool oversubscribe = false;            // CUDA replicas may share GPUs
  bool rerun = false;                    // run trials that are already done again
  bool restart = false;      // failed and interrupted trials start at epoch 1, not at a checkpoint
  bool verbose = false;      // forward the trial processes' output to stderr
  double trial_timeout = 0;  // seconds; 0: none
  /// --launcher and --hostfile replace [launch]'s when not empty; --launch-arg adds to its args.
  LaunchConfig launch;
};

/// The backend a trial runs on: --backend when given, else its backend setting (auto | cpu |
/// cuda).
std::string backend_for(const RunOptions& options, const TrialSettings& settings);

/// Default options with this backend.
inline RunOptions with_backend(std::string backend) {
  RunOptions o;
  o.backend = std::move(backend);
  return o;
}

/// One member per option (launch's three fields as launcher, hostfile, launch_args), with the
/// names submission.json has always used.
Json run_options_to_json(const RunOptions& options);
/// Throws JsonError naming the member that is missing or of the wrong type.
RunOptions run_options_from_json(const Json& json);

}  // namespace dprun
