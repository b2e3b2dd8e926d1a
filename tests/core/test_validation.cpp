// The validation split: which examples hold_out takes (by its seed alone, disjoint from what
// stays, the rest in order), and the trainer's evaluation of a validation set beside the test set.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "dp/data.hpp"
#include "dp/error.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"

namespace {

// A set whose example i has every pixel equal to i % 256 and label i % 10, so an example is
// recognised by its first pixel and label.
dp::Dataset numbered(int64_t count) {
  dp::Dataset d;
  d.name = "numbered";
  d.count = count;
  d.channels = 1;
  d.height = d.width = 2;
  for (int64_t i = 0; i < count; ++i) {
    for (int p = 0; p < 4; ++p) d.images.push_back(static_cast<uint8_t>(i % 256));
    d.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return d;
}

}  // namespace

TEST_CASE("hold_out takes count examples by its seed, disjoint from the rest, which keep order",
          "[data][validation]") {
  dp::Dataset train = numbered(200);
  const dp::Dataset val = dp::hold_out(train, 50, 7);
  CHECK(val.count == 50);
  CHECK(train.count == 150);
  CHECK(val.name == "numbered:validation");
  CHECK(val.images.size() == 50 * 4);
  std::set<int> held, kept;
  for (int64_t i = 0; i < val.count; ++i) {
    const int id = val.images[static_cast<size_t>(i * 4)];
    CHECK(val.labels[static_cast<size_t>(i)] == id % 10);  // image and label travel together
    held.insert(id);
  }
  int last = -1;
  for (int64_t i = 0; i < train.count; ++i) {
    const int id = train.images[static_cast<size_t>(i * 4)];
    CHECK(id > last);  // the examples left keep their order
    last = id;
    kept.insert(id);
  }
  CHECK(held.size() == 50);
  for (int id : held) CHECK(kept.count(id) == 0);
  CHECK(held.size() + kept.size() == 200);

  // The same seed, the same examples; another seed, others.
  dp::Dataset again = numbered(200), other = numbered(200);
  CHECK(dp::hold_out(again, 50, 7).images == val.images);
  CHECK(dp::hold_out(other, 50, 8).images != val.images);

  dp::Dataset small = numbered(10);
  CHECK_THROWS_WITH(dp::hold_out(small, 10, 0), Catch::Contains("cannot hold out 10 of 10"));
  CHECK_THROWS_WITH(dp::hold_out(small, 0, 0), Catch::Contains("cannot hold out 0 of 10"));
}

TEST_CASE("the trainer evaluates a validation set as it evaluates the test set",
          "[trainer][validation]") {
  const auto train = enginetest::synthetic_dataset(200, 41);
  const auto test = enginetest::synthetic_dataset(77, 42);
  const auto validation = enginetest::synthetic_dataset(53, 43);
  dp::TrainerOptions o;
  o.replicas = 2;
  o.batch_size = 50;
  o.eval_batch_size = 30;
  o.epochs = 2;
  o.seed = 3;
  o.cpu_threads = 2;
  o.lr.base = 0.1;
  SECTION("eager") {}
  SECTION("graphs") { o.graphs = true; }
  auto fit = [&](const dp::Dataset& test_set, const dp::Dataset* validation_set) {
    dp::Trainer t(o, enginetest::small_bn_net, train, test_set, validation_set);
    std::vector<dp::EpochReport> reports;
    t.fit([&](const dp::EpochReport& e) {
      reports.push_back(e);
      return true;
    });
    return reports;
  };
  const auto both = fit(test, &validation);
  // The validation set as a trainer's test set: its numbers must be those reported as val_*.
  const auto as_test = fit(validation, nullptr);
  const auto plain = fit(test, nullptr);
  REQUIRE(both.size() == 2);
  REQUIRE(as_test.size() == 2);
  REQUIRE(plain.size() == 2);
  for (size_t e = 0; e < both.size(); ++e) {
    INFO("epoch " << e + 1);
    CHECK(both[e].val_acc == as_test[e].test_acc);
    CHECK(both[e].val_loss == as_test[e].test_loss);
    CHECK(both[e].val_examples == 53);
    // The test set's numbers do not change with a validation set beside it.
    CHECK(both[e].test_acc == plain[e].test_acc);
    CHECK(both[e].test_loss == plain[e].test_loss);
    CHECK(both[e].train_loss == plain[e].train_loss);
    CHECK(std::isnan(plain[e].val_acc));
    CHECK(std::isnan(plain[e].val_loss));
    CHECK(both[e].test_loss > 0);
  }
  // Learning shows in the loss the evaluation computes.
  CHECK(both[1].test_loss < both[0].test_loss);
}

TEST_CASE("a validation set of another shape is refused", "[trainer][validation]") {
  const auto train = enginetest::synthetic_dataset(64, 1);
  dp::Dataset other = train.head(8);
  other.classes = 5;
  dp::TrainerOptions o;
  o.batch_size = 32;
  CHECK_THROWS_WITH(dp::Trainer(o, enginetest::small_bn_net, train, train.head(8), &other),
                    Catch::Contains("the validation set"));
}
