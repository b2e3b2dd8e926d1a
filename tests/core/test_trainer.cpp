// The data-parallel trainer on the CPU backend: k replicas compute the step of one replica,
// shards, epochs, evaluation, failures.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>

#include "dp/error.hpp"
#include "dp/layers.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"
#include "support/module_check.hpp"

namespace {

using enginetest::norm_relative_error;

using enginetest::small_bn_net;

dp::ModelBuilder lenet(const dp::ModelOptions& options = {}) {
  return [options] { return enginetest::build_model("libdprun_lenet.so", "lenet", options); };
}

dp::TrainerOptions cpu_options(int replicas, int64_t batch, dp::SgdParams sgd = {}) {
  dp::TrainerOptions o;
  o.replicas = replicas;
  o.batch_size = batch;
  o.lr.base = sgd.lr;
  o.optimizer.momentum = sgd.momentum;
  o.optimizer.weight_decay = sgd.weight_decay;
  o.seed = 17;
  o.cpu_threads = 2;
  o.epochs = 1;
  return o;
}

// A linear classifier: no ReLU that could die, so a huge learning rate really overflows.
std::unique_ptr<dp::Module> linear_net() {
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(784, 10));
  return net;
}

// Trains `steps` steps on consecutive index batches of `batch` and returns replica 0's
// parameters, checking that every replica holds exactly the same ones.
std::vector<float> train_steps(const dp::TrainerOptions& o, const dp::ModelBuilder& builder,
                               const dp::Dataset& data, int steps, std::vector<double>* losses) {
  dp::Trainer t(o, builder, data, data.head(0));
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> idx(static_cast<size_t>(o.batch_size));
    for (size_t i = 0; i < idx.size(); ++i)
      idx[i] = static_cast<int32_t>(
          (static_cast<int64_t>(s) * o.batch_size + static_cast<int64_t>(i)) % data.count);
    const double loss = t.step(idx);
    if (losses) losses->push_back(loss);
  }
  const auto p = t.parameters(0);
  for (int r = 1; r < t.replicas(); ++r) CHECK(t.parameters(r) == p);
  return p;
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

}  // namespace

TEST_CASE("shard_sizes: the first n % k shards get one more, batch >= replicas",
          "[engine][trainer]") {
  CHECK(dp::shard_sizes(10, 3) == std::vector<int64_t>{4, 3, 3});
  CHECK(dp::shard_sizes(9, 3) == std::vector<int64_t>{3, 3, 3});
  CHECK(dp::shard_sizes(65, 2) == std::vector<int64_t>{33, 32});
  CHECK(dp::shard_sizes(7, 1) == std::vector<int64_t>{7});
  CHECK(dp::shard_sizes(4, 4) == std::vector<int64_t>{1, 1, 1, 1});
  CHECK_THROWS_WITH(dp::shard_sizes(2, 3), Catch::Contains("batch size >= gpus"));
  CHECK_THROWS_AS(dp::shard_sizes(5, 0), dp::Error);

  const auto data = enginetest::synthetic_dataset(16, 1);
  CHECK_THROWS_WITH(dp::Trainer(cpu_options(4, 3), lenet(), data, data.head(0)),
                    Catch::Contains("batch size 3") && Catch::Contains("4 replicas"));
  dp::Trainer t(cpu_options(2, 8), lenet(), data, data.head(0));
  CHECK_THROWS_WITH(t.step({0}), Catch::Contains("batch size >= gpus"));
  CHECK_THROWS_AS(t.step({0, 99}), dp::Error);
}

TEST_CASE("Data-parallel identity: LeNet on k = 2, 3 replicas equals one replica",
          "[engine][trainer]") {
  bool real = false;
  const auto data = enginetest::training_data(400, 3, &real);
  INFO((real ? "Fashion-MNIST" : "synthetic data"));
  // A larger weight init than d2l's 0.01 makes the updates big enough that a wrong gradient
  // scale or a missing shard would show. d2l's lr 0.2 keeps these steps stable: at 0.5 the
  // first steps overshoot, ReLUs die, and rounding differences grow chaotically.
  const auto builder = lenet({{"init_std", 0.1}});
  for (const int64_t batch : {int64_t{64}, int64_t{65}}) {
    for (const bool momentum : {false, true}) {
      dp::SgdParams sgd;
      sgd.lr = 0.2f;
      if (momentum) {
        sgd.momentum = 0.9f;
        sgd.weight_decay = 5e-3f;
      }
      DYNAMIC_SECTION("batch " << batch << (momentum ? ", momentum and weight decay" : "")) {
        dp::Trainer init(cpu_options(1, batch, sgd), builder, data, data.head(0));
        const auto p0 = init.parameters(0);
        std::vector<double> l1, lk;
        const auto p1 = train_steps(cpu_options(1, batch, sgd), builder, data, 5, &l1);
        // The steps moved the parameters by much more than the tolerance.
        const auto d1 = minus(p1, p0);
        CHECK_FALSE(dptest::compare(p1, p0, 1e-3, 0.0, 1e-2).ok);
        for (const int k : {2, 3}) {
          lk.clear();
          const auto pk = train_steps(cpu_options(k, batch, sgd), builder, data, 5, &lk);
          INFO(k << " replicas");
          // Only the summation order of the gradients differs from one replica.
          CHECK(norm_relative_error(pk, p1) <= 1e-5);
          auto c = dptest::compare(pk, p1, 1e-4, 0.0, 1e-2);
          INFO("parameters: " << c.message);
          CHECK(c.ok);
          c = dptest::compare(minus(pk, p0), d1, 1e-3, 1e-7, 1e-3);
          INFO("updates: " << c.message);
          CHECK(c.ok);
          for (size_t s = 0; s < l1.size(); ++s) CHECK(lk[s] == Approx(l1[s]).epsilon(1e-5));
        }
      }
    }
  }
}

// [scale]: left out of CI's sanitizer run (.ci/run): the full-width model and its ops run there in
// the checkpoint, memory-plan and parameter tests; these 20 steps take 90 s under ASan.
TEST_CASE("ResNet-18 on the CPU: output shape and a decreasing loss", "[engine][trainer][scale]") {
  SECTION("the full-width model gives (N, 10)") {
    dptest::ModuleRunner run(enginetest::build_model("libdprun_resnet18.so", "resnet18"),
                             {2, 1, 28, 28});
    CHECK(run.output() == dp::Shape{2, 10});
    const auto y = run.forward(dptest::random_vector(2 * 784, 1, 0.0f, 1.0f), false);
    CHECK(y.size() == 20);
    for (float v : y) CHECK(std::isfinite(v));
  }
  SECTION("20 steps of batch 32 on 512 images, 2 replicas") {
    // The real model (width 64, 11.2 M parameters): about 12 s on two cores.
    bool real = false;
    const auto data = enginetest::training_data(512, 5, &real);
    INFO((real ? "Fashion-MNIST" : "synthetic data"));
    dp::SgdParams sgd;
    sgd.lr = 0.05f;
    std::vector<double> losses;
    const dp::ModelBuilder builder = [] {
      return enginetest::build_model("libdprun_resnet18.so", "resnet18");
    };
    train_steps(cpu_options(2, 32, sgd), builder, data, 20, &losses);
    double first = 0, last = 0;
    for (int i = 0; i < 5; ++i) {
      first += losses[static_cast<size_t>(i)] / 5;
      last += losses[static_cast<size_t>(15 + i)] / 5;
    }
    INFO("mean loss of steps 1-5: " << first << ", of steps 16-20: " << last);
    for (double l : losses) CHECK(std::isfinite(l));
    // Steps 1-16 each see new examples: a noisy curve, still clearly going down (measured on
    // Fashion-MNIST: about 2.41 -> 1.83).
    CHECK(last < first - 0.2);
  }
}

TEST_CASE("Epochs: shuffled, reproducible, BN buffers averaged, reports filled",
          "[engine][trainer]") {
  const auto train = enginetest::synthetic_dataset(300, 7);
  const auto test = enginetest::synthetic_dataset(101, 8);
  auto o = cpu_options(2, 64);
  o.lr.base = 0.1f;
  o.optimizer.momentum = 0.9f;
  o.epochs = 3;
  o.eval_batch_size = 50;
  dp::Trainer a(o, small_bn_net, train, test), b(o, small_bn_net, train, test);
  std::vector<dp::EpochReport> reports;
  a.fit([&](const dp::EpochReport& r) {
    reports.push_back(r);
    return true;
  });
  REQUIRE(reports.size() == 3);
  for (int e = 0; e < 3; ++e) {
    const auto& r = reports[static_cast<size_t>(e)];
    CHECK(r.epoch == e + 1);
    CHECK(r.finite);
    CHECK(r.train_examples == 300);
    CHECK(r.test_examples == 101);
    CHECK(r.seconds > 0);
    CHECK(r.examples_per_second > 0);
    CHECK((r.train_acc >= 0 && r.train_acc <= 1 && r.test_acc >= 0 && r.test_acc <= 1));
  }
  CHECK(reports[2].train_loss < reports[0].train_loss);
  CHECK(reports[2].test_acc > 0.5);  // synthetic classes are easy; chance is 0.1
  // One model after evaluation: the replicas' BN running statistics were averaged.
  CHECK(a.buffers(0) == a.buffers(1));
  CHECK(a.parameters(0) == a.parameters(1));
  // The same seed gives the same run.
  for (int e = 1; e <= 3; ++e) {
    const auto r = b.run_epoch(e);
    CHECK(r.train_loss == reports[static_cast<size_t>(e - 1)].train_loss);
    CHECK(r.test_acc == reports[static_cast<size_t>(e - 1)].test_acc);
  }
  CHECK(a.parameters(0) == b.parameters(0));
  CHECK(a.evaluate() == reports[2].test_acc);
  CHECK(a.backend_name() == "cpu");
  CHECK(a.communicator_kind() == "inprocess");
  CHECK_THAT(a.devices(), Catch::EndsWith(" x2"));
  CHECK(a.peak_memory_bytes() > 0);
  CHECK(a.registry(1).entries().size() == a.registry(0).entries().size());
}

TEST_CASE("Evaluating again does not change the averaged BN buffers", "[engine][trainer]") {
  // With 3 replicas, (a + a + a) * (1/3) is not always a in floats: averaging buffers that
  // already agree must be skipped, or every evaluate() drifts the running statistics.
  const auto data = enginetest::synthetic_dataset(96, 15);
  dp::Trainer t(cpu_options(3, 48), small_bn_net, data, data.head(30));
  const double acc = t.run_epoch(1).test_acc;
  const auto averaged = t.buffers(0);
  CHECK(t.buffers(2) == averaged);
  for (int i = 0; i < 3; ++i) CHECK(t.evaluate() == acc);
  CHECK(t.buffers(0) == averaged);
  CHECK(t.buffers(1) == averaged);
}

TEST_CASE("fit stops when the callback says so, or after a non-finite loss", "[engine][trainer]") {
  const auto data = enginetest::synthetic_dataset(200, 9);
  auto o = cpu_options(3, 50);
  o.epochs = 4;
  int calls = 0;
  {
    dp::Trainer t(o, small_bn_net, data, data.head(20));
    t.fit([&](const dp::EpochReport&) { return ++calls < 2; });
  }
  CHECK(calls == 2);
  o.lr.base = 1e38f;
  calls = 0;
  bool finite = true;
  dp::Trainer t(o, linear_net, data, data.head(20));
  t.fit([&](const dp::EpochReport& r) {
    ++calls;
    finite = r.finite;
    return true;
  });
  CHECK(calls == 1);
  CHECK_FALSE(finite);
}

TEST_CASE("The last partial batch may be smaller than the replica count", "[engine][trainer]") {
  // 131 examples, batch 64 on 3 replicas: the last batch has 3 examples... and with 129 only 1.
  for (const int64_t count : {int64_t{131}, int64_t{129}}) {
    const auto data = enginetest::synthetic_dataset(count, 10);
    auto o = cpu_options(3, 64);
    o.average_bn_buffers = false;
    dp::Trainer t(o, lenet(), data, data.head(0));
    const auto r = t.run_epoch(1);
    CHECK(r.finite);
    CHECK(t.parameters(0) == t.parameters(2));
  }
}

TEST_CASE(
    "A last batch, or a whole training set, smaller than the replica count: the step of "
    "one replica",
    "[engine][trainer]") {
  // 129 examples in batches of 64 on 3 replicas: the last step has one example (shards 1, 0, 0).
  // 2 examples in one batch of 3: the training set itself is smaller than the replica count.
  struct Case {
    int64_t count, batch;
  };
  for (const Case c : {Case{129, 64}, Case{2, 3}}) {
    DYNAMIC_SECTION(c.count << " examples, batch " << c.batch) {
      const auto data = enginetest::synthetic_dataset(c.count, 12);
      dp::SgdParams sgd;
      sgd.lr = 0.5f;
      sgd.momentum = 0.9f;
      sgd.weight_decay = 1e-3f;
      auto o3 = cpu_options(3, c.batch, sgd);
      dp::Trainer one(cpu_options(1, c.batch, sgd), linear_net, data, data.head(0));
      dp::Trainer three(o3, linear_net, data, data.head(0));
      const auto p0 = one.parameters(0);
      REQUIRE(three.parameters(0) == p0);
      const size_t peak = three.peak_memory_bytes();
      const auto r1 = one.run_epoch(1);
      const auto r3 = three.run_epoch(1);
      CHECK(three.peak_memory_bytes() == peak);  // nothing allocated in the step loop
      CHECK(r3.finite);
      CHECK(r3.train_loss == Approx(r1.train_loss).epsilon(1e-5));
      CHECK(r3.train_acc == r1.train_acc);
      const auto p1 = one.parameters(0), p3 = three.parameters(0);
      for (int r = 1; r < 3; ++r) CHECK(three.parameters(r) == p3);
      CHECK_FALSE(dptest::compare(p1, p0, 1e-3, 0.0, 1e-2).ok);  // the epoch moved them
      const auto c3 = dptest::compare(minus(p3, p0), minus(p1, p0), 1e-3, 1e-7, 1e-3);
      INFO("updates: " << c3.message);
      CHECK(c3.ok);
    }
  }
}

TEST_CASE("Synchronised batch norm: k replicas compute the step of one replica",
          "[engine][trainer]") {
  // With bn = "sync" the statistics are those of the whole global batch, so a net with batch
  // norm trained on k replicas equals one replica (with ordinary batch norm) on the whole batch,
  // up to summation order. 131 examples in batches of 64: the last step has 3 examples, so with
  // k = 4 one replica's shard is empty and it must still take part in the statistics. With
  // per-replica statistics the same runs differ visibly (checked last). Both layouts: the CPU
  // backend's NHWC batch norm has its own loops.
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  bool real = false;
  const auto data = enginetest::training_data(131, 4, &real);
  INFO((real ? "Fashion-MNIST" : "synthetic data"));
  dp::SgdParams sgd;
  sgd.lr = 0.1f;
  sgd.momentum = 0.9f;
  auto one = cpu_options(1, 64, sgd);
  one.average_bn_buffers = false;
  one.layout = layout;
  dp::Trainer reference(one, small_bn_net, data, data.head(0));
  const auto p0 = reference.parameters(0);
  const auto r1 = reference.run_epoch(1);
  const auto p1 = reference.parameters(0), b1 = reference.buffers(0);
  for (const int k : {2, 4}) {
    INFO(k << " replicas");
    auto o = cpu_options(k, 64, sgd);
    o.sync_bn = true;
    o.layout = layout;
    o.average_bn_buffers = false;  // synchronised: every replica's running stats already agree
    dp::Trainer t(o, small_bn_net, data, data.head(0));
    const auto r = t.run_epoch(1);
    const auto p = t.parameters(0);
    for (int q = 1; q < k; ++q) {
      CHECK(t.parameters(q) == p);
      CHECK(t.buffers(q) == t.buffers(0));
    }
    CHECK(r.train_loss == Approx(r1.train_loss).epsilon(1e-5));
    CHECK(norm_relative_error(p, p1) <= 1e-5);
    // Updates within 1e-3 of the largest: the conv bias before batch norm has a gradient that
    // is zero in exact arithmetic (the mean subtraction cancels it), so its updates are rounding
    // noise that no relative tolerance per element can hold.
    const auto u1 = minus(p1, p0);
    double largest = 0;
    for (float v : u1) largest = std::max(largest, std::fabs(static_cast<double>(v)));
    const auto c = dptest::compare(minus(p, p0), u1, 0.0, 1e-3 * largest);
    INFO("updates: " << c.message);
    CHECK(c.ok);
    CHECK(norm_relative_error(t.buffers(0), b1) <= 1e-5);
  }
  auto per_replica = cpu_options(4, 64, sgd);
  per_replica.average_bn_buffers = false;
  per_replica.layout = layout;
  dp::Trainer t(per_replica, small_bn_net, data, data.head(0));
  t.run_epoch(1);
  CHECK(norm_relative_error(t.parameters(0), p1) > 1e-4);
}

TEST_CASE("Evaluation counts every test example once, whatever the replicas and eval batch",
          "[engine][trainer]") {
  // Zero weights and biases: every logit is 0, the prediction is class 0 (the first maximum),
  // so the accuracy is exactly the fraction of label-0 examples. A shard evaluated twice or
  // skipped would change it.
  const dp::ModelBuilder constant = [] {
    auto net = std::make_unique<dp::Sequential>();
    net->add(std::make_unique<dp::Flatten>());
    net->add(std::make_unique<dp::Linear>(784, 10, true, dp::Init::zeros(), dp::Init::zeros()));
    return net;
  };
  const auto train = enginetest::synthetic_dataset(16, 13);
  for (const int64_t count : {int64_t{101}, int64_t{2}}) {  // 2: fewer examples than replicas
    auto test = enginetest::synthetic_dataset(count, 14);
    int64_t zeros = 0;
    for (int64_t i = 0; i < count; ++i) {
      auto& label = test.labels[static_cast<size_t>(i)];
      if (i % 3 == 0) label = 0;
      if (label == 0) ++zeros;
    }
    const double expected = static_cast<double>(zeros) / static_cast<double>(count);
    for (const int k : {1, 2, 3}) {
      for (const int64_t eval_batch : {int64_t{1}, int64_t{7}, int64_t{50}, int64_t{256}}) {
        INFO(count << " test examples, " << k << " replicas, eval batch " << eval_batch);
        auto o = cpu_options(k, 16);
        o.eval_batch_size = eval_batch;
        dp::Trainer t(o, constant, train, test);
        CHECK(t.evaluate() == expected);
      }
    }
  }
}

namespace {
// Identity module that throws from forward on one chosen replica after a few calls.
class FailingModule : public dp::Module {
 public:
  FailingModule(bool fail, int after) : fail_(fail), after_(after) {}
  const char* type() const override { return "FailingModule"; }

 protected:
  dp::Shape do_setup(dp::SetupContext&, const dp::Shape& input) override { return input; }
  dp::Tensor do_forward(dp::RunContext&, const dp::Tensor& x) override {
    if (fail_ && ++calls_ > after_) throw dp::Error("forced failure in replica 1");
    return x;
  }
  dp::Tensor do_backward(dp::RunContext&, const dp::Tensor& dy, bool) override { return dy; }

 private:
  bool fail_;
  int after_;
  int calls_ = 0;
};
}  // namespace

TEST_CASE("A failing replica makes step()/fit() throw its error without hanging",
          "[engine][trainer]") {
  const auto data = enginetest::synthetic_dataset(256, 11);
  for (const int k : {2, 3}) {
    DYNAMIC_SECTION(k << " replicas") {
      int built = 0;
      const dp::ModelBuilder builder = [&] {
        auto net = std::make_unique<dp::Sequential>();
        net->add(std::make_unique<dp::Flatten>());
        net->add(std::make_unique<FailingModule>(built++ == 1, 2));
        net->add(std::make_unique<dp::Linear>(784, 10));
        return net;
      };
      auto o = cpu_options(k, 32);
      o.epochs = 3;
      dp::Trainer t(o, builder, data, data.head(32));
      std::vector<int32_t> idx(32);
      for (int32_t i = 0; i < 32; ++i) idx[static_cast<size_t>(i)] = i;
      CHECK_NOTHROW(t.step(idx));
      CHECK_NOTHROW(t.step(idx));
      CHECK_THROWS_WITH(t.step(idx), Catch::Contains("forced failure in replica 1"));
      CHECK_THROWS_WITH(t.step(idx), Catch::Contains("no longer be used"));

      built = 0;
      dp::Trainer f(o, builder, data, data.head(32));
      CHECK_THROWS_WITH(f.fit(nullptr), Catch::Contains("forced failure in replica 1"));
    }
  }
}
