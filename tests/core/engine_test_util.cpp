#include "engine_test_util.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "dp/error.hpp"
#include "dp/layers.hpp"
#include "dp/random.hpp"
#include "models/plugin_loader.hpp"
#include "support/check.hpp"

namespace enginetest {

dp::ModelFactory plugin_model(const std::string& file, const std::string& model) {
  static std::mutex mutex;
  static std::map<std::string, std::vector<dprun::LoadedModel>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(file);
  if (it == loaded.end())
    it = loaded.emplace(file, dprun::load_plugin(dptest::plugin_dir() + "/" + file)).first;
  for (const auto& m : it->second)
    if (m.factory.name == model) return m.factory;
  throw dp::Error("plugin " + file + " has no model '" + model + "'");
}

std::unique_ptr<dp::Module> build_model(const std::string& file, const std::string& model,
                                        const dp::ModelOptions& options) {
  const dp::ModelFactory f = plugin_model(file, model);
  return f.build(dp::resolve_model_options(f, options), f.input);
}

dp::Dataset synthetic_dataset(int64_t count, uint64_t seed) {
  dp::Dataset d;
  d.name = "synthetic";
  d.count = count;
  d.images.resize(static_cast<size_t>(count * 784));
  d.labels.resize(static_cast<size_t>(count));
  dp::Rng rng(seed);
  // Class c lights up block (c % 4, c / 4) of a 4x4 grid of 7x7 blocks.
  for (int64_t i = 0; i < count; ++i) {
    const int c = static_cast<int>(rng.below(10));
    d.labels[static_cast<size_t>(i)] = static_cast<uint8_t>(c);
    const int bx = c % 4, by = c / 4;
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) {
        const bool on = x / 7 == bx && y / 7 == by;
        const double v = (on ? 180.0 : 40.0) + 30.0 * rng.normal();
        d.images[static_cast<size_t>(i * 784 + y * 28 + x)] =
            static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return d;
}

dp::Dataset training_data(int64_t count, uint64_t seed, bool* real) {
  const std::string dir = dptest::fashion_mnist_dir();
  if (!dir.empty()) {
    if (real) *real = true;
    static const dp::Dataset train = dp::load_dataset("fashion-mnist", dir).train;  // once
    return train.head(count);
  }
  if (real) *real = false;
  return synthetic_dataset(count, seed);
}

std::unique_ptr<dp::Module> small_bn_net() {
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Conv2d>(1, 8, 3, 2, 1));
  net->add(std::make_unique<dp::BatchNorm2d>(8));
  net->add(std::make_unique<dp::ReLU>());
  net->add(std::make_unique<dp::MaxPool2d>(2, 2));
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(8 * 7 * 7, 10, true, dp::Init::normal(0.1f)));
  return net;
}

double norm_relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / n);
}

}  // namespace enginetest
