// The trial_summary and scaling views on hand-made epochs whose answers are known.
#include <unistd.h>

#include <algorithm>
#include <map>

#include "store_test_util.hpp"

using dps::Store;
using dps::TrialStatus;
using dpstest::ScratchDir;

namespace {

// Runs a trial through start, the given (test_acc, seconds) epochs and a final status.
int64_t run_trial(Store& store, int64_t exp, const std::string& hash, dps::SettingValues s,
                  const std::vector<std::pair<double, double>>& epochs,
                  TrialStatus status = TrialStatus::done, const std::string& backend = "cpu") {
  static int64_t ordinal = 0;
  const int64_t id = store.ensure_trial(exp, hash, ordinal++, s).id;
  dps::TrialStart start;
  start.backend = backend;
  start.devices = "cpu:0";
  start.runner_pid = getpid();
  store.start_trial(id, start);
  int64_t e = 1;
  for (auto [acc, seconds] : epochs) {
    store.record_epoch(dpstest::epoch_row(id, e, acc, seconds, 2.0 / static_cast<double>(e)));
    ++e;
  }
  if (status != TrialStatus::running) store.finish_trial(id, status);
  return id;
}

double num(const std::optional<std::string>& v) {
  REQUIRE(v.has_value());
  return std::stod(*v);
}

// Row of a query keyed by its first column (trial id), columns by name.
std::map<std::string, std::map<std::string, std::optional<std::string>>> by_trial(
    const dps::QueryResult& r) {
  std::map<std::string, std::map<std::string, std::optional<std::string>>> out;
  for (const auto& row : r.rows) {
    for (size_t c = 0; c < r.columns.size(); ++c) out[*row[0]][r.columns[c]] = row[c];
  }
  return out;
}

}  // namespace

TEST_CASE("trial_summary: final and best accuracy, mean seconds without epoch 1", "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("results.db"));
  const int64_t exp = store.upsert_experiment("summary", "", "", 1);
  // Epoch 1 is slow (warm-up); best accuracy is not the last one.
  const int64_t three = run_trial(store, exp, "three", dpstest::settings("lenet", 1),
                                  {{0.70, 10.0}, {0.90, 2.0}, {0.85, 4.0}});
  const int64_t one = run_trial(store, exp, "one", dpstest::settings("lenet", 2), {{0.60, 5.0}});
  const int64_t none = store.ensure_trial(exp, "none", 99, dpstest::settings("lenet", 4)).id;

  auto rows = by_trial(store.query(
      "SELECT trial_id, experiment, model, gpus, per_gpu_batch, status, error, epochs_done, "
      "final_test_acc, best_test_acc, mean_seconds_per_epoch, final_train_loss, total_seconds, "
      "mean_examples_per_second, peak_memory_bytes, backend, devices FROM trial_summary"));
  REQUIRE(rows.size() == 3);
  auto& t3 = rows[std::to_string(three)];
  CHECK(t3["experiment"] == "summary");
  CHECK(t3["model"] == "lenet");
  CHECK(t3["status"] == "done");
  CHECK(t3["error"] == std::nullopt);
  CHECK(t3["epochs_done"] == "3");
  CHECK(num(t3["final_test_acc"]) == 0.85);
  CHECK(num(t3["best_test_acc"]) == 0.90);
  CHECK(num(t3["mean_seconds_per_epoch"]) == 3.0);  // (2 + 4) / 2: epoch 1 left out
  CHECK(num(t3["total_seconds"]) == 16.0);
  // Throughput without epoch 1 too: (1000/2 + 1000/4) / 2; the peak over every epoch.
  CHECK(num(t3["mean_examples_per_second"]) == 375.0);
  CHECK(num(t3["peak_memory_bytes"]) == 1 << 20);
  CHECK(num(t3["final_train_loss"]) == Approx(2.0 / 3.0));
  CHECK(t3["backend"] == "cpu");
  CHECK(t3["devices"] == "cpu:0");

  auto& t1 = rows[std::to_string(one)];
  CHECK(t1["epochs_done"] == "1");
  CHECK(num(t1["mean_seconds_per_epoch"]) == 5.0);  // a single epoch counts as it is
  CHECK(num(t1["mean_examples_per_second"]) == 200.0);
  CHECK(num(t1["final_test_acc"]) == 0.60);

  auto& t0 = rows[std::to_string(none)];
  CHECK(t0["status"] == "pending");
  CHECK(t0["epochs_done"] == "0");
  CHECK(t0["final_test_acc"] == std::nullopt);
  CHECK(t0["mean_seconds_per_epoch"] == std::nullopt);
  CHECK(t0["backend"] == std::nullopt);

  // Every setting column is in the view.
  dps::QueryResult all = store.query("SELECT * FROM trial_summary LIMIT 0");
  for (const char* c : {"model_options",
                        "dataset",
                        "data_path",
                        "batch_size",
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
                        "attempts",
                        "config_hash",
                        "ordinal"}) {
    INFO(c);
    CHECK(std::count(all.columns.begin(), all.columns.end(), c) == 1);
  }
}

TEST_CASE("scaling: speedup and efficiency over the 1-GPU trial of the same model", "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("results.db"));
  const int64_t exp = store.upsert_experiment("scaling", "", "", 1);
  // Mean seconds (epoch 1 excluded): 1 GPU 8 s, 2 GPUs 5 s, 4 GPUs 2.5 s.
  const int64_t g1 = run_trial(store, exp, "g1", dpstest::settings("lenet", 1),
                               {{0.8, 30.0}, {0.8, 8.0}, {0.8, 8.0}});
  const int64_t g2 = run_trial(store, exp, "g2", dpstest::settings("lenet", 2),
                               {{0.8, 30.0}, {0.8, 4.0}, {0.8, 6.0}});
  const int64_t g4 = run_trial(store, exp, "g4", dpstest::settings("lenet", 4),
                               {{0.8, 30.0}, {0.8, 2.5}, {0.83, 2.5}});
  // No 1-GPU trial for this per-GPU batch: NULL speedup.
  const int64_t orphan =
      run_trial(store, exp, "orphan", dpstest::settings("lenet", 2, 32), {{0.8, 9.0}, {0.8, 3.0}});
  // Other backend: its own group, so the cpu 1-GPU trial is not its baseline.
  const int64_t cuda2 = run_trial(store, exp, "cuda2", dpstest::settings("lenet", 2),
                                  {{0.8, 9.0}, {0.8, 1.0}}, TrialStatus::done, "cuda");
  // Unfinished and failed trials are not in the view.
  run_trial(store, exp, "failed", dpstest::settings("lenet", 8), {{0.1, 1.0}, {0.1, 1.0}},
            TrialStatus::failed);
  run_trial(store, exp, "running", dpstest::settings("lenet", 8, 32), {{0.1, 1.0}},
            TrialStatus::running);

  dps::QueryResult r = store.query(
      "SELECT trial_id, experiment, model, per_gpu_batch, backend, gpus, batch_size, lr, "
      "mean_seconds_per_epoch, speedup, efficiency, final_test_acc FROM scaling");
  auto rows = by_trial(r);
  REQUIRE(rows.size() == 5);
  auto& s1 = rows[std::to_string(g1)];
  CHECK(num(s1["speedup"]) == 1.0);
  CHECK(num(s1["efficiency"]) == 1.0);
  CHECK(s1["experiment"] == "scaling");
  CHECK(s1["batch_size"] == "64");
  auto& s2 = rows[std::to_string(g2)];
  CHECK(num(s2["mean_seconds_per_epoch"]) == 5.0);
  CHECK(num(s2["speedup"]) == Approx(1.6));
  CHECK(num(s2["efficiency"]) == Approx(0.8));
  CHECK(s2["gpus"] == "2");
  CHECK(s2["batch_size"] == "128");
  auto& s4 = rows[std::to_string(g4)];
  CHECK(num(s4["speedup"]) == Approx(3.2));
  CHECK(num(s4["efficiency"]) == Approx(0.8));
  CHECK(num(s4["final_test_acc"]) == 0.83);
  auto& so = rows[std::to_string(orphan)];
  CHECK(so["speedup"] == std::nullopt);
  CHECK(so["efficiency"] == std::nullopt);
  CHECK(num(so["mean_seconds_per_epoch"]) == 3.0);
  auto& sc = rows[std::to_string(cuda2)];
  CHECK(sc["backend"] == "cuda");
  CHECK(sc["speedup"] == std::nullopt);
}

TEST_CASE("scaling: trials of another experiment or setting are not a baseline", "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("results.db"));
  const int64_t a = store.upsert_experiment("a", "", "", 1);
  const int64_t b = store.upsert_experiment("b", "", "", 1);
  run_trial(store, a, "a1", dpstest::settings("lenet", 1), {{0.8, 9.0}, {0.8, 6.0}});
  dps::SettingValues fp16 = dpstest::settings("lenet", 1);
  fp16["precision"] = "fp16";
  run_trial(store, b, "b1-fp16", fp16, {{0.8, 9.0}, {0.8, 1.0}});
  const int64_t b2 =
      run_trial(store, b, "b2", dpstest::settings("lenet", 2), {{0.8, 9.0}, {0.8, 3.0}});
  auto rows = by_trial(store.query("SELECT trial_id, speedup FROM scaling"));
  CHECK(rows[std::to_string(b2)]["speedup"] == std::nullopt);
  // Two matching 1-GPU trials (a seed sweep) are averaged into one baseline.
  dps::SettingValues seed1 = dpstest::settings("lenet", 1);
  seed1["seed"] = int64_t{1};
  run_trial(store, b, "b1-seed1", seed1, {{0.8, 9.0}, {0.8, 5.0}});
  dps::SettingValues seed2 = dpstest::settings("lenet", 1);
  seed2["seed"] = int64_t{2};
  run_trial(store, b, "b1-seed2", seed2, {{0.8, 9.0}, {0.8, 7.0}});
  rows = by_trial(store.query("SELECT trial_id, speedup FROM scaling"));
  CHECK(num(rows[std::to_string(b2)]["speedup"]) == 2.0);  // 6 s / 3 s
  // Each 1-GPU trial is its own baseline: speedup 1, not its seconds against the mean of the
  // 1-GPU trials (which would give 6/5 and 6/7 here).
  rows = by_trial(store.query("SELECT trial_id, speedup, efficiency FROM scaling WHERE gpus = 1"));
  REQUIRE(rows.size() == 4);
  for (const auto& [id, row] : rows) {
    CHECK(num(row.at("speedup")) == 1.0);
    CHECK(num(row.at("efficiency")) == 1.0);
  }
}

TEST_CASE("scaling: a baseline ran its steps captured or not as the trial did", "[store]") {
  // graphs = "auto" captures where each replica has a GPU of its own: with two replicas sharing
  // one GPU the 1-GPU trial is captured and the 2-GPU one is not, and comparing their seconds
  // would charge the capture's gain to the second GPU. A trial of an older dprun (graphs_used
  // NULL) ran its graphs setting as given.
  ScratchDir dir;
  std::vector<dps::SettingColumn> columns = dpstest::setting_columns();
  columns.push_back({"graphs", dps::SqlValue(int64_t{0}), false});
  Store store(dir.file("results.db"), Store::Mode::read_write, columns);
  const int64_t exp = store.upsert_experiment("auto", "", "", 3);
  auto trial = [&](const std::string& hash, int64_t gpus, dps::SqlValue graphs, int64_t used,
                   double seconds) {
    dps::SettingValues v = dpstest::settings("lenet", gpus);
    v["graphs"] = std::move(graphs);
    static int64_t ordinal = 100;
    const int64_t id = store.ensure_trial(exp, hash, ordinal++, v).id;
    dps::TrialStart start;
    start.backend = "cuda";
    start.runner_pid = getpid();
    start.graphs_used = used;
    store.start_trial(id, start);
    store.record_epoch(dpstest::epoch_row(id, 1, 0.8, 9.0, 1.0));
    store.record_epoch(dpstest::epoch_row(id, 2, 0.8, seconds, 1.0));
    store.finish_trial(id, TrialStatus::done);
    return id;
  };
  const dps::SqlValue automatic = std::string("auto");
  trial("1-captured", 1, automatic, 1, 6.0);
  const int64_t shared = trial("2-shared", 2, automatic, 0, 4.0);
  const int64_t own = trial("2-own", 2, automatic, 1, 4.0);  // a machine with two GPUs
  // Older trials: graphs = true ran captured, false did not.
  trial("1-old-true", 1, dps::SqlValue(int64_t{1}), -1, 5.0);
  const int64_t old_true = trial("2-old-true", 2, dps::SqlValue(int64_t{1}), -1, 2.5);
  const int64_t eager = trial("2-old-false", 2, dps::SqlValue(int64_t{0}), -1, 3.0);
  auto rows = by_trial(store.query("SELECT trial_id, speedup FROM scaling WHERE gpus = 2"));
  REQUIRE(rows.size() == 4);
  CHECK(rows[std::to_string(shared)]["speedup"] == std::nullopt);   // no eager 1-GPU "auto" trial
  CHECK(num(rows[std::to_string(own)]["speedup"]) == Approx(1.5));  // 6 s / 4 s
  CHECK(num(rows[std::to_string(old_true)]["speedup"]) == Approx(2.0));  // 5 s / 2.5 s
  CHECK(rows[std::to_string(eager)]["speedup"] == std::nullopt);         // graphs differs from both
}

TEST_CASE("trial_summaries: each trial with its results, in sweep order", "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("results.db"));
  const int64_t other = store.upsert_experiment("other", "", "", 1);
  run_trial(store, other, "elsewhere", dpstest::settings("lenet", 1), {{0.5, 1.0}});
  const int64_t exp = store.upsert_experiment("summaries", "", "", 1);
  const int64_t g2 = run_trial(store, exp, "g2", dpstest::settings("lenet", 2),
                               {{0.7, 9.0}, {0.9, 3.0}, {0.8, 5.0}});
  const int64_t g1 = run_trial(store, exp, "g1", dpstest::settings("lenet", 1),
                               {{0.7, 9.0}, {0.8, 8.0}, {0.8, 8.0}});
  const int64_t idle = store.ensure_trial(exp, "idle", 1000, dpstest::settings("lenet", 4)).id;

  const auto rows = store.trial_summaries(exp);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].trial.id == g2);  // by ordinal: run_trial numbers them in call order
  CHECK(rows[1].trial.id == g1);
  CHECK(rows[2].trial.id == idle);

  const dps::TrialSummary& s2 = rows[0];
  CHECK(dpstest::setting<int64_t>(s2.trial, "gpus") == 2);
  CHECK(s2.trial.status == TrialStatus::done);
  CHECK(s2.trial.epochs_done == 3);
  CHECK(s2.final_test_acc == 0.8);
  CHECK(s2.best_test_acc == 0.9);
  CHECK(s2.mean_seconds_per_epoch == 4.0);
  CHECK(s2.total_seconds == 17.0);
  CHECK(s2.final_train_loss == Approx(2.0 / 3.0));
  CHECK(s2.speedup == 2.0);
  CHECK(s2.efficiency == 1.0);

  const dps::TrialSummary& pending = rows[2];
  CHECK(pending.trial.status == TrialStatus::pending);
  CHECK(pending.trial.epochs_done == 0);
  CHECK_FALSE(pending.final_test_acc.has_value());
  CHECK_FALSE(pending.mean_seconds_per_epoch.has_value());
  CHECK_FALSE(pending.speedup.has_value());

  CHECK(store.trial_summaries(exp + 100).empty());
}

TEST_CASE("experiments are found by name and listed oldest first", "[store]") {
  ScratchDir dir;
  Store store = dpstest::open_store(dir.file("results.db"));
  CHECK(store.experiments().empty());
  CHECK_FALSE(store.find_experiment("a").has_value());
  const int64_t b = store.upsert_experiment("b", "second letter", "x = 1", 1);
  const int64_t a = store.upsert_experiment("a", "", "y = 2", 1);
  const auto found = store.find_experiment("b");
  REQUIRE(found.has_value());
  CHECK(found->id == b);
  CHECK(found->description == "second letter");
  CHECK(found->toml_sha256 == dps::sha256_hex("x = 1"));
  CHECK(found->created_at.size() == 24);
  const auto all = store.experiments();
  REQUIRE(all.size() == 2);
  CHECK(all[0].id == b);
  CHECK(all[1].id == a);
  CHECK(all[1].name == "a");
}
