#include "progress.hpp"

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

std::string Progress::prefix() const {
  // Appends, not operator+ chains: GCC 12 warns falsely (-Wrestrict) on "lit" + string.
  std::string p = "[";
  p += std::to_string(index_);
  p += '/';
  p += std::to_string(trials_);
  p += "] ";
  p += name_;
  return p;
}

void Progress::clear_line() {
  if (live_ && line_shown_) {
    std::fputs("\r\033[K", out_);
    line_shown_ = false;
  }
}

double Progress::mean_epoch_seconds() const {
  if (epoch_ > 1) return (trial_seconds_ - first_epoch_seconds_) / double(epoch_ - 1);
  return epoch_ > 0 ? trial_seconds_ / double(epoch_) : 0.0;
}

void Progress::draw() {
  if (!live_ || index_ == 0) return;
  // The epoch in progress (the last one once all are done).
  const int64_t shown = std::min(epoch_ + 1, trial_epochs_);
  std::string line =
      prefix() + "  epoch " + std::to_string(shown) + "/" + std::to_string(trial_epochs_);
  char buf[128];
  if (last_test_acc_ >= 0) {
    std::snprintf(buf, sizeof buf, "  test_acc %.3f", last_test_acc_);
    line += buf;
  }
  if (epoch_ > 0) line += "  " + duration(mean_epoch_seconds()) + "/epoch";
  const double running = std::chrono::duration<double>(clock::now() - epoch_started_).count();
  line += "  (" + duration(running) + ")";
  if (epochs_finished_ > 0) {
    const double per_epoch = seconds_finished_ / double(epochs_finished_);
    const double left = double(epochs_total_ - epochs_finished_) * per_epoch - running;
    line += "  ETA " + duration(left > 0 ? left : 0);
  }
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  std::fflush(out_);
  line_shown_ = true;
}

void Progress::trial_started(int index, const std::string& name, int64_t epochs) {
  index_ = index;
  name_ = name;
  trial_epochs_ = epochs;
  epoch_ = 0;
  last_test_acc_ = -1;
  trial_seconds_ = 0;
  first_epoch_seconds_ = 0;
  epoch_started_ = clock::now();
  if (live_) {
    draw();
  } else {
    std::fprintf(out_, "%s starting (%lld epochs)\n", prefix().c_str(),
                 static_cast<long long>(epochs));
    std::fflush(out_);
  }
}

void Progress::epoch(const dps::EpochRow& row) {
  const double wall = std::chrono::duration<double>(clock::now() - epoch_started_).count();
  epoch_started_ = clock::now();
  epoch_ = row.epoch;
  last_test_acc_ = row.test_acc;
  trial_seconds_ += row.seconds;
  if (row.epoch == 1) first_epoch_seconds_ = row.seconds;
  ++epochs_finished_;
  seconds_finished_ += wall;
  if (live_) {
    draw();
    return;
  }
  std::fprintf(out_, "%s epoch %lld/%lld loss %.3f train_acc %.3f test_acc %.3f %s\n",
               prefix().c_str(), static_cast<long long>(row.epoch),
               static_cast<long long>(trial_epochs_), row.train_loss, row.train_acc, row.test_acc,
               duration(row.seconds).c_str());
  std::fflush(out_);
}

void Progress::trial_finished(dps::TrialStatus status, const std::string& message) {
  // Epochs this trial will not run no longer count towards the ETA.
  if (epoch_ < trial_epochs_) epochs_total_ -= trial_epochs_ - epoch_;
  clear_line();
  std::string line = prefix() + " " + dps::status_name(status);
  if (status == dps::TrialStatus::done && epoch_ > 0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ": test_acc %.3f, %s/epoch", last_test_acc_,
                  duration(mean_epoch_seconds()).c_str());
    line += buf;
  }
  if (!message.empty()) line += ": " + message;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
  index_ = 0;
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
