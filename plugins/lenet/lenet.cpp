// The d2l from-scratch LeNet ("Training on Multiple GPUs"):
//   conv 3x3 -> 20, ReLU, avg-pool 2, conv 5x5 -> 50, ReLU, avg-pool 2, flatten (800),
//   linear 128, ReLU, linear 10. Weights N(0, 0.01^2), biases 0. Built for the data's shape: on
//   CIFAR-10's 3x32x32 the first convolution takes 3 channels and the flatten gives 1250.
// To add a model of your own, copy this folder, change the layers and the names, build, run.
#include <memory>
#include <string>
#include <vector>

#include "dp/layers.hpp"
#include "dp/plugin.hpp"

namespace {

std::unique_ptr<dp::Module> build_lenet(const dp::ModelOptions& options,
                                        const dp::ModelInput& input) {
  const auto hidden = std::get<int64_t>(options.at("hidden"));
  const auto pool = std::get<std::string>(options.at("pool"));
  const auto init_std = static_cast<float>(std::get<double>(options.at("init_std")));
  auto make_pool = [&]() -> std::unique_ptr<dp::Module> {
    if (pool == "max") return std::make_unique<dp::MaxPool2d>(2, 2);
    return std::make_unique<dp::AvgPool2d>(2, 2);
  };
  dp::Conv2d::Options conv1{.kernel = 3, .weight_init = dp::Init::normal(init_std)};
  dp::Conv2d::Options conv2{.kernel = 5, .weight_init = dp::Init::normal(init_std)};
  // Spatial size after conv 3 (valid), pool 2, conv 5 (valid), pool 2.
  const int64_t h = ((input.height - 2) / 2 - 4) / 2;
  const int64_t w = ((input.width - 2) / 2 - 4) / 2;
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Conv2d>(input.channels, 20, conv1));
  net->add(std::make_unique<dp::ReLU>());
  net->add(make_pool());
  net->add(std::make_unique<dp::Conv2d>(20, 50, conv2));
  net->add(std::make_unique<dp::ReLU>());
  net->add(make_pool());
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(50 * h * w, hidden, true, dp::Init::normal(init_std)));
  net->add(std::make_unique<dp::ReLU>());
  net->add(std::make_unique<dp::Linear>(hidden, input.classes, true, dp::Init::normal(init_std)));
  return net;
}

std::vector<dp::ModelFactory> models() {
  dp::ModelFactory lenet;
  lenet.name = "lenet";
  lenet.description = "d2l LeNet: conv3x3-20, pool, conv5x5-50, pool, fc 800-128-10 (on 1x28x28)";
  lenet.input = {1, 28, 28, 10};
  lenet.options = {
      {"hidden", int64_t{128}, "width of the hidden fully connected layer"},
      {"pool", std::string("avg"), "pooling: \"avg\" (d2l) or \"max\""},
      {"init_std", 0.01, "standard deviation of the normal weight initialisation"},
  };
  lenet.build = build_lenet;
  return {lenet};
}

}  // namespace

DPRUN_PLUGIN(models)
