// CPU backend ops, part 2: batch norm, elementwise ops, softmax cross-entropy, accuracy, SGD,
// batch gathering, fill, memory accounting and the backend factory.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/random.hpp"
#include "support/check.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;
using dptest::host_tensor;
using dptest::random_vector;

// ---- batch norm --------------------------------------------------------------------------------

namespace {

struct BnCase {
  const char* name;
  dp::Shape shape;  // (N,C,H,W) or (N,C)
  float offset;     // added to x: batch norm must not lose precision to a large mean
  int64_t n() const { return shape[0]; }
  int64_t c() const { return shape[1]; }
  int64_t hw() const { return shape.rank == 4 ? shape[2] * shape[3] : 1; }
};
const std::vector<BnCase> kBnCases = {
    {"odd sizes", dp::Shape{3, 5, 7, 9}, 0.0f},
    {"batch 1", dp::Shape{1, 4, 3, 3}, 0.0f},
    {"(N, C) features", dp::Shape{6, 7}, 0.0f},
    {"large mean", dp::Shape{2, 3, 4, 5}, 20.0f},
    {"37 channels", dp::Shape{2, 37, 3, 2}, 0.0f},
    // NHWC takes channels 1024 at a time (batchnorm_nhwc_cpu.cpp): a second, partial slice.
    {"1030 channels (NHWC: two slices)", dp::Shape{2, 1030, 3, 2}, 0.0f},
};

// Batch norm in `layout` with the test's arrays in NCHW order (rank 2 has one layout only).
struct BnLayout {
  const BnCase& bc;
  dp::Layout layout;
  dp::Layout of_x() const { return bc.shape.rank == 4 ? layout : dp::Layout::nchw; }
  fvec in(const fvec& v) const {
    return bc.shape.rank == 4 ? to_layout(v, layout, bc.n(), bc.c(), bc.shape[2], bc.shape[3]) : v;
  }
  fvec out(const fvec& v) const {
    return bc.shape.rank == 4 ? from_layout(v, layout, bc.n(), bc.c(), bc.shape[2], bc.shape[3])
                              : v;
  }
  dp::Tensor tensor(fvec& v) const { return host_tensor(v, bc.shape, of_x()); }
};

struct BnRef {
  dvec y, mean, invstd, running_mean, running_var;
};

BnRef bn_train_ref(const BnCase& bc, const fvec& x, const fvec& gamma, const fvec& beta,
                   const fvec& rm, const fvec& rv, double momentum, double eps) {
  const int64_t C = bc.c(), HW = bc.hw(), N = bc.n();
  const double m = static_cast<double>(N * HW);
  BnRef out{dvec(x.size()), dvec(C), dvec(C), dvec(C), dvec(C)};
  auto at = [&](int64_t n, int64_t c, int64_t i) {
    return static_cast<size_t>((n * C + c) * HW + i);
  };
  for (int64_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) mean += x[at(n, c, i)] / m;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) var += (x[at(n, c, i)] - mean) * (x[at(n, c, i)] - mean) / m;
    const auto cs = static_cast<size_t>(c);
    out.mean[cs] = mean;
    out.invstd[cs] = 1 / std::sqrt(var + eps);
    out.running_mean[cs] = (1 - momentum) * rm[cs] + momentum * mean;
    out.running_var[cs] = (1 - momentum) * rv[cs] + momentum * var * m / (m - 1);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i)
        out.y[at(n, c, i)] = gamma[cs] * (x[at(n, c, i)] - mean) * out.invstd[cs] + beta[cs];
  }
  return out;
}

}  // namespace

// Batch norm is the backend's own loops in either kernel selection; both layouts are tested.
TEST_CASE("cpu batchnorm training forward, running statistics and backward", "[cpu][ops]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  auto backend = make_cpu();
  const float momentum = 0.1f, eps = 1e-5f;
  for (const BnCase& bc : kBnCases) {
    SECTION(bc.name) {
      const BnLayout lay{bc, layout};
      const int64_t C = bc.c();
      fvec x = random_vector(bc.shape.numel(), 81);
      for (auto& v : x) v += bc.offset;
      fvec gamma = random_vector(C, 82, 0.5f, 1.5f), beta = random_vector(C, 83);
      fvec rm = random_vector(C, 84), rv = random_vector(C, 85, 0.5f, 2.0f);
      fvec r = random_vector(bc.shape.numel(), 86);
      const dp::Shape cs{C};
      fvec save_mean(C), save_invstd(C), y(x.size());
      auto run_forward = [&](const fvec& xi, const fvec& gi, const fvec& bi, fvec& rmean,
                             fvec& rvar, fvec& out) {
        fvec xa = lay.in(xi), ga = gi, ba = bi;
        backend->batchnorm_forward_train(lay.tensor(xa), host_tensor(ga, cs), host_tensor(ba, cs),
                                         host_tensor(rmean, cs), host_tensor(rvar, cs), momentum,
                                         eps, host_tensor(save_mean, cs),
                                         host_tensor(save_invstd, cs), lay.tensor(out));
        out = lay.out(out);
      };
      // Forward and the running statistics over two steps (the second from updated stats).
      fvec rm_run = rm, rv_run = rv;
      BnRef ref = bn_train_ref(bc, x, gamma, beta, rm, rv, momentum, eps);
      run_forward(x, gamma, beta, rm_run, rv_run, y);
      // fp32 output vs double: 1e-5 relative (statistics are accumulated in double).
      check_close(y, ref.y, 1e-5);
      check_close(save_mean, ref.mean, 1e-5);
      check_close(save_invstd, ref.invstd, 1e-5);
      check_close(rm_run, ref.running_mean, 1e-6);
      check_close(rv_run, ref.running_var, 1e-6);
      fvec x2 = random_vector(bc.shape.numel(), 87, -2.0f, 3.0f);
      fvec rm_before = rm_run, rv_before = rv_run;
      BnRef ref2 = bn_train_ref(bc, x2, gamma, beta, rm_before, rv_before, momentum, eps);
      run_forward(x2, gamma, beta, rm_run, rv_run, y);
      check_close(rm_run, ref2.running_mean, 1e-6);
      check_close(rv_run, ref2.running_var, 1e-6);

      // Backward at x, against a double formula and against finite differences.
      run_forward(x, gamma, beta, rm_run, rv_run, y);
      fvec dx(x.size(), 3.0f), dgamma(C, 3.0f), dbeta(C, 3.0f);
      fvec xl = lay.in(x), rl = lay.in(r);
      backend->batchnorm_backward(lay.tensor(xl), lay.tensor(rl), host_tensor(gamma, cs),
                                  host_tensor(save_mean, cs), host_tensor(save_invstd, cs), eps,
                                  lay.tensor(dx), host_tensor(dgamma, cs), host_tensor(dbeta, cs));
      dx = lay.out(dx);
      const int64_t HW = bc.hw(), N = bc.n();
      const double m = static_cast<double>(N * HW);
      dvec dx_ref(x.size()), dgamma_ref(C, 0.0), dbeta_ref(C, 0.0);
      for (int64_t c = 0; c < C; ++c) {
        const auto ci = static_cast<size_t>(c);
        auto at = [&](int64_t n, int64_t i) { return static_cast<size_t>((n * C + c) * HW + i); };
        auto xhat = [&](int64_t n, int64_t i) {
          return (x[at(n, i)] - ref.mean[ci]) * ref.invstd[ci];
        };
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < HW; ++i) {
            dbeta_ref[ci] += r[at(n, i)];
            dgamma_ref[ci] += r[at(n, i)] * xhat(n, i);
          }
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < HW; ++i)
            dx_ref[at(n, i)] = gamma[ci] * ref.invstd[ci] / m *
                               (m * r[at(n, i)] - dbeta_ref[ci] - xhat(n, i) * dgamma_ref[ci]);
      }
      // With a large mean, x - mean in fp32 loses ~offset * 6e-8 / std: 1e-4 covers it.
      check_close(dx, dx_ref, 1e-4);
      check_close(dgamma, dgamma_ref, 1e-4);
      check_close(dbeta, dbeta_ref, 1e-4);
      auto forward = [&](const fvec& xi, const fvec& gi, const fvec& bi) {
        fvec rmean = rm, rvar = rv, out(x.size());
        run_forward(xi, gi, bi, rmean, rvar, out);
        return out;
      };
      // The large-mean case perturbs x by 1e-2 around 20: float rounding of x +- h is ~1e-6,
      // still far below the tolerance.
      check_finite_differences([&](const fvec& v) { return forward(v, gamma, beta); }, x, r, dx);
      check_finite_differences([&](const fvec& v) { return forward(x, v, beta); }, gamma, r,
                               dgamma);
      check_finite_differences([&](const fvec& v) { return forward(x, gamma, v); }, beta, r, dbeta);
    }
  }
}

TEST_CASE("cpu synchronised batch norm: a batch cut into parts equals the whole batch",
          "[cpu][ops]") {
  // The pieces between synchronised BN's allreduces, with the allreduce done here by adding the
  // parts' sums: forward, running statistics and backward must equal batchnorm_forward_train /
  // batchnorm_backward on the whole batch. One part is empty (a replica with no examples). Parts
  // are cut along N, the outermost dimension in both layouts.
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  auto backend = make_cpu();
  const float momentum = 0.1f, eps = 1e-5f;
  for (const BnCase& bc : kBnCases) {
    if (bc.n() < 2) continue;
    SECTION(bc.name) {
      const int64_t C = bc.c(), N = bc.n(), per = bc.shape.numel() / N;
      const dp::Shape cs{C}, cs2{2 * C};
      const dp::Layout lx = bc.shape.rank == 4 ? layout : dp::Layout::nchw;
      fvec x = random_vector(bc.shape.numel(), 91);
      for (auto& v : x) v += bc.offset;
      const fvec dy = random_vector(bc.shape.numel(), 92);
      fvec gamma = random_vector(C, 93, 0.5f, 1.5f), beta = random_vector(C, 94);
      const fvec rm0 = random_vector(C, 95), rv0 = random_vector(C, 96, 0.5f, 2.0f);
      // The whole batch.
      fvec xa = x, dya = dy, rm = rm0, rv = rv0, sm(C), si(C), y(x.size()), dx(x.size());
      fvec dgamma(C), dbeta(C);
      backend->batchnorm_forward_train(host_tensor(xa, bc.shape, lx), host_tensor(gamma, cs),
                                       host_tensor(beta, cs), host_tensor(rm, cs),
                                       host_tensor(rv, cs), momentum, eps, host_tensor(sm, cs),
                                       host_tensor(si, cs), host_tensor(y, bc.shape, lx));
      backend->batchnorm_backward(host_tensor(xa, bc.shape, lx), host_tensor(dya, bc.shape, lx),
                                  host_tensor(gamma, cs), host_tensor(sm, cs), host_tensor(si, cs),
                                  eps, host_tensor(dx, bc.shape, lx), host_tensor(dgamma, cs),
                                  host_tensor(dbeta, cs));
      // Three parts: the first example, none, the rest.
      const std::vector<std::pair<int64_t, int64_t>> parts = {{0, 1}, {1, 0}, {1, N - 1}};
      auto part_shape = [&](int64_t n) {
        dp::Shape s = bc.shape;
        s[0] = n;
        return s;
      };
      auto slice = [&](const fvec& v, int64_t first, int64_t n) {
        return fvec(v.begin() + first * per, v.begin() + (first + n) * per);
      };
      const int64_t count = N * bc.hw();
      fvec total(C, 0.0f), mean(C), var(C, 0.0f);
      for (const auto& [first, n] : parts) {
        fvec xp = slice(x, first, n), sums(C);
        backend->batchnorm_sums(host_tensor(xp, part_shape(n), lx), nullptr, host_tensor(sums, cs));
        for (int64_t c = 0; c < C; ++c) total[c] += sums[c];
      }
      for (int64_t c = 0; c < C; ++c) mean[c] = total[c] / static_cast<float>(count);
      for (const auto& [first, n] : parts) {
        fvec xp = slice(x, first, n), sums(C);
        auto mt = host_tensor(mean, cs);
        backend->batchnorm_sums(host_tensor(xp, part_shape(n), lx), &mt, host_tensor(sums, cs));
        for (int64_t c = 0; c < C; ++c) var[c] += sums[c] / static_cast<float>(count);
      }
      fvec y_parts, dx_parts, bsum(2 * C, 0.0f);
      for (const auto& [first, n] : parts) {
        fvec xp = slice(x, first, n), yp(xp.size()), prm = rm0, prv = rv0, psm(C), psi(C);
        backend->batchnorm_apply_stats(
            host_tensor(xp, part_shape(n), lx), host_tensor(gamma, cs), host_tensor(beta, cs),
            host_tensor(mean, cs), host_tensor(var, cs), host_tensor(prm, cs), host_tensor(prv, cs),
            momentum, eps, count, host_tensor(psm, cs), host_tensor(psi, cs),
            host_tensor(yp, part_shape(n), lx));
        y_parts.insert(y_parts.end(), yp.begin(), yp.end());
        // Every replica keeps the same running statistics, those of the whole batch.
        check_close(prm, to_double(rm), 1e-6);
        check_close(prv, to_double(rv), 1e-5);
        check_close(psi, to_double(si), 1e-5);
        fvec dyp = slice(dy, first, n), sums(2 * C);
        backend->batchnorm_backward_sums(host_tensor(xp, part_shape(n), lx),
                                         host_tensor(dyp, part_shape(n), lx), host_tensor(sm, cs),
                                         host_tensor(si, cs), host_tensor(sums, cs2));
        for (int64_t c = 0; c < 2 * C; ++c) bsum[c] += sums[c];
      }
      check_close(y_parts, to_double(y), 1e-5);
      check_close(fvec(bsum.begin(), bsum.begin() + C), to_double(dbeta), 1e-5);
      check_close(fvec(bsum.begin() + C, bsum.end()), to_double(dgamma), 1e-5);
      for (const auto& [first, n] : parts) {
        fvec xp = slice(x, first, n), dyp = slice(dy, first, n), dxp(xp.size());
        backend->batchnorm_backward_apply(
            host_tensor(xp, part_shape(n), lx), host_tensor(dyp, part_shape(n), lx),
            host_tensor(gamma, cs), host_tensor(sm, cs), host_tensor(si, cs),
            host_tensor(bsum, cs2), count, host_tensor(dxp, part_shape(n), lx));
        dx_parts.insert(dx_parts.end(), dxp.begin(), dxp.end());
      }
      // The same 1e-4 as the backward test above (the large-mean case's fp32 x - mean).
      check_close(dx_parts, to_double(dx), 1e-4);
    }
  }
}

TEST_CASE("cpu batchnorm inference uses the running statistics", "[cpu][ops]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  auto backend = make_cpu();
  for (const BnCase& bc : kBnCases) {
    SECTION(bc.name) {
      const BnLayout lay{bc, layout};
      const int64_t C = bc.c(), HW = bc.hw();
      fvec x = random_vector(bc.shape.numel(), 91);
      fvec gamma = random_vector(C, 92), beta = random_vector(C, 93);
      fvec rm = random_vector(C, 94), rv = random_vector(C, 95, 0.1f, 2.0f);
      fvec y(x.size());
      const dp::Shape cs{C};
      const float eps = 1e-3f;
      fvec xl = lay.in(x);
      backend->batchnorm_forward_infer(lay.tensor(xl), host_tensor(gamma, cs),
                                       host_tensor(beta, cs), host_tensor(rm, cs),
                                       host_tensor(rv, cs), eps, lay.tensor(y));
      y = lay.out(y);
      dvec ref(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const auto c = static_cast<size_t>((static_cast<int64_t>(i) / HW) % C);
        ref[i] = gamma[c] * (x[i] - static_cast<double>(rm[c])) / std::sqrt(rv[c] + double{eps}) +
                 beta[c];
      }
      check_close(y, ref, 1e-5);
    }
  }
}

TEST_CASE("cpu batchnorm rejects a single value per channel", "[cpu][ops]") {
  auto backend = make_cpu();
  fvec x1(3), y1(3), v(3, 1.0f), a(3), b(3), c(3), d(3);
  check_error_mentions(
      [&] {
        backend->batchnorm_forward_train(host_tensor(x1, {1, 3, 1, 1}), host_tensor(v, {3}),
                                         host_tensor(a, {3}), host_tensor(b, {3}),
                                         host_tensor(c, {3}), 0.1f, 1e-5f, host_tensor(d, {3}),
                                         host_tensor(d, {3}), host_tensor(y1, {1, 3, 1, 1}));
      },
      {"batchnorm_forward_train", "more than one value per channel"});
}

// ---- elementwise -------------------------------------------------------------------------------

TEST_CASE("cpu relu forward and backward, in place and in NHWC", "[cpu][ops]") {
  auto backend = make_cpu();
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{40000}}) {  // 40000 takes the threaded path
    INFO("n " << n);
    const dp::Shape s{n, 5, 1, 1};
    fvec x = random_vector(s.numel(), 101), r = random_vector(s.numel(), 102);
    auto forward = [&](const fvec& xi) {
      fvec xa = xi, y(xi.size());
      backend->relu_forward(host_tensor(xa, s), host_tensor(y, s));
      return y;
    };
    fvec y = forward(x);
    dvec y_ref(x.size()), dx_ref(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      y_ref[i] = x[i] > 0 ? x[i] : 0.0;
      dx_ref[i] = x[i] > 0 ? r[i] : 0.0;
    }
    check_close(y, y_ref, 0.0);
    fvec dx(x.size());
    backend->relu_backward(host_tensor(y, s), host_tensor(r, s), host_tensor(dx, s));
    check_close(dx, dx_ref, 0.0);
    if (n < 1000) {
      dptest::GradCheckOptions options = fd_options();
      options.kink = [&](const dvec& xv, int64_t i) {
        return std::abs(xv[static_cast<size_t>(i)]) < 2 * options.step;
      };
      check_finite_differences(forward, x, r, dx, options);
    }
    // In place (y aliases x, dx aliases dy) and in NHWC (elementwise: layout is irrelevant).
    fvec inplace = x, grad = r;
    backend->relu_forward(host_tensor(inplace, s, dp::Layout::nhwc),
                          host_tensor(inplace, s, dp::Layout::nhwc));
    CHECK(inplace == y);
    backend->relu_backward(host_tensor(inplace, s), host_tensor(grad, s), host_tensor(grad, s));
    CHECK(grad == dx);
  }
}

TEST_CASE("cpu add (with aliasing) and scale", "[cpu][ops]") {
  auto backend = make_cpu();
  for (auto layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
    for (int64_t n : {int64_t{7}, int64_t{50001}}) {
      INFO("layout " << dp::layout_name(layout) << " n " << n);
      const dp::Shape s{n, 1, 1, 1};
      const fvec a = random_vector(n, 111), b = random_vector(n, 112);
      dvec sum(static_cast<size_t>(n));
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = double{a[i]} + b[i];
      fvec a1 = a, b1 = b, y(a.size());
      backend->add(host_tensor(a1, s, layout), host_tensor(b1, s, layout),
                   host_tensor(y, s, layout));
      check_close(y, sum, 1e-7);
      fvec a2 = a, b2 = b;  // y aliases a
      backend->add(host_tensor(a2, s, layout), host_tensor(b2, s, layout),
                   host_tensor(a2, s, layout));
      CHECK(a2 == y);
      fvec a3 = a, b3 = b;  // y aliases b
      backend->add(host_tensor(a3, s, layout), host_tensor(b3, s, layout),
                   host_tensor(b3, s, layout));
      CHECK(b3 == y);
      // y = a + alpha * b, rounded once (fma); alpha = 1 is a + b exactly.
      for (float alpha : {-1.0f, 0.1f, 0.0f}) {
        INFO("alpha " << alpha);
        fvec a4 = a, b4 = b, y4(a.size());
        backend->add(host_tensor(a4, s, layout), host_tensor(b4, s, layout),
                     host_tensor(y4, s, layout), alpha);
        for (size_t i = 0; i < y4.size(); ++i)
          CHECK(y4[i] == static_cast<float>(double{a[i]} + double{alpha} * b[i]));
        backend->add(host_tensor(a4, s, layout), host_tensor(b4, s, layout),
                     host_tensor(a4, s, layout), alpha);  // y aliases a
        CHECK(a4 == y4);
      }
      fvec a5 = a, b5 = b;
      backend->add(host_tensor(a5, s, layout), host_tensor(b5, s, layout),
                   host_tensor(a5, s, layout), 1.0f);
      CHECK(a5 == y);
      fvec t = a;
      backend->scale(host_tensor(t, s, layout), -2.5f);
      dvec scaled(a.size());
      for (size_t i = 0; i < a.size(); ++i) scaled[i] = -2.5 * a[i];
      check_close(t, scaled, 1e-7);
    }
  }
  fvec a(4), b(4), y(4);
  check_error_mentions(
      [&] {
        backend->add(host_tensor(a, {1, 4, 1, 1}), host_tensor(b, {1, 4, 1, 1}, dp::Layout::nhwc),
                     host_tensor(y, {1, 4, 1, 1}));
      },
      {"add", "layout"});
  check_error_mentions(
      [&] {
        backend->add(host_tensor(a, {1, 4, 1, 1}), host_tensor(b, {1, 4, 1, 1}),
                     host_tensor(y, {1, 4, 1, 1}), std::numeric_limits<float>::quiet_NaN());
      },
      {"add", "alpha must be finite"});
}

// ---- loss and metrics --------------------------------------------------------------------------

namespace {
struct LossRef {
  double loss = 0;
  int32_t correct = 0;
  dvec dlogits;
};
LossRef softmax_ce_ref(const fvec& logits, const std::vector<int32_t>& labels, int64_t k,
                       double grad_scale) {
  LossRef out;
  out.dlogits.resize(logits.size());
  const auto n = static_cast<int64_t>(labels.size());
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * k;
    double mx = row[0];
    int64_t arg = 0;
    for (int64_t j = 1; j < k; ++j)
      if (row[j] > mx) {
        mx = row[j];
        arg = j;
      }
    double z = 0;
    for (int64_t j = 0; j < k; ++j) z += std::exp(row[j] - mx);
    const int32_t label = labels[static_cast<size_t>(i)];
    out.loss += -(row[label] - mx - std::log(z));
    out.correct += arg == label;
    for (int64_t j = 0; j < k; ++j)
      out.dlogits[static_cast<size_t>(i * k + j)] =
          (std::exp(row[j] - mx) / z - (j == label)) * grad_scale;
  }
  return out;
}
}  // namespace

TEST_CASE("cpu softmax cross-entropy: loss, gradient, correct count", "[cpu][ops]") {
  auto backend = make_cpu();
  struct Case {
    int64_t n, k;
    float scale;  // logits spread
    double grad_scale;
  };
  for (const Case& c : {Case{5, 10, 3.0f, 0.2}, Case{1, 3, 1.0f, 1.0}, Case{7, 4, 2.0f, 0.37},
                        Case{300, 10, 4.0f, 1.0 / 300}, Case{3, 1, 1.0f, 1.0}}) {
    INFO("n " << c.n << " k " << c.k);
    fvec logits = random_vector(c.n * c.k, 121, -c.scale, c.scale);
    std::vector<int32_t> labels(static_cast<size_t>(c.n));
    dp::Rng rng(122);
    for (auto& l : labels) l = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.k)));
    const LossRef ref = softmax_ce_ref(logits, labels, c.k, c.grad_scale);
    fvec dlogits(logits.size(), 8.0f), loss(1, 8.0f);
    std::vector<int32_t> correct(1, -1), counted(1, -1);
    auto run = [&](const fvec& l, fvec& grad, fvec& loss_out) {
      fvec la = l;
      backend->softmax_cross_entropy(
          host_tensor(la, {c.n, c.k}), host_tensor(labels, {c.n}), static_cast<float>(c.grad_scale),
          host_tensor(grad, {c.n, c.k}), host_tensor(loss_out, {1}), host_tensor(correct, {1}));
    };
    run(logits, dlogits, loss);
    // Loss accumulated in double, stored in float: 1e-6 relative; gradient 1e-6 absolute.
    check_close(loss, dvec{ref.loss}, 1e-6);
    check_close(dlogits, ref.dlogits, 1e-6);
    CHECK(correct[0] == ref.correct);
    backend->count_correct(host_tensor(logits, {c.n, c.k}), host_tensor(labels, {c.n}),
                           host_tensor(counted, {1}));
    CHECK(counted[0] == ref.correct);
    if (c.n <= 10) {
      // d(loss_sum * grad_scale)/dlogits = dlogits, by finite differences.
      auto f = [&](const dvec& l) {
        fvec grad(logits.size()), loss_out(1);
        run(to_float(l), grad, loss_out);
        return double{loss_out[0]} * c.grad_scale;
      };
      const auto cmp =
          dptest::check_gradient(f, to_double(logits), to_double(dlogits), fd_options());
      INFO(cmp.message);
      CHECK(cmp.ok);
    }
  }
}

TEST_CASE("cpu softmax cross-entropy is stable for large logits and counts first maxima",
          "[cpu][ops]") {
  auto backend = make_cpu(1);
  // Row 0: huge logits (exp would overflow without the max shift). Rows 1-2: a tie between
  // classes 1 and 2; the first maximum (1) is the prediction.
  fvec logits = {1000.0f, -1000.0f, 999.0f,  //
                 1.0f,    3.0f,     3.0f,    //
                 1.0f,    3.0f,     3.0f};
  std::vector<int32_t> labels = {2, 1, 2}, correct(1), counted(1);
  fvec dlogits(9), loss(1);
  backend->softmax_cross_entropy(host_tensor(logits, {3, 3}), host_tensor(labels, {3}), 1.0f,
                                 host_tensor(dlogits, {3, 3}), host_tensor(loss, {1}),
                                 host_tensor(correct, {1}));
  const LossRef ref = softmax_ce_ref(logits, labels, 3, 1.0);
  REQUIRE(std::isfinite(loss[0]));
  check_close(loss, dvec{ref.loss}, 1e-6);
  check_close(dlogits, ref.dlogits, 1e-6);
  CHECK(correct[0] == 1);  // only row 1 (label 1 = first max)
  backend->count_correct(host_tensor(logits, {3, 3}), host_tensor(labels, {3}),
                         host_tensor(counted, {1}));
  CHECK(counted[0] == 1);
  // A label outside [0, K) is an error that names the example.
  labels[2] = 3;
  check_error_mentions(
      [&] {
        backend->softmax_cross_entropy(host_tensor(logits, {3, 3}), host_tensor(labels, {3}), 1.0f,
                                       host_tensor(dlogits, {3, 3}), host_tensor(loss, {1}),
                                       host_tensor(correct, {1}));
      },
      {"softmax_cross_entropy", "labels[2] = 3"});
}

// ---- optimizer ---------------------------------------------------------------------------------

TEST_CASE("cpu sgd_update follows PyTorch SGD over several steps", "[cpu][ops]") {
  auto backend = make_cpu();
  for (dp::SgdParams p : {dp::SgdParams{0.1f, 0.0f, 0.0f}, dp::SgdParams{0.05f, 0.0f, 0.01f},
                          dp::SgdParams{0.1f, 0.9f, 0.0f}, dp::SgdParams{0.03f, 0.9f, 5e-4f}}) {
    for (int64_t n : {int64_t{1001}, int64_t{70001}}) {
      INFO("lr " << p.lr << " momentum " << p.momentum << " weight_decay " << p.weight_decay
                 << " n " << n);
      fvec params = random_vector(n, 131), buf(static_cast<size_t>(n), 0.0f);
      dvec ref_params(params.begin(), params.end()), ref_buf(static_cast<size_t>(n), 0.0);
      for (uint64_t step = 0; step < 4; ++step) {
        fvec grads = random_vector(n, 200 + step);
        const fvec grads_before = grads;
        auto bt = host_tensor(buf, {n});
        backend->sgd_update(host_tensor(params, {n}), host_tensor(grads, {n}),
                            p.momentum != 0 ? &bt : nullptr, p);
        CHECK(grads == grads_before);  // gradients are read, never modified
        // torch.optim.SGD (no dampening, no nesterov): d = g + wd * p; buf = mu * buf + d
        // (buf = d on the first step, the same as starting from 0); p -= lr * buf.
        for (size_t i = 0; i < ref_params.size(); ++i) {
          double d = grads[i] + double{p.weight_decay} * ref_params[i];
          if (p.momentum != 0) {
            ref_buf[i] = p.momentum * ref_buf[i] + d;
            d = ref_buf[i];
          }
          ref_params[i] -= double{p.lr} * d;
        }
      }
      // fp32 updates vs a double loop over 4 steps: 1e-6 relative.
      check_close(params, ref_params, 1e-6);
      if (p.momentum != 0) check_close(buf, ref_buf, 1e-6);
    }
  }
  fvec params(3), grads(3);
  check_error_mentions(
      [&] {
        backend->sgd_update(host_tensor(params, {3}), host_tensor(grads, {3}), nullptr,
                            dp::SgdParams{0.1f, 0.9f, 0.0f});
      },
      {"sgd_update", "momentum buffer"});
}

// ---- data --------------------------------------------------------------------------------------

TEST_CASE("cpu gather_batch in NCHW and NHWC", "[cpu][ops]") {
  auto backend = make_cpu();
  const int64_t m = 7, c = 2, h = 3, w = 5;
  std::vector<uint8_t> images(static_cast<size_t>(m * c * h * w)), labels(static_cast<size_t>(m));
  dp::Rng rng(141);
  for (auto& v : images) v = static_cast<uint8_t>(rng.below(256));
  for (auto& v : labels) v = static_cast<uint8_t>(rng.below(10));
  images[0] = 255;
  images[1] = 0;
  const dp::Tensor images_t(images.data(), {m, c, h, w}, dp::DType::u8);
  const dp::Tensor labels_t(labels.data(), {m}, dp::DType::u8);
  std::vector<int32_t> index = {6, 0, 3, 0};  // repeats are allowed
  const auto n = static_cast<int64_t>(index.size());
  for (auto layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
    INFO("layout " << dp::layout_name(layout));
    fvec x(static_cast<size_t>(n * c * h * w), -1.0f);
    std::vector<int32_t> y(static_cast<size_t>(n), -1);
    backend->gather_batch(images_t, labels_t, host_tensor(index, {n}),
                          host_tensor(x, {n, c, h, w}, layout), host_tensor(y, {n}));
    dvec x_ref(x.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t p = 0; p < h * w; ++p) {
          const auto dst =
              layout == dp::Layout::nchw ? (i * c + ch) * h * w + p : (i * h * w + p) * c + ch;
          x_ref[static_cast<size_t>(dst)] =
              images[static_cast<size_t>((index[static_cast<size_t>(i)] * c + ch) * h * w + p)] /
              255.0;
        }
    check_close(x, x_ref, 1e-7);
    for (int64_t i = 0; i < n; ++i)
      CHECK(y[static_cast<size_t>(i)] ==
            labels[static_cast<size_t>(index[static_cast<size_t>(i)])]);
  }
  index[2] = 7;
  fvec x(static_cast<size_t>(n * c * h * w));
  std::vector<int32_t> y(static_cast<size_t>(n));
  check_error_mentions(
      [&] {
        backend->gather_batch(images_t, labels_t, host_tensor(index, {n}),
                              host_tensor(x, {n, c, h, w}), host_tensor(y, {n}));
      },
      {"gather_batch", "indices[2] = 7"});
}

// ---- fill, memory, factory
// -----------------------------------------------------------------------

TEST_CASE("cpu fill writes f32 and i32", "[cpu][ops]") {
  auto backend = make_cpu();
  for (int64_t n : {int64_t{5}, int64_t{40000}}) {
    fvec f(static_cast<size_t>(n), 1.0f);
    std::vector<int32_t> i(static_cast<size_t>(n), 1);
    backend->fill(host_tensor(f, {n}), -0.25f);
    backend->fill(host_tensor(i, {n}), 7.0f);
    CHECK(f == fvec(static_cast<size_t>(n), -0.25f));
    CHECK(i == std::vector<int32_t>(static_cast<size_t>(n), 7));
  }
  uint8_t bytes[4] = {};
  check_error_mentions([&] { backend->fill(dp::Tensor(bytes, {4}, dp::DType::u8), 1.0f); },
                       {"fill", "u8"});
}

TEST_CASE("cpu memory is aligned and accounted, conv scratch included", "[cpu][ops]") {
  auto backend = make_cpu();
  CHECK(backend->memory_in_use() == 0);
  void* a = backend->allocate(1000);
  void* b = backend->allocate(3);
  CHECK(reinterpret_cast<uintptr_t>(a) % 256 == 0);
  CHECK(reinterpret_cast<uintptr_t>(b) % 256 == 0);
  CHECK(backend->memory_in_use() == 1003);
  backend->release(a);
  CHECK(backend->memory_in_use() == 3);
  CHECK(backend->peak_memory() == 1003);
  {
    dp::ConvGeometry g;
    g.max_batch = 8;
    g.in_channels = 4;
    g.in_h = g.in_w = 10;
    g.out_channels = 6;
    g.kernel_h = g.kernel_w = 3;
    auto plan = backend->plan_conv(g);
    CHECK(backend->memory_in_use() > 3);  // im2col scratch belongs to the plan
  }
  CHECK(backend->memory_in_use() == 3);
  backend->release(b);
  CHECK(backend->memory_in_use() == 0);
  // upload / download / copy are plain copies.
  fvec src = {1, 2, 3}, dst(3);
  float* dev = static_cast<float*>(backend->allocate(sizeof(float) * 3));
  float* dev2 = static_cast<float*>(backend->allocate(sizeof(float) * 3));
  backend->upload(dev, src.data(), sizeof(float) * 3);
  backend->copy(dev2, dev, sizeof(float) * 3);
  backend->synchronize();
  backend->download(dst.data(), dev2, sizeof(float) * 3);
  CHECK(dst == src);
  backend->release(dev);
  backend->release(dev2);
}

TEST_CASE("backend factory: cpu, and cuda only where compiled", "[cpu][ops]") {
  auto backend = make_cpu(2);
  CHECK(backend->name() == "cpu");
  CHECK(backend->device() == dp::Device{dp::DeviceKind::cpu, 0});
  // "CPU (2 threads, oneDNN 2.6.3 avx512_core_bf16)": the thread count and the kernels in use.
  CHECK(backend->device_description().rfind("CPU (2 threads, ", 0) == 0);
  dp::BackendOptions blas;
  blas.cpu_threads = 1;
  blas.cpu_kernels = dp::CpuKernels::blas;
  CHECK(dp::create_backend(blas)->device_description().rfind("CPU (1 thread, OpenBLAS ", 0) == 0);
  CHECK(dp::cpu_kernels(dp::CpuKernels::onednn).rfind("oneDNN ", 0) == 0);
  CHECK(dp::cpu_kernels(dp::CpuKernels::blas).rfind("OpenBLAS ", 0) == 0);
  CHECK(std::string(dp::backend_kind_name(dp::BackendKind::cpu)) == "cpu");
  CHECK(std::string(dp::backend_kind_name(dp::BackendKind::cuda)) == "cuda");
  if (!dp::cuda_compiled()) {
    CHECK(dp::cuda_device_count() == 0);
    dp::BackendOptions options;
    options.kind = dp::BackendKind::cuda;
    check_error_mentions([&] { dp::create_backend(options); },
                         {"built without CUDA", "cpu backend"});
  }
  dp::ConvGeometry g;
  g.in_channels = 20;
  g.out_channels = 50;
  g.in_h = g.in_w = 13;
  g.kernel_h = g.kernel_w = 5;
  CHECK(g.str().find("20->50") != std::string::npos);
}
