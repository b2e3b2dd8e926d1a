// The CPU backend's own Winograd F(4x4, 3x3) convolution (conv_winograd.cpp), which runs the 3x3
// stride-1 layers where oneDNN has no Winograd kernel (below AVX-512). Forced here with
// DPRUN_ONEDNN_CONV=own-winograd, so it runs on any machine; every pass against the naive
// double loops, with a tolerance derived from the algorithm's rounding, not measured:
//
// Rounding model. A sum of m terms computed in any order in fp32 is within gamma(m-1) * (the
// same sum of absolute values), gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., section 3.1). Winograd's output is a chain of such
// sums: the filter transform G w G^T, the input transform B^T x B, the sum over channels (the
// SGEMM) of their products, and the output transform A^T . A. To first order its error is at
// most gamma(n) times the same chain evaluated in absolute values:
//
//   |y - y_exact| <= gamma(n) * |A^T| ( sum_c |G| |w_c| |G^T| . |B^T| |x_c| |B| ) |A|
//
// with n the longest chain of roundings an output goes through: C (the channel sum) plus the
// transforms' depths, counted from conv_winograd.cpp's formulas: 6 for B^T x B (3 per side), 8
// for G w G^T (4 per side, the 1/6, 1/12, 1/24 not being exact in fp32), 6 for A^T m A, 1 for
// the bias: n = C + 21. The filter gradient chains G^T . G (10), A dy A^T (6), B^T x B (6) and a
// sum over every tile of the batch: n = tiles + 22. A direct convolution's bound is the same
// without the transforms (n = C*9, no magnification); Winograd's is larger by the absolute
// transform matrices, up to 10 (B^T's row 4, -5, 1) per side in, 19 (A^T's row 1, 1, 8, 8, 1)
// per side out. The bound is loose (the errors measured are 1e-5 to 1e-3 of it), but a wrong
// transform, tile or chunk is off by the size of the outputs, and the test checks that the bound
// stays below a quarter of that, so it cannot pass vacuously: the filter gradient over 1960
// tiles (its bound's worst case) is at 0.13 of its largest output, the forward at 0.01.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "conv_test_util.hpp"
#include "dp/backend.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;

namespace {

// Lavin's F(4x4, 3x3) matrices in absolute value (the signs do not enter the bound).
constexpr double kBt[6][6] = {{4, 0, 5, 0, 1, 0}, {0, 4, 4, 1, 1, 0}, {0, 4, 4, 1, 1, 0},
                              {0, 2, 1, 2, 1, 0}, {0, 2, 1, 2, 1, 0}, {0, 4, 0, 5, 0, 1}};
constexpr double kG[6][3] = {{1.0 / 4, 0, 0},
                             {1.0 / 6, 1.0 / 6, 1.0 / 6},
                             {1.0 / 6, 1.0 / 6, 1.0 / 6},
                             {1.0 / 24, 1.0 / 12, 1.0 / 6},
                             {1.0 / 24, 1.0 / 12, 1.0 / 6},
                             {0, 0, 1}};
constexpr double kAt[4][6] = {
    {1, 1, 1, 1, 1, 0}, {0, 1, 1, 2, 2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, 1, 8, 8, 1}};

// The smaller of two bounds on a chain of n fp32 roundings, per unit of the chain evaluated in
// absolute values: the worst case gamma(n) = n u / (1 - n u), and the probabilistic bound of
// Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019, theorem 2.4), exp(lambda sqrt(n) u +
// n u^2 / (1 - u)) - 1, which holds with probability at least 1 - 2 n exp(-lambda^2 (1 - u)^2
// / 2) for one inner product whose rounding errors are independent and of mean zero. Here it is
// a model, not a proof: an output sums many chains, and the rounded constants 1/6, 1/12, 1/24
// err alike on every chain. Long sums (a filter gradient adds up every tile of the batch) need
// it all the same: the worst case grows as n and would say nothing there. lambda = 8 leaves a
// wide margin (the errors measured are at most 1e-3 of the bound).
double rounding_bound(int64_t n) {
  const double u = std::ldexp(1.0, -24), lambda = 8.0;
  const double worst = n * u / (1 - n * u);
  const double likely =
      std::expm1(lambda * std::sqrt(static_cast<double>(n)) * u + n * u * u / (1 - u));
  return std::min(worst, likely);
}

using Mat6 = std::array<std::array<double, 6>, 6>;

// |B^T| |d| |B| of the 6x6 input patch at tile (ti, tj) of image `n`, channel `c` of an NCHW
// array with `ch` channels and size h x w, one pixel of zero padding.
Mat6 input_bound(const fvec& x, int64_t n, int64_t c, int64_t ch, int64_t h, int64_t w, int64_t ti,
                 int64_t tj) {
  double d[6][6];
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) {
      const int64_t ih = 4 * ti + i - 1, iw = 4 * tj + j - 1;
      d[i][j] = ih < 0 || ih >= h || iw < 0 || iw >= w
                    ? 0.0
                    : std::fabs(x[static_cast<size_t>(((n * ch + c) * h + ih) * w + iw)]);
    }
  Mat6 out{};
  for (int a = 0; a < 6; ++a)
    for (int b = 0; b < 6; ++b) {
      double s = 0;
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j) s += kBt[a][i] * d[i][j] * kBt[b][j];
      out[a][b] = s;
    }
  return out;
}

// |G| |g| |G^T| of a 3x3 filter (taps[r*3+s]), turned by 180 degrees when `turned`.
Mat6 filter_bound(const float* taps, bool turned) {
  Mat6 out{};
  for (int a = 0; a < 6; ++a)
    for (int b = 0; b < 6; ++b) {
      double s = 0;
      for (int r = 0; r < 3; ++r)
        for (int t = 0; t < 3; ++t)
          s += kG[a][r] * std::fabs(taps[turned ? 8 - (r * 3 + t) : r * 3 + t]) * kG[b][t];
      out[a][b] = s;
    }
  return out;
}

// The forward's bound (see the top of the file) for out = conv(in, w') + bias, where in has
// `cin` channels and w' is w (forward) or w turned with its channel axes swapped (backward
// data): one value per output, NCHW, without the gamma.
dvec conv_bound(const ConvCase& cc, const fvec& in, const fvec& w, const fvec* bias,
                bool backward_data) {
  const int64_t cin = backward_data ? cc.k : cc.c, cout = backward_data ? cc.c : cc.k;
  const int64_t h = cc.h, wd = cc.w, th = (h + 3) / 4, tw = (wd + 3) / 4;
  dvec bound(static_cast<size_t>(cc.n * cout * h * wd));
  std::vector<Mat6> filters(static_cast<size_t>(cin * cout));
  for (int64_t i = 0; i < cin; ++i)
    for (int64_t o = 0; o < cout; ++o) {
      const int64_t k = backward_data ? i : o, c = backward_data ? o : i;
      filters[static_cast<size_t>(i * cout + o)] =
          filter_bound(&w[static_cast<size_t>((k * cc.c + c) * 9)], backward_data);
    }
  for (int64_t n = 0; n < cc.n; ++n)
    for (int64_t ti = 0; ti < th; ++ti)
      for (int64_t tj = 0; tj < tw; ++tj) {
        std::vector<Mat6> inputs(static_cast<size_t>(cin));
        for (int64_t i = 0; i < cin; ++i)
          inputs[static_cast<size_t>(i)] = input_bound(in, n, i, cin, h, wd, ti, tj);
        for (int64_t o = 0; o < cout; ++o) {
          Mat6 m{};
          for (int64_t i = 0; i < cin; ++i) {
            const Mat6& f = filters[static_cast<size_t>(i * cout + o)];
            const Mat6& v = inputs[static_cast<size_t>(i)];
            for (int a = 0; a < 6; ++a)
              for (int b = 0; b < 6; ++b) m[a][b] += f[a][b] * v[a][b];
          }
          for (int p = 0; p < 4; ++p)
            for (int q = 0; q < 4; ++q) {
              const int64_t oh = 4 * ti + p, ow = 4 * tj + q;
              if (oh >= h || ow >= wd) continue;
              double s = bias ? std::fabs((*bias)[static_cast<size_t>(o)]) : 0.0;
              for (int a = 0; a < 6; ++a)
                for (int b = 0; b < 6; ++b) s += kAt[p][a] * m[a][b] * kAt[q][b];
              bound[static_cast<size_t>(((n * cout + o) * h + oh) * wd + ow)] = s;
            }
        }
      }
  return bound;
}

// The filter gradient's bound: |G^T| ( sum over tiles |A| |dy| |A^T| . |B^T| |x| |B| ) |G| per
// filter tap, (K, C, 3, 3), without the gamma.
dvec filter_gradient_bound(const ConvCase& cc, const fvec& x, const fvec& dy) {
  const int64_t h = cc.h, wd = cc.w, th = (h + 3) / 4, tw = (wd + 3) / 4;
  std::vector<Mat6> sums(static_cast<size_t>(cc.k * cc.c));
  for (int64_t n = 0; n < cc.n; ++n)
    for (int64_t ti = 0; ti < th; ++ti)
      for (int64_t tj = 0; tj < tw; ++tj) {
        std::vector<Mat6> inputs(static_cast<size_t>(cc.c));
        for (int64_t c = 0; c < cc.c; ++c)
          inputs[static_cast<size_t>(c)] = input_bound(x, n, c, cc.c, h, wd, ti, tj);
        for (int64_t k = 0; k < cc.k; ++k) {
          double e[4][4];
          for (int p = 0; p < 4; ++p)
            for (int q = 0; q < 4; ++q) {
              const int64_t oh = 4 * ti + p, ow = 4 * tj + q;
              e[p][q] =
                  oh >= h || ow >= wd
                      ? 0.0
                      : std::fabs(dy[static_cast<size_t>(((n * cc.k + k) * h + oh) * wd + ow)]);
            }
          Mat6 g{};  // |A| |dy| |A^T|, A = (A^T)^T
          for (int a = 0; a < 6; ++a)
            for (int b = 0; b < 6; ++b)
              for (int p = 0; p < 4; ++p)
                for (int q = 0; q < 4; ++q) g[a][b] += kAt[p][a] * e[p][q] * kAt[q][b];
          for (int64_t c = 0; c < cc.c; ++c) {
            Mat6& s = sums[static_cast<size_t>(k * cc.c + c)];
            const Mat6& v = inputs[static_cast<size_t>(c)];
            for (int a = 0; a < 6; ++a)
              for (int b = 0; b < 6; ++b) s[a][b] += g[a][b] * v[a][b];
          }
        }
      }
  dvec bound(static_cast<size_t>(cc.k * cc.c * 9));
  for (size_t f = 0; f < sums.size(); ++f)
    for (int r = 0; r < 3; ++r)
      for (int t = 0; t < 3; ++t) {
        double s = 0;
        for (int a = 0; a < 6; ++a)
          for (int b = 0; b < 6; ++b) s += kG[a][r] * sums[f][a][b] * kG[b][t];
        bound[f * 9 + static_cast<size_t>(r * 3 + t)] = s;
      }
  return bound;
}

// Every |actual - expected| within gamma(n) * bound, and the bound meaningful: its largest
// gamma(n) * bound below a quarter of the largest |expected|.
void check_within_bound(const fvec& actual, const dvec& expected, const dvec& bound, int64_t n,
                        const char* what) {
  REQUIRE(actual.size() == expected.size());
  REQUIRE(bound.size() == expected.size());
  const double g = rounding_bound(n);
  double worst = 0, largest = 0, widest = 0;
  size_t worst_at = 0, failures = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(actual[i] - expected[i]), allowed = g * bound[i];
    if (!(err <= allowed)) ++failures;
    if (allowed > 0 && err / allowed > worst) worst = err / allowed, worst_at = i;
    largest = std::max(largest, std::fabs(expected[i]));
    widest = std::max(widest, allowed);
  }
  INFO(what << ": " << failures << " of " << actual.size()
            << " outside the bound; largest error / bound " << worst << " at " << worst_at
            << " (got " << actual[worst_at] << ", expected " << expected[worst_at] << ", allowed "
            << g * bound[worst_at] << "); widest bound " << widest << " against outputs up to "
            << largest);
  CHECK(failures == 0);
  CHECK(widest < 0.25 * largest);
}

struct WinogradCase {
  ConvCase cc;
  int threads;
};

}  // namespace

// Sets DPRUN_ONEDNN_CONV while alive (plans read it when they are made), also if a check throws.
struct ForcedFormulation {
  explicit ForcedFormulation(const char* f) { setenv("DPRUN_ONEDNN_CONV", f, 1); }
  ~ForcedFormulation() { unsetenv("DPRUN_ONEDNN_CONV"); }
  ForcedFormulation(const ForcedFormulation&) = delete;
  ForcedFormulation& operator=(const ForcedFormulation&) = delete;
};

TEST_CASE("cpu winograd: every pass within its rounding bound", "[cpu][ops]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  // Partial tiles on both sides, an image of one tile, of one pixel, fewer images than planned,
  // and (32->32 on 28x28, the first ResNet stage's shape) several chunks with a partial last one.
  const std::vector<WinogradCase> cases = {
      {{"8->16 on 7x9", 3, 8, 7, 9, 16, 3, 3, 1, 1, 1, 1}, 2},
      {{"16->8 on 4x4, batch 2 of 5", 2, 16, 4, 4, 8, 3, 3, 1, 1, 1, 1, 5}, 3},
      {{"8->8 on 1x1", 2, 8, 1, 1, 8, 3, 3, 1, 1, 1, 1}, 2},
      {{"8->24 on 13x5, one thread", 7, 8, 13, 5, 24, 3, 3, 1, 1, 1, 1}, 1},
      {{"32->32 on 28x28, 40 images", 40, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1}, 2},
  };
  for (const WinogradCase& wc : cases) {
    const ConvCase& cc = wc.cc;
    SECTION(std::string(cc.name) + ", " + dp::layout_name(layout)) {
      auto backend = make_cpu(wc.threads, dp::CpuKernels::onednn);
      const ConvRunner run = [&] {
        const ForcedFormulation forced("own-winograd");
        return ConvRunner(*backend, cc, layout);
      }();
      const std::string impl = run.plan->implementation();
      INFO(impl);
      CHECK(impl.find("dprun Winograd F(4x4, 3x3)") != std::string::npos);
      const auto [x, w, b, dy] = conv_data(cc, 71);
      const size_t memory_before = backend->memory_in_use();
      const fvec y = run.forward(x, w, &b);
      const fvec dx = run.backward_data(dy, w);
      fvec dw, db;
      run.backward_filter(x, dy, dw, &db);
      CHECK(backend->memory_in_use() == memory_before);  // the scratch was reserved at plan time

      dvec dx_ref, dw_ref, db_ref;
      conv_ref_grads(cc, x, w, dy, dx_ref, dw_ref, db_ref);
      check_within_bound(y, conv_ref(cc, x, w, &b), conv_bound(cc, x, w, &b, false), cc.c + 21,
                         "forward");
      check_within_bound(dx, dx_ref, conv_bound(cc, dy, w, nullptr, true), cc.k + 21,
                         "backward data");
      const int64_t tiles = cc.n * ((cc.h + 3) / 4) * ((cc.w + 3) / 4);
      check_within_bound(dw, dw_ref, filter_gradient_bound(cc, x, dy), tiles + 22,
                         "filter gradient");
      dvec dy_abs(db_ref.size());  // the bias gradient: plain sums of N*P*Q values
      for (int64_t n = 0; n < cc.n; ++n)
        for (int64_t k = 0; k < cc.k; ++k)
          for (int64_t i = 0; i < cc.h * cc.w; ++i)
            dy_abs[static_cast<size_t>(k)] +=
                std::fabs(dy[static_cast<size_t>((n * cc.k + k) * cc.h * cc.w + i)]);
      check_within_bound(db, db_ref, dy_abs, cc.n * cc.h * cc.w, "bias gradient");
      // Without a bias: the same outputs less the bias, and the same filter gradient.
      const fvec y0 = run.forward(x, w, nullptr);
      check_within_bound(y0, conv_ref(cc, x, w, nullptr), conv_bound(cc, x, w, nullptr, false),
                         cc.c + 21, "forward without bias");
      fvec dw2;
      run.backward_filter(x, dy, dw2, nullptr);
      CHECK(dw2 == dw);
    }
  }
}

TEST_CASE("cpu winograd runs the 3x3 layers where oneDNN has no Winograd kernel", "[cpu][ops]") {
  // oneDNN 2.6 has Winograd for AVX-512 only. This test runs twice under ctest: as the CPU is,
  // and with ONEDNN_MAX_CPU_ISA=AVX2 (tests/CMakeLists.txt), so both branches run on a machine
  // with AVX-512.
  auto backend = make_cpu(2, dp::CpuKernels::onednn);
  const std::string devices = backend->device_description();
  INFO(devices);
  const bool avx512 = devices.find("avx512") != std::string::npos;
  ConvCase resnet{"64->64 on 14x14", 4, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1};
  const auto plan = backend->plan_conv(resnet.geometry());
  const std::string impl = plan->implementation();
  INFO(impl);
  if (avx512) {
    CHECK(impl.find("own-winograd") == std::string::npos);
    CHECK(impl.find("forward: batch 4 winograd") != std::string::npos);
  } else {
    CHECK(impl.find("forward: own-winograd") != std::string::npos);
    CHECK(impl.find("backward-data: own-winograd") != std::string::npos);
    CHECK(impl.find("backward-weights: own-winograd") != std::string::npos);
  }
  // Not a Winograd shape: strided, or channels not in multiples of 8.
  ConvCase strided{"64->64 stride 2", 4, 64, 14, 14, 64, 3, 3, 2, 2, 1, 1};
  ConvCase odd{"20->12", 4, 20, 14, 14, 12, 3, 3, 1, 1, 1, 1};
  for (const ConvCase& other : {strided, odd}) {
    const auto p = backend->plan_conv(other.geometry());
    INFO(other.name << ": " << p->implementation());
    CHECK(p->implementation().find("winograd") == std::string::npos);
  }
}

TEST_CASE("cpu winograd: a region with fewer threads than the plan's gives the same gradients",
          "[cpu][ops]") {
  // Called from inside a parallel region (nested regions inactive), the plan's region runs on
  // one thread, not the two it was planned for: the second thread's bias-gradient sums, left in
  // the shared scratch by an earlier call, must not enter the result.
  const ConvCase cc{"16->8 on 9x9", 6, 16, 9, 9, 8, 3, 3, 1, 1, 1, 1};
  auto backend = make_cpu(2, dp::CpuKernels::onednn);
  const ConvRunner run = [&] {
    const ForcedFormulation forced("own-winograd");
    return ConvRunner(*backend, cc, dp::Layout::nchw);
  }();
  const auto [x, w, b, dy] = conv_data(cc, 81);
  fvec dw_first, db_first;
  run.backward_filter(x, random_vector(static_cast<int64_t>(dy.size()), 82, 5.0f, 9.0f), dw_first,
                      &db_first);
  fvec dw, db;
  // Inside an active region (2 threads) with one active level allowed, the plan's own region is
  // inactive: one thread.
  const int saved_levels = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  int active_level = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp master
    {
      active_level = omp_get_active_level();
      run.backward_filter(x, dy, dw, &db);
    }
  }
  omp_set_max_active_levels(saved_levels);
  REQUIRE(active_level == 1);
  dvec dx_ref, dw_ref, db_ref;
  conv_ref_grads(cc, x, w, dy, dx_ref, dw_ref, db_ref);
  check_close(db, db_ref, 1e-5);
  check_close(dw, dw_ref, 1e-4);
}
