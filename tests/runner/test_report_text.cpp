// `dprun report`'s reasons for a missing speedup (ExperimentTrials::no_speedup_reason), on
// trials made by hand: the scaling view's matching rules, said in words.
#include <catch2/catch.hpp>

#include "report/report.hpp"

namespace {

// Trials of one experiment with the settings (model, gpus, per_gpu_batch, seed); seed may
// differ from the baseline, per_gpu_batch may not.
dprun::ExperimentTrials trials(
    const std::vector<std::tuple<std::string, std::string, std::string, bool>>& rows) {
  dprun::ExperimentTrials x;
  x.baseline_may_differ = {false, false, false, true};
  int64_t id = 0;
  for (const auto& [gpus, per_gpu, backend, done] : rows) {
    dps::TrialSummary t;
    t.trial.id = ++id;
    t.trial.status = done ? dps::TrialStatus::done : dps::TrialStatus::failed;
    t.trial.backend = backend;
    x.trials.push_back(t);
    x.settings.push_back(
        {{"model", "lenet"}, {"gpus", gpus}, {"per_gpu_batch", per_gpu}, {"seed", "0"}});
  }
  x.shown = {0, 1, 2};
  return x;
}

}  // namespace

TEST_CASE("report: a missing speedup says which baseline setting differs", "[report]") {
  auto x = trials({{"1", "256", "cpu", true}, {"2", "128", "cpu", true}, {"4", "64", "cpu", true}});
  CHECK(x.no_speedup_reason(0).empty());  // the 1-GPU trial is its own baseline
  CHECK(x.no_speedup_reason(1) ==
        "its per_gpu_batch is 128, the 1-GPU trial's 256 (speedup compares trials that differ "
        "only in gpus, and in settings that may vary with it, such as batch_size and lr)");
  // A baseline that matches: no reason (the view gives the speedup).
  x.trials[1].speedup = 1.8;
  CHECK(x.no_speedup_reason(1).empty());
  // A setting allowed to differ (seed) is not named.
  x.settings[2][3] = {"seed", std::string("7")};
  CHECK_THAT(x.no_speedup_reason(2), Catch::StartsWith("its per_gpu_batch is 64, the 1-GPU "
                                                       "trial's 256 ("));
}

TEST_CASE("report: no 1-GPU trial on the same backend, or a trial not done", "[report]") {
  auto x = trials({{"1", "64", "cpu", true}, {"2", "64", "cuda", true}, {"2", "64", "cpu", false}});
  CHECK(x.no_speedup_reason(1) == "no done 1-GPU trial on cuda in this experiment to compare with");
  CHECK(x.no_speedup_reason(2).empty());  // failed: its status says why
  // A 1-GPU trial that did not finish is no baseline.
  x.trials[0].trial.status = dps::TrialStatus::failed;
  x.trials[1].trial.backend = std::string("cpu");
  CHECK(x.no_speedup_reason(1) == "no done 1-GPU trial on cpu in this experiment to compare with");
}
