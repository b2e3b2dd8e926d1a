// Whole training steps through dp::Trainer: CUDA vs CPU for LeNet and ResNet-18, NHWC vs NCHW,
// and the data-parallel identity on CUDA (k replicas sharing one GPU = one replica).
//
// Tolerances. After one step p' = p - lr * g, so comparing parameters alone mostly compares the
// (identical) initial values. Each test therefore also compares the updates (p' - p) of the two
// runs, relative to the largest update: |du_a - du_b| <= tol * max|du|. With exact fp32 on both
// sides the gradients differ only by summation order (~1e-6 relative); 1e-3 of the largest
// update leaves room for the longer reductions of a whole network (ResNet-18: batch norm over
// 32*28*28 values feeding 20 layers of backward) while any wrong op gives O(1) differences.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "dp/data.hpp"
#include "dp/trainer.hpp"
#include "support/check.hpp"

namespace {

struct Data {
  dp::Dataset train, test;
  bool ok = false;
};

/// The first 512 training and 256 test images of Fashion-MNIST ($DPRUN_DATA honoured), loaded
/// once.
const Data& data() {
  static Data d = [] {
    Data out;
    const std::string dir = dptest::fashion_mnist_dir();
    if (dir.empty()) return out;
    auto pair = dp::load_dataset("fashion-mnist", dir);
    out.train = pair.train.head(512);
    out.test = pair.test.head(256);
    out.ok = true;
    return out;
  }();
  return d;
}

dp::ModelBuilder builder(const std::string& model, const dp::ModelOptions& given = {}) {
  const dp::ModelFactory factory = cudatest::model_factory(model);
  const dp::ModelOptions options = dp::resolve_model_options(factory, given);
  return [factory, options]() { return factory.build(options, factory.input); };
}

std::vector<int32_t> batch_indices(int64_t n, int64_t offset = 0) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  // A fixed, scrambled selection (not 0..n-1) so shards see mixed classes.
  for (int64_t i = 0; i < n; ++i)
    idx[static_cast<size_t>(i)] = static_cast<int32_t>((offset + i * 37) % 512);
  return idx;
}

struct StepResult {
  std::vector<float> before, after;
  double loss = 0;
  std::vector<float> update() const {
    std::vector<float> u(after.size());
    for (size_t i = 0; i < u.size(); ++i) u[i] = after[i] - before[i];
    return u;
  }
};

StepResult run_steps(dp::TrainerOptions options, const dp::ModelBuilder& build,
                     const std::vector<std::vector<int32_t>>& batches) {
  dp::Trainer trainer(options, build, data().train, data().test);
  StepResult r;
  r.before = trainer.parameters(0);
  for (const auto& b : batches) r.loss = trainer.step(b);
  r.after = trainer.parameters(0);
  // Every replica holds the same parameters after an update.
  for (int k = 1; k < trainer.replicas(); ++k) CHECK(trainer.parameters(k) == r.after);
  return r;
}

/// Parameters within `param_rel` (floor 1) and updates within `update_rel` of the largest update.
void check_same_step(const StepResult& actual, const StepResult& expected, double param_rel,
                     double update_rel) {
  REQUIRE(actual.after.size() == expected.after.size());
  CHECK(actual.before == expected.before);  // same initialisation from the same seed
  {
    auto cmp = dptest::compare(actual.after, expected.after, param_rel, 0.0, 1.0);
    INFO("parameters: " << cmp.message);
    CHECK(cmp.ok);
  }
  const auto ua = actual.update(), ue = expected.update();
  double largest = 0;
  for (float v : ue) largest = std::max(largest, static_cast<double>(std::fabs(v)));
  REQUIRE(largest > 0);
  auto cmp = dptest::compare(ua, ue, 0.0, update_rel * largest);
  INFO("updates (largest " << largest << "): " << cmp.message);
  CHECK(cmp.ok);
  CHECK(std::fabs(actual.loss - expected.loss) <= 1e-4 * std::max(1.0, std::fabs(expected.loss)));
}

dp::TrainerOptions options_for(dp::BackendKind kind, int64_t batch, float lr) {
  dp::TrainerOptions o;
  o.backend = kind;
  o.batch_size = batch;
  o.eval_batch_size = batch;
  o.epochs = 1;
  o.lr.base = lr;
  o.seed = 7;
  o.allow_tf32 = false;
  return o;
}

}  // namespace

TEST_CASE("cuda LeNet training step equals the cpu backend's", "[cuda][train]") {
  if (!data().ok) {
    WARN("Fashion-MNIST not found (set DPRUN_DATA): skipping");
    return;
  }
  const auto build = builder("lenet");
  const auto batches = std::vector<std::vector<int32_t>>{batch_indices(64), batch_indices(64, 5)};
  // lr 0.9 (the d2l LeNet uses large rates): visible updates after two steps.
  const auto cpu = run_steps(options_for(dp::BackendKind::cpu, 64, 0.9f), build, batches);
  const auto gpu = run_steps(options_for(dp::BackendKind::cuda, 64, 0.9f), build, batches);
  check_same_step(gpu, cpu, 1e-5, 1e-3);
}

TEST_CASE("cuda LeNet with max pooling and momentum equals the cpu backend", "[cuda][train]") {
  if (!data().ok) {
    WARN("Fashion-MNIST not found (set DPRUN_DATA): skipping");
    return;
  }
  const auto build = builder("lenet", {{"pool", std::string("max")}, {"init_std", 0.1}});
  auto o = options_for(dp::BackendKind::cpu, 48, 0.1f);
  o.optimizer.momentum = 0.9f;
  o.optimizer.weight_decay = 5e-4f;
  const auto batches = std::vector<std::vector<int32_t>>{batch_indices(48), batch_indices(48, 9)};
  const auto cpu = run_steps(o, build, batches);
  o.backend = dp::BackendKind::cuda;
  const auto gpu = run_steps(o, build, batches);
  check_same_step(gpu, cpu, 1e-5, 1e-3);
}

TEST_CASE("cuda ResNet-18 training step equals the cpu backend's", "[cuda][train]") {
  if (!data().ok) {
    WARN("Fashion-MNIST not found (set DPRUN_DATA): skipping");
    return;
  }
  // Full width, batch 16: small enough for the CPU reference to take a few seconds.
  const auto build = builder("resnet18");
  const auto batches = std::vector<std::vector<int32_t>>{batch_indices(16)};
  const auto cpu = run_steps(options_for(dp::BackendKind::cpu, 16, 0.1f), build, batches);
  const auto gpu = run_steps(options_for(dp::BackendKind::cuda, 16, 0.1f), build, batches);
  check_same_step(gpu, cpu, 1e-5, 1e-3);
}

TEST_CASE("cuda ResNet-18 step in NHWC equals NCHW", "[cuda][train]") {
  if (!data().ok) {
    WARN("Fashion-MNIST not found (set DPRUN_DATA): skipping");
    return;
  }
  // ResNet-18 flattens (N, C, 1, 1), so both layouts compute the same function of the same
  // parameters. (LeNet flattens (N, 50, 4, 4): its NHWC variant orders the features differently,
  // so it is a different function of the same parameters and is not compared here.)
  const auto build = builder("resnet18");
  const auto batches = std::vector<std::vector<int32_t>>{batch_indices(32), batch_indices(32, 3)};
  auto o = options_for(dp::BackendKind::cuda, 32, 0.1f);
  const auto nchw = run_steps(o, build, batches);
  o.layout = dp::Layout::nhwc;
  const auto nhwc = run_steps(o, build, batches);
  check_same_step(nhwc, nchw, 1e-5, 1e-3);
}

TEST_CASE("cuda data-parallel identity: k replicas sharing one GPU equal one replica",
          "[cuda][train]") {
  if (!data().ok) {
    WARN("Fashion-MNIST not found (set DPRUN_DATA): skipping");
    return;
  }
  // LeNet has no batch norm, so k replicas compute exactly the step of one replica on the whole
  // batch, up to the summation order of the gradient (per shard, then across ranks).
  const auto build = builder("lenet");
  const int64_t batch = 61;  // divisible by neither 2 nor 3: shards differ by one example
  const auto batches =
      std::vector<std::vector<int32_t>>{batch_indices(batch), batch_indices(batch, 11)};
  auto o = options_for(dp::BackendKind::cuda, batch, 0.9f);
  const auto one = run_steps(o, build, batches);
  // One GPU: 2 and 3 replicas share it (the same-device path). Several GPUs: one replica per
  // GPU (NCCL); a mix of shared and distinct GPUs is refused by design.
  const int gpus = dp::cuda_device_count();
  const std::vector<int> ks = gpus == 1 ? std::vector<int>{2, 3} : std::vector<int>{gpus};
  for (int k : ks) {
    INFO(k << " replicas on " << gpus << " GPU(s)");
    o.replicas = k;
    o.oversubscribe = true;
    dp::Trainer trainer(o, build, data().train, data().test);
    CHECK(trainer.communicator_kind() == (gpus == 1 ? "cuda-same-device" : "nccl"));
    const auto before = trainer.parameters(0);
    double loss = 0;
    for (const auto& b : batches) loss = trainer.step(b);
    StepResult many{before, trainer.parameters(0), loss};
    for (int r = 1; r < k; ++r) CHECK(trainer.parameters(r) == many.after);
    // Parameters within 1e-5 (floor 1) and updates within 1e-4 of the largest update. (No
    // parameter check with a smaller floor: a weight near zero would then be held to ~1e-8
    // absolute, below the rounding noise of summing the gradient in another order at lr 0.9.)
    check_same_step(many, one, 1e-5, 1e-4);
  }
}
