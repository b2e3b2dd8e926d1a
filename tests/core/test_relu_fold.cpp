// A ReLU that Sequential fuses into the Conv2d, Linear or BatchNorm2d before it
// (ReLU::fold_previous) against the same network with each ReLU a layer of its own, on every
// backend present, in both layouts, with and without biases: training output, input gradient,
// every parameter gradient, evaluation, finite differences. Then the op that runs a fused ReLU's
// backward, Backend::relu_backward_bias, against relu_backward and the bias gradients of
// linear_backward and conv_backward_filter, in fp32 and bf16.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dp/bf16.hpp"
#include "dp/layers.hpp"
#include "dp/random.hpp"
#include "support/check.hpp"
#include "support/module_check.hpp"

using dptest::check_against_cpu;
using dptest::check_module_gradients;
using dptest::DeviceBuffer;
using dptest::entry_values;
using dptest::ModuleRunner;

namespace {

// conv1 (3 -> 5, 3x3, padding 1) -> ReLU -> conv2 (5 -> 4, 3x3, padding 1) -> batch norm (which
// folds conv2's bias) -> ReLU -> avg pool 2 -> global avg pool -> flatten -> fc1 (-> 6) -> ReLU
// -> fc2 (-> 4). Fused: as Sequential builds it (conv1, the batch norm and fc1 take their ReLUs).
// Separate: each ReLU inside a Sequential of its own, which Sequential::add does not fuse. (The
// global pool leaves fc1 one feature per channel, the same in both layouts, so the NHWC runs
// compare with the CPU's NCHW as they are.)
std::unique_ptr<dp::Module> relu_net(bool fuse, bool bias) {
  auto net = std::make_unique<dp::Sequential>();
  auto relu = [&] {
    if (fuse) {
      net->add(std::make_unique<dp::ReLU>());
    } else {
      auto alone = std::make_unique<dp::Sequential>();
      alone->add(std::make_unique<dp::ReLU>());
      net->add(std::move(alone));
    }
  };
  net->add("conv1", std::make_unique<dp::Conv2d>(3, 5, 3, 1, 1, bias));
  relu();
  net->add("conv2", std::make_unique<dp::Conv2d>(5, 4, 3, 1, 1, bias));
  net->add("bn", std::make_unique<dp::BatchNorm2d>(4));
  relu();
  net->add(std::make_unique<dp::AvgPool2d>(2, 2));
  net->add(std::make_unique<dp::GlobalAvgPool>());
  net->add(std::make_unique<dp::Flatten>());
  net->add("fc1", std::make_unique<dp::Linear>(4, 6, bias));
  relu();
  net->add("fc2", std::make_unique<dp::Linear>(6, 4, bias));
  return net;
}

// Every trainable value from U(-1, 1): biases as large as the weighted sums, so every ReLU masks
// a good share of its inputs, and a fused layer that dropped its bias or its mask would show.
void randomize(ModuleRunner& run, uint64_t seed) { dptest::randomize_trainable(run, seed); }

}  // namespace

TEST_CASE("Sequential fuses a ReLU into the Conv2d, Linear or BatchNorm2d before it",
          "[engine][layers]") {
  auto net = relu_net(true, true);
  auto& seq = static_cast<dp::Sequential&>(*net);
  CHECK(static_cast<dp::Conv2d&>(seq.at(0)).relu_fused());
  CHECK(static_cast<dp::ReLU&>(seq.at(1)).folded());
  CHECK_FALSE(static_cast<dp::Conv2d&>(seq.at(2)).relu_fused());  // a batch norm reads it
  CHECK(static_cast<dp::ReLU&>(seq.at(4)).folded());              // into the batch norm
  CHECK(static_cast<dp::Linear&>(seq.at(8)).relu_fused());
  CHECK(static_cast<dp::ReLU&>(seq.at(9)).folded());
  CHECK_FALSE(static_cast<dp::Linear&>(seq.at(10)).relu_fused());

  // Not into another kind of layer, not twice, not into a layer that has one already.
  dp::Sequential other;
  other.add(std::make_unique<dp::AvgPool2d>(2, 2));
  auto after_pool = std::make_unique<dp::ReLU>();
  const dp::ReLU* p = after_pool.get();
  other.add(std::move(after_pool));
  auto second = std::make_unique<dp::ReLU>();
  const dp::ReLU* q = second.get();
  other.add(std::move(second));  // after a ReLU
  CHECK_FALSE(p->folded());
  CHECK_FALSE(q->folded());
  dp::Sequential twice;
  twice.add(std::make_unique<dp::Linear>(3, 2));
  twice.add(std::make_unique<dp::ReLU>());
  auto again = std::make_unique<dp::ReLU>();
  const dp::ReLU* r = again.get();
  twice.add(std::move(again));
  CHECK_FALSE(r->folded());
  dp::BatchNorm2d fused_bn(2, 1e-5f, 0.1f, dp::BatchNorm2d::Fused{false, true});
  CHECK_FALSE(fused_bn.fuse_relu());
  // A subclass of ReLU computes its output its own way: not fused.
  struct OwnRelu : dp::ReLU {};
  dp::Sequential own;
  auto lin = std::make_unique<dp::Linear>(3, 2);
  const dp::Linear* l = lin.get();
  own.add(std::move(lin));
  auto mine = std::make_unique<OwnRelu>();
  const OwnRelu* m = mine.get();
  own.add(std::move(mine));
  CHECK_FALSE(m->folded());
  CHECK_FALSE(l->relu_fused());

  // A batch norm cannot take the bias of a convolution whose output goes through a ReLU first.
  dp::Conv2d conv(1, 2, 3);
  REQUIRE(conv.fuse_relu());
  dp::BatchNorm2d bn(2);
  REQUIRE_THROWS_WITH(bn.fold_bias_of(conv), Catch::Contains("goes through a fused ReLU first"));

  ModuleRunner run(std::move(net), {2, 3, 6, 4});
  std::ostringstream os;
  run.module().describe(os);
  INFO(os.str());
  CHECK(os.str().find("(conv1): Conv2d(3, 5, kernel_size=(3, 3), stride=(1, 1), "
                      "padding=(1, 1)) + ReLU  -> (2, 5, 6, 4)") != std::string::npos);
  CHECK(os.str().find("(1): ReLU() (fused into the layer before)  -> (2, 5, 6, 4)") !=
        std::string::npos);
  CHECK(os.str().find("(fc1): Linear(in_features=4, out_features=6, bias=True) + ReLU") !=
        std::string::npos);
  CHECK_THROWS_WITH(
      static_cast<dp::Conv2d&>(static_cast<dp::Sequential&>(run.module()).at(2)).fuse_relu(),
      Catch::Contains("fuse_relu after setup"));
}

TEST_CASE("a ReLU fused into the layer before computes the separate layers' values",
          "[engine][layers]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const bool bias = GENERATE(true, false);
  INFO("layout " << dp::layout_name(layout) << ", biases " << bias);
  const dp::Shape in{3, 3, 6, 4};
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner fused(relu_net(true, bias), in, 3, kind, layout);
    ModuleRunner separate(relu_net(false, bias), in, 3, kind, layout);
    randomize(fused, 29);
    separate.set_params(fused.params());
    const auto x = dptest::random_vector(in.numel(), 30);
    const auto dy = dptest::random_vector(fused.output().numel(), 31);

    // The same bits: the fused passes compute what the separate ones do, in the same order.
    const auto y = fused.forward(x);
    DP_CHECK_CLOSE(y, separate.forward(x), 0.0);
    DP_CHECK_CLOSE(fused.backward(dy), separate.backward(dy), 0.0);
    const auto fg = fused.grads(), sg = separate.grads();
    std::vector<std::string> names = {"conv1.weight", "conv2.weight", "bn.weight",
                                      "bn.bias",      "fc1.weight",   "fc2.weight"};
    if (bias) names.insert(names.end(), {"conv1.bias", "conv2.bias", "fc1.bias", "fc2.bias"});
    for (const std::string& name : names) {
      INFO(name);
      const auto a = entry_values(fused.registry(), fg, name);
      const auto b = entry_values(separate.registry(), sg, name);
      // conv1's bias gradient on the cpu backend: the fused pass sums channel by channel, the
      // convolution's own bias gradient in its algorithm's order.
      const bool other_order = kind == dp::BackendKind::cpu && name == "conv1.bias";
      DP_CHECK_CLOSE(a, b, other_order ? 1e-5 : 0.0);
    }
    DP_CHECK_CLOSE(fused.forward(x, false), separate.forward(x, false), 0.0);

    // Finite differences on the CPU (hundreds of forwards: minutes on the emulated GPU of CI);
    // the other backends equal their separate layers bit for bit and the CPU's to rounding.
    if (kind == dp::BackendKind::cpu) check_module_gradients(fused, x, {1e-3, 2e-2, 3e-3, true});
    check_against_cpu(
        fused, [bias] { return relu_net(true, bias); }, x, 1e-4);
  }
}

namespace {

// The backend the op tests run on: two CPU threads, exact fp32 on the GPU.
std::unique_ptr<dp::Backend> op_backend(dp::BackendKind kind, dp::Precision precision) {
  dp::BackendOptions options;
  options.kind = kind;
  options.precision = precision;
  options.cpu_threads = 2;
  options.allow_tf32 = false;
  return dp::create_backend(options);
}

// The bias gradient of dx = relu_backward(y, dy) over every position of each channel, in double:
// each value rounded to bf16 first in precision bf16.
std::vector<double> masked_channel_sums(const std::vector<float>& y, const std::vector<float>& dy,
                                        int64_t n, int64_t c, int64_t hw, bool channels_last,
                                        bool bf16) {
  std::vector<double> sums(static_cast<size_t>(c), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) {
        const int64_t i = channels_last ? (b * hw + p) * c + ch : (b * c + ch) * hw + p;
        const float v = y[i] > 0.0f ? dy[i] : 0.0f;
        sums[ch] += bf16 ? dp::round_to_bf16(v) : v;
      }
  return sums;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("a fused ReLU's forward passes write the ReLU of the unfused passes' output",
          "[engine][layers]") {
  const dp::Precision precision = GENERATE(dp::Precision::fp32, dp::Precision::bf16);
  INFO("precision " << dp::precision_name(precision));
  for (const dp::BackendKind kind : dptest::available_backends()) {
    INFO("backend " << dp::backend_kind_name(kind));
    auto backend = op_backend(kind, precision);
    dp::Backend& B = *backend;
    const auto relu_of = [](std::vector<float> v) {
      for (float& e : v) e = e < 0.0f ? 0.0f : e;
      return v;
    };
    const auto count_zeros = [](const std::vector<float>& v) {
      int64_t z = 0;
      for (float e : v) z += e == 0.0f;
      return z;
    };
    {  // linear, with and without a bias
      const int64_t n = 9, in = 7, out = 6;
      DeviceBuffer x(B, {n, in}), w(B, {out, in}), b(B, {out}), y(B, {n, out}), plain(B, {n, out});
      x.upload(dptest::random_vector(n * in, 50));
      w.upload(dptest::random_vector(out * in, 51));
      b.upload(dptest::random_vector(out, 52));
      for (const bool with_bias : {true, false}) {
        INFO("linear, bias " << with_bias);
        const dp::Tensor* bp = with_bias ? b.ptr() : nullptr;
        B.linear_forward(x.tensor(), w.tensor(), bp, y.tensor(), /*relu=*/true);
        B.linear_forward(x.tensor(), w.tensor(), bp, plain.tensor());
        const auto fused = y.download_f32();
        DP_CHECK_CLOSE(fused, relu_of(plain.download_f32()), 0.0);
        CHECK(count_zeros(fused) > n * out / 5);
      }
    }
    // Convolutions in both layouts: a few input channels (the cuda backend's own kernels where
    // it chose them) and more, with and without a bias.
    for (const dp::Layout layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
      for (const int64_t cin : {1, 6}) {
        const dp::ConvGeometry g = dptest::conv_geometry(2, cin, 5, 6, 8, 3, 3, 1, 1, 1, 1, layout);
        DeviceBuffer x(B, {2, cin, 5, 6}, dp::DType::f32, layout), w(B, {8, cin, 3, 3});
        DeviceBuffer b(B, {8}), y(B, {2, 8, 5, 6}, dp::DType::f32, layout);
        DeviceBuffer plain(B, {2, 8, 5, 6}, dp::DType::f32, layout);
        x.upload(dptest::random_vector(2 * cin * 30, 53));
        w.upload(dptest::random_vector(8 * cin * 9, 54));
        b.upload(dptest::random_vector(8, 55));
        for (const bool with_bias : {true, false}) {
          INFO("conv " << cin << " channels, " << dp::layout_name(layout) << ", bias "
                       << with_bias);
          // Without a bias, plans declared so (ConvUse::forward_bias): in bf16 the cuda backend
          // may then run cuDNN's bf16 kernels, which round their output themselves.
          dp::ConvUse use;
          use.forward_bias = with_bias;
          auto plan = B.plan_conv(g, use);
          use.output_relu = true;
          auto fused_plan = B.plan_conv(g, use);
          CHECK(fused_plan->output_relu());
          CHECK_FALSE(plan->output_relu());
          const dp::Tensor* bp = with_bias ? b.ptr() : nullptr;
          B.conv_forward(*fused_plan, x.tensor(), w.tensor(), bp, y.tensor());
          B.conv_forward(*plan, x.tensor(), w.tensor(), bp, plain.tensor());
          const auto fused = y.download_f32();
          DP_CHECK_CLOSE(fused, relu_of(plain.download_f32()), 0.0);
          CHECK(count_zeros(fused) > 2 * 8 * 30 / 5);
        }
      }
    }
  }
}

TEST_CASE("relu_backward_bias masks the gradient and sums the bias gradient in one pass",
          "[engine][layers]") {
  const dp::Precision precision = GENERATE(dp::Precision::fp32, dp::Precision::bf16);
  INFO("precision " << dp::precision_name(precision));
  const bool bf16 = precision == dp::Precision::bf16;
  for (const dp::BackendKind kind : dptest::available_backends()) {
    INFO("backend " << dp::backend_kind_name(kind));
    auto backend = op_backend(kind, precision);
    dp::Backend& B = *backend;
    // (N, C): a linear layer's; its bias gradient is linear_backward's, bit for bit.
    {
      const int64_t n = 37, c = 5, in = 3;
      const auto yv = dptest::random_vector(n * c, 40), dyv = dptest::random_vector(n * c, 41);
      DeviceBuffer y(B, {n, c}), dy(B, {n, c}), dx(B, {n, c}), db(B, {c});
      DeviceBuffer ref_dx(B, {n, c}), x(B, {n, in}), w(B, {c, in}), dw(B, {c, in}), ref_db(B, {c});
      y.upload(yv);
      dy.upload(dyv);
      x.upload(dptest::random_vector(n * in, 42));
      w.upload(dptest::random_vector(c * in, 43));
      B.relu_backward_bias(y.tensor(), dy.tensor(), dx.tensor(), db.tensor());
      B.relu_backward(y.tensor(), dy.tensor(), ref_dx.tensor());
      B.linear_backward(x.tensor(), w.tensor(), ref_dx.tensor(), nullptr, dw.tensor(),
                        ref_db.ptr());
      DP_CHECK_CLOSE(dx.download_f32(), ref_dx.download_f32(), 0.0);
      DP_CHECK_CLOSE(db.download_f32(), ref_db.download_f32(), 0.0);
      DP_CHECK_CLOSE(widen(db.download_f32()), masked_channel_sums(yv, dyv, n, c, 1, true, bf16),
                     1e-5);
      // dx may be dy itself.
      B.relu_backward_bias(y.tensor(), dy.tensor(), dy.tensor(), db.tensor());
      DP_CHECK_CLOSE(dy.download_f32(), ref_dx.download_f32(), 0.0);
      DP_CHECK_CLOSE(db.download_f32(), ref_db.download_f32(), 0.0);
    }
    // (N, C, H, W) in both layouts: a convolution's; its bias gradient is conv_backward_filter's,
    // bit for bit on the cuda backend (the same reduction: 360 values a channel, two levels), to
    // rounding on the cpu backend's.
    for (const dp::Layout layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
      INFO("layout " << dp::layout_name(layout));
      const int64_t n = 3, c = 5, h = 12, wd = 10, cin = 2;
      const dp::Shape s{n, c, h, wd};
      const auto yv = dptest::random_vector(s.numel(), 44),
                 dyv = dptest::random_vector(s.numel(), 45);
      DeviceBuffer y(B, s, dp::DType::f32, layout), dy(B, s, dp::DType::f32, layout);
      DeviceBuffer dx(B, s, dp::DType::f32, layout), ref_dx(B, s, dp::DType::f32, layout);
      DeviceBuffer x(B, {n, cin, h, wd}, dp::DType::f32, layout), dw(B, {c, cin, 1, 1});
      DeviceBuffer db(B, {c}), ref_db(B, {c});
      y.upload(yv);
      dy.upload(dyv);
      x.upload(dptest::random_vector(n * cin * h * wd, 46));
      B.relu_backward_bias(y.tensor(), dy.tensor(), dx.tensor(), db.tensor());
      B.relu_backward(y.tensor(), dy.tensor(), ref_dx.tensor());
      auto plan = B.plan_conv(dptest::conv_geometry(n, cin, h, wd, c, 1, 1, 1, 1, 0, 0, layout));
      B.conv_backward_filter(*plan, x.tensor(), ref_dx.tensor(), dw.tensor(), ref_db.ptr());
      DP_CHECK_CLOSE(dx.download_f32(), ref_dx.download_f32(), 0.0);
      DP_CHECK_CLOSE(db.download_f32(), ref_db.download_f32(),
                     kind == dp::BackendKind::cpu ? 1e-5 : 0.0);
      DP_CHECK_CLOSE(widen(db.download_f32()),
                     masked_channel_sums(yv, dyv, n, c, h * wd, layout == dp::Layout::nhwc, bf16),
                     1e-5);
    }
  }
}
