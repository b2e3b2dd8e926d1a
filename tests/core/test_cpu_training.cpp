// The cpu backend end to end: the models of the plugins trained by the Trainer with each kernel
// selection and layout. What the op tests cannot see: every batch size an epoch runs (the last
// partial batch, evaluation chunks) is prepared at setup, so an epoch allocates nothing, and
// the kernel selections and layouts train the same model to float tolerance.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"

namespace {

// TrainerOptions has no kernel selection: the backend's automatic choice reads
// DPRUN_CPU_KERNELS, which this sets for one scope.
class KernelsFromEnvironment {
 public:
  explicit KernelsFromEnvironment(dp::CpuKernels k) {
    setenv("DPRUN_CPU_KERNELS", dp::cpu_kernels_name(k), 1);
  }
  ~KernelsFromEnvironment() { unsetenv("DPRUN_CPU_KERNELS"); }
  KernelsFromEnvironment(const KernelsFromEnvironment&) = delete;
  KernelsFromEnvironment& operator=(const KernelsFromEnvironment&) = delete;
};

dp::TrainerOptions options_for(dp::Layout layout) {
  dp::TrainerOptions o;
  o.replicas = 2;
  o.batch_size = 24;
  o.cpu_threads = 2;
  o.epochs = 2;
  o.seed = 3;
  o.lr.base = 0.05f;
  o.layout = layout;
  return o;
}

dp::ModelBuilder builder(const std::string& plugin, const std::string& model,
                         const dp::ModelOptions& options) {
  return [=] { return enginetest::build_model(plugin, model, options); };
}

// Two epochs on 2 replicas (80 examples, batch 24: three full batches and a partial one; 30
// test examples in chunks of 24 and 6): finite, and neither epoch allocated.
void train_two_epochs(const dp::ModelBuilder& build, dp::CpuKernels kernels, dp::Layout layout) {
  const KernelsFromEnvironment scope(kernels);
  dp::Trainer t(options_for(layout), build, enginetest::synthetic_dataset(80, 5),
                enginetest::synthetic_dataset(30, 6));
  CHECK_THAT(t.devices(),
             Catch::Contains(kernels == dp::CpuKernels::onednn ? "oneDNN" : "OpenBLAS"));
  const size_t peak = t.peak_memory_bytes();
  for (int epoch = 1; epoch <= 2; ++epoch) CHECK(t.run_epoch(epoch).finite);
  CHECK(t.peak_memory_bytes() == peak);  // nothing allocated in the step loop
}

struct Step {
  double loss = 0;            // the mean loss of the step's forward pass
  std::vector<float> update;  // the parameters' change: lr * the gradient summed over replicas
};

// One SGD step on the first 24 examples.
Step one_step(const dp::ModelBuilder& build, dp::CpuKernels kernels, dp::Layout layout) {
  const KernelsFromEnvironment scope(kernels);
  dp::Trainer t(options_for(layout), build, enginetest::synthetic_dataset(80, 5),
                enginetest::synthetic_dataset(30, 6));
  const std::vector<float> before = t.parameters(0);
  std::vector<int32_t> batch(24);
  for (int32_t i = 0; i < 24; ++i) batch[static_cast<size_t>(i)] = i;
  Step s;
  s.loss = t.step(batch);
  s.update = t.parameters(0);
  for (size_t i = 0; i < s.update.size(); ++i) s.update[i] -= before[i];
  return s;
}

// The forward loss agrees to 1e-5 (fp32 sums in other orders). The updates agree to 1e-2, or
// 5e-3 of the largest update. Measured (ResNet, oneDNN vs OpenBLAS): the losses agree to 1e-6,
// 99% of the update's elements to 1e-5 of the largest, and the rest, all in the layers before
// the first downsampling block, by up to 1.1e-3: there batch norm divides by the small
// variances of this synthetic data's early features, which magnifies last-bit differences
// (each convolution pass alone agrees with the double loops to ~1e-6 of its largest value, see
// test_cpu_conv.cpp; a wrong pass is off by O(1)). Whole epochs are not compared: the
// differences grow about a hundredfold per epoch on these tiny batches, as they do between
// thread counts of one kernel selection.
void check_same_step(const Step& actual, const Step& expected) {
  CHECK(actual.loss == Approx(expected.loss).epsilon(1e-5));
  float largest = 0;
  for (float v : expected.update) largest = std::max(largest, std::abs(v));
  const dptest::Comparison c =
      dptest::compare(actual.update, expected.update, 1e-2, 5e-3 * largest);
  INFO(c.message);
  CHECK(c.ok);
}

}  // namespace

TEST_CASE("cpu training: ResNet-18 alike with both kernel selections and layouts",
          "[cpu][engine]") {
  // Width 16: channels 16..128, whole blocks, so oneDNN runs its blocked kernels (the stem's
  // one input channel: im2col in NCHW, oneDNN's NHWC kernel in NHWC). The global average pool
  // makes the classifier see the same features in both layouts: all four train one model.
  const auto build = builder("libdprun_resnet18.so", "resnet18", {{"width", int64_t{16}}});
  const Step reference = one_step(build, dp::CpuKernels::blas, dp::Layout::nchw);
  for (const auto kernels : {dp::CpuKernels::onednn, dp::CpuKernels::blas}) {
    for (const auto layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
      INFO("kernels " << dp::cpu_kernels_name(kernels) << ", layout " << dp::layout_name(layout));
      check_same_step(one_step(build, kernels, layout), reference);
      train_two_epochs(build, kernels, layout);
    }
  }
}

TEST_CASE("cpu training: LeNet with both kernel selections", "[cpu][engine]") {
  // NHWC LeNet flattens its features in (H, W, C) order, a different model from NCHW's: each
  // layout is compared across kernel selections only.
  const auto build = builder("libdprun_lenet.so", "lenet", {});
  for (const auto layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
    INFO("layout " << dp::layout_name(layout));
    check_same_step(one_step(build, dp::CpuKernels::onednn, layout),
                    one_step(build, dp::CpuKernels::blas, layout));
    for (const auto kernels : {dp::CpuKernels::onednn, dp::CpuKernels::blas})
      train_two_epochs(build, kernels, layout);
  }
}
