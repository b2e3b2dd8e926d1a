// Collecting Slurm tasks' databases into the experiment's (merge.hpp), with squeue and scontrol
// played by small scripts on PATH that print what a test says: idempotence, tasks still
// running, half-written databases, tasks killed hard or before they started, an older attempt
// arriving after a newer one, and a Slurm that cannot be asked. The real Slurm is
// test_slurm_cluster.cpp.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>

#include "cli_helpers.hpp"
#include "slurm/merge.hpp"
#include "settings/settings.hpp"
#include "support/env_var.hpp"

using Catch::Matchers::Contains;
using dps::Store;
using dps::TrialStatus;

namespace fs = std::filesystem;

namespace {

// A trial's settings as the store records them (every setting at its default, LeNet).
dps::SettingValues trial_settings() {
  dps::SettingValues s = dprun::to_store(dprun::TrialSettings());
  s["model"] = std::string("lenet");
  return s;
}

// Writes an executable shell script.
void write_script(const std::string& path, const std::string& body) {
  clitest::write_file(path, "#!/bin/sh\n" + body);
  ::chmod(path.c_str(), 0755);
}

// An experiment database with one trial (hash h1) and submissions of it to "Slurm", whose
// squeue and scontrol answer with the contents of squeue.txt and scontrol.txt.
struct Cluster {
  dptest::TempDir dir;
  std::string db = dir.path() + "/results/e.db";
  std::string bin = dir.path() + "/bin";
  dptest::EnvVar path{"PATH",
                      bin + ":" + std::string(std::getenv("PATH") ? std::getenv("PATH") : "")};
  Store store{db, Store::Mode::read_write, dprun::builtin_settings().store_columns()};
  int64_t exp = store.upsert_experiment("e", "", "x = 1", dprun::kDefaultsGeneration);
  int64_t trial = store.ensure_trial(exp, "h1", 0, trial_settings()).id;

  Cluster() {
    fs::create_directories(bin);
    write_script(bin + "/squeue", "cat '" + dir.path() + "/squeue.txt'\n");
    write_script(bin + "/scontrol", "cat '" + dir.path() + "/scontrol.txt'\n");
    squeue("");
    scontrol("");
  }
  void squeue(const std::string& text) { clitest::write_file(dir.path() + "/squeue.txt", text); }
  void scontrol(const std::string& text) {
    clitest::write_file(dir.path() + "/scontrol.txt", text);
  }

  // A submission of the trial as task 0 of job `job`; returns (its id, its task database).
  std::pair<int64_t, std::string> submit(const std::string& job) {
    const std::string folder = "e.tasks/s" + job;
    fs::create_directories(dir.path() + "/results/" + folder);
    dps::SubmissionRow s;
    s.experiment_id = exp;
    s.scheduler = "slurm";
    s.folder = folder;
    s.command = "sbatch job.sh";
    dps::TaskRow t;
    t.index = 0;
    t.trial_id = trial;
    t.database = folder + "/t0000.db";
    t.base_attempts = store.get_trial(trial)->attempts;
    const int64_t id = store.add_submission(s, {t});
    store.set_submission_job(id, job);
    return {id, dir.path() + "/results/" + t.database};
  }

  dprun::MergeSummary merge() { return dprun::merge_tasks(store, exp); }

  // Every row a merge may touch, as text: equal dumps mean nothing changed.
  std::string dump() {
    std::string out;
    for (const char* q : {"SELECT * FROM trials ORDER BY id", "SELECT * FROM epochs ORDER BY 1, 2",
                          "SELECT * FROM tasks ORDER BY 1, 2"})
      for (const auto& row : store.query(q).rows) {
        for (const auto& v : row) out += v.value_or("NULL") + "|";
        out += "\n";
      }
    return out;
  }
};

// A task's own database as the task leaves it: trial h1 after `epochs` epochs with `status`
// (running: the task was killed before it could record the end).
void task_database(const std::string& path, TrialStatus status, int epochs,
                   const std::string& error = "") {
  Store task(path, Store::Mode::read_write, dprun::builtin_settings().store_columns(),
             Store::Journal::rollback);
  const int64_t exp = task.upsert_experiment("e", "", "x = 1", dprun::kDefaultsGeneration);
  const int64_t id = task.ensure_trial(exp, "h1", 0, trial_settings()).id;
  dps::TrialStart start;
  start.backend = "cpu";
  start.host = "node1";
  start.data_residence = "streamed";
  start.layout_used = "nhwc";
  start.graphs_used = 1;
  task.start_trial(id, start);
  for (int e = 1; e <= epochs; ++e) {
    dps::EpochRow row;
    row.trial_id = id;
    row.epoch = e;
    row.test_acc = 0.5 + 0.1 * e;
    task.record_epoch(row);
  }
  if (status != TrialStatus::running) task.finish_trial(id, status, error);
}

}  // namespace

TEST_CASE("merge: a task that ended is collected once and merging again changes nothing",
          "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  task_database(task_db, TrialStatus::done, 2);
  const auto m = c.merge();
  CHECK(m.merged == 1);
  CHECK(m.waiting == 0);
  CHECK(m.notes.empty());
  const auto trial = c.store.get_trial(c.trial);
  CHECK(trial->status == TrialStatus::done);
  CHECK(trial->epochs_done == 2);
  CHECK(trial->host == "node1");
  CHECK(trial->data_residence == "streamed");  // facts of the run come along
  CHECK(trial->layout_used == "nhwc");
  CHECK(trial->graphs_used == 1);
  CHECK(c.store.tasks(c.exp, true).empty());

  const std::string before = c.dump();
  const auto again = c.merge();
  CHECK(again.merged + again.superseded + again.lost + again.waiting == 0);
  CHECK(c.dump() == before);
  // Even with the task's database changed since: a merged task is closed.
  fs::remove(task_db);
  task_database(task_db, TrialStatus::failed, 1, "changed");
  c.merge();
  CHECK(c.dump() == before);
}

TEST_CASE("merge: a task Slurm still lists is left alone, its database unread", "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  task_database(task_db, TrialStatus::running, 1);
  c.squeue("42|0|RUNNING\n");
  const auto m = c.merge();
  CHECK(m.merged == 0);
  CHECK(m.waiting == 1);
  CHECK(m.live.at({sub, 0}) == "RUNNING");
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::pending);
  CHECK(c.store.tasks(c.exp, true).size() == 1);
  // run and submit skip it: it must not run twice.
  const auto elsewhere = dprun::merge_before_running(c.store, c.exp);
  CHECK(elsewhere.at("h1") == "Slurm job 42_0 (RUNNING)");
}

TEST_CASE("merge: a half-written task database is left for a later merge, saying so", "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  task_database(task_db, TrialStatus::done, 2);
  const std::string whole = clitest::slurp(task_db);
  // What a reader may see of a file still being copied or written on another host.
  clitest::write_file(task_db, whole.substr(0, 1000));
  const auto m = c.merge();
  CHECK(m.merged == 0);
  CHECK(m.waiting == 1);
  REQUIRE(m.notes.size() == 1);
  CHECK_THAT(m.notes[0], Contains("Slurm job 42_0: cannot read its database") &&
                             Contains("left for a later merge"));
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::pending);
  CHECK(c.store.tasks(c.exp, true).size() == 1);

  clitest::write_file(task_db, whole);
  CHECK(c.merge().merged == 1);
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::done);
}

TEST_CASE("merge: without Slurm, only a trial's recorded end is collected", "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  task_database(task_db, TrialStatus::running, 1);
  const dptest::EnvVar no_slurm("PATH", c.dir.path() + "/nothing-here");
  auto m = c.merge();
  CHECK_FALSE(m.slurm_known);
  CHECK(m.waiting == 1);
  REQUIRE(!m.notes.empty());
  CHECK_THAT(m.notes.back(), Contains("Slurm cannot be asked (squeue is not on PATH)"));
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::pending);

  fs::remove(task_db);
  task_database(task_db, TrialStatus::done, 2);
  m = c.merge();
  CHECK(m.merged == 1);
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::done);
}

TEST_CASE("merge: a task killed hard is recorded interrupted with Slurm's cause", "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  task_database(task_db, TrialStatus::running, 1);
  c.scontrol(
      "JobId=43 ArrayJobId=42 ArrayTaskId=0 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:9 "
      "BatchHost=node1\n");
  CHECK(c.merge().merged == 1);
  const auto trial = c.store.get_trial(c.trial);
  CHECK(trial->status == TrialStatus::interrupted);
  CHECK(trial->error == "node failure (Slurm) (Slurm state NODE_FAIL on node1), after epoch 1");
  CHECK(trial->epochs_done == 1);
}

TEST_CASE("merge: a task stopped by Slurm names the cause slurmstepd wrote", "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  // Killed before dprun could record anything: no database, only slurmstepd's line.
  clitest::write_file(fs::path(task_db).replace_extension(".out").string(),
                      "slurmstepd: error: *** JOB 43 ON node1 CANCELLED AT 2026-01-01T10:00:00 "
                      "DUE TO TIME LIMIT ***\n");
  const auto m = c.merge();
  CHECK(m.lost == 1);
  REQUIRE(m.notes.size() == 1);
  CHECK_THAT(m.notes[0], Contains("Slurm job 42_0 ended before dprun started the trial: Slurm "
                                  "time limit reached (job 43 on node1"));
  const auto tasks = c.store.tasks(c.exp, false);
  CHECK(tasks[0].state == dps::TaskState::lost);
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::pending);  // it keeps what it had
}

TEST_CASE("merge: an older attempt ending after a newer one was merged changes nothing",
          "[merge]") {
  Cluster c;
  const auto [older, older_db] = c.submit("42");
  const auto [newer, newer_db] = c.submit("50");
  task_database(older_db, TrialStatus::running, 1);
  task_database(newer_db, TrialStatus::done, 2);
  c.squeue("42|0|RUNNING\n");  // the older task is still running (e.g. a node that hung)
  auto m = c.merge();
  CHECK(m.merged == 1);
  CHECK(m.waiting == 1);
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::done);

  fs::remove(older_db);
  task_database(older_db, TrialStatus::interrupted, 1, "interrupted by SIGTERM");
  c.squeue("");
  m = c.merge();
  CHECK(m.superseded == 1);
  const auto trial = c.store.get_trial(c.trial);
  CHECK(trial->status == TrialStatus::done);
  CHECK(trial->epochs_done == 2);
  CHECK(c.store.tasks(c.exp, true).empty());
}

TEST_CASE("merge: dprun report collects ended tasks before it reads", "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  task_database(task_db, TrialStatus::done, 2);
  // dprun inherits the fake squeue on PATH.
  const auto r = clitest::run({"report", "--db", c.db}, c.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.err, Contains("collected the results of 1 Slurm task"));
  CHECK_THAT(r.out, Contains("done"));
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::done);
  CHECK(c.store.tasks(c.exp, true).empty());
  // A database without open tasks is only read.
  const std::string before = c.dump();
  DPRUN_REQUIRE_EXIT(clitest::run({"report", "--db", c.db}, c.dir.path()), 0);
  CHECK(c.dump() == before);
}

TEST_CASE("merge: a task whose submission folder is gone or unreadable is left open, not lost",
          "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  const fs::path folder = fs::path(task_db).parent_path();
  // Slurm no longer lists the task; its folder is not there (unmounted, moved): no verdict.
  fs::remove_all(folder);
  auto m = c.merge();
  CHECK(m.lost == 0);
  CHECK(m.waiting == 1);
  REQUIRE(!m.notes.empty());
  CHECK_THAT(m.notes[0], Contains("Slurm job 42_0: its submission folder") &&
                             Contains("left for a later merge"));
  CHECK(c.store.tasks(c.exp, true).size() == 1);

  // An error other than "no such file" (here a symbolic link loop; EIO, ESTALE and EACCES alike).
  fs::create_directory_symlink(folder.filename(), folder);
  m = c.merge();
  CHECK(m.lost == 0);
  CHECK(m.waiting == 1);
  REQUIRE(!m.notes.empty());
  CHECK_THAT(m.notes[0], Contains("Slurm job 42_0: cannot tell whether its database") &&
                             Contains("left for a later merge"));
  CHECK(c.store.tasks(c.exp, true).size() == 1);

  // Back in place, the task's end is collected.
  fs::remove(folder);
  fs::create_directories(folder);
  task_database(task_db, TrialStatus::done, 2);
  CHECK(c.merge().merged == 1);
}

TEST_CASE("merge: a squeue that fails or answers garbage leaves every task unread for later",
          "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  // A recorded end, which a merge without any squeue would collect: not while squeue fails.
  task_database(task_db, TrialStatus::done, 2);
  const std::string before = c.dump();
  for (const std::string& body :
       {std::string(
            "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n"),
        std::string("echo '42|0|RUNNING'\necho 'squeue: warning: something odd'\n")}) {
    write_script(c.bin + "/squeue", body);
    const auto m = c.merge();
    CHECK_FALSE(m.slurm_known);
    CHECK(m.merged + m.lost == 0);
    CHECK(m.waiting == 1);
    REQUIRE(m.notes.size() == 1);
    CHECK_THAT(m.notes[0], Contains("Slurm cannot be asked (squeue ") &&
                               Contains("no task database read") &&
                               Contains("left for a later merge"));
    CHECK(c.dump() == before);
  }
  write_script(c.bin + "/squeue", "true\n");
  CHECK(c.merge().merged == 1);
}

TEST_CASE("merge: the user's SQUEUE_* and SLURM_CLUSTERS settings cannot hide a live task",
          "[merge]") {
  Cluster c;
  const auto [sub, task_db] = c.submit("42");
  task_database(task_db, TrialStatus::running, 1);
  // As the real squeue would: a filter from the environment hides the running task.
  write_script(c.bin + "/squeue",
               "if [ -n \"$SQUEUE_STATES$SLURM_CLUSTERS$SQUEUE_PARTITION\" ]; then exit 0; fi\n"
               "echo '42|0|RUNNING'\n");
  write_script(c.bin + "/scontrol", "env > '" + c.dir.path() + "/scontrol-env.txt'\n");
  const dptest::EnvVar states("SQUEUE_STATES", "COMPLETED");
  const dptest::EnvVar clusters("SLURM_CLUSTERS", "other");
  const dptest::EnvVar partition("SQUEUE_PARTITION", "debug");
  const auto m = c.merge();
  CHECK(m.merged == 0);
  CHECK(m.waiting == 1);
  CHECK(m.live.at({sub, 0}) == "RUNNING");
  CHECK(c.store.get_trial(c.trial)->status == TrialStatus::pending);

  // scontrol is asked without them too (once the task has ended).
  write_script(c.bin + "/squeue", "true\n");
  CHECK(c.merge().merged == 1);
  const std::string env = clitest::slurp(c.dir.path() + "/scontrol-env.txt");
  CHECK_THAT(env, Contains("PATH="));
  CHECK_FALSE(env.find("SQUEUE_STATES") != std::string::npos);
  CHECK_FALSE(env.find("SLURM_CLUSTERS") != std::string::npos);
}

TEST_CASE("status: a database without experiments and no experiment file is an error", "[merge]") {
  dptest::TempDir dir;
  const std::string db = dir.path() + "/empty.db";
  { Store s(db, Store::Mode::read_write, dprun::builtin_settings().store_columns()); }
  const auto r = clitest::run({"status", "--db", db}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("database " + db + " holds no experiment"));
}
