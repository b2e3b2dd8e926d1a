// A user's own model, as the README's "Adding a model" builds one outside dprun's tree: a
// two-layer perceptron.
#include <memory>
#include <vector>

#include "dp/layers.hpp"
#include "dp/plugin.hpp"

namespace {

std::unique_ptr<dp::Module> build(const dp::ModelOptions& options, const dp::ModelInput& input) {
  const auto hidden = std::get<int64_t>(options.at("hidden"));
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(input.channels * input.height * input.width, hidden, true,
                                        dp::Init::normal(0.05f)));
  net->add(std::make_unique<dp::ReLU>());
  net->add(std::make_unique<dp::Linear>(hidden, input.classes, true, dp::Init::normal(0.05f)));
  return net;
}

std::vector<dp::ModelFactory> models() {
  dp::ModelFactory f;
  f.name = "mynet";
  f.description = "a two-layer perceptron built outside dprun's tree";
  f.input = {1, 28, 28, 10};
  f.options = {{"hidden", int64_t{32}, "hidden units"}};
  f.build = build;
  return {f};
}

}  // namespace

DPRUN_PLUGIN(models)
