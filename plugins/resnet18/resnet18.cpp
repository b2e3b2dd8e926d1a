// The d2l small-image ResNet-18 ("Concise Implementation for Multiple GPUs"):
//   conv 3x3 64 stride 1 pad 1, BN, ReLU (no max-pool), four stages of two residual blocks
//   (64, 128, 256, 512; stages 2-4 start with a strided block with a 1x1 shortcut), global
//   average pool, flatten, linear 10. Names follow the d2l PyTorch module:
//   0.weight, 1.weight, resnet_block2.0.conv1.weight, fc.1.weight, ...
#include <memory>
#include <string>
#include <vector>

#include "dp/layers.hpp"
#include "dp/plugin.hpp"

namespace {

std::unique_ptr<dp::Module> resnet_block(int64_t in_channels, int64_t out_channels,
                                         int num_residuals, bool first_block) {
  auto blk = std::make_unique<dp::Sequential>();
  for (int i = 0; i < num_residuals; ++i) {
    if (i == 0 && !first_block) {
      blk->add(std::make_unique<dp::Residual>(in_channels, out_channels, true, 2));
    } else {
      blk->add(std::make_unique<dp::Residual>(out_channels, out_channels));
    }
  }
  return blk;
}

std::unique_ptr<dp::Module> build_resnet18(const dp::ModelOptions& options,
                                           const dp::ModelInput& input) {
  const auto w = std::get<int64_t>(options.at("width"));
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Conv2d>(input.channels, w, 3, 1, 1));
  // The stem's ReLU is fused into its batch norm (the same values, one pass fewer). Module "2",
  // d2l's nn.ReLU, holds no parameters, so the names of everything else are unchanged.
  net->add(std::make_unique<dp::BatchNorm2d>(w, 1e-5f, 0.1f, dp::BatchNorm2d::Fused{false, true}));
  net->add("resnet_block1", resnet_block(w, w, 2, true));
  net->add("resnet_block2", resnet_block(w, 2 * w, 2, false));
  net->add("resnet_block3", resnet_block(2 * w, 4 * w, 2, false));
  net->add("resnet_block4", resnet_block(4 * w, 8 * w, 2, false));
  net->add("global_avg_pool", std::make_unique<dp::GlobalAvgPool>());
  auto fc = std::make_unique<dp::Sequential>();
  fc->add(std::make_unique<dp::Flatten>());
  fc->add(std::make_unique<dp::Linear>(8 * w, input.classes));
  net->add("fc", std::move(fc));
  return net;
}

std::vector<dp::ModelFactory> models() {
  dp::ModelFactory resnet;
  resnet.name = "resnet18";
  resnet.description = "d2l small-image ResNet-18: conv3x3-64, 4 stages x 2 residual blocks, fc";
  resnet.input = {1, 28, 28, 10};
  resnet.options = {
      {"width", int64_t{64}, "channels of the first stage (doubled at each later stage)"},
  };
  resnet.build = build_resnet18;
  return {resnet};
}

}  // namespace

DPRUN_PLUGIN(models)
