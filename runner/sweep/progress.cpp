#include "sweep/progress.hpp"

#include <algorithm>
#include <cmath>

namespace dprun {

Progress::Progress(std::FILE* out, bool live, int trials, int64_t epochs)
    : out_(out), live_(live), trials_(trials), epochs_total_(epochs) {}

std::string Progress::duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    const long t = std::lround(s);
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  } else {
    const long t = std::lround(s / 60);
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 60, t % 60);
  }
  return buf;
}

std::string Progress::prefix(int index) const {
  // Appends, not operator+ chains: GCC 12 warns falsely (-Wrestrict) on "lit" + string.
  std::string p = "[";
  p += std::to_string(index);
  p += '/';
  p += std::to_string(trials_);
  p += "] ";
  auto it = running_.find(index);
  if (it != running_.end()) p += it->second.name;
  return p;
}

void Progress::clear_line() {
  if (live_ && line_shown_) {
    std::fputs("\r\033[K", out_);
    line_shown_ = false;
  }
}

double Progress::Trial::mean_epoch_seconds() const {
  if (epochs_seen > 1) return (seconds - first_epoch_seconds) / double(epochs_seen - 1);
  return epochs_seen > 0 ? seconds / double(epochs_seen) : 0.0;
}

void Progress::draw() {
  if (!live_ || running_.empty()) return;
  std::string line;
  char buf[128];
  for (const auto& [index, t] : running_) {
    // The epoch in progress (the last one once all are done).
    const int64_t shown = std::min(t.epoch + 1, t.epochs);
    if (!line.empty()) line += "  |  ";
    // One trial: its name; several: their positions only, to fit one line.
    if (running_.size() == 1) {
      line += prefix(index);
    } else {
      line += '[';
      line += std::to_string(index);
      line += ']';
    }
    line += " epoch ";
    line += std::to_string(shown);
    line += '/';
    line += std::to_string(t.epochs);
    if (t.last_test_acc >= 0) {
      std::snprintf(buf, sizeof buf, " test_acc %.3f", t.last_test_acc);
      line += buf;
    }
    if (t.epochs_seen > 0) {
      line += ' ';
      line += duration(t.mean_epoch_seconds());
      line += "/epoch";
    }
    if (running_.size() == 1) {
      const double running = std::chrono::duration<double>(clock::now() - t.epoch_started).count();
      line += "  (";
      line += duration(running);
      line += ')';
    }
  }
  if (epochs_finished_ > 0) {
    // Trials at once share the remaining epochs.
    const double per_epoch = seconds_finished_ / double(epochs_finished_);
    const double left = double(epochs_total_ - epochs_finished_) * per_epoch /
                        double(std::max<size_t>(1, running_.size()));
    line += "  ETA " + duration(left > 0 ? left : 0);
  }
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  std::fflush(out_);
  line_shown_ = true;
}

void Progress::trial_started(int index, const std::string& name, int64_t epochs,
                             const std::string& where) {
  Trial& t = running_[index];
  t = Trial{};
  t.name = name;
  t.epochs = epochs;
  t.epoch_started = clock::now();
  if (live_) {
    draw();
  } else {
    std::fprintf(out_, "%s starting (%lld epochs%s)\n", prefix(index).c_str(),
                 static_cast<long long>(epochs), where.empty() ? "" : (", " + where).c_str());
    std::fflush(out_);
  }
}

void Progress::trial_running(int index, const dps::TrialStart& start) {
  if (running_.find(index) == running_.end()) return;
  const std::string& backend = start.backend;
  std::string line = prefix(index) + " on " + backend + ": " + start.devices;
  if (start.oversubscribed) line += " (oversubscribed: replicas share GPUs)";
  if (backend == "cuda" && !start.layout_used.empty() && start.graphs_used >= 0)
    line += std::string(" (") + start.layout_used +
            (start.graphs_used == 1 ? ", CUDA graphs" : ", no CUDA graphs") + ")";
  // `gpus` counts replicas; without a GPU they are CPU threads, which a user should not have to
  // guess from a setting named gpus.
  if (backend == "cpu") line += " (CPU backend: each replica is a CPU thread)";
  note(line);
}

void Progress::epoch(int index, const dps::EpochRow& row) {
  auto it = running_.find(index);
  if (it == running_.end()) return;
  Trial& t = it->second;
  const double wall = std::chrono::duration<double>(clock::now() - t.epoch_started).count();
  t.epoch_started = clock::now();
  t.epoch = row.epoch;
  t.last_test_acc = row.test_acc;
  t.seconds += row.seconds;
  if (++t.epochs_seen == 1) t.first_epoch_seconds = row.seconds;
  ++epochs_finished_;
  seconds_finished_ += wall;
  if (live_) {
    draw();
    return;
  }
  std::fprintf(out_, "%s epoch %lld/%lld loss %.3f train_acc %.3f test_acc %.3f %s\n",
               prefix(index).c_str(), static_cast<long long>(row.epoch),
               static_cast<long long>(t.epochs), row.train_loss, row.train_acc, row.test_acc,
               duration(row.seconds).c_str());
  std::fflush(out_);
}

void Progress::trial_finished(int index, dps::TrialStatus status, const std::string& message) {
  auto it = running_.find(index);
  if (it == running_.end()) return;
  const Trial& t = it->second;
  // Epochs this trial will not run no longer count towards the ETA.
  if (t.epoch < t.epochs) epochs_total_ -= t.epochs - t.epoch;
  clear_line();
  std::string line = prefix(index) + " " + dps::status_name(status);
  if (status == dps::TrialStatus::done && t.epochs_seen > 0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ": test_acc %.3f, %s/epoch", t.last_test_acc,
                  duration(t.mean_epoch_seconds()).c_str());
    line += buf;
  }
  if (!message.empty()) line += ": " + message;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
  running_.erase(it);
  draw();
}

void Progress::note(const std::string& text) {
  clear_line();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
  draw();
}

void Progress::tick() {
  if (live_) draw();
}

void Progress::finish() { clear_line(); }

}  // namespace dprun
