// The run options' codec (see run_options.hpp): one row per option.
#include "process/run_options.hpp"

#include "base/json_fields.hpp"

namespace dprun {

namespace {

const JsonFields<RunOptions>& fields() {
  static const JsonFields<RunOptions> table = {
      field("backend", &RunOptions::backend),
      field("plugin_dirs", &RunOptions::plugin_dirs),
      field("threads", &RunOptions::threads),
      field("oversubscribe", &RunOptions::oversubscribe),
      field("rerun", &RunOptions::rerun),
      field("restart", &RunOptions::restart),
      field("verbose", &RunOptions::verbose),
      field("trial_timeout", &RunOptions::trial_timeout),
      field("launcher", &RunOptions::launch, &LaunchConfig::launcher),
      field("hostfile", &RunOptions::launch, &LaunchConfig::hostfile),
      field("launch_args", &RunOptions::launch, &LaunchConfig::args),
  };
  return table;
}

}  // namespace

std::string backend_for(const RunOptions& options, const TrialSettings& settings) {
  return options.backend.empty() ? settings[key::backend_request] : options.backend;
}

Json run_options_to_json(const RunOptions& options) { return fields().to_json(options); }

RunOptions run_options_from_json(const Json& json) {
  RunOptions options;
  fields().read(json, options, "run option");
  return options;
}

}  // namespace dprun
