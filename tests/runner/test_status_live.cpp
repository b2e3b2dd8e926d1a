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

  // What the time of an epoch depends on: exact fp32 against TF32, graphs, and the layout
  // (whose "auto" resolves with allow_tf32) tell shapes apart; the learning rate does not.
  const dps::SettingValues base{{"model", std::string("resnet18")},
                                {"layout", std::string("auto")},
                                {"allow_tf32", int64_t{1}},
                                {"graphs", int64_t{0}},
                                {"lr", 0.1}};
  for (const auto& [key, other] : std::vector<std::pair<std::string, dps::SqlValue>>{
           {"allow_tf32", int64_t{0}}, {"graphs", int64_t{1}}, {"layout", std::string("nchw")}}) {
    dps::SettingValues changed = base;
    changed[key] = other;
    INFO(key);
    CHECK(shape_of(changed) != shape_of(base));
  }
  dps::SettingValues lr = base;
  lr["lr"] = 0.4;
  CHECK(shape_of(lr) == shape_of(base));

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

TEST_CASE("status: a database of trials running, stale and not run", "[status]") {
  dptest::TempDir dir;
  const std::string db = dir.path() + "/results/e.db";
  {
    Store store(db, Store::Mode::read_write, dprun::builtin_settings().store_columns());
    const int64_t exp = store.upsert_experiment("e", "", "x = 1", dprun::kDefaultsGeneration);
    // Running elsewhere (a host this dprun cannot look at): its 3rd epoch of 5.
    const int64_t running = store.ensure_trial(exp, "h1", 0, settings(5, 1, 0.1)).id;
    dps::TrialStart start;
    start.backend = "cpu";
    start.devices = "CPU (2 threads, oneDNN) x1";
    start.host = "node7";
    start.runner_pid = 1;
    REQUIRE(store.claim_trial(running, TrialStatus::pending, 1, "node7"));
    store.start_trial(running, start);
    add_epochs(store, running, 1, 3, 0.4);
    // Running on this host, but its runner (this test, not a dprun) is no runner.
    const int64_t stale = store.ensure_trial(exp, "h2", 1, settings(5, 1, 0.2)).id;
    REQUIRE(store.claim_trial(stale, TrialStatus::pending, getpid(), dprun::host_name()));
    start.host = dprun::host_name();
    start.runner_pid = getpid();
    store.start_trial(stale, start);
    add_epochs(store, stale, 1, 3, 0.4);
    // Not run: the shape of the others (lr does not change it), which lend it their timing.
    store.ensure_trial(exp, "h3", 2, settings(5, 1, 0.3));
  }
  const auto r = clitest::run({"status", "--db", db}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  INFO(r.out);
  CHECK_THAT(r.out, Contains("experiment e: 3 trials: 1 running, 1 stale, 1 not run"));
  // 2 epochs left of the running trial and 5 of the one not run, at 0.4 s (epoch 1 left out).
  CHECK_THAT(r.out, Contains("progress: 6/15 epochs; ETA 3s for the 2 trials left"));
  const auto running = lines_with(r.out, "lenet lr=0.1 ");
  REQUIRE(running.size() == 1);
  for (const char* cell :
       {" 1  ", "running", "3/5", "0.3333", "0.5300", "0.40", "1s", "CPU x1 on node7"})
    CHECK_THAT(running[0], Contains(cell));
  const auto stale = lines_with(r.out, "lenet lr=0.2 ");
  REQUIRE(stale.size() == 1);
  CHECK_THAT(stale[0],
             Contains("stale") && Contains("3/5") && Contains("is gone without recording its end"));
  const auto next = lines_with(r.out, "lenet lr=0.3 ");
  REQUIRE(next.size() == 1);
  CHECK_THAT(next[0], Contains("not run") && Contains("0/5") && Contains("2s"));
  // Read only: a local sweep's database is not written (its runner writes alone).
  CHECK(clitest::sql1(db, "SELECT status FROM trials WHERE config_hash = 'h2'") == "running");

  // Nothing runs here (the running trial is another host's; it may go on): --watch waits for
  // it, and ends once it has ended.
  {
    Store store(db, Store::Mode::read_write, dprun::builtin_settings().store_columns());
    store.finish_trial(1, TrialStatus::done);
  }
  const auto watched = clitest::run({"status", "--db", db, "--watch", "0.5"}, dir.path());
  DPRUN_REQUIRE_EXIT(watched, 0);
  CHECK_THAT(watched.out, EndsWith("nothing runs or waits to run any more: --watch ends\n"));
  CHECK(lines_with(watched.out, "experiment e:").size() == 1);  // one snapshot: nothing active
}

TEST_CASE("status: a running Slurm task's database is read read-only before any merge",
          "[status][slurm]") {
  dptest::TempDir dir;
  const std::string results = dir.path() + "/results";
  const std::string db = results + "/e.db";
  const std::string bin = dir.path() + "/bin";
  fs::create_directories(bin);
  const dptest::EnvVar path("PATH", bin + ":" + std::string(std::getenv("PATH")));
  // Slurm lists both tasks: 0 runs, 1 is queued.
  write_script(bin + "/squeue", "echo '42|0|RUNNING'\necho '42|1|PENDING'\n");
  write_script(bin + "/scontrol", "true\n");
  const std::string task_db = results + "/e.tasks/s0001/t0000.db";
  {
    Store store(db, Store::Mode::read_write, dprun::builtin_settings().store_columns());
    const int64_t exp = store.upsert_experiment("e", "", "x = 1", dprun::kDefaultsGeneration);
    const int64_t t0 = store.ensure_trial(exp, "h1", 0, settings(4, 2, 0.1)).id;
    const int64_t t1 = store.ensure_trial(exp, "h2", 1, settings(4, 2, 0.2)).id;
    fs::create_directories(results + "/e.tasks/s0001");
    dps::SubmissionRow s;
    s.experiment_id = exp;
    s.scheduler = "slurm";
    s.folder = "e.tasks/s0001";
    s.command = "sbatch job.sh";
    dps::TaskRow a, b;
    a.index = 0;
    a.trial_id = t0;
    a.database = "e.tasks/s0001/t0000.db";
    b.index = 1;
    b.trial_id = t1;
    b.database = "e.tasks/s0001/t0001.db";
    store.set_submission_job(store.add_submission(s, {a, b}), "42");

    // The task's own database, as the task writes it: its trial at epoch 2 of 4.
    Store task(task_db, Store::Mode::read_write, dprun::builtin_settings().store_columns(),
               Store::Journal::rollback);
    const int64_t texp = task.upsert_experiment("e", "", "x = 1", dprun::kDefaultsGeneration);
    const int64_t id = task.ensure_trial(texp, "h1", 0, settings(4, 2, 0.1)).id;
    dps::TrialStart start;
    start.backend = "cpu";
    start.devices = "cpu";
    start.host = "node1";
    start.hosts = "node1 x2";
    task.start_trial(id, start);
    add_epochs(task, id, 1, 2, 3.0);
  }
  const auto before = fs::last_write_time(task_db);
  const auto size = fs::file_size(task_db);

  const auto r = clitest::run({"status", "--db", db}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  INFO(r.out);
  CHECK_THAT(r.out, Contains("experiment e: 2 trials: 1 running, 1 queued"));
  CHECK_THAT(r.out, Contains("Slurm job 42; collected 0 task results; 2 task(s) still queued"));
  const auto running = lines_with(r.out, "lenet lr=0.1 ");
  REQUIRE(running.size() == 1);
  for (const char* cell : {"running", "2/4", "0.5000", "0.5200", "3.00", "6s", "cpu on node1 x2",
                           "Slurm job 42_0 RUNNING"})
    CHECK_THAT(running[0], Contains(cell));
  const auto queued = lines_with(r.out, "lenet lr=0.2 ");
  REQUIRE(queued.size() == 1);
  CHECK_THAT(queued[0],
             Contains("queued") && Contains("0/4") && Contains("Slurm job 42_1 PENDING"));
  // The queued trial has the running one's shape: the sweep's ETA is known.
  CHECK_THAT(r.out, Contains("ETA 18s for the 2 trials left"));
  // Neither database changed: the task's is only read, the main one not merged into.
  CHECK(fs::last_write_time(task_db) == before);
  CHECK(fs::file_size(task_db) == size);
  CHECK(clitest::sql1(db, "SELECT COUNT(*) FROM epochs") == "0");
  CHECK(clitest::sql1(db, "SELECT COUNT(*) FROM tasks WHERE state = 'submitted'") == "2");

  // Read directly: a database not created yet, and one that is not a database (yet), are said
  // to be so, not errors.
  dps::TaskRow missing;
  missing.database = "e.tasks/s0001/t0009.db";
  missing.config_hash = "h9";
  CHECK(dprun::cli::read_task_progress(db, missing).problem == "is not created yet");
  clitest::write_file(results + "/e.tasks/s0001/t0008.db", "half written");
  missing.database = "e.tasks/s0001/t0008.db";
  const auto unreadable = dprun::cli::read_task_progress(db, missing);
  CHECK_FALSE(unreadable.state);
  CHECK_THAT(unreadable.problem, Contains("cannot be read now"));
  dps::TaskRow t0;
  t0.database = "e.tasks/s0001/t0000.db";
  t0.config_hash = "h1";
  const auto read = dprun::cli::read_task_progress(db, t0);
  REQUIRE(read.state);
  CHECK(read.state->epochs.size() == 2);
  CHECK(read.state->trial.status == TrialStatus::running);

  // Once Slurm no longer lists them, status merges as before: task 0 (its trial still running
  // in its database) is interrupted, task 1 (never started) lost.
  write_script(bin + "/squeue", "true\n");
  const auto after = clitest::run({"status", "--db", db, "--watch"}, dir.path());
  DPRUN_REQUIRE_EXIT(after, 0);
  CHECK_THAT(after.out, Contains("2 trials: 1 interrupted, 1 lost") && Contains("--watch ends"));
}

TEST_CASE("status: a local sweep held at epoch 2 of 3, once and with --watch", "[status][cli]") {
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/live.toml";
  const std::string db = dir.path() + "/live.db";
  clitest::write_file(file, clitest::experiment_toml("live", data, "[1, 2]", 3));
  // The first trial (gpus 1) hangs after its 2nd epoch: it stays at 2/3 until stopped.
  clitest::Dprun runner({"run", file, "--db", db, "--threads", "2"}, dir.path(),
                        {"DPRUN_FAULT=hang@2#0"}, "runner");
  REQUIRE(runner.pid() > 0);
  REQUIRE(clitest::wait_for_epochs(db, 2));

  const auto r = clitest::run({"status", file, "--db", db}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  INFO(r.out);
  CHECK_THAT(r.out, Contains("experiment live: 2 trials: 1 running, 1 not run"));
  // The other trial has 2 GPUs: another shape, no timing to lend.
  CHECK_THAT(r.out, Contains("progress: 2/6 epochs; ETA unknown: 1 of the 2 trials left have no "
                             "timing yet"));
  const auto line = lines_with(r.out, "running");
  REQUIRE(line.size() >= 1);
  CHECK_THAT(line.back(), Contains("lenet gpus=1") && Contains("2/3"));
  CHECK_THAT(lines_with(r.out, "gpus=2").at(0), Contains("not run") && Contains("0/3"));

  // Two watches, whose output is not a terminal: snapshots apart by a blank line. One is stopped
  // with Ctrl-C (SIGINT: exit 0); the other ends by itself once the sweep stopped.
  clitest::Dprun stopped({"status", "--db", db, "--watch", "0.5"}, dir.path(), {}, "stopped");
  clitest::Dprun watch({"status", "--watch", "0.5", file, "--db", db}, dir.path(), {}, "watch");
  for (const char* tag : {"stopped", "watch"})
    REQUIRE(clitest::wait_until([&] {
      return clitest::slurp(dir.path() + "/" + tag + ".out").find("2/3") != std::string::npos;
    }));
  ::kill(stopped.pid(), SIGINT);
  const auto s = stopped.wait();
  DPRUN_CHECK_EXIT(s, 0);

  ::kill(runner.pid(), SIGINT);  // the sweep stops: its trial is recorded interrupted
  DPRUN_CHECK_EXIT(runner.wait(), 130);
  REQUIRE(clitest::wait_until([&] { return !clitest::process_alive(watch.pid()); }, 60));
  const auto w = watch.wait();
  DPRUN_REQUIRE_EXIT(w, 0);
  CHECK(w.out.rfind("experiment live: 2 trials: 1 running, 1 not run\n", 0) == 0);
  CHECK_THAT(w.out, Contains("\n\nexperiment live: 2 trials: 1 interrupted, 1 not run\n") &&
                        EndsWith("nothing runs or waits to run any more: --watch ends\n"));
  CHECK(w.out.find('\x1b') == std::string::npos);  // no terminal codes
}
