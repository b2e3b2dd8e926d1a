// Schema version 3: the checkpoints a trial keeps, and an attempt that resumes from one (its
// earlier epochs kept, later ones dropped), added to older databases by the forward migration.
#include <filesystem>

#include "store_test_util.hpp"

using Catch::Matchers::Contains;
using dps::Store;
using dpstest::ScratchDir;

namespace {

dps::CheckpointRow checkpoint(int64_t trial, const std::string& role, int64_t epoch) {
  dps::CheckpointRow c;
  c.trial_id = trial;
  c.role = role;
  c.epoch = epoch;
  c.path = "x.checkpoints/trial-" + std::to_string(trial) + "/" + role + "-" +
           std::to_string(epoch) + ".safetensors";
  c.sha256 = dps::sha256_hex(c.path);
  c.bytes = 100 + epoch;
  if (role == "last") {
    c.optimizer_path = "x.checkpoints/last.optimizer.safetensors";
    c.optimizer_sha256 = dps::sha256_hex("optimizer " + std::to_string(epoch));
  }
  return c;
}

std::string epochs_of(Store& store, int64_t trial) {
  std::string out;
  for (const auto& e : store.epochs(trial)) out += std::to_string(e.epoch) + " ";
  return out;
}

std::string checkpoints_of(Store& store, int64_t trial) {
  std::string out;
  for (const auto& c : store.checkpoints(trial)) out += c.role + std::to_string(c.epoch) + " ";
  return out;
}

}  // namespace

TEST_CASE("checkpoints: last and best are replaced and every epoch's are kept", "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("x.db"));
  const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
  const int64_t id = store.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 1)).id;
  store.start_trial(id, {});
  for (int64_t e = 1; e <= 3; ++e) {
    store.record_epoch(dpstest::epoch_row(id, e, 0.5, 1.0));
    store.record_checkpoint(checkpoint(id, "epoch", e));
    store.record_checkpoint(checkpoint(id, "last", e));
    if (e != 3) store.record_checkpoint(checkpoint(id, "best", e));
  }
  CHECK(checkpoints_of(store, id) == "best2 epoch1 epoch2 epoch3 last3 ");
  const auto rows = store.checkpoints(id);
  const auto& last = rows.back();
  CHECK(last.path == checkpoint(id, "last", 3).path);
  CHECK(last.sha256 == checkpoint(id, "last", 3).sha256);
  CHECK(last.bytes == 103);
  CHECK(last.optimizer_sha256 == dps::sha256_hex("optimizer 3"));
  CHECK_FALSE(last.recorded_at.empty());
  CHECK(rows.front().optimizer_path.empty());  // best: NULL
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM checkpoints WHERE optimizer_path IS NULL") ==
        "4");
  REQUIRE_THROWS_WITH(store.record_checkpoint(checkpoint(id, "first", 1)),
                      Contains("role \"first\": expected last, best or epoch"));
  // Checkpoints belong to their trial: deleting it deletes them.
  dpstest::raw_exec(dir.file("x.db"), "PRAGMA foreign_keys = ON; DELETE FROM trials");
  CHECK(dpstest::raw_scalar(dir.file("x.db"), "SELECT COUNT(*) FROM checkpoints") == "0");
}

TEST_CASE("a resumed attempt keeps the epochs up to its checkpoint and a new start keeps none",
          "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("x.db"));
  const int64_t exp = store.upsert_experiment("e", "", "x = 1", 1);
  const int64_t id = store.ensure_trial(exp, "h", 0, dpstest::settings("lenet", 1)).id;
  store.start_trial(id, {});
  for (int64_t e = 1; e <= 4; ++e) {
    store.record_epoch(dpstest::epoch_row(id, e, 0.5, 1.0));
    if (e <= 3) {
      store.record_checkpoint(checkpoint(id, "epoch", e));
      store.record_checkpoint(checkpoint(id, "last", e));
    }
  }
  store.record_checkpoint(checkpoint(id, "best", 2));
  store.finish_trial(id, dps::TrialStatus::failed, "killed after epoch 4");
  CHECK(store.get_trial(id)->resumed_from_epoch == 0);

  // Epoch 4 was recorded but its checkpoint was not written: the next attempt continues from 3.
  store.start_trial(id, {}, 3);
  auto row = store.get_trial(id);
  CHECK(row->attempts == 2);
  CHECK(row->resumed_from_epoch == 3);
  CHECK(row->status == dps::TrialStatus::running);
  CHECK(row->error.empty());
  CHECK(epochs_of(store, id) == "1 2 3 ");
  CHECK(checkpoints_of(store, id) == "best2 epoch1 epoch2 epoch3 last3 ");
  store.finish_trial(id, dps::TrialStatus::interrupted, "SIGINT");

  // Resuming from an earlier epoch drops the checkpoints after it too.
  store.start_trial(id, {}, 1);
  CHECK(epochs_of(store, id) == "1 ");
  CHECK(checkpoints_of(store, id) == "epoch1 ");
  store.finish_trial(id, dps::TrialStatus::failed, "again");

  // From scratch: nothing of the earlier attempts stays, and resumed_from_epoch is NULL.
  store.start_trial(id, {});
  CHECK(epochs_of(store, id).empty());
  CHECK(checkpoints_of(store, id).empty());
  CHECK(store.get_trial(id)->resumed_from_epoch == 0);
  CHECK(dpstest::scalar(store, "SELECT resumed_from_epoch IS NULL FROM trials") == "1");
  REQUIRE_THROWS_WITH(store.start_trial(id, {}, -1), Contains("resume_epoch -1 is negative"));
}

TEST_CASE("schema 3: a version 1 database gains checkpoints and resumed_from_epoch", "[store]") {
  ScratchDir dir;
  const std::string path = dir.file("v1.db");
  std::filesystem::copy_file(
      std::string(DPRUN_TEST_SOURCE_DIR) + "/tests/runner/fixtures/upgrade-v1.db", path);
  {
    // Read-only, it stays as it is: no checkpoints table, and none read.
    Store before(path, Store::Mode::read_only);
    const auto exp = before.find_experiment("upgrade");
    REQUIRE(exp);
    const auto trials = before.trials(exp->id);
    REQUIRE_FALSE(trials.empty());
    CHECK(before.checkpoints(trials[0].id).empty());
    CHECK(trials[0].resumed_from_epoch == 0);
  }
  REQUIRE(dpstest::raw_scalar(path, "PRAGMA user_version") == "1");
  Store store = dpstest::open_store(path);
  CHECK(store.user_version() == dps::schema_version());
  const auto exp = store.find_experiment("upgrade");
  const auto trials = store.trials(exp->id);
  for (const auto& t : trials) CHECK(t.status == dps::TrialStatus::done);
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM checkpoints") == "0");
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM trials WHERE resumed_from_epoch IS NULL") ==
        std::to_string(trials.size()));
  store.record_checkpoint(checkpoint(trials[0].id, "last", 1));
  CHECK(checkpoints_of(store, trials[0].id) == "last1 ");
}
