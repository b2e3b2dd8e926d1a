// Gradient buckets (core/src/buckets.hpp): how the flat gradient buffer is cut, the order
// buckets are summed in whatever order layers report, and that bucketed, overlapped sums give
// exactly the parameters of one sum after backward.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "../../core/src/buckets.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "test_cpu_util.hpp"

namespace {

/// Records launches instead of summing.
struct Recorder final : dp::BucketLauncher {
  std::vector<std::pair<size_t, size_t>> launched;  // (offset from base, count)
  float* base = nullptr;
  void launch(float* data, size_t count) override {
    launched.emplace_back(static_cast<size_t>(data - base), count);
  }
  void wait() override {}
};

}  // namespace

TEST_CASE("Gradient buckets tile the buffer, last parameters first, within the cap",
          "[engine][buckets]") {
  auto backend = cputest::make_cpu(1);
  auto model = enginetest::build_model("libdprun_lenet.so", "lenet");
  dp::ParamRegistry registry;
  model->declare(registry, "");
  const size_t floats = registry.parameter_floats();
  for (const size_t cap : {size_t{0}, size_t{4096}, size_t{64 * 1024}, size_t{1} << 30}) {
    INFO("cap " << cap << " bytes");
    dp::GradientBuckets b(registry, cap, cap / 4);
    const auto& buckets = b.buckets();
    REQUIRE(!buckets.empty());
    CHECK(buckets.front().end == floats);  // the last parameters first
    CHECK(buckets.back().begin == 0);
    int parameters = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      parameters += buckets[i].parameters;
      CHECK(buckets[i].begin < buckets[i].end);
      if (i > 0) CHECK(buckets[i].end == buckets[i - 1].begin);  // no gap, no overlap
    }
    int trainable = 0;
    for (const auto& e : registry.entries()) trainable += e.trainable ? 1 : 0;
    CHECK(parameters == trainable);
    if (cap == 0 || cap == (size_t{1} << 30)) CHECK(buckets.size() == 1);
    if (cap == 4096) {
      // Each bucket within the cap unless one parameter alone is larger (LeNet's fc1 weight).
      for (const auto& bk : buckets) {
        if (bk.parameters > 1) CHECK((bk.end - bk.begin) * sizeof(float) <= 4096 + 64 * 4);
      }
      CHECK(buckets.size() >= 4);
    }
  }
}

TEST_CASE("Gradient buckets launch in order, whatever order gradients are reported in",
          "[engine][buckets]") {
  auto model = enginetest::build_model("libdprun_lenet.so", "lenet");
  dp::ParamRegistry registry;
  model->declare(registry, "");
  dp::GradientBuckets b(registry, 4096, 1024);
  const auto& buckets = b.buckets();
  REQUIRE(buckets.size() >= 3);
  std::vector<float> grads(registry.parameter_floats());
  Recorder rec;
  rec.base = grads.data();
  // Report every parameter in declaration order: the reverse of what backward does, so bucket 0
  // (the last parameters) completes last and nothing may launch before it.
  b.start(grads.data(), rec);
  const auto& entries = registry.entries();
  size_t reported = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].trainable) continue;
    b.ready(dp::ParamHandle{static_cast<int>(i)});
    ++reported;
    if (reported < static_cast<size_t>(buckets.size())) CHECK(rec.launched.empty());
  }
  b.finish();
  REQUIRE(rec.launched.size() == buckets.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    CHECK(rec.launched[i].first == buckets[i].begin);
    CHECK(rec.launched[i].second == buckets[i].end - buckets[i].begin);
  }
  // Nothing reported: finish() launches every bucket, in order.
  rec.launched.clear();
  b.start(grads.data(), rec);
  b.finish();
  CHECK(rec.launched.size() == buckets.size());
  // A parameter reported twice in one step is refused (it would launch a bucket early).
  b.start(grads.data(), rec);
  int first = -1;
  for (size_t i = 0; i < entries.size() && first < 0; ++i)
    if (entries[i].trainable) first = static_cast<int>(i);
  b.ready(dp::ParamHandle{first});
  CHECK_THROWS_WITH(b.ready(dp::ParamHandle{first}), Catch::Contains("twice"));
}

TEST_CASE("Bucketed gradient sums overlapping backward give exactly the unbucketed parameters",
          "[engine][buckets][trainer]") {
  // The same sums element by element (rank order), only cut and timed differently: the
  // parameters must be bit-identical, for plain LeNet and for a BN net with sync BN, whose
  // statistics' collectives run on the replica threads while the buckets run on the
  // communication threads.
  bool real = false;
  const auto data = enginetest::training_data(200, 6, &real);
  for (const bool sync : {false, true}) {
    DYNAMIC_SECTION((sync ? "synchronised BN net" : "LeNet")) {
      auto o = dp::TrainerOptions{};
      o.replicas = 3;
      o.batch_size = 61;
      o.lr.base = 0.1f;
      o.optimizer.momentum = 0.9f;
      o.seed = 5;
      o.cpu_threads = 3;
      o.sync_bn = sync;
      o.average_bn_buffers = false;
      const dp::ModelBuilder builder = [sync]() -> std::unique_ptr<dp::Module> {
        if (!sync) return enginetest::build_model("libdprun_lenet.so", "lenet");
        return enginetest::build_model("libdprun_resnet18.so", "resnet18", {{"width", int64_t{8}}});
      };
      auto run = [&](size_t bucket_bytes) {
        auto oo = o;
        oo.bucket_bytes = bucket_bytes;
        oo.first_bucket_bytes = bucket_bytes / 4;
        dp::Trainer t(oo, builder, data, data.head(0));
        t.run_epoch(1);
        return t.parameters(0);
      };
      const auto whole = run(0);
      CHECK(run(2048) == whole);
      CHECK(run(size_t{1} << 20) == whole);
    }
  }
}
