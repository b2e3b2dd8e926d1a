// Every layer through the Module API on every backend present (the CPU always, CUDA where a GPU
// is): forward against a naive reference, backward (dx and each named parameter tensor) against
// central differences, and a CUDA backend against the CPU backend tensor by named tensor; odd
// shapes; the shape checks of Module; Sequential naming; describe().
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <sstream>

#include "dp/error.hpp"
#include "dp/layers.hpp"
#include "dp/random.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"
#include "support/module_check.hpp"
#include "test_cpu_util.hpp"

using dptest::check_against_cpu;
using dptest::check_module_gradients;
using dptest::entry_values;
using dptest::ModuleRunner;
using dptest::Tolerance;

namespace {

// Random parameter values (padding left at zero), so gradients w.r.t. gamma/beta/bias are
// checked away from their initial 1/0.
void randomize_params(ModuleRunner& run, uint64_t seed, float scale = 0.5f) {
  dptest::randomize_trainable(run, seed, scale);
}

// The CUDA backend against the CPU oracle: float sums in another order.
constexpr double kCrossBackend = 1e-4;

// A Linear whose backward reports a bias gradient off by 0.5 in its first element: the checker
// must notice.
class LinearWithWrongBiasGradient : public dp::Linear {
 public:
  using dp::Linear::Linear;

 protected:
  dp::Tensor do_backward(dp::RunContext& ctx, const dp::Tensor& dy, bool need_dx) override {
    const dp::Tensor dx = dp::Linear::do_backward(ctx, dy, need_dx);
    for (const auto& e : ctx.params.entries()) {
      if (e.name != "bias") continue;
      float* grad = static_cast<float*>(ctx.params.grads_flat().data) + e.offset;
      float first = 0;
      ctx.backend.download(&first, grad, sizeof first);
      first += 0.5f;
      ctx.backend.upload(grad, &first, sizeof first);
    }
    return dx;
  }
};

// Deep compositions: a smaller step (float noise ~1e-3 at this step) and kink detection.
const Tolerance kinky{1e-3, 2e-2, 3e-3, true};

// ---- naive references (NCHW) ----------------------------------------------------------------

std::vector<float> conv_ref(const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>* b, int64_t N, int64_t C, int64_t H, int64_t W,
                            int64_t K, int64_t R, int64_t stride, int64_t pad) {
  const int64_t P = (H + 2 * pad - R) / stride + 1, Q = (W + 2 * pad - R) / stride + 1;
  std::vector<float> y(static_cast<size_t>(N * K * P * Q));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          double s = b ? (*b)[static_cast<size_t>(k)] : 0.0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < R; ++i)
              for (int64_t j = 0; j < R; ++j) {
                const int64_t h = p * stride - pad + i, ww = q * stride - pad + j;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                s += static_cast<double>(x[static_cast<size_t>(((n * C + c) * H + h) * W + ww)]) *
                     w[static_cast<size_t>(((k * C + c) * R + i) * R + j)];
              }
          y[static_cast<size_t>(((n * K + k) * P + p) * Q + q)] = static_cast<float>(s);
        }
  return y;
}

std::vector<float> pool_ref(const std::vector<float>& x, int64_t N, int64_t C, int64_t H, int64_t W,
                            int64_t k, int64_t stride, int64_t pad, bool max) {
  const int64_t P = (H + 2 * pad - k) / stride + 1, Q = (W + 2 * pad - k) / stride + 1;
  std::vector<float> y(static_cast<size_t>(N * C * P * Q));
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        double s = 0, m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) {
            const int64_t h = p * stride - pad + i, w = q * stride - pad + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const double v = x[static_cast<size_t>((nc * H + h) * W + w)];
            s += v;
            m = std::max(m, v);
          }
        y[static_cast<size_t>((nc * P + p) * Q + q)] =
            static_cast<float>(max ? m : s / static_cast<double>(k * k));
      }
  return y;
}

// Distinct values spaced 0.05 apart in random order: no ties or near-ties for max pooling and
// no value within 0.025 of zero for ReLU, so a finite-difference step of 1e-2 crosses no kink.
std::vector<float> spaced_values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = 0.05f * static_cast<float>(i - n / 2) + 0.025f;
  dp::Rng rng(seed);
  const auto perm = dp::permutation(n, rng);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[static_cast<size_t>(perm[i])];
  return out;
}

}  // namespace

TEST_CASE("Conv2d: forward matches a naive convolution, gradients match finite differences",
          "[engine][layers]") {
  struct Case {
    int64_t n, c, h, w, k, r, stride, pad;
    bool bias;
  };
  for (const Case& cs : {Case{3, 2, 7, 6, 5, 3, 2, 1, true}, Case{2, 3, 5, 5, 4, 1, 2, 0, false},
                         Case{1, 1, 6, 4, 2, 3, 1, 0, true}}) {
    DYNAMIC_SECTION("N=" << cs.n << " C=" << cs.c << " " << cs.h << "x" << cs.w << " K=" << cs.k
                         << " R=" << cs.r << " stride " << cs.stride << " pad " << cs.pad)
    DP_FOR_EACH_BACKEND(kind) {
      auto make = [&] {
        return std::make_unique<dp::Conv2d>(cs.c, cs.k, cs.r, cs.stride, cs.pad, cs.bias);
      };
      ModuleRunner run(make(), {cs.n, cs.c, cs.h, cs.w}, 3, kind);
      randomize_params(run, 11);
      const auto x = dptest::random_vector(cs.n * cs.c * cs.h * cs.w, 5);
      const auto p = run.params();
      const auto w = entry_values(run.registry(), p, "weight");
      std::vector<float> b;
      if (cs.bias) b = entry_values(run.registry(), p, "bias");
      const auto expected = conv_ref(x, w, cs.bias ? &b : nullptr, cs.n, cs.c, cs.h, cs.w, cs.k,
                                     cs.r, cs.stride, cs.pad);
      DP_CHECK_CLOSE(run.forward(x), expected, 1e-5);
      check_module_gradients(run, x);
      check_against_cpu(run, make, x, kCrossBackend);
    }
  }
}

TEST_CASE("Conv2d: a batch smaller than the setup batch", "[engine][layers]") {
  DP_FOR_EACH_BACKEND(kind) {
    auto make = [] { return std::make_unique<dp::Conv2d>(2, 3, 3, 1, 1); };
    ModuleRunner run(make(), {4, 2, 5, 5}, 1, kind);
    randomize_params(run, 2);
    const auto x = dptest::random_vector(2 * 2 * 5 * 5, 8);
    const auto p = run.params();
    const auto w = entry_values(run.registry(), p, "weight");
    const auto b = entry_values(run.registry(), p, "bias");
    DP_CHECK_CLOSE(run.forward(x), conv_ref(x, w, &b, 2, 2, 5, 5, 3, 3, 1, 1), 1e-5);
    check_module_gradients(run, x);
    check_against_cpu(run, make, x, kCrossBackend);
  }
}

TEST_CASE("Conv2d: a weight stored for one layout refuses to be set up in the other",
          "[engine][layers]") {
  // Its weight's memory order is the registry's layout when it was declared
  // (ParamRegistry::set_layout); an NCHW setup of an NHWC-stored weight names both and the fix.
  auto b = cputest::make_cpu(1);
  dp::Arena arena(*b);
  dp::ParamRegistry registry;
  registry.set_layout(dp::Layout::nhwc);
  dp::Conv2d conv(2, 3, 3);
  conv.declare(registry, "stem.");
  CHECK(conv.weight_layout() == dp::Layout::nhwc);
  registry.allocate(*b);
  dp::SetupContext ctx{*b, arena, registry, dp::Layout::nchw, {}, {}, true};
  CHECK_THROWS_WITH(conv.setup(ctx, {2, 2, 5, 5}),
                    Catch::Contains("Conv2d stem") && Catch::Contains("stored nhwc") &&
                        Catch::Contains("set up nchw") && Catch::Contains("set_layout"));
}

TEST_CASE("Linear: forward is x w^T + b, gradients match finite differences", "[engine][layers]") {
  const int64_t n = 3, in = 7, out = 5;
  DP_FOR_EACH_BACKEND(kind) {
    auto make = [&] { return std::make_unique<dp::Linear>(in, out); };
    ModuleRunner run(make(), {n, in}, 1, kind);
    randomize_params(run, 4);
    const auto x = dptest::random_vector(n * in, 6);
    const auto p = run.params();
    const auto w = entry_values(run.registry(), p, "weight");
    const auto b = entry_values(run.registry(), p, "bias");
    std::vector<float> expected(static_cast<size_t>(n * out));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double s = b[static_cast<size_t>(o)];
        for (int64_t j = 0; j < in; ++j)
          s += static_cast<double>(x[static_cast<size_t>(i * in + j)]) *
               w[static_cast<size_t>(o * in + j)];
        expected[static_cast<size_t>(i * out + o)] = static_cast<float>(s);
      }
    DP_CHECK_CLOSE(run.forward(x), expected, 1e-5);
    check_module_gradients(run, x);
    check_against_cpu(run, make, x, kCrossBackend);

    SECTION("without bias") {
      auto make_nb = [&] { return std::make_unique<dp::Linear>(in, out, false); };
      ModuleRunner nb(make_nb(), {n, in}, 1, kind);
      CHECK(nb.registry().entries().size() == 1);
      check_module_gradients(nb, x);
      check_against_cpu(nb, make_nb, x, kCrossBackend);
    }
  }
}

// Expected to fail: a checker that cannot fail would pass every layer test above.
TEST_CASE("the layer checker catches a wrong gradient of one named tensor",
          "[engine][layers][!shouldfail]") {
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner run(std::make_unique<LinearWithWrongBiasGradient>(7, 5), {3, 7}, 1, kind);
    randomize_params(run, 4);
    check_module_gradients(run, dptest::random_vector(3 * 7, 6));
  }
}

TEST_CASE("BatchNorm2d: training forward, running statistics, inference, gradients",
          "[engine][layers]") {
  const int64_t N = 3, C = 2, H = 3, W = 5, M = N * H * W;
  DP_FOR_EACH_BACKEND(kind) {
    auto make = [&] { return std::make_unique<dp::BatchNorm2d>(C); };
    ModuleRunner run(make(), {N, C, H, W}, 1, kind);
    randomize_params(run, 9);
    const auto x = dptest::random_vector(N * C * H * W, 10, -2.0f, 3.0f);
    const auto p = run.params();
    const auto gamma = entry_values(run.registry(), p, "weight");
    const auto beta = entry_values(run.registry(), p, "bias");

    std::vector<float> expected(x.size());
    std::vector<double> mean(C), var(C);
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, s2 = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < H * W; ++i) s += x[static_cast<size_t>((n * C + c) * H * W + i)];
      mean[static_cast<size_t>(c)] = s / M;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < H * W; ++i) {
          const double d = x[static_cast<size_t>((n * C + c) * H * W + i)] - s / M;
          s2 += d * d;
        }
      var[static_cast<size_t>(c)] = s2 / M;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < H * W; ++i) {
          const size_t k = static_cast<size_t>((n * C + c) * H * W + i);
          expected[k] = static_cast<float>(gamma[static_cast<size_t>(c)] * (x[k] - s / M) /
                                               std::sqrt(s2 / M + 1e-5) +
                                           beta[static_cast<size_t>(c)]);
        }
    }
    DP_CHECK_CLOSE(run.forward(x, true), expected, 1e-4);

    // PyTorch's update: momentum 0.1, the variance unbiased by M / (M - 1).
    const auto buffers = run.registry().download_buffers();
    const auto rm = entry_values(run.registry(), buffers, "running_mean");
    const auto rv = entry_values(run.registry(), buffers, "running_var");
    std::vector<float> em(C), ev(C);
    for (size_t c = 0; c < static_cast<size_t>(C); ++c) {
      em[c] = static_cast<float>(0.1 * mean[c]);
      ev[c] = static_cast<float>(0.9 + 0.1 * var[c] * M / (M - 1));
    }
    DP_CHECK_CLOSE(rm, em, 1e-5);
    DP_CHECK_CLOSE(rv, ev, 1e-5);

    SECTION("inference uses the running statistics") {
      std::vector<float> inf(x.size());
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t i = 0; i < H * W; ++i) {
            const size_t k = static_cast<size_t>((n * C + c) * H * W + i);
            const size_t cc = static_cast<size_t>(c);
            inf[k] = static_cast<float>(gamma[cc] * (x[k] - rm[cc]) / std::sqrt(rv[cc] + 1e-5) +
                                        beta[cc]);
          }
      DP_CHECK_CLOSE(run.forward(x, false), inf, 1e-5);
    }
    SECTION("gradients in training mode") {
      check_module_gradients(run, x);
      check_against_cpu(run, make, x, kCrossBackend);
    }
    SECTION("(N, C) input") {
      auto make_flat = [] { return std::make_unique<dp::BatchNorm2d>(3); };
      ModuleRunner flat(make_flat(), {5, 3}, 1, kind);
      randomize_params(flat, 12);
      const auto x2 = dptest::random_vector(15, 13, -2.0f, 2.0f);
      check_module_gradients(flat, x2);
      check_against_cpu(flat, make_flat, x2, kCrossBackend);
    }
  }
}

TEST_CASE("BatchNorm2d with a fused ReLU equals BatchNorm2d then ReLU, in both layouts",
          "[engine][layers]") {
  // The fused layer must compute exactly what the two layers compute (the CPU backend's fused
  // loops are bit for bit its separate ops: test_cpu_bn_epilogue.cpp), and its gradients must
  // match finite differences. Training and evaluation.
  const dp::Shape in{3, 4, 5, 3};
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  auto make = [] {
    return std::make_unique<dp::BatchNorm2d>(4, 1e-5f, 0.1f, dp::BatchNorm2d::Fused{false, true});
  };
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner fused(make(), in, 7, kind, layout);
    // The ReLU in a Sequential of its own: added right after the batch norm, Sequential would
    // fuse it (ReLU::fold_previous).
    auto relu = std::make_unique<dp::Sequential>();
    relu->add(std::make_unique<dp::ReLU>());
    auto seq = std::make_unique<dp::Sequential>();
    seq->add(std::make_unique<dp::BatchNorm2d>(4));
    seq->add(std::move(relu));
    ModuleRunner parts(std::move(seq), in, 7, kind, layout);
    randomize_params(fused, 41);
    parts.set_params(fused.params());
    const auto x = dptest::random_vector(in.numel(), 42, -2.0f, 2.0f);
    const auto dy = dptest::random_vector(in.numel(), 43);
    CHECK(fused.forward(x) == parts.forward(x));
    CHECK(fused.backward(dy) == parts.backward(dy));
    CHECK(fused.grads() == parts.grads());
    CHECK(fused.registry().download_buffers() == parts.registry().download_buffers());
    CHECK(fused.forward(x, false) == parts.forward(x, false));
    check_module_gradients(fused, x, kinky);
    check_against_cpu(fused, make, x, kCrossBackend);
  }
}

TEST_CASE("BatchNorm2d built for a residual refuses a forward without one", "[engine][layers]") {
  ModuleRunner run(
      std::make_unique<dp::BatchNorm2d>(2, 1e-5f, 0.1f, dp::BatchNorm2d::Fused{true, false}),
      {2, 2, 3, 3});
  CHECK_THROWS_WITH(run.forward(dptest::random_vector(36, 1)),
                    Catch::Contains("built with Fused::residual") &&
                        Catch::Contains("forward(ctx, x, residual)"));
}

TEST_CASE("ReLU: forward and gradient", "[engine][layers]") {
  auto make = [] { return std::make_unique<dp::ReLU>(); };
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner run(make(), {3, 2, 3, 5}, 1, kind);
    const auto x = spaced_values(90, 1);
    std::vector<float> expected(x.size());
    for (size_t i = 0; i < x.size(); ++i) expected[i] = std::max(x[i], 0.0f);
    CHECK(run.forward(x) == expected);
    check_module_gradients(run, x);
    check_against_cpu(run, make, x, kCrossBackend);
    SECTION("rank 2") {
      ModuleRunner flat(make(), {4, 5}, 1, kind);
      check_module_gradients(flat, spaced_values(20, 2));
    }
  }
}

TEST_CASE("AvgPool2d and MaxPool2d: forward against a naive pool, gradients", "[engine][layers]") {
  struct Case {
    int64_t n, c, h, w, k, stride, pad;
  };
  for (const Case& cs :
       {Case{2, 3, 7, 5, 3, 2, 1}, Case{3, 2, 6, 6, 2, 2, 0}, Case{1, 2, 5, 7, 3, 1, 0}}) {
    DYNAMIC_SECTION(cs.h << "x" << cs.w << " kernel " << cs.k << " stride " << cs.stride << " pad "
                         << cs.pad)
    DP_FOR_EACH_BACKEND(kind) {
      const auto x = spaced_values(cs.n * cs.c * cs.h * cs.w, 17);
      const dp::Shape in{cs.n, cs.c, cs.h, cs.w};
      auto make_avg = [&] { return std::make_unique<dp::AvgPool2d>(cs.k, cs.stride, cs.pad); };
      ModuleRunner avg(make_avg(), in, 1, kind);
      DP_CHECK_CLOSE(avg.forward(x),
                     pool_ref(x, cs.n, cs.c, cs.h, cs.w, cs.k, cs.stride, cs.pad, false), 1e-5);
      check_module_gradients(avg, x);
      check_against_cpu(avg, make_avg, x, kCrossBackend);
      auto make_max = [&] { return std::make_unique<dp::MaxPool2d>(cs.k, cs.stride, cs.pad); };
      ModuleRunner mx(make_max(), in, 1, kind);
      CHECK(mx.forward(x) == pool_ref(x, cs.n, cs.c, cs.h, cs.w, cs.k, cs.stride, cs.pad, true));
      check_module_gradients(mx, x);
      check_against_cpu(mx, make_max, x, kCrossBackend);
    }
  }
}

TEST_CASE("GlobalAvgPool and Flatten", "[engine][layers]") {
  const int64_t N = 2, C = 3, H = 5, W = 3;
  const auto x = dptest::random_vector(N * C * H * W, 21);
  DP_FOR_EACH_BACKEND(kind) {
    auto make_gap = [] { return std::make_unique<dp::GlobalAvgPool>(); };
    ModuleRunner gap(make_gap(), {N, C, H, W}, 1, kind);
    CHECK(gap.output() == dp::Shape{N, C, 1, 1});
    std::vector<float> expected(static_cast<size_t>(N * C));
    for (size_t i = 0; i < expected.size(); ++i) {
      double s = 0;
      for (int64_t j = 0; j < H * W; ++j)
        s += x[i * static_cast<size_t>(H * W) + static_cast<size_t>(j)];
      expected[i] = static_cast<float>(s / (H * W));
    }
    DP_CHECK_CLOSE(gap.forward(x), expected, 1e-5);
    check_module_gradients(gap, x);
    check_against_cpu(gap, make_gap, x, kCrossBackend);

    ModuleRunner flat(std::make_unique<dp::Flatten>(), {N, C, H, W}, 1, kind);
    CHECK(flat.output() == dp::Shape{N, C * H * W});
    CHECK(flat.forward(x) == x);
    CHECK(flat.backward(x) == x);
  }
}

TEST_CASE("Residual with a 1x1 shortcut and stride 2: gradients (BN in training mode)",
          "[engine][layers]") {
  auto make = [] { return std::make_unique<dp::Residual>(3, 4, true, 2); };
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner run(make(), {2, 3, 6, 6}, 5, kind);
    CHECK(run.output() == dp::Shape{2, 4, 3, 3});
    std::vector<std::string> names;
    for (const auto& e : run.registry().entries()) names.push_back(e.name);
    CHECK(names == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight",
                                            "conv2.bias", "conv3.weight", "conv3.bias",
                                            "bn1.weight", "bn1.bias", "bn1.running_mean",
                                            "bn1.running_var", "bn2.weight", "bn2.bias",
                                            "bn2.running_mean", "bn2.running_var"});
    randomize_params(run, 31);
    const auto x = dptest::random_vector(2 * 3 * 6 * 6, 32);
    check_module_gradients(run, x, kinky);
    check_against_cpu(run, make, x, kCrossBackend);
  }
}

TEST_CASE("Residual with the identity shortcut equals its composition", "[engine][layers]") {
  const dp::Shape in{2, 3, 5, 5};
  auto make = [] { return std::make_unique<dp::Residual>(3, 3); };
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner run(make(), in, 6, kind);
    randomize_params(run, 33);
    const auto x = dptest::random_vector(in.numel(), 34);
    // The same block written as a Sequential of its parts; the shortcut added by hand.
    auto seq = std::make_unique<dp::Sequential>();
    seq->add("conv1", std::make_unique<dp::Conv2d>(3, 3, 3, 1, 1));
    seq->add("bn1", std::make_unique<dp::BatchNorm2d>(3));
    seq->add("relu", std::make_unique<dp::ReLU>());
    seq->add("conv2", std::make_unique<dp::Conv2d>(3, 3, 3, 1, 1));
    seq->add("bn2", std::make_unique<dp::BatchNorm2d>(3));
    ModuleRunner parts(std::move(seq), in, 6, kind);
    std::vector<float> pp = parts.params();
    const auto rp = run.params();
    for (const auto& e : parts.registry().entries()) {
      if (!e.trainable) continue;
      const auto v = entry_values(run.registry(), rp, e.name);
      std::copy(v.begin(), v.end(), pp.begin() + static_cast<std::ptrdiff_t>(e.offset));
    }
    parts.set_params(pp);
    auto main = parts.forward(x);
    for (size_t i = 0; i < main.size(); ++i) main[i] = std::max(main[i] + x[i], 0.0f);
    DP_CHECK_CLOSE(run.forward(x), main, 1e-5);
    check_module_gradients(run, x, kinky);
    check_against_cpu(run, make, x, kCrossBackend);
  }
}

TEST_CASE("Residual in NHWC computes what it computes in NCHW (fused epilogues included)",
          "[engine][layers]") {
  // Both shortcuts: the identity (bn2 fuses the add and the ReLU) and the strided 1x1 conv.
  const bool projection = GENERATE(false, true);
  const int64_t n = 2, c = 3, h = 6, w = 6, k = projection ? 4 : 3;
  const int64_t stride = projection ? 2 : 1, p = h / stride, q = w / stride;
  INFO((projection ? "1x1 shortcut, stride 2" : "identity shortcut"));
  auto make = [&] { return std::make_unique<dp::Residual>(c, k, projection, stride); };
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner nchw(make(), {n, c, h, w}, 9, kind, dp::Layout::nchw);
    ModuleRunner nhwc(make(), {n, c, h, w}, 9, kind, dp::Layout::nhwc);
    randomize_params(nchw, 51);
    nhwc.set_params(nchw.params());
    const auto x = dptest::random_vector(n * c * h * w, 52);
    const auto dy = dptest::random_vector(n * k * p * q, 53);
    using cputest::to_nhwc;
    // Two layouts are two summation orders (on the GPU two cuDNN algorithms): a rounding
    // difference, as between backends.
    const double tol = kind == dp::BackendKind::cuda ? kCrossBackend : 1e-5;
    DP_CHECK_CLOSE(nhwc.forward(to_nhwc(x, n, c, h, w)), to_nhwc(nchw.forward(x), n, k, p, q), tol);
    DP_CHECK_CLOSE(nhwc.backward(to_nhwc(dy, n, k, p, q)), to_nhwc(nchw.backward(dy), n, c, h, w),
                   tol);
    DP_CHECK_CLOSE(nhwc.grads(), nchw.grads(), tol);
    DP_CHECK_CLOSE(nhwc.registry().download_buffers(), nchw.registry().download_buffers(), 1e-6);
    DP_CHECK_CLOSE(nhwc.forward(to_nhwc(x, n, c, h, w), false),
                   to_nhwc(nchw.forward(x, false), n, k, p, q), tol);
    // Finite differences: the NCHW tests above; equal values carry them over.
  }
}

TEST_CASE("Sequential: a small network end to end, gradients through every layer",
          "[engine][layers]") {
  auto make = [] {
    auto net = std::make_unique<dp::Sequential>();
    net->add(std::make_unique<dp::Conv2d>(1, 3, 3));
    net->add(std::make_unique<dp::BatchNorm2d>(3));
    net->add(std::make_unique<dp::ReLU>());
    net->add(std::make_unique<dp::MaxPool2d>(2, 2));
    net->add(std::make_unique<dp::AvgPool2d>(2, 1));
    net->add(std::make_unique<dp::Flatten>());
    net->add(std::make_unique<dp::Linear>(3 * 2 * 2, 4));
    return net;
  };
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner run(make(), {3, 1, 8, 8}, 8, kind);
    CHECK(run.output() == dp::Shape{3, 4});
    randomize_params(run, 41);
    const auto x = dptest::random_vector(3 * 64, 42);
    check_module_gradients(run, x, kinky);
    check_against_cpu(run, make, x, kCrossBackend);
  }
}

TEST_CASE("Module checks shapes and names the module and both shapes", "[engine][layers]") {
  ModuleRunner run(std::make_unique<dp::Conv2d>(3, 4, 3), {2, 3, 8, 8});
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const dp::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  // A larger batch than at setup.
  std::string m = message([&] { run.forward(std::vector<float>(3 * 3 * 64)); });
  CHECK_THAT(m, Catch::Contains("Conv2d") && Catch::Contains("(3, 3, 8, 8)") &&
                    Catch::Contains("(2, 3, 8, 8)"));
  // A smaller batch is fine.
  CHECK(run.forward(std::vector<float>(3 * 64)).size() == 4 * 36);
  // Wrong channels at setup.
  m = message([] { ModuleRunner bad(std::make_unique<dp::Conv2d>(3, 4, 3), {2, 2, 8, 8}); });
  CHECK_THAT(m, Catch::Contains("Conv2d") && Catch::Contains("(2, 2, 8, 8)"));
  m = message([] { ModuleRunner bad(std::make_unique<dp::Linear>(10, 4), {2, 1, 2, 5}); });
  CHECK_THAT(m, Catch::Contains("Linear") && Catch::Contains("Flatten"));
  m = message([] { dp::Residual bad(3, 4); });
  CHECK_THAT(m, Catch::Contains("use_1x1conv"));
  // Backward with a gradient of the wrong shape.
  m = message([&] { run.backward(std::vector<float>(4 * 36 * 2)); });
  CHECK(m != "(no error)");
}

TEST_CASE("Sequential names children and prefixes nested names", "[engine][layers]") {
  auto inner = std::make_unique<dp::Sequential>();
  inner->add(std::make_unique<dp::Flatten>());
  inner->add(std::make_unique<dp::Linear>(12, 2));
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Conv2d>(1, 3, 3, 1, 1));
  net->add("bn", std::make_unique<dp::BatchNorm2d>(3));
  net->add("head", std::move(inner));
  CHECK_THROWS_AS(net->add("bn", std::make_unique<dp::ReLU>()), dp::Error);
  CHECK_THROWS_AS(net->add("a.b", std::make_unique<dp::ReLU>()), dp::Error);
  ModuleRunner run(std::move(net), {2, 1, 2, 2});
  std::vector<std::string> names;
  for (const auto& e : run.registry().entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "bn.weight", "bn.bias",
                                          "bn.running_mean", "bn.running_var", "head.1.weight",
                                          "head.1.bias"});
  CHECK(run.module().children().size() == 3);
}

TEST_CASE("describe() prints like PyTorch with output shapes", "[engine][layers]") {
  auto model = enginetest::build_model("libdprun_lenet.so", "lenet");
  ModuleRunner run(std::move(model), {256, 1, 28, 28});
  std::ostringstream os;
  run.module().describe(os);
  const std::string s = os.str();
  INFO(s);
  // LeNet's ReLUs are fused into the layers before them (ReLU::fold_previous).
  CHECK_THAT(s, Catch::StartsWith("Sequential(\n  (0): Conv2d(1, 20, kernel_size=(3, 3), "
                                  "stride=(1, 1)) + ReLU  -> (256, 20, 26, 26)\n"
                                  "  (1): ReLU() (fused into the layer before)  -> "
                                  "(256, 20, 26, 26)\n"));
  CHECK_THAT(s, Catch::Contains("  (2): AvgPool2d(kernel_size=2, stride=2, padding=0)  -> "
                                "(256, 20, 13, 13)\n"));
  CHECK_THAT(s, Catch::Contains("  (6): Flatten()  -> (256, 800)\n"));
  CHECK_THAT(s, Catch::EndsWith("  (9): Linear(in_features=128, out_features=10, bias=True)  -> "
                                "(256, 10)\n)  -> (256, 10)\n"));

  std::ostringstream rs;
  dp::Residual(3, 4, true, 2).describe(rs);
  CHECK(rs.str() ==
        "Residual(\n"
        "  (conv1): Conv2d(3, 4, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))\n"
        "  (conv2): Conv2d(4, 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "  (conv3): Conv2d(3, 4, kernel_size=(1, 1), stride=(2, 2))\n"
        "  (bn1): BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)"
        " + conv bias + ReLU\n"
        "  (bn2): BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)"
        " + conv bias + residual + ReLU\n"
        ")\n");
}
