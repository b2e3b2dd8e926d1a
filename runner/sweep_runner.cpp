// Running a sweep: reconcile its trials with the store, then run those that need it, each in its
// own process, recording every epoch as it arrives. Loading and planning: sweep_plan.cpp.
#include "sweep_runner.hpp"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "dp/version.hpp"
#include "progress.hpp"
#include "report.hpp"
#include "trial_process.hpp"

namespace dprun {

namespace fs = std::filesystem;

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,@+") == std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// ---- running
// -------------------------------------------------------------------------------------

namespace {

using clock = std::chrono::steady_clock;

double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

struct TrialOutcome {
  dps::TrialStatus status = dps::TrialStatus::failed;
  std::string message;
  int interrupted_by = 0;  // SIGINT / SIGTERM received by the runner
  bool taken = false;      // another dprun claimed or finished it since the plan: not run here
};

std::string after_epoch(int64_t epoch) {
  return epoch > 0 ? "after epoch " + std::to_string(epoch) : "before its first epoch";
}

// The last few non-empty lines the child wrote, for an error message.
std::string tail_text(const std::deque<std::string>& tail, size_t lines) {
  std::vector<std::string> keep;
  for (auto it = tail.rbegin(); it != tail.rend() && keep.size() < lines; ++it)
    if (!it->empty()) keep.push_back(*it);
  std::string out;
  for (auto it = keep.rbegin(); it != keep.rend(); ++it) out += (out.empty() ? "" : " | ") + *it;
  return out;
}

class SweepRun {
 public:
  SweepRun(dps::Store& store, const Experiment& experiment, const SweepOptions& options,
           Progress& progress, SignalPipe& signals)
      : store_(store),
        experiment_(experiment),
        options_(options),
        progress_(progress),
        signals_(signals) {}

  TrialOutcome run(const TrialSpec& spec, const dps::TrialRow& row, int index) {
    TrialRequest request;
    request.ordinal = spec.ordinal;
    request.settings = spec.settings;
    request.model_options = spec.model_options;
    request.data_path = experiment_.data_path;
    request.plugin_dirs = options_.plugin_dirs;
    request.backend =
        options_.backend.empty() ? spec.settings.text("backend_request") : options_.backend;
    request.oversubscribe = options_.oversubscribe;
    request.threads = options_.threads;

    // Another dprun on the same database planned from the same rows: whoever claims the trial
    // first runs it; the other skips it rather than restart it (and drop its epochs).
    if (!store_.claim_trial(row.id, row.status, getpid(), host_name())) {
      TrialOutcome taken;
      taken.taken = true;
      taken.status = dps::TrialStatus::skipped;
      auto now = store_.get_trial(row.id);
      const dps::TrialStatus status = now ? now->status : dps::TrialStatus::running;
      std::string who;
      if (now && status == dps::TrialStatus::running)
        who = " by another dprun (pid " + std::to_string(now->runner_pid) +
              (now->host.empty() ? "" : " on " + now->host) + ")";
      progress_.note("[" + std::to_string(index) + "] " + trial_display_name(spec) +
                     ": skipped: now " + dps::status_name(status) + who);
      return taken;
    }
    progress_.trial_started(index, trial_display_name(spec), spec.settings.integer("epochs"));
    SpawnOptions spawn;
    if (options_.verbose)
      spawn.on_output_line = [this](const std::string& l) { progress_.note("  | " + l); };
    TrialProcess child(request, spawn);

    trial_id_ = row.id;
    epochs_ = spec.settings.integer("epochs");
    started_ = false;
    last_epoch_ = 0;
    final_.reset();
    protocol_error_.clear();
    const auto on_record = [&](const TrialRecord& r) { handle(r, request); };

    const auto t0 = clock::now();
    auto last_beat = clock::now();
    TrialOutcome out;
    bool timed_out = false;
    while (!child.streams_closed()) {
      std::vector<pollfd> fds;
      for (int fd : child.poll_fds()) fds.push_back({fd, POLLIN, 0});
      fds.push_back({signals_.fd(), POLLIN, 0});
      double wait = options_.heartbeat_seconds - seconds_since(last_beat);
      if (options_.trial_timeout > 0)
        wait = std::min(wait, options_.trial_timeout - seconds_since(t0));
      wait = std::clamp(wait, 0.0, 1.0);  // at least once a second for the live line
      int rc = ::poll(fds.data(), fds.size(), static_cast<int>(wait * 1000) + 1);
      if (rc < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
      if (int sig = signals_.received()) {
        out.interrupted_by = sig;
        break;
      }
      child.pump(on_record);
      if (seconds_since(last_beat) >= options_.heartbeat_seconds) {
        store_.heartbeat(trial_id_);  // claimed: running from here on, even before its start
        last_beat = clock::now();
      }
      if (options_.trial_timeout > 0 && seconds_since(t0) >= options_.trial_timeout &&
          !child.streams_closed()) {
        timed_out = true;
        child.send(SIGKILL);
        child.reap();
        child.pump(on_record);  // records written before the kill still count
        break;
      }
      progress_.tick();
    }

    if (!out.interrupted_by && !timed_out) {
      child.reap();
      // Ctrl-C on a terminal signals the whole process group: the trial process can die of it
      // and close its pipes before the loop above saw the runner's own SIGINT. Without a
      // result from the child, that is an interrupted trial, not a failed one.
      if (!final_) out.interrupted_by = signals_.received();
    }
    if (out.interrupted_by) {
      stop(child);
      out.status = dps::TrialStatus::interrupted;
      out.message = "interrupted by " + signal_name(out.interrupted_by);
    } else {
      child.reap();
      decide(child, timed_out, out);
    }
    if (!started_) start(nullptr, request);
    store_.finish_trial(trial_id_, out.status, out.message);
    progress_.trial_finished(out.status, out.message);
    // A crash leaves no error record: show what the process said last (its own error record
    // already carries the message).
    if (out.status == dps::TrialStatus::failed && !final_ && !options_.verbose)
      for (const auto& l : child.stderr_tail()) progress_.note("  | " + l);
    return out;
  }

 private:
  // The start record, or a stand-in when the child ended without one (so finish_trial always
  // follows start_trial and `attempts` counts every try).
  void start(const dps::TrialStart* from_child, const TrialRequest& request) {
    dps::TrialStart s;
    if (from_child) {
      s = *from_child;
    } else {
      s.backend = request.backend;
    }
    s.host = host_name();
    s.dprun_version = dp::version();
    s.runner_pid = getpid();
    store_.start_trial(trial_id_, s);
    started_ = true;
  }

  void handle(const TrialRecord& r, const TrialRequest& request) {
    if (final_) {
      if (protocol_error_.empty()) protocol_error_ = "trial process wrote records after its result";
      return;
    }
    switch (r.kind) {
      case TrialRecord::Kind::start:
        if (started_) {
          protocol_error_ = "trial process sent two start records";
          return;
        }
        start(&r.start, request);
        break;
      case TrialRecord::Kind::epoch: {
        if (!started_) start(nullptr, request);
        dps::EpochRow row = r.epoch;
        row.trial_id = trial_id_;
        // Each epoch in its own transaction, as soon as it arrives: a crash later keeps it.
        store_.record_epoch(row);
        last_epoch_ = row.epoch;
        progress_.epoch(row);
        break;
      }
      default:
        final_ = r;
    }
  }

  // SIGTERM, then SIGKILL if the child has not gone within a few seconds.
  void stop(TrialProcess& child) {
    child.send(SIGTERM);
    const auto t0 = clock::now();
    while (!child.try_reap()) {
      if (seconds_since(t0) > 5) {
        child.send(SIGKILL);
        child.reap();
        break;
      }
      ::poll(nullptr, 0, 20);
    }
  }

  void decide(const TrialProcess& child, bool timed_out, TrialOutcome& out) {
    using S = dps::TrialStatus;
    // A record line that could not be read may have been an epoch: the trial's rows cannot be
    // trusted to be complete, whatever its final record says.
    if (protocol_error_.empty() && !child.protocol_error().empty())
      protocol_error_ = child.protocol_error();
    if (!protocol_error_.empty() && !timed_out) {
      out.status = S::failed;
      out.message = protocol_error_;
      return;
    }
    if (final_) {
      switch (final_->kind) {
        case TrialRecord::Kind::done:
          out.status = S::done;
          break;
        case TrialRecord::Kind::diverged:
          out.status = S::diverged;
          break;
        case TrialRecord::Kind::skipped:
          out.status = S::skipped;
          break;
        default:
          out.status = S::failed;
          break;
      }
      out.message = final_->message;
      if (out.status == S::done && last_epoch_ < experiment_epochs()) {
        out.status = S::failed;
        out.message = "trial process reported done after " + std::to_string(last_epoch_) + " of " +
                      std::to_string(experiment_epochs()) + " epochs";
      }
      return;
    }
    out.status = S::failed;
    if (timed_out) {
      out.message = "timed out after " + Progress::duration(options_.trial_timeout) +
                    " (--trial-timeout), " + after_epoch(last_epoch_);
    } else if (!protocol_error_.empty()) {
      out.message = protocol_error_;
    } else if (int sig = child.term_signal()) {
      out.message = "trial process killed by signal " + std::to_string(sig) + " (" +
                    signal_name(sig) + ") " + after_epoch(last_epoch_);
      if (auto t = tail_text(child.stderr_tail(), 3); !t.empty()) out.message += ": " + t;
    } else if (child.exit_code() != 0) {
      out.message = "trial process exited with status " + std::to_string(child.exit_code()) + " " +
                    after_epoch(last_epoch_);
      if (auto t = tail_text(child.stderr_tail(), 5); !t.empty()) out.message += ": " + t;
    } else {
      out.message = "trial process exited without reporting a result " + after_epoch(last_epoch_);
    }
  }

  int64_t experiment_epochs() const { return epochs_; }

  dps::Store& store_;
  const Experiment& experiment_;
  const SweepOptions& options_;
  Progress& progress_;
  SignalPipe& signals_;
  int64_t trial_id_ = 0;
  bool started_ = false;
  int64_t last_epoch_ = 0;
  std::optional<TrialRecord> final_;
  std::string protocol_error_;
  int64_t epochs_ = 0;  // of the trial being run
};

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
  table.push_back({"trial", "status", "epochs", "test_acc", "s/epoch", "note"});
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
                     note});
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

}  // namespace

int run_sweep(const SweepOptions& options) {
  if (options.dry_run) return plan_sweep(options);
  Experiment experiment = load_sweep(options);
  const std::string db = database_path(experiment, options);

  dps::Store store(db, dps::Store::Mode::read_write, experiment.settings->store_columns());
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
  const auto plan = plan_trials(experiment, stored, options);

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
  SweepRun runner(store, experiment, options, progress, signals);
  bool any_failed = false;
  int interrupted_by = 0;
  int index = 0;
  try {
    for (const PlannedTrial* p : to_run) {
      if (int sig = signals.received()) {  // arrived between two trials
        interrupted_by = sig;
        break;
      }
      ++index;
      TrialOutcome out = runner.run(*p->spec, *p->row, index);
      if (out.status == dps::TrialStatus::failed || out.status == dps::TrialStatus::diverged)
        any_failed = true;
      if (out.interrupted_by) {
        interrupted_by = out.interrupted_by;
        break;
      }
    }
  } catch (const std::exception& e) {
    // The store failed under us (disk full, file removed): the trial process is gone with its
    // TrialProcess; what was written stays, and a re-run recovers the trial left running.
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
