// Talking to Slurm (see slurm.hpp).
#include "slurm/slurm.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "base/command.hpp"
#include "base/os.hpp"
#include "dp/error.hpp"
#include "process/trial_process.hpp"

namespace dprun {

namespace {

// squeue and scontrol answer in milliseconds on a healthy controller; a busy one may take
// seconds. Longer than this and the controller is treated as unreachable for now.
constexpr double kQueryTimeoutSeconds = 60;

// Variables through which a user's settings would change what squeue and scontrol answer (which
// states, partitions, users, clusters, the output format): a live task hidden by them would be
// taken for ended, collected and run a second time. They are removed from the queries' environment.
const std::vector<std::string> kQueryEnvToUnset = {
    "SQUEUE_STATES",   "SQUEUE_PARTITION", "SQUEUE_USERS",     "SQUEUE_ACCOUNT", "SQUEUE_QOS",
    "SQUEUE_NAMES",    "SQUEUE_FORMAT",    "SQUEUE_FORMAT2",   "SQUEUE_SORT",    "SLURM_CLUSTERS",
    "SQUEUE_CLUSTERS", "SQUEUE_SIBLING",   "SLURM_TIME_FORMAT"};

std::string plural(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::string TaskShape::text() const {
  std::string s = plural(processes, "process", "processes");
  if (gpus_per_process > 0)
    s += (processes > 1 ? " x " : ", ") + plural(gpus_per_process, "GPU", "GPUs");
  if (cpus_per_process > 0)
    s += (processes > 1 ? " x " : ", ") + plural(cpus_per_process, "CPU", "CPUs");
  return s;
}

TaskShape task_shape(const SlurmConfig& config, int64_t gpus, int64_t processes, bool cpu) {
  TaskShape shape;
  shape.processes = static_cast<int>(processes);
  const int per_process = static_cast<int>(gpus / std::max<int64_t>(processes, 1));
  if (!cpu) shape.gpus_per_process = per_process;
  // On the CPU backend each replica is a thread: a core each, as `--jobs` gives them.
  shape.cpus_per_process = config.cpus_per_task > 0 ? static_cast<int>(config.cpus_per_task)
                           : cpu                    ? per_process
                                                    : 0;
  return shape;
}

std::vector<std::string> sbatch_command(const SlurmConfig& config, const TaskShape& shape,
                                        int64_t count, const std::string& job_name,
                                        const std::string& folder,
                                        const std::vector<std::string>& extra,
                                        const std::string& script) {
  if (folder.find('\\') != std::string::npos)
    throw dp::Error("the submission folder " + folder +
                    " has a backslash in its path, which turns off sbatch's expansion of %a in "
                    "--output (every task would write one file named t%4a.out); keep the "
                    "experiment's database in a folder whose path has none");
  // sbatch expands %x in --output: a % of the folder's own is written %%.
  std::string escaped;
  for (char c : folder) escaped += c == '%' ? std::string("%%") : std::string(1, c);
  std::string array = "--array=0-" + std::to_string(count - 1);
  if (config.max_parallel > 0) array += "%" + std::to_string(config.max_parallel);
  // %4a: the array index padded to four digits, as the task databases are named.
  std::vector<std::string> cmd{"sbatch",
                               "--parsable",
                               "--job-name=" + job_name,
                               array,
                               "--output=" + escaped + "/t%4a.out",
                               "--ntasks=" + std::to_string(shape.processes)};
  if (shape.gpus_per_process > 0 && !config.gres) {
    cmd.push_back("--gpus-per-task=" + std::to_string(shape.gpus_per_process));
  } else if (shape.gpus_per_process > 0) {
    // A generic resource counts per node: one process per node gets them all.
    if (shape.processes > 1)
      cmd.insert(cmd.end(), {"--nodes=" + std::to_string(shape.processes), "--ntasks-per-node=1"});
    cmd.push_back("--gres=gpu:" + std::to_string(shape.gpus_per_process));
  }
  if (shape.cpus_per_process > 0)
    cmd.push_back("--cpus-per-task=" + std::to_string(shape.cpus_per_process));
  for (const auto& [name, value] : {std::pair{"partition", &config.partition},
                                    {"time", &config.time},
                                    {"account", &config.account},
                                    {"qos", &config.qos},
                                    {"mem", &config.mem}})
    if (!value->empty()) cmd.push_back(std::string("--") + name + "=" + *value);
  cmd.insert(cmd.end(), config.args.begin(), config.args.end());
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  cmd.push_back(script);
  return cmd;
}

std::string parse_sbatch_job_id(const std::string& out) {
  static const std::regex id(R"(^\s*(\d+)(;\S*)?\s*$)");
  std::smatch m;
  // The last line: a site's sbatch wrapper may print notes before the answer.
  std::string last;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return std::regex_match(last, m, id) ? m[1].str() : "";
}

std::optional<std::map<std::string, std::map<int64_t, std::string>>> parse_squeue(
    const std::string& out, std::string& problem) {
  std::map<std::string, std::map<int64_t, std::string>> live;
  static const std::regex row(R"(^\s*(\d+)\|(\d+)\|([A-Z_]+)\s*$)");
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::smatch m;
    if (!std::regex_match(line, m, row)) {
      // A task skipped here would read as ended: its database opened while it may still run.
      problem = "squeue printed a line that is not JOB|INDEX|STATE: '" + line.substr(0, 200) + "'";
      return std::nullopt;
    }
    live[m[1].str()][std::stoll(m[2].str())] = m[3].str();
  }
  return live;
}

std::optional<std::map<std::string, std::map<int64_t, std::string>>> live_array_tasks(
    const std::vector<std::string>& job_ids, std::string& problem, bool& absent) {
  absent = false;
  std::map<std::string, std::map<int64_t, std::string>> none;
  if (job_ids.empty()) return none;
  std::string list;
  for (const auto& id : job_ids) list += (list.empty() ? "" : ",") + id;
  // -r: one line per array task, pending ones too (squeue folds them into "12_[3-9]" otherwise).
  const CommandOutput q = run_captured({"squeue", "-h", "-r", "-j", list, "-o", "%F|%K|%T"},
                                       kQueryTimeoutSeconds, kQueryEnvToUnset);
  if (q.ok()) return parse_squeue(q.out, problem);
  // squeue refuses a list in which it knows no job at all: every one of them has ended.
  if (q.started && !q.timed_out && q.err.find("Invalid job id") != std::string::npos) return none;
  absent = q.not_found;
  problem = q.started ? "squeue " + q.failure() : q.failure();
  return std::nullopt;
}

std::map<int64_t, EndedTask> parse_scontrol_jobs(const std::string& out) {
  std::map<int64_t, EndedTask> tasks;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::map<std::string, std::string> fields;
    std::istringstream words(line);
    for (std::string w; words >> w;)
      if (auto eq = w.find('='); eq != std::string::npos)
        fields.emplace(w.substr(0, eq), w.substr(eq + 1));
    auto index = fields.find("ArrayTaskId");
    if (index == fields.end() ||
        index->second.find_first_not_of("0123456789") != std::string::npos || index->second.empty())
      continue;  // a pending remainder ("3-9%2") or not an array task
    EndedTask t;
    t.state = fields["JobState"];
    t.reason = fields["Reason"];
    t.exit_code = fields["ExitCode"];
    t.node = fields["BatchHost"];
    tasks[std::stoll(index->second)] = t;
  }
  return tasks;
}

std::map<int64_t, EndedTask> ended_array_tasks(const std::string& job_id) {
  const CommandOutput q = run_captured({"scontrol", "show", "job", "-o", job_id},
                                       kQueryTimeoutSeconds, kQueryEnvToUnset);
  return q.ok() ? parse_scontrol_jobs(q.out) : std::map<int64_t, EndedTask>{};
}

std::string cause_from_output(const std::string& text) {
  // slurmstepd's words (src/slurmd/slurmstepd/req.c), the last such line counting.
  static const std::regex line(
      R"(\*\*\* (?:JOB|STEP) ([0-9.]+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))?(?:,[^*]*)? \*\*\*)");
  std::string cause;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it) {
    const std::smatch& m = *it;
    const std::string why = m[4].str();
    std::string what = why.empty()             ? "cancelled by Slurm (scancel)"
                       : why == "TIME LIMIT"   ? "Slurm time limit reached"
                       : why == "PREEMPTION"   ? "preempted by Slurm"
                       : why == "NODE FAILURE" ? "node failure (Slurm)"
                       : why == "JOB REQUEUE"  ? "requeued by Slurm"
                                               : "cancelled by Slurm (" + why + ")";
    cause = what + " (job " + m[1].str() + " on " + m[2].str() + " at " + m[3].str() + ")";
  }
  return cause;
}

std::string cause_from_state(const EndedTask& t) {
  std::string what;
  if (t.state == "CANCELLED")
    what = "cancelled by Slurm (scancel)";
  else if (t.state == "TIMEOUT")
    what = "Slurm time limit reached";
  else if (t.state == "PREEMPTED")
    what = "preempted by Slurm";
  else if (t.state == "NODE_FAIL")
    what = "node failure (Slurm)";
  else if (t.state == "OUT_OF_MEMORY")
    what = "out of memory (Slurm's memory limit)";
  else if (t.state == "BOOT_FAIL")
    what = "the node failed to boot (Slurm)";
  else if (t.state == "DEADLINE")
    what = "Slurm deadline reached";
  else
    return "";
  return what + " (Slurm state " + t.state + (t.node.empty() ? "" : " on " + t.node) + ")";
}

std::string ended_task_text(const EndedTask& t) {
  const std::string state = "Slurm state " + t.state + ", exit code " + t.exit_code;
  // ExitCode=STATUS:SIGNAL, SIGNAL the one that ended the job script (dprun itself: it execs).
  const auto colon = t.exit_code.find(':');
  const int sig = colon == std::string::npos ? 0 : std::atoi(t.exit_code.c_str() + colon + 1);
  if (sig > 0)
    return "the task was killed by " + signal_name(sig) + " (" + state +
           (t.node.empty() ? "" : " on " + t.node) + ")";
  return state + (t.node.empty() ? "" : " on " + t.node);
}

}  // namespace dprun
