// `dprun __slurm-task FOLDER`: one task of a Slurm job array made by `dprun submit`. It runs its
// one trial with the local runner (its own process, records, checkpoints, resume) into its own
// database in FOLDER, and never opens the experiment's database.
#include "slurm/slurm_task.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "base/os.hpp"
#include "dp/error.hpp"
#include "process/trial_process.hpp"
#include "slurm/slurm.hpp"
#include "slurm/submission.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Why this task got `sig`. slurmstepd writes its reason into the task's output ("*** JOB 13 ON
// node1 CANCELLED AT ... DUE TO TIME LIMIT ***") before it signals the task's processes; on a
// shared file system the line may take a moment to show, so it is looked for a few times. Then
// scontrol, which may already say TIMEOUT, PREEMPTED, ... (or only COMPLETING: no reason yet;
// the merge asks again once the task has ended).
std::string stop_cause(int sig, const std::string& output) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    if (std::string c = cause_from_output(file_tail(output)); !c.empty()) return c;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string job = env("SLURM_ARRAY_JOB_ID"), index = env("SLURM_ARRAY_TASK_ID");
  if (!job.empty() && !index.empty()) {
    const auto tasks = ended_array_tasks(job + "_" + index);
    if (auto t = tasks.find(std::atoll(index.c_str())); t != tasks.end()) {
      if (std::string c = cause_from_state(t->second); !c.empty()) return c;
      return "interrupted by " + signal_name(sig) + " (Slurm job " + job + "_" + index + " is " +
             t->second.state + ", no reason given)";
    }
  }
  return "interrupted by " + signal_name(sig);
}

}  // namespace

int slurm_task_main(const std::vector<std::string>& args) {
  try {
    std::string folder, index_text;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == "--index" && i + 1 < args.size())
        index_text = args[++i];
      else if (folder.empty() && args[i].rfind("--", 0) != 0)
        folder = args[i];
      else
        throw dp::Error("unexpected argument " + args[i]);
    }
    if (folder.empty()) throw dp::Error("usage: dprun __slurm-task FOLDER [--index N]");
    if (index_text.empty()) index_text = env("SLURM_ARRAY_TASK_ID");
    if (index_text.empty())
      throw dp::Error(
          "SLURM_ARRAY_TASK_ID is not set: dprun __slurm-task runs as a task of the Slurm job "
          "array dprun submit made (to run one task by hand: dprun __slurm-task " +
          folder + " --index N)");
    char* end = nullptr;
    const long long index = std::strtoll(index_text.c_str(), &end, 10);
    if (*end != '\0' || index < 0) throw dp::Error("task index " + index_text + ": not a number");
    const SubmissionManifest m = read_manifest(folder);
    const SubmittedTrial* task = nullptr;
    for (const auto& t : m.tasks)
      if (t.index == index) task = &t;
    if (!task)
      throw dp::Error((fs::path(folder) / "submission.json").string() + " has no task " +
                      index_text + " (it lists " + std::to_string(m.tasks.size()) + ")");

    SweepOptions o;
    o.file = (fs::path(folder) / m.file).string();
    o.db = (fs::path(folder) / task->database).string();
    o.run = m.run;
    o.overrides = m.overrides;
    o.task_rung = task->rung;
    o.task_stop_after = task->stop_after;
    // Without --threads, the CPUs Slurm gave the task (the machine may have many more).
    if (o.run.threads == 0 && !env("SLURM_CPUS_PER_TASK").empty())
      o.run.threads = std::max(1, std::atoi(env("SLURM_CPUS_PER_TASK").c_str()));
    // Submitted with --force or not, the task keeps one trial of the sweep (by hash): a sweep
    // of any size must load here.
    o.force = true;
    o.journal = dps::Store::Journal::rollback;
    // This task is its database's only writer: a trial left `running` there is from an earlier
    // run of this same task (Slurm requeued it) and resumes.
    o.stale_seconds = 0;
    o.command_line = "dprun __slurm-task " + shell_quote(folder) + " --index " + index_text;
    const std::string output = (fs::path(folder) / (task_stem(index) + ".out")).string();
    o.interruption_cause = [output](int sig) { return stop_cause(sig, output); };

    Experiment e = load_sweep(o);
    std::erase_if(e.trials, [&](const TrialSpec& s) { return s.config_hash != task->config_hash; });
    if (e.trials.empty())
      throw dp::Error(o.file + " no longer yields trial " + task->config_hash.substr(0, 12) +
                      "... (was this dprun upgraded in a way that changes trial hashes since the "
                      "submission? submit the experiment again)");
    std::fprintf(stderr, "dprun: Slurm task %s of experiment %s: trial %s\n", index_text.c_str(),
                 m.experiment.c_str(), trial_display_name(e.trials.front()).c_str());
    return run_experiment(e, o);
  } catch (const ConfigErrors& e) {
    for (const auto& err : e.errors()) std::fprintf(stderr, "%s\n", err.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dprun: __slurm-task: %s\n", e.what());
    return 2;
  }
}

}  // namespace dprun
