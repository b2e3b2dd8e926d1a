// Schema 6: the user's words about trials (tags, notes) and forgetting trials. A database of the
// previous schema is migrated when opened read-write and read as it is (no tags, no notes) when
// opened read-only; forgetting a trial takes everything recorded of it and leaves the database
// sound.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "store_test_util.hpp"

using Catch::Matchers::Contains;
using dps::Store;
using dps::StoreError;
using dps::TrialStatus;
using dpstest::ScratchDir;

namespace {

using Tags = std::vector<std::string>;

// A trial that ran `epochs` epochs to `status`, with a 'last' checkpoint of its last epoch.
int64_t ran_trial(Store& store, int64_t exp, const std::string& hash, int64_t gpus, int epochs,
                  TrialStatus status = TrialStatus::done) {
  const int64_t id = store.ensure_trial(exp, hash, gpus, dpstest::settings("lenet", gpus)).id;
  dps::TrialStart start;
  start.backend = "cpu";
  start.runner_pid = getpid();
  store.start_trial(id, start);
  for (int e = 1; e <= epochs; ++e) store.record_epoch(dpstest::epoch_row(id, e, 0.5 + e * 0.1, 2));
  dps::CheckpointRow c;
  c.trial_id = id;
  c.role = "last";
  c.epoch = epochs;
  c.path = "results.checkpoints/trial-" + std::to_string(id) + "/last.safetensors";
  c.sha256 = "00";
  c.bytes = 10;
  c.optimizer_path =
      "results.checkpoints/trial-" + std::to_string(id) + "/last.optimizer.safetensors";
  c.optimizer_sha256 = "11";
  store.record_checkpoint(c);
  store.finish_trial(id, status);
  return id;
}

std::string count(const std::string& db, const std::string& table, int64_t trial_id) {
  return dpstest::raw_scalar(
      db, "SELECT COUNT(*) FROM " + table + " WHERE trial_id = " + std::to_string(trial_id));
}

// PRAGMA integrity_check and foreign_key_check, on a connection of their own.
void check_sound(const std::string& db) {
  CHECK(dpstest::raw_scalar(db, "PRAGMA integrity_check") == "ok");
  CHECK(dpstest::raw_scalar(db, "SELECT COUNT(*) FROM pragma_foreign_key_check") == "0");
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// The id of a process that has ended (and was reaped): a runner that is gone.
int64_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

// Turns a database of this schema (6) back into one of schema 5 as dprun wrote it: schema 6 only
// added trials.note, trial_tags with its index, and the views' columns tags and note, so taking
// them away leaves exactly the tables of schema 5. The views are put back without the two
// columns (their text otherwise as this dprun generates it; a schema-5 dprun's differed in
// nothing a read depends on).
void downgrade_to_schema_5(const std::string& db) {
  std::string summary = dpstest::raw_scalar(
      db, "SELECT sql FROM sqlite_schema WHERE type = 'view' AND name = 'trial_summary'");
  const std::string scaling = dpstest::raw_scalar(
      db, "SELECT sql FROM sqlite_schema WHERE type = 'view' AND name = 'scaling'");
  const size_t from = summary.find(",\n  (SELECT group_concat(tag");
  const size_t to = summary.find("\nFROM trials t");
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  summary.erase(from,
                to - from);  // tags, note, 7's data_residence, 8's layout_used, 9's graphs_used
  dpstest::raw_exec(db,
                    "DROP VIEW scaling; DROP VIEW trial_summary; DROP INDEX trial_tags_by_tag; "
                    "DROP TABLE trial_tags; ALTER TABLE trials DROP COLUMN note; "
                    "ALTER TABLE trials DROP COLUMN data_residence; "
                    "ALTER TABLE trials DROP COLUMN layout_used; "
                    "ALTER TABLE trials DROP COLUMN graphs_used; "
                    "ALTER TABLE experiments DROP COLUMN defaults; " +
                        summary + "; " + scaling + "; PRAGMA user_version = 5;");
  REQUIRE(dpstest::raw_scalar(db, "PRAGMA user_version") == "5");
  REQUIRE(dpstest::raw_scalar(db,
                              "SELECT COUNT(*) FROM pragma_table_info('trials') WHERE name "
                              "= 'note'") == "0");
}

std::vector<std::string> columns_of(Store& store, const std::string& relation) {
  return store.query("SELECT * FROM " + relation + " LIMIT 0").columns;
}

bool has(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

TEST_CASE(
    "annotations: a database of schema 5 reads no tags read-only, and is migrated to the current "
    "schema",
    "[store][annotations]") {
  ScratchDir dir;
  const std::string db = dir.file("results.db");
  int64_t exp = 0, a = 0, b = 0;
  {
    Store store = dpstest::open_store(db);
    exp = store.upsert_experiment("e", "", "x = 1", 1);
    a = ran_trial(store, exp, "a", 1, 2);
    b = ran_trial(store, exp, "b", 2, 1);
  }
  downgrade_to_schema_5(db);
  {
    // Read-only: read as it is, never migrated; tags and notes read as none.
    Store old(db, Store::Mode::read_only);
    CHECK(old.user_version() == 5);
    const auto trials = old.trials(exp);
    REQUIRE(trials.size() == 2);
    for (const auto& t : trials) {
      CHECK(t.tags.empty());
      CHECK(t.note.empty());
    }
    const auto summaries = old.trial_summaries(exp);
    REQUIRE(summaries.size() == 2);
    CHECK(summaries[0].trial.tags.empty());
    CHECK(summaries[0].final_test_acc.has_value());
    CHECK(old.get_trial(a)->tags.empty());
    CHECK_THROWS_WITH(old.tag_trials({a}, "x"),
                      Contains("schema version 5, before tags and notes"));
    CHECK_FALSE(has(columns_of(old, "trial_summary"), "tags"));
  }
  REQUIRE(dpstest::raw_scalar(db, "PRAGMA user_version") == "5");

  // Read-write: migrated, the views regenerated with tags and note, nothing lost.
  Store store = dpstest::open_store(db);
  CHECK(store.user_version() == dps::schema_version());
  CHECK(dpstest::raw_scalar(db, "PRAGMA user_version") == std::to_string(dps::schema_version()));
  const auto summary_columns = columns_of(store, "trial_summary");
  CHECK(has(summary_columns, "tags"));
  CHECK(has(summary_columns, "note"));
  CHECK(has(columns_of(store, "trial_tags"), "tagged_at"));
  CHECK(count(db, "epochs", a) == "2");
  CHECK(count(db, "epochs", b) == "1");
  CHECK(count(db, "attempts", a) == "1");
  CHECK(store.get_trial(a)->status == TrialStatus::done);
  // note is the store's own column, not a setting.
  CHECK_FALSE(has(store.setting_columns(), "note"));
  CHECK(store.tag_trials({a, b}, "old") == 2);
  store.set_note(a, "from schema 5");
  CHECK(store.get_trial(a)->note == "from schema 5");
  check_sound(db);
}

TEST_CASE("annotations: a database of dprun 0.1.0 (schema 1) gains tags when migrated",
          "[store][annotations]") {
  ScratchDir dir;
  const std::string db = dir.file("v1.db");
  std::filesystem::copy_file(
      std::string(DPRUN_TEST_SOURCE_DIR) + "/tests/runner/fixtures/upgrade-v1.db", db);
  {
    Store old(db, Store::Mode::read_only);
    const auto exp = old.find_experiment("upgrade");
    REQUIRE(exp);
    for (const auto& t : old.trials(exp->id)) CHECK(t.tags.empty());
  }
  Store store = dpstest::open_store(db);
  const auto exp = store.find_experiment("upgrade");
  REQUIRE(exp);
  const auto trials = store.trials(exp->id);
  REQUIRE(trials.size() == 4);
  CHECK(store.tag_trials({trials[0].id}, "v1") == 1);
  CHECK(store.trial_summaries(exp->id)[0].trial.tags == Tags{"v1"});
  CHECK(dpstest::scalar(store, "SELECT tags FROM trial_summary WHERE trial_id = " +
                                   std::to_string(trials[0].id)) == "v1");
  check_sound(db);
}

TEST_CASE("annotations: tags round trip sorted through every read and the view",
          "[store][annotations]") {
  ScratchDir dir;
  const std::string db = dir.file("results.db");
  Store store = dpstest::open_store(db);
  const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
  const int64_t a = store.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).id;
  const int64_t b = store.ensure_trial(exp, "b", 1, dpstest::settings("lenet", 2)).id;

  CHECK(store.tag_trials({a, b}, "baseline") == 2);
  CHECK(store.tag_trials({a}, "z-last") == 1);
  CHECK(store.tag_trials({a}, "A.first_1") == 1);
  CHECK(store.tag_trials({a, a, b}, "baseline") == 0);  // had it: kept once
  const Tags sorted{"A.first_1", "baseline", "z-last"};
  CHECK(store.get_trial(a)->tags == sorted);
  CHECK(store.find_trial(exp, "a")->tags == sorted);
  CHECK(store.trials(exp)[0].tags == sorted);
  CHECK(store.trials(exp)[1].tags == Tags{"baseline"});
  CHECK(store.trial_summaries(exp)[0].trial.tags == sorted);
  CHECK(store.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).tags == sorted);
  CHECK(store.trial_state(a).trial.tags == sorted);
  CHECK(dpstest::scalar(store, "SELECT tags FROM trial_summary WHERE trial_id = " +
                                   std::to_string(a)) == "A.first_1,baseline,z-last");

  SECTION("removing a tag") {
    CHECK(store.untag_trials({a, b}, "z-last") == 1);
    CHECK(store.untag_trials({a, b}, "z-last") == 0);
    CHECK(store.untag_trials({a, b}, "baseline") == 2);
    CHECK(store.get_trial(a)->tags == Tags{"A.first_1"});
    CHECK(store.get_trial(b)->tags.empty());
    CHECK_FALSE(dpstest::scalar(
                    store, "SELECT tags FROM trial_summary WHERE trial_id = " + std::to_string(b))
                    .has_value());  // NULL: none
  }
  SECTION("an unknown trial id changes nothing") {
    CHECK_THROWS_WITH(store.tag_trials({a, 98, 99}, "new"),
                      Contains("tag: no trials with ids 98, 99 (nothing was changed)"));
    CHECK_THROWS_WITH(store.untag_trials({a, 99}, "baseline"),
                      Contains("no trial with id 99 (nothing was changed)"));
    CHECK(store.get_trial(a)->tags == sorted);
    CHECK_THROWS_WITH(store.set_note(99, "x"), Contains("no trial with id 99"));
  }
  SECTION("tag names are checked, by the store and by the table") {
    CHECK(dps::tag_name_problem("ok-1.2_x").empty());
    for (const std::string& bad :
         std::vector<std::string>{"", "a b", "a,b", "é", "semi;colon", std::string(65, 'x')}) {
      INFO(bad);
      CHECK_THAT(dps::tag_name_problem(bad), Contains("tag \"" + bad + "\": "));
      CHECK_THROWS_AS(store.tag_trials({a}, bad), StoreError);
    }
    CHECK_THAT(dps::tag_name_problem(""), Contains("is empty"));
    CHECK_THAT(dps::tag_name_problem("a,b"), Contains("A-Z a-z 0-9 _ . -"));
    CHECK(store.get_trial(a)->tags == sorted);
    sqlite3* raw = nullptr;
    REQUIRE(sqlite3_open(db.c_str(), &raw) == SQLITE_OK);
    CHECK(sqlite3_exec(raw, "INSERT INTO trial_tags (trial_id, tag) VALUES (1, 'a,b')", nullptr,
                       nullptr, nullptr) == SQLITE_CONSTRAINT);
    sqlite3_close(raw);
  }
}

TEST_CASE("annotations: notes keep odd text as given, and an empty one clears",
          "[store][annotations]") {
  ScratchDir dir;
  const std::string db = dir.file("results.db");
  Store store = dpstest::open_store(db);
  const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
  const int64_t a = store.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).id;
  CHECK(store.get_trial(a)->note.empty());
  const std::string odd = "it's \"odd\"; DROP TABLE trials; --\nline 2\tü ✓ %s \\";
  store.set_note(a, odd);
  CHECK(store.get_trial(a)->note == odd);
  CHECK(store.trial_summaries(exp)[0].trial.note == odd);
  CHECK(dpstest::scalar(store, "SELECT note FROM trial_summary") == odd);
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM trials") == "1");
  store.set_note(a, "");
  CHECK(store.get_trial(a)->note.empty());
  CHECK(dpstest::scalar(store, "SELECT note IS NULL FROM trials") == "1");
}

TEST_CASE(
    "annotations: a trial new to a database brings its tags and note, one there keeps its own",
    "[store][annotations]") {
  ScratchDir dir;
  Store from = dpstest::open_store(dir.file("from.db"));
  Store to = dpstest::open_store(dir.file("to.db"));
  const int64_t from_exp = from.upsert_experiment("e", "", "x = 1", 1);
  const int64_t to_exp = to.upsert_experiment("e", "", "x = 1", 1);
  const int64_t id = ran_trial(from, from_exp, "a", 1, 1);
  from.tag_trials({id}, "carried");
  from.set_note(id, "carried note");
  const int64_t there = to.put_trial_state(to_exp, from.trial_state(id));
  CHECK(to.get_trial(there)->tags == Tags{"carried"});
  CHECK(to.get_trial(there)->note == "carried note");
  // A merge of the same trial again (its task's result) leaves this database's words alone.
  to.untag_trials({there}, "carried");
  to.tag_trials({there}, "here");
  to.set_note(there, "here note");
  to.put_trial_state(to_exp, from.trial_state(id));
  CHECK(to.get_trial(there)->tags == Tags{"here"});
  CHECK(to.get_trial(there)->note == "here note");
}

TEST_CASE("forget: a trial goes with its epochs, attempts, checkpoints, tags and tasks",
          "[store][annotations]") {
  ScratchDir dir;
  const std::string db = dir.file("results.db");
  Store store = dpstest::open_store(db);
  const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
  const int64_t a = ran_trial(store, exp, "a", 1, 2);
  const int64_t b = ran_trial(store, exp, "b", 2, 2, TrialStatus::failed);
  const int64_t kept = ran_trial(store, exp, "kept", 4, 1);
  store.tag_trials({a, b, kept}, "t");
  store.set_note(a, "going");
  // A Slurm task of b that was collected (closed): its row goes with b.
  dps::SubmissionRow s;
  s.experiment_id = exp;
  s.scheduler = "slurm";
  s.folder = "results.tasks/s0001";
  s.command = "sbatch";
  dps::TaskRow task;
  task.index = 0;
  task.trial_id = b;
  task.database = "results.tasks/s0001/task-0.db";
  const int64_t sub = store.add_submission(s, {task});
  REQUIRE(store.close_lost_task(sub, 0, "cancelled"));

  SECTION("an unknown id changes nothing") {
    CHECK_THROWS_WITH(store.forget_trials({a, 99}, 120),
                      Contains("forget: no trial with id 99 (nothing was changed)"));
    CHECK(store.trials(exp).size() == 3);
    CHECK(count(db, "epochs", a) == "2");
  }
  SECTION("forgotten, with the rows that name its files returned") {
    const auto files = store.forget_trials({a, b, a}, 120);
    REQUIRE(files.size() == 2);
    CHECK(files[0].path == "results.checkpoints/trial-" + std::to_string(a) + "/last.safetensors");
    CHECK(files[1].optimizer_path ==
          "results.checkpoints/trial-" + std::to_string(b) + "/last.optimizer.safetensors");
    CHECK_FALSE(store.get_trial(a));
    CHECK_FALSE(store.get_trial(b));
    for (int64_t id : {a, b}) {
      for (const char* table : {"epochs", "attempts", "checkpoints", "trial_tags", "tasks"}) {
        INFO(table << " of trial " << id);
        CHECK(count(db, table, id) == "0");
      }
    }
    // The other trial is untouched.
    REQUIRE(store.trials(exp).size() == 1);
    CHECK(store.get_trial(kept)->tags == Tags{"t"});
    CHECK(count(db, "epochs", kept) == "1");
    CHECK(count(db, "checkpoints", kept) == "1");
    check_sound(db);
    // A trial forgotten is simply absent: the next run creates it again, pending.
    const auto again = store.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1));
    CHECK(again.status == TrialStatus::pending);
    CHECK(again.epochs_done == 0);
    CHECK(again.tags.empty());
    CHECK(again.note.empty());
  }
}

TEST_CASE("forget: refuses a trial a live runner or an open Slurm task holds",
          "[store][annotations]") {
  ScratchDir dir;
  const std::string db = dir.file("results.db");
  Store store = dpstest::open_store(db);
  const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
  const int64_t id = store.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).id;
  CHECK(store.forget_refusal(id, 120).empty());

  SECTION("running in a live dprun on this host") {
    REQUIRE(store.claim_trial(id, TrialStatus::pending, getpid(), host_name()));
    CHECK_THAT(store.forget_refusal(id, 120),
               Contains("it is running in dprun pid " + std::to_string(getpid()) +
                        " on this host: stop that dprun"));
    CHECK_THROWS_WITH(store.forget_trials({id}, 120),
                      Contains("trial " + std::to_string(id) + ": it is running") &&
                          Contains("(nothing was changed)"));
    CHECK(store.get_trial(id));
  }
  SECTION("running on another host with a fresh heartbeat; stale once it is old") {
    REQUIRE(store.claim_trial(id, TrialStatus::pending, 12345, "elsewhere"));
    CHECK_THAT(store.forget_refusal(id, 120), Contains("pid 12345 on elsewhere"));
    dpstest::raw_exec(db, "UPDATE trials SET heartbeat_at = '2000-01-01T00:00:00.000Z'");
    CHECK(store.forget_refusal(id, 120).empty());
  }
  SECTION("running, but its runner is gone") {
    REQUIRE(store.claim_trial(id, TrialStatus::pending, dead_pid(), host_name()));
    CHECK(store.forget_refusal(id, 120).empty());
    store.forget_trials({id}, 120);
    CHECK_FALSE(store.get_trial(id));
    check_sound(db);
  }
  SECTION("held by a Slurm task not collected yet") {
    dps::SubmissionRow s;
    s.experiment_id = exp;
    s.scheduler = "slurm";
    s.folder = "f";
    s.command = "sbatch";
    dps::TaskRow task;
    task.index = 3;
    task.trial_id = id;
    task.database = "f/t.db";
    const int64_t sub = store.add_submission(s, {task});
    store.set_submission_job(sub, "77");
    CHECK_THAT(store.forget_refusal(id, 120), Contains("Slurm job 77_3 runs it"));
    CHECK_THROWS_AS(store.forget_trials({id}, 120), StoreError);
    REQUIRE(store.close_lost_task(sub, 3, "cancelled"));
    CHECK(store.forget_refusal(id, 120).empty());
  }
}
