// dprun's own convolution passes for few input channels (conv_small.cu: dp::kConvAlgoDprunSmallC),
// run by the kernel emulator against an exact reference: each output, forward y or filter
// gradient dw, is a sum of L products computed in double, and the kernel's fp32 sum of the same
// products (in any order, one rounding per addition) is within L * 2^-24 * M of it, M the sum of
// the products' magnitudes (the standard bound of a sum of L terms). With bf16 the passes round
// their operands first: the reference takes the same rounded operands. Nothing is written
// outside the outputs. (That two runs give the same bits is checked on a GPU, by test_cuda: the
// emulator runs a block's threads in one order, so it could not fail here.)
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/kernels.cuh"
#include "dp/bf16.hpp"
#include "emu_buffers.hpp"
#include "support/check.hpp"

namespace kernels = dp::cuda_emu::kernels;
using emutest::Guarded;
using fvec = std::vector<float>;

namespace {

struct Shape {
  int64_t n, h, w;
  int c, k, r, s, stride, pad;
  kernels::SmallConv conv() const {
    kernels::SmallConv g;
    g.n = n;
    g.h = h;
    g.w = w;
    g.out_h = (h + 2 * pad - r) / stride + 1;
    g.out_w = (w + 2 * pad - s) / stride + 1;
    g.c = c;
    g.k = k;
    g.r = r;
    g.s = s;
    g.stride_h = g.stride_w = stride;
    g.pad_h = g.pad_w = pad;
    return g;
  }
};

float bf16(float v) {
  return std::bit_cast<float>(dp::round_bits_to_bf16(std::bit_cast<uint32_t>(v)));
}

/// The exact results (in double) and magnitudes of y = conv(x, w) (NHWC) and
/// dw = sum dy * x (KCRS), x NHWC, w KCRS, dy NHWC.
struct Exact {
  std::vector<double> y, my, dw, mdw;
};
Exact exact(const kernels::SmallConv& g, const fvec& x, const fvec& w, const fvec& dy) {
  Exact e;
  const int64_t outputs = g.n * g.out_h * g.out_w * g.k, values = int64_t{g.k} * g.c * g.r * g.s;
  e.y.assign(static_cast<size_t>(outputs), 0.0);
  e.my = e.y;
  e.dw.assign(static_cast<size_t>(values), 0.0);
  e.mdw = e.dw;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t oh = 0; oh < g.out_h; ++oh)
      for (int64_t ow = 0; ow < g.out_w; ++ow)
        for (int k = 0; k < g.k; ++k) {
          const auto out = static_cast<size_t>(((n * g.out_h + oh) * g.out_w + ow) * g.k + k);
          for (int c = 0; c < g.c; ++c)
            for (int r = 0; r < g.r; ++r)
              for (int s = 0; s < g.s; ++s) {
                const int64_t ih = oh * g.stride_h - g.pad_h + r,
                              iw = ow * g.stride_w - g.pad_w + s;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const double xv = x[static_cast<size_t>(((n * g.h + ih) * g.w + iw) * g.c + c)];
                const auto tap = static_cast<size_t>(((int64_t{k} * g.c + c) * g.r + r) * g.s + s);
                e.y[out] += xv * w[tap];
                e.my[out] += std::fabs(xv * w[tap]);
                e.dw[tap] += xv * dy[out];
                e.mdw[tap] += std::fabs(xv * dy[out]);
              }
        }
  return e;
}

/// How many of `actual` are farther from `expected` than L * 2^-24 * M (L terms per sum).
int64_t outside(const fvec& actual, const std::vector<double>& expected,
                const std::vector<double>& magnitude, double terms) {
  REQUIRE(actual.size() == expected.size());
  int64_t bad = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double bound = terms * std::ldexp(1.0, -24) * magnitude[i];
    if (!(std::fabs(actual[i] - expected[i]) <= bound)) {
      if (bad < 3) UNSCOPED_INFO("output " << i << ": " << actual[i] << " against " << expected[i]);
      ++bad;
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("emulated cuda: the few-channel convolution's forward and filter gradient are exact sums",
          "[emulated][conv]") {
  // ResNet-18's and LeNet's first layers (small batches), padding wider than the kernel's
  // reach, strides with odd edges, 3 and 4 channels, 1x1 and 5x5, K not dividing 256, the
  // largest filter the passes take (K 256, 32 taps), and more positions than one block of the
  // filter gradient sums (so its second level adds several: 3, and 37, more than a warp has
  // lanes).
  const Shape shape =
      GENERATE(Shape{3, 28, 28, 1, 64, 3, 3, 1, 1}, Shape{2, 28, 28, 1, 20, 3, 3, 1, 0},
               Shape{2, 9, 7, 3, 12, 3, 3, 2, 2}, Shape{3, 6, 5, 4, 20, 1, 1, 2, 0},
               Shape{2, 12, 11, 1, 6, 5, 5, 1, 2}, Shape{1, 5, 6, 2, 256, 4, 4, 1, 1},
               Shape{5, 16, 16, 1, 3, 3, 3, 1, 1}, Shape{24, 28, 28, 1, 4, 3, 3, 1, 1});
  const kernels::SmallConv g = shape.conv();
  INFO("n " << g.n << " " << g.h << "x" << g.w << " c " << g.c << " k " << g.k << " " << g.r << "x"
            << g.s << " stride " << g.stride_h << " pad " << g.pad_h);
  REQUIRE(kernels::small_conv_fits(g));
  const int64_t positions = g.n * g.out_h * g.out_w;
  const auto y_n = static_cast<size_t>(positions * g.k);
  const auto w_n = static_cast<size_t>(int64_t{g.k} * g.c * g.r * g.s);
  const fvec x = dptest::random_vector(g.n * g.h * g.w * g.c, 71, -2.0f, 2.0f);
  const fvec w = dptest::random_vector(static_cast<int64_t>(w_n), 72);
  const fvec dy = dptest::random_vector(static_cast<int64_t>(y_n), 73);

  for (const bool round : {false, true}) {
    INFO((round ? "operands rounded to bf16" : "fp32"));
    fvec xr = x, wr = w;
    if (round) {
      for (float& v : xr) v = bf16(v);
      for (float& v : wr) v = bf16(v);
    }
    const Exact e = exact(g, xr, wr, dy);
    // y aligned (K % 4 == 0: four channels a thread, one float4 store) and one float off (a
    // channel a thread).
    for (const size_t offset : {size_t{0}, size_t{1}}) {
      INFO((offset ? "y misaligned" : "y aligned"));
      Guarded<float> in(x), filter(w), y(y_n, offset);
      kernels::small_conv_forward(in.data(), filter.data(), y.data(), g, round, nullptr);
      emutest::require_no_pending_error();
      CHECK(outside(y.values(), e.y, e.my, g.c * g.r * g.s) == 0);
      EMU_CHECK_INTACT(y);
    }
  }

  // The filter gradient, with x and dy rounded to bf16 as they are read and each dw rounded to
  // bf16 once (a bf16 pass: within the sum's bound plus half a bf16 ulp of the result, and a bf16
  // value), or not.
  const size_t scratch = kernels::small_conv_filter_scratch_floats(g);
  CHECK(scratch == static_cast<size_t>(kernels::small_conv_filter_blocks(g)) * w_n);
  for (const bool round : {false, true}) {
    INFO((round ? "operands rounded to bf16" : "fp32"));
    fvec xr = x, dyr = dy;
    if (round) {
      for (float& v : xr) v = bf16(v);
      for (float& v : dyr) v = bf16(v);
    }
    const Exact e = exact(g, xr, w, dyr);
    Guarded<float> in(x), grad(dy), dw(w_n), partial(scratch);
    kernels::small_conv_filter(in.data(), grad.data(), dw.data(), g, partial.data(), round,
                               nullptr);
    emutest::require_no_pending_error();
    const fvec got = dw.values();
    if (round) {
      int64_t bad = 0, not_bf16 = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double a = std::max(std::fabs(static_cast<double>(got[i])), 0x1p-126);
        const double half_ulp = std::ldexp(1.0, std::ilogb(a) - 8);
        const double bound = static_cast<double>(positions) * std::ldexp(1.0, -24) * e.mdw[i];
        bad += std::fabs(got[i] - e.dw[i]) <= bound + half_ulp ? 0 : 1;
        not_bf16 += bf16(got[i]) == got[i] ? 0 : 1;
      }
      CHECK(bad == 0);
      CHECK(not_bf16 == 0);
      // A packed bf16 dy (a batch norm's dx, rounded already) gives the same bits.
      std::vector<uint16_t> packed(dy.size());
      for (size_t i = 0; i < dy.size(); ++i)
        packed[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(dyr[i]) >> 16);
      Guarded<uint16_t> grad16(packed);
      Guarded<float> dw16(w_n), partial16(scratch);
      kernels::small_conv_filter(in.data(), grad16.data(), dw16.data(), g, partial16.data(), true,
                                 nullptr);
      emutest::require_no_pending_error();
      CHECK(dw16.values() == got);
      EMU_CHECK_INTACT(dw16);
    } else {
      CHECK(outside(got, e.dw, e.mdw, static_cast<double>(positions)) == 0);
    }
    EMU_CHECK_INTACT(dw);
    EMU_CHECK_INTACT(partial);
  }
}

TEST_CASE(
    "emulated cuda: the few-channel convolution reads and writes a (K, R, S, C) filter with the "
    "(K, C, R, S) filter's bits",
    "[emulated][conv]") {
  // SmallConv::filter_krsc (an NHWC model's Conv2d weight): the same taps in the same order,
  // only where each value sits in memory changes. 1 channel (the two orders coincide), 2, 3 and
  // 4 channels with square and non-square kernels.
  const Shape shape =
      GENERATE(Shape{2, 9, 7, 3, 12, 3, 3, 2, 2}, Shape{3, 6, 5, 4, 20, 1, 1, 2, 0},
               Shape{1, 5, 6, 2, 16, 4, 4, 1, 1}, Shape{3, 10, 10, 1, 8, 3, 3, 1, 1},
               Shape{4, 8, 8, 3, 64, 3, 3, 1, 1});
  kernels::SmallConv kcrs = shape.conv();
  kernels::SmallConv krsc = kcrs;
  krsc.filter_krsc = true;
  INFO("n " << kcrs.n << " " << kcrs.h << "x" << kcrs.w << " c " << kcrs.c << " k " << kcrs.k << " "
            << kcrs.r << "x" << kcrs.s);
  REQUIRE(kernels::small_conv_fits(krsc));
  const int64_t rs = int64_t{kcrs.r} * kcrs.s, taps = kcrs.c * rs;
  const auto w_n = static_cast<size_t>(kcrs.k * taps);
  const auto y_n = static_cast<size_t>(kcrs.n * kcrs.out_h * kcrs.out_w * kcrs.k);
  const fvec x = dptest::random_vector(kcrs.n * kcrs.h * kcrs.w * kcrs.c, 81, -2.0f, 2.0f);
  const fvec w = dptest::random_vector(static_cast<int64_t>(w_n), 82);
  const fvec dy = dptest::random_vector(static_cast<int64_t>(y_n), 83);
  // Value (k, c, r, s) at ((k * C + c) * R + r) * S + s, or at ((k * R + r) * S + s) * C + c.
  const auto to_krsc = [&](const fvec& v) {
    fvec out(v.size());
    for (int64_t k = 0; k < kcrs.k; ++k)
      for (int64_t c = 0; c < kcrs.c; ++c)
        for (int64_t t = 0; t < rs; ++t)
          out[static_cast<size_t>((k * rs + t) * kcrs.c + c)] =
              v[static_cast<size_t>((k * kcrs.c + c) * rs + t)];
    return out;
  };
  const size_t scratch = kernels::small_conv_filter_scratch_floats(kcrs);
  for (const bool round : {false, true}) {
    INFO((round ? "bf16" : "fp32"));
    Guarded<float> in(x), grad(dy), w_kcrs(w), w_krsc(to_krsc(w));
    Guarded<float> y_kcrs(y_n), y_krsc(y_n), dw_kcrs(w_n), dw_krsc(w_n), partial(scratch);
    kernels::small_conv_forward(in.data(), w_kcrs.data(), y_kcrs.data(), kcrs, round, nullptr);
    kernels::small_conv_forward(in.data(), w_krsc.data(), y_krsc.data(), krsc, round, nullptr);
    kernels::small_conv_filter(in.data(), grad.data(), dw_kcrs.data(), kcrs, partial.data(), round,
                               nullptr);
    kernels::small_conv_filter(in.data(), grad.data(), dw_krsc.data(), krsc, partial.data(), round,
                               nullptr);
    emutest::require_no_pending_error();
    CHECK(y_krsc.values() == y_kcrs.values());
    CHECK(dw_krsc.values() == to_krsc(dw_kcrs.values()));
    EMU_CHECK_INTACT(y_krsc);
    EMU_CHECK_INTACT(dw_krsc);
  }
}

TEST_CASE("emulated cuda: the few-channel convolution takes what fits its registers and memory",
          "[emulated][conv]") {
  const Shape base{2, 8, 8, 1, 64, 3, 3, 1, 1};
  CHECK(kernels::small_conv_fits(base.conv()));
  auto with = [&](int c, int k, int r, int s) {
    Shape t = base;
    t.c = c;
    t.k = k;
    t.r = r;
    t.s = s;
    return kernels::small_conv_fits(t.conv());
  };
  CHECK(with(4, 64, 3, 3));         // 36 taps
  CHECK_FALSE(with(5, 8, 1, 1));    // 5 channels
  CHECK_FALSE(with(2, 8, 5, 5));    // 50 taps
  CHECK(with(1, 256, 5, 5));        // 25 taps, 6400 filter values
  CHECK_FALSE(with(1, 257, 1, 1));  // more output channels than a block has threads
  CHECK_FALSE(with(4, 256, 3, 3));  // 9216 filter values
  // The filter gradient's blocks depend on the shape alone: 128 positions each, at most 1024.
  Shape big = base;
  big.n = 32;
  big.h = big.w = 28;
  CHECK(kernels::small_conv_filter_blocks(big.conv()) == 196);
  big.n = 256;
  CHECK(kernels::small_conv_filter_blocks(big.conv()) == 1024);
  CHECK(kernels::small_conv_filter_blocks(base.conv()) == 1);
  // They index in 32 bits: a batch whose y would hold 2^31 values or more is not theirs.
  Shape huge = base;
  huge.n = (int64_t{1} << 31) / (8 * 8 * 64);  // y: exactly 2^31 values
  CHECK_FALSE(kernels::small_conv_fits(huge.conv()));
  huge.n -= 1;
  CHECK(kernels::small_conv_fits(huge.conv()));
}
