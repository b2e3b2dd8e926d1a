// CPU backend ops, part 1: linear and pooling (convolution: test_cpu_conv.cpp). Each forward is
// compared with a naive double-precision reference written here; each backward with central
// differences of sum(y * r) (see test_cpu_util.hpp) and with a double-precision reference of the
// gradient.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "support/check.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;
using dptest::host_tensor;
using dptest::random_vector;

// ---- linear ------------------------------------------------------------------------------------

namespace {
struct LinearCase {
  const char* name;
  int64_t n, in, out;
};
const std::vector<LinearCase> kLinearCases = {
    {"3 x 7 -> 5", 3, 7, 5}, {"batch 1", 1, 9, 4}, {"odd and wide", 11, 33, 13}};

dvec linear_ref(const LinearCase& lc, const fvec& x, const fvec& w, const fvec* b) {
  dvec y(static_cast<size_t>(lc.n * lc.out));
  for (int64_t n = 0; n < lc.n; ++n)
    for (int64_t o = 0; o < lc.out; ++o) {
      double s = b ? (*b)[static_cast<size_t>(o)] : 0.0;
      for (int64_t i = 0; i < lc.in; ++i)
        s += static_cast<double>(x[static_cast<size_t>(n * lc.in + i)]) *
             w[static_cast<size_t>(o * lc.in + i)];
      y[static_cast<size_t>(n * lc.out + o)] = s;
    }
  return y;
}
}  // namespace

TEST_CASE("cpu linear forward and backward", "[cpu][ops]") {
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();  // the SGEMM is the kernels'
  INFO("kernels " << dp::cpu_kernels_name(kernels));
  auto backend = make_cpu(2, kernels);
  for (const LinearCase& lc : kLinearCases) {
    SECTION(lc.name) {
      fvec x = random_vector(lc.n * lc.in, 31), w = random_vector(lc.out * lc.in, 32),
           b = random_vector(lc.out, 33), r = random_vector(lc.n * lc.out, 34);
      const dp::Shape xs{lc.n, lc.in}, ws{lc.out, lc.in}, ys{lc.n, lc.out}, bs{lc.out};
      auto forward = [&](const fvec& xi, const fvec& wi, const fvec& bi) {
        fvec xa = xi, wa = wi, ba = bi, y(static_cast<size_t>(lc.n * lc.out), -3.0f);
        auto bt = host_tensor(ba, bs);
        backend->linear_forward(host_tensor(xa, xs), host_tensor(wa, ws), &bt, host_tensor(y, ys));
        return y;
      };
      // Forward: fp32 dot products of up to 33 terms vs double, 1e-5.
      check_close(forward(x, w, b), linear_ref(lc, x, w, &b), 1e-5);
      fvec y_nobias(static_cast<size_t>(lc.n * lc.out));
      backend->linear_forward(host_tensor(x, xs), host_tensor(w, ws), nullptr,
                              host_tensor(y_nobias, ys));
      check_close(y_nobias, linear_ref(lc, x, w, nullptr), 1e-5);

      fvec dx(x.size(), 9.0f), dw(w.size(), 9.0f), db(b.size(), 9.0f);
      auto dxt = host_tensor(dx, xs);
      auto dbt = host_tensor(db, bs);
      backend->linear_backward(host_tensor(x, xs), host_tensor(w, ws), host_tensor(r, ys), &dxt,
                               host_tensor(dw, ws), &dbt);
      // Double reference of the gradients: dx = r w, dw = r^T x, db = sum_n r.
      dvec dx_ref(dx.size(), 0.0), dw_ref(dw.size(), 0.0), db_ref(db.size(), 0.0);
      for (int64_t n = 0; n < lc.n; ++n)
        for (int64_t o = 0; o < lc.out; ++o) {
          const double g = r[static_cast<size_t>(n * lc.out + o)];
          db_ref[static_cast<size_t>(o)] += g;
          for (int64_t i = 0; i < lc.in; ++i) {
            dx_ref[static_cast<size_t>(n * lc.in + i)] += g * w[static_cast<size_t>(o * lc.in + i)];
            dw_ref[static_cast<size_t>(o * lc.in + i)] += g * x[static_cast<size_t>(n * lc.in + i)];
          }
        }
      check_close(dx, dx_ref, 1e-4);
      check_close(dw, dw_ref, 1e-4);
      check_close(db, db_ref, 1e-4);
      check_finite_differences([&](const fvec& v) { return forward(v, w, b); }, x, r, dx);
      check_finite_differences([&](const fvec& v) { return forward(x, v, b); }, w, r, dw);
      check_finite_differences([&](const fvec& v) { return forward(x, w, v); }, b, r, db);

      // dx and db skipped: dw is unchanged, nothing else is written.
      fvec dw2(w.size(), 1.0f);
      backend->linear_backward(host_tensor(x, xs), host_tensor(w, ws), host_tensor(r, ys), nullptr,
                               host_tensor(dw2, ws), nullptr);
      CHECK(dw2 == dw);
    }
  }
}

TEST_CASE("cpu linear at LeNet's size agrees on 1 and 2 threads", "[cpu][ops]") {
  // 256 x 800 -> 128 is large enough for the threaded path (row blocks, one GEMM each). BLAS
  // may order a dot product differently for another block height, so the results agree to
  // rounding (1e-5), not bit for bit.
  const LinearCase lc{"lenet fc1", 256, 800, 128};
  fvec x = random_vector(lc.n * lc.in, 41), w = random_vector(lc.out * lc.in, 42, -0.05f, 0.05f),
       b = random_vector(lc.out, 43), dy = random_vector(lc.n * lc.out, 44);
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  INFO("kernels " << dp::cpu_kernels_name(kernels));
  std::vector<fvec> ys, dxs, dws, dbs;
  for (int threads : {1, 2}) {
    auto backend = make_cpu(threads, kernels);
    fvec y(static_cast<size_t>(lc.n * lc.out)), dx(x.size()), dw(w.size()), db(b.size());
    auto bt = host_tensor(b, {lc.out});
    auto dxt = host_tensor(dx, {lc.n, lc.in});
    auto dbt = host_tensor(db, {lc.out});
    backend->linear_forward(host_tensor(x, {lc.n, lc.in}), host_tensor(w, {lc.out, lc.in}), &bt,
                            host_tensor(y, {lc.n, lc.out}));
    backend->linear_backward(host_tensor(x, {lc.n, lc.in}), host_tensor(w, {lc.out, lc.in}),
                             host_tensor(dy, {lc.n, lc.out}), &dxt,
                             host_tensor(dw, {lc.out, lc.in}), &dbt);
    ys.push_back(y);
    dxs.push_back(dx);
    dws.push_back(dw);
    dbs.push_back(db);
  }
  check_close(ys[0], linear_ref(lc, x, w, &b), 1e-5);
  check_close(ys[1], to_double(ys[0]), 1e-5);
  check_close(dxs[1], to_double(dxs[0]), 1e-5);
  check_close(dws[1], to_double(dws[0]), 1e-5);
  check_close(dbs[1], to_double(dbs[0]), 1e-5);
}

// ---- pooling -----------------------------------------------------------------------------------

namespace {
struct PoolCase {
  const char* name;
  int64_t n, c, h, w;
  dp::PoolGeometry g;
  int64_t p() const { return g.out_h(h); }
  int64_t q() const { return g.out_w(w); }
};
dp::PoolGeometry pool(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  dp::PoolGeometry g;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.pad_h = ph;
  g.pad_w = pw;
  return g;
}
const std::vector<PoolCase> kPoolCases = {
    {"2x2 stride 2 on odd sizes", 3, 5, 7, 9, pool(2, 2, 2, 2, 0, 0)},
    {"2x2 stride 2 tiling the image exactly", 2, 17, 6, 8, pool(2, 2, 2, 2, 0, 0)},
    {"3x3 stride 2 pad 1", 2, 3, 7, 8, pool(3, 3, 2, 2, 1, 1)},
    {"3x2 stride 1 pad 1x0, batch 1", 1, 2, 5, 6, pool(3, 2, 1, 1, 1, 0)},
    {"overlapping 3x3 stride 1", 2, 2, 6, 5, pool(3, 3, 1, 1, 0, 0)},
};

// Windows in row-major order over the padded input; `visit(n, c, p, q, ih, iw)` sees only
// positions inside the image.
template <typename F>
void for_each_window_cell(const PoolCase& pc, F visit) {
  for (int64_t n = 0; n < pc.n; ++n)
    for (int64_t c = 0; c < pc.c; ++c)
      for (int64_t p = 0; p < pc.p(); ++p)
        for (int64_t q = 0; q < pc.q(); ++q)
          for (int64_t i = 0; i < pc.g.kernel_h; ++i)
            for (int64_t j = 0; j < pc.g.kernel_w; ++j) {
              const int64_t ih = p * pc.g.stride_h - pc.g.pad_h + i;
              const int64_t iw = q * pc.g.stride_w - pc.g.pad_w + j;
              if (ih >= 0 && ih < pc.h && iw >= 0 && iw < pc.w) visit(n, c, p, q, ih, iw);
            }
}

size_t xi(const PoolCase& pc, int64_t n, int64_t c, int64_t h, int64_t w) {
  return static_cast<size_t>(((n * pc.c + c) * pc.h + h) * pc.w + w);
}
size_t yi(const PoolCase& pc, int64_t n, int64_t c, int64_t p, int64_t q) {
  return static_cast<size_t>(((n * pc.c + c) * pc.p() + p) * pc.q() + q);
}

// Conversions between the test's NCHW-ordered arrays and tensors in `layout`.
struct PoolRunner {
  dp::Backend& backend;
  const PoolCase& pc;
  dp::Layout layout;
  fvec x_in(const fvec& v) const { return to_layout(v, layout, pc.n, pc.c, pc.h, pc.w); }
  fvec x_out(const fvec& v) const { return from_layout(v, layout, pc.n, pc.c, pc.h, pc.w); }
  fvec y_in(const fvec& v) const { return to_layout(v, layout, pc.n, pc.c, pc.p(), pc.q()); }
  fvec y_out(const fvec& v) const { return from_layout(v, layout, pc.n, pc.c, pc.p(), pc.q()); }
  // Runs op(x, y) on x (NCHW order) and returns y in the tensor's layout.
  template <typename Op>
  fvec call_xy(const fvec& x, Op op) const {
    fvec xl = x_in(x), y(static_cast<size_t>(pc.n * pc.c * pc.p() * pc.q()));
    op(host_tensor(xl, {pc.n, pc.c, pc.h, pc.w}, layout),
       host_tensor(y, {pc.n, pc.c, pc.p(), pc.q()}, layout));
    return y;
  }
};
}  // namespace

// Pooling is the backend's own loops in either kernel selection; both layouts are tested, the
// arrays kept in NCHW order by the test (PoolRunner) so the references stay NCHW loops.
TEST_CASE("cpu avgpool forward and backward (padding counted in the divisor)", "[cpu][ops]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  auto backend = make_cpu();
  for (const PoolCase& pc : kPoolCases) {
    SECTION(pc.name) {
      const PoolRunner run{*backend, pc, layout};
      fvec x = random_vector(pc.n * pc.c * pc.h * pc.w, 51);
      const int64_t ny = pc.n * pc.c * pc.p() * pc.q();
      fvec r = random_vector(ny, 52);
      const dp::Shape xs{pc.n, pc.c, pc.h, pc.w}, ys{pc.n, pc.c, pc.p(), pc.q()};
      const double area = static_cast<double>(pc.g.kernel_h * pc.g.kernel_w);
      dvec y_ref(static_cast<size_t>(ny), 0.0), dx_ref(x.size(), 0.0);
      for_each_window_cell(pc,
                           [&](int64_t n, int64_t c, int64_t p, int64_t q, int64_t h, int64_t w) {
                             y_ref[yi(pc, n, c, p, q)] += x[xi(pc, n, c, h, w)] / area;
                             dx_ref[xi(pc, n, c, h, w)] += r[yi(pc, n, c, p, q)] / area;
                           });
      auto forward = [&](const fvec& xin) {
        return run.y_out(run.call_xy(xin, [&](const dp::Tensor& xt, const dp::Tensor& yt) {
          backend->avgpool_forward(pc.g, xt, yt);
        }));
      };
      check_close(forward(x), y_ref, 1e-5);
      fvec dyl = run.y_in(r), dx(x.size(), 4.0f);
      backend->avgpool_backward(pc.g, host_tensor(dyl, ys, layout), host_tensor(dx, xs, layout));
      dx = run.x_out(dx);
      check_close(dx, dx_ref, 1e-4);
      check_finite_differences(forward, x, r, dx);
    }
  }
}

TEST_CASE("cpu maxpool forward and backward (padding never wins)", "[cpu][ops]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  auto backend = make_cpu();
  for (const PoolCase& pc : kPoolCases) {
    SECTION(pc.name) {
      const PoolRunner run{*backend, pc, layout};
      // Values below zero everywhere, so a padded zero would win if padding were counted.
      fvec x = random_vector(pc.n * pc.c * pc.h * pc.w, 61, -2.0f, -0.1f);
      const int64_t ny = pc.n * pc.c * pc.p() * pc.q();
      fvec r = random_vector(ny, 62);
      const dp::Shape xs{pc.n, pc.c, pc.h, pc.w}, ys{pc.n, pc.c, pc.p(), pc.q()};
      dvec y_ref(static_cast<size_t>(ny), -1e30);
      std::vector<size_t> arg(static_cast<size_t>(ny));
      for_each_window_cell(pc,
                           [&](int64_t n, int64_t c, int64_t p, int64_t q, int64_t h, int64_t w) {
                             const size_t o = yi(pc, n, c, p, q), i = xi(pc, n, c, h, w);
                             if (x[i] > y_ref[o]) {  // strict: the first maximum stays
                               y_ref[o] = x[i];
                               arg[o] = i;
                             }
                           });
      dvec dx_ref(x.size(), 0.0);
      for (size_t o = 0; o < arg.size(); ++o) dx_ref[arg[o]] += r[o];
      auto forward = [&](const fvec& xin) {
        return run.y_out(run.call_xy(xin, [&](const dp::Tensor& xt, const dp::Tensor& yt) {
          backend->maxpool_forward(pc.g, xt, yt);
        }));
      };
      fvec y = forward(x);
      check_close(y, y_ref, 0.0);  // a maximum is exact
      fvec xl = run.x_in(x), yl = run.y_in(y), dyl = run.y_in(r), dx(x.size(), 4.0f);
      backend->maxpool_backward(pc.g, host_tensor(xl, xs, layout), host_tensor(yl, ys, layout),
                                host_tensor(dyl, ys, layout), host_tensor(dx, xs, layout));
      dx = run.x_out(dx);
      check_close(dx, dx_ref, 1e-6);
      // Kinks: a coordinate within 2 steps of another value in a window it shares.
      dptest::GradCheckOptions options = fd_options();
      options.kink = [&](const dvec& xv, int64_t i) {
        const int64_t w = i % pc.w, h = (i / pc.w) % pc.h, plane = i / (pc.h * pc.w);
        for (int64_t dh = -pc.g.kernel_h + 1; dh < pc.g.kernel_h; ++dh)
          for (int64_t dw = -pc.g.kernel_w + 1; dw < pc.g.kernel_w; ++dw) {
            const int64_t h2 = h + dh, w2 = w + dw;
            if ((dh == 0 && dw == 0) || h2 < 0 || h2 >= pc.h || w2 < 0 || w2 >= pc.w) continue;
            const auto j = static_cast<size_t>((plane * pc.h + h2) * pc.w + w2);
            if (std::abs(xv[static_cast<size_t>(i)] - xv[j]) < 2 * options.step) return true;
          }
        return false;
      };
      check_finite_differences(forward, x, r, dx, options);
    }
  }
}

TEST_CASE("cpu maxpool ties go to the first maximum in window order", "[cpu][ops]") {
  auto backend = make_cpu(1);
  // One 3x3 image, 2x2 windows with stride 1: every window holds ties of the value 5.
  fvec x = {5, 5, 1,  //
            5, 5, 5,  //
            0, 5, 5};
  fvec y(4), dy = {1, 2, 3, 4}, dx(9, -1.0f);
  const auto g = pool(2, 2, 1, 1, 0, 0);
  backend->maxpool_forward(g, host_tensor(x, {1, 1, 3, 3}), host_tensor(y, {1, 1, 2, 2}));
  CHECK(y == fvec{5, 5, 5, 5});
  backend->maxpool_backward(g, host_tensor(x, {1, 1, 3, 3}), host_tensor(y, {1, 1, 2, 2}),
                            host_tensor(dy, {1, 1, 2, 2}), host_tensor(dx, {1, 1, 3, 3}));
  // Window (0,0) -> x[0]; (0,1) -> x[1]; (1,0) -> x[3]; (1,1) -> x[4].
  CHECK(dx == fvec{1, 2, 0, 3, 4, 0, 0, 0, 0});
}

TEST_CASE("cpu relu and maxpool propagate NaN, as PyTorch does", "[cpu][ops]") {
  // A diverging model must not be hidden by its activations: NaN in gives NaN out.
  auto backend = make_cpu(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  fvec a = {-1.0f, nan, 2.0f, 0.0f}, r(4);
  backend->relu_forward(host_tensor(a, {4}), host_tensor(r, {4}));
  CHECK(r[0] == 0.0f);
  CHECK(std::isnan(r[1]));
  CHECK(r[2] == 2.0f);
  CHECK(r[3] == 0.0f);
  // One 2x3 image, 2x2 windows, stride 1: the NaN at x[1] lies in both windows and wins over
  // the larger numbers after it; backward routes each window's gradient to it.
  fvec x = {1, nan, 9,  //
            3, 4,   5};
  fvec y(2), dy = {1, 2}, dx(6, -1.0f);
  const auto g = pool(2, 2, 1, 1, 0, 0);
  backend->maxpool_forward(g, host_tensor(x, {1, 1, 2, 3}), host_tensor(y, {1, 1, 1, 2}));
  CHECK(std::isnan(y[0]));
  CHECK(std::isnan(y[1]));
  backend->maxpool_backward(g, host_tensor(x, {1, 1, 2, 3}), host_tensor(y, {1, 1, 1, 2}),
                            host_tensor(dy, {1, 1, 1, 2}), host_tensor(dx, {1, 1, 2, 3}));
  CHECK(dx == fvec{0, 3, 0, 0, 0, 0});
}

TEST_CASE("cpu global average pooling", "[cpu][ops]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << dp::layout_name(layout));
  auto backend = make_cpu();
  for (auto [n, c, h, w] :
       std::vector<std::array<int64_t, 4>>{{3, 5, 7, 9}, {1, 2, 1, 1}, {2, 64, 4, 4}}) {
    INFO("shape " << n << "x" << c << "x" << h << "x" << w);
    fvec x = random_vector(n * c * h * w, 71), r = random_vector(n * c, 72);
    const dp::Shape xs{n, c, h, w}, ys{n, c, 1, 1};
    dvec y_ref(static_cast<size_t>(n * c), 0.0), dx_ref(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      y_ref[i / static_cast<size_t>(h * w)] += x[i] / static_cast<double>(h * w);
      dx_ref[i] = r[i / static_cast<size_t>(h * w)] / static_cast<double>(h * w);
    }
    // (N, C, 1, 1) is the same memory in both layouts.
    auto forward = [&](const fvec& xin) {
      fvec xa = to_layout(xin, layout, n, c, h, w), y(static_cast<size_t>(n * c));
      backend->global_avgpool_forward(host_tensor(xa, xs, layout), host_tensor(y, ys, layout));
      return y;
    };
    // fp32 sums of up to 63 values: 1e-5.
    check_close(forward(x), y_ref, 1e-5);
    fvec dx(x.size());
    backend->global_avgpool_backward(host_tensor(r, ys, layout), host_tensor(dx, xs, layout));
    dx = from_layout(dx, layout, n, c, h, w);
    check_close(dx, dx_ref, 1e-6);
    check_finite_differences(forward, x, r, dx);
  }
}

TEST_CASE("cpu pooling rejects mixed layouts and bad windows by name", "[cpu][ops]") {
  auto backend = make_cpu();
  fvec x(2 * 3 * 4 * 4), y(2 * 3 * 2 * 2);
  const auto g = pool(2, 2, 2, 2, 0, 0);
  check_error_mentions(
      [&] {
        backend->avgpool_forward(g, host_tensor(x, {2, 3, 4, 4}, dp::Layout::nhwc),
                                 host_tensor(y, {2, 3, 2, 2}));
      },
      {"avgpool_forward", "nhwc", "nchw"});
  check_error_mentions(
      [&] {
        backend->maxpool_forward(pool(2, 2, 2, 2, 2, 0), host_tensor(x, {2, 3, 4, 4}),
                                 host_tensor(y, {2, 3, 2, 2}));
      },
      {"maxpool_forward", "padding at most half the kernel"});
}
