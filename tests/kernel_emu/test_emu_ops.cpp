// The CUDA backend's own elementwise, reduction, bf16-rounding, pooling, loss, optimizer, gather
// and rank-sum kernels, run by the kernel emulator against the cpu backend (the same inputs as
// tests/cuda/test_cuda_ops.cpp, whose GPU twins compare the whole cuda backend) or against exact
// host computations. The expected agreement is stated per op: bits where both sides compute the
// same float expression, a tolerance where the order of a sum or the math library differs.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include "cuda/kernels.cuh"
#include "dp/augment.hpp"
#include "dp/backend.hpp"
#include "dp/bf16.hpp"
#include "dp/optimizer.hpp"
#include "emu_buffers.hpp"
#include "support/check.hpp"

namespace kernels = dp::cuda_emu::kernels;
using emutest::Guarded;
using fvec = std::vector<float>;
using ivec = std::vector<int32_t>;

namespace {

dp::Backend& cpu() {
  static const std::unique_ptr<dp::Backend> backend = [] {
    dp::BackendOptions options;
    options.kind = dp::BackendKind::cpu;
    options.cpu_threads = 1;
    return dp::create_backend(options);
  }();
  return *backend;
}

dp::Tensor t(fvec& v, dp::Shape s, dp::Layout l = dp::Layout::nchw) {
  return dptest::host_tensor(v, s, l);
}
dp::Tensor t(ivec& v, dp::Shape s) { return dptest::host_tensor(v, s); }

/// Values on a grid of `step`: exact zeros and ties occur.
fvec quantized(int64_t n, uint64_t seed, float lo, float hi, float step) {
  fvec v = dptest::random_vector(n, seed, lo, hi);
  for (float& x : v) x = step * static_cast<float>(static_cast<int>(x / step));
  return v;
}

bool same_bits(const fvec& a, const fvec& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

#define EMU_CHECK_CLOSE(actual, expected, rel)                    \
  do {                                                            \
    const auto cmp_ = dptest::compare((actual), (expected), rel); \
    INFO(cmp_.message);                                           \
    CHECK(cmp_.ok);                                               \
  } while (0)

}  // namespace

TEST_CASE("emulated cuda: relu, add, scale and fill equal the cpu backend's bits",
          "[emulated][elementwise]") {
  const int64_t n = GENERATE(int64_t{1}, int64_t{1000}, int64_t{65537});
  INFO("n = " << n);
  const auto s = static_cast<size_t>(n);
  fvec a = quantized(n, 61, -1.0f, 1.0f, 0.125f), b = dptest::random_vector(n, 62),
       dy = dptest::random_vector(n, 63);
  a[0] = std::numeric_limits<float>::quiet_NaN();  // NaN stays NaN through relu
  Guarded<float> ga(a), gb(b), gdy(dy), gy(s), gdx(s);
  fvec y(s), dx(s);
  cpu().relu_forward(t(a, {n}), t(y, {n}));
  kernels::relu_forward(ga.data(), gy.data(), n, nullptr);
  CHECK(same_bits(gy.values(), y));
  cpu().relu_backward(t(y, {n}), t(dy, {n}), t(dx, {n}));
  kernels::relu_backward(gy.data(), gdy.data(), gdx.data(), n, nullptr);
  CHECK(same_bits(gdx.values(), dx));
  if (n > 1) {
    // One element in: no pointer 16-byte aligned, the scalar kernels (above: the float4 ones
    // and their tail).
    Guarded<float> ry(s), rdx(s);
    kernels::relu_forward(ga.data() + 1, ry.data() + 1, n - 1, nullptr);
    kernels::relu_backward(gy.data() + 1, gdy.data() + 1, rdx.data() + 1, n - 1, nullptr);
    const fvec ry_values = ry.values(), rdx_values = rdx.values();
    CHECK(same_bits(fvec(ry_values.begin() + 1, ry_values.end()), fvec(y.begin() + 1, y.end())));
    CHECK(
        same_bits(fvec(rdx_values.begin() + 1, rdx_values.end()), fvec(dx.begin() + 1, dx.end())));
    EMU_CHECK_INTACT(ry);
    EMU_CHECK_INTACT(rdx);
  }

  for (const float alpha : {1.0f, -0.3f}) {
    cpu().add(t(y, {n}), t(b, {n}), t(y, {n}), alpha);
    kernels::add(gy.data(), gb.data(), gy.data(), n, alpha, nullptr);  // in place
    CHECK(same_bits(gy.values(), y));
  }
  if (n > 1) {
    // One element in: no pointer 16-byte aligned, the scalar kernel (above: the float4 one).
    const int64_t m = n - 1;
    fvec tail(y.begin() + 1, y.end());
    fvec b_tail(b.begin() + 1, b.end());
    cpu().add(t(tail, {m}), t(b_tail, {m}), t(tail, {m}), 0.75f);
    kernels::add(gy.data() + 1, gb.data() + 1, gy.data() + 1, m, 0.75f, nullptr);
    std::copy(tail.begin(), tail.end(), y.begin() + 1);  // y[0] untouched
    CHECK(same_bits(gy.values(), y));
  }
  cpu().scale(t(y, {n}), -0.37f);
  kernels::scale(gy.data(), n, -0.37f, nullptr);
  CHECK(same_bits(gy.values(), y));
  kernels::fill_f32(gy.data(), n, 2.5f, nullptr);
  CHECK(gy.values() == fvec(s, 2.5f));
  Guarded<int32_t> ints(s);
  kernels::fill_i32(ints.data(), n, -3, nullptr);
  CHECK(ints.values() == ivec(s, -3));
  emutest::require_no_pending_error();
  for (const auto* g : {&ga, &gb, &gdy, &gy, &gdx}) EMU_CHECK_INTACT(*g);
  EMU_CHECK_INTACT(ints);
}

TEST_CASE("emulated cuda: the bias add, its bf16-rounding twin and bf16 rounding give dp's bits",
          "[emulated][elementwise][bf16]") {
  const auto [n, c, hw] = GENERATE(std::tuple<int64_t, int64_t, int64_t>{3, 5, 7},
                                   std::tuple<int64_t, int64_t, int64_t>{2, 64, 1},
                                   std::tuple<int64_t, int64_t, int64_t>{1, 3, 1000});
  const bool nhwc = GENERATE(false, true);
  const bool wide_indices = GENERATE(false, true);
  const emutest::WideIndices forced(wide_indices);
  INFO("N " << n << " C " << c << " HW " << hw << (nhwc ? ", NHWC" : ", NCHW")
            << (wide_indices ? ", 64-bit indices" : ""));
  const auto total = static_cast<size_t>(n * c * hw);
  const fvec y0 = dptest::random_vector(static_cast<int64_t>(total), 21, -4.0f, 4.0f);
  const fvec b = dptest::random_vector(c, 22);
  fvec plain(total), rounded(total);
  for (size_t i = 0; i < total; ++i) {
    const auto ch =
        static_cast<size_t>(nhwc ? static_cast<int64_t>(i) % c : static_cast<int64_t>(i) / hw % c);
    plain[i] = y0[i] + b[ch];
    rounded[i] = dp::round_to_bf16(plain[i]);
  }
  Guarded<float> y(y0), gb(b), r(y0);
  kernels::bias_add(y.data(), gb.data(), n, c, hw, nhwc, nullptr);
  CHECK(same_bits(y.values(), plain));
  kernels::bias_add_round_bf16(r.data(), gb.data(), n, c, hw, nhwc, nullptr);
  CHECK(same_bits(r.values(), rounded));
  emutest::require_no_pending_error();
  EMU_CHECK_INTACT(y);
  EMU_CHECK_INTACT(r);
}

TEST_CASE("emulated cuda: add with packed bf16 operands gives the bits of adding their widening",
          "[emulated][elementwise]") {
  // A residual block's input gradients: conv1's (and conv3's) packed, the shortcut's fp32.
  const int64_t n = GENERATE(int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099});
  // Elements in: 1 and 4 (2 and 8 bytes into the packed operands) take the scalar kernel, 8 (16
  // bytes) the 16-byte one with y and the fp32 operand 32 bytes in.
  const int offset = GENERATE(0, 1, 4, 8);
  const auto s = static_cast<size_t>(n);
  std::vector<uint16_t> a16(s + 8), b16(s + 8);
  const fvec a_wide_all = dptest::random_vector(n + 8, 31, -3.0f, 3.0f);
  const fvec b_wide_all = dptest::random_vector(n + 8, 32, -3.0f, 3.0f);
  for (size_t i = 0; i < s + 8; ++i) {
    a16[i] = dp::packed_bf16_bits(std::bit_cast<uint32_t>(a_wide_all[i]));
    b16[i] = dp::packed_bf16_bits(std::bit_cast<uint32_t>(b_wide_all[i]));
  }
  const auto widened = [&](const std::vector<uint16_t>& v) {
    fvec out(s);
    for (size_t i = 0; i < s; ++i)
      out[i] =
          std::bit_cast<float>(static_cast<uint32_t>(v[i + static_cast<size_t>(offset)]) << 16);
    return out;
  };
  fvec a32 = dptest::random_vector(n, 33, -3.0f, 3.0f),
       b32 = dptest::random_vector(n, 34, -3.0f, 3.0f);
  Guarded<uint16_t> ga(a16), gb(b16);
  Guarded<float> ga32(a32), gb32(b32);
  for (const bool a_packed : {true, false}) {
    for (const bool b_packed : {true, false}) {
      if (!a_packed && !b_packed) continue;  // the fp32 pair: the test above
      for (const float alpha : {1.0f, -0.3f}) {
        INFO("n " << n << ", offset " << offset << ", a " << (a_packed ? "bf16" : "f32") << ", b "
                  << (b_packed ? "bf16" : "f32") << ", alpha " << alpha);
        fvec wa = a_packed ? widened(a16) : a32, wb = b_packed ? widened(b16) : b32, expected(s);
        cpu().add(t(wa, {n}), t(wb, {n}), t(expected, {n}), alpha);
        Guarded<float> gy{fvec(s + static_cast<size_t>(offset), -7.0f)};
        const void* pa = a_packed ? static_cast<const void*>(ga.data() + offset) : ga32.data();
        const void* pb = b_packed ? static_cast<const void*>(gb.data() + offset) : gb32.data();
        float* py = gy.data() + offset;
        kernels::add(pa, a_packed, pb, b_packed, py, n, alpha, nullptr);
        const fvec got = gy.values();
        CHECK(same_bits(fvec(got.begin() + offset, got.end()), expected));
        CHECK(std::all_of(got.begin(), got.begin() + offset, [](float v) { return v == -7.0f; }));
        EMU_CHECK_INTACT(gy);
      }
    }
  }
  EMU_CHECK_INTACT(ga);
  EMU_CHECK_INTACT(gb);
}

TEST_CASE("emulated cuda: round_to_bf16 gives dp::round_bits_to_bf16's bits, special values too",
          "[emulated][elementwise][bf16]") {
  fvec x = dptest::random_vector(5000, 23, -1e3f, 1e3f);
  for (const uint32_t bits :
       {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u, 0x7f7fffffu,
        0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7f8000u}) {
    x.push_back(std::bit_cast<float>(bits));  // zeros, infinities, NaNs, the largest float,
  }                                           // subnormals, ties to even, overflow to inf
  fvec expected(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    expected[i] = std::bit_cast<float>(dp::round_bits_to_bf16(std::bit_cast<uint32_t>(x[i])));
  Guarded<float> in(x), out(x.size());
  const auto n = static_cast<int64_t>(x.size());
  kernels::round_to_bf16(in.data(), out.data(), n, nullptr);
  CHECK(same_bits(out.values(), expected));
  kernels::round_to_bf16(in.data(), in.data(), n, nullptr);  // in place
  CHECK(same_bits(in.values(), expected));
  emutest::require_no_pending_error();
  EMU_CHECK_INTACT(in);
  EMU_CHECK_INTACT(out);
}

TEST_CASE("emulated cuda: packing to bf16 and widening back give dp::round_bits_to_bf16's bits",
          "[emulated][elementwise][bf16]") {
  // 5013 values: the 16-byte path's tail; from the start (aligned: the 16-byte kernels) and from
  // the second value (misaligned: the scalar ones).
  fvec x = dptest::random_vector(5000, 24, -1e3f, 1e3f);
  for (const uint32_t bits :
       {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f7fffffu, 0x00000001u,
        0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7f8000u, 0xffa00000u})
    x.push_back(std::bit_cast<float>(bits));
  for (const size_t first : {size_t{0}, size_t{1}}) {
    INFO("from value " << first);
    const fvec part(x.begin() + static_cast<std::ptrdiff_t>(first), x.end());
    const auto n = static_cast<int64_t>(part.size());
    std::vector<uint16_t> packed_expected(part.size());
    fvec widened_expected(part.size());
    for (size_t i = 0; i < part.size(); ++i) {
      const uint32_t r = dp::round_bits_to_bf16(std::bit_cast<uint32_t>(part[i]));
      packed_expected[i] = static_cast<uint16_t>(r >> 16);
      widened_expected[i] = std::bit_cast<float>(r);
    }
    Guarded<float> in(x), rounded(x.size()), widened(x.size());
    Guarded<uint16_t> packed(x.size());
    kernels::to_bf16(in.data() + first, packed.data() + first, n, nullptr);
    kernels::from_bf16(packed.data() + first, widened.data() + first, n, nullptr);
    kernels::round_to_bf16(in.data() + first, rounded.data() + first, n, nullptr);
    emutest::require_no_pending_error();
    const std::vector<uint16_t> got_packed = packed.values();
    CHECK(std::vector<uint16_t>(got_packed.begin() + static_cast<std::ptrdiff_t>(first),
                                got_packed.end()) == packed_expected);
    for (const auto* g : {&widened, &rounded}) {
      const fvec got = g->values();
      CHECK(same_bits(fvec(got.begin() + static_cast<std::ptrdiff_t>(first), got.end()),
                      widened_expected));
    }
    for (const auto* g : {&in, &rounded, &widened}) EMU_CHECK_INTACT(*g);
    EMU_CHECK_INTACT(packed);
  }
}

TEST_CASE("emulated cuda: channel_sum, one pass and two-level, is deterministic and exact enough",
          "[emulated][reduction]") {
  const auto [n, c, hw] = GENERATE(std::tuple<int64_t, int64_t, int64_t>{3, 5, 7},
                                   std::tuple<int64_t, int64_t, int64_t>{256, 10, 1},
                                   std::tuple<int64_t, int64_t, int64_t>{2, 70, 49},
                                   std::tuple<int64_t, int64_t, int64_t>{9, 3, 1000},
                                   // the most groups (256), more than a warp has lanes
                                   std::tuple<int64_t, int64_t, int64_t>{4, 20, 17000});
  const bool nhwc = GENERATE(false, true);
  const bool two_level = GENERATE(false, true);
  INFO("N " << n << " C " << c << " HW " << hw << (nhwc ? ", NHWC" : ", NCHW")
            << (two_level ? ", two-level" : ", one pass"));
  const auto total = n * c * hw;
  const fvec x = dptest::random_vector(total, 31, -1.0f, 3.0f);
  std::vector<double> sum(static_cast<size_t>(c), 0.0);
  for (int64_t i = 0; i < total; ++i)
    sum[static_cast<size_t>(nhwc ? i % c : i / hw % c)] += x[static_cast<size_t>(i)];
  Guarded<float> gx(x), out(static_cast<size_t>(c)), again(static_cast<size_t>(c));
  Guarded<float> partial(static_cast<size_t>(kernels::kChannelSumGroups * c));
  float* scratch = two_level ? partial.data() : nullptr;
  kernels::channel_sum(gx.data(), out.data(), n, c, hw, nhwc, scratch, nullptr);
  kernels::channel_sum(gx.data(), again.data(), n, c, hw, nhwc, scratch, nullptr);
  emutest::require_no_pending_error();
  CHECK(same_bits(out.values(), again.values()));
  // fp32 sums of at most 68000 values of magnitude <= 3: relative to the sum of |x| that is
  // well under 1e-5 for any order.
  const fvec got = out.values();
  for (size_t ch = 0; ch < sum.size(); ++ch) {
    INFO("channel " << ch);
    CHECK(std::abs(got[ch] - sum[ch]) <= 1e-5 * std::max(1.0, std::abs(sum[ch]) + 3.0 * total / c));
  }
  for (const auto* g : {&gx, &out, &again, &partial}) EMU_CHECK_INTACT(*g);
}

TEST_CASE("emulated cuda: filter layout transposes are inverse permutations",
          "[emulated][elementwise]") {
  const bool wide_indices = GENERATE(false, true);
  const emutest::WideIndices forced(wide_indices);
  INFO((wide_indices ? "64-bit indices" : "32-bit indices where they fit"));
  const int64_t k = 7, c = 5, rs = 9;
  const auto total = static_cast<size_t>(k * c * rs);
  fvec w(total);
  for (size_t i = 0; i < total; ++i) w[i] = static_cast<float>(i);
  Guarded<float> kcrs(w), krsc(total), back(total);
  kernels::kcrs_to_krsc(kcrs.data(), krsc.data(), k, c, rs, nullptr);
  kernels::krsc_to_kcrs(krsc.data(), back.data(), k, c, rs, nullptr);
  emutest::require_no_pending_error();
  const fvec t1 = krsc.values();
  for (int64_t a = 0; a < k; ++a)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < rs; ++p)
        CHECK(t1[static_cast<size_t>((a * rs + p) * c + ch)] ==
              w[static_cast<size_t>((a * c + ch) * rs + p)]);
  CHECK(back.values() == w);
  // The bf16 twin: the same permutation, each value packed (to_bf16's bits).
  fvec wide(total);  // distinct bf16 values, each exact: a misplaced one is seen
  for (size_t i = 0; i < total; ++i)
    wide[i] = std::bit_cast<float>((0x3f80u + static_cast<uint32_t>(i)) << 16);
  Guarded<float> kcrs_wide(wide), krsc_wide(total);
  Guarded<uint16_t> krsc16(total), expected16(total);
  kernels::kcrs_to_krsc(kcrs_wide.data(), krsc_wide.data(), k, c, rs, nullptr);
  kernels::to_bf16(krsc_wide.data(), expected16.data(), static_cast<int64_t>(total), nullptr);
  kernels::kcrs_to_krsc_bf16(kcrs_wide.data(), krsc16.data(), k, c, rs, nullptr);
  emutest::require_no_pending_error();
  CHECK(krsc16.values() == expected16.values());
  const std::vector<uint16_t> packed = krsc16.values();
  CHECK(packed[static_cast<size_t>((1 * rs + 2) * c + 3)] ==
        static_cast<uint16_t>(0x3f80u + static_cast<uint32_t>((1 * c + 3) * rs + 2)));
  // The rounding twin (an fp32 pass given bf16's operands): the permutation of round_to_bf16's
  // values, on values that are not bf16 already.
  const fvec raw = dptest::random_vector(static_cast<int64_t>(total), 81, -3.0f, 3.0f);
  Guarded<float> kcrs_raw(raw), rounded(total), krsc_rounded(total), expected_rounded(total);
  kernels::round_to_bf16(kcrs_raw.data(), rounded.data(), static_cast<int64_t>(total), nullptr);
  kernels::kcrs_to_krsc(rounded.data(), expected_rounded.data(), k, c, rs, nullptr);
  kernels::kcrs_to_krsc(kcrs_raw.data(), krsc_rounded.data(), k, c, rs, nullptr, true);
  emutest::require_no_pending_error();
  CHECK(same_bits(krsc_rounded.values(), expected_rounded.values()));  // raw is not bf16 already
  for (const auto* g : {&kcrs, &krsc, &back, &kcrs_wide, &krsc_wide, &kcrs_raw, &krsc_rounded})
    EMU_CHECK_INTACT(*g);
  EMU_CHECK_INTACT(krsc16);
  EMU_CHECK_INTACT(expected16);
}

TEST_CASE("emulated cuda: subsample_nhwc gathers a strided 1x1 convolution's rows",
          "[emulated][elementwise][bf16]") {
  // (n, h, w) with strides that leave odd edges out; C a multiple of 4 (the float4 path when
  // aligned) and not (the scalar path); rounded to bf16 or copied as they are.
  struct Case {
    int64_t n, h, w, c, sh, sw;
  };
  for (const Case cs : {Case{3, 7, 6, 8, 2, 2}, Case{2, 5, 5, 3, 2, 1}, Case{1, 4, 4, 4, 1, 1},
                        Case{2, 9, 4, 12, 3, 2}}) {
    const int64_t ho = (cs.h - 1) / cs.sh + 1, wo = (cs.w - 1) / cs.sw + 1;
    const fvec x = dptest::random_vector(cs.n * cs.h * cs.w * cs.c, 41, -3.0f, 3.0f);
    fvec expected(static_cast<size_t>(cs.n * ho * wo * cs.c)), rounded(expected.size());
    for (int64_t b = 0; b < cs.n; ++b)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j)
          for (int64_t c = 0; c < cs.c; ++c) {
            const float v =
                x[static_cast<size_t>(((b * cs.h + i * cs.sh) * cs.w + j * cs.sw) * cs.c + c)];
            const auto at = static_cast<size_t>(((b * ho + i) * wo + j) * cs.c + c);
            expected[at] = v;
            rounded[at] = std::bit_cast<float>(dp::round_bits_to_bf16(std::bit_cast<uint32_t>(v)));
          }
    for (const size_t offset : {size_t{0}, size_t{1}}) {  // aligned, then not
      for (const bool round : {false, true}) {
        INFO("n " << cs.n << " h " << cs.h << " w " << cs.w << " c " << cs.c << " stride " << cs.sh
                  << "x" << cs.sw << (offset ? ", misaligned" : "") << (round ? ", rounded" : ""));
        Guarded<float> in(x, offset), out(expected.size(), offset);
        kernels::subsample_nhwc(in.data(), out.data(), cs.n, cs.h, cs.w, cs.c, cs.sh, cs.sw, ho, wo,
                                round, nullptr);
        emutest::require_no_pending_error();
        CHECK(same_bits(out.values(), round ? rounded : expected));
        EMU_CHECK_INTACT(in);
        EMU_CHECK_INTACT(out);
      }
    }
  }
}

TEST_CASE("emulated cuda: pooling equals the cpu backend (ties: first maximum)",
          "[emulated][pool]") {
  // (N, C, H, W, kernel, stride, pad): LeNet's 2x2, ResNet's 3x3/2/1 on odd sizes, overlapping
  // windows, an odd input whose last row and column are dropped.
  const auto [n, c, h, w, kk, st, pd] =
      GENERATE(std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{3, 4, 8, 8,
                                                                                         2, 2, 0},
               std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{2, 3, 9, 7,
                                                                                         3, 2, 1},
               std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{2, 2, 5, 6,
                                                                                         3, 1, 1},
               std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{1, 5, 7, 7,
                                                                                         2, 2, 0});
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const bool wide_indices = GENERATE(false, true);
  const emutest::WideIndices forced(wide_indices);
  INFO((wide_indices ? "64-bit indices" : "32-bit indices where they fit"));
  const bool nhwc = layout == dp::Layout::nhwc;
  dp::PoolGeometry g;
  g.kernel_h = g.kernel_w = kk;
  g.stride_h = g.stride_w = st;
  g.pad_h = g.pad_w = pd;
  const int64_t p = g.out_h(h), q = g.out_w(w);
  INFO("N " << n << " C " << c << " " << h << "x" << w << " k" << kk << " s" << st << " p" << pd
            << (nhwc ? " NHWC" : " NCHW"));
  const kernels::PoolShape shape{n, c, h, w, p, q, kk, kk, st, st, pd, pd, nhwc};
  fvec x = quantized(n * c * h * w, 41, -2.0f, 2.0f, 0.5f);  // ties
  fvec dy = dptest::random_vector(n * c * p * q, 42);
  const dp::Shape in{n, c, h, w}, out{n, c, p, q};
  const auto in_n = static_cast<size_t>(in.numel()), out_n = static_cast<size_t>(out.numel());
  for (const bool max : {false, true}) {
    INFO((max ? "max" : "average"));
    fvec y(out_n), dx(in_n);
    Guarded<float> gx(x), gy(out_n), gdy(dy), gdx(in_n);
    if (max) {
      cpu().maxpool_forward(g, t(x, in, layout), t(y, out, layout));
      cpu().maxpool_backward(g, t(x, in, layout), t(y, out, layout), t(dy, out, layout),
                             t(dx, in, layout));
      kernels::maxpool_forward(shape, gx.data(), gy.data(), nullptr);
      kernels::maxpool_backward(shape, gx.data(), gdy.data(), gdx.data(), nullptr);
      CHECK(same_bits(gy.values(), y));  // a maximum is a value of x
    } else {
      cpu().avgpool_forward(g, t(x, in, layout), t(y, out, layout));
      cpu().avgpool_backward(g, t(dy, out, layout), t(dx, in, layout));
      kernels::avgpool_forward(shape, gx.data(), gy.data(), nullptr);
      kernels::avgpool_backward(shape, gdy.data(), gdx.data(), nullptr);
      EMU_CHECK_CLOSE(gy.values(), y, 1e-6);
    }
    emutest::require_no_pending_error();
    EMU_CHECK_CLOSE(gdx.values(), dx, 1e-6);
    for (const auto* b : {&gx, &gy, &gdy, &gdx}) EMU_CHECK_INTACT(*b);
  }
}

TEST_CASE("emulated cuda: global average pooling equals the cpu backend", "[emulated][pool]") {
  const auto [n, c, h, w] = GENERATE(std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 5, 7, 7},
                                     std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 512, 4, 4},
                                     std::tuple<int64_t, int64_t, int64_t, int64_t>{4, 3, 1, 1},
                                     std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 33, 28, 28});
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const bool nhwc = layout == dp::Layout::nhwc;
  INFO("(" << n << ", " << c << ", " << h << ", " << w << ")" << (nhwc ? " NHWC" : " NCHW"));
  const dp::Shape in{n, c, h, w}, out{n, c, 1, 1};
  fvec x = dptest::random_vector(in.numel(), 51), dy = dptest::random_vector(out.numel(), 52);
  fvec y(static_cast<size_t>(out.numel())), dx(static_cast<size_t>(in.numel()));
  cpu().global_avgpool_forward(t(x, in, layout), t(y, out, layout));
  cpu().global_avgpool_backward(t(dy, out, layout), t(dx, in, layout));
  Guarded<float> gx(x), gy(y.size()), gdy(dy), gdx(dx.size());
  kernels::global_avgpool_forward(gx.data(), gy.data(), n, c, h * w, nhwc, nullptr);
  kernels::global_avgpool_backward(gdy.data(), gdx.data(), n, c, h * w, nhwc, nullptr);
  emutest::require_no_pending_error();
  EMU_CHECK_CLOSE(gy.values(), y, 1e-6);
  EMU_CHECK_CLOSE(gdx.values(), dx, 1e-6);
  for (const auto* b : {&gx, &gy, &gdy, &gdx}) EMU_CHECK_INTACT(*b);
}

TEST_CASE("emulated cuda: softmax cross-entropy and the correct count equal the cpu backend",
          "[emulated][loss]") {
  const auto [n, k, scale] = GENERATE(std::tuple<int64_t, int64_t, float>{37, 10, 1.0f / 37},
                                      std::tuple<int64_t, int64_t, float>{256, 10, 1.0f / 512},
                                      std::tuple<int64_t, int64_t, float>{5, 100, 1.0f},
                                      std::tuple<int64_t, int64_t, float>{1, 2, 0.5f},
                                      std::tuple<int64_t, int64_t, float>{2000, 10, 1.0f / 2000});
  INFO("n " << n << " k " << k);
  fvec logits = quantized(n * k, 71, -3.0f, 3.0f, 0.5f);  // ties: the first maximum wins
  ivec labels(static_cast<size_t>(n));
  const fvec r = dptest::random_vector(n, 72, 0.0f, static_cast<float>(k));
  for (size_t i = 0; i < labels.size(); ++i)
    labels[i] = std::min<int32_t>(static_cast<int32_t>(r[i]), static_cast<int32_t>(k - 1));
  fvec dlogits(static_cast<size_t>(n * k)), loss{1234.5f};
  ivec correct{77};
  cpu().softmax_cross_entropy(t(logits, {n, k}), t(labels, {n}), scale, t(dlogits, {n, k}),
                              t(loss, {1}), t(correct, {1}));
  Guarded<float> gl(logits), gd(dlogits.size()), gloss(fvec{1234.5f});
  Guarded<int32_t> glab(labels), gc(ivec{77});
  kernels::softmax_cross_entropy(gl.data(), glab.data(), n, k, scale, gd.data(), gloss.data(),
                                 gc.data(), nullptr, 1, nullptr);
  emutest::require_no_pending_error();
  // expf and logf of the host's library here, the device's there: a few ulp apart.
  const auto cmp = dptest::compare(gd.values(), dlogits, 1e-5, 0.0, scale);
  INFO(cmp.message);
  CHECK(cmp.ok);
  EMU_CHECK_CLOSE(gloss.values(), loss, 1e-5);
  CHECK(gc.values() == correct);
  // count_correct's form (no gradient, no loss), into row 2 of a table through a slot.
  Guarded<int32_t> table(ivec{-1, -1, -1, -1}), slot(ivec{2});
  kernels::softmax_cross_entropy(gl.data(), glab.data(), n, k, 0.0f, nullptr, nullptr, table.data(),
                                 slot.data(), 4, nullptr);
  emutest::require_no_pending_error();
  CHECK(table.values() == ivec{-1, -1, correct[0], -1});
  for (const auto* b : {&gl, &gd, &gloss}) EMU_CHECK_INTACT(*b);
  for (const auto* b : {&glab, &gc, &table, &slot}) EMU_CHECK_INTACT(*b);
}

TEST_CASE("emulated cuda: the loss over an empty batch writes zeros", "[emulated][loss]") {
  Guarded<float> loss(fvec{5.0f});
  Guarded<int32_t> correct(ivec{5});
  kernels::softmax_cross_entropy(nullptr, nullptr, 0, 10, 1.0f, nullptr, loss.data(),
                                 correct.data(), nullptr, 1, nullptr);
  emutest::require_no_pending_error();
  CHECK(loss.values() == fvec{0.0f});
  CHECK(correct.values() == ivec{0});
}

namespace {
/// Each value's bf16 rounding, packed: dp::round_bits_to_bf16's high half.
std::vector<uint16_t> packed_bits(const fvec& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = dp::packed_bf16_bits(std::bit_cast<uint32_t>(v[i]));
  return out;
}
}  // namespace

TEST_CASE("emulated cuda: sgd_update equals the cpu backend, its learning rate read at a cursor",
          "[emulated][optimizer]") {
  const int64_t n = 10007;
  const auto s = static_cast<size_t>(n);
  const auto sgd =
      GENERATE(dp::SgdParams{0.1f, 0.0f, 0.0f}, dp::SgdParams{0.05f, 0.9f, 5e-4f},
               dp::SgdParams{0.2f, 0.0f, 1e-2f}, dp::SgdParams{0.05f, 0.9f, 1e-3f, true});
  const bool from_row = GENERATE(false, true);
  INFO("lr " << sgd.lr << " momentum " << sgd.momentum << " wd " << sgd.weight_decay << " nesterov "
             << sgd.nesterov << (from_row ? ", lr from a StepRow" : ""));
  fvec p = dptest::random_vector(n, 81), buf(s, 0.0f);
  Guarded<float> gp(p), gg(s), gbuf(buf);
  Guarded<uint16_t> packed(s);  // the updated parameters' bf16 copy, written in the same pass
  // Steps 0..2 read rows 0..2 of the table at the cursor, which advance() moves on.
  const fvec lrs{sgd.lr, sgd.lr * 0.5f, sgd.lr * 0.25f};
  Guarded<float> table(lrs);
  Guarded<int32_t> cursor(ivec{0});
  const kernels::DeviceRow row =
      from_row ? kernels::DeviceRow{table.data(), cursor.data(), 3, 1} : kernels::DeviceRow{};
  float* momentum_buf = sgd.momentum != 0.0f ? gbuf.data() : nullptr;
  for (int step = 0; step < 3; ++step) {
    fvec g = dptest::random_vector(n, 82 + static_cast<uint64_t>(step));
    std::copy(g.begin(), g.end(), gg.data());
    dp::SgdParams host = sgd;
    if (from_row) host.lr = lrs[static_cast<size_t>(step)];
    const dp::Tensor bt = t(buf, {n});
    cpu().sgd_update(t(p, {n}), t(g, {n}), sgd.momentum != 0.0f ? &bt : nullptr, host);
    // With a row, the host's learning rate must not be used: pass a wrong one.
    kernels::sgd_update(gp.data(), gg.data(), momentum_buf, n, from_row ? 1e6f : sgd.lr,
                        sgd.momentum, sgd.weight_decay, sgd.nesterov, row,
                        step == 1 ? nullptr : packed.data(), nullptr);
    kernels::advance(cursor.data(), nullptr);
    CHECK(gg.values() == g);  // gradients are not modified
    if (step != 1) CHECK(packed.values() == packed_bits(gp.values()));
  }
  emutest::require_no_pending_error();
  // The same float expression on both sides; FMA contraction may differ by an ulp per step.
  EMU_CHECK_CLOSE(gp.values(), p, 1e-6);
  EMU_CHECK_CLOSE(gbuf.values(), buf, 1e-6);
  CHECK(cursor.values() == ivec{3});
  if (from_row) {  // the cursor is past the table: the update writes NaN, visibly
    kernels::sgd_update(gp.data(), gg.data(), momentum_buf, n, sgd.lr, sgd.momentum,
                        sgd.weight_decay, sgd.nesterov, row, nullptr, nullptr);
    CHECK(std::isnan(gp.values()[0]));
    CHECK(std::isnan(gp.values()[s - 1]));
  }
  for (const auto* b : {&gp, &gg, &gbuf, &table}) EMU_CHECK_INTACT(*b);
  EMU_CHECK_INTACT(cursor);
  EMU_CHECK_INTACT(packed);
}

TEST_CASE("emulated cuda: adamw_update equals the cpu backend, its scalars read at a cursor",
          "[emulated][optimizer]") {
  const int64_t n = 10007;
  const auto s = static_cast<size_t>(n);
  const float wd = GENERATE(0.0f, 0.05f);
  const bool from_row = GENERATE(false, true);
  INFO("weight_decay " << wd << (from_row ? ", scalars from a StepRow" : ""));
  fvec p = dptest::random_vector(n, 91), m(s, 0.0f), v(s, 0.0f);
  Guarded<float> gp(p), gg(s), gm(m), gv(v);
  Guarded<uint16_t> packed(s);  // the updated parameters' bf16 copy, written in the same pass
  fvec rows;  // (4, 3): step_size, decay, bias2_sqrt of steps 1..4
  for (int64_t step = 1; step <= 4; ++step) {
    const dp::AdamWStep st = dp::adamw_step(dp::AdamWParams{3e-3f, 0.8f, 0.95f, 1e-6f, wd, step});
    rows.insert(rows.end(), {st.step_size, st.decay, st.bias2_sqrt});
  }
  Guarded<float> table(rows);
  Guarded<int32_t> cursor(ivec{0});
  const kernels::DeviceRow row =
      from_row ? kernels::DeviceRow{table.data(), cursor.data(), 4, 3} : kernels::DeviceRow{};
  for (int64_t step = 1; step <= 4; ++step) {
    fvec g = dptest::random_vector(n, 92 + static_cast<uint64_t>(step), -2.0f, 2.0f);
    std::copy(g.begin(), g.end(), gg.data());
    const dp::AdamWParams a{3e-3f, 0.8f, 0.95f, 1e-6f, wd, step};
    cpu().adamw_update(t(p, {n}), t(g, {n}), t(m, {n}), t(v, {n}), a);
    const dp::AdamWStep st = dp::adamw_step(a);
    const float wrong = 1e6f;  // with a row, the host's scalars must not be used
    kernels::adamw_update(gp.data(), gg.data(), gm.data(), gv.data(), n,
                          from_row ? wrong : st.step_size, from_row ? wrong : st.decay, a.beta1,
                          a.beta2, a.eps, from_row ? wrong : st.bias2_sqrt, row,
                          step == 2 ? nullptr : packed.data(), nullptr);
    kernels::advance(cursor.data(), nullptr);
    if (step != 2) CHECK(packed.values() == packed_bits(gp.values()));
  }
  emutest::require_no_pending_error();
  // sqrtf against std::sqrt and FMA contraction: an ulp or two per step.
  EMU_CHECK_CLOSE(gp.values(), p, 1e-6);
  EMU_CHECK_CLOSE(gm.values(), m, 1e-6);
  EMU_CHECK_CLOSE(gv.values(), v, 1e-6);
  for (const auto* b : {&gp, &gg, &gm, &gv, &table}) EMU_CHECK_INTACT(*b);
  EMU_CHECK_INTACT(packed);
}

namespace {

/// A u8 dataset of m examples (C, H, W) and its labels, with cpu-backend tensors over them.
struct Dataset {
  int64_t m, c, h, w;
  std::vector<uint8_t> images, labels;
  dp::Tensor images_t() { return dp::Tensor(images.data(), {m, c, h, w}, dp::DType::u8); }
  dp::Tensor labels_t() { return dp::Tensor(labels.data(), {m}, dp::DType::u8); }
};

Dataset dataset(int64_t m, int64_t c, int64_t h, int64_t w) {
  Dataset d{m,
            c,
            h,
            w,
            std::vector<uint8_t>(static_cast<size_t>(m * c * h * w)),
            std::vector<uint8_t>(static_cast<size_t>(m))};
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = static_cast<uint8_t>(1 + i * 37 % 254);
  for (size_t i = 0; i < d.labels.size(); ++i) d.labels[i] = static_cast<uint8_t>(i * 3 % 10);
  return d;
}

}  // namespace

TEST_CASE("emulated cuda: gather_batch equals the cpu backend's bits, plain and augmented",
          "[emulated][data]") {
  // Every crop offset (the padding border included) and both flips, read through a StepRow
  // window that starts at row 2, normalised or not, in both layouts; and the plain gather.
  const auto [c, h, w] = GENERATE(std::tuple<int64_t, int64_t, int64_t>{3, 6, 5},
                                  std::tuple<int64_t, int64_t, int64_t>{1, 28, 28});
  const int mode = GENERATE(0, 1, 2);  // plain, crop + flip, crop + flip + normalisation
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const bool nhwc = layout == dp::Layout::nhwc;
  INFO("C " << c << " H " << h << " W " << w << ", mode " << mode << (nhwc ? ", NHWC" : ", NCHW"));
  const int64_t m = 9, pad = 2, span = 2 * pad + 1;
  Dataset d = dataset(m, c, h, w);
  ivec idx = {0, 0}, draws = {0, 0};
  for (int64_t oy = 0; oy < span; ++oy)
    for (int64_t ox = 0; ox < span; ++ox)
      for (int flip = 0; flip < 2; ++flip) {
        idx.push_back(static_cast<int32_t>((oy * 7 + ox * 3 + flip) % m));
        draws.push_back(dp::pack_draw(oy, ox, flip != 0));
      }
  const auto rows = static_cast<int64_t>(idx.size()), n = rows - 2;
  const auto xs = static_cast<size_t>(n * c * h * w);
  ivec table{2}, cursor{0};
  const dp::StepRow start{t(table, {1, 1}), t(cursor, {1})};
  dp::GatherTransform transform;
  transform.crop_padding = pad;
  const dp::Tensor draws_t = t(draws, {rows});
  transform.draws = &draws_t;
  if (mode == 2) {
    transform.mean.assign({0.4914f, 0.4822f, 0.4465f});
    transform.std.assign({0.2470f, 0.2435f, 0.2616f});
    transform.mean.resize(static_cast<size_t>(c));
    transform.std.resize(static_cast<size_t>(c));
  }
  fvec x(xs);
  ivec y(static_cast<size_t>(n));
  cpu().gather_batch(d.images_t(), d.labels_t(), t(idx, {rows}), t(x, {n, c, h, w}, layout),
                     t(y, {n}), &start, mode == 0 ? nullptr : &transform);

  Guarded<uint8_t> gi(d.images), glab(d.labels);
  Guarded<int32_t> gidx(idx), gdraws(draws), gtable(table), gcursor(cursor), gy(y.size());
  Guarded<float> gx(xs);
  kernels::GatherAugment aug;
  if (mode != 0) {
    aug.active = true;
    aug.pad = pad;
    aug.draws = gdraws.data();
    aug.channels = static_cast<int>(transform.mean.size());
    for (size_t i = 0; i < transform.mean.size(); ++i) {
      aug.mean[i] = transform.mean[i];
      aug.std[i] = transform.std[i];
    }
  }
  kernels::gather_batch(gi.data(), glab.data(), m, gidx.data(), rows,
                        kernels::DeviceRow{gtable.data(), gcursor.data(), 1, 1}, n, c, h, w, nhwc,
                        aug, gx.data(), gy.data(), nullptr);
  emutest::require_no_pending_error();
  CHECK(same_bits(gx.values(), x));
  CHECK(gy.values() == y);
  EMU_CHECK_INTACT(gi);
  EMU_CHECK_INTACT(glab);
  EMU_CHECK_INTACT(gx);
  for (const auto* b : {&gidx, &gdraws, &gtable, &gcursor, &gy}) EMU_CHECK_INTACT(*b);
}

TEST_CASE("emulated cuda: gather_batch marks a bad index, window or draw with NaN and label -1",
          "[emulated][data]") {
  // The cpu backend refuses these; a kernel cannot throw, so it marks the example instead.
  const int64_t m = 4, c = 2, h = 3, w = 3, n = 3, per = c * h * w;
  Dataset d = dataset(m, c, h, w);
  Guarded<uint8_t> gi(d.images), glab(d.labels);
  Guarded<float> gx(static_cast<size_t>(n * per));
  Guarded<int32_t> gy(static_cast<size_t>(n));
  const auto example_is_nan = [&](int64_t e) {
    const fvec x = gx.values();
    for (int64_t i = 0; i < per; ++i)
      if (!std::isnan(x[static_cast<size_t>(e * per + i)])) return false;
    return true;
  };
  SECTION("an index outside the dataset") {
    Guarded<int32_t> idx(ivec{1, 4, -1});
    kernels::gather_batch(gi.data(), glab.data(), m, idx.data(), n, kernels::DeviceRow{}, n, c, h,
                          w, false, kernels::GatherAugment{}, gx.data(), gy.data(), nullptr);
    emutest::require_no_pending_error();
    CHECK_FALSE(example_is_nan(0));
    CHECK(example_is_nan(1));
    CHECK(example_is_nan(2));
    CHECK(gy.values() == ivec{d.labels[1], -1, -1});
  }
  SECTION("a window past the index buffer") {
    Guarded<int32_t> idx(ivec{0, 1, 2, 3}), table(ivec{2}), cursor(ivec{0});
    kernels::gather_batch(gi.data(), glab.data(), m, idx.data(), 4,
                          kernels::DeviceRow{table.data(), cursor.data(), 1, 1}, n, c, h, w, true,
                          kernels::GatherAugment{}, gx.data(), gy.data(), nullptr);
    emutest::require_no_pending_error();
    CHECK(example_is_nan(0));  // the whole window is marked
    CHECK(example_is_nan(2));
    CHECK(gy.values() == ivec{-1, -1, -1});
  }
  SECTION("a draw offset outside [0, 2P]") {
    Guarded<int32_t> idx(ivec{0, 1, 2}),
        draws(ivec{dp::pack_draw(0, 0, false), dp::pack_draw(3, 0, false),
                   dp::pack_draw(1, 1, true)});
    kernels::GatherAugment aug;
    aug.active = true;
    aug.pad = 1;
    aug.draws = draws.data();
    kernels::gather_batch(gi.data(), glab.data(), m, idx.data(), n, kernels::DeviceRow{}, n, c, h,
                          w, false, aug, gx.data(), gy.data(), nullptr);
    emutest::require_no_pending_error();
    CHECK_FALSE(example_is_nan(0));
    CHECK(example_is_nan(1));
    CHECK_FALSE(example_is_nan(2));
  }
  EMU_CHECK_INTACT(gx);
  EMU_CHECK_INTACT(gy);
}

TEST_CASE("emulated cuda: the same-device rank sum adds in rank order and writes every rank",
          "[emulated][comm]") {
  const int ranks = GENERATE(1, 2, 3, kernels::kMaxSameDeviceRanks);
  const int64_t len = 5000, begin = 17, end = 4321;
  INFO(ranks << " ranks");
  std::vector<Guarded<float>> buffers;
  std::vector<fvec> values;
  buffers.reserve(static_cast<size_t>(ranks));
  kernels::RankPointers pointers{};
  pointers.count = ranks;
  for (int r = 0; r < ranks; ++r) {
    values.push_back(dptest::random_vector(len, 100 + static_cast<uint64_t>(r)));
    buffers.emplace_back(values.back());
    pointers.p[r] = buffers.back().data();
  }
  kernels::sum_across_ranks(pointers, begin, end, nullptr);
  emutest::require_no_pending_error();
  for (int r = 0; r < ranks; ++r) {
    const fvec got = buffers[static_cast<size_t>(r)].values();
    size_t wrong = 0;
    for (int64_t i = 0; i < len; ++i) {
      const auto e = static_cast<size_t>(i);
      float expected = values[static_cast<size_t>(r)][e];  // outside the range: untouched
      if (i >= begin && i < end) {
        expected = values[0][e];
        for (size_t q = 1; q < values.size(); ++q) expected += values[q][e];
      }
      wrong += std::bit_cast<uint32_t>(got[e]) != std::bit_cast<uint32_t>(expected) ? 1 : 0;
    }
    INFO("rank " << r);
    CHECK(wrong == 0);
    EMU_CHECK_INTACT(buffers[static_cast<size_t>(r)]);
  }
}
