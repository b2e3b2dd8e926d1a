// One trial being run by the runner (see trial_run.hpp).
#include "sweep/trial_run.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "base/os.hpp"
#include "dp/process_group.hpp"
#include "dp/version.hpp"
#include "process/checkpoint_files.hpp"
#include "process/launch.hpp"
#include "process/stop_rule.hpp"

namespace dprun {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string after_epoch(int64_t epoch) {
  return epoch > 0 ? "after epoch " + std::to_string(epoch) : "before its first epoch";
}

// The last few non-empty lines the child wrote, for an error message.
std::string tail_text(const std::deque<std::string>& tail, size_t lines) {
  std::vector<std::string> keep;
  for (auto it = tail.rbegin(); it != tail.rend() && keep.size() < lines; ++it)
    if (!it->empty() && it->find_first_not_of("- ") != std::string::npos) keep.push_back(*it);
  std::string out;
  for (auto it = keep.rbegin(); it != keep.rend(); ++it) out += (out.empty() ? "" : " | ") + *it;
  return out;
}

// The status a trial process's final record gives its trial (paused: at a [search] rung).
dps::TrialStatus status_of(TrialRecord::Kind kind) {
  using K = TrialRecord::Kind;
  using S = dps::TrialStatus;
  switch (kind) {
    case K::done:
      return S::done;
    case K::diverged:
      return S::diverged;
    case K::skipped:
      return S::skipped;
    case K::stopped:
      return S::stopped;
    case K::paused:
      return S::pruned;
    default:
      return S::failed;
  }
}

// How long a launcher gets to end its processes on every host before it is killed.
constexpr double kLauncherGrace = 5.0;

}  // namespace

TrialRun::TrialRun(const SweepContext& sweep, const TrialSpec& spec, const dps::TrialRow& row,
                   int index, DeviceSet devices, int64_t stop_after)
    : store_(sweep.store),
      experiment_(sweep.experiment),
      options_(sweep.options),
      progress_(sweep.progress),
      signals_(sweep.signals),
      spec_(spec),
      row_(row),
      index_(index),
      devices_(std::move(devices)),
      stop_after_(stop_after) {}

TrialRun::~TrialRun() = default;

TrialRequest TrialRun::request() const {
  TrialRequest request;
  request.ordinal = spec_.ordinal;
  request.settings = spec_.settings;
  request.model_options = spec_.model_options;
  request.data_path = experiment_.data_path;
  request.run = options_.run;
  request.run.backend = backend_for(options_.run, spec_.settings);
  // Cores given by --jobs: one thread each.
  if (!devices_.exclusive && devices_.kind == DeviceKind::cpu && !devices_.cores.empty())
    request.run.threads = static_cast<int>(devices_.cores.size());
  request.checkpoint_dir = checkpoint_dir_;
  request.resume = resume_;
  request.stop_after_epoch = stop_after_;
  return request;
}

std::optional<ResumePoint> TrialRun::find_resume_point(std::string& problem) {
  const dps::CheckpointRow* last = nullptr;
  const dps::CheckpointRow* best = nullptr;
  const auto rows = store_.checkpoints(row_.id);
  for (const auto& c : rows) {
    if (c.role == "last") last = &c;
    if (c.role == "best") best = &c;
  }
  if (!last) return std::nullopt;
  ResumePoint p;
  p.epoch = last->epoch;
  p.model_path = resolve_checkpoint_path(store_.path(), last->path);
  p.model_sha256 = last->sha256;
  p.optimizer_path = resolve_checkpoint_path(store_.path(), last->optimizer_path);
  p.optimizer_sha256 = last->optimizer_sha256;
  // The files are checked here, before a process starts: a checkpoint that is gone or changed
  // costs the epochs since epoch 1, never a failed trial.
  for (const auto& [path, sha] :
       {std::pair{p.model_path, p.model_sha256}, std::pair{p.optimizer_path, p.optimizer_sha256}}) {
    try {
      const std::string found = checkpoint_file_sha256(path);
      if (found != sha) {
        problem = path + " has changed since it was written (sha256 " + found.substr(0, 12) +
                  "..., recorded " + sha.substr(0, 12) + "...)";
        return std::nullopt;
      }
    } catch (const std::exception& e) {
      problem = e.what();
      return std::nullopt;
    }
  }
  const std::vector<dps::EpochRow> epochs = store_.epochs(row_.id);
  if (best && best->epoch <= p.epoch) {
    for (const auto& e : epochs)
      if (e.epoch == best->epoch) {
        p.best_epoch = e.epoch;
        p.best_test_acc = e.test_acc;
      }
  }
  // What the stopping rule saw before the checkpoint (epochs 1..p.epoch, in order).
  if (const StopRule rule = stop_rule(spec_.settings); rule.active()) {
    for (int64_t e = 1; e <= p.epoch; ++e) {
      double value = std::nan("");
      for (const auto& row : epochs)
        if (row.epoch == e) value = metric_value(row, rule.metric);
      p.stop_history.push_back(value);
    }
  }
  return p;
}

void TrialRun::prepare_checkpoints() {
  const CheckpointMode mode = parse_checkpoint_mode(spec_.settings[key::checkpoint]);
  const std::string dir = trial_checkpoint_dir(store_.path(), row_.id);
  if (mode != CheckpointMode::none) checkpoint_dir_ = dir;
  // A pruned trial resumes when a [search] scheduler promotes it.
  const bool resumable = row_.status == dps::TrialStatus::failed ||
                         row_.status == dps::TrialStatus::interrupted ||
                         row_.status == dps::TrialStatus::pruned;
  const std::string name = "[" + std::to_string(index_) + "] " + trial_display_name(spec_);
  if (mode != CheckpointMode::none && resumable && !options_.run.restart) {
    std::string problem;
    if (auto p = find_resume_point(problem)) {
      resume_ = *p;
      progress_.note(name + ": resuming after epoch " + std::to_string(resume_.epoch) +
                     " from its checkpoint");
    } else if (!problem.empty()) {
      progress_.note(name + ": cannot resume from its last checkpoint (" + problem +
                     "): starting at epoch 1");
    }
  }
  // A start from scratch leaves no file of an earlier attempt behind (its rows go with
  // start_trial): a stale epoch-0007 must not pass for this attempt's.
  if (resume_.epoch == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (ec)
      progress_.note(name + ": cannot remove the earlier checkpoints in " + dir + ": " +
                     ec.message());
  }
  last_epoch_ = resume_.epoch;
}

bool TrialRun::claim() {
  // Another dprun on the same database planned from the same rows: whoever claims the trial
  // first runs it; the other skips it rather than restart it (and drop its epochs).
  if (store_.claim_trial(row_.id, row_.status, getpid(), host_name())) return true;
  TrialOutcome taken;
  taken.taken = true;
  taken.status = dps::TrialStatus::skipped;
  auto now = store_.get_trial(row_.id);
  const dps::TrialStatus status = now ? now->status : dps::TrialStatus::running;
  std::string who;
  if (now && status == dps::TrialStatus::running)
    who = " by another dprun (pid " + std::to_string(now->runner_pid) +
          (now->host.empty() ? "" : " on " + now->host) + ")";
  progress_.note("[" + std::to_string(index_) + "] " + trial_display_name(spec_) +
                 ": skipped: now " + dps::status_name(status) + who);
  outcome_ = taken;
  return false;
}

void TrialRun::start() {
  const int processes = static_cast<int>(spec_.settings[key::processes]);
  const std::string where = devices_.exclusive ? "" : devices_.text();
  progress_.trial_started(index_, trial_display_name(spec_), spec_.settings[key::epochs], where);
  started_at_ = last_beat_ = clock::now();
  prepare_checkpoints();

  SpawnOptions spawn;
  if (options_.run.verbose)
    spawn.on_output_line = [this](const std::string& l) {
      progress_.note("  [" + std::to_string(index_) + "] | " + l);
    };
  if (!devices_.exclusive) {
    if (devices_.kind == DeviceKind::gpu)
      spawn.env.push_back("CUDA_VISIBLE_DEVICES=" + devices_.visible_devices());
    else
      spawn.cores = devices_.cores;
  }
  if (processes > 1) {
    LaunchConfig config = experiment_.launch;
    if (!options_.run.launch.launcher.empty()) config.launcher = options_.run.launch.launcher;
    if (!options_.run.launch.hostfile.empty()) config.hostfile = options_.run.launch.hostfile;
    config.args.insert(config.args.end(), options_.run.launch.args.begin(),
                       options_.run.launch.args.end());
    const char* slurm = std::getenv("SLURM_JOB_ID");
    const std::string launcher = effective_launcher(config, slurm && *slurm);
    const std::string path = find_executable(launcher);
    if (auto problem = launch_problem(processes, dp::mpi_compiled(), launcher, path);
        !problem.empty()) {
      record_start(nullptr);
      finish({dps::TrialStatus::failed, problem, 0, false});
      return;
    }
    spawn.launch =
        launch_command(config, path, processes, {self_exe(), "__trial", "--records", "stdout"},
                       exported_variables());
    launch_text_ = command_text(spawn.launch);
  } else {
    launch_text_ = command_text({self_exe(), "__trial", "--record-fd", "3"});
  }
  child_ = std::make_unique<TrialProcess>(request(), spawn);
}

std::vector<int> TrialRun::poll_fds() const {
  return child_ && !outcome_ ? child_->poll_fds() : std::vector<int>{};
}

double TrialRun::seconds_to_next_duty() const {
  double wait = options_.heartbeat_seconds - seconds_since(last_beat_);
  if (options_.run.trial_timeout > 0)
    wait = std::min(wait, options_.run.trial_timeout - seconds_since(started_at_));
  return wait;
}

void TrialRun::pump() {
  if (outcome_ || !child_) return;
  const auto on_record = [this](const TrialRecord& r) { handle(r); };
  child_->pump(on_record);
  if (seconds_since(last_beat_) >= options_.heartbeat_seconds) {
    store_.heartbeat(row_.id);  // claimed: running from here on, even before its start
    last_beat_ = clock::now();
  }
  bool timed_out = false;
  if (options_.run.trial_timeout > 0 && seconds_since(started_at_) >= options_.run.trial_timeout &&
      !child_->streams_closed()) {
    timed_out = true;
    child_->terminate(child_->launched() ? kLauncherGrace : 0.0);
    child_->pump(on_record);  // records written before the end still count
  } else if (!child_->streams_closed()) {
    return;
  }
  child_->reap();
  TrialOutcome out;
  // Ctrl-C on a terminal signals the whole process group: the trial process can die of it and
  // close its pipes before the runner's loop saw its own SIGINT. Without a result from the
  // child, that is an interrupted trial, not a failed one.
  if (!timed_out && !final_) out.interrupted_by = signals_.received();
  if (out.interrupted_by) {
    out.status = dps::TrialStatus::interrupted;
    out.message = interruption_message(out.interrupted_by);
  } else {
    decide(timed_out, out);
  }
  finish(out);
}

void TrialRun::interrupt(int sig) {
  if (outcome_) return;
  if (child_) child_->terminate(kLauncherGrace);  // SIGTERM, then SIGKILL
  TrialOutcome out;
  out.interrupted_by = sig;
  out.status = dps::TrialStatus::interrupted;
  out.message = interruption_message(sig);
  finish(out);
}

std::string TrialRun::interruption_message(int sig) const {
  if (!options_.interruption_cause) return "interrupted by " + signal_name(sig);
  return options_.interruption_cause(sig) + ", " + after_epoch(last_epoch_);
}

void TrialRun::finish(TrialOutcome out) {
  if (!started_) record_start(nullptr);
  store_.finish_trial(row_.id, out.status, out.message);
  progress_.trial_finished(index_, out.status, out.message);
  // A crash leaves no error record: show what the process said last (its own error record
  // already carries the message).
  if (child_ && out.status == dps::TrialStatus::failed && !final_ && !options_.run.verbose)
    for (const auto& l : child_->stderr_tail())
      if (l.find_first_not_of('-') != std::string::npos) progress_.note("  | " + l);
  outcome_ = out;
}

// The start record, or a stand-in when the child ended without one (so finish_trial always
// follows start_trial and `attempts` counts every try).
void TrialRun::record_start(const TrialRecord* from_child) {
  dps::TrialStart s;
  if (from_child) {
    s = from_child->start;
    rank_hosts_ = from_child->rank_hosts;
  } else {
    s.backend = backend_for(options_.run, spec_.settings);
  }
  s.host = host_name();
  s.dprun_version = dp::version();
  s.runner_pid = getpid();
  s.launch = launch_text_;
  if (!devices_.exclusive) s.device_set = devices_.text();
  store_.start_trial(row_.id, s, resume_.epoch);
  started_ = true;
}

void TrialRun::handle(const TrialRecord& r) {
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
      record_start(&r);
      progress_.trial_running(index_, r.start);
      break;
    case TrialRecord::Kind::epoch: {
      if (!started_) record_start(nullptr);
      dps::EpochRow row = r.epoch;
      row.trial_id = row_.id;
      // Each epoch in its own transaction, as soon as it arrives: a crash later keeps it.
      store_.record_epoch(row);
      last_epoch_ = row.epoch;
      progress_.epoch(index_, row);
      break;
    }
    case TrialRecord::Kind::checkpoint: {
      if (!started_) record_start(nullptr);
      dps::CheckpointRow row = r.checkpoint;
      if ((row.role != "last" && row.role != "best" && row.role != "epoch") || row.epoch < 1 ||
          row.path.empty() || (row.role == "last") == row.optimizer_path.empty()) {
        protocol_error_ = "trial process sent a malformed checkpoint record (role \"" + row.role +
                          "\", epoch " + std::to_string(row.epoch) + ")";
        return;
      }
      row.trial_id = row_.id;
      row.path = stored_checkpoint_path(store_.path(), row.path);
      if (!row.optimizer_path.empty())
        row.optimizer_path = stored_checkpoint_path(store_.path(), row.optimizer_path);
      store_.record_checkpoint(row);
      break;
    }
    default:
      final_ = r;
  }
}

void TrialRun::decide(bool timed_out, TrialOutcome& out) {
  using S = dps::TrialStatus;
  const TrialProcess& child = *child_;
  const int processes = static_cast<int>(spec_.settings[key::processes]);
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
    out.status = status_of(final_->kind);
    out.message = final_->message;
    if (out.status == S::failed)
      out.message = explain_timeout(out.message, processes, child.failure_lines(), rank_hosts_);
    const int64_t epochs = spec_.settings[key::epochs];
    if (out.status == S::done && last_epoch_ < epochs) {
      out.status = S::failed;
      out.message = "trial process reported done after " + std::to_string(last_epoch_) + " of " +
                    std::to_string(epochs) + " epochs";
    }
    return;
  }
  out.status = S::failed;
  // Who ended without a result: the trial process, or the launcher of its processes.
  const std::string who = child.launched()
                              ? std::filesystem::path(child.program()).filename().string()
                              : std::string("trial process");
  if (timed_out) {
    out.message = "timed out after " + Progress::duration(options_.run.trial_timeout) +
                  " (--trial-timeout), " + after_epoch(last_epoch_);
  } else if (!protocol_error_.empty()) {
    out.message = protocol_error_;
  } else if (auto f = launcher_failure(child.failure_lines(), after_epoch(last_epoch_));
             !f.empty()) {
    // Process 0 went without a word: when another process reports a timeout, process 0 may
    // be the one that stopped responding.
    out.message = f;
    for (const auto& line : child.failure_lines())
      if (auto report = parse_rank_report(line)) {
        out.message =
            explain_timeout(f, processes, child.failure_lines(), rank_hosts_, report->rank);
        break;
      }
  } else if (int sig = child.term_signal()) {
    out.message = who + " killed by signal " + std::to_string(sig) + " (" + signal_name(sig) +
                  ") " + after_epoch(last_epoch_);
    if (auto t = tail_text(child.stderr_tail(), 3); !t.empty()) out.message += ": " + t;
  } else if (child.exit_code() != 0) {
    out.message = who + " exited with status " + std::to_string(child.exit_code()) + " " +
                  after_epoch(last_epoch_);
    if (auto t = tail_text(child.stderr_tail(), 5); !t.empty()) out.message += ": " + t;
    if (out.message.find("run as root") != std::string::npos)
      out.message +=
          " (to let mpirun run as root, set OMPI_ALLOW_RUN_AS_ROOT=1 and "
          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)";
  } else {
    out.message = who + " exited without reporting a result " + after_epoch(last_epoch_);
  }
}

}  // namespace dprun
