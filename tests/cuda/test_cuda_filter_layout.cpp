// A (K, R, S, C) filter (ConvUse::filter_layout nhwc, how an NHWC model's Conv2d stores its
// weight) on every algorithm the cuda backend may choose for each pass: cuDNN's NHWC kernels
// read and write it as it is, the few-channel direct kernels index it in its order, the 1x1
// GEMM reads it as the (K, C) matrix it also is. Each pass gives the bits of the same pass with
// the (K, C, R, S) filter, which the backend transposes for cuDNN: the same values in another
// memory order, so the same arithmetic.
// And a weight's packed bf16 copy (the optimizer's, ParamRegistry::param_bf16), which a pass
// reads where the backend says so and which gives the bits of the pass that rounds the weight.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
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

/// Whether the plan's pass in direction d at batch n, as chosen, is cuDNN's on bf16 data (its
/// implementation(): "batch 2 forward: cuDNN ... bf16 data, ...").
bool cudnn_bf16_pass(const dp::ConvPlan& plan, dp::ConvDirection d, int64_t n) {
  const std::string impl = plan.implementation(),
                    head = "batch " + std::to_string(n) + " " + dp::conv_direction_name(d) + ":";
  size_t at = impl.find(head);
  while (at != std::string::npos && at != 0 && impl.compare(at - 2, 2, "; ") != 0)
    at = impl.find(head, at + 1);  // "batch 3" inside "batch 13"
  REQUIRE(at != std::string::npos);
  const std::string part = impl.substr(at, impl.find(';', at) - at);
  return part.find(": cuDNN ") != std::string::npos && part.find("bf16 data") != std::string::npos;
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

// The packed bf16 copy of a filter (conv_forward's and conv_backward_data's w_bf16, which the
// optimizer's update keeps for a bf16 model): on every algorithm the pass gives the bits it gives
// without it. A copy of another filter proves which passes read it: cuDNN's bf16 passes over a
// filter in the plan's own order (no transpose) give that filter's bits, every other pass (dprun's
// own kernels, a (K, C, R, S) filter of NHWC activations, which is transposed and rounded in one
// pass) ignores it.
TEST_CASE("cuda bf16: a filter's packed copy gives the bits of the pass that rounds the filter",
          "[cuda][bf16]") {
  dp::BackendOptions o;
  o.kind = dp::BackendKind::cuda;
  o.precision = dp::Precision::bf16;
  o.conv_choice = dp::ConvChoice::heuristic;  // nothing timed: every algorithm is set below
  auto gpu = dp::create_backend(o);
  dp::Backend& B = *gpu;
  struct Orders {
    Layout activations, filter;
  };
  std::vector<ConvCase> cases = cudatest::op_conv_cases();
  cases.push_back({2, 2, 16, 6, 5, 16, 3, 3, 1, 1, false});  // no bias: bf16's cuDNN forward
  cases.push_back({4, 3, 3, 8, 7, 8, 3, 3, 1, 1, false});    // 3 channels: the few-channel passes
  size_t read_forward = 0, read_backward = 0;
  for (const Orders orders :
       {Orders{Layout::nchw, Layout::nchw}, Orders{Layout::nhwc, Layout::nhwc},
        Orders{Layout::nhwc, Layout::nchw}}) {
    const bool transposed = orders.activations != orders.filter;
    for (const ConvCase& cc : cases) {
      const dp::ConvGeometry g = cc.geometry(orders.activations);
      INFO(g.str() << " at batch " << cc.n << ", filter " << dp::layout_name(orders.filter));
      dp::ConvUse use;
      use.forward_bias = cc.bias;
      use.train_batches = {cc.n};
      use.filter_layout = orders.filter;
      auto plan = B.plan_conv(g, use);
      const dp::Shape in{cc.n, cc.c, cc.h, cc.w}, out{cc.n, cc.k, g.out_h(), g.out_w()};
      const dp::Shape filter{cc.k, cc.c, cc.r, cc.s};
      const Layout a = orders.activations, f = orders.filter;
      DeviceBuffer x(B, in, DType::f32, a), dy(B, out, DType::f32, a), b(B, {cc.k});
      DeviceBuffer w(B, filter, DType::f32, f), other(B, filter, DType::f32, f);
      DeviceBuffer w16(B, filter, DType::bf16, f), other16(B, filter, DType::bf16, f);
      DeviceBuffer y(B, out, DType::f32, a), dx(B, in, DType::f32, a);
      x.upload(dptest::random_vector(in.numel(), 91));
      dy.upload(dptest::random_vector(out.numel(), 92));
      b.upload(dptest::random_vector(cc.k, 93));
      w.upload(dptest::random_vector(filter.numel(), 94, -0.5f, 0.5f));
      other.upload(dptest::random_vector(filter.numel(), 95, -0.5f, 0.5f));
      B.pack_bf16(w.tensor(), w16.tensor());
      B.pack_bf16(other.tensor(), other16.tensor());
      const dp::Tensor* bias = cc.bias ? b.ptr() : nullptr;

      for (const dp::ConvAlgorithm& alg :
           deterministic(B, *plan, dp::ConvDirection::forward, cc.n)) {
        INFO("forward " << alg.str());
        dp::cuda_use_conv_algorithm(B, *plan, alg);
        const auto pass = [&](const DeviceBuffer& filt, const DeviceBuffer* copy) {
          B.conv_forward(*plan, x.tensor(), filt.tensor(), bias, y.tensor(), nullptr,
                         copy != nullptr ? copy->ptr() : nullptr);
          return y.download_f32();
        };
        const std::vector<float> plain = pass(w, nullptr), of_other = pass(other, nullptr);
        REQUIRE(plain != of_other);
        CHECK(pass(w, &w16) == plain);
        // Read where cuDNN rounds nothing itself: its bf16 pass on a filter in the plan's order.
        const bool reads = !transposed && cudnn_bf16_pass(*plan, dp::ConvDirection::forward, cc.n);
        CHECK(pass(w, &other16) == (reads ? of_other : plain));
        read_forward += reads ? 1 : 0;
      }
      for (const dp::ConvAlgorithm& alg :
           deterministic(B, *plan, dp::ConvDirection::backward_data, cc.n)) {
        INFO("backward-data " << alg.str());
        dp::cuda_use_conv_algorithm(B, *plan, alg);
        const auto pass = [&](const DeviceBuffer& filt, const DeviceBuffer* copy) {
          B.conv_backward_data(*plan, dy.tensor(), filt.tensor(), dx.tensor(), nullptr,
                               copy != nullptr ? copy->ptr() : nullptr);
          return dx.download_f32();
        };
        const std::vector<float> plain = pass(w, nullptr), of_other = pass(other, nullptr);
        REQUIRE(plain != of_other);
        CHECK(pass(w, &w16) == plain);
        const bool reads =
            !transposed && cudnn_bf16_pass(*plan, dp::ConvDirection::backward_data, cc.n);
        CHECK(pass(w, &other16) == (reads ? of_other : plain));
        read_backward += reads ? 1 : 0;
      }
    }
  }
  // cuDNN's bf16 passes read the copy in both directions (forward: the cases without a bias).
  CHECK(read_forward > 0);
  CHECK(read_backward > 0);
}

TEST_CASE("cuda bf16: a linear weight's packed copy gives the bits of the pass that rounds it",
          "[cuda][bf16]") {
  // Read where the backend says so (reads_packed_weights: cuBLAS's bf16 GEMMs); elsewhere
  // (TF32 on the GPU, bf16 on the cpu, whose GEMMs take fp32 operands) it goes unread.
  struct Config {
    dp::BackendKind kind;
    dp::Precision precision;
    bool reads;
  };
  for (const Config c : {Config{dp::BackendKind::cuda, dp::Precision::bf16, true},
                         Config{dp::BackendKind::cuda, dp::Precision::fp32, false},
                         Config{dp::BackendKind::cpu, dp::Precision::bf16, false}}) {
    dp::BackendOptions o;
    o.kind = c.kind;
    o.precision = c.precision;
    o.cpu_threads = 1;
    auto backend = dp::create_backend(o);
    dp::Backend& B = *backend;
    INFO(B.name() << " " << dp::precision_name(c.precision));
    CHECK(B.reads_packed_weights() == c.reads);
    struct Dims {
      int64_t n, in, out;
    };
    for (const Dims d : {Dims{6, 37, 11}, Dims{1, 8, 3}, Dims{32, 400, 120}}) {
      INFO("x (" << d.n << ", " << d.in << "), w (" << d.out << ", " << d.in << ")");
      DeviceBuffer x(B, {d.n, d.in}), w(B, {d.out, d.in}), other(B, {d.out, d.in}), b(B, {d.out});
      DeviceBuffer w16(B, {d.out, d.in}, DType::bf16), other16(B, {d.out, d.in}, DType::bf16);
      DeviceBuffer y(B, {d.n, d.out}), dy(B, {d.n, d.out}), dx(B, {d.n, d.in});
      DeviceBuffer dw(B, {d.out, d.in}), db(B, {d.out});
      x.upload(dptest::random_vector(d.n * d.in, 81));
      w.upload(dptest::random_vector(d.out * d.in, 82, -0.5f, 0.5f));
      other.upload(dptest::random_vector(d.out * d.in, 83, -0.5f, 0.5f));
      b.upload(dptest::random_vector(d.out, 84));
      dy.upload(dptest::random_vector(d.n * d.out, 85));
      B.pack_bf16(w.tensor(), w16.tensor());
      B.pack_bf16(other.tensor(), other16.tensor());
      for (const bool relu : {false, true}) {
        const auto forward = [&](const DeviceBuffer& weight, const DeviceBuffer* copy) {
          B.linear_forward(x.tensor(), weight.tensor(), b.ptr(), y.tensor(), relu,
                           copy != nullptr ? copy->ptr() : nullptr);
          return y.download_f32();
        };
        const std::vector<float> plain = forward(w, nullptr), of_other = forward(other, nullptr);
        REQUIRE(plain != of_other);
        CHECK(forward(w, &w16) == plain);
        CHECK(forward(w, &other16) == (c.reads ? of_other : plain));
      }
      struct Grads {
        std::vector<float> dx, dw, db;
        bool operator==(const Grads&) const = default;
      };
      const auto backward = [&](const DeviceBuffer& weight, const DeviceBuffer* copy) {
        B.linear_backward(x.tensor(), weight.tensor(), dy.tensor(), dx.ptr(), dw.tensor(), db.ptr(),
                          copy != nullptr ? copy->ptr() : nullptr);
        return Grads{dx.download_f32(), dw.download_f32(), db.download_f32()};
      };
      const Grads plain = backward(w, nullptr), of_other = backward(other, nullptr);
      REQUIRE(plain.dx != of_other.dx);
      CHECK(backward(w, &w16) == plain);
      // Only dx reads w: dw and db are the plain pass's whichever copy is given.
      const Grads with_other = backward(w, &other16);
      CHECK(with_other.dx == (c.reads ? of_other.dx : plain.dx));
      CHECK(with_other.dw == plain.dw);
      CHECK(with_other.db == plain.db);
      // Without dx, a copy is not read at all (and needs no room).
      B.linear_backward(x.tensor(), w.tensor(), dy.tensor(), nullptr, dw.tensor(), db.ptr(),
                        other16.ptr());
      CHECK(dw.download_f32() == plain.dw);
    }
  }
}
