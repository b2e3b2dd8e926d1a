// Whether a sweep is still going (liveness.hpp).
#include "cli/liveness.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <set>

#include "base/os.hpp"

namespace dprun::cli {

bool dprun_alive(int64_t pid) {
  if (pid <= 0 || pid == getpid()) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/cmdline").c_str(), "r");
  if (!f) return false;
  char buf[4096] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  // The name of argv[0] (an exited process, a zombie, has none).
  const std::string program(buf, std::min(n, std::char_traits<char>::length(buf)));
  return std::filesystem::path(program).filename().string().find("dprun") != std::string::npos;
}

std::string sweep_activity(dps::Store& store, int64_t experiment_id, double stale_seconds) {
  const std::string here = host_name();
  std::set<int64_t> runners;
  for (const auto& t : store.trials(experiment_id))
    if (t.host == here && t.runner_pid > 0) runners.insert(t.runner_pid);
  for (int64_t pid : runners)
    if (dprun_alive(pid)) return "dprun pid " + std::to_string(pid) + " on this host";
  const std::string id = std::to_string(experiment_id);
  std::string quoted_here;  // as an SQL string
  for (char c : here) quoted_here += c == '\'' ? std::string("''") : std::string(1, c);
  const auto beating = store.query(
      "SELECT id, host, CAST((julianday('now') - julianday(heartbeat_at)) * 86400 AS INTEGER) "
      "FROM trials WHERE experiment_id = " + id + " AND status = 'running' AND host IS NOT '" +
      quoted_here + "' AND heartbeat_at IS NOT NULL ORDER BY id");
  for (const auto& row : beating.rows) {
    const double age = row[2] ? std::stod(*row[2]) : 1e300;
    if (age <= stale_seconds)
      return "trial " + row[0].value_or("?") + " on " + row[1].value_or("?") + " (heartbeat " +
             row[2].value_or("?") + " s ago)";
  }
  for (const auto& task : store.tasks(experiment_id, true))
    return "Slurm task " + (task.job_id.empty() ? std::string("?") : task.job_id) + "_" +
           std::to_string(task.index) + " not collected yet";
  return "";
}

}  // namespace dprun::cli
