// Upgrading dprun never re-runs finished trials: fixtures/upgrade-v1.db was written by dprun 0.1.0
// (how: see fixtures/upgrade.toml); this dprun must find its trials done under the same config
// hashes, plan nothing and run nothing. Nothing here trains, so no dataset is needed.
#include <catch2/catch.hpp>
#include <filesystem>

#include "cli_helpers.hpp"
#include "experiment.hpp"
#include "plugin_loader.hpp"

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
  const auto ex = dprun::load_experiment(kFixtures + "/upgrade.toml", catalog);
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
