#pragma once
// Convolution test helpers shared by the CPU convolution tests (test_cpu_conv.cpp,
// test_cpu_winograd.cpp): a case's geometry, its random data, the naive double-precision
// references of every pass, and a runner of the passes on one backend in either layout.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "dp/backend.hpp"
#include "support/check.hpp"
#include "test_cpu_util.hpp"

namespace cputest {

using dptest::host_tensor;
using dptest::random_vector;

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, k, r, s, sh, sw, ph, pw;
  int64_t max_batch = 0;  // 0: n
  int64_t p() const { return (h + 2 * ph - r) / sh + 1; }
  int64_t q() const { return (w + 2 * pw - s) / sw + 1; }
  dp::ConvGeometry geometry(dp::Layout layout = dp::Layout::nchw) const {
    return dptest::conv_geometry(max_batch ? max_batch : n, c, h, w, k, r, s, sh, sw, ph, pw,
                                 layout);
  }
};

// Random inputs of one case: x (N,C,H,W), w (K,C,R,S) in [-w_range, w_range), b (K) and
// dy (N,K,P,Q), from seeds seed..seed+3.
struct ConvData {
  fvec x, w, b, dy;
};
inline ConvData conv_data(const ConvCase& cc, uint64_t seed, float w_range = 1.0f) {
  return ConvData{random_vector(cc.n * cc.c * cc.h * cc.w, seed),
                  random_vector(cc.k * cc.c * cc.r * cc.s, seed + 1, -w_range, w_range),
                  random_vector(cc.k, seed + 2),
                  random_vector(cc.n * cc.k * cc.p() * cc.q(), seed + 3)};
}

// y[n][k][p][q] = b[k] + sum_{c,r,s} x[n][c][p*sh-ph+r][q*sw-pw+s] * w[k][c][r][s]
inline dvec conv_ref(const ConvCase& cc, const fvec& x, const fvec& w, const fvec* b) {
  const int64_t P = cc.p(), Q = cc.q();
  dvec y(static_cast<size_t>(cc.n * cc.k * P * Q));
  for (int64_t n = 0; n < cc.n; ++n)
    for (int64_t k = 0; k < cc.k; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          double sum = b ? (*b)[static_cast<size_t>(k)] : 0.0;
          for (int64_t c = 0; c < cc.c; ++c)
            for (int64_t r = 0; r < cc.r; ++r)
              for (int64_t s = 0; s < cc.s; ++s) {
                const int64_t ih = p * cc.sh - cc.ph + r, iw = q * cc.sw - cc.pw + s;
                if (ih < 0 || ih >= cc.h || iw < 0 || iw >= cc.w) continue;
                sum += static_cast<double>(
                           x[static_cast<size_t>(((n * cc.c + c) * cc.h + ih) * cc.w + iw)]) *
                       w[static_cast<size_t>(((k * cc.c + c) * cc.r + r) * cc.s + s)];
              }
          y[static_cast<size_t>(((n * cc.k + k) * P + p) * Q + q)] = sum;
        }
  return y;
}

// The adjoints of conv_ref: dx = d(sum y*dy)/dx, dw likewise, db = sum dy.
inline void conv_ref_grads(const ConvCase& cc, const fvec& x, const fvec& w, const fvec& dy,
                           dvec& dx, dvec& dw, dvec& db) {
  const int64_t P = cc.p(), Q = cc.q();
  dx.assign(x.size(), 0.0);
  dw.assign(w.size(), 0.0);
  db.assign(static_cast<size_t>(cc.k), 0.0);
  for (int64_t n = 0; n < cc.n; ++n)
    for (int64_t k = 0; k < cc.k; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          const double g = dy[static_cast<size_t>(((n * cc.k + k) * P + p) * Q + q)];
          db[static_cast<size_t>(k)] += g;
          for (int64_t c = 0; c < cc.c; ++c)
            for (int64_t r = 0; r < cc.r; ++r)
              for (int64_t s = 0; s < cc.s; ++s) {
                const int64_t ih = p * cc.sh - cc.ph + r, iw = q * cc.sw - cc.pw + s;
                if (ih < 0 || ih >= cc.h || iw < 0 || iw >= cc.w) continue;
                const auto xi = static_cast<size_t>(((n * cc.c + c) * cc.h + ih) * cc.w + iw);
                const auto wi = static_cast<size_t>(((k * cc.c + c) * cc.r + r) * cc.s + s);
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
}

// The passes of one case on one backend with activations in `layout`; every array in and out is
// in NCHW order, filters (K, C, R, S) (the conversions are the test's, so the references stay
// NCHW loops; a plan's (K, R, S, C) filters, ConvUse::filter_layout nhwc, are converted too). A
// plan made with ConvUse::planned_workspace gets a workspace of its own per stage, of the bytes it
// asked for, filled with NaNs before every pass: a pass that read its scratch before writing it
// would show in its results. After each workspace come kCanaryFloats more NaNs, which a pass that
// wrote past its workspace would overwrite (tails_intact()).
struct ConvRunner {
  dp::Backend& backend;
  const ConvCase& cc;
  dp::Layout layout;
  std::unique_ptr<dp::ConvPlan> plan;
  dp::Tensor workspaces[2];
  static constexpr int64_t kCanaryFloats = 1024;

  ConvRunner(dp::Backend& b, const ConvCase& c, dp::Layout l, const dp::ConvUse& use = {})
      : backend(b), cc(c), layout(l), plan(b.plan_conv(c.geometry(l), use)) {
    if (!plan->planned_workspace()) return;
    for (const dp::ConvStage stage : {dp::ConvStage::forward, dp::ConvStage::backward}) {
      const size_t bytes = plan->workspace_bytes(stage);
      if (bytes == 0) continue;
      const auto floats = static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float));
      workspaces[static_cast<int>(stage)] =
          dp::Tensor(backend.allocate(static_cast<size_t>(floats + kCanaryFloats) * sizeof(float)),
                     {floats}, dp::DType::f32, backend.device());
    }
  }
  ~ConvRunner() {
    for (const dp::Tensor& w : workspaces) backend.release(w.data);
  }
  ConvRunner(const ConvRunner&) = delete;
  ConvRunner& operator=(const ConvRunner&) = delete;

  /// The workspace of a pass of `stage`, poisoned, and its canary; null for a plan that keeps
  /// its own (or needs none in that stage).
  const dp::Tensor* workspace(dp::ConvStage stage) const {
    const dp::Tensor& w = workspaces[static_cast<int>(stage)];
    if (w.data == nullptr) return nullptr;
    backend.fill(with_canary(w), std::numeric_limits<float>::quiet_NaN());
    return &w;
  }
  /// Whether every workspace's canary still holds its NaNs.
  bool tails_intact() const {
    for (const dp::Tensor& w : workspaces) {
      if (w.data == nullptr) continue;
      std::vector<float> all(static_cast<size_t>(w.numel() + kCanaryFloats));
      backend.download(all.data(), w.data, all.size() * sizeof(float));
      for (size_t i = static_cast<size_t>(w.numel()); i < all.size(); ++i)
        if (!std::isnan(all[i])) return false;
    }
    return true;
  }
  static dp::Tensor with_canary(const dp::Tensor& w) {
    dp::Tensor t = w;
    t.shape = dp::Shape{w.numel() + kCanaryFloats};
    return t;
  }

  dp::Shape xs(int64_t n) const { return {n, cc.c, cc.h, cc.w}; }
  dp::Shape ys(int64_t n) const { return {n, cc.k, cc.p(), cc.q()}; }
  dp::Shape ws() const { return {cc.k, cc.c, cc.r, cc.s}; }
  dp::Layout filters() const { return plan->filter_layout(); }
  /// w (K, C, R, S) in the memory order of the plan's filters.
  fvec in_w(const fvec& w) const { return to_layout(w, filters(), cc.k, cc.c, cc.r, cc.s); }
  fvec in_x(const fvec& v, int64_t n) const { return to_layout(v, layout, n, cc.c, cc.h, cc.w); }
  fvec in_y(const fvec& v, int64_t n) const {
    return to_layout(v, layout, n, cc.k, cc.p(), cc.q());
  }

  fvec forward(const fvec& x, const fvec& w, const fvec* b, int64_t n) const {
    fvec xl = in_x(x, n), wa = in_w(w), y(static_cast<size_t>(n * cc.k * cc.p() * cc.q()), -7.0f);
    fvec ba = b ? *b : fvec();
    const dp::Tensor bt = b ? host_tensor(ba, {cc.k}) : dp::Tensor();
    backend.conv_forward(*plan, host_tensor(xl, xs(n), layout), host_tensor(wa, ws(), filters()),
                         b ? &bt : nullptr, host_tensor(y, ys(n), layout),
                         workspace(dp::ConvStage::forward));
    return from_layout(y, layout, n, cc.k, cc.p(), cc.q());
  }
  fvec forward(const fvec& x, const fvec& w, const fvec* b) const { return forward(x, w, b, cc.n); }

  fvec backward_data(const fvec& dy, const fvec& w) const {
    fvec dyl = in_y(dy, cc.n), wa = in_w(w),
         dx(static_cast<size_t>(cc.n * cc.c * cc.h * cc.w), 5.0f);
    backend.conv_backward_data(*plan, host_tensor(dyl, ys(cc.n), layout),
                               host_tensor(wa, ws(), filters()), host_tensor(dx, xs(cc.n), layout),
                               workspace(dp::ConvStage::backward));
    return from_layout(dx, layout, cc.n, cc.c, cc.h, cc.w);
  }

  // dw, and db unless null; both overwritten.
  void backward_filter(const fvec& x, const fvec& dy, fvec& dw, fvec* db) const {
    fvec xl = in_x(x, cc.n), dyl = in_y(dy, cc.n);
    dw.assign(static_cast<size_t>(cc.k * cc.c * cc.r * cc.s), 5.0f);
    if (db) db->assign(static_cast<size_t>(cc.k), 5.0f);
    const auto dbt = db ? host_tensor(*db, {cc.k}) : dp::Tensor();
    backend.conv_backward_filter(
        *plan, host_tensor(xl, xs(cc.n), layout), host_tensor(dyl, ys(cc.n), layout),
        host_tensor(dw, ws(), filters()), db ? &dbt : nullptr, workspace(dp::ConvStage::backward));
    dw = from_layout(dw, filters(), cc.k, cc.c, cc.r, cc.s);
  }
};

}  // namespace cputest
