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
  // The test set given as the validation set too: the same numbers, bit for bit.
  dp::Trainer t(o, enginetest::small_bn_net, train, test, &test);
  std::vector<dp::EpochReport> reports;
  t.fit([&](const dp::EpochReport& e) {
    reports.push_back(e);
    return true;
  });
  REQUIRE(reports.size() == 2);
  for (const auto& e : reports) {
    CHECK(e.val_acc == e.test_acc);
    CHECK(e.val_loss == e.test_loss);
    CHECK(e.val_examples == 77);
    CHECK(e.test_loss > 0);
    CHECK(std::isfinite(e.test_loss));
  }
  // Learning shows in the loss the evaluation computes.
  CHECK(reports[1].test_loss < reports[0].test_loss);

  // Without a validation set: NaN, and the test numbers do not change.
  dp::Trainer plain(o, enginetest::small_bn_net, train, test);
  std::vector<dp::EpochReport> plain_reports;
  plain.fit([&](const dp::EpochReport& e) {
    plain_reports.push_back(e);
    return true;
  });
  for (size_t i = 0; i < plain_reports.size(); ++i) {
    CHECK(std::isnan(plain_reports[i].val_acc));
    CHECK(std::isnan(plain_reports[i].val_loss));
    CHECK(plain_reports[i].test_acc == reports[i].test_acc);
    CHECK(plain_reports[i].test_loss == reports[i].test_loss);
  }
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
