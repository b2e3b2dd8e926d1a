// End-to-end tests of the failure paths of `dprun run`, made real with DPRUN_FAULT (read by the
// trial process): a trial process killed, aborting, throwing, diverging, hanging; the runner
// interrupted by SIGINT or killed outright. Waiting is done by polling the database or /proc
// with generous deadlines, never by sleeping a fixed time.
#include <catch2/catch.hpp>

#include "cli_helpers.hpp"

using clitest::run;
using clitest::sql;
using clitest::sql1;

namespace {

struct Sweep {
  dptest::TempDir dir;
  std::string file, db;
  Sweep(const std::string& name, const std::string& data, const std::string& gpus) {
    file = dir.path() + "/" + name + ".toml";
    db = dir.path() + "/" + name + ".db";
    clitest::write_file(file, clitest::experiment_toml(name, data, gpus));
  }
  std::vector<std::string> args() const { return {"run", file, "--db", db, "--threads", "1"}; }
  std::string status(int gpus) const {
    return sql1(db, "SELECT status FROM trials WHERE gpus = " + std::to_string(gpus));
  }
  std::string error(int gpus) const {
    return sql1(db, "SELECT error FROM trials WHERE gpus = " + std::to_string(gpus));
  }
  std::string epochs(int gpus) const {
    return sql1(db,
                "SELECT COUNT(*) FROM epochs e JOIN trials t ON t.id = e.trial_id WHERE "
                "t.gpus = " +
                    std::to_string(gpus));
  }
};

}  // namespace

TEST_CASE("a killed trial process is recorded failed and the sweep goes on", "[cli]") {
  DPRUN_NEED_DATA(data);
  Sweep s("killed", data, "[1, 2]");
  auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=kill@1#0"});
  DPRUN_CHECK_EXIT(r, 1);
  CHECK(s.status(1) == "failed");
  CHECK(s.error(1).find("killed by signal 9 (SIGKILL) after epoch 1") != std::string::npos);
  CHECK(s.epochs(1) == "1");  // the epoch written before the kill is kept
  CHECK(s.status(2) == "done");
  CHECK(s.epochs(2) == "2");

  // A re-run without the fault runs only the failed trial, from its checkpoint of epoch 1.
  r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(s.status(1) == "done");
  CHECK(s.epochs(1) == "2");
  CHECK(sql1(s.db, "SELECT attempts FROM trials WHERE gpus = 1") == "2");
  CHECK(sql1(s.db, "SELECT resumed_from_epoch FROM trials WHERE gpus = 1") == "1");
  CHECK(sql1(s.db, "SELECT attempts FROM trials WHERE gpus = 2") == "1");
  CHECK(sql1(s.db, "SELECT error FROM trials WHERE gpus = 1").empty());
}

TEST_CASE("NaN loss -> diverged, abort and throw -> failed with the reason", "[cli]") {
  DPRUN_NEED_DATA(data);
  {
    Sweep s("nan", data, "[1]");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=nan@1"});
    DPRUN_CHECK_EXIT(r, 1);
    CHECK(s.status(1) == "diverged");
    CHECK(s.error(1) == "loss became NaN at epoch 1");
  }
  {
    Sweep s("abort", data, "[1]");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=abort@1"});
    DPRUN_CHECK_EXIT(r, 1);
    CHECK(s.status(1) == "failed");
    CHECK(s.error(1).find("signal 6 (SIGABRT) after epoch 1") != std::string::npos);
    CHECK(s.epochs(1) == "1");
  }
  {
    Sweep s("throw", data, "[1, 2]");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=throw@2"});
    DPRUN_CHECK_EXIT(r, 1);
    for (int gpus : {1, 2}) {
      CHECK(s.status(gpus) == "failed");
      CHECK(s.error(gpus).find("injected fault") != std::string::npos);
      CHECK(s.epochs(gpus) == "2");
    }
  }
  {
    // A record line the runner cannot read may have been an epoch: the trial fails, and the
    // epochs read before it stay.
    Sweep s("garble", data, "[1]");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=garble@2"});
    DPRUN_CHECK_EXIT(r, 1);
    CHECK(s.status(1) == "failed");
    CHECK(s.error(1).find("malformed record") != std::string::npos);
    CHECK(s.epochs(1) == "1");
  }
  {
    // A bad DPRUN_FAULT is an error of the trial, never silently ignored.
    Sweep s("badfault", data, "[1]");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=explode@1"});
    DPRUN_CHECK_EXIT(r, 1);
    CHECK(s.error(1).find("DPRUN_FAULT") != std::string::npos);
  }
}

TEST_CASE("the option --trial-timeout kills a hanging trial", "[cli]") {
  DPRUN_NEED_DATA(data);
  Sweep s("timeout", data, "[1]");
  auto args = s.args();
  args.push_back("--trial-timeout");
  args.push_back("3");
  auto r = run(args, s.dir.path(), {"DPRUN_FAULT=hang@1"});
  DPRUN_CHECK_EXIT(r, 1);
  CHECK(s.status(1) == "failed");
  CHECK(s.error(1).find("timed out") != std::string::npos);
}

TEST_CASE("SIGINT or SIGTERM stops the runner and its trial, a re-run completes it", "[cli]") {
  DPRUN_NEED_DATA(data);
  const int sig = GENERATE(SIGINT, SIGTERM);
  const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  INFO(name);
  Sweep s("signal", data, "[1, 2]");
  clitest::Dprun runner(s.args(), s.dir.path(), {"DPRUN_FAULT=hang@1#0"});
  REQUIRE(runner.pid() > 0);
  // The trial has written epoch 1 and now hangs: a deterministic point to interrupt.
  REQUIRE(clitest::wait_for_epochs(s.db, 1));
  const auto children = clitest::children_of(runner.pid());
  REQUIRE(children.size() == 1);
  const pid_t child = children[0];
  REQUIRE(clitest::process_alive(child));

  ::kill(runner.pid(), sig);
  auto r = runner.wait();
  DPRUN_CHECK_EXIT(r, 128 + sig);
  CHECK(r.err.find("run the same command again") != std::string::npos);
  CHECK_FALSE(clitest::process_alive(child));
  CHECK(s.status(1) == "interrupted");
  CHECK(s.error(1) == "interrupted by " + name);
  CHECK(s.epochs(1) == "1");
  CHECK(s.status(2) == "pending");  // never started

  r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(s.status(1) == "done");
  CHECK(s.status(2) == "done");
  CHECK(s.epochs(1) == "2");
}

TEST_CASE("Ctrl-C (SIGINT to the whole process group) records the trial interrupted", "[cli]") {
  DPRUN_NEED_DATA(data);
  // The runner and its trial process get SIGINT together; whichever notices first, the trial
  // is interrupted (not failed with "killed by signal 2") and the sweep stops with 130.
  Sweep s("ctrl_c", data, "[1, 2]");
  clitest::Dprun runner(s.args(), s.dir.path(), {"DPRUN_FAULT=hang@1#0"}, "dprun", true);
  REQUIRE(runner.pid() > 0);
  REQUIRE(clitest::wait_for_epochs(s.db, 1));
  const auto children = clitest::children_of(runner.pid());
  REQUIRE(children.size() == 1);
  ::kill(-runner.pid(), SIGINT);
  auto r = runner.wait();
  DPRUN_CHECK_EXIT(r, 130);
  CHECK_FALSE(clitest::process_alive(children[0]));
  CHECK(s.status(1) == "interrupted");
  CHECK(s.error(1) == "interrupted by SIGINT");
  CHECK(s.epochs(1) == "1");
  CHECK(s.status(2) == "pending");
}

TEST_CASE("a runner killed with SIGKILL takes its trial process with it", "[cli]") {
  DPRUN_NEED_DATA(data);
  Sweep s("sigkill", data, "[1]");
  clitest::Dprun runner(s.args(), s.dir.path(), {"DPRUN_FAULT=hang@1"});
  REQUIRE(runner.pid() > 0);
  REQUIRE(clitest::wait_for_epochs(s.db, 1));
  const auto children = clitest::children_of(runner.pid());
  REQUIRE(children.size() == 1);
  const pid_t child = children[0];

  ::kill(runner.pid(), SIGKILL);
  auto r = runner.wait();
  CHECK(r.term_signal == SIGKILL);
  // PR_SET_PDEATHSIG: the orphaned trial process is killed by the kernel.
  CHECK(clitest::wait_until([&] { return !clitest::process_alive(child); }, 60));
  CHECK(s.status(1) == "running");  // nobody was left to record anything

  // The next run sees that the runner recorded in the trial is gone: interrupted, then re-run.
  r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.err.find("now interrupted") != std::string::npos);
  CHECK(s.status(1) == "done");
  CHECK(s.epochs(1) == "2");
  CHECK(sql1(s.db, "SELECT attempts FROM trials") == "2");
}

TEST_CASE("two runners on one database never run the same trial twice", "[cli]") {
  DPRUN_NEED_DATA(data);
  Sweep s("two_runners", data, "[1, 2]");
  // Runner A hangs in trial 1 (gpus=1) after its first epoch; both trials were pending when it
  // made its plan.
  clitest::Dprun a(s.args(), s.dir.path(), {"DPRUN_FAULT=hang@1#0"}, "a");
  REQUIRE(a.pid() > 0);
  REQUIRE(clitest::wait_for_epochs(s.db, 1));
  // Runner B leaves A's running trial alone and runs the other one.
  auto b = clitest::Dprun(s.args(), s.dir.path(), {}, "b").wait();
  DPRUN_CHECK_EXIT(b, 0);
  CHECK(s.status(2) == "done");
  CHECK(sql1(s.db, "SELECT attempts FROM trials WHERE gpus = 2") == "1");

  // A's trial ends (its process killed); A must now skip the trial B finished, not restart it.
  const auto children = clitest::children_of(a.pid());
  REQUIRE(children.size() == 1);
  ::kill(children[0], SIGKILL);
  auto r = a.wait();
  DPRUN_CHECK_EXIT(r, 1);
  CHECK(r.err.find("skipped: now done") != std::string::npos);
  CHECK(s.status(1) == "failed");
  CHECK(s.status(2) == "done");
  CHECK(sql1(s.db, "SELECT attempts FROM trials WHERE gpus = 2") == "1");
  CHECK(s.epochs(2) == "2");
}

TEST_CASE("four runners started at once on one database share the work and all exit 0", "[cli]") {
  // Trials another runner claimed are work shared, not an error: each runner goes on with what
  // is left (one found 'the scheduler has trials waiting that fit nowhere' after skipping a
  // claimed trial, and exited 1).
  DPRUN_NEED_DATA(data);
  dptest::TempDir dir;
  const std::string file = dir.path() + "/four.toml", db = dir.path() + "/four.db";
  clitest::write_file(file, clitest::experiment_toml("four", data, "[1, 2]", 1) +
                                "seed = [0, 1, 2, 3]\n");
  const std::vector<std::string> args{"run", file, "--db", db, "--threads", "1"};
  std::vector<std::unique_ptr<clitest::Dprun>> runners;
  for (int i = 0; i < 4; ++i)
    runners.push_back(std::make_unique<clitest::Dprun>(args, dir.path(),
                                                       std::vector<std::string>{},
                                                       "r" + std::to_string(i)));
  for (auto& r : runners) {
    auto result = r->wait();
    DPRUN_CHECK_EXIT(result, 0);
  }
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials") == "8");
  CHECK(sql1(db, "SELECT COUNT(*) FROM trials WHERE status = 'done' AND attempts = 1") == "8");
  CHECK(sql1(db, "SELECT COUNT(*) FROM epochs") == "8");
}
