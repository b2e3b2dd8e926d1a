// `dprun submit`: a sweep as Slurm job arrays (see submit.hpp).
#include "slurm/submit.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "base/command.hpp"
#include "base/os.hpp"
#include "base/text.hpp"
#include "dp/error.hpp"
#include "dp/safetensors.hpp"
#include "process/checkpoint_files.hpp"
#include "slurm/merge.hpp"
#include "slurm/slurm.hpp"
#include "slurm/submission.hpp"
#include "sweep/asha.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

namespace {

namespace fs = std::filesystem;

// One array holds at most this many tasks: Slurm's default MaxArraySize is 1001 (indices 0-1000).
constexpr size_t kMaxArrayTasks = 1000;

// The folder of the next submission, created here (create_directory fails on one that exists,
// so two submits at once never share a folder): <db folder>/<db stem>.tasks/s0001, s0002, ...
fs::path new_submission_folder(const std::string& db) {
  const fs::path db_path = fs::absolute(db).lexically_normal();
  const fs::path base = db_path.parent_path() / (db_path.stem().string() + ".tasks");
  fs::create_directories(base);
  for (int n = 1;; ++n) {
    char name[32];
    std::snprintf(name, sizeof name, "s%04d", n);
    if (fs::create_directory(base / name)) return base / name;
  }
}

// The resources a trial asks of Slurm (tasks with the same shape share one array).
TaskShape shape_of(const TrialSpec& spec, const SweepOptions& o, const SlurmConfig& config) {
  const std::string backend = backend_for(o.run, spec.settings);
  return task_shape(config, spec.settings[key::gpus], spec.settings[key::processes],
                    backend == "cpu");
}

SubmissionManifest manifest_for(const Experiment& e, const SweepOptions& o) {
  SubmissionManifest m;
  m.experiment = e.name;
  m.run = o.run;
  m.overrides = o.overrides;
  // The tasks run from another folder, maybe on another host.
  for (auto& d : m.run.plugin_dirs) d = fs::absolute(d).string();
  return m;
}

void write_text(const fs::path& path, const std::string& text) {
  dp::write_bytes_atomically(path.string(), text);
}

struct Group {
  TaskShape shape;
  std::vector<const PlannedTrial*> trials;
};

// Under [search] scheduler = "asha", each submitted trial's job: the rung it runs to.
using Jobs = std::map<const PlannedTrial*, AshaJob>;

// What asha starts or promotes now, decided on what the database holds: the results merged so
// far (the trials whose tasks are still out are held elsewhere, so busy). Every job at once, each
// trial decided busy for the next: a submission is one round of successive halving. store null
// (no database yet): every trial starts towards the first rung.
Jobs asha_jobs(dps::Store* store, const Experiment& e, const std::vector<PlannedTrial>& plan) {
  Jobs jobs;
  std::vector<const PlannedTrial*> work;
  for (const auto& p : plan)
    if (p.eligible) work.push_back(&p);
  if (store == nullptr) {
    for (const PlannedTrial* p : work) {
      const int64_t epochs = p->spec->settings[key::epochs];
      const auto rungs = rung_epochs(e.search.min_epochs, e.search.eta, epochs);
      jobs[p] = AshaJob{0, 0, rungs.empty() ? epochs : rungs.front(), AshaJob::Kind::start,
                        dps::TrialStatus::pending};
    }
    return jobs;
  }
  AshaDriver driver(*store, e.search, plan, work);
  std::set<int> busy;
  while (const auto job = driver.next(busy)) {
    busy.insert(static_cast<int>(job->trial));
    jobs[work[job->trial]] = *job;
  }
  return jobs;
}

// Whether a submission runs the trial: under asha, when asha gave it a job this round; else when
// the plan runs it.
bool submits(const PlannedTrial& p, const Experiment& e, const Jobs& jobs) {
  return e.search.asha() ? jobs.count(&p) > 0 : p.action == TrialAction::run;
}

// The arrays to submit: one per shape, each at most kMaxArrayTasks tasks, in sweep order.
std::vector<Group> arrays_of(const std::vector<const PlannedTrial*>& trials, const SweepOptions& o,
                             const SlurmConfig& config) {
  std::map<TaskShape, std::vector<const PlannedTrial*>> by_shape;
  for (const auto* p : trials) by_shape[shape_of(*p->spec, o, config)].push_back(p);
  std::vector<Group> groups;
  for (const auto& [shape, list] : by_shape)
    for (size_t i = 0; i < list.size(); i += kMaxArrayTasks)
      groups.push_back(
          {shape, {list.begin() + i, list.begin() + std::min(list.size(), i + kMaxArrayTasks)}});
  return groups;
}

// Writes the submission's folder (the manifest, the file, the script, a seeded database per
// task), records it, then asks sbatch. Returns the job id; throws dp::Error when sbatch refuses
// (the submission is then forgotten and its folder removed).
std::string submit_array(dps::Store& store, int64_t experiment_id, const Experiment& e,
                         const SweepOptions& o, const SlurmConfig& config, const Group& group,
                         const std::vector<std::string>& sbatch_args, const Jobs& jobs) {
  const std::string& db = store.path();
  const fs::path folder = new_submission_folder(db);
  try {
    write_text(folder / "experiment.toml", e.source);
    SubmissionManifest m = manifest_for(e, o);
    std::vector<dps::TaskRow> tasks;
    for (size_t i = 0; i < group.trials.size(); ++i) {
      const PlannedTrial& p = *group.trials[i];
      const std::string stem = task_stem(static_cast<int64_t>(i));
      const std::string task_db = (folder / (stem + ".db")).string();
      // The trial as the experiment's database holds it, checkpoints named from the task's
      // folder: a failed or interrupted trial resumes where it stopped.
      dps::TrialState state = store.trial_state(p.row->id);
      for (auto& c : state.checkpoints) {
        c.path = rebase_checkpoint_path(db, c.path, task_db);
        if (!c.optimizer_path.empty())
          c.optimizer_path = rebase_checkpoint_path(db, c.optimizer_path, task_db);
      }
      {
        dps::Store seed(task_db, dps::Store::Mode::read_write, e.settings->store_columns(),
                        dps::Store::Journal::rollback);
        seed.put_trial_state(
            seed.upsert_experiment(e.name, e.description, e.source, e.settings->generation()),
            state);
      }
      SubmittedTrial task{static_cast<int64_t>(i), p.spec->config_hash, stem + ".db"};
      if (const auto job = jobs.find(&p); job != jobs.end()) {
        task.rung = job->second.rung;
        task.stop_after = job->second.stop_after;
      }
      m.tasks.push_back(task);
      dps::TaskRow row;
      row.index = static_cast<int64_t>(i);
      row.trial_id = p.row->id;
      row.database = rebase_checkpoint_path(task_db, task_db, db);
      row.base_attempts = state.trial.attempts;
      tasks.push_back(row);
    }
    write_manifest(folder.string(), m);
    const fs::path script = folder / "job.sh";
    write_text(script, job_script(self_exe(), folder.string(), e.name, tasks.size()));
    fs::permissions(script, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
    const auto cmd =
        sbatch_command(config, group.shape, static_cast<int64_t>(tasks.size()), "dprun-" + e.name,
                       folder.string(), sbatch_args, script.string());
    dps::SubmissionRow sub;
    sub.experiment_id = experiment_id;
    sub.scheduler = "slurm";
    sub.folder = rebase_checkpoint_path(db, folder.string(), db);
    sub.command = command_text(cmd);
    const int64_t id = store.add_submission(sub, tasks);
    const CommandOutput r = run_captured(cmd, 120);
    const std::string job = parse_sbatch_job_id(r.out);
    if (!r.ok() || job.empty()) {
      store.delete_submission(id);
      throw dp::Error("sbatch refused the job array (" +
                      (r.ok() ? "no job id in its answer: " + r.out : r.failure()) +
                      "); the command was: " + command_text(cmd));
    }
    store.set_submission_job(id, job);
    std::printf("submitted Slurm job %s: %zu trial%s (%s each), array 0-%zu%s\n  %s\n", job.c_str(),
                tasks.size(), tasks.size() == 1 ? "" : "s", group.shape.text().c_str(),
                tasks.size() - 1,
                config.max_parallel > 0
                    ? (", at most " + std::to_string(config.max_parallel) + " at once").c_str()
                    : "",
                folder.c_str());
    return job;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(folder, ec);
    throw;
  }
}

}  // namespace

void print_submission_plan(const Experiment& e, const SweepOptions& o, const SlurmConfig& config,
                           const std::vector<std::string>& sbatch_args) {
  const std::string db = database_path(e, o);
  std::map<std::string, std::string> elsewhere;
  const auto plan = plan_trials(e, stored_trials_read_only(db, e.name, elsewhere), o, elsewhere);
  std::optional<dps::Store> store;
  if (e.search.asha() && fs::exists(db)) store.emplace(db, dps::Store::Mode::read_only);
  const Jobs jobs = e.search.asha() ? asha_jobs(store ? &*store : nullptr, e, plan) : Jobs{};
  std::vector<const PlannedTrial*> to_run;
  std::vector<std::vector<std::string>> table{{"#", "hash", "trial", "action"}};
  for (const auto& p : plan) {
    const auto job = jobs.find(&p);
    if (submits(p, e, jobs)) to_run.push_back(&p);
    std::string action = p.describe();
    if (job != jobs.end())
      action = "asha: to rung " + std::to_string(job->second.rung) + " (epoch " +
               std::to_string(job->second.stop_after) + ")";
    else if (e.search.asha() && p.eligible)
      action = "asha: not now";
    table.push_back({std::to_string(p.spec->ordinal + 1), p.spec->config_hash.substr(0, 10),
                     trial_display_name(*p.spec), action});
  }
  std::printf("experiment %s: %zu trials, database %s\n", e.name.c_str(), plan.size(), db.c_str());
  std::fputs(format_aligned(table).c_str(), stdout);
  // The folder of each array is numbered when it is made; the dry run names it sNNNN.
  const fs::path db_path = fs::absolute(db).lexically_normal();
  const std::string folder =
      (db_path.parent_path() / (db_path.stem().string() + ".tasks") / "sNNNN").string();
  const auto groups = arrays_of(to_run, o, config);
  for (const auto& g : groups)
    std::printf(
        "would submit %zu trial%s (%s each):\n  %s\n", g.trials.size(),
        g.trials.size() == 1 ? "" : "s", g.shape.text().c_str(),
        command_text(sbatch_command(config, g.shape, static_cast<int64_t>(g.trials.size()),
                                    "dprun-" + e.name, folder, sbatch_args, folder + "/job.sh"))
            .c_str());
  if (groups.empty()) {
    std::printf("nothing to submit\n");
    return;
  }
  std::printf("with %s/job.sh:\n%s", folder.c_str(),
              job_script(self_exe(), folder, e.name, groups.front().trials.size()).c_str());
}

int submit_sweep(const Experiment& e, const SweepOptions& o, const SlurmConfig& config,
                 const std::vector<std::string>& sbatch_args) {
  const std::string db = database_path(e, o);
  dps::Store store(db, dps::Store::Mode::read_write, e.settings->store_columns());
  const int64_t experiment_id =
      store.upsert_experiment(e.name, e.description, e.source, e.settings->generation());
  store.recover_stale(experiment_id, o.stale_seconds);
  const auto elsewhere = merge_before_running(store, experiment_id);
  std::map<std::string, dps::TrialRow> stored;
  for (const TrialSpec& spec : e.trials)
    stored[spec.config_hash] =
        store.ensure_trial(experiment_id, spec.config_hash, spec.ordinal, to_store(spec.settings));
  const auto plan = plan_trials(e, stored, o, elsewhere);
  // Under asha a submission is one round: what it starts or promotes on the results so far.
  const Jobs jobs = e.search.asha() ? asha_jobs(&store, e, plan) : Jobs{};
  std::vector<const PlannedTrial*> to_run;
  std::map<std::string, int> skipped;
  for (const auto& p : plan) {
    if (submits(p, e, jobs))
      to_run.push_back(&p);
    else
      ++skipped[e.search.asha() && p.eligible ? std::string("not now (asha)")
                                              : p.why.substr(0, p.why.find(':'))];
  }
  std::string skip_text;
  for (const auto& [why, n] : skipped)
    skip_text += (skip_text.empty() ? "" : ", ") + std::to_string(n) + " " + why;
  std::printf("experiment %s: %zu trials, %zu to submit%s; database %s\n", e.name.c_str(),
              plan.size(), to_run.size(), skip_text.empty() ? "" : (" (" + skip_text + ")").c_str(),
              db.c_str());
  if (to_run.empty()) {
    std::printf("nothing to submit\n");
    return 0;
  }
  size_t submitted = 0;
  try {
    for (const auto& g : arrays_of(to_run, o, config)) {
      submit_array(store, experiment_id, e, o, config, g, sbatch_args, jobs);
      submitted += g.trials.size();
    }
  } catch (const dp::Error& err) {
    std::fprintf(stderr, "dprun: %s\n", err.what());
    // Nothing submitted: most often an sbatch option or a [launch.slurm] value Slurm refuses.
    if (submitted == 0) return 2;
    std::fprintf(stderr,
                 "dprun: %zu of %zu trials were submitted; submit again to retry the rest\n",
                 submitted, to_run.size());
    return 1;
  }
  std::printf("follow it with: %s status %s\n", shell_quote(command_name()).c_str(),
              shell_quote(o.file).c_str());
  if (e.search.asha())
    std::printf("asha: submit again when these tasks have ended, to promote the best of them "
                "(each submit is one round)\n");
  return 0;
}

}  // namespace dprun
