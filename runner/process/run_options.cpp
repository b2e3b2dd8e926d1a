// The run options' codec (see run_options.hpp): one row per option.
#include "process/run_options.hpp"

#include <functional>

namespace dprun {

namespace {

Json encode(const std::string& v) { return Json::string(v); }
Json encode(bool v) { return Json::boolean(v); }
Json encode(int v) { return Json::integer(v); }
Json encode(double v) { return Json::number(v); }
Json encode(const std::vector<std::string>& v) {
  Json a = Json::array();
  for (const auto& s : v) a.push(Json::string(s));
  return a;
}

void decode(const Json& j, std::string& v) { v = j.as_string(); }
void decode(const Json& j, bool& v) { v = j.as_bool(); }
void decode(const Json& j, int& v) { v = static_cast<int>(j.as_int()); }
void decode(const Json& j, double& v) { v = j.as_double(); }
void decode(const Json& j, std::vector<std::string>& v) {
  v.clear();
  for (const auto& s : j.items()) v.push_back(s.as_string());
}

struct Field {
  const char* name;
  std::function<Json(const RunOptions&)> get;
  std::function<void(const Json&, RunOptions&)> set;
};

/// A row for member `m` of RunOptions (or of its LaunchConfig, through `launch`).
template <class T>
Field row(const char* name, T RunOptions::*m) {
  return {name, [m](const RunOptions& o) { return encode(o.*m); },
          [m](const Json& j, RunOptions& o) { decode(j, o.*m); }};
}
template <class T>
Field launch_row(const char* name, T LaunchConfig::*m) {
  return {name, [m](const RunOptions& o) { return encode(o.launch.*m); },
          [m](const Json& j, RunOptions& o) { decode(j, o.launch.*m); }};
}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      row("backend", &RunOptions::backend),
      row("plugin_dirs", &RunOptions::plugin_dirs),
      row("threads", &RunOptions::threads),
      row("oversubscribe", &RunOptions::oversubscribe),
      row("rerun", &RunOptions::rerun),
      row("restart", &RunOptions::restart),
      row("verbose", &RunOptions::verbose),
      row("trial_timeout", &RunOptions::trial_timeout),
      launch_row("launcher", &LaunchConfig::launcher),
      launch_row("hostfile", &LaunchConfig::hostfile),
      launch_row("launch_args", &LaunchConfig::args),
  };
  return table;
}

}  // namespace

std::string backend_for(const RunOptions& options, const TrialSettings& settings) {
  return options.backend.empty() ? settings[key::backend_request] : options.backend;
}

Json run_options_to_json(const RunOptions& options) {
  Json j = Json::object();
  for (const Field& f : fields()) j.set(f.name, f.get(options));
  return j;
}

RunOptions run_options_from_json(const Json& json) {
  RunOptions options;
  for (const Field& f : fields()) {
    try {
      f.set(json.at(f.name), options);
    } catch (const JsonError& e) {
      throw JsonError(std::string("run option \"") + f.name + "\": " + e.what());
    }
  }
  return options;
}

}  // namespace dprun
