// A (K, R, S, C) filter (ConvUse::filter_layout nhwc, how an NHWC model's Conv2d stores its
// weight) on every algorithm the cuda backend may choose for each pass: cuDNN's NHWC kernels
// read and write it as it is, the few-channel direct kernels index it in its order, the 1x1
// GEMM reads it as the (K, C) matrix it also is. Each pass gives the bits of the same pass with
// the (K, C, R, S) filter, which the backend transposes for cuDNN: the same values in another
// memory order, so the same arithmetic.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda_test_util.hpp"
#include "dp/backend.hpp"
#include "dp/conv_contract.hpp"
#include "support/check.hpp"

using cudatest::ConvCase;
using dp::DType;
using dp::Layout;
using dptest::DeviceBuffer;

namespace {

/// Every deterministic algorithm cuDNN or dprun offers for `plan` in direction d at batch n.
std::vector<dp::ConvAlgorithm> deterministic(dp::Backend& b, dp::ConvPlan& plan,
                                             dp::ConvDirection d, int64_t n) {
  std::vector<dp::ConvAlgorithm> out;
  for (const dp::ConvAlgorithm& a : dp::cuda_conv_algorithms(b, plan, d, n))
    if (a.deterministic) out.push_back(a);
  return out;
}

}  // namespace

TEST_CASE(
    "cuda: a (K, R, S, C) filter gives the (K, C, R, S) filter's bits on every convolution "
    "algorithm",
    "[cuda]") {
  struct Config {
    dp::Precision precision;
    bool tf32;
  };
  for (const Config config : {Config{dp::Precision::fp32, false}, Config{dp::Precision::fp32, true},
                              Config{dp::Precision::bf16, false}}) {
    dp::BackendOptions o;
    o.kind = dp::BackendKind::cuda;
    o.precision = config.precision;
    o.allow_tf32 = config.tf32;
    o.conv_choice = dp::ConvChoice::heuristic;  // nothing timed: every algorithm is set below
    auto gpu = dp::create_backend(o);
    dp::Backend& B = *gpu;
    std::vector<ConvCase> cases = cudatest::op_conv_cases();
    cases.push_back({4, 4, 8, 6, 6, 16, 1, 1, 1, 0, true});    // a 1x1 with a bias: the GEMM
    cases.push_back({4, 3, 3, 8, 7, 8, 3, 3, 1, 1, true});     // 3 channels: the few-channel passes
    cases.push_back({2, 2, 16, 6, 5, 16, 3, 3, 1, 1, false});  // no bias: bf16's cuDNN forward
    for (const ConvCase& cc : cases) {
      const dp::ConvGeometry g = cc.geometry(Layout::nhwc);
      INFO(dp::precision_name(config.precision)
           << (config.tf32 ? " tf32 " : " ") << g.str() << " at batch " << cc.n);
      dp::ConvUse use;
      use.forward_bias = cc.bias;
      use.train_batches = {cc.n};
      auto kcrs = B.plan_conv(g, use);
      use.filter_layout = Layout::nhwc;
      auto krsc = B.plan_conv(g, use);
      REQUIRE(krsc->filter_layout() == Layout::nhwc);
      const dp::Shape in{cc.n, cc.c, cc.h, cc.w}, out{cc.n, cc.k, g.out_h(), g.out_w()};
      const dp::Shape filter{cc.k, cc.c, cc.r, cc.s};
      DeviceBuffer x(B, in, DType::f32, Layout::nhwc), b(B, {cc.k}), db(B, {cc.k});
      DeviceBuffer dy(B, out, DType::f32, Layout::nhwc);
      DeviceBuffer w(B, filter), w_krsc(B, filter, DType::f32, Layout::nhwc);
      DeviceBuffer dw(B, filter), dw_krsc(B, filter, DType::f32, Layout::nhwc);
      DeviceBuffer y(B, out, DType::f32, Layout::nhwc), y_krsc(B, out, DType::f32, Layout::nhwc);
      DeviceBuffer dx(B, in, DType::f32, Layout::nhwc), dx_krsc(B, in, DType::f32, Layout::nhwc);
      const std::vector<float> w_values = dptest::random_vector(filter.numel(), 82, -0.5f, 0.5f);
      x.upload(dptest::random_vector(in.numel(), 81));
      w.upload(w_values);
      w_krsc.upload(dptest::to_nhwc(w_values, cc.k, cc.c, cc.r, cc.s));
      b.upload(dptest::random_vector(cc.k, 83));
      dy.upload(dptest::random_vector(out.numel(), 84));
      const dp::Tensor* bias = cc.bias ? b.ptr() : nullptr;

      size_t runs = 0;
      for (const dp::ConvAlgorithm& a : deterministic(B, *krsc, dp::ConvDirection::forward, cc.n)) {
        INFO("forward " << a.str());
        dp::cuda_use_conv_algorithm(B, *kcrs, a);
        dp::cuda_use_conv_algorithm(B, *krsc, a);
        B.conv_forward(*kcrs, x.tensor(), w.tensor(), bias, y.tensor());
        B.conv_forward(*krsc, x.tensor(), w_krsc.tensor(), bias, y_krsc.tensor());
        CHECK(y_krsc.download_f32() == y.download_f32());
        ++runs;
      }
      CHECK(runs > 0);
      runs = 0;
      for (const dp::ConvAlgorithm& a :
           deterministic(B, *krsc, dp::ConvDirection::backward_data, cc.n)) {
        INFO("backward-data " << a.str());
        dp::cuda_use_conv_algorithm(B, *kcrs, a);
        dp::cuda_use_conv_algorithm(B, *krsc, a);
        B.conv_backward_data(*kcrs, dy.tensor(), w.tensor(), dx.tensor());
        B.conv_backward_data(*krsc, dy.tensor(), w_krsc.tensor(), dx_krsc.tensor());
        CHECK(dx_krsc.download_f32() == dx.download_f32());
        ++runs;
      }
      CHECK(runs > 0);
      runs = 0;
      for (const dp::ConvAlgorithm& a :
           deterministic(B, *krsc, dp::ConvDirection::backward_filter, cc.n)) {
        INFO("backward-filter " << a.str());
        dp::cuda_use_conv_algorithm(B, *kcrs, a);
        dp::cuda_use_conv_algorithm(B, *krsc, a);
        B.conv_backward_filter(*kcrs, x.tensor(), dy.tensor(), dw.tensor(), db.ptr());
        const std::vector<float> db_kcrs = db.download_f32();
        B.conv_backward_filter(*krsc, x.tensor(), dy.tensor(), dw_krsc.tensor(), db.ptr());
        CHECK(dptest::to_nchw(dw_krsc.download_f32(), cc.k, cc.c, cc.r, cc.s) == dw.download_f32());
        CHECK(db.download_f32() == db_kcrs);
        ++runs;
      }
      CHECK(runs > 0);
    }
  }
}
