// Schema version 2: how a trial ran (the hosts of its processes, the command that launched it,
// the devices --jobs gave it), added to a database of version 1 by the forward migration.
#include <filesystem>

#include "store_test_util.hpp"

using dps::Store;
using dpstest::ScratchDir;

TEST_CASE("schema 2: a database of version 1 gains hosts, launch and device_set", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("v1.db");
  // A database written by dprun 0.1.0 (schema version 1), with 4 done trials.
  std::filesystem::copy_file(std::string(DPRUN_TEST_SOURCE_DIR) +
                                 "/tests/runner/fixtures/"
                                 "upgrade-v1.db",
                             path);
  REQUIRE(dpstest::raw_scalar(path, "PRAGMA user_version") == "1");
  REQUIRE(dpstest::raw_scalar(path,
                              "SELECT COUNT(*) FROM pragma_table_info('trials') WHERE "
                              "name = 'hosts'") == "0");
  {
    // Read-only, it is read as it is (never migrated): the columns it lacks read as NULL.
    Store before(path, Store::Mode::read_only);
    CHECK(before.user_version() == 1);
    const auto exp = before.find_experiment("upgrade");
    REQUIRE(exp);
    const auto trials = before.trials(exp->id);
    REQUIRE(trials.size() == 4);
    CHECK(trials[0].hosts.empty());
    CHECK(before.trial_summaries(exp->id).size() == 4);
  }
  REQUIRE(dpstest::raw_scalar(path, "PRAGMA user_version") == "1");
  Store store = dpstest::open_store(path);
  CHECK(store.user_version() == dps::schema_version());
  const auto exp = store.find_experiment("upgrade");
  REQUIRE(exp);
  const auto trials = store.trials(exp->id);
  REQUIRE(trials.size() == 4);
  for (const auto& t : trials) {
    CHECK(t.status == dps::TrialStatus::done);  // finished trials stay finished
    CHECK(t.hosts.empty());                     // NULL: run before these columns existed
    CHECK(t.launch.empty());
    CHECK(t.device_set.empty());
  }
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM trials WHERE hosts IS NULL") == "4");
  for (const char* view : {"trial_summary"}) {
    const auto columns = store.query(std::string("SELECT * FROM ") + view + " LIMIT 0").columns;
    for (const char* c : {"hosts", "launch", "device_set"}) {
      INFO(view << "." << c);
      CHECK(std::find(columns.begin(), columns.end(), c) != columns.end());
    }
  }

  // A run records them; an empty one is NULL.
  const int64_t id = store.ensure_trial(exp->id, "new", 9, dpstest::settings("lenet", 2)).id;
  dps::TrialStart start;
  start.backend = "cpu";
  start.hosts = "nodeA x2, nodeB x2";
  start.launch = "mpirun -np 4 --bind-to none dprun __trial --records stdout";
  store.start_trial(id, start);
  auto row = store.get_trial(id);
  REQUIRE(row);
  CHECK(row->hosts == start.hosts);
  CHECK(row->launch == start.launch);
  CHECK(row->device_set.empty());
  CHECK(dpstest::scalar(store, "SELECT device_set IS NULL FROM trials WHERE id = " +
                                   std::to_string(id)) == "1");
  start.device_set = "gpus 2,3";
  store.start_trial(id, start);
  CHECK(store.get_trial(id)->device_set == "gpus 2,3");
}
