// The precision contract on the GPU, independent of timing: for the op tests' convolution shapes
// and the real layers of LeNet and ResNet-18 at batch 256, NCHW and NHWC, under fp32-exact and
// TF32, EVERY algorithm cuDNN offers that the contract allows is run and compared with the CPU
// backend. A forbidden algorithm is refused; the default GPU path (TF32, batches 256 and 512,
// heuristic and measured choice, a choice read back from the cache) stays inside the contract.
//
// Tolerance, per output element i, with M_i = the same convolution of |inputs| (sum |a_k b_k|,
// computed by the CPU backend) and K the length of the sum:
//  - both sides sum K fp32 products in some order: at most K * 2^-24 * M_i each (gamma_K), so
//    2 K 2^-24 M_i together (fp32-exact allows only such sums: GEMM and direct algorithms);
//  - TF32 rounds both inputs to a 10-bit mantissa first: a product is off by at most 2 * 2^-10
//    of itself (round to nearest would halve that), adding 2^-9 M_i;
//  - FFT and Winograd (TF32 only) transform the inputs, which spreads an input's rounding over a
//    tile: their bound is kTransformFactor times TF32's, on max(M_i, the mean of M). The factor is
//    a first estimate; the test prints, per algorithm, the largest fraction of its bound it used,
//    so each GPU run measures the margin (scripts/gpu-check keeps the log).
// Under bf16 (precision = "bf16") the reference is the cpu backend's bf16, which rounds the same
// operands to the same bf16 values: every product is exact on both sides (TF32 math holds a bf16
// significand), so only the fp32 sums differ, by 3 K 2^-24 M_i (K 2^-24 M_i for the CPU's
// round-to-nearest sums, 2 K 2^-24 M_i for tensor-core sums that may truncate), with M_i from
// the bf16 operands (the CPU's |inputs| convolution in bf16, widened by 2^-7 for the rounding
// of M itself). The activation, the input gradient and the weight gradient are then rounded to
// bf16 on both sides, which can split two such sums by one bf16 ulp of the larger result: added
// to their bound.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.hpp"
#include "dp/backend.hpp"
#include "dp/choice_cache.hpp"
#include "dp/conv_contract.hpp"
#include "dp/error.hpp"
#include "support/check.hpp"

using dp::ConvContract;
using dp::ConvDirection;
using dp::ConvFamily;
using dp::Layout;

namespace {

constexpr double kU32 = 1.0 / (1 << 24);     // fp32 unit roundoff (round to nearest)
constexpr double kTf32Input = 1.0 / (1 << 10);  // TF32 input rounding, truncation included
constexpr double kTransformFactor = 8.0;

struct ConvShape {
  std::string what;
  int64_t n, c, h, w, k, r, s, stride, pad;
  dp::ConvGeometry geometry(Layout layout) const {
    return cudatest::ConvCase{n, n, c, h, w, k, r, s, stride, pad, false}.geometry(layout);
  }
};

// The op tests' shapes (test_cuda_ops.cpp).
std::vector<ConvShape> op_shapes() {
  return {{"odd sizes", 3, 2, 7, 6, 5, 3, 3, 1, 1},
          {"strided 5x5", 4, 3, 9, 9, 4, 5, 5, 2, 2},
          {"lenet-like 20->50 5x5", 2, 20, 12, 12, 50, 5, 5, 1, 0},
          {"1x1 stride 2", 5, 8, 8, 8, 16, 1, 1, 2, 0},
          {"28x28 stem", 8, 1, 28, 28, 6, 3, 3, 1, 1},
          {"wide 64->64", 2, 64, 7, 7, 64, 3, 3, 1, 1}};
}

// Every convolution of the plugins' LeNet and ResNet-18 (width 64) on 28x28 Fashion-MNIST.
std::vector<ConvShape> model_shapes(int64_t n) {
  return {{"lenet conv1", n, 1, 28, 28, 20, 3, 3, 1, 0},
          {"lenet conv2", n, 20, 13, 13, 50, 5, 5, 1, 0},
          {"resnet stem", n, 1, 28, 28, 64, 3, 3, 1, 1},
          {"resnet block1 conv", n, 64, 28, 28, 64, 3, 3, 1, 1},
          {"resnet block2 conv1", n, 64, 28, 28, 128, 3, 3, 2, 1},
          {"resnet block2 shortcut", n, 64, 28, 28, 128, 1, 1, 2, 0},
          {"resnet block2 conv", n, 128, 14, 14, 128, 3, 3, 1, 1},
          {"resnet block3 conv1", n, 128, 14, 14, 256, 3, 3, 2, 1},
          {"resnet block3 shortcut", n, 128, 14, 14, 256, 1, 1, 2, 0},
          {"resnet block3 conv", n, 256, 7, 7, 256, 3, 3, 1, 1},
          {"resnet block4 conv1", n, 256, 7, 7, 512, 3, 3, 2, 1},
          {"resnet block4 shortcut", n, 256, 7, 7, 512, 1, 1, 2, 0},
          {"resnet block4 conv", n, 512, 4, 4, 512, 3, 3, 1, 1}};
}

std::unique_ptr<dp::Backend> gpu_backend(ConvContract contract, dp::ConvChoice choice) {
  dp::BackendOptions o;
  o.kind = dp::BackendKind::cuda;
  o.device_index = 0;
  o.allow_tf32 = contract != ConvContract::fp32_exact;
  o.precision = contract == ConvContract::bf16 ? dp::Precision::bf16 : dp::Precision::fp32;
  o.conv_choice = choice;
  return dp::create_backend(o);
}

/// The reference of a contract: the CPU in fp32, or in bf16 for the bf16 contract.
dp::Backend& cpu_oracle(ConvContract contract) {
  if (contract != ConvContract::bf16) return *cudatest::backends().cpu;
  static std::unique_ptr<dp::Backend> bf16 = [] {
    dp::BackendOptions o;
    o.kind = dp::BackendKind::cpu;
    o.precision = dp::Precision::bf16;
    return dp::create_backend(o);
  }();
  return *bf16;
}

std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

/// The CPU's results of one shape (NCHW) and the magnitudes M of each output.
struct Reference {
  std::vector<float> x, w, dy;      // inputs
  std::vector<float> y, dx, dw;     // results
  std::vector<float> my, mdx, mdw;  // sum |a b| per output
};

Reference cpu_reference(const ConvShape& cs, dp::Backend& cpu) {
  const dp::ConvGeometry g = cs.geometry(Layout::nchw);
  const int64_t p = g.out_h(), q = g.out_w();
  Reference r;
  r.x = dptest::random_vector(cs.n * cs.c * cs.h * cs.w, 101);
  r.w = dptest::random_vector(cs.k * cs.c * cs.r * cs.s, 102, -0.5f, 0.5f);
  r.dy = dptest::random_vector(cs.n * cs.k * p * q, 103);
  auto plan = cpu.plan_conv(g);
  dptest::DeviceBuffer x(cpu, {cs.n, cs.c, cs.h, cs.w}), dx(cpu, {cs.n, cs.c, cs.h, cs.w});
  dptest::DeviceBuffer y(cpu, {cs.n, cs.k, p, q}), dy(cpu, {cs.n, cs.k, p, q});
  dptest::DeviceBuffer w(cpu, {cs.k, cs.c, cs.r, cs.s}), dw(cpu, {cs.k, cs.c, cs.r, cs.s});
  const auto run = [&](const std::vector<float>& xv, const std::vector<float>& wv,
                       const std::vector<float>& dyv, std::vector<float>& yo,
                       std::vector<float>& dxo, std::vector<float>& dwo) {
    x.upload(xv);
    w.upload(wv);
    dy.upload(dyv);
    cpu.conv_forward(*plan, x.tensor(), w.tensor(), nullptr, y.tensor());
    cpu.conv_backward_data(*plan, dy.tensor(), w.tensor(), dx.tensor());
    cpu.conv_backward_filter(*plan, x.tensor(), dy.tensor(), dw.tensor(), nullptr);
    yo = y.download_f32();
    dxo = dx.download_f32();
    dwo = dw.download_f32();
  };
  run(r.x, r.w, r.dy, r.y, r.dx, r.dw);
  run(absolute(r.x), absolute(r.w), absolute(r.dy), r.my, r.mdx, r.mdw);
  return r;
}

/// Terms in each output's sum, per direction (an upper bound where stride or padding skips some).
int64_t sum_length(const ConvShape& cs, ConvDirection d) {
  const dp::ConvGeometry g = cs.geometry(Layout::nchw);
  switch (d) {
    case ConvDirection::forward:
      return cs.c * cs.r * cs.s;
    case ConvDirection::backward_data:
      return cs.k * cs.r * cs.s;
    case ConvDirection::backward_filter:
      return cs.n * g.out_h() * g.out_w();
  }
  return 0;
}

/// One ulp of bf16 at |v| (normal range; 2^-133 below it).
double bf16_ulp(double v) {
  const double a = std::max(std::fabs(v), 0x1p-126);
  return std::ldexp(1.0, std::ilogb(a) - 7);
}

/// The largest |actual - expected| / bound_i over the elements (<= 1: within the contract).
/// `rounded`: the outputs were rounded to bf16 (every pass's output under bf16).
double worst_fraction(const std::vector<float>& actual, const std::vector<float>& expected,
                      const std::vector<float>& magnitude, ConvContract contract, ConvFamily family,
                      int64_t k, int64_t* outside, bool rounded = false) {
  if (contract == ConvContract::bf16) {
    double worst = 0;
    *outside = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      const double a = actual[i], e = expected[i];
      double bound = 3.0 * static_cast<double>(k) * kU32 * (1.0 + 0x1p-7) * magnitude[i];
      if (rounded) bound += bf16_ulp(std::max(std::fabs(a), std::fabs(e)));
      bound += 1e-30;
      const double f = std::fabs(a - e) / bound;
      if (!(f <= 1.0)) ++*outside;
      worst = std::max(worst, std::isnan(f) ? INFINITY : f);
    }
    return worst;
  }
  const double sums = 2.0 * static_cast<double>(k) * kU32;
  double mean = 0;
  for (float m : magnitude) mean += m;
  mean /= std::max<size_t>(1, magnitude.size());
  const bool transform = family == ConvFamily::fft || family == ConvFamily::winograd;
  double worst = 0;
  *outside = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double m = magnitude[i];
    double bound = sums * m;
    if (contract != ConvContract::fp32_exact) {
      bound += transform ? kTransformFactor * 2 * kTf32Input * std::max(m, mean)
                         : 2 * kTf32Input * m;
    }
    bound += 1e-30;  // an exact zero compared with an exact zero
    const double f = std::fabs(static_cast<double>(actual[i]) - expected[i]) / bound;
    if (!(f <= 1.0)) ++*outside;  // NaN counts as outside
    worst = std::max(worst, std::isnan(f) ? INFINITY : f);
  }
  return worst;
}

/// Runs direction `d` of the GPU plan as the step would, into NCHW host order.
std::vector<float> run_direction(dp::Backend& gpu, dp::ConvPlan& plan, ConvDirection d,
                                 const ConvShape& cs, Layout layout, const Reference& ref) {
  const dp::ConvGeometry g = cs.geometry(layout);
  const int64_t p = g.out_h(), q = g.out_w();
  const bool nhwc = layout == Layout::nhwc;
  const auto mine = [&](const std::vector<float>& v, int64_t c, int64_t h, int64_t w) {
    return nhwc ? dptest::to_nhwc(v, cs.n, c, h, w) : v;
  };
  dptest::DeviceBuffer x(gpu, {cs.n, cs.c, cs.h, cs.w}, dp::DType::f32, layout);
  dptest::DeviceBuffer dy(gpu, {cs.n, cs.k, p, q}, dp::DType::f32, layout);
  dptest::DeviceBuffer w(gpu, {cs.k, cs.c, cs.r, cs.s});
  x.upload(mine(ref.x, cs.c, cs.h, cs.w));
  dy.upload(mine(ref.dy, cs.k, p, q));
  w.upload(ref.w);
  const auto poisoned = [&](dp::Shape s, Layout l) {
    dptest::DeviceBuffer b(gpu, s, dp::DType::f32, l);
    b.upload(std::vector<float>(static_cast<size_t>(s.numel()), 7.0f));
    return b;
  };
  switch (d) {
    case ConvDirection::forward: {
      dptest::DeviceBuffer y = poisoned({cs.n, cs.k, p, q}, layout);
      gpu.conv_forward(plan, x.tensor(), w.tensor(), nullptr, y.tensor());
      const auto v = y.download_f32();
      return nhwc ? dptest::to_nchw(v, cs.n, cs.k, p, q) : v;
    }
    case ConvDirection::backward_data: {
      dptest::DeviceBuffer dx = poisoned({cs.n, cs.c, cs.h, cs.w}, layout);
      gpu.conv_backward_data(plan, dy.tensor(), w.tensor(), dx.tensor());
      const auto v = dx.download_f32();
      return nhwc ? dptest::to_nchw(v, cs.n, cs.c, cs.h, cs.w) : v;
    }
    case ConvDirection::backward_filter: {
      dptest::DeviceBuffer dw = poisoned({cs.k, cs.c, cs.r, cs.s}, Layout::nchw);
      gpu.conv_backward_filter(plan, x.tensor(), dy.tensor(), dw.tensor(), nullptr);
      return dw.download_f32();
    }
  }
  return {};
}

const std::vector<float>& expected_of(const Reference& r, ConvDirection d) {
  return d == ConvDirection::forward ? r.y : d == ConvDirection::backward_data ? r.dx : r.dw;
}
const std::vector<float>& magnitude_of(const Reference& r, ConvDirection d) {
  return d == ConvDirection::forward ? r.my : d == ConvDirection::backward_data ? r.mdx : r.mdw;
}

constexpr ConvDirection kDirections[] = {ConvDirection::forward, ConvDirection::backward_data,
                                         ConvDirection::backward_filter};

/// Every allowed algorithm of every direction of `cs`, under the given contracts and both
/// layouts.
void check_every_algorithm(const ConvShape& cs, std::vector<ConvContract> contracts = {
                                                    ConvContract::fp32_exact, ConvContract::tf32}) {
  std::optional<Reference> fp32_ref, bf16_ref;  // each computed once, when a contract needs it
  for (ConvContract contract : contracts) {
    std::optional<Reference>& slot = contract == ConvContract::bf16 ? bf16_ref : fp32_ref;
    if (!slot) slot = cpu_reference(cs, cpu_oracle(contract));
    const Reference& ref = *slot;
    auto gpu = gpu_backend(contract, dp::ConvChoice::heuristic);
    // bf16's forward runs other kernels with and without a bias (ConvUse::forward_bias: cuDNN's
    // bf16 kernels without, fp32 kernels on rounded copies with): both are run.
    const std::vector<bool> bias_declared =
        contract == ConvContract::bf16 ? std::vector<bool>{false, true} : std::vector<bool>{true};
    for (Layout layout : {Layout::nchw, Layout::nhwc}) {
      for (const bool bias : bias_declared) {
        dp::ConvUse use;
        use.forward_bias = bias;
        auto plan = gpu->plan_conv(cs.geometry(layout), use);
        for (ConvDirection d : kDirections) {
          if (bias && contract == ConvContract::bf16 && d != ConvDirection::forward) continue;
          // The passes that give cuDNN packed bf16 data (cuda_backend.hpp).
          const bool bf16_data =
              contract == ConvContract::bf16 && (d != ConvDirection::forward || !bias);
          const auto algorithms = dp::cuda_conv_algorithms(*gpu, *plan, d, cs.n);
          INFO(cs.what << " " << cs.geometry(layout).str() << ", "
                       << dp::conv_contract_name(contract) << ", " << dp::conv_direction_name(d)
                       << (bias ? "" : ", declared without a bias"));
          // The GEMM-like algorithms run every shape: a contract with nothing to run is a bug.
          CHECK_FALSE(algorithms.empty());
          for (const dp::ConvAlgorithm& a : algorithms) {
            INFO(a.str());
            REQUIRE(dp::conv_contract_allows(contract, d, a.algo, a.math));
            dp::cuda_use_conv_algorithm(*gpu, *plan, a);
            CHECK(dp::cuda_conv_choice(*gpu, *plan, d, cs.n).algo == a.algo);
            const std::vector<float> actual = run_direction(*gpu, *plan, d, cs, layout, ref);
            int64_t outside = 0;
            const ConvFamily family = dp::conv_family(d, a.algo);
            const double used =
                worst_fraction(actual, expected_of(ref, d), magnitude_of(ref, d), contract, family,
                               sum_length(cs, d), &outside, /*rounded=*/true);
            std::printf("conv-algorithm %-24s %-5s %-10s %-15s %-22s %-9s %-10s %6.3f of bound%s\n",
                        cs.what.c_str(), dp::layout_name(layout), dp::conv_contract_name(contract),
                        dp::conv_direction_name(d), dp::conv_algorithm_name(d, a.algo).c_str(),
                        dp::conv_family_name(family), dp::conv_math_name(a.math), used,
                        bf16_data ? " (bf16 data)" : "");
            INFO(outside << " of " << actual.size() << " outputs outside the contract's bound; "
                         << "worst at " << used << " of it");
            CHECK(outside == 0);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("cuda conv: every algorithm the contract allows computes within it (op test shapes)",
          "[cuda][algorithms]") {
  for (const ConvShape& cs : op_shapes()) check_every_algorithm(cs);
}

TEST_CASE("cuda conv: every algorithm the contract allows computes within it (LeNet, ResNet-18, "
          "batch 256)",
          "[cuda][algorithms]") {
  for (const ConvShape& cs : model_shapes(256)) check_every_algorithm(cs);
}

TEST_CASE(
    "cuda conv: every algorithm the bf16 contract allows computes the cpu's bf16 within "
    "summation order (op test shapes, LeNet, ResNet-18 at batch 32)",
    "[cuda][algorithms][bf16]") {
  // Batch 32: the CPU's bf16 reference (rounded copies of every operand) of the ResNet-18
  // layers stays quick; the algorithms cuDNN offers per shape are the same kinds as at 256.
  for (const ConvShape& cs : op_shapes()) check_every_algorithm(cs, {ConvContract::bf16});
  for (const ConvShape& cs : model_shapes(32)) check_every_algorithm(cs, {ConvContract::bf16});
}

TEST_CASE("cuda conv: an algorithm the contract forbids is refused", "[cuda][algorithms]") {
  const ConvShape cs{"lenet-like 20->50 5x5", 2, 20, 12, 12, 50, 5, 5, 1, 0};
  auto exact = gpu_backend(ConvContract::fp32_exact, dp::ConvChoice::heuristic);
  auto plan = exact->plan_conv(cs.geometry(Layout::nchw));
  const dp::ConvAlgorithm before = dp::cuda_conv_choice(*exact, *plan, ConvDirection::forward, 2);
  // The H100 run's case: WINOGRAD_NONFUSED with FMA math, picked by timing.
  CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(
                        *exact, *plan, {ConvDirection::forward, 2, 7, dp::ConvMath::fma, 0, true}),
                    Catch::Contains("fp32-exact") && Catch::Contains("WINOGRAD_NONFUSED"));
  CHECK_THROWS_WITH(
      dp::cuda_use_conv_algorithm(
          *exact, *plan, {ConvDirection::forward, 2, 1, dp::ConvMath::default_math, 0, true}),
      Catch::Contains("FMA math only"));
  CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(*exact, *plan,
                                                {ConvDirection::backward_filter, 2, 2,
                                                 dp::ConvMath::fma, 0, true}),
                    Catch::Contains("an FFT"));
  // A refusal changes nothing.
  const dp::ConvAlgorithm after = dp::cuda_conv_choice(*exact, *plan, ConvDirection::forward, 2);
  CHECK(after.algo == before.algo);
  CHECK(after.math == before.math);
  // No contract down-converts to fp16.
  auto tf32 = gpu_backend(ConvContract::tf32, dp::ConvChoice::heuristic);
  auto tf32_plan = tf32->plan_conv(cs.geometry(Layout::nchw));
  CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(*tf32, *tf32_plan,
                                                {ConvDirection::forward, 2, 1,
                                                 dp::ConvMath::tensor_op_allow_conversion, 0, true}),
                    Catch::Contains("fp16"));
  // And the CPU backend has no cuDNN algorithms.
  auto& cpu = *cudatest::backends().cpu;
  auto cpu_plan = cpu.plan_conv(cs.geometry(Layout::nchw));
  CHECK_THROWS_WITH(dp::cuda_conv_algorithms(cpu, *cpu_plan, ConvDirection::forward, 2),
                    Catch::Contains("cuDNN"));
}

TEST_CASE("cuda conv: the default GPU path (TF32, batch 256 and 512, heuristic and measured) "
          "stays inside the contract",
          "[cuda][algorithms]") {
  for (const dp::ConvChoice choice : {dp::ConvChoice::heuristic, dp::ConvChoice::measured}) {
    auto gpu = gpu_backend(ConvContract::tf32, choice);
    for (int64_t n : {256, 512}) {
      for (const ConvShape& cs : model_shapes(n)) {
        const Reference ref = cpu_reference(cs, cpu_oracle(ConvContract::tf32));
        for (Layout layout : {Layout::nchw, Layout::nhwc}) {
          auto plan = gpu->plan_conv(cs.geometry(layout));
          for (ConvDirection d : kDirections) {
            const dp::ConvAlgorithm a = dp::cuda_conv_choice(*gpu, *plan, d, n);
            INFO(cs.what << " " << cs.geometry(layout).str() << ", " << dp::conv_choice_name(choice)
                         << ": " << a.str());
            CHECK(dp::conv_contract_allows(ConvContract::tf32, d, a.algo, a.math));
            int64_t outside = 0;
            const double used = worst_fraction(
                run_direction(*gpu, *plan, d, cs, layout, ref), expected_of(ref, d),
                magnitude_of(ref, d), ConvContract::tf32, dp::conv_family(d, a.algo),
                sum_length(cs, d), &outside);
            INFO(outside << " outputs outside the bound; worst at " << used << " of it");
            CHECK(outside == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda conv: timing the algorithms at setup takes only the workspace they need",
          "[cuda][algorithms]") {
  // A measured choice times cuDNN's algorithms in a workspace as large as the most that an
  // algorithm the contract allows needs here (as PyTorch's benchmark mode sizes it), not in the
  // whole 256 MiB limit: the backend's peak, recorded with each trial, would otherwise show
  // 256 MiB for a layer of kilobytes. A shape no other test measures, so its choices are not in
  // this run's cache yet and are timed now.
  const ConvShape cs{"7 images, 3->5 3x3 on 11x13", 7, 3, 11, 13, 5, 3, 3, 1, 1};
  for (const ConvContract contract : {ConvContract::fp32_exact, ConvContract::tf32}) {
    INFO(dp::conv_contract_name(contract));
    auto gpu = gpu_backend(contract, dp::ConvChoice::measured);
    const size_t held = gpu->memory_in_use();
    dp::ConvUse use;
    use.planned_workspace = true;  // the chosen algorithms' workspace is the caller's
    auto plan = gpu->plan_conv(cs.geometry(Layout::nchw), use);
    size_t most = 0;
    for (const ConvDirection d : kDirections) {
      for (const dp::ConvAlgorithm& a : dp::cuda_conv_algorithms(*gpu, *plan, d, cs.n))
        most = std::max(most, a.workspace);
    }
    const auto bytes = [](int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); };
    const size_t tensors = bytes(cs.n * cs.c * cs.h * cs.w) + bytes(cs.n * cs.k * cs.h * cs.w) +
                           bytes(cs.k * cs.c * cs.r * cs.s);
    INFO("the timing tensors " << tensors << " bytes, the largest allowed workspace " << most);
    // 1 MiB for the rest the plan reserves (a few KiB here) and allocation rounding.
    CHECK(gpu->peak_memory() - held <= tensors + most + (size_t{1} << 20));
  }
}

TEST_CASE("cuda conv: a measured choice read back from the cache is held to the contract",
          "[cuda][algorithms]") {
  // Batch 4 is planned (and measured) at setup; batch 2 is first met later, so its cache entry
  // can be planted before anything reads it.
  const ConvShape cs{"lenet-like 20->50 5x5", 4, 20, 12, 12, 50, 5, 5, 1, 0};
  auto gpu = gpu_backend(ConvContract::fp32_exact, dp::ConvChoice::measured);
  SECTION("a forbidden entry is refused and the heuristics choose inside the contract") {
    auto plan = gpu->plan_conv(cs.geometry(Layout::nchw));
    const dp::ConvChoiceKey where =
        dp::cuda_conv_choice_key(*gpu, *plan, ConvDirection::forward, 2);
    CHECK_THAT(where.key, Catch::Contains("fp32-exact"));
    dp::ChoiceCache::shared(where.scope).put(where.key, "algo 7 math 3 workspace 0 ms 0.0010");
    const dp::ConvAlgorithm a = dp::cuda_conv_choice(*gpu, *plan, ConvDirection::forward, 2);
    INFO(a.str());
    CHECK(a.algo != 7);
    CHECK(dp::conv_contract_allows(ConvContract::fp32_exact, ConvDirection::forward, a.algo,
                                   a.math));
  }
  SECTION("an allowed entry is what runs") {
    dp::ConvGeometry g = cs.geometry(Layout::nhwc);  // another key than the section above
    auto plan = gpu->plan_conv(g);
    const dp::ConvChoiceKey where =
        dp::cuda_conv_choice_key(*gpu, *plan, ConvDirection::forward, 2);
    // IMPLICIT_GEMM with FMA math runs every shape and is rarely the fastest.
    dp::ChoiceCache::shared(where.scope).put(where.key, "algo 0 math 3 workspace 0 ms 0.0010");
    const dp::ConvAlgorithm a = dp::cuda_conv_choice(*gpu, *plan, ConvDirection::forward, 2);
    INFO(a.str());
    CHECK(a.algo == 0);
    CHECK(a.math == dp::ConvMath::fma);
  }
}

TEST_CASE(
    "cuda conv: dprun's own 1x1 forward takes part in the measured choice where it "
    "computes the layer and nowhere else",
    "[cuda][algorithms]") {
  auto gpu = gpu_backend(ConvContract::fp32_exact, dp::ConvChoice::measured);
  // Batch 2 is first met after setup (batch 4), so its cache entry can be planted first.
  const ConvShape one{"1x1 stride 2", 4, 8, 8, 8, 16, 1, 1, 2, 0};
  const ConvShape three{"3x3", 4, 8, 8, 8, 16, 3, 3, 1, 1};
  const auto plant = [&](dp::ConvPlan& plan) {
    const dp::ConvChoiceKey where = dp::cuda_conv_choice_key(*gpu, plan, ConvDirection::forward, 2);
    dp::ChoiceCache::shared(where.scope)
        .put(where.key,
             "algo " + std::to_string(dp::kConvAlgoDprunGemm1x1) + " math 3 workspace 0 ms 0.0010");
    return where.key;
  };
  SECTION("an NHWC 1x1 layer: its key says the GEMM was timed too, and a choice of it runs it") {
    auto plan = gpu->plan_conv(one.geometry(Layout::nhwc));
    CHECK_THAT(plant(*plan), Catch::EndsWith(" with dprun-gemm-1x1"));
    const dp::ConvAlgorithm a = dp::cuda_conv_choice(*gpu, *plan, ConvDirection::forward, 2);
    INFO(a.str());
    CHECK(a.algo == dp::kConvAlgoDprunGemm1x1);
    CHECK(a.math == dp::ConvMath::fma);
    CHECK_THAT(plan->implementation(), Catch::Contains("batch 2 forward: dprun's DPRUN_GEMM_1X1"));
    ConvShape two = one;
    two.n = 2;
    const Reference ref = cpu_reference(two, cpu_oracle(ConvContract::fp32_exact));
    int64_t outside = 0;
    worst_fraction(run_direction(*gpu, *plan, ConvDirection::forward, two, Layout::nhwc, ref),
                   ref.y, ref.my, ConvContract::fp32_exact, dp::ConvFamily::gemm,
                   sum_length(two, ConvDirection::forward), &outside);
    CHECK(outside == 0);
    // Its math is the cuBLAS handle's: TF32 where the contract allows it, and no other.
    auto tf32_gpu = gpu_backend(ConvContract::tf32, dp::ConvChoice::heuristic);
    auto tf32_plan = tf32_gpu->plan_conv(one.geometry(Layout::nhwc));
    std::optional<dp::ConvAlgorithm> listed;
    for (const dp::ConvAlgorithm& b :
         dp::cuda_conv_algorithms(*tf32_gpu, *tf32_plan, ConvDirection::forward, 4))
      if (b.algo == dp::kConvAlgoDprunGemm1x1) listed = b;
    REQUIRE(listed);
    CHECK(listed->math == dp::ConvMath::default_math);
    listed->math = dp::ConvMath::fma;
    CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(*tf32_gpu, *tf32_plan, *listed),
                      Catch::Contains("runs with the cuBLAS handle's default math"));
  }
  SECTION("a layer it does not compute: never listed, a planted choice of it refused") {
    for (const auto& [cs, layout] :
         {std::pair{three, Layout::nhwc}, std::pair{one, Layout::nchw}}) {
      auto plan = gpu->plan_conv(cs.geometry(layout));
      INFO(cs.what << " " << dp::layout_name(layout));
      CHECK_THAT(plant(*plan), !Catch::Contains("dprun-gemm-1x1"));
      for (const dp::ConvAlgorithm& a :
           dp::cuda_conv_algorithms(*gpu, *plan, ConvDirection::forward, 4))
        CHECK(a.algo != dp::kConvAlgoDprunGemm1x1);
      const dp::ConvAlgorithm a = dp::cuda_conv_choice(*gpu, *plan, ConvDirection::forward, 2);
      CHECK(a.algo != dp::kConvAlgoDprunGemm1x1);
      dp::ConvAlgorithm own = a;
      own.algo = dp::kConvAlgoDprunGemm1x1;
      CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(*gpu, *plan, own),
                        Catch::Contains("computes NHWC 1x1 convolutions without padding"));
    }
  }
}

TEST_CASE("cuda conv: dprun's 1x1 forward at stride 1 and with a bias stays inside the contract",
          "[cuda][algorithms]") {
  // Stride 1 reads x itself (no gather) unless it rounds (bf16); C = 6 takes the gather's
  // scalar path.
  const ConvShape cs{"1x1 stride 1, C 6", 3, 6, 5, 7, 10, 1, 1, 1, 0};
  check_every_algorithm(cs);
  check_every_algorithm(cs, {ConvContract::bf16});
  // The bias joins the GEMM's fp32 sum (and in bf16 before the one rounding) as after cuDNN.
  for (const ConvContract contract :
       {ConvContract::fp32_exact, ConvContract::tf32, ConvContract::bf16}) {
    for (const ConvShape& shape : {cs, ConvShape{"1x1 stride 2", 5, 8, 8, 8, 16, 1, 1, 2, 0}}) {
      INFO(shape.what << ", " << dp::conv_contract_name(contract));
      const Reference ref = cpu_reference(shape, cpu_oracle(contract));
      auto gpu = gpu_backend(contract, dp::ConvChoice::heuristic);
      dp::ConvUse use;
      use.forward_bias = true;
      auto plan = gpu->plan_conv(shape.geometry(Layout::nhwc), use);
      std::optional<dp::ConvAlgorithm> own;
      for (const dp::ConvAlgorithm& a :
           dp::cuda_conv_algorithms(*gpu, *plan, ConvDirection::forward, shape.n))
        if (a.algo == dp::kConvAlgoDprunGemm1x1) own = a;
      REQUIRE(own);
      dp::cuda_use_conv_algorithm(*gpu, *plan, *own);
      const int64_t p = shape.geometry(Layout::nhwc).out_h(),
                    q = shape.geometry(Layout::nhwc).out_w();
      std::vector<float> bias(static_cast<size_t>(shape.k));
      for (size_t k = 0; k < bias.size(); ++k) bias[k] = 0.25f * static_cast<float>(k) - 1.0f;
      dptest::DeviceBuffer x(*gpu, {shape.n, shape.c, shape.h, shape.w}, dp::DType::f32,
                             Layout::nhwc);
      dptest::DeviceBuffer w(*gpu, {shape.k, shape.c, 1, 1});
      dptest::DeviceBuffer b(*gpu, {shape.k});
      dptest::DeviceBuffer y(*gpu, {shape.n, shape.k, p, q}, dp::DType::f32, Layout::nhwc);
      x.upload(dptest::to_nhwc(ref.x, shape.n, shape.c, shape.h, shape.w));
      w.upload(ref.w);
      b.upload(bias);
      const dp::Tensor bt = b.tensor();
      gpu->conv_forward(*plan, x.tensor(), w.tensor(), &bt, y.tensor());
      const std::vector<float> actual = dptest::to_nchw(y.download_f32(), shape.n, shape.k, p, q);
      // The CPU's forward with the same bias (in bf16 its one rounding after the bias too).
      dp::Backend& cpu = cpu_oracle(contract);
      auto cpu_plan = cpu.plan_conv(shape.geometry(Layout::nchw), use);
      dptest::DeviceBuffer cx(cpu, {shape.n, shape.c, shape.h, shape.w});
      dptest::DeviceBuffer cw(cpu, {shape.k, shape.c, 1, 1}), cb(cpu, {shape.k});
      dptest::DeviceBuffer cy(cpu, {shape.n, shape.k, p, q});
      cx.upload(ref.x);
      cw.upload(ref.w);
      cb.upload(bias);
      const dp::Tensor cbt = cb.tensor();
      cpu.conv_forward(*cpu_plan, cx.tensor(), cw.tensor(), &cbt, cy.tensor());
      const std::vector<float> expected = cy.download_f32();
      std::vector<float> magnitude = ref.my;
      for (size_t i = 0; i < magnitude.size(); ++i)
        magnitude[i] += std::fabs(bias[(i / static_cast<size_t>(p * q)) % bias.size()]);
      int64_t outside = 0;
      worst_fraction(actual, expected, magnitude, contract, dp::ConvFamily::gemm,
                     sum_length(shape, ConvDirection::forward), &outside);
      CHECK(outside == 0);
    }
  }
}

TEST_CASE("cuda conv: the measured choice keeps the faster of cuDNN's forward and dprun's 1x1 GEMM",
          "[cuda][algorithms]") {
  // On the emulated GPU the timings are set (DPRUN_EMULATED_EVENT_MS against the fake cuDNN's
  // 0.1 ms), so both outcomes are seen; on a GPU whichever is faster there wins, within the
  // contract. Shapes no other test measures: their choices are timed here.
  auto probe = gpu_backend(ConvContract::tf32, dp::ConvChoice::measured);
  const bool emulated = probe->device_description().find("emulated") != std::string::npos;
  for (const auto& [event_ms, n] : {std::pair{"0.5", int64_t{3}}, std::pair{"0.05", int64_t{6}}}) {
    if (emulated) ::setenv("DPRUN_EMULATED_EVENT_MS", event_ms, 1);
    // 8 channels: the GEMM is dprun's only pass here (the few-channel ones take at most 4).
    const ConvShape cs{"1x1 stride 2 on 6x10", n, 8, 6, 10, 8, 1, 1, 2, 0};
    auto gpu = gpu_backend(ConvContract::tf32, dp::ConvChoice::measured);
    auto plan = gpu->plan_conv(cs.geometry(Layout::nhwc));
    const dp::ConvAlgorithm a = dp::cuda_conv_choice(*gpu, *plan, ConvDirection::forward, n);
    INFO(a.str() << (emulated ? std::string(", emulated events read ") + event_ms + " ms" : ""));
    if (emulated) CHECK((a.algo == dp::kConvAlgoDprunGemm1x1) == (std::string(event_ms) == "0.05"));
    CHECK(dp::conv_contract_allows(ConvContract::tf32, ConvDirection::forward, a.algo, a.math));
    const Reference ref = cpu_reference(cs, cpu_oracle(ConvContract::tf32));
    int64_t outside = 0;
    worst_fraction(run_direction(*gpu, *plan, ConvDirection::forward, cs, Layout::nhwc, ref), ref.y,
                   ref.my, ConvContract::tf32, dp::conv_family(ConvDirection::forward, a.algo),
                   sum_length(cs, ConvDirection::forward), &outside);
    CHECK(outside == 0);
  }
  if (emulated) ::unsetenv("DPRUN_EMULATED_EVENT_MS");
}

TEST_CASE(
    "cuda conv: dprun's few-channel passes are listed where they compute the layer and stay "
    "inside every contract",
    "[cuda]") {
  // Not [algorithms]: the emulated GPU runs these kernels of ours for real (only cuDNN's are
  // stand-ins there), so CI runs this. A 1-channel stem (28x28 is the models'; 9x8 keeps the
  // emulator quick) and 3 channels with stride and padding.
  const ConvShape stem{"stem 1->12 3x3", 3, 1, 9, 8, 12, 3, 3, 1, 1};
  const ConvShape rgb{"3->8 3x3 stride 2", 2, 3, 9, 7, 8, 3, 3, 2, 1};
  const auto own_in = [](dp::Backend& gpu, dp::ConvPlan& plan, ConvDirection d, int64_t n) {
    std::optional<dp::ConvAlgorithm> own;
    for (const dp::ConvAlgorithm& a : dp::cuda_conv_algorithms(gpu, plan, d, n))
      if (a.algo == dp::kConvAlgoDprunSmallC) own = a;
    return own;
  };
  for (const ConvContract contract :
       {ConvContract::fp32_exact, ConvContract::tf32, ConvContract::bf16}) {
    auto gpu = gpu_backend(contract, dp::ConvChoice::heuristic);
    for (const ConvShape& cs : {stem, rgb}) {
      INFO(cs.what << ", " << dp::conv_contract_name(contract));
      const Reference ref = cpu_reference(cs, cpu_oracle(contract));
      dp::ConvUse use;
      use.forward_bias = true;
      auto plan = gpu->plan_conv(cs.geometry(Layout::nhwc), use);
      for (const ConvDirection d : {ConvDirection::forward, ConvDirection::backward_filter}) {
        INFO(dp::conv_direction_name(d));
        const std::optional<dp::ConvAlgorithm> own = own_in(*gpu, *plan, d, cs.n);
        REQUIRE(own);
        CHECK(own->math == dp::ConvMath::fma);  // fp32 sums of products, under every contract
        dp::cuda_use_conv_algorithm(*gpu, *plan, *own);
        CHECK_THAT(plan->implementation(),
                   Catch::Contains(std::string(dp::conv_direction_name(d)) +
                                   ": dprun's DPRUN_DIRECT_SMALL_C (direct, few channels)"));
        int64_t outside = 0;
        const std::vector<float> first = run_direction(*gpu, *plan, d, cs, Layout::nhwc, ref);
        worst_fraction(first, expected_of(ref, d), magnitude_of(ref, d), contract,
                       ConvFamily::direct, sum_length(cs, d), &outside,
                       d == ConvDirection::forward);
        CHECK(outside == 0);
        // Deterministic: a fixed order of sums, whatever the GPU schedules first (on the
        // emulated GPU, which runs a block's threads in one order, this cannot fail; on a GPU it
        // can).
        CHECK(run_direction(*gpu, *plan, d, cs, Layout::nhwc, ref) == first);
      }
      if (contract == ConvContract::bf16) {
        // bf16's forward declared without a bias gives cuDNN packed bf16 data; this pass takes
        // the fp32 tensors and rounds as it reads, the same values.
        auto packed = gpu->plan_conv(cs.geometry(Layout::nhwc));
        const std::optional<dp::ConvAlgorithm> own =
            own_in(*gpu, *packed, ConvDirection::forward, cs.n);
        REQUIRE(own);
        dp::cuda_use_conv_algorithm(*gpu, *packed, *own);
        int64_t outside = 0;
        worst_fraction(run_direction(*gpu, *packed, ConvDirection::forward, cs, Layout::nhwc, ref),
                       ref.y, ref.my, contract, ConvFamily::direct,
                       sum_length(cs, ConvDirection::forward), &outside, true);
        CHECK(outside == 0);
      }
      // Its input gradient is cuDNN's: the layer is a model's first, which needs none.
      CHECK_FALSE(own_in(*gpu, *plan, ConvDirection::backward_data, cs.n));

      // The bias joins the forward's fp32 sum before bf16's one rounding, and db sums the dy the
      // pass took (rounded in bf16), as the cpu does.
      const dp::ConvGeometry g = cs.geometry(Layout::nhwc);
      const int64_t p = g.out_h(), q = g.out_w();
      std::vector<float> bias(static_cast<size_t>(cs.k));
      for (size_t k = 0; k < bias.size(); ++k) bias[k] = 0.25f * static_cast<float>(k) - 1.0f;
      dptest::DeviceBuffer x(*gpu, {cs.n, cs.c, cs.h, cs.w}, dp::DType::f32, Layout::nhwc);
      dptest::DeviceBuffer w(*gpu, {cs.k, cs.c, cs.r, cs.s}), b(*gpu, {cs.k}), db(*gpu, {cs.k});
      dptest::DeviceBuffer dw(*gpu, {cs.k, cs.c, cs.r, cs.s});
      dptest::DeviceBuffer y(*gpu, {cs.n, cs.k, p, q}, dp::DType::f32, Layout::nhwc);
      dptest::DeviceBuffer dy(*gpu, {cs.n, cs.k, p, q}, dp::DType::f32, Layout::nhwc);
      x.upload(dptest::to_nhwc(ref.x, cs.n, cs.c, cs.h, cs.w));
      dy.upload(dptest::to_nhwc(ref.dy, cs.n, cs.k, p, q));
      w.upload(ref.w);
      b.upload(bias);
      const dp::Tensor bt = b.tensor(), dbt = db.tensor();
      gpu->conv_forward(*plan, x.tensor(), w.tensor(), &bt, y.tensor());
      gpu->conv_backward_filter(*plan, x.tensor(), dy.tensor(), dw.tensor(), &dbt);
      dp::Backend& cpu = cpu_oracle(contract);
      auto cpu_plan = cpu.plan_conv(cs.geometry(Layout::nchw), use);
      dptest::DeviceBuffer cx(cpu, {cs.n, cs.c, cs.h, cs.w}), cdy(cpu, {cs.n, cs.k, p, q});
      dptest::DeviceBuffer cw(cpu, {cs.k, cs.c, cs.r, cs.s}), cb(cpu, {cs.k}), cdb(cpu, {cs.k});
      dptest::DeviceBuffer cy(cpu, {cs.n, cs.k, p, q}), cdw(cpu, {cs.k, cs.c, cs.r, cs.s});
      cx.upload(ref.x);
      cdy.upload(ref.dy);
      cw.upload(ref.w);
      cb.upload(bias);
      const dp::Tensor cbt = cb.tensor(), cdbt = cdb.tensor();
      cpu.conv_forward(*cpu_plan, cx.tensor(), cw.tensor(), &cbt, cy.tensor());
      cpu.conv_backward_filter(*cpu_plan, cx.tensor(), cdy.tensor(), cdw.tensor(), &cdbt);
      std::vector<float> magnitude = ref.my;
      for (size_t i = 0; i < magnitude.size(); ++i)
        magnitude[i] += std::fabs(bias[(i / static_cast<size_t>(p * q)) % bias.size()]);
      int64_t outside = 0;
      worst_fraction(dptest::to_nchw(y.download_f32(), cs.n, cs.k, p, q), cy.download_f32(),
                     magnitude, contract, ConvFamily::direct,
                     sum_length(cs, ConvDirection::forward), &outside, true);
      CHECK(outside == 0);
      // db: a sum of n * p * q values of dy, |dy| summed as its magnitude.
      std::vector<float> db_magnitude(bias.size(), 0.0f);
      for (size_t i = 0; i < ref.dy.size(); ++i)
        db_magnitude[(i / static_cast<size_t>(p * q)) % bias.size()] += std::fabs(ref.dy[i]);
      worst_fraction(db.download_f32(), cdb.download_f32(), db_magnitude, contract,
                     ConvFamily::direct, sum_length(cs, ConvDirection::backward_filter), &outside);
      CHECK(outside == 0);
    }
    // The measured choice: the key says it took part, and a choice of it read back runs it (batch
    // 2 is first met after setup, so its entry can be planted first).
    {
      auto measured = gpu_backend(contract, dp::ConvChoice::measured);
      auto plan = measured->plan_conv(stem.geometry(Layout::nhwc));
      for (const ConvDirection d : {ConvDirection::forward, ConvDirection::backward_filter}) {
        INFO("measured, " << dp::conv_direction_name(d));
        const dp::ConvChoiceKey where = dp::cuda_conv_choice_key(*measured, *plan, d, 2);
        CHECK_THAT(where.key, Catch::EndsWith(" with dprun-small-c"));
        const size_t ws =
            d == ConvDirection::forward ? 0 : own_in(*measured, *plan, d, 2).value().workspace;
        dp::ChoiceCache::shared(where.scope)
            .put(where.key, "algo " + std::to_string(dp::kConvAlgoDprunSmallC) +
                                " math 3 workspace " + std::to_string(ws) + " ms 0.0010");
        CHECK(dp::cuda_conv_choice(*measured, *plan, d, 2).algo == dp::kConvAlgoDprunSmallC);
      }
      CHECK_THAT(dp::cuda_conv_choice_key(*measured, *plan, ConvDirection::backward_data, 2).key,
                 !Catch::Contains("dprun-small-c"));
    }
    // Where it does not compute the layer: never listed, and refused when asked for.
    const ConvShape five{"5 channels", 2, 5, 6, 6, 8, 3, 3, 1, 1};
    for (const auto& [cs, layout] :
         {std::pair{stem, Layout::nchw}, std::pair{five, Layout::nhwc}}) {
      INFO(cs.what << " " << dp::layout_name(layout));
      auto plan = gpu->plan_conv(cs.geometry(layout));
      for (const ConvDirection d : kDirections) CHECK_FALSE(own_in(*gpu, *plan, d, cs.n));
      dp::ConvAlgorithm asked = dp::cuda_conv_choice(*gpu, *plan, ConvDirection::forward, cs.n);
      asked.algo = dp::kConvAlgoDprunSmallC;
      asked.math = dp::ConvMath::fma;
      CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(*gpu, *plan, asked),
                        Catch::Contains("computes NHWC convolutions of at most 4 input"));
    }
    // Where it does: with FMA math only.
    auto plan = gpu->plan_conv(stem.geometry(Layout::nhwc));
    dp::ConvAlgorithm tensor = own_in(*gpu, *plan, ConvDirection::forward, stem.n).value();
    tensor.math = dp::ConvMath::default_math;
    if (contract != ConvContract::fp32_exact) {  // fp32-exact refuses it before, as any TF32
      CHECK_THROWS_WITH(dp::cuda_use_conv_algorithm(*gpu, *plan, tensor),
                        Catch::Contains("it runs with fma math"));
    }
  }
}
