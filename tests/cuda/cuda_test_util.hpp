#pragma once
// Shared by the [cuda] tests: one CPU and one CUDA backend (exact fp32: TF32 off), tensors
// mirrored on both, host layout conversions, and locating plugins and data on either machine.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/plugin.hpp"
#include "support/check.hpp"

namespace cudatest {

/// The oracle and the backend under test, created once for the whole run (cuDNN handles are
/// slow to create). The CUDA backend computes in exact fp32 (allow_tf32 = false).
struct Backends {
  std::unique_ptr<dp::Backend> cpu;
  std::unique_ptr<dp::Backend> gpu;
};
/// Owned here so main() can destroy the backends before the CUDA runtime shuts down at exit.
inline std::unique_ptr<Backends>& backends_slot() {
  static std::unique_ptr<Backends> slot;
  return slot;
}
inline Backends& backends() {
  auto& slot = backends_slot();
  if (!slot) {
    slot = std::make_unique<Backends>();
    dp::BackendOptions c;
    c.kind = dp::BackendKind::cpu;
    c.cpu_threads = 0;
    slot->cpu = dp::create_backend(c);
    dp::BackendOptions g;
    g.kind = dp::BackendKind::cuda;
    g.device_index = 0;
    g.allow_tf32 = false;
    slot->gpu = dp::create_backend(g);
  }
  return *slot;
}

/// One logical tensor with a copy on each backend (the GPU copy may use another layout).
struct Twin {
  dptest::DeviceBuffer cpu;
  dptest::DeviceBuffer gpu;
  Twin(dp::Shape s, dp::DType t = dp::DType::f32, dp::Layout gpu_layout = dp::Layout::nchw)
      : cpu(*backends().cpu, s, t, dp::Layout::nchw), gpu(*backends().gpu, s, t, gpu_layout) {}
  const dp::Tensor& c() const { return cpu.tensor(); }
  const dp::Tensor& g() const { return gpu.tensor(); }
};

/// (N,C,H,W) <-> (N,H,W,C) on the host (tests/support/check.hpp).
using dptest::to_nchw;
using dptest::to_nhwc;

/// Values in [lo, hi) rounded to multiples of `step`, so max pooling and argmax see ties.
inline std::vector<float> quantized(int64_t n, uint64_t seed, float lo, float hi, float step) {
  auto v = dptest::random_vector(n, seed, lo, hi);
  for (auto& x : v) x = step * static_cast<float>(static_cast<int>(x / step));
  return v;
}

/// Plugins: $DPRUN_PLUGIN_DIR, else the build tree's (tests/support/check.hpp).
using dptest::plugin_dir;

/// The factory of a model from its plugin (libdprun_<model>.so).
dp::ModelFactory model_factory(const std::string& model);

/// A convolution of the op tests: the plan's batch, the batch run, (C, H, W) in, K filters of
/// R x S, stride and padding (both dimensions), with or without a bias.
struct ConvCase {
  int64_t plan_n, n, c, h, w, k, r, s, stride, pad;
  bool bias;
  /// Its plan geometry in `layout`.
  dp::ConvGeometry geometry(dp::Layout layout = dp::Layout::nchw) const {
    return dptest::conv_geometry(plan_n, c, h, w, k, r, s, stride, stride, pad, pad, layout);
  }
};

/// The op tests' convolution shapes; each test adds its own last case.
inline std::vector<ConvCase> op_conv_cases() {
  return {
      {3, 3, 2, 7, 6, 5, 3, 3, 1, 1, true},      // odd sizes, same padding
      {4, 4, 3, 9, 9, 4, 5, 5, 2, 2, true},      // strided, large kernel
      {2, 2, 20, 12, 12, 50, 5, 5, 1, 0, true},  // LeNet's second convolution (500-term sums)
      {5, 5, 8, 8, 8, 16, 1, 1, 2, 0, false},    // ResNet's 1x1 strided shortcut, no bias
      {8, 3, 1, 28, 28, 6, 3, 3, 1, 1, true},    // batch smaller than the plan's (a last batch)
  };
}

}  // namespace cudatest

/// Compares with the tolerance of an op test: |a-b| <= rel * max(|a|, |b|, 1).
#define CUDA_CHECK_CLOSE(actual, expected, rel)                           \
  do {                                                                    \
    auto cmp_ = ::dptest::compare((actual), (expected), (rel), 0.0, 1.0); \
    INFO(cmp_.message);                                                   \
    CHECK(cmp_.ok);                                                       \
  } while (0)
