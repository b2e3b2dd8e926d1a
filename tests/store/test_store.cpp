// The store: opening and versioning, the trial lifecycle, stale-runner recovery, cascades and
// two writers on one file.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "store_test_util.hpp"

using Catch::Matchers::Contains;
using dps::Store;
using dps::StoreError;
using dps::TrialStatus;
using dpstest::ScratchDir;

namespace {

std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

dps::TrialStart start_info(int64_t pid) {
  dps::TrialStart s;
  s.backend = "cpu";
  s.devices = "cpu:0,cpu:1";
  s.host = this_host();
  s.dprun_version = "0.1.0";
  s.plugin_path = "/plugins/liblenet.so";
  s.plugin_sha256 = dps::sha256_hex("plugin");
  s.runner_pid = pid;
  return s;
}

// A pid that certainly belonged to a process that has exited (and been reaped).
int64_t dead_pid() {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return child;
}

}  // namespace

TEST_CASE("a fresh database has the schema, WAL and foreign keys", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("nested/folders/results.db");  // parents are created
  Store store(path);
  CHECK(store.path() == path);
  CHECK(store.user_version() == dps::schema_version());
  CHECK(dps::schema_version() == 9);
  CHECK(dpstest::scalar(store, "PRAGMA user_version") == "9");
  CHECK(dpstest::raw_scalar(path, "PRAGMA journal_mode") == "wal");  // persistent in the file
  CHECK(dpstest::scalar(store, "PRAGMA foreign_keys") == "1");
  CHECK(dpstest::scalar(store, "PRAGMA synchronous") == "1");  // NORMAL

  dps::QueryResult objects = store.query(
      "SELECT type || ':' || name FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%' "
      "AND type IN ('table', 'view') ORDER BY 1");
  std::vector<std::string> names;
  for (auto& row : objects.rows) names.push_back(*row[0]);
  CHECK(names == std::vector<std::string>{"table:attempts", "table:checkpoints", "table:epochs",
                                          "table:experiments", "table:submissions", "table:tasks",
                                          "table:trial_tags", "table:trials", "view:scaling",
                                          "view:trial_summary"});

  // Every TrialSettings field is a column of trials under its documented name.
  std::set<std::string> columns;
  for (auto& row : store.query("SELECT name FROM pragma_table_info('trials')").rows) {
    columns.insert(*row[0]);
  }
  for (const char* c : {"id",
                        "experiment_id",
                        "config_hash",
                        "ordinal",
                        "model",
                        "model_options",
                        "dataset",
                        "data_path",
                        "gpus",
                        "batch_size",
                        "per_gpu_batch",
                        "lr",
                        "epochs",
                        "seed",
                        "optimizer",
                        "momentum",
                        "weight_decay",
                        "precision",
                        "layout",
                        "bn_mode",
                        "eval_batch_size",
                        "train_limit",
                        "test_limit",
                        "backend_request",
                        "status",
                        "error",
                        "attempts",
                        "backend",
                        "devices",
                        "oversubscribed",
                        "host",
                        "dprun_version",
                        "plugin_path",
                        "plugin_sha256",
                        "runner_pid",
                        "created_at",
                        "started_at",
                        "finished_at",
                        "heartbeat_at",
                        "hosts",
                        "launch",
                        "device_set",
                        "resumed_from_epoch",
                        "rung",
                        "note",
                        "data_residence",
                        "layout_used",
                        "graphs_used"}) {
    INFO(c);
    CHECK(columns.count(c) == 1);
  }
}

TEST_CASE("reopening keeps the data and migrates nothing", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  int64_t exp = 0;
  {
    Store store(path);
    exp = store.upsert_experiment("quickstart", "first", "[model]\nname = \"lenet\"\n", 1);
    store.ensure_trial(exp, "h1", 0, dpstest::settings("lenet", 1));
  }
  Store again(path);
  CHECK(again.user_version() == 9);
  CHECK(again.upsert_experiment("quickstart", "first", "[model]\nname = \"lenet\"\n", 1) == exp);
  REQUIRE(again.trials(exp).size() == 1);
  // A second migration would have failed on "table experiments already exists"; also check the
  // schema objects exist once.
  CHECK(dpstest::scalar(again, "SELECT COUNT(*) FROM sqlite_schema WHERE name = 'trials'") == "1");
}

TEST_CASE("a database from a newer dprun is refused", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  { Store store(path); }
  const std::string newer = std::to_string(dps::schema_version() + 1);
  dpstest::raw_exec(path, "PRAGMA user_version = " + newer);
  const std::string expected = path + ": database schema version " + newer +
                               " is newer than this dprun supports (" +
                               std::to_string(dps::schema_version()) + "): upgrade dprun";
  REQUIRE_THROWS_AS(Store(path), StoreError);
  REQUIRE_THROWS_WITH(Store(path), expected);
  REQUIRE_THROWS_WITH(Store(path, Store::Mode::read_only), expected);
}

TEST_CASE("files that are not dprun databases are refused with clear messages", "[store]") {
  ScratchDir dir;
  SECTION("a text file") {
    const std::string path = dir.file("notes.db");
    std::ofstream(path) << "this is not a database, just some text that is long enough to "
                           "cover the 100-byte SQLite header completely.........................";
    REQUIRE_THROWS_WITH(Store(path), Contains(path) && Contains("not an SQLite database"));
    REQUIRE_THROWS_WITH(Store(path, Store::Mode::read_only),
                        Contains(path) && Contains("not an SQLite database"));
  }
  SECTION("someone else's SQLite database") {
    const std::string path = dir.file("other.db");
    dpstest::raw_exec(path, "CREATE TABLE trials (x INTEGER)");
    REQUIRE_THROWS_WITH(Store(path), Contains(path) && Contains("not a dprun one"));
  }
  SECTION("read-only needs an existing file") {
    const std::string path = dir.file("missing.db");
    REQUIRE_THROWS_WITH(Store(path, Store::Mode::read_only),
                        Contains(path) && Contains("no such database file"));
    CHECK_FALSE(std::filesystem::exists(path));
  }
  SECTION("a folder") { REQUIRE_THROWS_WITH(Store(dir.file("")), Contains("is a folder")); }
}

TEST_CASE("read-only stores cannot write, through query or the connection", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  int64_t exp = 0;
  {
    Store store(path);
    exp = store.upsert_experiment("e", "", "x = 1", 1);
    store.ensure_trial(exp, "h1", 0, dpstest::settings("lenet", 1));
  }
  Store ro(path, Store::Mode::read_only);
  CHECK(ro.user_version() == 9);
  REQUIRE(ro.trials(exp).size() == 1);
  CHECK(dpstest::scalar(ro, "SELECT name FROM experiments") == "e");
  REQUIRE_THROWS_WITH(ro.query("INSERT INTO experiments (name, toml_source, toml_sha256) "
                               "VALUES ('x', '', '')"),
                      Contains("query: only read-only statements are allowed (got: INSERT"));
  // The connection itself is read-only: the API's own writes fail too.
  REQUIRE_THROWS_AS(ro.upsert_experiment("other", "", "y = 2", 1), StoreError);
  REQUIRE_THROWS_WITH(ro.start_trial(ro.trials(exp)[0].id, start_info(1)), Contains("readonly"));
  Store rw(path);
  CHECK(dpstest::scalar(rw, "SELECT COUNT(*) FROM experiments") == "1");
  CHECK(rw.trials(exp)[0].status == TrialStatus::pending);
}

TEST_CASE("upsert_experiment finds by name and updates the source", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  const int64_t a = store.upsert_experiment("scaling", "v1", "gpus = [1, 2]", 1);
  const int64_t b = store.upsert_experiment("other", "", "x = 1", 1);
  CHECK(a != b);
  CHECK(store.upsert_experiment("scaling", "v2", "gpus = [1, 2, 4]", 1) == a);
  dps::QueryResult r = store.query(
      "SELECT description, toml_source, toml_sha256 FROM experiments WHERE name = 'scaling'");
  REQUIRE(r.rows.size() == 1);
  CHECK(r.rows[0][0] == "v2");
  CHECK(r.rows[0][1] == "gpus = [1, 2, 4]");
  CHECK(r.rows[0][2] == dps::sha256_hex("gpus = [1, 2, 4]"));
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM experiments") == "2");
}

TEST_CASE("an experiment keeps the defaults generation it was made with", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  const int64_t a = store.upsert_experiment("a", "", "x = 1", 1);
  store.upsert_experiment("b", "", "x = 1", 3);
  CHECK(store.upsert_experiment("a", "changed", "x = 2", 1) == a);
  // Its file read with another generation's defaults: refused, nothing changed.
  CHECK_THROWS_WITH(store.upsert_experiment("a", "again", "x = 3", 3),
                    Contains("experiment \"a\" was begun with the defaults of generation 1") &&
                        Contains("read with those of generation 3"));
  CHECK(dpstest::scalar(store, "SELECT description FROM experiments WHERE name = 'a'") ==
        "changed");
  CHECK(store.find_experiment("a")->defaults == 1);
  CHECK(store.find_experiment("b")->defaults == 3);
  CHECK(store.experiments().at(1).defaults == 3);
  CHECK_THROWS_WITH(store.upsert_experiment("c", "", "", 0), Contains("defaults generation 0"));
  CHECK_FALSE(store.find_experiment("c"));

  // Read without a Store, as a runner does before it opens the database to write.
  CHECK(dps::experiment_defaults(dir.file("results.db"), "b") == 3);
  CHECK_FALSE(dps::experiment_defaults(dir.file("results.db"), "c"));
  CHECK_FALSE(dps::experiment_defaults(dir.file("none.db"), "a"));
  // A file another dprun has just created, its schema not written yet: nothing there yet.
  dpstest::raw_exec(dir.file("new.db"), "PRAGMA user_version = 0");
  REQUIRE(std::filesystem::exists(dir.file("new.db")));
  CHECK_FALSE(dps::experiment_defaults(dir.file("new.db"), "a"));
  // A database of something else is an error, as Store says it.
  dpstest::raw_exec(dir.file("other.db"), "CREATE TABLE t (x)");
  CHECK_THROWS_WITH(dps::experiment_defaults(dir.file("other.db"), "a"),
                    Contains("not a dprun database"));
}

TEST_CASE("ensure_trial is idempotent by config hash and round-trips every setting", "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("results.db"));
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  const dps::SettingValues s = {{"model", "resnet18"},
                                {"model_options", R"({"width":0.5})"},
                                {"dataset", "fashion-mnist"},
                                {"data_path", "/data/fmnist"},
                                {"gpus", int64_t{4}},
                                {"batch_size", int64_t{512}},
                                {"per_gpu_batch", int64_t{128}},
                                {"lr", 0.05},
                                {"epochs", int64_t{7}},
                                {"seed", int64_t{42}},
                                {"optimizer", "sgd"},
                                {"momentum", 0.9},
                                {"weight_decay", 5e-4},
                                {"precision", "fp16"},
                                {"layout", "nhwc"},
                                {"bn_mode", "sync"},
                                {"eval_batch_size", int64_t{1024}},
                                {"train_limit", int64_t{6000}},
                                {"test_limit", int64_t{1000}},
                                {"backend_request", "cuda"}};

  dps::TrialRow first = store.ensure_trial(exp, "hash-a", 3, s);
  CHECK(first.id > 0);
  CHECK(first.experiment_id == exp);
  CHECK(first.config_hash == "hash-a");
  CHECK(first.ordinal == 3);
  CHECK(first.status == TrialStatus::pending);
  CHECK(first.attempts == 0);
  CHECK(first.epochs_done == 0);
  CHECK(first.error.empty());
  CHECK(first.started_at.empty());
  CHECK(first.created_at.size() == 24);  // 2024-01-02T03:04:05.678Z
  CHECK(first.created_at.back() == 'Z');
  // Every setting column comes back under its name with the value and type it was given.
  CHECK(first.settings == s);
  CHECK(dpstest::setting<double>(first, "lr") == 0.05);
  CHECK(dpstest::setting<int64_t>(first, "seed") == 42);

  // Same hash: same row, ordinal moved (the sweep was reordered), nothing inserted.
  dps::TrialRow again = store.ensure_trial(exp, "hash-a", 1, s);
  CHECK(again.id == first.id);
  CHECK(again.ordinal == 1);
  dps::TrialRow other = store.ensure_trial(exp, "hash-b", 0, dpstest::settings("lenet", 1));
  CHECK(other.id != first.id);
  auto all = store.trials(exp);
  REQUIRE(all.size() == 2);
  CHECK(all[0].id == other.id);  // ordered by ordinal
  CHECK(all[1].id == first.id);
  CHECK(store.find_trial(exp, "hash-a")->id == first.id);
  CHECK_FALSE(store.find_trial(exp, "nope").has_value());
  CHECK_FALSE(store.get_trial(999999).has_value());
  REQUIRE_THROWS_WITH(store.ensure_trial(exp + 100, "h", 0, s), Contains("no experiment with id"));
  dps::SettingValues unknown = s;
  unknown["warp_factor"] = int64_t{9};
  REQUIRE_THROWS_WITH(store.ensure_trial(exp, "h", 0, unknown),
                      Contains("no setting column \"warp_factor\""));
}

TEST_CASE("trial lifecycle: pending, running, epochs, done", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  const int64_t id = store.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 2)).id;

  store.start_trial(id, start_info(getpid()));
  dps::TrialRow t = *store.get_trial(id);
  CHECK(t.status == TrialStatus::running);
  CHECK(t.attempts == 1);
  CHECK(t.backend == "cpu");
  CHECK(t.devices == "cpu:0,cpu:1");
  CHECK(t.host == this_host());
  CHECK(t.dprun_version == "0.1.0");
  CHECK(t.plugin_path == "/plugins/liblenet.so");
  CHECK(t.plugin_sha256 == dps::sha256_hex("plugin"));
  CHECK(t.runner_pid == getpid());
  CHECK_FALSE(t.started_at.empty());
  CHECK_FALSE(t.heartbeat_at.empty());
  CHECK(t.finished_at.empty());

  store.record_epoch(dpstest::epoch_row(id, 1, 0.70, 3.0));
  store.record_epoch(dpstest::epoch_row(id, 2, 0.80, 2.0));
  // The same epoch again (a retried write) replaces the row instead of adding one.
  dps::EpochRow second = dpstest::epoch_row(id, 2, 0.85, 2.5, 0.25);
  second.peak_memory_bytes = 123456789012;
  store.record_epoch(second);
  store.heartbeat(id);
  auto rows = store.epochs(id);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].epoch == 1);
  CHECK(rows[1].epoch == 2);
  CHECK(rows[1].test_acc == 0.85);
  CHECK(rows[1].seconds == 2.5);
  CHECK(rows[1].train_loss == 0.25);
  CHECK(rows[1].peak_memory_bytes == 123456789012);
  CHECK(rows[1].eval_seconds == 0.5);
  CHECK(rows[1].examples_per_second == 400.0);
  CHECK(store.get_trial(id)->epochs_done == 2);

  store.finish_trial(id, TrialStatus::done);
  t = *store.get_trial(id);
  CHECK(t.status == TrialStatus::done);
  CHECK(t.error.empty());
  CHECK_FALSE(t.finished_at.empty());
  CHECK(t.finished_at >= t.started_at);
  CHECK(dpstest::scalar(store, "SELECT error IS NULL FROM trials") == "1");

  REQUIRE_THROWS_WITH(store.finish_trial(id, TrialStatus::running), Contains("not a final status"));
  REQUIRE_THROWS_WITH(store.record_epoch(dpstest::epoch_row(id + 50, 1, 0.1, 1)),
                      Contains("no trial with id"));
  REQUIRE_THROWS_WITH(store.start_trial(id + 50, start_info(1)), Contains("no trial with id"));
  REQUIRE_THROWS_WITH(store.finish_trial(id + 50, TrialStatus::failed),
                      Contains("no trial with id"));
}

TEST_CASE("a diverged epoch with NaN metrics is stored as NULL and read back as NaN", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  const int64_t id = store.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 1)).id;
  store.start_trial(id, start_info(getpid()));
  store.record_epoch(dpstest::epoch_row(id, 1, 0.1, 1.0, std::nan("")));
  store.finish_trial(id, TrialStatus::diverged, "train loss is NaN at epoch 1");
  CHECK(std::isnan(store.epochs(id)[0].train_loss));
  CHECK(dpstest::scalar(store, "SELECT train_loss FROM epochs") == std::nullopt);
  dps::TrialRow t = *store.get_trial(id);
  CHECK(t.status == TrialStatus::diverged);
  CHECK(t.error == "train loss is NaN at epoch 1");
}

TEST_CASE(
    "the epoch metrics list is the epochs table, and a metric a database lacks is added or read "
    "as missing",
    "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  int64_t id = 0;
  {
    Store store(path);
    const int64_t exp = store.upsert_experiment("e", "", "", 1);
    id = store.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 1)).id;
    store.start_trial(id, start_info(getpid()));
    store.record_epoch(dpstest::epoch_row(id, 1, 0.7, 3.0));
  }
  // Every metric is a column, and nothing else is (a metric added later comes after
  // recorded_at in a database made before it: the order of the columns does not matter).
  std::string expected;
  std::set<std::string> names = {"trial_id", "epoch", "recorded_at"};
  for (const dps::EpochMetric& m : dps::epoch_metrics()) names.insert(m.name);
  for (const auto& n : names) expected += (expected.empty() ? "" : ",") + n;
  CHECK(dpstest::raw_scalar(path, "SELECT group_concat(name) FROM (SELECT name FROM "
                                  "pragma_table_info('epochs') ORDER BY name)") == expected);
  // A database of a dprun that had no eval_seconds yet.
  dpstest::raw_exec(path, "ALTER TABLE epochs DROP COLUMN eval_seconds");
  {
    Store read_only(path, Store::Mode::read_only);
    const auto rows = read_only.epochs(id);
    REQUIRE(rows.size() == 1);
    CHECK(rows[0].test_acc == 0.7);
    CHECK(std::isnan(rows[0].eval_seconds));  // missing, not a measured 0
  }
  CHECK(dpstest::raw_scalar(path,
                            "SELECT count(*) FROM pragma_table_info('epochs') WHERE name = "
                            "'eval_seconds'") == "0");  // reading changed nothing
  {
    Store store(path);  // read-write: the column comes back, NULL for the epoch already there
    dps::EpochRow second = dpstest::epoch_row(id, 2, 0.8, 2.0);
    store.record_epoch(second);
    const auto rows = store.epochs(id);
    REQUIRE(rows.size() == 2);
    CHECK(std::isnan(rows[0].eval_seconds));
    CHECK(rows[1].eval_seconds == second.eval_seconds);
  }
}

TEST_CASE("restarting a trial drops the partial epochs of the earlier attempt", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  const int64_t id = store.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 1)).id;
  store.start_trial(id, start_info(getpid()));
  store.record_epoch(dpstest::epoch_row(id, 1, 0.5, 1.0));
  store.record_epoch(dpstest::epoch_row(id, 2, 0.6, 1.0));
  store.finish_trial(id, TrialStatus::interrupted, "stopped by the user");

  dps::TrialStart again = start_info(getpid());
  again.backend = "cuda";
  again.oversubscribed = true;
  store.start_trial(id, again);
  dps::TrialRow t = *store.get_trial(id);
  CHECK(t.attempts == 2);
  CHECK(t.status == TrialStatus::running);
  CHECK(t.error.empty());
  CHECK(t.finished_at.empty());
  CHECK(t.backend == "cuda");
  CHECK(t.oversubscribed);
  CHECK(t.epochs_done == 0);
  CHECK(store.epochs(id).empty());
}

TEST_CASE("recover_stale interrupts trials of dead runners and silent ones", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  Store store(path);
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  auto make_running = [&](const std::string& hash, int64_t pid, const std::string& host) {
    const int64_t id = store.ensure_trial(exp, hash, 0, dpstest::settings("lenet", 1)).id;
    dps::TrialStart s = start_info(pid);
    s.host = host;
    store.start_trial(id, s);
    return id;
  };
  const int64_t gone = dead_pid();
  const int64_t dead = make_running("dead", gone, this_host());
  const int64_t alive = make_running("alive", getpid(), this_host());
  // The same pid on another machine says nothing about that machine's processes.
  const int64_t elsewhere = make_running("elsewhere", gone, "some-other-host");
  const int64_t silent = make_running("silent", getpid(), this_host());
  dpstest::raw_exec(path,
                    "UPDATE trials SET heartbeat_at = '2000-01-01T00:00:00.000Z' "
                    "WHERE config_hash = 'silent'");
  const int64_t finished = make_running("finished", gone, this_host());
  store.finish_trial(finished, TrialStatus::done);

  CHECK(store.recover_stale(exp, 3600.0) == 2);
  dps::TrialRow d = *store.get_trial(dead);
  CHECK(d.status == TrialStatus::interrupted);
  CHECK(d.error ==
        "runner stopped without finishing this trial (pid " + std::to_string(gone) + ")");
  CHECK_FALSE(d.finished_at.empty());
  dps::TrialRow s = *store.get_trial(silent);
  CHECK(s.status == TrialStatus::interrupted);
  CHECK_THAT(s.error, Contains("runner stopped without finishing this trial (pid " +
                               std::to_string(getpid()) + ")") &&
                          Contains("no heartbeat"));
  CHECK(store.get_trial(alive)->status == TrialStatus::running);
  CHECK(store.get_trial(elsewhere)->status == TrialStatus::running);
  CHECK(store.get_trial(finished)->status == TrialStatus::done);
  CHECK(store.recover_stale(exp, 3600.0) == 0);  // nothing left to recover
  CHECK(store.recover_stale(exp + 1, 3600.0) == 0);
}

TEST_CASE("deleting rows cascades: experiment -> trials -> epochs", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  Store store(path);
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  const int64_t a = store.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).id;
  const int64_t b = store.ensure_trial(exp, "b", 1, dpstest::settings("lenet", 2)).id;
  for (int64_t id : {a, b}) {
    store.start_trial(id, start_info(getpid()));
    store.record_epoch(dpstest::epoch_row(id, 1, 0.5, 1.0));
    store.record_epoch(dpstest::epoch_row(id, 2, 0.6, 1.0));
  }
  dpstest::raw_exec(path, "DELETE FROM trials WHERE id = " + std::to_string(a));
  CHECK(store.epochs(a).empty());
  CHECK(store.epochs(b).size() == 2);
  dpstest::raw_exec(path, "DELETE FROM experiments");
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM trials") == "0");
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM epochs") == "0");
}

TEST_CASE("two stores on one file write alternately without lock errors", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  Store first(path);
  Store second(path);
  const int64_t exp = first.upsert_experiment("e", "", "", 1);
  CHECK(second.upsert_experiment("e", "", "", 1) == exp);
  const int64_t a = first.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).id;
  const int64_t b = second.ensure_trial(exp, "b", 1, dpstest::settings("lenet", 2)).id;
  first.start_trial(a, start_info(getpid()));
  second.start_trial(b, start_info(getpid()));
  for (int e = 1; e <= 20; ++e) {
    first.record_epoch(dpstest::epoch_row(a, e, 0.5, 1.0));
    // A reader in between must see the other connection's committed rows.
    CHECK(static_cast<int>(second.epochs(a).size()) == e);
    second.record_epoch(dpstest::epoch_row(b, e, 0.5, 1.0));
    CHECK(static_cast<int>(first.epochs(b).size()) == e);
  }
  first.finish_trial(a, TrialStatus::done);
  second.finish_trial(b, TrialStatus::done);
  CHECK(first.get_trial(b)->status == TrialStatus::done);
  CHECK(second.get_trial(a)->status == TrialStatus::done);
}

TEST_CASE("claim_trial lets only one of two runners take a trial", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  Store first(path);
  Store second(path);
  const int64_t exp = first.upsert_experiment("e", "", "", 1);
  const int64_t id = first.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).id;
  // Both runners planned the trial as pending; only the first claim wins.
  CHECK(first.claim_trial(id, TrialStatus::pending, getpid(), this_host()));
  CHECK_FALSE(second.claim_trial(id, TrialStatus::pending, getpid() + 1, "elsewhere"));
  dps::TrialRow t = *second.get_trial(id);
  CHECK(t.status == TrialStatus::running);
  CHECK(t.runner_pid == getpid());
  CHECK(t.host == this_host());
  CHECK(t.attempts == 0);  // start_trial counts the attempt
  CHECK_FALSE(t.heartbeat_at.empty());

  // A trial the other runner finished meanwhile is not taken (and its epochs stay).
  first.start_trial(id, start_info(getpid()));
  first.record_epoch(dpstest::epoch_row(id, 1, 0.7, 1.0));
  first.finish_trial(id, TrialStatus::done);
  CHECK_FALSE(second.claim_trial(id, TrialStatus::pending, getpid(), this_host()));
  CHECK(second.get_trial(id)->status == TrialStatus::done);
  CHECK(second.epochs(id).size() == 1);
  // --rerun: a runner that planned it as done may take it again.
  CHECK(second.claim_trial(id, TrialStatus::done, getpid(), this_host()));
  REQUIRE_THROWS_WITH(first.claim_trial(id + 50, TrialStatus::pending, 1, ""),
                      Contains("no trial with id"));
}

TEST_CASE("two processes writing one file at the same time both succeed", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  int64_t a = 0, b = 0;
  {
    Store store(path);
    const int64_t exp = store.upsert_experiment("e", "", "", 1);
    a = store.ensure_trial(exp, "a", 0, dpstest::settings("lenet", 1)).id;
    b = store.ensure_trial(exp, "b", 1, dpstest::settings("lenet", 2)).id;
  }
  constexpr int kEpochs = 150;
  auto writer = [&](int64_t trial) {
    Store store(path);
    store.start_trial(trial, start_info(getpid()));
    for (int e = 1; e <= kEpochs; ++e) {
      store.record_epoch(dpstest::epoch_row(trial, e, 0.5, 1.0));
      store.heartbeat(trial);
    }
    store.finish_trial(trial, TrialStatus::done);
  };
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child must not return into Catch2: report through the exit status only.
    int code = 0;
    try {
      writer(b);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child writer failed: %s\n", e.what());
      code = 1;
    }
    _exit(code);
  }
  std::string parent_error;
  try {
    writer(a);
  } catch (const std::exception& e) {
    parent_error = e.what();
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(parent_error.empty());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  Store store(path, Store::Mode::read_only);
  CHECK(store.epochs(a).size() == kEpochs);
  CHECK(store.epochs(b).size() == kEpochs);
  CHECK(store.get_trial(a)->status == TrialStatus::done);
  CHECK(store.get_trial(b)->status == TrialStatus::done);
}

TEST_CASE("several processes creating one new database at the same time all succeed", "[store]") {
  // Two `dprun` started together on a new results file: each opens it, sets WAL and migrates.
  // A race repeated a few times; every round must succeed for every process.
  constexpr int kRounds = 15, kProcesses = 4;
  for (int round = 0; round < kRounds; ++round) {
    ScratchDir dir;
    const std::string path = dir.file("results.db");
    int go[2];
    REQUIRE(pipe(go) == 0);
    std::vector<pid_t> children;
    for (int p = 0; p < kProcesses; ++p) {
      pid_t child = fork();
      REQUIRE(child >= 0);
      if (child == 0) {
        ::close(go[1]);
        char byte;
        while (::read(go[0], &byte, 1) < 0 && errno == EINTR) {
        }
        int code = 0;
        try {
          Store store(path);
          const int64_t exp = store.upsert_experiment("e", "", "", 1);
          store.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 1));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "process %d of round %d: %s\n", p, round, e.what());
          code = 1;
        }
        _exit(code);
      }
      children.push_back(child);
    }
    ::close(go[0]);
    ::close(go[1]);  // end of file: every child starts at once
    int failures = 0;
    for (pid_t c : children) {
      int status = 0;
      REQUIRE(waitpid(c, &status, 0) == c);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ++failures;
        UNSCOPED_INFO("a process ended with wait status " << status);
      }
    }
    INFO("round " << round);
    REQUIRE(failures == 0);
    Store store(path, Store::Mode::read_only);
    CHECK(store.user_version() == dps::schema_version());
    CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM trials") == "1");
  }
}

TEST_CASE("status names round-trip and unknown ones are refused", "[store]") {
  for (TrialStatus s :
       {TrialStatus::pending, TrialStatus::running, TrialStatus::done, TrialStatus::failed,
        TrialStatus::diverged, TrialStatus::interrupted, TrialStatus::skipped}) {
    CHECK(dps::parse_status(dps::status_name(s)) == s);
  }
  REQUIRE_THROWS_WITH(dps::parse_status("finished"), Contains("unknown trial status \"finished\""));
}

TEST_CASE("moved-from stores hand over their connection", "[store]") {
  ScratchDir dir;
  Store a(dir.file("results.db"));
  const int64_t exp = a.upsert_experiment("e", "", "", 1);
  Store b(std::move(a));
  CHECK(b.upsert_experiment("e", "", "", 1) == exp);
  Store c(dir.file("other.db"));
  c = std::move(b);
  CHECK(c.path() == dir.file("results.db"));
  CHECK(c.upsert_experiment("e", "", "", 1) == exp);
}

TEST_CASE("the status check takes the statuses of schema 5 and refuses others", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  {
    Store store(path);
    const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
    store.ensure_trial(exp, "h1", 0, dpstest::settings("lenet", 1));
  }
  dpstest::raw_exec(path, "UPDATE trials SET status = 'pruned'");
  dpstest::raw_exec(path, "UPDATE trials SET status = 'stopped'");
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  CHECK(sqlite3_exec(db, "UPDATE trials SET status = 'paused'", nullptr, nullptr, nullptr) ==
        SQLITE_CONSTRAINT);
  CHECK_THAT(std::string(sqlite3_errmsg(db)), Contains("CHECK constraint failed"));
  sqlite3_close(db);
  Store store(path);
  CHECK(store.trials(store.find_experiment("e")->id)[0].status == TrialStatus::stopped);
}
