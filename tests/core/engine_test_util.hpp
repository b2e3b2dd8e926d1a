#pragma once
// Helpers for the engine tests (layers, parameters, trainer): running one module on the CPU
// backend from host vectors, loading the model plugins, and small datasets.
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/data.hpp"
#include "dp/module.hpp"
#include "dp/params.hpp"
#include "dp/plugin.hpp"

namespace enginetest {

/// One module on its own single-threaded CPU backend: declared, allocated, initialised from
/// `seed`, set up for `input`. Host vectors in, host vectors out.
class ModuleRunner {
 public:
  ModuleRunner(std::unique_ptr<dp::Module> module, dp::Shape input, uint64_t seed = 1);
  ~ModuleRunner();

  dp::Module& module() { return *module_; }
  dp::ParamRegistry& registry() { return registry_; }
  const dp::Shape& input() const { return input_; }
  const dp::Shape& output() const { return module_->output_shape(); }

  std::vector<float> params() const { return registry_.download_params(); }
  void set_params(const std::vector<float>& flat) { registry_.upload_params(flat); }
  std::vector<float> grads() const;

  /// Forward on x (any batch up to the setup batch); returns y.
  std::vector<float> forward(const std::vector<float>& x, bool training = true);
  /// Backward of the last forward with dy; returns dx (parameter gradients via grads()).
  std::vector<float> backward(const std::vector<float>& dy);

 private:
  std::unique_ptr<dp::Backend> backend_;
  std::unique_ptr<dp::Arena> arena_;
  dp::ParamRegistry registry_;
  std::unique_ptr<dp::Module> module_;
  dp::Shape input_;
  dp::Tensor x_, dy_;
  int64_t batch_ = 0;
};

/// The models of a plugin in DPRUN_TEST_PLUGIN_DIR (e.g. "libdprun_lenet.so"), by name.
dp::ModelFactory plugin_model(const std::string& file, const std::string& model);
/// A builder of `model` from its plugin with the given options.
std::unique_ptr<dp::Module> build_model(const std::string& file, const std::string& model,
                                        const dp::ModelOptions& options = {});

/// `count` 28x28 one-channel examples of 10 classes, each class a distinct blocky pattern plus
/// noise: easily separable, for tests that need learning without the real data.
dp::Dataset synthetic_dataset(int64_t count, uint64_t seed);
/// The first `count` Fashion-MNIST training examples when the data is installed, else
/// synthetic_dataset(count, seed). `real` tells which.
dp::Dataset training_data(int64_t count, uint64_t seed, bool* real = nullptr);

}  // namespace enginetest
