// Setting columns: a setting a later dprun describes is added to the databases it opens (no
// migration of its own), filled with its default for the trials already there, and listed by the
// views; an older dprun leaves what a newer one added alone.
#include <algorithm>
#include <cmath>
#include <limits>

#include "store_test_util.hpp"

using Catch::Matchers::Contains;
using dps::SettingColumn;
using dps::SqlValue;
using dps::Store;
using dps::StoreError;
using dpstest::ScratchDir;

namespace {

// Today's columns plus three of a later dprun: an integer that the 1-GPU baseline must share, a
// float it may not, and a text.
std::vector<SettingColumn> later_columns() {
  auto columns = dpstest::setting_columns();
  columns.push_back({"processes", SqlValue(int64_t{1}), false});
  columns.push_back({"warmup_epochs", SqlValue(0.0), true});
  columns.push_back({"checkpoint", SqlValue(std::string("it's last")), true});
  return columns;
}

std::vector<std::string> result_columns(Store& store, const std::string& view) {
  return store.query("SELECT * FROM " + view + " LIMIT 0").columns;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

void finish(Store& store, int64_t id, double seconds) {
  dps::TrialStart start;
  start.backend = "cpu";
  store.start_trial(id, start);
  store.record_epoch(dpstest::epoch_row(id, 1, 0.5, 10 * seconds));
  store.record_epoch(dpstest::epoch_row(id, 2, 0.5, seconds));
  store.finish_trial(id, dps::TrialStatus::done);
}

}  // namespace

TEST_CASE("a described setting column is added to an existing database with its default",
          "[store][settings]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  int64_t exp = 0, old_trial = 0;
  {
    Store today = dpstest::open_store(path);
    exp = today.upsert_experiment("e", "", "", 1);
    old_trial = today.ensure_trial(exp, "old", 0, dpstest::settings("lenet", 1)).id;
    CHECK_FALSE(has(today.setting_columns(), "processes"));
  }
  Store later(path, Store::Mode::read_write, later_columns());
  CHECK(later.user_version() == dps::schema_version());  // no migration of its own
  const auto& columns = later.setting_columns();
  REQUIRE(columns.size() == dpstest::setting_columns().size() + 3);
  CHECK(columns[columns.size() - 3] == "processes");  // appended, in the order described
  CHECK(columns.back() == "checkpoint");
  CHECK(dpstest::scalar(later,
                        "SELECT type FROM pragma_table_info('trials') "
                        "WHERE name = 'warmup_epochs'") == "REAL");

  // The trial stored before has the defaults; a new one takes what it is given.
  const dps::TrialRow before = *later.get_trial(old_trial);
  CHECK(dpstest::setting<int64_t>(before, "processes") == 1);
  CHECK(dpstest::setting<double>(before, "warmup_epochs") == 0.0);
  CHECK(dpstest::setting<std::string>(before, "checkpoint") == "it's last");
  auto s = dpstest::settings("lenet", 2);
  s["processes"] = int64_t{2};
  const dps::TrialRow added = later.ensure_trial(exp, "new", 1, s);
  CHECK(dpstest::setting<int64_t>(added, "processes") == 2);
  // Not given: the column's default.
  CHECK(dpstest::setting<std::string>(added, "checkpoint") == "it's last");

  // Both views list the new settings.
  for (const char* view : {"trial_summary", "scaling"}) {
    INFO(view);
    const auto names = result_columns(later, view);
    for (const char* c : {"processes", "warmup_epochs", "checkpoint", "model_options", "gpus"})
      CHECK(has(names, c));
  }
  CHECK(dpstest::scalar(later, "SELECT processes FROM trial_summary WHERE config_hash = 'new'") ==
        "2");
}

TEST_CASE("the scaling view matches every setting but those that may differ", "[store][settings]") {
  ScratchDir dir;
  Store store(dir.file("results.db"), Store::Mode::read_write, later_columns());
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  auto one = dpstest::settings("lenet", 1);
  const int64_t base = store.ensure_trial(exp, "base", 0, one).id;
  finish(store, base, 8.0);

  // processes must match: a 1-process baseline is no baseline for a 2-process trial.
  auto two_processes = dpstest::settings("lenet", 2);
  two_processes["processes"] = int64_t{2};
  const int64_t a = store.ensure_trial(exp, "a", 1, two_processes).id;
  finish(store, a, 4.0);
  // warmup_epochs may differ (and so may lr and seed, as every dprun had it).
  auto warm = dpstest::settings("lenet", 2);
  warm["warmup_epochs"] = 2.0;
  warm["lr"] = 0.2;
  warm["seed"] = int64_t{5};
  const int64_t b = store.ensure_trial(exp, "b", 2, warm).id;
  finish(store, b, 4.0);

  const auto rows = store.trial_summaries(exp);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].speedup == 1.0);
  CHECK_FALSE(rows[1].speedup.has_value());
  CHECK(rows[2].speedup == 2.0);
  CHECK(rows[2].efficiency == 1.0);
}

TEST_CASE("a database of schema version 1 gets the generated views", "[store][settings]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  { Store plain(path); }  // no descriptions: the views of the migration stay
  {
    Store ro(path, Store::Mode::read_only);
    CHECK_FALSE(has(result_columns(ro, "scaling"), "model_options"));
  }
  Store store = dpstest::open_store(path);
  const auto names = result_columns(store, "scaling");
  // Every column the view of version 1 had is still there, and every setting now.
  for (const char* c : {"experiment", "experiment_id", "trial_id", "model", "per_gpu_batch",
                        "backend", "gpus", "batch_size", "lr", "seed", "precision", "bn_mode",
                        "mean_seconds_per_epoch", "speedup", "efficiency", "final_test_acc"})
    CHECK(has(names, c));
  for (const auto& c : dpstest::setting_columns()) CHECK(has(names, c.name));
}

TEST_CASE("opening again changes nothing, and an older dprun leaves a newer one's columns alone",
          "[store][settings]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  std::string schema;
  auto schema_text = [&] {
    return dpstest::raw_scalar(path, "SELECT group_concat(sql, ';') FROM sqlite_schema");
  };
  int64_t exp = 0;
  {
    Store later(path, Store::Mode::read_write, later_columns());
    exp = later.upsert_experiment("e", "", "", 1);
    auto s = dpstest::settings("lenet", 1);
    s["processes"] = int64_t{4};
    later.ensure_trial(exp, "later", 0, s);
    schema = schema_text();
  }
  const std::string version_before = dpstest::raw_scalar(path, "PRAGMA schema_version");
  { Store again(path, Store::Mode::read_write, later_columns()); }
  CHECK(dpstest::raw_scalar(path, "PRAGMA schema_version") == version_before);

  // Today's dprun does not know processes: it neither drops it nor rewrites the views, and its
  // trials take the column's default.
  Store today = dpstest::open_store(path);
  CHECK(schema_text() == schema);
  CHECK(has(today.setting_columns(), "processes"));
  const dps::TrialRow mine = today.ensure_trial(exp, "today", 1, dpstest::settings("lenet", 2));
  CHECK(dpstest::setting<int64_t>(mine, "processes") == 1);
  CHECK(dpstest::setting<int64_t>(*today.find_trial(exp, "later"), "processes") == 4);
}

TEST_CASE("read-only, a database is read as it is", "[store][settings]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  {
    Store today = dpstest::open_store(path);
    const int64_t exp = today.upsert_experiment("e", "", "", 1);
    today.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 1));
  }
  Store ro(path, Store::Mode::read_only, later_columns());  // descriptions change nothing here
  CHECK_FALSE(has(ro.setting_columns(), "processes"));
  const auto rows = ro.trials(ro.find_experiment("e")->id);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].settings.count("processes") == 0);  // the caller reads it as its default
  CHECK(rows[0].settings.size() == dpstest::setting_columns().size());
}

TEST_CASE("setting column descriptions are checked", "[store][settings]") {
  ScratchDir dir;
  const std::string path = dir.file("results.db");
  auto refused = [&](SettingColumn extra, const std::string& why) {
    auto columns = dpstest::setting_columns();
    columns.push_back(extra);
    INFO(extra.name);
    REQUIRE_THROWS_WITH(Store(path, Store::Mode::read_write, columns),
                        Contains(path) && Contains("\"" + extra.name + "\"") && Contains(why));
  };
  refused({"Bad-Name", SqlValue(int64_t{0}), false}, "[a-z][a-z0-9_]*");
  refused({"x; DROP TABLE trials", SqlValue(int64_t{0}), false}, "[a-z][a-z0-9_]*");
  refused({"status", SqlValue(std::string("x")), false}, "the store's own");
  refused({"gpus", SqlValue(int64_t{1}), false}, "described twice");
  refused({"nothing", SqlValue(), false}, "needs a default");
  refused({"nan", SqlValue(std::numeric_limits<double>::quiet_NaN()), false}, "finite");
  // Nothing was added by the refused openings.
  Store store = dpstest::open_store(path);
  CHECK(store.setting_columns().size() == dpstest::setting_columns().size());
}
