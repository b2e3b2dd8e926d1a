// Launching a trial of several processes, and reading what its processes and its launcher say
// when one of them fails (see launch.hpp).
#include "process/launch.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <set>

namespace dprun {

std::string effective_launcher(const LaunchConfig& config, bool slurm_job) {
  if (!config.launcher.empty()) return config.launcher;
  if (!config.hostfile.empty()) return "mpirun";
  return slurm_job ? "srun" : "mpirun";
}

std::vector<std::string> launch_command(const LaunchConfig& config, const std::string& launcher,
                                        int processes, const std::vector<std::string>& program,
                                        const std::vector<std::string>& exported) {
  std::vector<std::string> cmd{launcher};
  const std::string n = std::to_string(processes);
  // `launcher` may be the path found on PATH (/usr/bin/srun): srun's options are srun's by name.
  const std::string name = launcher.substr(launcher.find_last_of('/') + 1);
  if (name == "srun") {
    cmd.insert(cmd.end(), {"--ntasks=" + n, "--kill-on-bad-exit=1", "--input=0"});
  } else {
    cmd.insert(cmd.end(), {"-np", n, "--bind-to", "none"});
    if (!config.hostfile.empty()) cmd.insert(cmd.end(), {"--hostfile", config.hostfile});
    for (const auto& name : exported) cmd.insert(cmd.end(), {"-x", name});
  }
  cmd.insert(cmd.end(), config.args.begin(), config.args.end());
  cmd.insert(cmd.end(), program.begin(), program.end());
  return cmd;
}

std::vector<std::string> exported_variables() {
  std::vector<std::string> names;
  for (const char* name :
       {"DPRUN_COMM_TIMEOUT_S", "DPRUN_DATA", "DPRUN_FAULT", "DPRUN_PLUGIN_PATH"}) {
    if (std::getenv(name)) names.push_back(name);
  }
  return names;
}

std::string launch_problem(int processes, bool mpi_compiled, const std::string& launcher,
                           const std::string& launcher_path) {
  const std::string what = "processes = " + std::to_string(processes);
  if (!mpi_compiled)
    return what +
           " needs MPI, but this dprun was built without it: install Open MPI (Debian: "
           "libopenmpi-dev openmpi-bin) and rebuild dprun, or use processes = 1";
  if (launcher_path.empty()) {
    if (launcher == "srun")
      return what +
             " is launched with srun, which is not on PATH: run dprun inside a Slurm "
             "allocation (salloc, sbatch), or set [launch] launcher = \"mpirun\"";
    return what + " is launched with " + launcher +
           ", which is not on PATH: install Open MPI (Debian: openmpi-bin), or set [launch] "
           "launcher = \"srun\" inside a Slurm allocation";
  }
  return "";
}

std::string group_hosts(const std::vector<std::string>& rank_hosts) {
  if (rank_hosts.size() == 1) return rank_hosts[0];
  std::vector<std::pair<std::string, int>> groups;  // in order of first appearance
  for (const auto& h : rank_hosts) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == h; });
    if (it == groups.end())
      groups.emplace_back(h, 1);
    else
      ++it->second;
  }
  std::string out;
  for (const auto& [host, n] : groups)
    out += (out.empty() ? "" : ", ") + host + " x" + std::to_string(n);
  return out;
}

// ---- failures ----------------------------------------------------------------------------------

std::string rank_report_line(const RankReport& r) {
  return "dprun: process " + std::to_string(r.rank) + " of " + std::to_string(r.size) + " on " +
         r.host + ": " + r.message;
}

std::optional<RankReport> parse_rank_report(const std::string& line) {
  static const std::regex form(R"(^dprun: process (\d+) of (\d+) on (\S+): (.*)$)");
  std::smatch m;
  if (!std::regex_match(line, m, form)) return std::nullopt;
  try {
    return RankReport{std::stoi(m[1]), std::stoi(m[2]), m[3], m[4]};
  } catch (const std::exception&) {
    return std::nullopt;  // a number too large: not one of ours
  }
}

namespace {

// mpirun: "mpirun noticed that process rank 1 with PID 77 on node vm exited on signal 9 (Killed)."
const std::regex& mpirun_notice() {
  static const std::regex r(
      R"(noticed that process rank (\d+) with PID \d+ on node (\S+) (.*?)\.?\s*$)");
  return r;
}

// srun: "srun: error: nodeB: task 1: Killed", "srun: error: nodeB: task 1: Exited with exit code 1"
const std::regex& srun_notice() {
  static const std::regex r(R"(^srun: error: (\S+): tasks? ([0-9,\-]+): (.*)$)");
  return r;
}

}  // namespace

bool is_failure_line(const std::string& line) {
  return parse_rank_report(line) || std::regex_search(line, mpirun_notice()) ||
         std::regex_search(line, srun_notice());
}

std::string launcher_failure(const std::vector<std::string>& lines, const std::string& when) {
  // A process the launcher saw die (a signal, an exit) is the cause: the others were stopped
  // because of it, and anything they reported happened after.
  for (const auto& line : lines) {
    std::smatch m;
    if (std::regex_search(line, m, mpirun_notice()))
      return "mpirun: process " + m[1].str() + " on " + m[2].str() + " " + m[3].str() + " " + when;
    if (std::regex_search(line, m, srun_notice()))
      return "srun: process " + m[2].str() + " on " + m[1].str() + ": " + m[3].str() + " " + when;
  }
  for (const auto& line : lines)
    if (auto r = parse_rank_report(line))
      return "process " + std::to_string(r->rank) + " of " + std::to_string(r->size) + " on " +
             r->host + ": " + r->message;
  return "";
}

std::string explain_timeout(const std::string& message, int processes,
                            const std::vector<std::string>& lines,
                            const std::vector<std::string>& rank_hosts, int reporter) {
  if (processes < 2 || message.find("DPRUN_COMM_TIMEOUT_S) for the others") == std::string::npos)
    return message;
  // Every process still running reports the same timeout: the ones that did not stopped
  // responding.
  std::set<int> reported;
  for (const auto& line : lines)
    if (auto r = parse_rank_report(line)) reported.insert(r->rank);
  reported.insert(reporter);  // the message itself is its
  std::string silent;
  int count = 0;
  for (int p = 0; p < processes; ++p) {
    if (reported.count(p)) continue;
    if (!silent.empty()) silent += ", ";
    silent += std::to_string(p);
    if (static_cast<size_t>(p) < rank_hosts.size()) {
      silent += " on ";
      silent += rank_hosts[static_cast<size_t>(p)];
    }
    ++count;
  }
  if (count == 0) return message;
  // "process 1 on nodeB of 2" reads badly: the count goes first.
  std::string out = count == 1 ? "process " : "processes ";
  out += silent;
  out += " (of " + std::to_string(processes) + ") stopped responding (hangs or died): ";
  return out + message;
}

}  // namespace dprun
