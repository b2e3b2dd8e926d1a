// `dprun status` while a sweep runs (cli/status_view.hpp): the ETA arithmetic and the layout on
// synthetic trials, a database built here (local trials, and a Slurm task's own database read
// read-only before any merge, with squeue played by a script), and a real LeNet sweep held at
// an epoch by DPRUN_FAULT=hang, observed once and with --watch. Nothing waits on time: every
// wait is for an event (epochs in the database, a line in an output, a process's end).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>

#include "cli/status_view.hpp"
#include "cli_helpers.hpp"
#include "settings/settings.hpp"
#include "support/env_var.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using dprun::cli::TrialProgress;
using dps::Store;
using dps::TrialStatus;

namespace fs = std::filesystem;

namespace {

TrialProgress trial(const std::string& name, const std::string& state, int64_t epoch,
                    int64_t epochs, std::optional<double> seconds, const std::string& shape) {
  TrialProgress t;
  t.name = name;
  t.state = state;
  t.epoch = epoch;
  t.epochs = epochs;
  t.seconds_per_epoch = seconds;
  t.shape = shape;
  return t;
}

// The lines of a text that contain `word`.
std::vector<std::string> lines_with(const std::string& text, const std::string& word) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    if (line.find(word) != std::string::npos) out.push_back(line);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// A trial's settings as the store records them: LeNet, `epochs` epochs, `gpus` GPUs.
dps::SettingValues settings(int64_t epochs, int64_t gpus, double lr) {
  dps::SettingValues s = dprun::to_store(dprun::TrialSettings());
  s["model"] = std::string("lenet");
  s["epochs"] = epochs;
  s["gpus"] = gpus;
  s["lr"] = lr;
  return s;
}

void add_epochs(Store& store, int64_t trial, int from, int to, double seconds) {
  for (int e = from; e <= to; ++e) {
    dps::EpochRow row;
    row.trial_id = trial;
    row.epoch = e;
    row.train_loss = 1.0 / e;
    row.test_acc = 0.5 + 0.01 * e;
    row.seconds = e == 1 ? 10 * seconds : seconds;  // a slow first epoch: left out of the mean
    store.record_epoch(row);
  }
}

void write_script(const std::string& path, const std::string& body) {
  clitest::write_file(path, "#!/bin/sh\n" + body);
  ::chmod(path.c_str(), 0755);
}

}  // namespace

TEST_CASE("status: seconds per epoch and ETAs, never guessed", "[status]") {
  using namespace dprun::cli;
  CHECK_FALSE(mean_epoch_seconds({}).has_value());
  CHECK(*mean_epoch_seconds({7}) == Approx(7));          // one epoch: itself, warm-up and all
  CHECK(*mean_epoch_seconds({9, 1, 2}) == Approx(1.5));  // epoch 1 left out when there are more

  const std::map<std::string, double> by_shape{{"a", 2.0}};
  CHECK(*trial_eta(trial("t", "running", 3, 10, 1.5, "a"), by_shape) == Approx(10.5));
  CHECK(*trial_eta(trial("t", "not run", 0, 10, std::nullopt, "a"), by_shape) == Approx(20));
  CHECK(*trial_eta(trial("t", "running", 10, 10, 1.5, "a"), by_shape) == Approx(0));
  CHECK_FALSE(trial_eta(trial("t", "not run", 0, 10, std::nullopt, "b"), by_shape));  // no timing
  CHECK_FALSE(trial_eta(trial("t", "running", 2, 0, 1.0, "a"), by_shape));  // epochs unknown
  CHECK_FALSE(trial_eta(trial("t", "done", 10, 10, 1.0, "a"), by_shape));
  CHECK_FALSE(trial_eta(trial("t", "failed", 3, 10, 1.0, "a"), by_shape));

  // Two running (7 s and 3 s left at 1 s/epoch), one done (its 1 s/epoch times shape "a"), two
  // of shape "a" not run: 20 epochs x 1 s. 30 s of work, 2 at a time: 15 s.
  std::vector<TrialProgress> trials{
      trial("r1", "running", 3, 10, 1.0, "a"), trial("r2", "running", 7, 10, 1.0, "a"),
      trial("d", "done", 10, 10, 1.0, "a"), trial("n1", "not run", 0, 10, std::nullopt, "a"),
      trial("n2", "not run", 0, 10, std::nullopt, "a")};
  SweepEta eta = sweep_eta(trials);
  CHECK(eta.left == 4);
  CHECK(eta.untimed == 0);
  CHECK(eta.at_once == 2);
  CHECK(eta.epochs_done == 20);
  CHECK(eta.epochs_total == 50);
  REQUIRE(eta.seconds);
  CHECK(*eta.seconds == Approx(15));
  // Never less than the longest running trial: one left, 7 s; the other trial's 1 s.
  eta =
      sweep_eta({trial("r1", "running", 3, 10, 1.0, "a"), trial("r2", "running", 9, 10, 1.0, "a")});
  CHECK(*eta.seconds == Approx(7));
  // Nothing running: one trial at a time.
  eta = sweep_eta(
      {trial("d", "done", 4, 4, 2.0, "a"), trial("n", "not run", 0, 4, std::nullopt, "a")});
  CHECK(eta.at_once == 1);
  CHECK(*eta.seconds == Approx(8));
  // A trial of another shape, with no timing of its own: the sweep's ETA is unknown.
  trials.push_back(trial("big", "not run", 0, 10, std::nullopt, "b"));
  eta = sweep_eta(trials);
  CHECK_FALSE(eta.seconds.has_value());
  CHECK(eta.untimed == 1);

  CHECK(format_duration(0) == "0s");
  CHECK(format_duration(0.3) == "<1s");
  CHECK(format_duration(59.4) == "59s");
  CHECK(format_duration(125) == "2m05s");
  CHECK(format_duration(3725) == "1h02m");
  CHECK(format_duration(90061) == "1d01h");
  CHECK(format_duration(-3) == "0s");
}

TEST_CASE("status: the layout, bounded for sweeps of hundreds of trials", "[status]") {
  using namespace dprun::cli;
  SweepStatus sweep;
  sweep.experiment = "big";
  sweep.active = true;
  sweep.rerun_command = "dprun run big.toml";
  for (int i = 0; i < 2; ++i) {
    TrialProgress t = trial("run" + std::to_string(i), "running", 3, 10, 2.0, "a");
    t.id = i + 1;
    t.train_loss = 0.25;
    t.test_acc = 0.875;
    t.devices = "gpus " + std::to_string(i);
    sweep.trials.push_back(t);
  }
  for (int i = 0; i < 10; ++i) {
    TrialProgress t = trial("bad" + std::to_string(i), "failed", 1, 10, 2.0, "a");
    t.why = "injected fault " + std::to_string(i);
    sweep.trials.push_back(t);
  }
  for (int i = 0; i < 60; ++i)
    sweep.trials.push_back(trial("next" + std::to_string(i), "not run", 0, 10, std::nullopt, "a"));
  for (int i = 0; i < 28; ++i)
    sweep.trials.push_back(trial("old" + std::to_string(i), "done", 10, 10, 2.0, "a"));

  StatusLayout layout;
  layout.max_trials = 12;
  const std::string text = format_status(sweep, layout);
  INFO(text);
  CHECK_THAT(text,
             Contains("experiment big: 100 trials: 28 done, 2 running, 10 failed, 60 not run\n"));
  // 2 running x 7 epochs + 60 x 10 epochs, at 2 s each, 2 at a time.
  CHECK_THAT(text, Contains("progress: 296/1000 epochs; ETA 10m14s for the 62 trials left, 2 at a "
                            "time (as many as run now)"));
  // The running ones, then 5 next to run and 5 failed ones with their reason.
  CHECK(lines_with(text, " running ").size() == 2);
  CHECK(lines_with(text, "  not run  ").size() == 5);
  CHECK(lines_with(text, "injected fault").size() == 5);
  CHECK(lines_with(text, "old").empty());
  CHECK_THAT(text, Contains("  not shown: 28 done, 5 failed, 55 not run (dprun status --all lists "
                            "every trial)"));
  const auto run0 = lines_with(text, "run0");
  REQUIRE(run0.size() == 1);
  for (const char* cell : {"3/10", "0.2500", "0.8750", "2.00", "14s", "gpus 0"})
    CHECK_THAT(run0[0], Contains(cell));
  CHECK(lines_with(text, "val_acc").empty());  // no trial has a validation split
  CHECK_THAT(text, EndsWith("to run them (failed and interrupted ones resume from their last "
                            "checkpoint): dprun run big.toml\n"));

  layout.max_trials = 0;
  CHECK(lines_with(format_status(sweep, layout), "old").size() == 28);

  // A validation split adds its column; a terminal's width cuts every line.
  sweep.trials[0].val_acc = 0.8125;
  layout.width = 60;
  const std::string narrow = format_status(sweep, layout);
  CHECK_THAT(narrow, Contains("val_acc"));
  for (const auto& line : lines_with(narrow, "")) CHECK(line.size() <= 60);
}
