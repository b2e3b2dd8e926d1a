// The asha scheduler's decisions (sweep/asha.hpp) on hand-made trial states, and its [search]
// keys.
#include <catch2/catch.hpp>

#include "experiment_helpers.hpp"
#include "sweep/asha.hpp"

namespace {

using dprun::AshaJob;
using dprun::AshaTrial;
using S = dps::TrialStatus;

AshaTrial trial(S status, int64_t rung, std::map<int64_t, double> metric, int64_t epochs = 9) {
  AshaTrial t;
  t.epochs = epochs;
  t.status = status;
  t.rung = rung;
  t.metric = std::move(metric);
  return t;
}

}  // namespace

TEST_CASE("asha: rungs at r, r*eta, ... below the trial's epochs", "[asha]") {
  CHECK(dprun::rung_epochs(1, 3, 9) == std::vector<int64_t>{1, 3});
  CHECK(dprun::rung_epochs(1, 3, 10) == std::vector<int64_t>{1, 3, 9});
  CHECK(dprun::rung_epochs(2, 2, 16) == std::vector<int64_t>{2, 4, 8});
  CHECK(dprun::rung_epochs(5, 3, 5).empty());  // the first rung is the end: no pause
  CHECK(dprun::rung_epochs(1, 1000, int64_t{1} << 62) == std::vector<int64_t>{
                                                           1, 1000, 1000000, 1000000000,
                                                           1000000000000, 1000000000000000,
                                                           1000000000000000000});
}

TEST_CASE("asha: trials start in order towards the first rung until one can be promoted",
          "[asha]") {
  std::vector<AshaTrial> t(5, trial(S::pending, -1, {}));
  auto job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 0);
  CHECK(job->rung == 0);
  CHECK(job->stop_after == 1);
  CHECK(job->kind == AshaJob::Kind::start);
  // Two reached rung 0: floor(2 / 3) = 0 may be promoted, so the next one starts.
  t[0] = trial(S::pruned, 0, {{1, 0.5}});
  t[1] = trial(S::pruned, 0, {{1, 0.7}});
  job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 2);
  CHECK(job->kind == AshaJob::Kind::start);
  // Three reached it: the best of them (trial 1) goes on to rung 1 (epoch 3).
  t[2] = trial(S::pruned, 0, {{1, 0.6}});
  job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 1);
  CHECK(job->rung == 1);
  CHECK(job->stop_after == 3);
  CHECK(job->kind == AshaJob::Kind::promotion);
  // Once it runs (busy), nothing else is promotable at rung 0: a new trial starts.
  t[1].busy = true;
  job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 3);
}

TEST_CASE("asha: the highest rung promotes first, to the trial's own epochs at the last",
          "[asha]") {
  std::vector<AshaTrial> t;
  // Rung 0 (epoch 1): six reached it, top 2 are trials 0 and 1 (both already promoted).
  t.push_back(trial(S::pruned, 1, {{1, 0.9}, {3, 0.95}}));
  t.push_back(trial(S::pruned, 1, {{1, 0.8}, {3, 0.85}}));
  t.push_back(trial(S::pruned, 1, {{1, 0.1}, {3, 0.91}}));  // promoted early, then overtaken
  for (double v : {0.3, 0.4, 0.5}) t.push_back(trial(S::pruned, 0, {{1, v}}));
  // Rung 1 (epoch 3): three reached it; the top 1 (trial 0) goes to the end (epoch 9).
  auto job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 0);
  CHECK(job->rung == 2);
  CHECK(job->stop_after == 9);
  CHECK(job->kind == AshaJob::Kind::promotion);
  // A loss ranks the other way: the smallest value first.
  job = dprun::next_asha_job(t, 1, 3, false);
  REQUIRE(job);
  CHECK(job->trial == 1);  // rung 1: 0.85 is the smallest
}

TEST_CASE("asha: a trial sent to a rung that failed or was interrupted resumes first",
          "[asha]") {
  std::vector<AshaTrial> t;
  t.push_back(trial(S::pruned, 0, {{1, 0.9}}));
  t.push_back(trial(S::interrupted, 1, {{1, 0.95}}));  // promoted, then its runner died
  t.push_back(trial(S::pending, -1, {}));
  auto job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 1);
  CHECK(job->rung == 1);
  CHECK(job->stop_after == 3);
  CHECK(job->kind == AshaJob::Kind::resume);
  // Done, stopped, diverged and skipped trials never run again, but they count in the ranking.
  t[1] = trial(S::done, 2, {{1, 0.95}, {3, 0.97}, {9, 0.98}});
  t.push_back(trial(S::diverged, 0, {}));
  t.push_back(trial(S::stopped, 0, {{1, 0.2}}));
  job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 2);  // 4 reached rung 0: top 1 is the done trial, so no promotion
  CHECK(job->kind == AshaJob::Kind::start);
  t[2].busy = true;
  // A diverged trial starts again from the start, as a run without a scheduler does.
  job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 3);
  CHECK(job->rung == 0);
  CHECK(job->expected == S::diverged);
  t[3].busy = true;
  CHECK_FALSE(dprun::next_asha_job(t, 1, 3, true));
}

TEST_CASE("asha: ties at a rung go to the earlier trial", "[asha]") {
  std::vector<AshaTrial> t;
  for (int i = 0; i < 3; ++i) t.push_back(trial(S::pruned, 0, {{2, 0.5}}));
  auto job = dprun::next_asha_job(t, 2, 2, true);
  REQUIRE(job);
  CHECK(job->trial == 0);
  CHECK(job->stop_after == 4);
}

TEST_CASE("asha: a trial another runner claimed first is still promoted by the one that lost it",
          "[asha]") {
  // How a trial that ended in this run counts from then on.
  for (S s : {S::failed, S::diverged, S::skipped}) {
    INFO(dps::status_name(s));
    CHECK(dprun::asha_gives_up(s, false));  // once per run, as without a scheduler
  }
  for (S s : {S::done, S::stopped, S::pruned, S::interrupted}) {
    INFO(dps::status_name(s));
    CHECK_FALSE(dprun::asha_gives_up(s, false));
  }
  // A lost claim ends as "skipped, taken": the trial runs in the other dprun.
  CHECK_FALSE(dprun::asha_gives_up(S::skipped, true));

  // Two runners started trial 0 at once, and this one lost the claim. The other ran it to the
  // first rung and exited; the three trials have reached it, and this runner, the last one
  // left, must promote the best. Had it given trial 0 up, it would be busy here for good, and the
  // run would end with nothing promoted (seen once in CI).
  std::vector<AshaTrial> t{trial(S::pruned, 0, {{1, 0.9}}), trial(S::pruned, 0, {{1, 0.5}}),
                           trial(S::pruned, 0, {{1, 0.6}})};
  t[0].busy = dprun::asha_gives_up(S::skipped, true);
  auto job = dprun::next_asha_job(t, 1, 3, true);
  REQUIRE(job);
  CHECK(job->trial == 0);
  CHECK(job->kind == AshaJob::Kind::promotion);
  t[0].busy = dprun::asha_gives_up(S::skipped, false);
  CHECK_FALSE(dprun::next_asha_job(t, 1, 3, true));  // what the runner did before the fix
}

TEST_CASE("asha: [search] keys are checked", "[asha][experiment]") {
  const std::string head = exptest::kHead + "[train]\nmodel = \"lenet\"\nepochs = 9\n";
  const dprun::Experiment ex = exptest::parse(head +
                                              "validation = 100\n[search]\nscheduler = \"asha\"\n"
                                              "eta = 3\nmin_epochs = 1\n[sweep]\nlr = [0.1, 0.2]\n");
  CHECK(ex.search.asha());
  CHECK(ex.search.metric == "val_acc");  // auto, with a validation split everywhere
  CHECK(exptest::parse(head + "[search]\nscheduler = \"asha\"\n").search.metric == "test_acc");
  CHECK_THAT(exptest::error_of(head + "[search]\nscheduler = \"asha\"\neta = 1\n").what(),
             Catch::Contains("search.eta: expected an integer of at least 2, got 1"));
  CHECK_THAT(exptest::error_of(head + "[search]\neta = 3\n").what(),
             Catch::Contains("eta is a setting of the asha scheduler"));
  CHECK_THAT(exptest::error_of(head + "[search]\nscheduler = \"hyperband\"\n").what(),
             Catch::Contains("expected one of \"none\", \"asha\""));
  CHECK_THAT(exptest::error_of(head + "checkpoint = \"none\"\n[search]\nscheduler = \"asha\"\n")
                 .what(),
             Catch::Contains("asha resumes a promoted trial from its checkpoint"));
  CHECK_THAT(exptest::error_of(head + "[search]\nscheduler = \"asha\"\n[sweep]\nvalidation = [0, 100]\n")
                 .what(),
             Catch::Contains("metric \"auto\" would rank some trials on validation"));
  CHECK_THAT(exptest::error_of(head + "[search]\nscheduler = \"asha\"\nmetric = \"val_loss\"\n")
                 .what(),
             Catch::Contains("needs a validation split in every trial"));
}
