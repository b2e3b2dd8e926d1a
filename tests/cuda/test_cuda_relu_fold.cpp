// A ReLU fused into a convolution (ConvUse::output_relu, Backend::relu_backward_bias) on every
// algorithm the cuda backend may choose for the pass: cuDNN's, the few-channel direct kernels,
// the 1x1 GEMM, and in bf16 cuDNN's bf16 kernels that round their own output (a plan without a
// bias). Each gives the bits of the plain pass followed by the separate ReLU ops.
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

TEST_CASE("cuda: a fused ReLU gives the separate ReLU's bits on every convolution algorithm",
          "[cuda]") {
  for (const dp::Precision precision : {dp::Precision::fp32, dp::Precision::bf16}) {
    dp::BackendOptions o;
    o.kind = dp::BackendKind::cuda;
    o.precision = precision;
    o.allow_tf32 = false;
    o.conv_choice = dp::ConvChoice::heuristic;  // nothing timed: every algorithm is set below
    auto gpu = dp::create_backend(o);
    dp::Backend& B = *gpu;
    std::vector<ConvCase> cases = cudatest::op_conv_cases();
    cases.push_back({4, 4, 8, 6, 6, 16, 1, 1, 1, 0, true});  // a 1x1 with a bias: the GEMM
    for (const Layout layout : {Layout::nhwc, Layout::nchw}) {
      for (const ConvCase& cc : cases) {
        const dp::ConvGeometry g = cc.geometry(layout);
        INFO(dp::precision_name(precision) << " " << g.str() << " at batch " << cc.n);
        dp::ConvUse use;
        use.forward_bias = cc.bias;
        use.train_batches = {cc.n};
        auto plain = B.plan_conv(g, use);
        use.output_relu = true;
        auto fused = B.plan_conv(g, use);
        const dp::Shape in{cc.n, cc.c, cc.h, cc.w}, out{cc.n, cc.k, g.out_h(), g.out_w()};
        DeviceBuffer x(B, in, DType::f32, layout), w(B, {cc.k, cc.c, cc.r, cc.s}), b(B, {cc.k});
        DeviceBuffer y(B, out, DType::f32, layout), y_plain(B, out, DType::f32, layout);
        DeviceBuffer dy(B, out, DType::f32, layout), dz(B, out, DType::f32, layout);
        DeviceBuffer dz_plain(B, out, DType::f32, layout), dw(B, {cc.k, cc.c, cc.r, cc.s});
        DeviceBuffer db(B, {cc.k}), db_plain(B, {cc.k});
        x.upload(dptest::random_vector(in.numel(), 71));
        w.upload(dptest::random_vector(cc.k * cc.c * cc.r * cc.s, 72, -0.5f, 0.5f));
        b.upload(dptest::random_vector(cc.k, 73));
        dy.upload(dptest::random_vector(out.numel(), 74));
        const dp::Tensor* bias = cc.bias ? b.ptr() : nullptr;
        size_t forward_algorithms = 0;
        for (const dp::ConvAlgorithm& a :
             dp::cuda_conv_algorithms(B, *fused, dp::ConvDirection::forward, cc.n)) {
          if (!a.deterministic) continue;
          INFO("forward " << a.str());
          dp::cuda_use_conv_algorithm(B, *fused, a);
          dp::cuda_use_conv_algorithm(B, *plain, a);
          B.conv_forward(*fused, x.tensor(), w.tensor(), bias, y.tensor());
          B.conv_forward(*plain, x.tensor(), w.tensor(), bias, y_plain.tensor());
          B.relu_forward(y_plain.tensor(), y_plain.tensor());
          DP_CHECK_CLOSE(y.download_f32(), y_plain.download_f32(), 0.0);
          ++forward_algorithms;
        }
        CHECK(forward_algorithms > 0);
        if (!cc.bias) continue;
        // The bias gradient: the masked sum against relu_backward then each filter-gradient
        // algorithm's own db (the few-channel kernels' and cuDNN's paths sum alike).
        B.relu_backward_bias(y.tensor(), dy.tensor(), dz.tensor(), db.tensor());
        B.relu_backward(y.tensor(), dy.tensor(), dz_plain.tensor());
        DP_CHECK_CLOSE(dz.download_f32(), dz_plain.download_f32(), 0.0);
        for (const dp::ConvAlgorithm& a :
             dp::cuda_conv_algorithms(B, *plain, dp::ConvDirection::backward_filter, cc.n)) {
          if (!a.deterministic) continue;
          INFO("backward-filter " << a.str());
          dp::cuda_use_conv_algorithm(B, *plain, a);
          B.conv_backward_filter(*plain, x.tensor(), dz_plain.tensor(), dw.tensor(),
                                 db_plain.ptr());
          DP_CHECK_CLOSE(db.download_f32(), db_plain.download_f32(), 0.0);
        }
      }
    }
  }
}
