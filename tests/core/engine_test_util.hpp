#pragma once
// Helpers for the engine tests (layers, parameters, trainer): loading the model plugins, and
// small datasets. Running one module from host vectors is tests/support/module_check.hpp.
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/data.hpp"
#include "dp/module.hpp"
#include "dp/params.hpp"
#include "dp/plugin.hpp"

namespace enginetest {

/// The models of a plugin in dptest::plugin_dir() (e.g. "libdprun_lenet.so"), by name.
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

/// A small conv net with batch norm for 28x28 single-channel input (quick to train, has
/// buffers).
std::unique_ptr<dp::Module> small_bn_net();

/// |a - b| / |b| over the whole vectors (2-norms): how far one run's parameters are from
/// another's.
double norm_relative_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace enginetest
