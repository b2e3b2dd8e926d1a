// End-to-end tests of the sweep tool's runtime: bounded retries (each attempt recorded), the
// validation split's metrics, the stopping rule (status stopped, and a resumed trial stopping
// where a straight one does), --set on the command line, and the drawn values in `dprun plan`.
#include <catch2/catch.hpp>

#include "cli_helpers.hpp"

using clitest::run;
using clitest::sql;
using clitest::sql1;

namespace {

struct Sweep {
  dptest::TempDir dir;
  std::string file, db;
  Sweep(const std::string& name, const std::string& data, const std::string& extra,
        int epochs = 3) {
    file = dir.path() + "/" + name + ".toml";
    db = dir.path() + "/" + name + ".db";
    std::string toml = clitest::experiment_toml(name, data, "[1]", epochs);
    toml.insert(toml.find("[sweep]"), extra + "\n");
    clitest::write_file(file, toml);
  }
  std::vector<std::string> args() const { return {"run", file, "--db", db, "--threads", "1"}; }
  std::string one(const std::string& q) const { return sql1(db, q); }
};

}  // namespace

TEST_CASE("retries: a failed trial runs again from its checkpoint, every attempt recorded",
          "[cli][search]") {
  DPRUN_NEED_DATA(data);
  SECTION("the retry succeeds: exit 0") {
    Sweep s("retry", data, "retries = 1");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=kill@1#0"});
    DPRUN_CHECK_EXIT(r, 0);
    CHECK(r.err.find("failed; retry 1 of 1 (retries)") != std::string::npos);
    CHECK(s.one("SELECT status FROM trials") == "done");
    CHECK(s.one("SELECT attempts FROM trials") == "2");
    CHECK(s.one("SELECT resumed_from_epoch FROM trials") == "1");
    CHECK(s.one("SELECT COUNT(*) FROM epochs") == "3");
    const auto attempts =
        sql(s.db, "SELECT attempt, status, resumed_from_epoch, epochs_done FROM attempts ORDER BY attempt");
    REQUIRE(attempts.size() == 2);
    CHECK(attempts[0] == std::vector<std::string>{"1", "failed", "", "1"});
    CHECK(attempts[1] == std::vector<std::string>{"2", "done", "1", "3"});
    CHECK(s.one("SELECT error FROM attempts WHERE attempt = 1").find("SIGKILL") !=
          std::string::npos);
  }
  SECTION("every retry fails: N + 1 attempts, then the sweep's exit status is 1") {
    // Without checkpoints every attempt starts at epoch 1 and meets the fault again.
    Sweep s("exhausted", data, "retries = 2\ncheckpoint = \"none\"");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=throw@1#0"});
    DPRUN_CHECK_EXIT(r, 1);
    CHECK(s.one("SELECT status FROM trials") == "failed");
    CHECK(s.one("SELECT attempts FROM trials") == "3");
    CHECK(s.one("SELECT COUNT(*) FROM attempts WHERE status = 'failed'") == "3");
    CHECK(r.err.find("retry 2 of 2") != std::string::npos);
    CHECK(r.err.find("retry 3") == std::string::npos);
  }
  SECTION("a diverged trial is not retried") {
    Sweep s("diverged", data, "retries = 3");
    auto r = run(s.args(), s.dir.path(), {"DPRUN_FAULT=nan@1#0"});
    DPRUN_CHECK_EXIT(r, 1);
    CHECK(s.one("SELECT status FROM trials") == "diverged");
    CHECK(s.one("SELECT attempts FROM trials") == "1");
  }
}

TEST_CASE("validation: every epoch records val_loss and val_acc on held-out examples",
          "[cli][search]") {
  DPRUN_NEED_DATA(data);
  Sweep s("validation", data, "validation = 200", 2);
  auto r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  const auto rows = sql(s.db, "SELECT val_acc, val_loss, test_loss FROM epochs ORDER BY epoch");
  REQUIRE(rows.size() == 2);
  for (const auto& row : rows) {
    for (const auto& v : row) CHECK_FALSE(v.empty());
    const double acc = std::stod(row[0]);
    CHECK(acc >= 0.0);
    CHECK(acc <= 1.0);
    // Accuracy over 200 examples is a multiple of 1/200.
    CHECK(std::fabs(acc * 200 - std::round(acc * 200)) < 1e-9);
  }
  CHECK(s.one("SELECT validation FROM trials") == "200.0");
}

TEST_CASE("the stopping rule ends a trial early as 'stopped', and a resumed trial stops alike",
          "[cli][search]") {
  DPRUN_NEED_DATA(data);
  // No improvement can be larger than 1 (an accuracy): epoch 1 sets the best, epoch 2 is the
  // one epoch of patience.
  const std::string rule = "validation = 128\nstop = {patience = 1, min_delta = 1.0}";
  Sweep straight("straight", data, rule, 4);
  auto r = run(straight.args(), straight.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(straight.one("SELECT status FROM trials") == "stopped");
  CHECK(straight.one("SELECT COUNT(*) FROM epochs") == "2");
  const std::string why = straight.one("SELECT error FROM trials");
  CHECK_THAT(why, Catch::StartsWith("stopped after epoch 2: val_acc has not improved"));
  // A re-run leaves it as it is.
  r = run(straight.args(), straight.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(straight.one("SELECT attempts FROM trials") == "1");

  // Killed after epoch 1, resumed from its checkpoint: the rule remembers epoch 1.
  Sweep resumed("resumed", data, rule, 4);
  r = run(resumed.args(), resumed.dir.path(), {"DPRUN_FAULT=kill@1#0"});
  DPRUN_CHECK_EXIT(r, 1);
  r = run(resumed.args(), resumed.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(resumed.one("SELECT status FROM trials") == "stopped");
  CHECK(resumed.one("SELECT resumed_from_epoch FROM trials") == "1");
  CHECK(resumed.one("SELECT COUNT(*) FROM epochs") == "2");
  CHECK(resumed.one("SELECT error FROM trials") == why);
  // The same bits: the same metric values epoch by epoch.
  CHECK(sql(resumed.db, "SELECT val_acc, test_acc, train_loss FROM epochs ORDER BY epoch") ==
        sql(straight.db, "SELECT val_acc, test_acc, train_loss FROM epochs ORDER BY epoch"));
}

TEST_CASE("overrides (--set) on the command line: plan shows it, run records it, errors name it",
          "[cli][search]") {
  DPRUN_NEED_DATA(data);
  Sweep s("overrides", data, "", 3);
  auto r = run({"plan", s.file, "--db", s.db, "--set", "train.epochs=1", "--set",
                "sweep.lr=[0.05, 0.1]"},
               s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("override: --set train.epochs=1") != std::string::npos);
  CHECK(r.out.find("2 to run") != std::string::npos);
  r = run({"run", s.file, "--db", s.db, "--threads", "1", "--set", "train.epochs=1"},
          s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(s.one("SELECT epochs FROM trials") == "1");
  CHECK(s.one("SELECT toml_source FROM experiments").find("#   train.epochs=1") !=
        std::string::npos);
  r = run({"plan", s.file, "--db", s.db, "--set", "train.epochs=none"}, s.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("--set train.epochs=none: train.epochs: expected a positive integer") !=
        std::string::npos);
}

TEST_CASE("dprun plan shows the values a sampled search drew", "[cli][search]") {
  DPRUN_NEED_DATA(data);
  Sweep s("sampled", data, "", 1);
  std::string toml = clitest::slurp(s.file);
  toml.replace(toml.find("[sweep]\ngpus = [1]\n"), std::string::npos,
               "[search]\nsamples = 4\n[sweep]\nlr = {log_uniform = [0.01, 0.5]}\n");
  clitest::write_file(s.file, toml);
  auto r = run({"plan", s.file, "--db", s.db}, s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("4 to run") != std::string::npos);
  size_t shown = 0;
  for (size_t at = r.out.find("lr="); at != std::string::npos; at = r.out.find("lr=", at + 1))
    ++shown;
  CHECK(shown == 4);
}

namespace {

// Nine LeNet trials under asha (eta 3, the first rung at epoch 1, 3 epochs each) on a validation
// split: every trial runs epoch 1, those in the top third there go on to epoch 3.
const char* kAsha =
    "validation = 128\n"
    "[search]\nscheduler = \"asha\"\neta = 3\nmin_epochs = 1\n";
const char* kLrs = "lr = [0.01, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5]";

struct AshaSweep : Sweep {
  AshaSweep(const std::string& name, const std::string& data) : Sweep(name, data, kAsha, 3) {
    std::string toml = clitest::slurp(file);
    toml.replace(toml.find("gpus = [1]"), 10, kLrs);
    clitest::write_file(file, toml);
  }
  // (ordinal, status, epochs recorded, rung) of every trial.
  std::vector<std::vector<std::string>> trials() const {
    return sql(db,
               "SELECT t.ordinal, t.status, (SELECT COUNT(*) FROM epochs e WHERE e.trial_id = "
               "t.id), t.rung FROM trials t ORDER BY t.ordinal");
  }
};

// Every trial ran to the first rung; the top third there (by val_acc, the earlier trial on ties)
// were promoted and ran to the end; the others stayed pruned with one epoch.
void check_asha_outcome(const AshaSweep& s) {
  const auto rows = s.trials();
  REQUIRE(rows.size() == 9);
  size_t done = 0;
  for (const auto& r : rows) {
    INFO("trial " << r[0] << ": " << r[1] << ", " << r[2] << " epochs, rung " << r[3]);
    if (r[1] == "done") {
      ++done;
      CHECK(r[2] == "3");
      CHECK(r[3] == "1");
    } else {
      CHECK(r[1] == "pruned");
      CHECK(r[2] == "1");
      CHECK(r[3] == "0");
    }
  }
  CHECK(done >= 3);
  CHECK(done < 9);
  const auto top = sql(s.db,
                       "SELECT t.status FROM trials t JOIN epochs e ON e.trial_id = t.id AND "
                       "e.epoch = 1 ORDER BY e.val_acc DESC, t.ordinal LIMIT 3");
  for (const auto& r : top) CHECK(r[0] == "done");
}

}  // namespace

TEST_CASE("asha: trials pause at a rung, the best go on, and a promoted trial computes the bits "
          "of a straight run",
          "[cli][search][asha]") {
  DPRUN_NEED_DATA(data);
  AshaSweep s("asha", data);
  auto r = run({"plan", s.file, "--db", s.db}, s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("asha: run to the first rung") != std::string::npos);
  r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  check_asha_outcome(s);
  CHECK(r.err.find("promoted to rung 1 (to epoch 3)") != std::string::npos);
  const std::string epochs = s.one("SELECT COUNT(*) FROM epochs");
  CHECK(std::stoi(epochs) < 27);  // the budget of running every trial to the end

  // A promoted trial resumed from its rung's checkpoint: the same epochs as running straight.
  const std::string lr = s.one("SELECT lr FROM trials WHERE status = 'done' ORDER BY ordinal LIMIT 1");
  const std::string id = s.one("SELECT id FROM trials WHERE status = 'done' ORDER BY ordinal LIMIT 1");
  CHECK(s.one("SELECT resumed_from_epoch FROM trials WHERE id = " + id) == "1");
  Sweep straight("straight", data, "validation = 128", 3);
  std::string toml = clitest::slurp(straight.file);
  toml.replace(toml.find("gpus = [1]"), 10, "lr = [" + lr + "]");
  clitest::write_file(straight.file, toml);
  r = run(straight.args(), straight.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(sql(s.db, "SELECT epoch, train_loss, val_acc, test_acc FROM epochs WHERE trial_id = " + id +
                      " ORDER BY epoch") ==
        sql(straight.db, "SELECT epoch, train_loss, val_acc, test_acc FROM epochs ORDER BY epoch"));

  // A re-run has nothing left to decide.
  r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  INFO(r.err);
  CHECK(r.err.find("promoted") == std::string::npos);
  check_asha_outcome(s);
}

TEST_CASE("asha: kill -9 of the runner during a promotion, then a re-run: nothing promoted twice "
          "or lost",
          "[cli][search][asha]") {
  DPRUN_NEED_DATA(data);
  AshaSweep s("asha_kill", data);
  // Only a promoted trial reaches epoch 2, where it hangs until the runner is killed. The trial
  // sends its epoch-2 record and then its epoch-2 checkpoint before it hangs, and the runner
  // records them one after the other: the kill waits for both (killed in between, as happened
  // once under the sanitizers, the trial resumes from an earlier checkpoint than this test's).
  clitest::Dprun runner(s.args(), s.dir.path(), {"DPRUN_FAULT=hang@2"});
  REQUIRE(runner.pid() > 0);
  REQUIRE(clitest::wait_until([&] {
    try {
      return sql1(s.db, "SELECT COUNT(*) FROM epochs WHERE epoch = 2") == "1" &&
             sql1(s.db, "SELECT COUNT(*) FROM checkpoints WHERE role = 'last' AND epoch = 2") ==
                 "1";
    } catch (const std::exception&) {
      return false;  // not created yet
    }
  }));
  ::kill(runner.pid(), SIGKILL);
  const auto killed = runner.wait();
  CHECK(killed.term_signal == SIGKILL);
  const std::string victim = s.one("SELECT trial_id FROM epochs WHERE epoch = 2");
  CHECK(s.one("SELECT status FROM trials WHERE id = " + victim) == "running");
  CHECK(s.one("SELECT rung FROM trials WHERE id = " + victim) == "1");

  auto r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  check_asha_outcome(s);
  CHECK(s.one("SELECT status FROM trials WHERE id = " + victim) == "done");
  CHECK(s.one("SELECT resumed_from_epoch FROM trials WHERE id = " + victim) == "2");
  // Its attempts: to the first rung, the promotion the kill cut short, the resumed one.
  CHECK(sql(s.db, "SELECT attempt, status, epochs_done FROM attempts WHERE trial_id = " + victim +
                      " ORDER BY attempt") ==
        std::vector<std::vector<std::string>>{
            {"1", "pruned", "1"}, {"2", "interrupted", "2"}, {"3", "done", "3"}});
  // Each promotion was made once: the promoted trials are the done ones, each announced once
  // over both runs (the victim's continuation is a resume, not a second promotion).
  const std::string both = killed.err + r.err;
  size_t promotions = 0;
  for (size_t at = both.find("promoted to rung"); at != std::string::npos;
       at = both.find("promoted to rung", at + 1))
    ++promotions;
  CHECK(std::to_string(promotions) == s.one("SELECT COUNT(*) FROM trials WHERE status = 'done'"));
}

TEST_CASE("experiments/search.toml plans 16 sampled trials under asha", "[cli][search]") {
  dptest::TempDir dir;
  const std::string file = std::string(DPRUN_TEST_SOURCE_DIR) + "/experiments/search.toml";
  auto r = run({"plan", file, "--db", dir.path() + "/search.db"}, dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(r.out.find("experiment search: 16 trials") != std::string::npos);
  CHECK(r.out.find("16 to run, 0 to skip") != std::string::npos);
  CHECK(r.out.find("asha: run to the first rung") != std::string::npos);
}

TEST_CASE("asha: two runners on one database share the work, each promotion made once",
          "[cli][search][asha]") {
  DPRUN_NEED_DATA(data);
  AshaSweep s("asha_two", data);
  clitest::Dprun a(s.args(), s.dir.path(), {}, "a");
  clitest::Dprun b(s.args(), s.dir.path(), {}, "b");
  const auto ra = a.wait(), rb = b.wait();
  DPRUN_CHECK_EXIT(ra, 0);
  DPRUN_CHECK_EXIT(rb, 0);
  check_asha_outcome(s);
  // A trial is started to the first rung once and promoted at most once: one attempt per rung
  // it was sent to (nothing was interrupted here).
  for (const auto& row : sql(s.db, "SELECT attempts, rung FROM trials"))
    CHECK(std::stoi(row[0]) == std::stoi(row[1]) + 1);
}

TEST_CASE("asha: a later run ranks, and promotes, the trials an earlier run paused",
          "[cli][search][asha]") {
  DPRUN_NEED_DATA(data);
  AshaSweep s("asha_later", data);
  // The first run sees three trials (--filter), the second all nine: the trials the first run
  // paused are ranked with the new ones, and promoted when they are in the top third.
  std::vector<std::string> first = s.args();
  for (const char* lr : {"0.01", "0.03", "0.05"}) {
    first.push_back("--filter");
    first.push_back(std::string("lr=") + lr);
  }
  auto r = run(first, s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  CHECK(s.one("SELECT COUNT(*) FROM epochs WHERE epoch = 1") == "3");
  r = run(s.args(), s.dir.path());
  DPRUN_CHECK_EXIT(r, 0);
  check_asha_outcome(s);
  // --rerun and --restart would pull trials' epochs out of the rankings: refused.
  r = run({"run", s.file, "--db", s.db, "--rerun"}, s.dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK(r.err.find("--rerun does not go with [search] scheduler = \"asha\"") != std::string::npos);
}
