// A batch norm that adds the bias of the convolution before it (BatchNorm2d::fold_bias_of)
// against the same pair unfolded, on every backend present, in both layouts, with and without
// the fused ReLU: training output, running statistics, every gradient, evaluation; the folded
// bias's gradient is 0, as its finite differences say. Also where the fold happens on its own
// (Sequential, Residual) and what it refuses.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <sstream>

#include "dp/error.hpp"
#include "dp/layers.hpp"
#include "dp/random.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"
#include "support/module_check.hpp"

using dptest::check_against_cpu;
using dptest::check_module_gradients;
using dptest::entry_values;
using dptest::ModuleRunner;

namespace {

using enginetest::norm_relative_error;

constexpr int64_t kIn = 3, kOut = 4;

// conv (3x3, padding 1, bias) -> batch norm, folded or not, outside any Sequential (which would
// fold on its own).
class ConvThenBn : public dp::Module {
 public:
  ConvThenBn(bool fold, bool relu)
      : conv_(kIn, kOut, 3, 1, 1), bn_(kOut, 1e-5f, 0.1f, dp::BatchNorm2d::Fused{false, relu}) {
    if (fold) bn_.fold_bias_of(conv_);
  }
  const char* type() const override { return "ConvThenBn"; }
  void declare(dp::ParamRegistry& registry, const std::string& prefix) override {
    conv_.declare(registry, prefix + "conv.");
    bn_.declare(registry, prefix + "bn.");
  }
  std::vector<dp::Module*> children() override { return {&conv_, &bn_}; }
  dp::StepSchedule::Handle schedule_forward(dp::StepSchedule& s,
                                            const dp::StepSchedule::Handle& x) override {
    return bn_.schedule_forward(s, conv_.schedule_forward(s, x));
  }
  dp::StepSchedule::Handle schedule_backward(dp::StepSchedule& s,
                                             const dp::StepSchedule::Handle& dy) override {
    return conv_.schedule_backward(s, bn_.schedule_backward(s, dy));
  }

 protected:
  dp::Shape do_setup(dp::SetupContext& ctx, const dp::Shape& input) override {
    const bool input_grad = ctx.input_grad;
    const dp::Shape s = conv_.setup(ctx, input);
    ctx.input_grad = true;
    const dp::Shape out = bn_.setup(ctx, s);
    ctx.input_grad = input_grad;
    return out;
  }
  dp::Tensor do_forward(dp::RunContext& ctx, const dp::Tensor& x) override {
    return bn_.forward(ctx, conv_.forward(ctx, x));
  }
  dp::Tensor do_backward(dp::RunContext& ctx, const dp::Tensor& dy, bool need_dx) override {
    return conv_.backward(ctx, bn_.backward(ctx, dy, true), need_dx);
  }

 private:
  dp::Conv2d conv_;
  dp::BatchNorm2d bn_;
};

// Random parameters, the conv's bias included (U(-1, 1) per channel: large against the spread
// of the conv's output, where a fold that dropped it would show).
void randomize(ModuleRunner& run, uint64_t seed) { dptest::randomize_trainable(run, seed); }

std::vector<float> values(ModuleRunner& run, const std::vector<float>& flat,
                          const std::string& name) {
  return entry_values(run.registry(), flat, name);
}

// conv (biases drawn from N(0.5, 0.5^2), far from 0) -> batch norm -> ReLU -> pool -> linear.
// Folded: as Sequential builds it. Unfolded: the conv inside a Sequential of its own, which
// Sequential::add does not look into.
std::unique_ptr<dp::Module> biased_bn_net(bool fold) {
  dp::Conv2d::Options o{.kernel = 3, .stride = 2, .padding = 1};
  o.weight_init = dp::Init::normal(0.1f);
  o.bias_init = dp::Init::normal(0.5f, 0.5f);
  auto conv = std::make_unique<dp::Conv2d>(1, 8, o);
  auto net = std::make_unique<dp::Sequential>();
  if (fold) {
    net->add(std::move(conv));
  } else {
    auto alone = std::make_unique<dp::Sequential>();
    alone->add(std::move(conv));
    net->add(std::move(alone));
  }
  net->add(std::make_unique<dp::BatchNorm2d>(8));
  net->add(std::make_unique<dp::ReLU>());
  net->add(std::make_unique<dp::MaxPool2d>(2, 2));
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(8 * 7 * 7, 10, true, dp::Init::normal(0.1f)));
  return net;
}

}  // namespace

TEST_CASE("a batch norm that folds its convolution's bias computes the unfolded pair's values",
          "[engine][layers]") {
  const dp::Shape in{3, kIn, 5, 4};
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const bool relu = GENERATE(false, true);
  INFO("layout " << dp::layout_name(layout) << ", fused ReLU " << relu);
  // Folded and unfolded differ only in rounding: z = conv + bias is rounded before its mean is
  // taken (about 2^-24 |bias| per value, times gamma / std after normalisation), and the running
  // mean is updated as (1 - m) r + m mean + m bias instead of (1 - m) r + m (mean + bias).
  constexpr double kRounding = 1e-5;
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner folded(std::make_unique<ConvThenBn>(true, relu), in, 3, kind, layout);
    ModuleRunner plain(std::make_unique<ConvThenBn>(false, relu), in, 3, kind, layout);
    randomize(folded, 17);
    plain.set_params(folded.params());
    const auto bias = values(folded, folded.params(), "conv.bias");
    REQUIRE(std::abs(bias[0]) > 0.01f);
    const auto x = dptest::random_vector(in.numel(), 18, -1.0f, 1.0f);
    const auto dy = dptest::random_vector(folded.output().numel(), 19);

    DP_CHECK_CLOSE(folded.forward(x), plain.forward(x), kRounding);
    const auto fb = folded.registry().download_buffers(), pb = plain.registry().download_buffers();
    DP_CHECK_CLOSE(values(folded, fb, "bn.running_mean"), values(plain, pb, "bn.running_mean"),
                   kRounding);
    DP_CHECK_CLOSE(values(folded, fb, "bn.running_var"), values(plain, pb, "bn.running_var"),
                   kRounding);
    // The running mean holds the bias: a fold that left it out would be off by 0.1 * bias.
    CHECK(std::abs(values(folded, fb, "bn.running_mean")[0] -
                   values(plain, pb, "bn.running_mean")[0]) < 1e-3 * std::abs(bias[0]));

    DP_CHECK_CLOSE(folded.backward(dy), plain.backward(dy), kRounding);
    const auto fg = folded.grads(), pg = plain.grads();
    for (const char* name : {"conv.weight", "bn.weight", "bn.bias"}) {
      INFO(name);
      DP_CHECK_CLOSE(values(folded, fg, name), values(plain, pg, name), kRounding);
    }
    // Exactly 0 folded; 0 up to the reduction's rounding unfolded.
    for (float g : values(folded, fg, "conv.bias")) CHECK(g == 0.0f);
    for (float g : values(plain, pg, "conv.bias")) CHECK(std::abs(g) < 1e-4);

    // Evaluation with the running statistics both now hold.
    DP_CHECK_CLOSE(folded.forward(x, false), plain.forward(x, false), kRounding);

    check_module_gradients(folded, x, {1e-3, 2e-2, 3e-3, relu});
    check_against_cpu(
        folded, [relu] { return std::make_unique<ConvThenBn>(true, relu); }, x, 1e-4);
  }
}

TEST_CASE("Sequential and Residual fold a convolution's bias into the batch norm after it",
          "[engine][layers]") {
  dp::Sequential seq;
  auto conv = std::make_unique<dp::Conv2d>(1, 2, 3);
  const dp::Conv2d* c = conv.get();
  seq.add(std::move(conv));
  seq.add(std::make_unique<dp::BatchNorm2d>(2));
  CHECK(c->bias_folded());
  // Not across another layer, not without a bias, not into another channel count.
  dp::Sequential other;
  auto c1 = std::make_unique<dp::Conv2d>(1, 2, 3, 1, 0, /*bias=*/false);
  auto c2 = std::make_unique<dp::Conv2d>(2, 3, 3);
  auto c3 = std::make_unique<dp::Conv2d>(3, 3, 3);
  const dp::Conv2d *p2 = c2.get(), *p3 = c3.get();
  other.add(std::move(c1));
  other.add(std::make_unique<dp::BatchNorm2d>(2));
  other.add(std::move(c2));
  other.add(std::make_unique<dp::BatchNorm2d>(2, 1e-5f, 0.1f));  // 3 channels come in: no fold
  other.add(std::move(c3));
  other.add(std::make_unique<dp::ReLU>());
  other.add(std::make_unique<dp::BatchNorm2d>(3));  // after the ReLU: c3's bias stays
  CHECK_FALSE(p2->bias_folded());
  CHECK_FALSE(p3->bias_folded());

  ModuleRunner block(std::make_unique<dp::Residual>(2, 3, true, 2), {2, 2, 6, 6});
  std::ostringstream os;
  block.module().describe(os);
  // bn1 and bn2 fold conv1's and conv2's; conv3 (the shortcut) keeps its own.
  CHECK(os.str().find("BatchNorm2d(3, eps=1e-05, momentum=0.1, affine=True, "
                      "track_running_stats=True) + conv bias + ReLU") != std::string::npos);
  CHECK(os.str().find("+ conv bias + residual + ReLU") != std::string::npos);
  int folded = 0;
  for (dp::Module* m : block.module().children())
    if (auto* conv2d = dynamic_cast<dp::Conv2d*>(m)) folded += conv2d->bias_folded();
  CHECK(folded == 2);
}

TEST_CASE("fold_bias_of refuses what it cannot fold, naming the layer", "[engine][layers]") {
  dp::Conv2d no_bias(1, 2, 3, 1, 0, false), three(1, 3, 3), conv(1, 2, 3), again(1, 2, 3);
  dp::BatchNorm2d bn(2), other(2);
  CHECK_THROWS_WITH(bn.fold_bias_of(no_bias),
                    Catch::Contains("BatchNorm2d(2)") && Catch::Contains("has no bias to fold"));
  CHECK_THROWS_WITH(bn.fold_bias_of(three), Catch::Contains("gives 3 channels"));
  bn.fold_bias_of(conv);
  CHECK_THROWS_WITH(other.fold_bias_of(conv), Catch::Contains("already folded elsewhere"));
  CHECK_THROWS_WITH(bn.fold_bias_of(again), Catch::Contains("already adds a convolution's bias"));

  ModuleRunner set_up(std::make_unique<dp::BatchNorm2d>(2), {2, 2, 3, 3});
  dp::Conv2d late(1, 2, 3);
  CHECK_THROWS_WITH(dynamic_cast<dp::BatchNorm2d&>(set_up.module()).fold_bias_of(late),
                    Catch::Contains("after setup"));
  // A convolution that is not part of the model (never declared): its bias has no place.
  dp::Conv2d outside(1, 2, 3);
  auto folding = std::make_unique<dp::BatchNorm2d>(2);
  folding->fold_bias_of(outside);
  CHECK_THROWS_WITH(ModuleRunner(std::move(folding), {2, 2, 3, 3}),
                    Catch::Contains("the folded convolution's bias is not declared"));
}

TEST_CASE("feeds refuses what it cannot declare, naming the layer", "[engine][layers]") {
  dp::Conv2d three(3, 2, 3), conv(2, 2, 3), another(2, 2, 3);
  dp::BatchNorm2d bn(2), other(2);
  CHECK_THROWS_WITH(bn.feeds(three),
                    Catch::Contains("BatchNorm2d(2)") && Catch::Contains("takes 3 channels"));
  bn.feeds(conv);
  CHECK_THROWS_WITH(bn.feeds(another), Catch::Contains("already feeds a convolution alone"));
  CHECK_THROWS_WITH(other.feeds(conv), Catch::Contains("already reads another batch norm"));
  ModuleRunner set_up(std::make_unique<dp::BatchNorm2d>(2), {2, 2, 3, 3});
  dp::Conv2d late(2, 2, 3);
  CHECK_THROWS_WITH(dynamic_cast<dp::BatchNorm2d&>(set_up.module()).feeds(late),
                    Catch::Contains("after setup"));
  // A convolution set up before the batch norm that feeds it would not know its input's dtype.
  auto first = std::make_unique<dp::Conv2d>(2, 2, 3, 1, 1);
  dp::BatchNorm2d never_set_up(2);
  never_set_up.feeds(*first);
  CHECK_THROWS_WITH(ModuleRunner(std::move(first), {2, 2, 5, 5}),
                    Catch::Contains("Conv2d(2, 2)") &&
                        Catch::Contains("the batch norm that feeds it (BatchNorm2d::feeds) must "
                                        "be set up before it"));
}

TEST_CASE(
    "a folded bias trains as the unfolded one: one replica, and k replicas with "
    "synchronised batch norm and an empty shard",
    "[engine][trainer]") {
  // An epoch of 131 examples in batches of 64 (the last step has 3: with k = 4 one replica's
  // shard is empty and still takes part in the statistics), SGD with momentum, in both layouts.
  // The biases start far from 0, so the running mean's momentum * bias (added after the
  // statistics, on each path) is large against rounding: leaving it out on any path is off by
  // about 0.1 * bias per step.
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  const auto data = enginetest::training_data(131, 4);
  for (const int k : {1, 4}) {
    INFO(k << " replicas");
    dp::TrainerOptions o;
    o.replicas = k;
    o.batch_size = 64;
    o.lr.base = 0.1f;
    o.optimizer.momentum = 0.9f;
    o.seed = 17;
    o.cpu_threads = 2;
    o.epochs = 1;
    o.layout = layout;
    o.sync_bn = k > 1;
    o.average_bn_buffers = false;
    dp::Trainer folded(
        o, [] { return biased_bn_net(true); }, data, data.head(0));
    dp::Trainer plain(
        o, [] { return biased_bn_net(false); }, data, data.head(0));
    REQUIRE(folded.parameters(0) == plain.parameters(0));  // the same start
    const auto rf = folded.run_epoch(1), rp = plain.run_epoch(1);
    CHECK(rf.train_loss == Approx(rp.train_loss).epsilon(1e-5));
    // The unfolded bias moves by rounding noise (its exact gradient is 0): the norm over every
    // parameter is what can be held to rounding.
    CHECK(norm_relative_error(folded.parameters(0), plain.parameters(0)) <= 1e-5);
    CHECK(norm_relative_error(folded.buffers(0), plain.buffers(0)) <= 1e-5);
    for (int q = 1; q < k; ++q) CHECK(folded.buffers(q) == folded.buffers(0));
  }
}
