// Running a sweep: reconcile its trials with the store, then run those that need it, each in its
// own process (trial_run.cpp), as many at once as the scheduler lets, recording every epoch as
// it arrives. Loading and planning: sweep_plan.cpp.
#include "sweep/sweep_runner.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include "base/os.hpp"
#include "base/text.hpp"
#include "process/process_set.hpp"
#include "sweep/asha.hpp"
#include "sweep/progress.hpp"
#include "sweep/scheduler.hpp"
#include "sweep/trial_run.hpp"

namespace dprun {

namespace fs = std::filesystem;

// ---- running
// -------------------------------------------------------------------------------------

namespace {

// Where a trial ran, for the summary: the devices --jobs gave it (else what the trial process
// found), and the hosts of its processes.
std::string devices_text(const dps::TrialRow& t, int64_t processes) {
  if (t.status == dps::TrialStatus::pending) return "-";
  std::string text = !t.device_set.empty() ? t.device_set : t.devices;
  if (processes > 1 && !t.hosts.empty()) text += (text.empty() ? "" : " on ") + t.hosts;
  return text.empty() ? "-" : text;
}

void print_summary(dps::Store& store, int64_t experiment_id, const Experiment& experiment,
                   const std::string& db) {
  std::map<std::string, dps::TrialSummary> by_hash;
  for (auto& t : store.trial_summaries(experiment_id)) by_hash[t.trial.config_hash] = t;

  std::vector<std::vector<std::string>> table;
  table.push_back({"trial", "status", "epochs", "test_acc", "s/epoch", "devices", "note"});
  for (const TrialSpec& spec : experiment.trials) {
    auto found = by_hash.find(spec.config_hash);
    if (found == by_hash.end()) continue;
    const dps::TrialSummary& t = found->second;
    std::string note = t.trial.error;
    if (auto nl = note.find('\n'); nl != std::string::npos) note = note.substr(0, nl);
    if (note.size() > 80) {
      note.resize(77);  // not substr(0, 77) + "...", which GCC 12 -O3 warns falsely about
      note += "...";
    }
    table.push_back(
        {trial_display_name(spec), dps::status_name(t.trial.status),
         std::to_string(t.trial.epochs_done) + "/" + std::to_string(spec.settings[key::epochs]),
         number_cell(t.final_test_acc, "%.4f"), number_cell(t.mean_seconds_per_epoch, "%.2f"),
         devices_text(t.trial, spec.settings[key::processes]), note});
  }
  std::printf("\nexperiment %s:\n", experiment.name.c_str());
  std::fputs(format_aligned(table, "  ").c_str(), stdout);
  std::printf("\ndatabase: %s\n", db.c_str());
  // The command as it works here: "dprun" once installed, else the path of this one.
  std::printf(
      "try: %s query --db %s \"SELECT model, gpus, batch_size, lr, final_test_acc, "
      "mean_seconds_per_epoch FROM trial_summary\"\n",
      shell_quote(command_name()).c_str(), shell_quote(db).c_str());
  std::fflush(stdout);
}

// What the scheduler may hand out: nothing with --jobs 1 (each trial has the machine, as
// always); else the runner's cores, and the GPUs when a trial may run on CUDA (counted in a
// child process: the runner never initialises CUDA).
DeviceInventory devices_for(const std::vector<const PlannedTrial*>& trials,
                            const SweepOptions& options) {
  DeviceInventory inventory;
  if (options.jobs == 1) return inventory;
  inventory.cores = affinity_cores();
  const bool may_use_gpus = std::any_of(trials.begin(), trials.end(), [&](const auto* p) {
    const std::string backend = backend_for(options.run, p->spec->settings);
    return backend != "cpu";
  });
  if (may_use_gpus) inventory.gpus = visible_gpus("/proc/self/exe");
  return inventory;
}

// What a trial asks of the scheduler: its GPUs, or on the CPU backend --threads cores (one per
// replica without it). A trial whose processes run on other hosts (a hostfile, srun) runs
// alone; so does every trial with --jobs 1.
DeviceNeed device_need(const TrialSpec& spec, const Experiment& experiment,
                       const SweepOptions& options, const DeviceInventory& inventory) {
  DeviceNeed need;
  const std::string launcher = !options.run.launch.launcher.empty() ? options.run.launch.launcher
                                                                    : experiment.launch.launcher;
  const bool remote = !options.run.launch.hostfile.empty() || !experiment.launch.hostfile.empty() ||
                      launcher == "srun" || (launcher.empty() && std::getenv("SLURM_JOB_ID"));
  need.exclusive = options.jobs == 1 || (spec.settings[key::processes] > 1 && remote);
  const std::string backend = backend_for(options.run, spec.settings);
  const int gpus = static_cast<int>(spec.settings[key::gpus]);
  need.kind = backend == "cuda" || (backend == "auto" && !inventory.gpus.empty()) ? DeviceKind::gpu
                                                                                  : DeviceKind::cpu;
  need.count = need.kind == DeviceKind::gpu ? gpus
               : options.run.threads > 0    ? options.run.threads
                                            : gpus;
  return need;
}

}  // namespace

namespace {

/// The trials of a run that train, in plan order, and their epochs in all (for the ETA).
struct Work {
  std::vector<const PlannedTrial*> trials;
  int64_t epochs = 0;
};

/// asha: every trial the scheduler may run (it decides, from the database, what runs).
Work work_of(const std::vector<PlannedTrial>& plan, bool asha) {
  Work w;
  for (const auto& p : plan)
    if (asha ? p.eligible : p.action == TrialAction::run) {
      w.trials.push_back(&p);
      w.epochs += p.spec->settings[key::epochs];
    }
  return w;
}

/// Runs the trials of `work`, as many at once as the scheduler lets, each a TrialRun waited on
/// by one ProcessSet, until all ended or the runner got SIGINT/SIGTERM (then the running ones
/// are stopped and recorded interrupted).
class Runs {
 public:
  /// asha: the [search] scheduler that says what runs next (null: every trial of the work, in
  /// plan order, each to its end).
  Runs(const SweepContext& sweep, const Work& work, AshaDriver* asha)
      : sweep_(sweep),
        work_(work),
        asha_(asha),
        scheduler_(devices_for(work.trials, sweep.options), sweep.options.jobs),
        running_(sweep.signals) {
    if (asha_ != nullptr) return;
    for (size_t i = 0; i < work.trials.size(); ++i) {
      // A Slurm task's asha job, decided by its submission.
      if (sweep.options.task_rung >= 0)
        jobs_[static_cast<int>(i)] =
            AshaJob{i, sweep.options.task_rung, sweep.options.task_stop_after, AshaJob::Kind::start,
                    work.trials[i]->row->status};
      queue(static_cast<int>(i));
    }
  }

  /// Returns the signal that stopped the run (0: every trial ended).
  int run() {
    try {
      while (!interrupted_by_) {
        if ((interrupted_by_ = sweep_.signals.received())) break;
        const int started = feed_and_start();
        if (running_.empty()) {
          if (!scheduler_.waiting()) break;
          // The trials just started were taken by another dprun or failed at once: their devices
          // are free again, so the next ones start. Only when nothing could start at all while
          // nothing runs do waiting trials fit nowhere.
          if (started == 0 && scheduler_.running() == 0)
            throw std::logic_error("the scheduler has trials waiting that fit nowhere");
          continue;
        }
        // At least once a second, for the live line.
        if (const int sig = running_.wait(1.0)) interrupted_by_ = sig;
        for (auto& [i, run] : running_.take_finished()) ended(i, run->outcome());
        sweep_.progress.tick();
      }
      for (auto& [i, run] : running_.take_all()) {
        run->interrupt(interrupted_by_);
        ended(i, run->outcome());
      }
    } catch (...) {
      // The trial processes go with their TrialRuns; what was written stays.
      running_.take_all();
      throw;
    }
    return interrupted_by_;
  }
  bool any_failed() const { return any_failed_; }

 private:
  void queue(int i) {
    queued_.insert(i);
    scheduler_.add(i, device_need(*work_.trials[static_cast<size_t>(i)]->spec, sweep_.experiment,
                                  sweep_.options, scheduler_.inventory()));
  }

  /// Starts what fits; under a [search] scheduler, asks it for a job whenever a device is free,
  /// and starts it at once: a decision is never parked to run later on stale rankings.
  int feed_and_start() {
    int started = start_what_fits();
    if (asha_ == nullptr) return started;
    while (!scheduler_.waiting() && scheduler_.could_start_any()) {
      std::set<int> busy = queued_;
      busy.insert(given_up_.begin(), given_up_.end());
      const auto job = asha_->next(busy);
      if (!job) break;
      const int i = static_cast<int>(job->trial);
      const PlannedTrial& p = *work_.trials[static_cast<size_t>(i)];
      if (!scheduler_.fits_now(
              device_need(*p.spec, sweep_.experiment, sweep_.options, scheduler_.inventory())))
        break;  // decided again when devices are free
      jobs_[i] = *job;
      queue(i);
      started += start_what_fits();
    }
    return started;
  }

  /// Starts the trials the scheduler lets start now; returns how many it let start.
  int start_what_fits() {
    const auto ready = scheduler_.start_now();
    for (const auto& [i, devices] : ready) {
      const PlannedTrial& p = *work_.trials[static_cast<size_t>(i)];
      // A retry starts from the trial as its failed attempt left it, a scheduler's job from the
      // trial as the database has it now.
      const auto again = retry_rows_.find(i);
      const auto job = jobs_.find(i);
      std::optional<dps::TrialRow> now;
      if (job != jobs_.end()) {
        now = sweep_.store.get_trial(p.row->id);
        // Claimed only if the trial is still as the decision saw it.
        if (now) now->status = job->second.expected;
      }
      const dps::TrialRow& row = now ? *now : again != retry_rows_.end() ? again->second : *p.row;
      const int64_t stop_after = job != jobs_.end() ? job->second.stop_after : 0;
      auto run = std::make_unique<TrialRun>(sweep_, *p.spec, row, i + 1, devices, stop_after);
      if (run->claim()) {
        if (job != jobs_.end()) start_job(i, job->second);
        run->start();
      }
      if (run->done())
        ended(i, run->outcome());
      else
        running_.add(i, std::move(run));
    }
    return static_cast<int>(ready.size());
  }
  // A claimed job of the [search] scheduler: the rung it may now run to, said once.
  void start_job(int i, const AshaJob& job) {
    const PlannedTrial& p = *work_.trials[static_cast<size_t>(i)];
    sweep_.store.set_rung(p.row->id, job.rung);
    if (job.kind == AshaJob::Kind::promotion) {
      std::string note = std::to_string(i + 1);
      note.insert(0, 1, '[');
      note.append("] ").append(trial_display_name(*p.spec)).append(": promoted to rung ");
      note.append(std::to_string(job.rung)).append(" (to epoch ");
      sweep_.progress.note(note.append(std::to_string(job.stop_after)).append(")"));
    }
  }

  // A trial that ended: its devices go to the next ones.
  void ended(int i, const TrialOutcome& out) {
    if (out.interrupted_by && !interrupted_by_) interrupted_by_ = out.interrupted_by;
    scheduler_.release(i);
    if (retry(i, out)) return;
    queued_.erase(i);
    jobs_.erase(i);
    // The scheduler would send a failed trial back towards its rung, and start a diverged or
    // skipped one again: once per run is what a run without it does too.
    if (asha_gives_up(out.status, out.taken)) given_up_.insert(i);
    if (out.status == dps::TrialStatus::failed || out.status == dps::TrialStatus::diverged)
      any_failed_ = true;
  }
  // A trial that failed (not diverged, stopped or taken by another dprun) waits to run again
  // while its `retries` allow, from its last checkpoint where it kept one.
  bool retry(int i, const TrialOutcome& out) {
    if (out.status != dps::TrialStatus::failed || out.taken || out.interrupted_by ||
        interrupted_by_)
      return false;
    const PlannedTrial& p = *work_.trials[static_cast<size_t>(i)];
    const int64_t allowed = p.spec->settings[key::retries];
    int64_t& used = retries_used_[i];
    if (used >= allowed) return false;
    auto row = sweep_.store.get_trial(p.row->id);
    if (!row || row->status != dps::TrialStatus::failed) return false;
    ++used;
    retry_rows_[i] = *row;
    jobs_.erase(i);  // a scheduler's retry goes on towards its rung: the database says which
    // Appended piece by piece: GCC 12 warns of an overlap (-Wrestrict) it imagines in a chain of
    // string +'s starting with a short literal.
    std::string note = std::to_string(i + 1);
    note.insert(0, 1, '[');
    note.append("] ").append(trial_display_name(*p.spec)).append(": failed; retry ");
    note.append(std::to_string(used)).append(" of ").append(std::to_string(allowed));
    sweep_.progress.note(note.append(" (retries)"));
    if (asha_ != nullptr) {
      // The scheduler resumes it towards its rung when it asks again.
      queued_.erase(i);
      return true;
    }
    scheduler_.add(i,
                   device_need(*p.spec, sweep_.experiment, sweep_.options, scheduler_.inventory()));
    return true;
  }

  const SweepContext& sweep_;
  const Work& work_;
  AshaDriver* asha_;
  Scheduler scheduler_;
  ProcessSet<TrialRun> running_;
  bool any_failed_ = false;
  int interrupted_by_ = 0;
  std::map<int, int64_t> retries_used_;      // by work index
  std::map<int, dps::TrialRow> retry_rows_;  // the row a retry starts from
  std::set<int> queued_;                     // given to the scheduler and not yet ended
  std::set<int> given_up_;                   // given up in this run (asha_gives_up)
  std::map<int, AshaJob> jobs_;              // the [search] scheduler's jobs, by work index
};

}  // namespace

int run_experiment(const Experiment& experiment, const SweepOptions& options,
                   const HeldElsewhere& elsewhere) {
  const std::string db = database_path(experiment, options);
  dps::Store store(db, dps::Store::Mode::read_write, experiment.settings->store_columns(),
                   options.journal);
  const int64_t experiment_id =
      store.upsert_experiment(experiment.name, experiment.description, experiment.source,
                              experiment.settings->generation());
  if (int n = store.recover_stale(experiment_id, options.stale_seconds))
    std::fprintf(stderr,
                 "dprun: %d trial%s left running by a dprun that is gone: now interrupted\n", n,
                 n == 1 ? "" : "s");
  std::map<std::string, dps::TrialRow> stored;
  for (const TrialSpec& spec : experiment.trials) {
    stored[spec.config_hash] =
        store.ensure_trial(experiment_id, spec.config_hash, spec.ordinal, to_store(spec.settings));
  }
  const auto plan = plan_trials(experiment, stored, options, elsewhere);
  const Work work = work_of(plan, experiment.search.asha());
  const auto to_run = std::count_if(
      plan.begin(), plan.end(), [](const PlannedTrial& p) { return p.action == TrialAction::run; });
  std::fprintf(stderr, "dprun: experiment %s: %zu trial%s, %zu to run%s, database %s\n",
               experiment.name.c_str(), plan.size(), plan.size() == 1 ? "" : "s",
               static_cast<size_t>(to_run),
               experiment.search.asha() ? " (asha decides how far)" : "", db.c_str());

  // A child that dies while we write its request must not kill the runner.
  signal(SIGPIPE, SIG_IGN);
  SignalPipe signals;
  Progress progress(stderr, isatty(fileno(stderr)), static_cast<int>(work.trials.size()),
                    work.epochs);
  const SweepContext sweep{store, experiment, options, progress, signals};
  std::optional<AshaDriver> asha;
  if (experiment.search.asha() && options.task_rung < 0)
    asha.emplace(store, experiment.search, plan, work.trials);
  Runs runs(sweep, work, asha ? &*asha : nullptr);
  int interrupted_by = 0;
  try {
    interrupted_by = runs.run();
  } catch (const std::exception& e) {
    // The store failed under us (disk full, file removed): a re-run recovers the trials left
    // running.
    progress.finish();
    std::fprintf(stderr, "dprun: the sweep stopped: %s\n", e.what());
    return 1;
  }
  progress.finish();
  print_summary(store, experiment_id, experiment, db);
  if (interrupted_by) {
    std::fprintf(stderr,
                 "dprun: interrupted by %s; finished epochs are kept. To resume, run the same "
                 "command again:\n  %s\n",
                 signal_name(interrupted_by).c_str(), options.command_line.c_str());
    return 128 + interrupted_by;
  }
  return runs.any_failed() ? 1 : 0;
}

}  // namespace dprun
