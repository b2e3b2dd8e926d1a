// Every op of the CUDA backend against the CPU backend (the reference) on random inputs, several
// shapes including odd sizes, exact fp32 (TF32 off). NHWC runs of the CUDA backend are compared
// with the same CPU (NCHW) results after a host transpose.
//
// Tolerances: |a - b| <= rel * max(|a|, |b|, 1) with rel = 1e-4 unless stated. Both sides
// compute in fp32 with different summation orders (cuDNN/cuBLAS tiles vs. im2col + BLAS). A sum
// of m terms of size <= 1 rounds by about sqrt(m) * 2^-24 of its scale in practice (m * 2^-24 at
// worst); the longest reductions here are the filter gradient of the 28x28 case (m = 3*28*28 =
// 2352) and batch norm over 32*7*7 = 1568 values, i.e. ~3e-6 typical, so 1e-4 catches any real
// error (TF32 alone would be ~1e-3) without failing on rounding.
#include <dlfcn.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.hpp"
#include "dp/augment.hpp"
#include "dp/backend.hpp"
#include "dp/error.hpp"
#include "support/backend_cases.hpp"
#include "support/check.hpp"
#include "support/env_var.hpp"
#include "support/step_cases.hpp"

using cudatest::backends;
using cudatest::to_nchw;
using cudatest::to_nhwc;
using cudatest::Twin;
using dp::DType;
using dp::Layout;

namespace {

constexpr double kRel = 1e-4;

const char* name(Layout l) { return l == Layout::nhwc ? "nhwc" : "nchw"; }

/// A rank-4 activation twin: uploads NCHW host data to the CPU and the GPU's layout to the GPU.
struct Act {
  int64_t n, c, h, w;
  Layout layout;
  Twin t;
  Act(int64_t n_, int64_t c_, int64_t h_, int64_t w_, Layout l)
      : n(n_), c(c_), h(h_), w(w_), layout(l), t({n_, c_, h_, w_}, DType::f32, l) {}
  void set(const std::vector<float>& v) {
    t.cpu.upload(v);
    t.gpu.upload(layout == Layout::nhwc ? to_nhwc(v, n, c, h, w) : v);
  }
  std::vector<float> cpu() const { return t.cpu.download_f32(); }
  /// The GPU result in NCHW order.
  std::vector<float> gpu() const {
    auto v = t.gpu.download_f32();
    return layout == Layout::nhwc ? to_nchw(v, n, c, h, w) : v;
  }
  const dp::Tensor& c_() const { return t.c(); }
  const dp::Tensor& g_() const { return t.g(); }
};

/// A flat twin (parameters, per-channel vectors, matrices).
struct Flat {
  Twin t;
  explicit Flat(dp::Shape s, DType d = DType::f32) : t(s, d) {}
  void set(const std::vector<float>& v) {
    t.cpu.upload(v);
    t.gpu.upload(v);
  }
  void set(const std::vector<int32_t>& v) {
    t.cpu.upload(v);
    t.gpu.upload(v);
  }
  std::vector<float> cpu() const { return t.cpu.download_f32(); }
  std::vector<float> gpu() const { return t.gpu.download_f32(); }
};

// ---- convolution --------------------------------------------------------------------------------

using cudatest::ConvCase;

void check_conv(const ConvCase& cc, Layout layout) {
  auto& B = backends();
  INFO("conv n=" << cc.n << " (plan " << cc.plan_n << ") c=" << cc.c << " " << cc.h << "x" << cc.w
                 << " k=" << cc.k << " " << cc.r << "x" << cc.s << " stride " << cc.stride
                 << " pad " << cc.pad << " bias " << cc.bias << " " << name(layout));
  const dp::ConvGeometry g = cc.geometry(layout);
  auto cpu_plan = B.cpu->plan_conv(cc.geometry());
  auto gpu_plan = B.gpu->plan_conv(g);
  const int64_t p = g.out_h(), q = g.out_w();

  Act x(cc.n, cc.c, cc.h, cc.w, layout), dx(cc.n, cc.c, cc.h, cc.w, layout);
  Act y(cc.n, cc.k, p, q, layout), dy(cc.n, cc.k, p, q, layout);
  Flat w({cc.k, cc.c, cc.r, cc.s}), dw({cc.k, cc.c, cc.r, cc.s}), b({cc.k}), db({cc.k});
  x.set(dptest::random_vector(cc.n * cc.c * cc.h * cc.w, 11));
  w.set(dptest::random_vector(cc.k * cc.c * cc.r * cc.s, 12, -0.5f, 0.5f));
  b.set(dptest::random_vector(cc.k, 13));
  dy.set(dptest::random_vector(cc.n * cc.k * p * q, 14));
  // Stale values in the GPU outputs: every op overwrites (cuDNN beta = 0, bias written).
  for (dptest::DeviceBuffer* t : {&y.t.gpu, &dx.t.gpu, &dw.t.gpu, &db.t.gpu})
    t->upload(std::vector<float>(static_cast<size_t>(t->tensor().numel()), 7.0f));

  const dp::Tensor* bc = cc.bias ? &b.t.c() : nullptr;
  const dp::Tensor* bg = cc.bias ? &b.t.g() : nullptr;
  B.cpu->conv_forward(*cpu_plan, x.c_(), w.t.c(), bc, y.c_());
  B.gpu->conv_forward(*gpu_plan, x.g_(), w.t.g(), bg, y.g_());
  CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);

  B.cpu->conv_backward_data(*cpu_plan, dy.c_(), w.t.c(), dx.c_());
  B.gpu->conv_backward_data(*gpu_plan, dy.g_(), w.t.g(), dx.g_());
  CUDA_CHECK_CLOSE(dx.gpu(), dx.cpu(), kRel);

  const dp::Tensor* dbc = cc.bias ? &db.t.c() : nullptr;
  const dp::Tensor* dbg = cc.bias ? &db.t.g() : nullptr;
  B.cpu->conv_backward_filter(*cpu_plan, x.c_(), dy.c_(), dw.t.c(), dbc);
  B.gpu->conv_backward_filter(*gpu_plan, x.g_(), dy.g_(), dw.t.g(), dbg);
  CUDA_CHECK_CLOSE(dw.gpu(), dw.cpu(), kRel);
  if (cc.bias) CUDA_CHECK_CLOSE(db.gpu(), db.cpu(), kRel);
}

}  // namespace

TEST_CASE("cuda conv forward/backward match the cpu backend", "[cuda]") {
  std::vector<ConvCase> cases = cudatest::op_conv_cases();
  cases.push_back({2, 2, 64, 7, 7, 64, 3, 3, 1, 1, true});  // wide channels

  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    for (const auto& cc : cases) check_conv(cc, layout);
  }
}

// ---- linear -------------------------------------------------------------------------------------

TEST_CASE("cuda linear forward/backward match the cpu backend", "[cuda]") {
  auto& B = backends();
  struct Case {
    int64_t n, in, out;
  };
  for (const Case cc : {Case{7, 33, 5}, Case{256, 800, 128}, Case{1, 3, 2}, Case{65, 128, 10}}) {
    INFO("linear n=" << cc.n << " in=" << cc.in << " out=" << cc.out);
    Flat x({cc.n, cc.in}), w({cc.out, cc.in}), b({cc.out}), y({cc.n, cc.out});
    Flat dy({cc.n, cc.out}), dx({cc.n, cc.in}), dw({cc.out, cc.in}), db({cc.out});
    x.set(dptest::random_vector(cc.n * cc.in, 21));
    w.set(dptest::random_vector(cc.out * cc.in, 22, -0.2f, 0.2f));
    b.set(dptest::random_vector(cc.out, 23));
    dy.set(dptest::random_vector(cc.n * cc.out, 24));
    B.cpu->linear_forward(x.t.c(), w.t.c(), &b.t.c(), y.t.c());
    B.gpu->linear_forward(x.t.g(), w.t.g(), &b.t.g(), y.t.g());
    CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);
    B.cpu->linear_forward(x.t.c(), w.t.c(), nullptr, y.t.c());
    B.gpu->linear_forward(x.t.g(), w.t.g(), nullptr, y.t.g());
    CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);

    B.cpu->linear_backward(x.t.c(), w.t.c(), dy.t.c(), &dx.t.c(), dw.t.c(), &db.t.c());
    B.gpu->linear_backward(x.t.g(), w.t.g(), dy.t.g(), &dx.t.g(), dw.t.g(), &db.t.g());
    CUDA_CHECK_CLOSE(dx.gpu(), dx.cpu(), kRel);
    CUDA_CHECK_CLOSE(dw.gpu(), dw.cpu(), kRel);
    CUDA_CHECK_CLOSE(db.gpu(), db.cpu(), kRel);
    // Without dx and db (the first layer): dw alone, overwritten. Only the GPU copy is poisoned:
    // the CPU copy stays the reference computed above.
    dw.t.gpu.upload(std::vector<float>(static_cast<size_t>(cc.out * cc.in), 7.0f));
    B.gpu->linear_backward(x.t.g(), w.t.g(), dy.t.g(), nullptr, dw.t.g(), nullptr);
    CUDA_CHECK_CLOSE(dw.gpu(), dw.cpu(), kRel);
  }
}

// ---- batch norm
// ---------------------------------------------------------------------------------- Tolerance 1e-4
// as everywhere: the statistics are sums of <= 1568 values per channel, computed in a different
// order (and cuDNN may use a one-pass variance); inputs have a non-zero mean (0.5) to expose a
// naive one-pass variance, whose error would show here.

namespace {
void check_batchnorm(int64_t n, int64_t c, int64_t h, int64_t w, bool rank2, Layout layout) {
  auto& B = backends();
  INFO("batchnorm (" << n << ", " << c << ", " << h << ", " << w << ") rank2 " << rank2 << " "
                     << name(layout));
  const int64_t numel = n * c * h * w;
  auto make = [&]() {
    return rank2 ? std::make_unique<Act>(n, c, 1, 1, Layout::nchw)
                 : std::make_unique<Act>(n, c, h, w, layout);
  };
  // Rank-2 (N, C) inputs use a flat twin viewed as (N, C).
  std::unique_ptr<Flat> x2, y2, dy2, dx2;
  std::unique_ptr<Act> x4, y4, dy4, dx4;
  if (rank2) {
    x2 = std::make_unique<Flat>(dp::Shape{n, c});
    y2 = std::make_unique<Flat>(dp::Shape{n, c});
    dy2 = std::make_unique<Flat>(dp::Shape{n, c});
    dx2 = std::make_unique<Flat>(dp::Shape{n, c});
  } else {
    x4 = make();
    y4 = make();
    dy4 = make();
    dx4 = make();
  }
  auto set = [&](auto& a4, auto& a2, const std::vector<float>& v) {
    if (rank2)
      a2->set(v);
    else
      a4->set(v);
  };
  auto tc = [&](auto& a4, auto& a2) -> const dp::Tensor& { return rank2 ? a2->t.c() : a4->c_(); };
  auto tg = [&](auto& a4, auto& a2) -> const dp::Tensor& { return rank2 ? a2->t.g() : a4->g_(); };
  auto gpu = [&](auto& a4, auto& a2) { return rank2 ? a2->gpu() : a4->gpu(); };
  auto cpu = [&](auto& a4, auto& a2) { return rank2 ? a2->cpu() : a4->cpu(); };

  auto xv = dptest::random_vector(numel, 31, -1.5f, 2.5f);
  set(x4, x2, xv);
  set(dy4, dy2, dptest::random_vector(numel, 32));
  Flat gamma({c}), beta({c}), rmean({c}), rvar({c}), smean({c}), sinv({c}), dgamma({c}), dbeta({c});
  gamma.set(dptest::random_vector(c, 33, 0.5f, 1.5f));
  beta.set(dptest::random_vector(c, 34));
  rmean.set(dptest::random_vector(c, 35));
  rvar.set(dptest::random_vector(c, 36, 0.5f, 1.5f));
  const float momentum = 0.1f, eps = 1e-5f;

  B.cpu->batchnorm_forward_train(tc(x4, x2), gamma.t.c(), beta.t.c(), rmean.t.c(), rvar.t.c(),
                                 momentum, eps, smean.t.c(), sinv.t.c(), tc(y4, y2));
  B.gpu->batchnorm_forward_train(tg(x4, x2), gamma.t.g(), beta.t.g(), rmean.t.g(), rvar.t.g(),
                                 momentum, eps, smean.t.g(), sinv.t.g(), tg(y4, y2));
  CUDA_CHECK_CLOSE(gpu(y4, y2), cpu(y4, y2), kRel);
  CUDA_CHECK_CLOSE(rmean.gpu(), rmean.cpu(), kRel);
  CUDA_CHECK_CLOSE(rvar.gpu(), rvar.cpu(), kRel);
  CUDA_CHECK_CLOSE(smean.gpu(), smean.cpu(), kRel);
  CUDA_CHECK_CLOSE(sinv.gpu(), sinv.cpu(), kRel);

  B.cpu->batchnorm_backward(tc(x4, x2), tc(dy4, dy2), gamma.t.c(), smean.t.c(), sinv.t.c(), eps,
                            tc(dx4, dx2), dgamma.t.c(), dbeta.t.c());
  B.gpu->batchnorm_backward(tg(x4, x2), tg(dy4, dy2), gamma.t.g(), smean.t.g(), sinv.t.g(), eps,
                            tg(dx4, dx2), dgamma.t.g(), dbeta.t.g());
  CUDA_CHECK_CLOSE(gpu(dx4, dx2), cpu(dx4, dx2), kRel);
  CUDA_CHECK_CLOSE(dgamma.gpu(), dgamma.cpu(), kRel);
  CUDA_CHECK_CLOSE(dbeta.gpu(), dbeta.cpu(), kRel);

  // The pieces of synchronised batch norm (one replica: count = this batch's values).
  const int64_t count = n * (rank2 ? 1 : h * w);
  Flat sums({c}), mean({c}), var({c}), bsums({2 * c}), rm2({c}), rv2({c}), sm2({c}), si2({c});
  B.cpu->batchnorm_sums(tc(x4, x2), nullptr, sums.t.c());
  B.gpu->batchnorm_sums(tg(x4, x2), nullptr, sums.t.g());
  CUDA_CHECK_CLOSE(sums.gpu(), sums.cpu(), kRel);
  std::vector<float> m = sums.cpu();
  for (auto& v : m) v /= static_cast<float>(count);
  mean.set(m);
  B.cpu->batchnorm_sums(tc(x4, x2), &mean.t.c(), sums.t.c());
  B.gpu->batchnorm_sums(tg(x4, x2), &mean.t.g(), sums.t.g());
  CUDA_CHECK_CLOSE(sums.gpu(), sums.cpu(), kRel);
  std::vector<float> v2 = sums.cpu();
  for (auto& v : v2) v /= static_cast<float>(count);
  var.set(v2);
  rm2.set(dptest::random_vector(c, 35));
  rv2.set(dptest::random_vector(c, 36, 0.5f, 1.5f));
  B.cpu->batchnorm_apply_stats(tc(x4, x2), gamma.t.c(), beta.t.c(), mean.t.c(), var.t.c(),
                               rm2.t.c(), rv2.t.c(), momentum, eps, count, sm2.t.c(), si2.t.c(),
                               tc(y4, y2));
  B.gpu->batchnorm_apply_stats(tg(x4, x2), gamma.t.g(), beta.t.g(), mean.t.g(), var.t.g(),
                               rm2.t.g(), rv2.t.g(), momentum, eps, count, sm2.t.g(), si2.t.g(),
                               tg(y4, y2));
  CUDA_CHECK_CLOSE(gpu(y4, y2), cpu(y4, y2), kRel);
  CUDA_CHECK_CLOSE(rm2.gpu(), rm2.cpu(), kRel);
  CUDA_CHECK_CLOSE(rv2.gpu(), rv2.cpu(), kRel);
  CUDA_CHECK_CLOSE(si2.gpu(), si2.cpu(), kRel);
  B.cpu->batchnorm_backward_sums(tc(x4, x2), tc(dy4, dy2), sm2.t.c(), si2.t.c(), bsums.t.c());
  B.gpu->batchnorm_backward_sums(tg(x4, x2), tg(dy4, dy2), sm2.t.g(), si2.t.g(), bsums.t.g());
  CUDA_CHECK_CLOSE(bsums.gpu(), bsums.cpu(), kRel);
  B.cpu->batchnorm_backward_apply(tc(x4, x2), tc(dy4, dy2), gamma.t.c(), sm2.t.c(), si2.t.c(),
                                  bsums.t.c(), count, tc(dx4, dx2));
  B.gpu->batchnorm_backward_apply(tg(x4, x2), tg(dy4, dy2), gamma.t.g(), sm2.t.g(), si2.t.g(),
                                  bsums.t.g(), count, tg(dx4, dx2));
  CUDA_CHECK_CLOSE(gpu(dx4, dx2), cpu(dx4, dx2), kRel);

  B.cpu->batchnorm_forward_infer(tc(x4, x2), gamma.t.c(), beta.t.c(), rmean.t.c(), rvar.t.c(), eps,
                                 tc(y4, y2));
  B.gpu->batchnorm_forward_infer(tg(x4, x2), gamma.t.g(), beta.t.g(), rmean.t.g(), rvar.t.g(), eps,
                                 tg(y4, y2));
  CUDA_CHECK_CLOSE(gpu(y4, y2), cpu(y4, y2), kRel);
}
}  // namespace

TEST_CASE("cuda batch norm matches the cpu backend", "[cuda]") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    check_batchnorm(4, 3, 5, 5, false, layout);
    check_batchnorm(8, 16, 7, 7, false, layout);
    check_batchnorm(32, 64, 7, 7, false, layout);  // 1568 values per channel
    check_batchnorm(3, 5, 2, 1, false, layout);
  }
  check_batchnorm(6, 10, 1, 1, true, Layout::nchw);  // (N, C), BatchNorm1d-style
}

// The batch norm epilogue (residual add + ReLU, see BnEpilogue): forward, backward, and the
// synchronised pieces, against the CPU backend's fused loops. The backward's ReLU mask is the
// CPU's output on both sides (uploaded to the GPU's y), so a value rounding to either side of 0
// cannot make the masks differ; the forward's outputs differ by rounding only.
namespace {
void check_batchnorm_epilogue(int64_t n, int64_t c, int64_t h, int64_t w, Layout layout,
                              bool residual, bool relu) {
  auto& B = backends();
  INFO("batchnorm epilogue (" << n << ", " << c << ", " << h << ", " << w << ") " << name(layout)
                              << (residual ? " + residual" : "") << (relu ? " + relu" : ""));
  const int64_t numel = n * c * h * w;
  Act x(n, c, h, w, layout), r(n, c, h, w, layout), y(n, c, h, w, layout), dy(n, c, h, w, layout);
  Act dz(n, c, h, w, layout), dx(n, c, h, w, layout);
  x.set(dptest::random_vector(numel, 41, -1.5f, 2.5f));
  r.set(dptest::random_vector(numel, 42));
  dy.set(dptest::random_vector(numel, 43));
  Flat gamma({c}), beta({c}), rmean({c}), rvar({c}), smean({c}), sinv({c}), dgamma({c}), dbeta({c});
  gamma.set(dptest::random_vector(c, 44, 0.5f, 1.5f));
  beta.set(dptest::random_vector(c, 45));
  rmean.set(dptest::random_vector(c, 46));
  rvar.set(dptest::random_vector(c, 47, 0.5f, 1.5f));
  const float momentum = 0.1f, eps = 1e-5f;
  const dp::BnEpilogue ec{residual ? &r.c_() : nullptr, relu};
  const dp::BnEpilogue eg{residual ? &r.g_() : nullptr, relu};
  // Without a ReLU the backward needs nothing of the epilogue (dz is not written).
  const dp::BnEpilogueGrad gc = relu ? dp::BnEpilogueGrad{&y.c_(), &dz.c_()} : dp::BnEpilogueGrad{};
  const dp::BnEpilogueGrad gg = relu ? dp::BnEpilogueGrad{&y.g_(), &dz.g_()} : dp::BnEpilogueGrad{};

  B.cpu->batchnorm_forward_train(x.c_(), gamma.t.c(), beta.t.c(), rmean.t.c(), rvar.t.c(), momentum,
                                 eps, smean.t.c(), sinv.t.c(), y.c_(), ec);
  B.gpu->batchnorm_forward_train(x.g_(), gamma.t.g(), beta.t.g(), rmean.t.g(), rvar.t.g(), momentum,
                                 eps, smean.t.g(), sinv.t.g(), y.g_(), eg);
  CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);
  CUDA_CHECK_CLOSE(rvar.gpu(), rvar.cpu(), kRel);
  y.set(y.cpu());  // one mask for both sides
  B.cpu->batchnorm_backward(x.c_(), dy.c_(), gamma.t.c(), smean.t.c(), sinv.t.c(), eps, dx.c_(),
                            dgamma.t.c(), dbeta.t.c(), gc);
  B.gpu->batchnorm_backward(x.g_(), dy.g_(), gamma.t.g(), smean.t.g(), sinv.t.g(), eps, dx.g_(),
                            dgamma.t.g(), dbeta.t.g(), gg);
  if (relu) CHECK(dz.gpu() == dz.cpu());  // a mask: exact
  CUDA_CHECK_CLOSE(dx.gpu(), dx.cpu(), kRel);
  CUDA_CHECK_CLOSE(dgamma.gpu(), dgamma.cpu(), kRel);
  CUDA_CHECK_CLOSE(dbeta.gpu(), dbeta.cpu(), kRel);

  // Synchronised pieces on one replica, with the statistics the forward saved.
  const int64_t count = n * h * w;
  Flat var({c}), bsums({2 * c}), rm2({c}), rv2({c}), sm2({c}), si2({c});
  std::vector<float> v = sinv.cpu();
  for (auto& e : v) e = 1.0f / (e * e) - eps;
  var.set(v);
  rm2.set(dptest::random_vector(c, 46));
  rv2.set(dptest::random_vector(c, 47, 0.5f, 1.5f));
  B.cpu->batchnorm_apply_stats(x.c_(), gamma.t.c(), beta.t.c(), smean.t.c(), var.t.c(), rm2.t.c(),
                               rv2.t.c(), momentum, eps, count, sm2.t.c(), si2.t.c(), y.c_(), ec);
  smean.set(smean.cpu());
  B.gpu->batchnorm_apply_stats(x.g_(), gamma.t.g(), beta.t.g(), smean.t.g(), var.t.g(), rm2.t.g(),
                               rv2.t.g(), momentum, eps, count, sm2.t.g(), si2.t.g(), y.g_(), eg);
  CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);
  y.set(y.cpu());
  B.cpu->batchnorm_backward_sums(x.c_(), dy.c_(), sm2.t.c(), si2.t.c(), bsums.t.c(), gc);
  B.gpu->batchnorm_backward_sums(x.g_(), dy.g_(), sm2.t.g(), si2.t.g(), bsums.t.g(), gg);
  if (relu) CHECK(dz.gpu() == dz.cpu());
  CUDA_CHECK_CLOSE(bsums.gpu(), bsums.cpu(), kRel);

  B.cpu->batchnorm_forward_infer(x.c_(), gamma.t.c(), beta.t.c(), rmean.t.c(), rvar.t.c(), eps,
                                 y.c_(), ec);
  rmean.set(rmean.cpu());
  rvar.set(rvar.cpu());
  B.gpu->batchnorm_forward_infer(x.g_(), gamma.t.g(), beta.t.g(), rmean.t.g(), rvar.t.g(), eps,
                                 y.g_(), eg);
  CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);
}
}  // namespace

TEST_CASE("cuda batch norm with a fused residual add and ReLU matches the cpu backend", "[cuda]") {
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    // residual + relu, relu only, residual only
    for (const auto& [residual, relu] : {std::pair{true, true}, {false, true}, {true, false}}) {
      check_batchnorm_epilogue(4, 3, 5, 5, layout, residual, relu);
      check_batchnorm_epilogue(32, 64, 7, 7, layout, residual, relu);
    }
  }
}

// ---- pooling ------------------------------------------------------------------------------------

namespace {
struct PoolCase {
  int64_t n, c, h, w, k, stride, pad;
};

void check_pool(const PoolCase& pc, bool max, Layout layout) {
  auto& B = backends();
  INFO((max ? "maxpool" : "avgpool")
       << " (" << pc.n << ", " << pc.c << ", " << pc.h << ", " << pc.w << ") kernel " << pc.k
       << " stride " << pc.stride << " pad " << pc.pad << " " << name(layout));
  dp::PoolGeometry g;
  g.kernel_h = g.kernel_w = pc.k;
  g.stride_h = g.stride_w = pc.stride;
  g.pad_h = g.pad_w = pc.pad;
  const int64_t p = g.out_h(pc.h), q = g.out_w(pc.w);
  Act x(pc.n, pc.c, pc.h, pc.w, layout), dx(pc.n, pc.c, pc.h, pc.w, layout);
  Act y(pc.n, pc.c, p, q, layout), dy(pc.n, pc.c, p, q, layout);
  // Quantised inputs make ties common: the first maximum must win on both backends.
  x.set(cudatest::quantized(pc.n * pc.c * pc.h * pc.w, 41, -1.0f, 1.0f, 0.25f));
  dy.set(dptest::random_vector(pc.n * pc.c * p * q, 42));
  if (max) {
    B.cpu->maxpool_forward(g, x.c_(), y.c_());
    B.gpu->maxpool_forward(g, x.g_(), y.g_());
  } else {
    B.cpu->avgpool_forward(g, x.c_(), y.c_());
    B.gpu->avgpool_forward(g, x.g_(), y.g_());
  }
  CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);
  if (max) {
    B.cpu->maxpool_backward(g, x.c_(), y.c_(), dy.c_(), dx.c_());
    B.gpu->maxpool_backward(g, x.g_(), y.g_(), dy.g_(), dx.g_());
  } else {
    B.cpu->avgpool_backward(g, dy.c_(), dx.c_());
    B.gpu->avgpool_backward(g, dy.g_(), dx.g_());
  }
  CUDA_CHECK_CLOSE(dx.gpu(), dx.cpu(), kRel);
}
}  // namespace

TEST_CASE("cuda channels-last batch norm gives the same bits call after call", "[cuda]") {
  // Its reductions finish in the last block of each channel tile to write its partial sums
  // (bn_nhwc.cu): which block that is changes from call to call on a GPU, what it computes must
  // not (a missing fence or a cached read would show as a stray bit now and then). Shapes of
  // many row groups (392 and 100: the blocks of a tile run at once), the 16-byte and the scalar
  // kernels, called again and again with the same inputs. The emulated GPU runs its blocks one
  // by one (its block-order tests are test_kernels'): two calls of smaller shapes there.
  auto& B = backends();
  const bool emulated = dlsym(RTLD_DEFAULT, "dp_emu_census") != nullptr;
  const int calls = emulated ? 2 : 50;
  struct Case {
    int64_t n, c, h, w;
  };
  for (const Case k : {Case{emulated ? 8 : 64, 64, 28, 28}, Case{emulated ? 4 : 32, 38, 20, 20}}) {
    INFO("N " << k.n << " C " << k.c << " H " << k.h << " W " << k.w << ", " << calls << " calls");
    const int64_t numel = k.n * k.c * k.h * k.w;
    const Layout nhwc = Layout::nhwc;
    Act x(k.n, k.c, k.h, k.w, nhwc), r(k.n, k.c, k.h, k.w, nhwc), y(k.n, k.c, k.h, k.w, nhwc);
    Act dy(k.n, k.c, k.h, k.w, nhwc), dz(k.n, k.c, k.h, k.w, nhwc), dx(k.n, k.c, k.h, k.w, nhwc);
    x.set(dptest::random_vector(numel, 61, -1.5f, 2.5f));
    r.set(dptest::random_vector(numel, 62));
    dy.set(dptest::random_vector(numel, 63));
    Flat gamma({k.c}), beta({k.c}), rmean({k.c}), rvar({k.c}), smean({k.c}), sinv({k.c});
    Flat dgamma({k.c}), dbeta({k.c});
    gamma.set(dptest::random_vector(k.c, 64, 0.5f, 1.5f));
    beta.set(dptest::random_vector(k.c, 65));
    const std::vector<float> rm0 = dptest::random_vector(k.c, 66);
    const std::vector<float> rv0 = dptest::random_vector(k.c, 67, 0.5f, 1.5f);
    const dp::BnEpilogue epilogue{&r.g_(), true};
    const dp::BnEpilogueGrad grad{&y.g_(), &dz.g_()};
    std::vector<std::vector<float>> first;
    for (int call = 0; call < calls; ++call) {
      rmean.set(rm0);
      rvar.set(rv0);
      B.gpu->batchnorm_forward_train(x.g_(), gamma.t.g(), beta.t.g(), rmean.t.g(), rvar.t.g(), 0.1f,
                                     1e-5f, smean.t.g(), sinv.t.g(), y.g_(), epilogue);
      B.gpu->batchnorm_backward(x.g_(), dy.g_(), gamma.t.g(), smean.t.g(), sinv.t.g(), 1e-5f,
                                dx.g_(), dgamma.t.g(), dbeta.t.g(), grad);
      std::vector<std::vector<float>> got = {y.t.gpu.download_f32(),
                                             smean.gpu(),
                                             sinv.gpu(),
                                             rmean.gpu(),
                                             rvar.gpu(),
                                             dx.t.gpu.download_f32(),
                                             dz.t.gpu.download_f32(),
                                             dgamma.gpu(),
                                             dbeta.gpu()};
      if (call == 0) {
        first = std::move(got);
        continue;
      }
      static const char* const names[] = {"y",           "save_mean", "save_invstd", "running_mean",
                                          "running_var", "dx",        "dz",          "dgamma",
                                          "dbeta"};
      for (size_t i = 0; i < got.size(); ++i) {
        size_t differing = 0;
        for (size_t j = 0; j < got[i].size(); ++j) differing += got[i][j] != first[i][j] ? 1 : 0;
        INFO("call " << call << ": " << names[i]);
        CHECK(differing == 0);
      }
    }
  }
}

TEST_CASE("cuda pooling matches the cpu backend (ties: first maximum)", "[cuda]") {
  const std::vector<PoolCase> cases = {
      {3, 4, 8, 8, 2, 2, 0},  // LeNet's 2x2
      {2, 3, 9, 7, 3, 2, 1},  // ResNet-style 3x3 stride 2 pad 1, odd sizes
      {2, 2, 5, 6, 3, 1, 1},  // overlapping windows
      {1, 5, 7, 7, 2, 2, 0},  // odd input: the last row/column is dropped
  };
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    for (const auto& pc : cases) {
      check_pool(pc, false, layout);
      check_pool(pc, true, layout);
    }
  }
}

TEST_CASE("cuda global average pooling matches the cpu backend", "[cuda]") {
  auto& B = backends();
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    for (auto [n, c, h, w] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 5, 7, 7},
                              {2, 512, 4, 4},
                              {4, 3, 1, 1},
                              {1, 33, 28, 28}}) {
      INFO("global avgpool (" << n << ", " << c << ", " << h << ", " << w << ") " << name(layout));
      Act x(n, c, h, w, layout), dx(n, c, h, w, layout);
      Act y(n, c, 1, 1, layout), dy(n, c, 1, 1, layout);
      x.set(dptest::random_vector(n * c * h * w, 51));
      dy.set(dptest::random_vector(n * c, 52));
      B.cpu->global_avgpool_forward(x.c_(), y.c_());
      B.gpu->global_avgpool_forward(x.g_(), y.g_());
      CUDA_CHECK_CLOSE(y.gpu(), y.cpu(), kRel);
      B.cpu->global_avgpool_backward(dy.c_(), dx.c_());
      B.gpu->global_avgpool_backward(dy.g_(), dx.g_());
      CUDA_CHECK_CLOSE(dx.gpu(), dx.cpu(), kRel);
    }
  }
}

// ---- elementwise --------------------------------------------------------------------------------

TEST_CASE("cuda relu, add, scale, fill match the cpu backend", "[cuda]") {
  auto& B = backends();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{65537}}) {
    INFO("n = " << n);
    Flat a({n}), b({n}), y({n}), dy({n}), dx({n});
    a.set(cudatest::quantized(n, 61, -1.0f, 1.0f, 0.125f));  // exact zeros occur
    b.set(dptest::random_vector(n, 62));
    dy.set(dptest::random_vector(n, 63));
    B.cpu->relu_forward(a.t.c(), y.t.c());
    B.gpu->relu_forward(a.t.g(), y.t.g());
    CHECK(y.gpu() == y.cpu());
    B.cpu->relu_backward(y.t.c(), dy.t.c(), dx.t.c());
    B.gpu->relu_backward(y.t.g(), dy.t.g(), dx.t.g());
    CHECK(dx.gpu() == dx.cpu());
    // In place: y aliases x, dx aliases dy.
    B.gpu->relu_backward(y.t.g(), dy.t.g(), dy.t.g());
    CHECK(dy.gpu() == dx.cpu());
    // From here on a is relu(a) on both sides (the CPU in place too), so add and scale below
    // compare like with like.
    B.cpu->relu_forward(a.t.c(), a.t.c());
    B.gpu->relu_forward(a.t.g(), a.t.g());
    CHECK(a.gpu() == y.cpu());
    CHECK(a.cpu() == y.cpu());

    B.cpu->add(a.t.c(), b.t.c(), y.t.c());
    B.gpu->add(a.t.g(), b.t.g(), y.t.g());
    CHECK(y.gpu() == y.cpu());
    B.cpu->add(y.t.c(), b.t.c(), y.t.c());
    B.gpu->add(y.t.g(), b.t.g(), y.t.g());
    CHECK(y.gpu() == y.cpu());
    // y = y + alpha * b: one rounding (fma) on both.
    B.cpu->add(y.t.c(), b.t.c(), y.t.c(), -0.3f);
    B.gpu->add(y.t.g(), b.t.g(), y.t.g(), -0.3f);
    CHECK(y.gpu() == y.cpu());
    B.cpu->scale(y.t.c(), -0.37f);
    B.gpu->scale(y.t.g(), -0.37f);
    CHECK(y.gpu() == y.cpu());
    B.gpu->fill(y.t.g(), 2.5f);
    CHECK(y.gpu() == std::vector<float>(static_cast<size_t>(n), 2.5f));
  }
  dptest::DeviceBuffer ints(*backends().gpu, {17}, DType::i32);
  backends().gpu->fill(ints.tensor(), 3.0f);
  CHECK(ints.download_i32() == std::vector<int32_t>(17, 3));
}

// ---- loss ---------------------------------------------------------------------------------------

TEST_CASE("cuda softmax cross-entropy and count_correct match the cpu backend", "[cuda]") {
  auto& B = backends();
  struct Case {
    int64_t n, k;
    float scale;
  };
  for (const Case cc : {Case{37, 10, 1.0f / 37}, Case{256, 10, 1.0f / 512}, Case{5, 100, 1.0f},
                        Case{1, 2, 0.5f}, Case{2000, 10, 1.0f / 2000}}) {
    INFO("softmax xent n=" << cc.n << " k=" << cc.k);
    Flat logits({cc.n, cc.k}), dlogits({cc.n, cc.k}), labels({cc.n}, DType::i32);
    Flat loss({1}), correct({1}, DType::i32);
    // Quantised logits: ties in the argmax (the first maximum wins).
    logits.set(cudatest::quantized(cc.n * cc.k, 71, -3.0f, 3.0f, 0.5f));
    std::vector<int32_t> lab(static_cast<size_t>(cc.n));
    const auto r = dptest::random_vector(cc.n, 72, 0.0f, static_cast<float>(cc.k));
    for (size_t i = 0; i < lab.size(); ++i)
      lab[i] = std::min<int32_t>(static_cast<int32_t>(r[i]), static_cast<int32_t>(cc.k - 1));
    labels.set(lab);
    // Stale values in the outputs: loss_sum and correct are written, not accumulated.
    loss.set(std::vector<float>{1234.5f});
    correct.set(std::vector<int32_t>{77});
    B.cpu->softmax_cross_entropy(logits.t.c(), labels.t.c(), cc.scale, dlogits.t.c(), loss.t.c(),
                                 correct.t.c());
    B.gpu->softmax_cross_entropy(logits.t.g(), labels.t.g(), cc.scale, dlogits.t.g(), loss.t.g(),
                                 correct.t.g());
    // The gradient is scaled by grad_scale: compare relative to its size.
    auto cmp = dptest::compare(dlogits.gpu(), dlogits.cpu(), kRel, 0.0, cc.scale);
    INFO(cmp.message);
    CHECK(cmp.ok);
    CUDA_CHECK_CLOSE(loss.gpu(), loss.cpu(), kRel);
    const int32_t cpu_correct = correct.t.cpu.download_i32()[0];
    CHECK(correct.t.gpu.download_i32()[0] == cpu_correct);
    correct.set(std::vector<int32_t>{-5});
    B.gpu->count_correct(logits.t.g(), labels.t.g(), correct.t.g());
    CHECK(correct.t.gpu.download_i32()[0] == cpu_correct);
  }
}

// ---- optimizer ----------------------------------------------------------------------------------

TEST_CASE("cuda adamw_update matches the cpu backend (PyTorch semantics)", "[cuda]") {
  auto& B = backends();
  const int64_t n = 10007;
  for (const float wd : {0.0f, 0.05f}) {
    INFO("weight_decay " << wd);
    Flat p({n}), g({n}), m({n}), v({n});
    p.set(dptest::random_vector(n, 91));
    m.set(std::vector<float>(static_cast<size_t>(n), 0.0f));
    v.set(std::vector<float>(static_cast<size_t>(n), 0.0f));
    for (int64_t step = 1; step <= 4; ++step) {
      g.set(dptest::random_vector(n, 92 + static_cast<uint64_t>(step), -2.0f, 2.0f));
      const dp::AdamWParams a{3e-3f, 0.8f, 0.95f, 1e-6f, wd, step};
      B.cpu->adamw_update(p.t.c(), g.t.c(), m.t.c(), v.t.c(), a);
      B.gpu->adamw_update(p.t.g(), g.t.g(), m.t.g(), v.t.g(), a);
    }
    // The same float expressions on both sides; sqrtf vs std::sqrt and FMA contraction differ
    // by an ulp or two per step.
    CUDA_CHECK_CLOSE(p.gpu(), p.cpu(), 1e-6);
    CUDA_CHECK_CLOSE(m.gpu(), m.cpu(), 1e-6);
    CUDA_CHECK_CLOSE(v.gpu(), v.cpu(), 1e-6);
  }
}

TEST_CASE("cuda sgd_update matches the cpu backend (PyTorch semantics)", "[cuda]") {
  auto& B = backends();
  const int64_t n = 10007;
  for (auto sgd : {dp::SgdParams{0.1f, 0.0f, 0.0f}, dp::SgdParams{0.05f, 0.9f, 5e-4f},
                   dp::SgdParams{0.2f, 0.0f, 1e-2f}, dp::SgdParams{0.05f, 0.9f, 1e-3f, true}}) {
    INFO("lr " << sgd.lr << " momentum " << sgd.momentum << " wd " << sgd.weight_decay
               << " nesterov " << sgd.nesterov);
    Flat p({n}), g({n}), buf({n});
    p.set(dptest::random_vector(n, 81));
    buf.set(std::vector<float>(static_cast<size_t>(n), 0.0f));
    for (int step = 0; step < 3; ++step) {
      g.set(dptest::random_vector(n, 82 + static_cast<uint64_t>(step)));
      const dp::Tensor* bc = sgd.momentum != 0.0f ? &buf.t.c() : nullptr;
      const dp::Tensor* bg = sgd.momentum != 0.0f ? &buf.t.g() : nullptr;
      B.cpu->sgd_update(p.t.c(), g.t.c(), bc, sgd);
      B.gpu->sgd_update(p.t.g(), g.t.g(), bg, sgd);
    }
    CUDA_CHECK_CLOSE(p.gpu(), p.cpu(), 1e-6);
    CUDA_CHECK_CLOSE(buf.gpu(), buf.cpu(), 1e-6);
    CHECK(g.gpu() == g.cpu());  // gradients are not modified
  }
}

// ---- data ---------------------------------------------------------------------------------------

TEST_CASE("cuda gather_batch matches the cpu backend in both layouts", "[cuda]") {
  auto& B = backends();
  const int64_t m = 50, c = 1, h = 28, w = 28, n = 13;
  std::vector<uint8_t> images(static_cast<size_t>(m * c * h * w)), labels(static_cast<size_t>(m));
  const auto r = dptest::random_vector(m * c * h * w + m, 91, 0.0f, 256.0f);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(r[i]);
  for (size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<uint8_t>(static_cast<int>(r[images.size() + i]) % 10);
  Twin img({m, c, h, w}, DType::u8), lab({m}, DType::u8);
  for (auto* t : {&img, &lab}) {
    const auto& src = t == &img ? images : labels;
    B.cpu->upload(t->c().data, src.data(), src.size());
    B.gpu->upload(t->g().data, src.data(), src.size());
  }
  std::vector<int32_t> idx = {49, 0, 7, 7, 23, 1, 48, 30, 12, 5, 44, 2, 19};
  Flat indices({n}, DType::i32);
  indices.set(idx);
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    INFO(name(layout));
    Act x(n, c, h, w, layout);
    Flat y({n}, DType::i32);
    B.cpu->gather_batch(img.c(), lab.c(), indices.t.c(), x.c_(), y.t.c());
    B.gpu->gather_batch(img.g(), lab.g(), indices.t.g(), x.g_(), y.t.g());
    CUDA_CHECK_CLOSE(x.gpu(), x.cpu(), 1e-6);
    CHECK(y.t.gpu.download_i32() == y.t.cpu.download_i32());
  }
  // A 3-channel dataset exercises the NHWC index arithmetic with C > 1.
  const int64_t c3 = 3;
  Twin img3({m, c3, 4, 5}, DType::u8);
  std::vector<uint8_t> images3(static_cast<size_t>(m * c3 * 4 * 5));
  for (size_t i = 0; i < images3.size(); ++i) images3[i] = static_cast<uint8_t>(i * 7 % 251);
  B.cpu->upload(img3.c().data, images3.data(), images3.size());
  B.gpu->upload(img3.g().data, images3.data(), images3.size());
  for (Layout layout : {Layout::nchw, Layout::nhwc}) {
    Act x(n, c3, 4, 5, layout);
    Flat y({n}, DType::i32);
    B.cpu->gather_batch(img3.c(), lab.c(), indices.t.c(), x.c_(), y.t.c());
    B.gpu->gather_batch(img3.g(), lab.g(), indices.t.g(), x.g_(), y.t.g());
    CUDA_CHECK_CLOSE(x.gpu(), x.cpu(), 1e-6);
  }
}

TEST_CASE("cuda gather_batch with crop, flip and normalisation equals the cpu's bits", "[cuda]") {
  // Every crop offset (the padding border included) and both flips, read through a StepRow
  // window, in both layouts: the same float operations as the cpu backend, so the same bits.
  auto& B = backends();
  const int64_t m = 9, c = 3, h = 6, w = 5, pad = 2, span = 2 * pad + 1;
  std::vector<uint8_t> images(static_cast<size_t>(m * c * h * w)), labels(static_cast<size_t>(m));
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(1 + i * 37 % 254);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>(i % 10);
  Twin img({m, c, h, w}, DType::u8), lab({m}, DType::u8);
  for (auto* t : {&img, &lab}) {
    const auto& src = t == &img ? images : labels;
    B.cpu->upload(t->c().data, src.data(), src.size());
    B.gpu->upload(t->g().data, src.data(), src.size());
  }
  std::vector<int32_t> idx = {0, 0}, draws = {0, 0};  // the window starts at row 2
  for (int64_t oy = 0; oy < span; ++oy)
    for (int64_t ox = 0; ox < span; ++ox)
      for (int flip = 0; flip < 2; ++flip) {
        idx.push_back(static_cast<int32_t>((oy * 7 + ox * 3 + flip) % m));
        draws.push_back(dp::pack_draw(oy, ox, flip != 0));
      }
  const auto rows = static_cast<int64_t>(idx.size()), n = rows - 2;
  Flat indices({rows}, DType::i32), draw_table({rows}, DType::i32), table({1, 1}, DType::i32),
      cursor({1}, DType::i32);
  indices.set(idx);
  draw_table.set(draws);
  table.set(std::vector<int32_t>{2});
  cursor.set(std::vector<int32_t>{0});
  const dp::StepRow start_c{table.t.c(), cursor.t.c()}, start_g{table.t.g(), cursor.t.g()};
  for (const bool normalise : {false, true}) {
    dp::GatherTransform tc, tg;
    tc.crop_padding = tg.crop_padding = pad;
    tc.draws = &draw_table.t.c();
    tg.draws = &draw_table.t.g();
    if (normalise) {
      tc.mean = tg.mean = {0.4914f, 0.4822f, 0.4465f};
      tc.std = tg.std = {0.2470f, 0.2435f, 0.2616f};
    }
    for (Layout layout : {Layout::nchw, Layout::nhwc}) {
      INFO(name(layout) << (normalise ? ", normalised" : ""));
      Act x(n, c, h, w, layout);
      Flat y({n}, DType::i32);
      B.cpu->gather_batch(img.c(), lab.c(), indices.t.c(), x.c_(), y.t.c(), &start_c, &tc);
      B.gpu->gather_batch(img.g(), lab.g(), indices.t.g(), x.g_(), y.t.g(), &start_g, &tg);
      CHECK(x.gpu() == x.cpu());
      CHECK(y.t.gpu.download_i32() == y.t.cpu.download_i32());
    }
  }
  // A draw outside [0, 2P] marks its example with NaN (a kernel cannot throw).
  draws[2] = dp::pack_draw(2 * pad + 1, 0, false);
  draw_table.set(draws);
  dp::GatherTransform tg;
  tg.crop_padding = pad;
  tg.draws = &draw_table.t.g();
  Act x(n, c, h, w, Layout::nchw);
  Flat y({n}, DType::i32);
  B.gpu->gather_batch(img.g(), lab.g(), indices.t.g(), x.g_(), y.t.g(), &start_g, &tg);
  const auto got = x.gpu();
  CHECK(std::isnan(got[0]));
  CHECK(std::isfinite(got[static_cast<size_t>(c * h * w)]));
}

TEST_CASE("cuda upload_async from page-locked memory, ordered with the stream's ops", "[cuda]") {
  // 12 rounds: more than the backend's ring of events, so reused places are waited on too.
  auto& gpu = *backends().gpu;
  const int64_t n = 1 << 20;
  std::vector<float> expected(static_cast<size_t>(n));
  void* host = gpu.allocate_host(static_cast<size_t>(n) * sizeof(float));
  dptest::DeviceBuffer dst(gpu, {n});
  auto* h = static_cast<float*>(host);
  uint64_t last = 0;
  for (int round = 0; round < 12; ++round) {
    // The fill is queued before the copy: the copy must land after it, whatever the streams.
    gpu.fill(dst.tensor(), -1.0f);
    for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>(round * n + i);
    const uint64_t ticket = gpu.upload_async(dst.tensor().data, host, static_cast<size_t>(n) * 4);
    CHECK(ticket > last);
    last = ticket;
    gpu.await_upload(ticket);
    gpu.scale(dst.tensor(), 2.0f);  // queued after the await: sees the copy
    gpu.wait_upload(ticket);
    for (int64_t i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = 2.0f * h[i];
    CHECK(dst.download_f32() == expected);
  }
  gpu.release_host(host);
}

// ---- memory and errors --------------------------------------------------------------------------

TEST_CASE("cuda memory accounting, copy, upload and download", "[cuda]") {
  auto& gpu = *backends().gpu;
  CHECK(gpu.name() == "cuda");
  CHECK(gpu.device().kind == dp::DeviceKind::cuda);
  CHECK(!gpu.device_description().empty());
  const size_t before = gpu.memory_in_use();
  void* p = gpu.allocate(size_t{3} << 20);
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  CHECK(gpu.memory_in_use() == before + (size_t{3} << 20));
  CHECK(gpu.peak_memory() >= gpu.memory_in_use());
  void* q = gpu.allocate(size_t{3} << 20);
  const auto v = dptest::random_vector(size_t{3} << 18, 99);
  gpu.upload(p, v.data(), v.size() * sizeof(float));
  gpu.copy(q, p, v.size() * sizeof(float));
  std::vector<float> back(v.size());
  gpu.download(back.data(), q, back.size() * sizeof(float));
  CHECK(back == v);
  gpu.release(q);
  gpu.release(p);
  CHECK(gpu.memory_in_use() == before);
}

TEST_CASE("cuda backend refuses exactly what the cpu backend refuses, with the same words",
          "[cuda]") {
  auto& cpu = *backends().cpu;
  auto& gpu = *backends().gpu;
  dptest::BackendCases cpu_cases(cpu), gpu_cases(gpu);
  const auto& expected = cpu_cases.bad_calls();
  const auto& actual = gpu_cases.bad_calls();
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    INFO(actual[i].op << ": " << actual[i].what);
    const std::string on_gpu = dptest::error_of(actual[i].call);
    const std::string on_cpu = dptest::error_of(expected[i].call);
    INFO("cuda: " << on_gpu << "\ncpu:  " << on_cpu);
    REQUIRE(on_gpu.rfind("cuda backend: " + actual[i].op + ": ", 0) == 0);
    REQUIRE(on_cpu.rfind("cpu backend: " + expected[i].op + ": ", 0) == 0);
    // Identical after the prefix, but for the device named in the wrong-device case.
    if (actual[i].what.find("another device") == std::string::npos) {
      CHECK(on_gpu.substr(std::string("cuda").size()) == on_cpu.substr(std::string("cpu").size()));
    }
  }
}

TEST_CASE("cuda backend accepts empty batches as the cpu backend does", "[cuda]") {
  auto& gpu = *backends().gpu;
  dptest::BackendCases cases(gpu);
  for (const auto& [name, values] : cases.run_empty_calls()) {
    INFO(name);
    CHECK(!values.empty());
    for (float v : values) CHECK(v == 0.0f);
  }
}

TEST_CASE(
    "cuda channels-last batch norm grows its scratch on first use, and while a step is being "
    "captured refuses to, naming what to prepare",
    "[cuda]") {
  // Its partial sums and its per-tile counters (bn_nhwc.cu) are the backend's own scratch, sized
  // at prepare_batchnorm; a larger call grows them, but a capture cannot allocate.
  dp::BackendOptions options;
  options.kind = dp::BackendKind::cuda;
  auto gpu = dp::create_backend(options);
  const auto call = [&](int64_t c) {
    dptest::DeviceBuffer x(*gpu, {2, c, 3, 3}, DType::f32, Layout::nhwc);
    dptest::DeviceBuffer y(*gpu, {2, c, 3, 3}, DType::f32, Layout::nhwc);
    x.upload(dptest::random_vector(18 * c, 71));
    dptest::DeviceBuffer gamma(*gpu, {c}), beta(*gpu, {c}), rm(*gpu, {c}), rv(*gpu, {c});
    dptest::DeviceBuffer sm(*gpu, {c}), si(*gpu, {c});
    gamma.upload(std::vector<float>(static_cast<size_t>(c), 1.0f));
    beta.upload(std::vector<float>(static_cast<size_t>(c), 0.0f));
    rm.upload(std::vector<float>(static_cast<size_t>(c), 0.0f));
    rv.upload(std::vector<float>(static_cast<size_t>(c), 1.0f));
    const auto run = [&] {
      gpu->batchnorm_forward_train(x.tensor(), gamma.tensor(), beta.tensor(), rm.tensor(),
                                   rv.tensor(), 0.1f, 1e-5f, sm.tensor(), si.tensor(), y.tensor());
    };
    gpu->begin_capture();
    const std::string refused = dptest::error_of(run);
    gpu->discard_capture();
    CHECK_THAT(refused, Catch::Contains("batchnorm_forward_train: a batch norm of " +
                                        std::to_string(c) + " channels over 18 rows") &&
                            Catch::Contains("while a step is being captured") &&
                            Catch::Contains("prepare_batchnorm"));
    run();  // outside a capture it grows
    const std::vector<float> mean = sm.download_f32();
    CHECK(mean.size() == static_cast<size_t>(c));
  };
  gpu->prepare_batchnorm({2, 8, 3, 3}, Layout::nhwc);
  call(40);  // more channels: a second counter tile and more partial sums
  call(72);  // and again
}

TEST_CASE("cuda backend errors name the device", "[cuda]") {
  dp::BackendOptions bad;
  bad.kind = dp::BackendKind::cuda;
  bad.device_index = 999;
  CHECK_THROWS_WITH(dp::create_backend(bad), Catch::Contains("device 999 does not exist"));
}

TEST_CASE("cuda backend refuses a DPRUN_CUDA_POISON_SCRATCH other than 0 or 1, naming it",
          "[cuda]") {
  dp::BackendOptions options;
  options.kind = dp::BackendKind::cuda;
  const dptest::EnvVar poison("DPRUN_CUDA_POISON_SCRATCH", "yes");
  CHECK_THROWS_WITH(
      dp::create_backend(options),
      Catch::Contains("DPRUN_CUDA_POISON_SCRATCH is 'yes'") && Catch::Contains("use 1"));
}

TEST_CASE("cuda backend refuses a value of its other environment switches, naming both choices",
          "[cuda]") {
  dp::BackendOptions options;
  options.kind = dp::BackendKind::cuda;
  for (const auto& [name, usage] : {std::pair{"DPRUN_CUDNN_CHOICE", "use measured"},
                                    std::pair{"DPRUN_CUDA_NHWC_BN", "use ours"},
                                    std::pair{"DPRUN_CUDA_BF16_CONV_OUTPUT", "use bf16"}}) {
    INFO(name);
    const dptest::EnvVar bad(name, std::string("maybe"));
    CHECK_THROWS_WITH(dp::create_backend(options),
                      Catch::Contains(std::string(name) + " is 'maybe'") && Catch::Contains(usage));
  }
  // Set but empty: the default.
  const dptest::EnvVar empty("DPRUN_CUDA_NHWC_BN", std::string());
  CHECK_NOTHROW(dp::create_backend(options));
}

TEST_CASE("cuda ops reading a step's values at a cursor equal their host-valued twins",
          "[cuda][capture]") {
  // The same kernels with the value read from device memory instead of a kernel argument: the
  // results must be the same bits.
  for (const auto& p : dptest::step_row_pairs(*backends().gpu)) {
    INFO(p.what);
    CHECK(p.got == p.expected);
  }
}

TEST_CASE("cuda graph of a step replayed k times computes the k steps it stands for",
          "[cuda][capture]") {
  size_t ops = 1;
  for (const auto& p : dptest::capture_pairs(*backends().gpu, 5, &ops)) {
    INFO(p.what);
    CHECK(p.got == p.expected);
  }
  CHECK(ops == 0);  // a CUDA graph, not a recording of ops
  // Host work cannot be part of a graph.
  dp::Backend& b = *backends().gpu;
  b.begin_capture();
  const std::string e = dptest::error_of([&] { b.host_work([] {}); });
  b.discard_capture();
  CHECK_THAT(e, Catch::Contains("host work cannot be part of a captured step"));
}
