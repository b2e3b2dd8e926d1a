#pragma once
// Checking a module (one layer or a composition) the way every layer test does, on every
// backend present: ModuleRunner runs it from host vectors; check_module_gradients compares dx and
// the gradient of each named parameter tensor with central differences (Caffe's GradientChecker
// habits, through check_gradient); check_against_cpu compares another backend's forward and
// backward with the CPU backend's, named tensor by named tensor.
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dp/backend.hpp"
#include "dp/module.hpp"
#include "dp/params.hpp"
#include "support/check.hpp"

namespace dptest {

/// The backends present: the CPU always; CUDA where this build has it and a GPU is visible.
/// With DPRUN_REQUIRE_CUDA set (the GPU machine), a CUDA backend that cannot run FAILs the test.
std::vector<dp::BackendKind> available_backends();

/// Runs the block once per backend present, as a Catch2 section named after the backend:
///   DP_FOR_EACH_BACKEND(kind) { ModuleRunner run(make(), shape, 1, kind); ... }
#define DP_FOR_EACH_BACKEND(kind)                                   \
  for (const dp::BackendKind kind : ::dptest::available_backends()) \
  DYNAMIC_SECTION("backend " << dp::backend_kind_name(kind))

/// One module on its own backend (one CPU thread; CUDA in exact fp32, TF32 off): declared,
/// allocated, initialised from `seed`, set up for `input`. Host vectors in, host vectors out.
class ModuleRunner {
 public:
  ModuleRunner(std::unique_ptr<dp::Module> module, dp::Shape input, uint64_t seed = 1,
               dp::BackendKind kind = dp::BackendKind::cpu,
               dp::Layout layout = dp::Layout::nchw);
  ~ModuleRunner();
  ModuleRunner(const ModuleRunner&) = delete;
  ModuleRunner& operator=(const ModuleRunner&) = delete;

  dp::BackendKind kind() const { return kind_; }
  /// The memory order of the module's rank-4 activations (host vectors in and out use it too).
  dp::Layout layout() const { return layout_; }
  dp::Module& module() { return *module_; }
  dp::ParamRegistry& registry() { return registry_; }
  const dp::Shape& input() const { return input_; }
  const dp::Shape& output() const { return module_->output_shape(); }

  /// The parameters and their gradients as flat host vectors, each tensor in the order its
  /// shape reads (ParamRegistry::params_in_reading_order), whichever order the registry keeps:
  /// runners of both layouts exchange them as they are.
  std::vector<float> params() const {
    return registry_.params_in_reading_order(registry_.download_params());
  }
  void set_params(const std::vector<float>& flat) {
    registry_.upload_params(registry_.params_in_memory_order(flat));
  }
  std::vector<float> grads() const;

  /// Forward on x (any batch up to the setup batch); returns y.
  std::vector<float> forward(const std::vector<float>& x, bool training = true);
  /// Backward of the last forward with dy; returns dx (parameter gradients via grads()).
  std::vector<float> backward(const std::vector<float>& dy);

 private:
  dp::BackendKind kind_;
  dp::Layout layout_;
  std::unique_ptr<dp::Backend> backend_;
  std::unique_ptr<dp::Arena> arena_;
  dp::ParamRegistry registry_;
  std::unique_ptr<dp::Module> module_;
  dp::Shape input_;
  dp::Tensor x_, dy_;
};

/// Sets every trainable value of run's model to scale * U(-1, 1), drawn from `seed` in registry
/// order (buffers keep theirs).
void randomize_trainable(ModuleRunner& run, uint64_t seed, float scale = 1.0f);

/// The values of one named entry of the registry inside a flat host copy (parameters or
/// buffers, whichever `flat` is).
std::vector<float> entry_values(const dp::ParamRegistry& registry, const std::vector<float>& flat,
                                const std::string& name);

/// How a gradient check treats non-smooth points.
struct Tolerance {
  double step = 1e-2, rel = 2e-2, abs = 2e-3;
  // Networks with ReLU/max-pool after other layers have kinks we cannot place away from the
  // finite-difference window by choosing inputs. A coordinate is skipped when the central
  // differences with step h and h/2 disagree by more than `abs` (the function is not smooth
  // there); that depends only on the function, never on the analytic gradient under test. At
  // most 3% of the coordinates (of dx, and of all parameters), or 4, may be skipped.
  bool detect_kinks = false;
};

/// With L = sum(y * r) for a fixed random r, CHECKs dx and the gradient of every named
/// parameter tensor (each on its own, its name in the message) against central differences,
/// and that the padding between tensors in the flat gradient buffer stays zero.
void check_module_gradients(ModuleRunner& run, const std::vector<float>& x,
                            const Tolerance& tol = {}, bool training = true);

/// CHECKs `run` against the same module on the CPU backend in NCHW (built by `make`, given run's
/// parameters and buffers): the output, dx, each named parameter gradient and each buffer, with
/// relative tolerance rel_tol scaled by max(|a|, |b|, 1). `x` is in run's layout; the oracle gets
/// it, and dy, converted to NCHW, and its output and dx are converted back. A CPU NCHW `run` is
/// its own oracle: nothing to do (a CPU NHWC run is checked against CPU NCHW).
void check_against_cpu(ModuleRunner& run, const std::function<std::unique_ptr<dp::Module>()>& make,
                       const std::vector<float>& x, double rel_tol, bool training = true);

}  // namespace dptest
