// The trainer with augmentation and with data streamed through a device budget, on the CPU
// backend: k replicas compute one replica's step with augmentation on, a resumed run computes
// the uninterrupted one, and the streamed path computes the device path's bits (k = 1 and
// k > 1, with augmentation, with graphs, from a resumed epoch, with step()).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"
#include "test_cpu_util.hpp"

namespace {

using enginetest::norm_relative_error;

// DPRUN_CPU_DEFER_UPLOADS=1 while it lives: the cpu backend's uploads happen as late as the
// contract allows (at wait_upload / await_upload, reading their source then).
struct DeferredUploads {
  DeferredUploads() { setenv("DPRUN_CPU_DEFER_UPLOADS", "1", 1); }
  ~DeferredUploads() { unsetenv("DPRUN_CPU_DEFER_UPLOADS"); }
  DeferredUploads(const DeferredUploads&) = delete;
  DeferredUploads& operator=(const DeferredUploads&) = delete;
};

dp::ModelBuilder lenet() {
  return [] { return enginetest::build_model("libdprun_lenet.so", "lenet", {{"init_std", 0.1}}); };
}

dp::Augmentation full_augmentation() {
  dp::Augmentation a;
  a.crop_padding = 3;
  a.flip = true;
  a.mean = {0.2860f};
  a.std = {0.3530f};
  return a;
}

dp::TrainerOptions options(int replicas, int64_t batch) {
  dp::TrainerOptions o;
  o.replicas = replicas;
  o.batch_size = batch;
  o.eval_batch_size = 40;
  o.epochs = 2;
  o.seed = 23;
  o.cpu_threads = 2;
  o.lr.base = 0.1;
  o.optimizer.momentum = 0.9f;
  o.augment = full_augmentation();
  return o;
}

struct Run {
  std::vector<dp::EpochReport> reports;
  std::vector<float> params, buffers;
  dp::DataResidence residence;
};

Run fit(const dp::TrainerOptions& o, const dp::ModelBuilder& builder, const dp::Dataset& train,
        const dp::Dataset& test) {
  dp::Trainer t(o, builder, train, test);
  Run run;
  t.fit([&](const dp::EpochReport& r) {
    run.reports.push_back(r);
    return true;
  });
  run.params = t.parameters(0);
  run.buffers = t.buffers(0);
  run.residence = t.data_residence();
  for (int r = 1; r < t.replicas(); ++r) CHECK(t.parameters(r) == run.params);
  return run;
}

void check_same_run(const Run& got, const Run& expected) {
  REQUIRE(got.reports.size() == expected.reports.size());
  for (size_t e = 0; e < got.reports.size(); ++e) {
    INFO("epoch " << e + 1);
    CHECK(got.reports[e].train_loss == expected.reports[e].train_loss);
    CHECK(got.reports[e].train_acc == expected.reports[e].train_acc);
    CHECK(got.reports[e].test_acc == expected.reports[e].test_acc);
    CHECK(got.reports[e].test_loss == expected.reports[e].test_loss);
  }
  CHECK(got.params == expected.params);
  CHECK(got.buffers == expected.buffers);
}

}  // namespace

TEST_CASE("augmentation: defaults change nothing, draws change the run", "[trainer][augment]") {
  const auto train = enginetest::synthetic_dataset(130, 3);
  const auto test = enginetest::synthetic_dataset(50, 4);
  dp::TrainerOptions o = options(1, 32);
  o.epochs = 1;
  o.augment = {};
  const Run plain = fit(o, lenet(), train, test);
  // Normalising by mean 0 and std 1, and padding 0 without flips, are the identity: same bits.
  o.augment.mean = {0.0f};
  o.augment.std = {1.0f};
  check_same_run(fit(o, lenet(), train, test), plain);
  o.augment = full_augmentation();
  const Run augmented = fit(o, lenet(), train, test);
  CHECK(augmented.params != plain.params);
  CHECK(std::isfinite(augmented.reports[0].train_loss));
  // Wrong settings are the user's error, said in their words.
  o.augment.std = {0.3f, 0.3f};
  CHECK_THROWS_WITH(fit(o, lenet(), train, test), Catch::Contains("augment.mean has 1 values"));
  o.augment = full_augmentation();
  o.augment.mean = {0.1f, 0.2f, 0.3f};
  o.augment.std = {0.3f, 0.3f, 0.3f};
  CHECK_THROWS_WITH(fit(o, lenet(), train, test), Catch::Contains("1 channels"));
}

TEST_CASE("augmentation: k replicas compute the step of one replica", "[trainer][augment]") {
  bool real = false;
  const auto data = enginetest::training_data(260, 3, &real);
  INFO((real ? "Fashion-MNIST" : "synthetic data"));
  dp::TrainerOptions o = options(1, 64);  // 260 = 4 x 64 + 4: a last batch of 4
  // The identity tests' regime: a few steps at a rate that keeps them stable (no momentum), so
  // rounding differences are not amplified chaotically.
  o.epochs = 1;
  o.lr.base = 0.2;
  o.optimizer.momentum = 0.0f;
  const Run one = fit(o, lenet(), data, data.head(0));
  for (const int k : {2, 3}) {
    INFO(k << " replicas");
    o.replicas = k;
    const Run many = fit(o, lenet(), data, data.head(0));
    // Only the summation order of the gradients differs (the identity tests' tolerance).
    CHECK(norm_relative_error(many.params, one.params) <= 1e-5);
    for (size_t e = 0; e < one.reports.size(); ++e) {
      CHECK(many.reports[e].train_loss == Approx(one.reports[e].train_loss).epsilon(1e-5));
    }
  }
}

TEST_CASE("augmentation: a resumed run computes the uninterrupted run's bits",
          "[trainer][augment][checkpoint]") {
  const auto train = enginetest::synthetic_dataset(150, 7);
  const auto test = enginetest::synthetic_dataset(40, 8);
  dp::TrainerOptions o = options(2, 64);
  o.epochs = 3;
  for (const size_t budget : {size_t{0}, size_t{1}}) {
    DYNAMIC_SECTION((budget == 0 ? "on the device" : "streamed")) {
      o.data_budget = budget;
      const Run whole = fit(o, lenet(), train, test);
      dptest::TempDir dir;
      {
        dp::Trainer first(o, lenet(), train, test);
        first.run_epoch(1);
        dp::write_safetensors(dir.path() + "/model.safetensors", first.model_state());
        dp::write_safetensors(dir.path() + "/state.safetensors", first.optimizer_state());
      }
      dp::Trainer resumed(o, lenet(), train, test);
      const auto state = dp::read_safetensors(dir.path() + "/state.safetensors");
      resumed.load_state(dp::read_safetensors(dir.path() + "/model.safetensors"), &state);
      std::vector<dp::EpochReport> got;
      resumed.fit(
          [&](const dp::EpochReport& r) {
            got.push_back(r);
            return true;
          },
          2);
      REQUIRE(got.size() == 2);
      for (size_t i = 0; i < 2; ++i) {
        CHECK(got[i].train_loss == whole.reports[i + 1].train_loss);
        CHECK(got[i].test_acc == whole.reports[i + 1].test_acc);
      }
      CHECK(resumed.parameters(0) == whole.params);
    }
  }
}

TEST_CASE("streamed data computes the device path's bits", "[trainer][stream]") {
  const auto train = enginetest::synthetic_dataset(301, 11);
  const auto test = enginetest::synthetic_dataset(97, 12);
  dp::TrainerOptions o = options(1, 48);  // 301 = 6 x 48 + 13
  SECTION("one replica, augmentation") {}
  SECTION("three replicas, augmentation, a last batch with an empty shard") {
    o.replicas = 3;
    o.batch_size = 149;  // 301 = 2 x 149 + 3
  }
  SECTION("two replicas, no augmentation, graphs") {
    o.replicas = 2;
    o.augment = {};
    o.graphs = true;
  }
  SECTION("two replicas, augmentation, graphs, NHWC") {
    o.replicas = 2;
    o.graphs = true;
    o.layout = dp::Layout::nhwc;
  }
  const Run resident = fit(o, lenet(), train, test);
  CHECK(resident.residence.path == "device");
  CHECK(resident.residence.device_bytes == resident.residence.resident_bytes);
  CHECK(resident.residence.chunk_examples == 0);
  const size_t example = 28 * 28, row = example + 1 + 4 + 4;
  // A budget of 1 byte: each slot holds one largest batch; one of ~3 batches per slot; one just
  // below what the sets need on the device.
  const int64_t shard = (o.batch_size + o.replicas - 1) / o.replicas;
  for (const size_t budget : {size_t{1}, 2 * row * static_cast<size_t>(3 * shard),
                              resident.residence.resident_bytes - 1}) {
    INFO("data budget " << budget);
    o.data_budget = budget;
    const Run streamed = fit(o, lenet(), train, test);
    CHECK(streamed.residence.path == "streamed");
    CHECK(streamed.residence.resident_bytes == resident.residence.resident_bytes);
    CHECK(streamed.residence.chunk_examples >= shard);
    CHECK(streamed.residence.device_bytes ==
          2 * static_cast<size_t>(streamed.residence.chunk_examples) * row);
    check_same_run(streamed, resident);
    // Again with every copy as late as a GPU's copy stream may do it: a step that read a slot
    // before its await_upload, or staging rewritten before its wait_upload, would change bits.
    const DeferredUploads late;
    check_same_run(fit(o, lenet(), train, test), resident);
  }
  o.data_budget = resident.residence.resident_bytes;  // fits exactly: on the device
  CHECK(fit(o, lenet(), train, test).residence.path == "device");
}

TEST_CASE("streamed data: step() computes the device path's bits", "[trainer][stream]") {
  const auto train = enginetest::synthetic_dataset(90, 13);
  dp::TrainerOptions o = options(2, 30);
  std::vector<std::vector<float>> params;
  for (const size_t budget : {size_t{0}, size_t{1}}) {
    o.data_budget = budget;
    dp::Trainer t(o, lenet(), train, train.head(0));
    CHECK(t.data_residence().path == (budget == 0 ? "device" : "streamed"));
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> idx;
      for (int i = 0; i < 30; ++i) idx.push_back((s * 37 + i * 7) % 90);
      losses.push_back(t.step(idx));
    }
    params.push_back(t.parameters(0));
  }
  CHECK(params[0] == params[1]);
}

TEST_CASE("deferred cpu uploads happen at await_upload, reading their source then", "[stream]") {
  // The mode the streamed tests use to put copies as late as a GPU may: it must really defer.
  const DeferredUploads late;
  auto backend = cputest::make_cpu(1);
  void* host = backend->allocate_host(4 * sizeof(int32_t));
  const dp::Tensor dst = [&] {
    void* p = backend->allocate(4 * sizeof(int32_t));
    return dp::Tensor(p, {4}, dp::DType::i32, backend->device());
  }();
  const int32_t zeros[4] = {0, 0, 0, 0};
  backend->upload(dst.data, zeros, sizeof zeros);
  auto* staging = static_cast<int32_t*>(host);
  for (int i = 0; i < 4; ++i) staging[i] = i + 1;
  const uint64_t first = backend->upload_async(dst.data, host, 4 * sizeof(int32_t));
  staging[3] = 40;  // before the wait: the copy reads this
  int32_t seen[4];
  backend->download(seen, dst.data, sizeof seen);
  CHECK(seen[0] == 0);  // not yet copied
  backend->await_upload(first);
  backend->download(seen, dst.data, sizeof seen);
  CHECK(seen[0] == 1);
  CHECK(seen[3] == 40);
  const uint64_t second = backend->upload_async(dst.data, zeros, sizeof zeros);
  CHECK(second == first + 1);
  backend->wait_upload(second);
  backend->download(seen, dst.data, sizeof seen);
  CHECK(seen[0] == 0);
  backend->release(dst.data);
  backend->release_host(host);
}
