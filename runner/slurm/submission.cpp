// A submission's manifest (see submission.hpp).
#include "slurm/submission.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/json.hpp"
#include "base/os.hpp"
#include "dp/error.hpp"
#include "dp/safetensors.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

namespace {

std::string manifest_path(const std::string& folder) {
  return (std::filesystem::path(folder) / "submission.json").string();
}

}  // namespace

std::string job_script(const std::string& dprun_exe, const std::string& folder,
                       const std::string& experiment, size_t trials) {
  // exec: Slurm's signals (SIGTERM at scancel, time limit, preemption) reach dprun itself, which
  // records why its trial stopped.
  return "#!/bin/sh\n"
         "# dprun: experiment " +
         experiment + ", " + std::to_string(trials) + " trial" + (trials == 1 ? "" : "s") +
         ". Each task of the Slurm job array runs one trial\n"
         "# (SLURM_ARRAY_TASK_ID picks it from submission.json) into its own database in this\n"
         "# folder; dprun merge (or status, report) collects them into the experiment's database.\n"
         "exec " +
         shell_quote(dprun_exe) + " __slurm-task " + shell_quote(folder) + "\n";
}

std::string task_stem(int64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "t%04lld", static_cast<long long>(index));
  return buf;
}

void write_manifest(const std::string& folder, const SubmissionManifest& m) {
  Json j = Json::object();
  j.set("format", Json::string("dprun submission"));
  j.set("version", Json::integer(kSubmissionFormatVersion));
  j.set("experiment", Json::string(m.experiment));
  j.set("file", Json::string(m.file));
  Json overrides = Json::array();
  for (const auto& o : m.overrides) overrides.push(Json::string(o));
  j.set("overrides", std::move(overrides));
  // The run options as members of the manifest itself (their names since format version 1).
  const Json run = run_options_to_json(m.run);
  for (const auto& [name, value] : run.members()) j.set(name, value);
  Json tasks = Json::array();
  for (const auto& t : m.tasks) {
    Json task = Json::object();
    task.set("index", Json::integer(t.index));
    task.set("config_hash", Json::string(t.config_hash));
    task.set("database", Json::string(t.database));
    if (t.rung >= 0) {
      task.set("rung", Json::integer(t.rung));
      task.set("stop_after", Json::integer(t.stop_after));
    }
    tasks.push(std::move(task));
  }
  j.set("tasks", std::move(tasks));
  dp::write_bytes_atomically(manifest_path(folder), j.dump() + "\n");
}

SubmissionManifest read_manifest(const std::string& folder) {
  const std::string path = manifest_path(folder);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw dp::Error(path + ": cannot read the submission's manifest (is " + folder +
                    " a folder that dprun submit made?)");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    const Json j = Json::parse(text.str());
    if (j.get("format").is_null() || j.at("format").as_string() != "dprun submission")
      throw dp::Error("not a dprun submission manifest");
    const int64_t version = j.at("version").as_int();
    if (version != kSubmissionFormatVersion)
      throw dp::Error("format version " + std::to_string(version) + ", this dprun reads version " +
                      std::to_string(kSubmissionFormatVersion) +
                      " (submit again with this dprun, or run the dprun that submitted it)");
    SubmissionManifest m;
    m.experiment = j.at("experiment").as_string();
    m.file = j.at("file").as_string();
    m.run = run_options_from_json(j);
    // Manifests written before --set existed have no overrides.
    if (!j.get("overrides").is_null())
      for (const auto& o : j.at("overrides").items()) m.overrides.push_back(o.as_string());
    for (const auto& t : j.at("tasks").items()) {
      SubmittedTrial task;
      task.index = t.at("index").as_int();
      task.config_hash = t.at("config_hash").as_string();
      task.database = t.at("database").as_string();
      // Tasks of a submission without a [search] scheduler (and of older dprun) have neither.
      if (!t.get("rung").is_null()) {
        task.rung = t.at("rung").as_int();
        task.stop_after = t.at("stop_after").as_int();
      }
      m.tasks.push_back(std::move(task));
    }
    return m;
  } catch (const std::exception& e) {
    throw dp::Error(path + ": " + e.what());
  }
}

}  // namespace dprun
