// Upgrading dprun never re-runs finished trials: fixtures/upgrade-v1.db was written by dprun 0.1.0
// (how: see fixtures/upgrade.toml); this dprun, and a later one with more settings, must find its
// trials done under the same config hashes, plan nothing and run nothing, and the later one must
// add its settings to the database. Nothing here trains, so no dataset is needed.
#include <sqlite3.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>

#include "cli_helpers.hpp"
#include "experiment/experiment.hpp"
#include "later_settings.hpp"
#include "models/plugin_loader.hpp"
#include "sweep/sweep_runner.hpp"

namespace fs = std::filesystem;
using clitest::run;
using clitest::sql;
using clitest::sql1;

namespace {

const std::string kFixtures = std::string(DPRUN_TEST_SOURCE_DIR) + "/tests/runner/fixtures";

// The config hashes dprun 0.1.0 stored, by ordinal. Literal on purpose: a change of the hash
// function shows here even before the fixture database is opened.
const std::vector<std::string> kV1Hashes = {
    "45e350b981f693d8a49f440c4585b1bb66b7f31d6038e706c31aecd1090c4e6a",
    "e4c3f0c158d0b3cb2a65c5119aa99dc03f87996e2a72a7563715363a64b23591",
    "a99c30b1223afd4ad9c63ae7427025c0b865966059f07b0e861f91de62599020",
    "6285fb27bbdfc589e4891862271dfd007e7e579ffefb60ccb17e9cb11e5f342f"};

// The fixture copied into a scratch folder (the committed file is never opened for writing).
struct Upgrade {
  dptest::TempDir dir;
  std::string file = dir.path() + "/upgrade.toml";
  std::string db = dir.path() + "/upgrade.db";
  Upgrade() {
    fs::copy_file(kFixtures + "/upgrade.toml", file);
    fs::copy_file(kFixtures + "/upgrade-v1.db", db);
  }
};

}  // namespace

TEST_CASE("upgrade: this dprun computes the config hashes dprun 0.1.0 stored", "[upgrade]") {
  dprun::ModelCatalog catalog;
  for (const auto& [name, m] : dprun::scan_plugins({}).models) catalog.models[name] = m.factory;
  // As load_sweep reads it against the database it was begun in: with generation 1's defaults.
  dprun::ParseOptions begun_then;
  begun_then.settings = &dprun::builtin_settings().with_defaults(1);
  const auto ex = dprun::load_experiment(kFixtures + "/upgrade.toml", catalog, begun_then);
  REQUIRE(ex.trials.size() == kV1Hashes.size());
  for (size_t i = 0; i < kV1Hashes.size(); ++i) {
    INFO(ex.trials[i].canonical);
    CHECK(ex.trials[i].config_hash == kV1Hashes[i]);
  }
}

TEST_CASE("upgrade: a database of dprun 0.1.0 plans nothing and runs nothing", "[upgrade][cli]") {
  Upgrade u;
  std::vector<std::string> stored;
  for (const auto& row :
       sql(u.db, "SELECT config_hash, status, attempts FROM trials ORDER BY id")) {
    stored.push_back(row[0]);
    CHECK(row[1] == "done");
    CHECK(row[2] == "1");
  }
  REQUIRE(stored == kV1Hashes);

  // The plan first: a wrong hash would otherwise start training below.
  auto r = run({"plan", u.file, "--db", u.db}, u.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("0 to run, 4 to skip") != std::string::npos);

  r = run({"run", u.file, "--db", u.db, "--threads", "1"}, u.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.err.find("4 trials, 0 to run") != std::string::npos);
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM trials") == "4");
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM trials WHERE status = 'done' AND attempts = 1") == "4");
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM epochs") == "4");
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM experiments") == "1");
}

namespace {

// A later dprun is this one with later_settings(): run in this process (nothing is run, so no
// trial process is started).
dprun::SweepOptions later_dprun(const Upgrade& u) {
  dprun::SweepOptions o;
  o.file = u.file;
  o.db = u.db;
  o.settings = &settingstest::later_settings();
  return o;
}

std::vector<dprun::PlannedTrial> plan(const dprun::Experiment& ex, const std::string& db,
                                      const dprun::SweepOptions& options) {
  std::map<std::string, dps::TrialRow> stored;
  dps::Store store(db, dps::Store::Mode::read_only);
  for (auto& row : store.trials(store.find_experiment(ex.name)->id)) stored[row.config_hash] = row;
  return dprun::plan_trials(ex, stored, options);
}

std::vector<std::string> columns_of(const std::string& db, const std::string& table) {
  std::vector<std::string> names;
  for (const auto& row : sql(db, "SELECT name FROM pragma_table_info('" + table + "')"))
    names.push_back(row[0]);
  return names;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

TEST_CASE("upgrade: a later dprun with new settings re-runs nothing and migrates the database",
          "[upgrade]") {
  Upgrade u;
  const dprun::SweepOptions options = later_dprun(u);

  // The plan, read-only, before anything is migrated: every trial is done.
  dprun::Experiment ex = dprun::load_sweep(options);
  REQUIRE(ex.trials.size() == kV1Hashes.size());
  for (size_t i = 0; i < kV1Hashes.size(); ++i) CHECK(ex.trials[i].config_hash == kV1Hashes[i]);
  for (const auto& p : plan(ex, u.db, options)) {
    INFO(p.spec->label);
    CHECK(p.describe() == "skip: done");
  }
  CHECK_FALSE(contains(columns_of(u.db, "trials"), "grad_accum"));
  const std::string speedups_before = sql1(
      u.db, "SELECT group_concat(trial_id || ':' || round(speedup, 6)) FROM scaling WHERE gpus > 1");
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM scaling WHERE gpus = 1 AND speedup IS NOT NULL") == "2");

  // The run: nothing to do, and the database now has the new settings' columns, filled with
  // their defaults for the trials of 0.1.0, in the table and in both views.
  REQUIRE(dprun::run_experiment(dprun::load_sweep(options), options) == 0);
  const auto trials = columns_of(u.db, "trials");
  for (const char* c : {"grad_accum", "checkpoint", "betas", "nesterov"}) {
    INFO(c);
    CHECK(contains(trials, c));
    CHECK(contains(columns_of(u.db, "trial_summary"), c));
    CHECK(contains(columns_of(u.db, "scaling"), c));
  }
  CHECK(sql1(u.db,
             "SELECT group_concat(DISTINCT grad_accum || ' ' || checkpoint || ' ' || betas || "
             "' ' || nesterov) FROM trials") == "1 last [0.9,0.999] 0");
  CHECK(sql1(u.db, "PRAGMA user_version") == std::to_string(dps::schema_version()));
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM trials WHERE status = 'done' AND attempts = 1") == "4");
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM trials") == "4");
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM epochs") == "4");
  std::vector<std::string> hashes;
  for (const auto& row : sql(u.db, "SELECT config_hash FROM trials ORDER BY id"))
    hashes.push_back(row[0]);
  CHECK(hashes == kV1Hashes);
  // Results and speedups are computed over the migrated views as before, except that a 1-GPU
  // trial is now its own baseline (speedup 1; 0.1.0's view compared it with the mean of the
  // 1-GPU trials of its group).
  CHECK(sql1(u.db, "SELECT group_concat(trial_id || ':' || round(speedup, 6)) FROM scaling "
                   "WHERE gpus > 1") == speedups_before);
  CHECK(sql1(u.db, "SELECT group_concat(DISTINCT speedup) FROM scaling WHERE gpus = 1") == "1.0");
  CHECK(sql1(u.db, "SELECT COUNT(*) FROM scaling WHERE speedup IS NOT NULL") == "2");

  // Still nothing to plan after the migration.
  for (const auto& p : plan(ex, u.db, options)) CHECK(p.describe() == "skip: done");

  // A new setting away from its default is another trial; one outside the identity is not.
  auto with = [&](const std::string& line) {
    std::string text = clitest::slurp(kFixtures + "/upgrade.toml");
    text.replace(text.find("[model.lenet]"), 0, line + "\n\n");
    clitest::write_file(u.file, text);
    return dprun::load_sweep(options);
  };
  const dprun::Experiment four = with("grad_accum = 4");
  for (const auto& p : plan(four, u.db, options)) CHECK(p.describe() == "run");
  const dprun::Experiment best = with("checkpoint = \"best\"");
  for (size_t i = 0; i < kV1Hashes.size(); ++i) CHECK(best.trials[i].config_hash == kV1Hashes[i]);
  for (const auto& p : plan(best, u.db, options)) CHECK(p.describe() == "skip: done");
}

TEST_CASE("upgrade: an experiment keeps the defaults it was begun with, a new one takes today's",
          "[upgrade]") {
  Upgrade u;
  dprun::SweepOptions o;
  o.file = u.file;
  o.db = u.db;
  auto layouts = [](const dprun::Experiment& ex) {
    std::string out;
    for (const auto& t : ex.trials) out += t.settings[dprun::key::layout] + " ";
    return out;
  };

  // Begun by dprun 0.1.0: the file's omitted layout is generation 1's nchw, the stored trials.
  const dprun::Experiment old = dprun::load_sweep(o);
  CHECK(old.settings->generation() == 1);
  CHECK(layouts(old) == "nchw nchw nchw nchw ");
  for (size_t i = 0; i < kV1Hashes.size(); ++i) CHECK(old.trials[i].config_hash == kV1Hashes[i]);
  REQUIRE(dprun::run_experiment(old, o) == 0);                   // nothing to run
  CHECK(sql1(u.db, "SELECT defaults FROM experiments") == "1");  // migrated, kept

  // The same file in a new database: today's defaults, other trials.
  dprun::SweepOptions fresh = o;
  fresh.db = u.dir.path() + "/fresh.db";
  const dprun::Experiment now = dprun::load_sweep(fresh);
  CHECK(now.settings->generation() == dprun::kDefaultsGeneration);
  CHECK(layouts(now) == "auto auto auto auto ");
  CHECK(now.trials[0].config_hash != kV1Hashes[0]);

  // Another experiment in the old database is new too; layout given in the old one's file is
  // the file's, whatever the generation.
  std::string text = clitest::slurp(kFixtures + "/upgrade.toml");
  const std::string named = "name = \"upgrade\"";
  std::string other = text;
  other.replace(other.find(named), named.size(), "name = \"other\"");
  clitest::write_file(u.file, other);
  CHECK(layouts(dprun::load_sweep(o)) == "auto auto auto auto ");
  std::string explicit_auto = text;
  explicit_auto.replace(explicit_auto.find("[model.lenet]"), 0, "layout = \"auto\"\n\n");
  clitest::write_file(u.file, explicit_auto);
  const dprun::Experiment asked = dprun::load_sweep(o);
  CHECK(layouts(asked) == "auto auto auto auto ");
  for (const auto& p : plan(asked, u.db, o)) CHECK(p.describe() == "run");

  // A generation this dprun does not know: refused, nothing guessed.
  clitest::write_file(u.file, text);
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(u.db.c_str(), &raw) == SQLITE_OK);
  const std::string later_generation =
      "UPDATE experiments SET defaults = " + std::to_string(dprun::kDefaultsGeneration + 1);
  CHECK(sqlite3_exec(raw, later_generation.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(raw);
  CHECK_THROWS_WITH(dprun::load_sweep(o), Catch::Contains("upgrade dprun") &&
                                              Catch::Contains("was begun by a later dprun"));
}

TEST_CASE("upgrade: an experiment begun under generation 2 keeps graphs = false", "[upgrade]") {
  Upgrade u;
  dprun::SweepOptions o;
  o.file = u.file;
  o.db = u.dir.path() + "/generation-2.db";
  {
    // What a dprun of generation 2 (layout "auto", graphs false) left: the experiment begun.
    dps::Store store(o.db, dps::Store::Mode::read_write, dprun::builtin_settings().store_columns());
    store.upsert_experiment("upgrade", "", clitest::slurp(u.file), 2);
  }
  const dprun::Experiment then = dprun::load_sweep(o);
  CHECK(then.settings->generation() == 2);
  dprun::SweepOptions fresh = o;
  fresh.db = u.dir.path() + "/fresh.db";
  const dprun::Experiment now = dprun::load_sweep(fresh);
  CHECK(now.settings->generation() == dprun::kDefaultsGeneration);
  REQUIRE(then.trials.size() == now.trials.size());
  for (size_t i = 0; i < then.trials.size(); ++i) {
    const dprun::TrialSettings& s = then.trials[i].settings;
    CHECK(s.get("graphs") == dprun::SettingValue(false));
    CHECK(s[dprun::key::layout] == "auto");
    // false is graphs' first default: not in the text, so the hashes generation 2 stored.
    CHECK(dprun::canonical_settings(s).find("graphs") == std::string::npos);
    CHECK(now.trials[i].settings.get("graphs") == dprun::SettingValue(std::string("auto")));
    CHECK(now.trials[i].config_hash != then.trials[i].config_hash);
  }
}

TEST_CASE("upgrade: this dprun still runs nothing on a database a later dprun migrated",
          "[upgrade][cli]") {
  Upgrade u;
  {
    const dprun::SweepOptions later = later_dprun(u);
    REQUIRE(dprun::run_experiment(dprun::load_sweep(later), later) == 0);
  }
  const std::string views =
      sql1(u.db, "SELECT group_concat(sql) FROM sqlite_schema WHERE type = 'view'");
  auto r = run({"plan", u.file, "--db", u.db}, u.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.out.find("0 to run, 4 to skip") != std::string::npos);
  r = run({"run", u.file, "--db", u.db}, u.dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(r.err.find("4 trials, 0 to run") != std::string::npos);
  // The later dprun's columns and views are left as they were.
  CHECK(contains(columns_of(u.db, "trials"), "grad_accum"));
  CHECK(sql1(u.db, "SELECT group_concat(sql) FROM sqlite_schema WHERE type = 'view'") == views);
}

TEST_CASE("upgrade: schema 5 widens the status check in place and records attempts",
          "[upgrade][store]") {
  Upgrade u;
  {
    dps::Store store(u.db, dps::Store::Mode::read_write, dprun::builtin_settings().store_columns());
    CHECK(store.user_version() == dps::schema_version());
    const auto exp = store.find_experiment("upgrade");
    REQUIRE(exp);
    const auto trials = store.trials(exp->id);
    REQUIRE(trials.size() == 4);
    // The trials of dprun 0.1.0 are still there, done, and a trial can now end as stopped.
    const int64_t id = trials[0].id;
    REQUIRE(store.claim_trial(id, dps::TrialStatus::done, 1, "h"));
    store.start_trial(id, {});
    store.finish_trial(id, dps::TrialStatus::stopped, "stopped after epoch 1: test");
    CHECK(store.get_trial(id)->status == dps::TrialStatus::stopped);
    const auto attempts = store.attempts(id);
    REQUIRE(attempts.size() == 1);
    CHECK(attempts[0].attempt == trials[0].attempts + 1);
    CHECK(attempts[0].status == dps::TrialStatus::stopped);
    CHECK(attempts[0].error == "stopped after epoch 1: test");
  }
}
