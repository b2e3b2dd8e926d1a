// Running a sweep: reconcile its trials with the store, then run those that need it, each in its
// own process (trial_run.cpp), as many at once as the scheduler lets, recording every epoch as
// it arrives. Loading and planning: sweep_plan.cpp.
#include "sweep/sweep_runner.hpp"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "base/os.hpp"
#include "base/text.hpp"
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

  auto fixed = [](const std::optional<double>& v, const char* fmt) -> std::string {
    if (!v) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, fmt, *v);
    return buf;
  };
  std::vector<std::vector<std::string>> table;
  table.push_back({"trial", "status", "epochs", "test_acc", "s/epoch", "devices", "note"});
  for (const TrialSpec& spec : experiment.trials) {
    auto found = by_hash.find(spec.config_hash);
    if (found == by_hash.end()) continue;
    const dps::TrialSummary& t = found->second;
    std::string note = t.trial.error;
    if (auto nl = note.find('\n'); nl != std::string::npos) note = note.substr(0, nl);
    if (note.size() > 80) note = note.substr(0, 77) + "...";
    table.push_back({trial_display_name(spec), dps::status_name(t.trial.status),
                     std::to_string(t.trial.epochs_done) + "/" +
                         std::to_string(spec.settings.integer("epochs")),
                     fixed(t.final_test_acc, "%.4f"), fixed(t.mean_seconds_per_epoch, "%.2f"),
                     devices_text(t.trial, spec.settings.integer("processes")), note});
  }
  std::printf("\nexperiment %s:\n", experiment.name.c_str());
  std::fputs(format_aligned(table, "  ").c_str(), stdout);
  std::printf("\ndatabase: %s\n", db.c_str());
  std::printf(
      "try: dprun query --db %s \"SELECT model, gpus, batch_size, lr, final_test_acc, "
      "mean_seconds_per_epoch FROM trial_summary\"\n",
      shell_quote(db).c_str());
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
    const std::string backend =
        options.backend.empty() ? p->spec->settings.text("backend_request") : options.backend;
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
  const std::string launcher =
      !options.launch.launcher.empty() ? options.launch.launcher : experiment.launch.launcher;
  const bool remote = !options.launch.hostfile.empty() || !experiment.launch.hostfile.empty() ||
                      launcher == "srun" || (launcher.empty() && std::getenv("SLURM_JOB_ID"));
  need.exclusive = options.jobs == 1 || (spec.settings.integer("processes") > 1 && remote);
  const std::string backend =
      options.backend.empty() ? spec.settings.text("backend_request") : options.backend;
  const int gpus = static_cast<int>(spec.settings.integer("gpus"));
  need.kind = backend == "cuda" || (backend == "auto" && !inventory.gpus.empty()) ? DeviceKind::gpu
                                                                                  : DeviceKind::cpu;
  need.count = need.kind == DeviceKind::gpu ? gpus : options.threads > 0 ? options.threads : gpus;
  return need;
}

}  // namespace

int run_experiment(const Experiment& experiment, const SweepOptions& options,
                   const HeldElsewhere& elsewhere) {
  const std::string db = database_path(experiment, options);

  dps::Store store(db, dps::Store::Mode::read_write, experiment.settings->store_columns(),
                   options.journal);
  const int64_t experiment_id =
      store.upsert_experiment(experiment.name, experiment.description, experiment.source);
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

  std::vector<const PlannedTrial*> to_run;
  int64_t epochs_to_run = 0;
  for (const auto& p : plan)
    if (p.action == TrialAction::run) {
      to_run.push_back(&p);
      epochs_to_run += p.spec->settings.integer("epochs");
    }
  std::fprintf(stderr, "dprun: experiment %s: %zu trial%s, %zu to run, database %s\n",
               experiment.name.c_str(), plan.size(), plan.size() == 1 ? "" : "s", to_run.size(),
               db.c_str());

  // A child that dies while we write its request must not kill the runner.
  signal(SIGPIPE, SIG_IGN);
  SignalPipe signals;
  const bool live = isatty(fileno(stderr));
  Progress progress(stderr, live, static_cast<int>(to_run.size()), epochs_to_run);
  Scheduler scheduler(devices_for(to_run, options), options.jobs);
  for (size_t i = 0; i < to_run.size(); ++i)
    scheduler.add(static_cast<int>(i),
                  device_need(*to_run[i]->spec, experiment, options, scheduler.inventory()));
  std::map<int, std::unique_ptr<TrialRun>> running;  // by position in to_run
  bool any_failed = false;
  int interrupted_by = 0;
  // A trial that ended: its devices go to the next ones.
  auto ended = [&](int i, const TrialOutcome& out) {
    if (out.status == dps::TrialStatus::failed || out.status == dps::TrialStatus::diverged)
      any_failed = true;
    if (out.interrupted_by && !interrupted_by) interrupted_by = out.interrupted_by;
    scheduler.release(i);
  };
  try {
    while (!interrupted_by) {
      if (int sig = signals.received()) {
        interrupted_by = sig;
        break;
      }
      for (const auto& [i, devices] : scheduler.start_now()) {
        const PlannedTrial& p = *to_run[static_cast<size_t>(i)];
        auto run = std::make_unique<TrialRun>(store, experiment, options, progress, signals,
                                              *p.spec, *p.row, i + 1, devices);
        if (run->claim()) run->start();
        if (run->done())
          ended(i, run->outcome());
        else
          running.emplace(i, std::move(run));
      }
      if (running.empty()) {
        if (scheduler.waiting() && scheduler.running() == 0)
          throw std::logic_error("the scheduler has trials waiting that fit nowhere");
        if (!scheduler.waiting()) break;
        continue;  // the trials just started were taken or failed at once: start the next ones
      }
      std::vector<pollfd> fds;
      double wait = 1.0;  // at least once a second for the live line
      for (const auto& [i, run] : running) {
        for (int fd : run->poll_fds()) fds.push_back({fd, POLLIN, 0});
        wait = std::min(wait, run->seconds_to_next_duty());
      }
      fds.push_back({signals.fd(), POLLIN, 0});
      wait = std::max(wait, 0.0);
      int rc = ::poll(fds.data(), fds.size(), static_cast<int>(wait * 1000) + 1);
      if (rc < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
      if (int sig = signals.received()) {
        interrupted_by = sig;
        break;
      }
      for (auto it = running.begin(); it != running.end();) {
        it->second->pump();
        if (it->second->done()) {
          ended(it->first, it->second->outcome());
          it = running.erase(it);
        } else {
          ++it;
        }
      }
      progress.tick();
    }
    for (auto& [i, run] : running) {
      run->interrupt(interrupted_by);
      ended(i, run->outcome());
    }
    running.clear();
  } catch (const std::exception& e) {
    // The store failed under us (disk full, file removed): the trial processes go with their
    // TrialRuns; what was written stays, and a re-run recovers the trials left running.
    running.clear();
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
  return any_failed ? 1 : 0;
}

}  // namespace dprun
