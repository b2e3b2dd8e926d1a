// precision = bf16 on the cpu backend (dp::Precision): the rounding itself against a reference
// computed another way, each convolution and linear pass against double loops on bf16-rounded
// inputs, and whole LeNet steps: how far bf16 moves a step from fp32, k replicas against one,
// and a short training run that learns without allocating in the step loop.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "dp/backend.hpp"
#include "dp/bf16.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;
using dptest::host_tensor;
using dptest::random_vector;

namespace {

// ---- the rounding ------------------------------------------------------------------------------

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// The nearest bf16 by distance in double: the two bf16 values around x (toward zero: x's low 16
// bits cleared; away: the next bf16 magnitude, the largest finite's neighbour being 2^128 as
// IEEE overflow rounding treats it), the closer one, the one with an even last bit on a tie.
float reference_bf16(float x) {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return x;
  const uint32_t sign = bits_of(x) & 0x80000000u, mag = bits_of(x) & 0x7FFFFFFFu;
  const uint32_t down = mag & 0xFFFF0000u, up = down + 0x10000u;
  const double a = std::fabs(static_cast<double>(x));
  const double lo = from_bits(down);
  const double hi = up == 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(from_bits(up));
  uint32_t chosen;
  if (a - lo < hi - a)
    chosen = down;
  else if (a - lo > hi - a)
    chosen = up;
  else
    chosen = ((down >> 16) & 1u) == 0 ? down : up;
  return from_bits(sign | chosen);
}

// Same value, or both NaN of the same sign; -0 and +0 told apart.
bool same_bf16(float actual, float expected) {
  if (std::isnan(expected))
    return std::isnan(actual) && std::signbit(actual) == std::signbit(expected);
  return bits_of(actual) == bits_of(expected);
}

// ---- convolution and linear passes -------------------------------------------------------------

fvec rounded(const fvec& v) {
  fvec r(v.size());
  std::transform(v.begin(), v.end(), r.begin(), dp::round_to_bf16);
  return r;
}

bool all_bf16(const fvec& v) {
  return std::all_of(v.begin(), v.end(), [](float f) { return dp::round_to_bf16(f) == f; });
}

std::unique_ptr<dp::Backend> make_bf16(dp::CpuKernels kernels) {
  dp::BackendOptions options;
  options.cpu_threads = 2;
  options.cpu_kernels = kernels;
  options.precision = dp::Precision::bf16;
  return dp::create_backend(options);
}

// Tolerances, relative to max(|a|, |b|, 1) as every op test's. The passes accumulate exact
// products of bf16 values in fp32, so against double loops on the rounded inputs they carry the
// fp32 op tests' accumulation error: 3e-5 (test_cpu_conv.cpp's forward, Winograd's transforms
// included; 1e-4 for the longer sums of the gradients). Activations, input gradients and a
// convolution's weight gradient are then rounded to bf16: at most half an ulp of its 8-bit
// significand, 2^-8 of the value (measured 3.3e-3 to 3.86e-3 against the bound 3.94e-3). Linear
// layers' weight gradients and bias gradients stay fp32 (measured 1e-7 to 4e-6). A pass that
// skipped rounding an input misses the reference by more (fp32's filter gradient: 8e-3 to
// 2.5e-2, two to six times the rounded tolerance); one that skipped rounding its output is caught
// by all_bf16.
constexpr double kAccumulation = 3e-5, kGradAccumulation = 1e-4;
constexpr double kOutputRounding = 1.0 / 256;

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, k, r, s, stride, pad;
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - s) / stride + 1; }
};

// im2col with OpenBLAS or oneDNN's SGEMM, oneDNN's NHWC kernels and its blocked and Winograd
// formulations (16 channels), as test_cpu_conv.cpp's cases reach them.
const ConvCase kCases[] = {
    {"3x3 pad 1, odd sizes", 3, 5, 7, 9, 4, 3, 3, 1, 1},
    {"3x3 stride 2 pad 1", 2, 3, 9, 8, 4, 3, 3, 2, 1},
    {"lenet conv2 alike 20->50 5x5", 4, 20, 9, 9, 50, 5, 5, 1, 0},
    {"16->16 3x3 pad 1 (blocked, Winograd)", 2, 16, 6, 6, 16, 3, 3, 1, 1},
};

// Double loops over NCHW: y = conv(x, w) + b; dx, dw, db the adjoints with output gradient dy.
void conv_reference(const ConvCase& cc, const fvec& x, const fvec& w, const fvec& b, const fvec& dy,
                    dvec& y, dvec& dx, dvec& dw, dvec& db) {
  const int64_t P = cc.p(), Q = cc.q();
  y.assign(static_cast<size_t>(cc.n * cc.k * P * Q), 0.0);
  dx.assign(x.size(), 0.0);
  dw.assign(w.size(), 0.0);
  db.assign(b.size(), 0.0);
  for (int64_t n = 0; n < cc.n; ++n)
    for (int64_t k = 0; k < cc.k; ++k)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          const auto yi = static_cast<size_t>(((n * cc.k + k) * P + p) * Q + q);
          double sum = b[static_cast<size_t>(k)];
          const double g = dy[yi];
          db[static_cast<size_t>(k)] += g;
          for (int64_t c = 0; c < cc.c; ++c)
            for (int64_t r = 0; r < cc.r; ++r)
              for (int64_t s = 0; s < cc.s; ++s) {
                const int64_t ih = p * cc.stride - cc.pad + r, iw = q * cc.stride - cc.pad + s;
                if (ih < 0 || ih >= cc.h || iw < 0 || iw >= cc.w) continue;
                const auto xi = static_cast<size_t>(((n * cc.c + c) * cc.h + ih) * cc.w + iw);
                const auto wi = static_cast<size_t>(((k * cc.c + c) * cc.r + r) * cc.s + s);
                sum += static_cast<double>(x[xi]) * w[wi];
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
          y[yi] = sum;
        }
}

}  // namespace

TEST_CASE("round_to_bf16 rounds to the nearest bf16, ties to even", "[cpu][bf16]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // bits -> expected bits
  const std::vector<std::pair<uint32_t, uint32_t>> edges = {
      {0x3F800000u, 0x3F800000u},  // 1: exact
      {0x3F808000u, 0x3F800000u},  // 1 + half an ulp: tie, down to even
      {0x3F818000u, 0x3F820000u},  // tie from an odd last bit: up to even
      {0x3F808001u, 0x3F810000u},  // just above the tie: up
      {0x3F807FFFu, 0x3F800000u},  // just below: down
      {0xBF808001u, 0xBF810000u},  // the same, negative: magnitudes round alike
      {0x7F7F0000u, 0x7F7F0000u},  // the largest finite bf16
      {0x7F7F7FFFu, 0x7F7F0000u},  // below its half ulp: stays finite
      {0x7F7F8000u, 0x7F800000u},  // its tie (odd last bit): overflows to inf
      {0x7F7FFFFFu, 0x7F800000u},  // FLT_MAX: inf
      {0xFF7FFFFFu, 0xFF800000u},  // -FLT_MAX: -inf
      {0x7F800000u, 0x7F800000u},  // inf
      {0xFF800000u, 0xFF800000u},  // -inf
      {0x00000000u, 0x00000000u},  // +0
      {0x80000000u, 0x80000000u},  // -0 stays -0
      {0x00000001u, 0x00000000u},  // the smallest subnormal: to 0
      {0x80000001u, 0x80000000u},  // negative: to -0
      {0x00008000u, 0x00000000u},  // subnormal tie: to even (0)
      {0x00018000u, 0x00020000u},  // subnormal tie from odd: up
      {0x007FFFFFu, 0x00800000u},  // the largest subnormal: up to the smallest normal
  };
  for (const auto& [in, out] : edges) {
    INFO("bits 0x" << std::hex << in);
    CHECK(bits_of(dp::round_to_bf16(from_bits(in))) == out);
    CHECK(bits_of(reference_bf16(from_bits(in))) == out);  // the reference agrees
  }
  // NaNs stay NaN with their sign, including those whose payload is in the low 16 bits only
  // (plain truncation would make them infinities).
  for (uint32_t b : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7F80FFFFu, 0x7FFFFFFFu}) {
    INFO("bits 0x" << std::hex << b);
    const float r = dp::round_to_bf16(from_bits(b));
    CHECK(std::isnan(r));
    CHECK(std::signbit(r) == ((b & 0x80000000u) != 0));
  }
  CHECK(std::isnan(dp::round_to_bf16(nan)));
  CHECK(dp::round_to_bf16(inf) == inf);
  // A million random bit patterns (every exponent, NaNs and infinities included), plus every
  // low-16-bit pattern of one value (every rounding position).
  std::mt19937 rng(12345);
  int64_t mismatches = 0;
  for (int i = 0; i < 1000000; ++i) {
    const float x = from_bits(static_cast<uint32_t>(rng()));
    if (!same_bf16(dp::round_to_bf16(x), reference_bf16(x))) ++mismatches;
  }
  for (uint32_t low = 0; low < 0x10000u; ++low) {
    const float x = from_bits(0x40490000u | low);
    if (!same_bf16(dp::round_to_bf16(x), reference_bf16(x))) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("cpu bf16 conv passes: double loops on bf16-rounded inputs", "[cpu][bf16][ops]") {
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("kernels " << dp::cpu_kernels_name(kernels) << ", layout " << dp::layout_name(layout));
  auto bf16 = make_bf16(kernels);
  auto fp32 = make_cpu(2, kernels);
  for (const ConvCase& cc : kCases) {
    INFO(cc.name);
    dp::ConvGeometry g;
    g.max_batch = cc.n;
    g.in_channels = cc.c, g.in_h = cc.h, g.in_w = cc.w, g.out_channels = cc.k;
    g.kernel_h = cc.r, g.kernel_w = cc.s, g.stride_h = g.stride_w = cc.stride;
    g.pad_h = g.pad_w = cc.pad;
    g.layout = layout;
    const fvec x = random_vector(cc.n * cc.c * cc.h * cc.w, 1);
    const fvec w = random_vector(cc.k * cc.c * cc.r * cc.s, 2);
    const fvec b = random_vector(cc.k, 3);
    const fvec dy = random_vector(cc.n * cc.k * cc.p() * cc.q(), 4);
    dvec y_ref, dx_ref, dw_ref, db_ref;
    conv_reference(cc, rounded(x), rounded(w), b, rounded(dy), y_ref, dx_ref, dw_ref, db_ref);

    const dp::Shape xs{cc.n, cc.c, cc.h, cc.w}, ys{cc.n, cc.k, cc.p(), cc.q()},
        ws{cc.k, cc.c, cc.r, cc.s};
    auto run = [&](dp::Backend& backend, fvec& y, fvec& dx, fvec& dw, fvec& db) {
      const auto plan = backend.plan_conv(g);
      fvec xl = to_layout(x, layout, cc.n, cc.c, cc.h, cc.w), wa = w, ba = b;
      fvec dyl = to_layout(dy, layout, cc.n, cc.k, cc.p(), cc.q());
      y.assign(dyl.size(), -7.0f), dx.assign(xl.size(), 5.0f), dw.assign(w.size(), 5.0f);
      db.assign(b.size(), 5.0f);
      const dp::Tensor bt = host_tensor(ba, {cc.k}), dbt = host_tensor(db, {cc.k});
      backend.conv_forward(*plan, host_tensor(xl, xs, layout), host_tensor(wa, ws), &bt,
                           host_tensor(y, ys, layout));
      backend.conv_backward_data(*plan, host_tensor(dyl, ys, layout), host_tensor(wa, ws),
                                 host_tensor(dx, xs, layout));
      backend.conv_backward_filter(*plan, host_tensor(xl, xs, layout), host_tensor(dyl, ys, layout),
                                   host_tensor(dw, ws), &dbt);
      CHECK(wa == w);  // the master weights are not touched
      CHECK(xl == to_layout(x, layout, cc.n, cc.c, cc.h, cc.w));
      y = from_layout(y, layout, cc.n, cc.k, cc.p(), cc.q());
      dx = from_layout(dx, layout, cc.n, cc.c, cc.h, cc.w);
    };
    fvec y, dx, dw, db;
    run(*bf16, y, dx, dw, db);
    CHECK(all_bf16(y));
    CHECK(all_bf16(dx));
    CHECK(all_bf16(dw));
    CHECK_FALSE(all_bf16(db));  // fp32 sums: bf16 values only by chance
    check_close(y, y_ref, kAccumulation + kOutputRounding);
    check_close(dx, dx_ref, kGradAccumulation + kOutputRounding);
    check_close(dw, dw_ref, kGradAccumulation + kOutputRounding);
    check_close(db, db_ref, kGradAccumulation);
    // fp32 does not round: its filter gradient misses the bf16 reference (rounded inputs).
    fvec y32, dx32, dw32, db32;
    run(*fp32, y32, dx32, dw32, db32);
    CHECK_FALSE(dptest::compare(to_double(dw32), dw_ref, kGradAccumulation + kOutputRounding).ok);
    CHECK_FALSE(all_bf16(y32));
    CHECK_FALSE(all_bf16(dw32));
  }
}

TEST_CASE("cpu bf16 linear passes: double loops on bf16-rounded inputs", "[cpu][bf16][ops]") {
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  INFO("kernels " << dp::cpu_kernels_name(kernels));
  auto bf16 = make_bf16(kernels);
  const int64_t N = 7, IN = 300, OUT = 13;
  check_error_mentions([&] { bf16->prepare_linear(0, IN, OUT); },
                       {"cpu backend: prepare_linear:", "must be >= 1"});
  bf16->prepare_linear(N, IN, OUT);
  const size_t peak = bf16->peak_memory();
  fvec x = random_vector(N * IN, 5), w = random_vector(OUT * IN, 6), b = random_vector(OUT, 7);
  fvec dy = random_vector(N * OUT, 8);
  const fvec x0 = x, w0 = w, xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
  dvec y_ref(static_cast<size_t>(N * OUT)), dx_ref(x.size(), 0.0), dw_ref(w.size(), 0.0),
      db_ref(b.size(), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      const auto yi = static_cast<size_t>(n * OUT + o);
      double sum = b[static_cast<size_t>(o)];
      db_ref[static_cast<size_t>(o)] += dyr[yi];
      for (int64_t i = 0; i < IN; ++i) {
        const auto xi = static_cast<size_t>(n * IN + i), wi = static_cast<size_t>(o * IN + i);
        sum += static_cast<double>(xr[xi]) * wr[wi];
        dx_ref[xi] += static_cast<double>(dyr[yi]) * wr[wi];
        dw_ref[wi] += static_cast<double>(dyr[yi]) * xr[xi];
      }
      y_ref[yi] = sum;
    }
  fvec y(static_cast<size_t>(N * OUT), -7.0f), dx(x.size(), 5.0f), dw(w.size(), 5.0f),
      db(b.size(), 5.0f);
  const dp::Tensor xt = host_tensor(x, {N, IN}), wt = host_tensor(w, {OUT, IN}),
                   bt = host_tensor(b, {OUT}), dyt = host_tensor(dy, {N, OUT}),
                   dxt = host_tensor(dx, {N, IN}), dbt = host_tensor(db, {OUT});
  bf16->linear_forward(xt, wt, &bt, host_tensor(y, {N, OUT}));
  bf16->linear_backward(xt, wt, dyt, &dxt, host_tensor(dw, {OUT, IN}), &dbt);
  CHECK(x == x0);
  CHECK(w == w0);
  CHECK(all_bf16(y));
  CHECK(all_bf16(dx));
  check_close(y, y_ref, kAccumulation + kOutputRounding);
  check_close(dx, dx_ref, kGradAccumulation + kOutputRounding);
  check_close(dw, dw_ref, kGradAccumulation);
  check_close(db, db_ref, kGradAccumulation);
  CHECK(bf16->peak_memory() == peak);  // the copies fit in what prepare_linear reserved
}

TEST_CASE("cpu bf16 batch norm rounds its output to bf16 once after its epilogue",
          "[cpu][bf16][ops]") {
  // Precision bf16 rounds a batch norm's output (after the residual add and the ReLU) and
  // nothing else of it (Backend::batchnorm_forward_train): against the fp32 backend's same op,
  // y must be that y rounded, bit for bit, and the statistics the fp32 ones' bits. Each op that
  // writes y: training, evaluation, the synchronised batch norm's normalising pass; both layouts
  // and the (N, C) form.
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  INFO("kernels " << dp::cpu_kernels_name(kernels));
  auto bf16 = make_bf16(kernels);
  dp::BackendOptions options;
  options.cpu_threads = 2;
  options.cpu_kernels = kernels;
  auto fp32 = dp::create_backend(options);
  const int64_t N = 3, C = 5, H = 4, W = 6;
  const dp::Shape shapes[] = {{N, C, H, W}, {N * H, C}};
  for (const dp::Shape& shape : shapes) {
    for (const dp::Layout layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
      if (shape.rank == 2 && layout == dp::Layout::nhwc) continue;
      for (const bool residual : {false, true}) {
        for (const bool relu : {false, true}) {
          for (const int op : {0, 1, 2}) {
            const char* names[] = {"training", "evaluation", "synchronised"};
            INFO(shape.str() << " " << dp::layout_name(layout) << (residual ? ", residual" : "")
                             << (relu ? ", ReLU" : "") << ", " << names[op]);
            // What one backend writes: y, then the running and saved statistics.
            const auto run = [&](dp::Backend& b) {
              fvec x = random_vector(shape.numel(), 21, -2.0f, 2.0f);
              fvec r = random_vector(shape.numel(), 22);
              fvec gamma = random_vector(C, 23, 0.5f, 1.5f), beta = random_vector(C, 24);
              fvec rm = random_vector(C, 25), rv = random_vector(C, 26, 0.5f, 2.0f);
              fvec mean = random_vector(C, 27), var = random_vector(C, 28, 0.5f, 2.0f);
              fvec sm(static_cast<size_t>(C)), si(static_cast<size_t>(C));
              fvec y(static_cast<size_t>(shape.numel()), -9.0f);
              const dp::Tensor xt = host_tensor(x, shape, layout),
                               rt = host_tensor(r, shape, layout);
              const dp::Tensor yt = host_tensor(y, shape, layout);
              const dp::Tensor g = host_tensor(gamma, {C}), bt = host_tensor(beta, {C});
              const dp::Tensor rmt = host_tensor(rm, {C}), rvt = host_tensor(rv, {C});
              const dp::Tensor mt = host_tensor(mean, {C}), vt = host_tensor(var, {C});
              const dp::Tensor smt = host_tensor(sm, {C}), sit = host_tensor(si, {C});
              const dp::BnEpilogue e{residual ? &rt : nullptr, relu};
              if (op == 0) {
                b.batchnorm_forward_train(xt, g, bt, rmt, rvt, 0.1f, 1e-5f, smt, sit, yt, e);
              } else if (op == 1) {
                b.batchnorm_forward_infer(xt, g, bt, rmt, rvt, 1e-5f, yt, e);
              } else {
                b.batchnorm_apply_stats(xt, g, bt, mt, vt, rmt, rvt, 0.1f, 1e-5f, shape.numel() / C,
                                        smt, sit, yt, e);
              }
              return std::vector<fvec>{y, rm, rv, sm, si};
            };
            const std::vector<fvec> want = run(*fp32), got = run(*bf16);
            REQUIRE_FALSE(all_bf16(want[0]));  // the rounding changes values: the case sees it
            size_t differ = 0;
            for (size_t i = 0; i < want[0].size(); ++i) {
              differ += same_bf16(got[0][i], reference_bf16(want[0][i])) ? 0 : 1;
            }
            CHECK(differ == 0);
            for (size_t k = 1; k < want.size(); ++k) CHECK(got[k] == want[k]);
          }
        }
      }
    }
  }
}

TEST_CASE("the cuda backend takes bf16 where it takes fp32", "[cpu][bf16]") {
  // Its bf16 path runs on the GPU (tests/cuda/test_cuda_bf16.cpp); without a GPU, or in a build
  // without CUDA, a bf16 backend fails for the reason an fp32 one does, never its precision.
  const auto creation_error = [](dp::Precision p) -> std::string {
    dp::BackendOptions options;
    options.kind = dp::BackendKind::cuda;
    options.precision = p;
    try {
      (void)dp::create_backend(options);
    } catch (const dp::Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string fp32 = creation_error(dp::Precision::fp32);
  CHECK(creation_error(dp::Precision::bf16) == fp32);
  CHECK(fp32.find("bf16") == std::string::npos);
  CHECK(std::string(dp::precision_name(dp::Precision::bf16)) == "bf16");
}
