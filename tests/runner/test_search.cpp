// The sweep tool's input language: --set overrides, sampled keys ([search] samples with
// distributions in [sweep]), the validation split and the stopping rule's settings, and the
// rule itself on recorded metric sequences.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "experiment/experiment.hpp"
#include "experiment/experiment_detail.hpp"
#include "experiment_helpers.hpp"
#include "process/stop_rule.hpp"

namespace {

using exptest::kHead;
using exptest::parse;

dprun::ParseOptions with_sets(std::vector<std::string> sets) {
  dprun::ParseOptions o;
  o.overrides = std::move(sets);
  return o;
}

std::vector<dprun::ConfigError> override_errors(const std::string& text,
                                                std::vector<std::string> sets) {
  try {
    parse(text, with_sets(std::move(sets)));
  } catch (const dprun::ConfigErrors& e) {
    return e.errors();
  }
  FAIL("expected ConfigErrors");
  return {};
}

const std::string kLenet = kHead + "[train]\nmodel = \"lenet\"\nepochs = 3\n";

}  // namespace

// ---- --set -------------------------------------------------------------------------------------

TEST_CASE("overrides (--set) replace values of the file and are part of the trials' settings",
          "[experiment][overrides]") {
  const dprun::Experiment plain = parse(kLenet);
  const dprun::Experiment ex =
      parse(kLenet, with_sets({"train.epochs=2", "model.lenet.hidden=64", "train.layout=nhwc",
                               "sweep.lr=[0.1, 0.2]"}));
  REQUIRE(ex.trials.size() == 2);
  for (const auto& t : ex.trials) {
    CHECK(t.settings.integer("epochs") == 2);
    CHECK(t.settings.text("layout") == "nhwc");  // a bare word is the string it spells
    CHECK(std::get<int64_t>(t.model_options.at("hidden")) == 64);
  }
  CHECK(ex.trials[0].settings.number("lr") == 0.1);
  CHECK(ex.trials[1].settings.number("lr") == 0.2);
  CHECK(ex.trials[0].config_hash != plain.trials[0].config_hash);  // another trial
  // The stored source says how the file was run.
  CHECK(ex.overrides.size() == 4);
  CHECK(ex.source.find("#   train.epochs=2") != std::string::npos);
  // Overriding with the file's own value is the same trial.
  CHECK(parse(kLenet, with_sets({"train.epochs=3"})).trials[0].config_hash ==
        plain.trials[0].config_hash);
  // A quoted key reaches a swept model option.
  const auto opt = parse(kLenet, with_sets({"sweep.\"model.lenet.hidden\"=[32, 64, 96]"}));
  CHECK(opt.trials.size() == 3);
}

TEST_CASE("overrides (--set) are checked as the file's, and errors name the override",
          "[experiment][overrides]") {
  auto errors = override_errors(kLenet, {"train.epochs=two"});
  REQUIRE(errors.size() == 1);
  CHECK(std::string(errors[0].what()) ==
        "--set train.epochs=two: train.epochs: expected a positive integer, got \"two\"");
  CHECK(errors[0].line() == 0);

  errors = override_errors(kLenet, {"train.epoch=2"});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].what(), Catch::StartsWith("--set train.epoch=2: train.epoch: unknown key; "
                                                 "did you mean \"epochs\"?"));

  errors = override_errors(kLenet, {"epochs"});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].what(), Catch::Contains("--set epochs: expected KEY=VALUE"));

  errors = override_errors(kLenet, {"traim.epochs=2"});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].what(),
             Catch::StartsWith("--set traim.epochs=2: traim: unknown section; did you mean"));

  // A [train] value the file sweeps would change nothing: said, not ignored.
  errors = override_errors(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\nlr = [0.1, 0.2]\n",
                           {"train.lr=0.3"});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].what(), Catch::Contains("override the sweep instead, e.g. --set 'sweep.lr"));
  // The same for a key of a group of settings, however the file writes it.
  errors =
      override_errors(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\n\"stop.patience\" = [1, 2]\n",
                      {"train.stop.patience=3"});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].what(), Catch::Contains("the file sweeps stop.patience"));
  // And for a model's or the dataset's option the file sweeps.
  errors = override_errors(
      kHead + "[train]\nmodel = \"lenet\"\n[sweep]\n\"model.lenet.hidden\" = [32, 64]\n",
      {"model.lenet.hidden=16"});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].what(),
             Catch::Contains("the file sweeps model.lenet.hidden in [sweep], which replaces "
                             "[model.lenet]'s value: override the sweep instead, e.g. --set "
                             "'sweep.\"model.lenet.hidden\"=[...]'"));
  errors = override_errors(kHead +
                               "[data]\ndataset = \"arrays\"\n[train]\nmodel = \"lenet\"\n"
                               "[sweep]\n\"data.arrays.classes\" = [3, 5]\n",
                           {"data.arrays.classes=9"});
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].what(), Catch::Contains("the file sweeps data.arrays.classes"));
  // A distribution given by --set replaces the file's, it is not merged into it.
  const dprun::Experiment swapped =
      parse(kHead +
                "[train]\nmodel = \"lenet\"\n[search]\nsamples = 4\n[sweep]\n"
                "lr = {log_uniform = [0.001, 1.0]}\n",
            with_sets({"sweep.lr={choice=[0.1, 0.2]}"}));
  REQUIRE(swapped.trials.size() == 2);  // 4 draws of two values: the two trials
  for (const auto& t : swapped.trials)
    CHECK((t.settings.number("lr") == 0.1 || t.settings.number("lr") == 0.2));
}

// ---- sampled search ---------------------------------------------------------------------------

namespace {

const std::string kSampled = kHead +
                             "[train]\nmodel = \"lenet\"\n"
                             "[search]\nsamples = 16\nseed = 3\n"
                             "[sweep]\n"
                             "lr = {log_uniform = [0.001, 1.0]}\n"
                             "batch_size = {choice = [64, 128, 256]}\n"
                             "\"model.lenet.hidden\" = {int_uniform = [32, 256]}\n"
                             "seed = [0, 1]\n";

}  // namespace

TEST_CASE("sampled keys draw the same values every time, within their distributions",
          "[experiment][search]") {
  const dprun::Experiment a = parse(kSampled);
  const dprun::Experiment b = parse(kSampled);
  // 16 samples (the sampled keys advance together) times the seed axis.
  REQUIRE(a.trials.size() == 32);
  std::set<int64_t> batches;
  std::set<double> lrs;
  for (size_t i = 0; i < a.trials.size(); ++i) {
    const auto& s = a.trials[i].settings;
    CHECK(a.trials[i].config_hash == b.trials[i].config_hash);
    const double lr = s.number("lr");
    CHECK(lr >= 0.001);
    CHECK(lr <= 1.0);
    lrs.insert(lr);
    const int64_t batch = s.integer("batch_size");
    CHECK((batch == 64 || batch == 128 || batch == 256));
    batches.insert(batch);
    const int64_t hidden = std::get<int64_t>(a.trials[i].model_options.at("hidden"));
    CHECK(hidden >= 32);
    CHECK(hidden <= 256);
    // The label shows the drawn values (dprun plan prints it).
    CHECK_THAT(a.trials[i].label, Catch::Contains("lr="));
  }
  CHECK(lrs.size() == 16);     // one draw per sample, shared by both seeds
  CHECK(batches.size() == 3);  // 16 draws of 3 choices see them all (here)
  // The sampled axis comes first (lr is the first key of [sweep]): seeds vary fastest.
  CHECK(a.trials[0].settings.number("lr") == a.trials[1].settings.number("lr"));
  CHECK(a.trials[0].settings.integer("seed") == 0);
  CHECK(a.trials[1].settings.integer("seed") == 1);
  // log_uniform spreads over the decades: some draws below 0.01, some above 0.1.
  CHECK(*lrs.begin() < 0.01);
  CHECK(*lrs.rbegin() > 0.1);
}

TEST_CASE("more samples extend the sequence, another seed draws another one",
          "[experiment][search]") {
  std::string more = kSampled;
  more.replace(more.find("samples = 16"), 12, "samples = 20");
  const dprun::Experiment a = parse(kSampled), b = parse(more);
  REQUIRE(b.trials.size() == 40);
  for (size_t i = 0; i < a.trials.size(); ++i)
    CHECK(a.trials[i].config_hash == b.trials[i].config_hash);
  std::string other = kSampled;
  other.replace(other.find("seed = 3"), 8, "seed = 4");
  const dprun::Experiment c = parse(other);
  CHECK(c.trials[0].settings.number("lr") != a.trials[0].settings.number("lr"));
}

TEST_CASE("draws are fixed numbers: the first draws of a known seed", "[experiment][search]") {
  // Pinned so that a change of the hash or the rounding, which would silently give stored
  // sweeps new trials, fails here. Values are rounded to 6 significant digits.
  const dprun::Experiment ex = parse(kHead +
                                     "[train]\nmodel = \"lenet\"\n[search]\nsamples = 3\n"
                                     "[sweep]\nlr = {uniform = [0.0, 1.0]}\n");
  REQUIRE(ex.trials.size() == 3);
  CHECK(ex.trials[0].settings.number("lr") == 0.274618);
  CHECK(ex.trials[1].settings.number("lr") == 0.846637);
  CHECK(ex.trials[2].settings.number("lr") == 0.65494);
  const double u0 = dprun::detail::sample_unit(0, "lr", 0);
  CHECK(u0 >= 0.274618 - 5e-7);
  CHECK(u0 < 0.274618 + 5e-7);
}

TEST_CASE("bad distributions are refused at the key", "[experiment][search]") {
  const std::string head = kHead + "[train]\nmodel = \"lenet\"\n[search]\nsamples = 4\n[sweep]\n";
  CHECK_THAT(exptest::error_of(head + "lr = {log_uniform = [0.0, 1.0]}\n").what(),
             Catch::Contains("sweep.lr.log_uniform: log_uniform needs 0 < low < high"));
  CHECK_THAT(exptest::error_of(head + "lr = {uniform = [1.0, 0.5]}\n").what(),
             Catch::Contains("needs low < high"));
  CHECK_THAT(exptest::error_of(head + "lr = {log_unform = [0.1, 1.0]}\n").what(),
             Catch::Contains("did you mean \"log_uniform\""));
  CHECK_THAT(exptest::error_of(head + "layout = {uniform = [0, 1]}\n").what(),
             Catch::Contains("layout takes other values: use choice"));
  CHECK_THAT(exptest::error_of(head + "gpus = {uniform = [1.5, 4]}\n").what(),
             Catch::Contains("expected [low, high], two integers"));
  CHECK_THAT(exptest::error_of(head + "layout = {choice = [\"nchw\", \"nhwx\"]}\n").what(),
             Catch::Contains("nhwx"));
  CHECK_THAT(exptest::error_of(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\nlr = {uniform = "
                                       "[0.1, 1.0]}\n")
                 .what(),
             Catch::Contains("a distribution needs [search] samples = N"));
  CHECK_THAT(
      exptest::error_of(kHead + "[train]\nmodel = \"lenet\"\n[search]\nsamples = 4\n").what(),
      Catch::Contains("search.samples: no [sweep] key is a distribution"));
  CHECK_THAT(exptest::error_of(head + "[[sweep.zip]]\nlr = {uniform = [0.1, 1.0]}\n").what(),
             Catch::Contains("a distribution cannot be in a zip group"));
}

// ---- validation and the stopping rule's settings ------------------------------------------

TEST_CASE("the validation split and the stopping rule are settings with their own checks",
          "[experiment][search]") {
  const dprun::Experiment ex = parse(kHead +
                                     "[train]\nmodel = \"lenet\"\nvalidation = 5000\n"
                                     "stop = {metric = \"val_loss\", patience = 3, "
                                     "min_delta = 0.001}\n"
                                     "[sweep]\n\"stop.target\" = [0.0, 0.5]\n");
  REQUIRE(ex.trials.size() == 2);
  const auto& s = ex.trials[0].settings;
  CHECK(s.number("validation") == 5000.0);
  CHECK(s.text("stop_metric") == "val_loss");
  CHECK(s.integer("stop_patience") == 3);
  CHECK(s.number("stop_min_delta") == 0.001);
  CHECK(ex.trials[1].settings.number("stop_target") == 0.5);
  // The dotted form is the same setting.
  const dprun::Experiment dotted = parse(kHead +
                                         "[train]\nmodel = \"lenet\"\nvalidation = 5000\n"
                                         "stop.metric = \"val_loss\"\nstop.patience = 3\n"
                                         "stop.min_delta = 0.001\n");
  CHECK(dotted.trials[0].config_hash == ex.trials[0].config_hash);

  CHECK_THAT(exptest::error_of(kHead + "[train]\nmodel = \"lenet\"\nvalidation = 2.5\n").what(),
             Catch::Contains("train.validation: validation 2.5: a count of examples is a whole"));
  CHECK_THAT(
      exptest::error_of(kHead + "[train]\nmodel = \"lenet\"\nstop.metric = \"val_acc\"\n").what(),
      Catch::Contains("stop.metric \"val_acc\" needs a validation split"));
  CHECK_THAT(
      exptest::error_of(kHead + "[train]\nmodel = \"lenet\"\nstop = {patiense = 3}\n").what(),
      Catch::Contains("train.stop.patiense: unknown key; did you mean \"stop.patience\"?"));
}

TEST_CASE("the stopping rule stops at the right epoch on recorded metric sequences",
          "[search][stop]") {
  dprun::StopRule rule;
  rule.metric = "val_acc";
  rule.patience = 3;
  rule.min_delta = 0.01;
  SECTION("patience: three epochs without an improvement of more than min_delta") {
    dprun::StopWatch w(rule);
    const std::vector<double> acc = {0.50, 0.60, 0.605, 0.609, 0.62, 0.615, 0.61, 0.60};
    std::vector<std::string> why;
    for (size_t i = 0; i < acc.size(); ++i) why.push_back(w.observe(int64_t(i) + 1, acc[i]));
    // Best 0.60 after epoch 2; 0.605 and 0.609 are within min_delta; 0.62 is better by 0.02
    // (epoch 5); then 6, 7, 8 do not improve: stop after epoch 8.
    for (size_t i = 0; i < 7; ++i) CHECK(why[i].empty());
    CHECK_THAT(why[7], Catch::StartsWith("stopped after epoch 8: val_acc has not improved by "
                                         "more than 0.01 for 3 epochs"));
    CHECK_THAT(why[7], Catch::Contains("best 0.62 after epoch 5"));
  }
  SECTION("a loss must fall") {
    rule.metric = "val_loss";
    rule.higher_is_better = false;
    rule.patience = 2;
    rule.min_delta = 0;
    dprun::StopWatch w(rule);
    CHECK(w.observe(1, 1.0).empty());
    CHECK(w.observe(2, 0.9).empty());
    CHECK(w.observe(3, 0.95).empty());
    CHECK_FALSE(w.observe(4, 0.9).empty());  // equal is no improvement
  }
  SECTION("target") {
    rule.patience = 0;
    rule.target = 0.9;
    dprun::StopWatch w(rule);
    CHECK(w.observe(1, 0.5).empty());
    CHECK_THAT(w.observe(2, 0.91), Catch::Contains("val_acc 0.91 reached the target 0.9"));
  }
  SECTION("a resumed watch stops where a straight run stops") {
    dprun::StopWatch straight(rule), resumed(rule);
    const std::vector<double> acc = {0.5, 0.7, 0.69, 0.68, 0.695};
    std::string a, b;
    for (size_t i = 0; i < acc.size(); ++i) a = straight.observe(int64_t(i) + 1, acc[i]);
    resumed.replay({0.5, 0.7, 0.69});
    resumed.observe(4, 0.68);
    b = resumed.observe(5, 0.695);
    CHECK(!a.empty());
    CHECK(a == b);
  }
  SECTION("a metric the trial does not record never stops it") {
    dprun::StopWatch w(rule);
    for (int e = 1; e < 10; ++e) CHECK(w.observe(e, std::nan("")).empty());
  }
}
