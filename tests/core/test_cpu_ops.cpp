// CPU backend ops, part 1: convolution, linear, pooling. Each forward is compared with a naive
// double-precision reference written here; each backward with central differences of
// sum(y * r) (see test_cpu_util.hpp) and with a double-precision reference of the gradient.
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

namespace {

// ---- convolution -----------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, k, r, s, sh, sw, ph, pw;
  int64_t max_batch = 0;  // 0: n
  int64_t p() const { return (h + 2 * ph - r) / sh + 1; }
  int64_t q() const { return (w + 2 * pw - s) / sw + 1; }
  dp::ConvGeometry geometry() const {
    dp::ConvGeometry g;
    g.max_batch = max_batch ? max_batch : n;
    g.in_channels = c;
    g.in_h = h;
    g.in_w = w;
    g.out_channels = k;
    g.kernel_h = r;
    g.kernel_w = s;
    g.stride_h = sh;
    g.stride_w = sw;
    g.pad_h = ph;
    g.pad_w = pw;
    return g;
  }
};

// Every case has odd or unequal sizes somewhere; the last runs fewer images than planned.
const std::vector<ConvCase> kConvCases = {
    {"3x3 pad 1, odd sizes", 3, 5, 7, 9, 4, 3, 3, 1, 1, 1, 1},
    {"3x3 stride 2 pad 1 (ResNet downsampling)", 2, 3, 9, 8, 4, 3, 3, 2, 2, 1, 1},
    {"3x2 kernel, stride 2x1, pad 1x0", 2, 3, 8, 7, 6, 3, 2, 2, 1, 1, 0},
    {"1x1 stride 2, batch 1", 1, 2, 5, 5, 3, 1, 1, 2, 2, 0, 0},
    {"4x4 stride 3 pad 2", 2, 2, 10, 11, 2, 4, 4, 3, 3, 2, 2},
    {"5x5 valid, planned for 7 run with 5", 5, 4, 9, 8, 3, 5, 5, 1, 1, 0, 0, 7},
};

// y[n][k][p][q] = b[k] + sum_{c,r,s} x[n][c][p*sh-ph+r][q*sw-pw+s] * w[k][c][r][s]
dvec conv_ref(const ConvCase& cc, const fvec& x, const fvec& w, const fvec* b) {
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
void conv_ref_grads(const ConvCase& cc, const fvec& x, const fvec& w, const fvec& dy, dvec& dx,
                    dvec& dw, dvec& db) {
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

}  // namespace

TEST_CASE("cpu conv forward matches a naive reference", "[cpu][ops]") {
  auto backend = make_cpu();
  for (const ConvCase& cc : kConvCases) {
    SECTION(cc.name) {
      fvec x = random_vector(cc.n * cc.c * cc.h * cc.w, 1);
      fvec w = random_vector(cc.k * cc.c * cc.r * cc.s, 2);
      fvec b = random_vector(cc.k, 3);
      fvec y(static_cast<size_t>(cc.n * cc.k * cc.p() * cc.q()), -7.0f);
      auto plan = backend->plan_conv(cc.geometry());
      const auto xt = host_tensor(x, {cc.n, cc.c, cc.h, cc.w});
      const auto wt = host_tensor(w, {cc.k, cc.c, cc.r, cc.s});
      const auto bt = host_tensor(b, {cc.k});
      const auto yt = host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()});
      // fp32 sums of up to C*R*S = 100 products of O(1) values vs double: 1e-5 relative.
      backend->conv_forward(*plan, xt, wt, &bt, yt);
      check_close(y, conv_ref(cc, x, w, &b), 1e-5);
      backend->conv_forward(*plan, xt, wt, nullptr, yt);
      check_close(y, conv_ref(cc, x, w, nullptr), 1e-5);
    }
  }
}

TEST_CASE("cpu conv LeNet conv2 shape, many chunks and threads", "[cpu][ops]") {
  // conv 20 -> 50, 5x5 on 13x13: the shape the speed work targets; 37 images are several
  // chunks with a partial last one, on 1 and 2 threads (must agree to rounding).
  const ConvCase cc{"lenet conv2", 37, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0, 64};
  fvec x = random_vector(cc.n * cc.c * cc.h * cc.w, 11);
  fvec w = random_vector(cc.k * cc.c * cc.r * cc.s, 12, -0.1f, 0.1f);
  fvec b = random_vector(cc.k, 13);
  fvec dy = random_vector(cc.n * cc.k * cc.p() * cc.q(), 14);
  const dvec expected = conv_ref(cc, x, w, &b);
  dvec dx_ref, dw_ref, db_ref;
  conv_ref_grads(cc, x, w, dy, dx_ref, dw_ref, db_ref);
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    auto backend = make_cpu(threads);
    auto plan = backend->plan_conv(cc.geometry());
    fvec y(expected.size()), dx(x.size()), dw(w.size()), db(b.size());
    const auto xt = host_tensor(x, {cc.n, cc.c, cc.h, cc.w});
    const auto wt = host_tensor(w, {cc.k, cc.c, cc.r, cc.s});
    const auto bt = host_tensor(b, {cc.k});
    const auto yt = host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()});
    const auto dyt = host_tensor(dy, {cc.n, cc.k, cc.p(), cc.q()});
    const auto dxt = host_tensor(dx, {cc.n, cc.c, cc.h, cc.w});
    const auto dwt = host_tensor(dw, {cc.k, cc.c, cc.r, cc.s});
    const auto dbt = host_tensor(db, {cc.k});
    const size_t memory_before = backend->memory_in_use();
    backend->conv_forward(*plan, xt, wt, &bt, yt);
    backend->conv_backward_data(*plan, dyt, wt, dxt);
    backend->conv_backward_filter(*plan, xt, dyt, dwt, &dbt);
    CHECK(backend->memory_in_use() == memory_before);  // scratch comes from the plan
    // Sums of 500 (forward) to 37*81 = 2997 (filter gradient) fp32 products: 1e-4 relative.
    check_close(y, expected, 1e-4);
    check_close(dx, dx_ref, 1e-4);
    check_close(dw, dw_ref, 1e-4);
    check_close(db, db_ref, 1e-4);
  }
}

TEST_CASE("cpu conv backward: data, filter and bias gradients", "[cpu][ops]") {
  auto backend = make_cpu();
  for (const ConvCase& cc : kConvCases) {
    SECTION(cc.name) {
      fvec x = random_vector(cc.n * cc.c * cc.h * cc.w, 21);
      fvec w = random_vector(cc.k * cc.c * cc.r * cc.s, 22);
      fvec b = random_vector(cc.k, 23);
      const int64_t ny = cc.n * cc.k * cc.p() * cc.q();
      fvec r = random_vector(ny, 24);  // the loss weights = dy
      auto plan = backend->plan_conv(cc.geometry());
      const dp::Shape xs{cc.n, cc.c, cc.h, cc.w}, ws{cc.k, cc.c, cc.r, cc.s},
          ys{cc.n, cc.k, cc.p(), cc.q()};
      fvec dx(x.size(), 5.0f), dw(w.size(), 5.0f), db(b.size(), 5.0f);  // overwritten
      backend->conv_backward_data(*plan, host_tensor(r, ys), host_tensor(w, ws),
                                  host_tensor(dx, xs));
      auto dbt = host_tensor(db, {cc.k});
      backend->conv_backward_filter(*plan, host_tensor(x, xs), host_tensor(r, ys),
                                    host_tensor(dw, ws), &dbt);
      // Analytic vs a double reference of the gradient: 1e-4.
      dvec dx_ref, dw_ref, db_ref;
      conv_ref_grads(cc, x, w, r, dx_ref, dw_ref, db_ref);
      check_close(dx, dx_ref, 1e-4);
      check_close(dw, dw_ref, 1e-4);
      check_close(db, db_ref, 1e-4);
      // Analytic vs finite differences (step 1e-2, relative 1e-2).
      auto forward = [&](const fvec& xi, const fvec& wi, const fvec& bi) {
        fvec xa = xi, wa = wi, ba = bi, y(static_cast<size_t>(ny));
        auto bt = host_tensor(ba, {cc.k});
        backend->conv_forward(*plan, host_tensor(xa, xs), host_tensor(wa, ws), &bt,
                              host_tensor(y, ys));
        return y;
      };
      check_finite_differences([&](const fvec& v) { return forward(v, w, b); }, x, r, dx);
      check_finite_differences([&](const fvec& v) { return forward(x, v, b); }, w, r, dw);
      check_finite_differences([&](const fvec& v) { return forward(x, w, v); }, b, r, db);
      // Without a bias the filter gradient is the same.
      fvec dw2(w.size());
      backend->conv_backward_filter(*plan, host_tensor(x, xs), host_tensor(r, ys),
                                    host_tensor(dw2, ws), nullptr);
      CHECK(dw2 == dw);
    }
  }
}

TEST_CASE("cpu conv rejects bad shapes and foreign layouts with clear errors", "[cpu][ops]") {
  auto backend = make_cpu();
  const ConvCase cc = kConvCases[0];
  auto plan = backend->plan_conv(cc.geometry());
  fvec x(static_cast<size_t>(cc.n * cc.c * cc.h * cc.w)), w(static_cast<size_t>(cc.k * 45)),
      y(static_cast<size_t>(cc.n * cc.k * cc.p() * cc.q()));
  auto wrong_w = host_tensor(w, {cc.k, cc.c, 3, 3});
  wrong_w.shape = dp::Shape{cc.k, cc.c, 5, 1};
  check_error_mentions(
      [&] {
        backend->conv_forward(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}), wrong_w, nullptr,
                              host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()}));
      },
      {"conv_forward", "w", "(4, 5, 5, 1)"});
  dp::ConvGeometry g = cc.geometry();
  g.layout = dp::Layout::nhwc;
  check_error_mentions([&] { backend->plan_conv(g); }, {"plan_conv", "nhwc"});
  check_error_mentions(
      [&] {
        backend->conv_forward(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}, dp::Layout::nhwc),
                              host_tensor(w, {cc.k, cc.c, 3, 3}), nullptr,
                              host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()}));
      },
      {"conv_forward", "nhwc"});
  // Outputs without memory are errors that name the argument, not a crash.
  const dp::Tensor no_memory(nullptr, {cc.n, cc.k, cc.p(), cc.q()});
  check_error_mentions(
      [&] {
        backend->conv_forward(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}),
                              host_tensor(w, {cc.k, cc.c, 3, 3}), nullptr, no_memory);
      },
      {"conv_forward", "y", "null"});
  check_error_mentions(
      [&] {
        backend->conv_backward_data(*plan, host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()}),
                                    host_tensor(w, {cc.k, cc.c, 3, 3}),
                                    dp::Tensor(nullptr, {cc.n, cc.c, cc.h, cc.w}));
      },
      {"conv_backward_data", "dx", "null"});
  check_error_mentions(
      [&] {
        backend->conv_backward_filter(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}), no_memory,
                                      host_tensor(w, {cc.k, cc.c, 3, 3}), nullptr);
      },
      {"conv_backward_filter", "dy", "null"});
}

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
  auto backend = make_cpu();
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
  std::vector<fvec> ys, dxs, dws, dbs;
  for (int threads : {1, 2}) {
    auto backend = make_cpu(threads);
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
}  // namespace

TEST_CASE("cpu avgpool forward and backward (padding counted in the divisor)", "[cpu][ops]") {
  auto backend = make_cpu();
  for (const PoolCase& pc : kPoolCases) {
    SECTION(pc.name) {
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
        fvec xa = xin, y(static_cast<size_t>(ny));
        backend->avgpool_forward(pc.g, host_tensor(xa, xs), host_tensor(y, ys));
        return y;
      };
      check_close(forward(x), y_ref, 1e-5);
      fvec dx(x.size(), 4.0f);
      backend->avgpool_backward(pc.g, host_tensor(r, ys), host_tensor(dx, xs));
      check_close(dx, dx_ref, 1e-4);
      check_finite_differences(forward, x, r, dx);
    }
  }
}

TEST_CASE("cpu maxpool forward and backward (padding never wins)", "[cpu][ops]") {
  auto backend = make_cpu();
  for (const PoolCase& pc : kPoolCases) {
    SECTION(pc.name) {
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
        fvec xa = xin, y(static_cast<size_t>(ny));
        backend->maxpool_forward(pc.g, host_tensor(xa, xs), host_tensor(y, ys));
        return y;
      };
      fvec y = forward(x);
      check_close(y, y_ref, 0.0);  // a maximum is exact
      fvec dx(x.size(), 4.0f);
      backend->maxpool_backward(pc.g, host_tensor(x, xs), host_tensor(y, ys), host_tensor(r, ys),
                                host_tensor(dx, xs));
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
            3, 4, 5};
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
    auto forward = [&](const fvec& xin) {
      fvec xa = xin, y(static_cast<size_t>(n * c));
      backend->global_avgpool_forward(host_tensor(xa, xs), host_tensor(y, ys));
      return y;
    };
    check_close(forward(x), y_ref, 1e-5);
    fvec dx(x.size());
    backend->global_avgpool_backward(host_tensor(r, ys), host_tensor(dx, xs));
    check_close(dx, dx_ref, 1e-6);
    check_finite_differences(forward, x, r, dx);
  }
}

TEST_CASE("cpu pooling rejects NHWC and bad windows by name", "[cpu][ops]") {
  auto backend = make_cpu();
  fvec x(2 * 3 * 4 * 4), y(2 * 3 * 2 * 2), g_out(2 * 3);
  const auto g = pool(2, 2, 2, 2, 0, 0);
  check_error_mentions(
      [&] {
        backend->avgpool_forward(g, host_tensor(x, {2, 3, 4, 4}, dp::Layout::nhwc),
                                 host_tensor(y, {2, 3, 2, 2}, dp::Layout::nhwc));
      },
      {"avgpool_forward", "nhwc"});
  check_error_mentions(
      [&] {
        backend->maxpool_forward(g, host_tensor(x, {2, 3, 4, 4}, dp::Layout::nhwc),
                                 host_tensor(y, {2, 3, 2, 2}, dp::Layout::nhwc));
      },
      {"maxpool_forward", "nhwc"});
  check_error_mentions(
      [&] {
        backend->global_avgpool_forward(host_tensor(x, {2, 3, 4, 4}, dp::Layout::nhwc),
                                        host_tensor(g_out, {2, 3, 1, 1}));
      },
      {"global_avgpool_forward", "nhwc"});
  check_error_mentions(
      [&] {
        backend->maxpool_forward(pool(2, 2, 2, 2, 2, 0), host_tensor(x, {2, 3, 4, 4}),
                                 host_tensor(y, {2, 3, 2, 2}));
      },
      {"maxpool_forward", "padding at most half the kernel"});
}
