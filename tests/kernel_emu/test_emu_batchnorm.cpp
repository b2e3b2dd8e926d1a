// The CUDA backend's batch-norm kernels, run by the kernel emulator against the double reference
// (support/bn_reference.hpp): the channels-last kernels (bn_nhwc.cu: statistics, the fused
// residual add and ReLU, backward, inference) and the synchronised batch norm's (bn_sync.cu), over
// the shapes of the layer's sweep (C in {1, 3, 4, 8, 64}, H != W, N in {1, 3}) and row counts that
// take the multi-group reductions, on aligned and misaligned buffers (the float4 path and the
// scalar one). Until now these ran only on a GPU machine, which most sessions do not have.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cuda/kernels.cuh"
#include "dp/bf16.hpp"
#include "emu_buffers.hpp"
#include "emu_runtime.hpp"
#include "support/bn_reference.hpp"
#include "support/check.hpp"

namespace kernels = dp::cuda_emu::kernels;
using emutest::Guarded;

namespace {

constexpr float kEps = 1e-5f, kMomentum = 0.1f;

struct BnCase {
  int64_t n, c, h, w;
  std::vector<float> x, dy, residual, gamma, beta, running_mean, running_var;  // NCHW
};

/// Inputs with a per-channel offset, so a channel mix-up changes the result; gamma of both signs.
BnCase make_case(int64_t n, int64_t c, int64_t h, int64_t w) {
  BnCase k{n, c, h, w, {}, {}, {}, {}, {}, {}, {}};
  const int64_t total = n * c * h * w;
  k.x = dptest::random_vector(total, 7, -2.0f, 2.0f);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < h * w; ++i)
        k.x[static_cast<size_t>((b * c + ch) * h * w + i)] +=
            0.5f * static_cast<float>(ch % 5) + 3.0f;
  k.dy = dptest::random_vector(total, 8);
  k.residual = dptest::random_vector(total, 9);
  k.gamma = dptest::random_vector(c, 5, -1.5f, 1.5f);
  k.beta = dptest::random_vector(c, 6, -1.5f, 1.5f);
  k.running_mean = dptest::random_vector(c, 10);
  k.running_var = dptest::random_vector(c, 11, 0.5f, 2.0f);
  return k;
}

std::vector<float> nhwc(const BnCase& k, const std::vector<float>& v) {
  return dptest::to_nhwc(v, k.n, k.c, k.h, k.w);
}
std::vector<float> nchw(const BnCase& k, const std::vector<float>& v) {
  return dptest::to_nchw(v, k.n, k.c, k.h, k.w);
}

/// What the channels-last kernels computed for one case (NCHW order), and the counters after.
struct NhwcResult {
  std::vector<float> y_train, dx, dgamma, dbeta, running_mean, running_var, y_eval, y_nhwc, dy_nhwc,
      dz_nhwc;
  std::vector<unsigned> counters;
};

/// The channels-last kernels of one case: training forward, backward, inference.
NhwcResult run_nhwc_kernels(const BnCase& k, bool residual, bool relu, size_t offset) {
  const int64_t rows = k.n * k.h * k.w, c = k.c;
  const auto total = static_cast<size_t>(rows * c), cs = static_cast<size_t>(c);
  Guarded<float> x(nhwc(k, k.x), offset), r(nhwc(k, k.residual), offset), y(total, offset);
  Guarded<float> gamma(k.gamma), beta(k.beta), rm(k.running_mean), rv(k.running_var);
  Guarded<float> save_mean(cs), save_invstd(cs);
  Guarded<float> scratch(kernels::bn_nhwc_scratch_floats(rows, c));
  Guarded<unsigned> counters(std::vector<unsigned>(kernels::bn_nhwc_counters(c), 0u));
  kernels::bn_nhwc_forward_train(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), nullptr,
                                 kMomentum, kEps, save_mean.data(), save_invstd.data(),
                                 residual ? r.data() : nullptr, relu, y.data(), rows, c,
                                 scratch.data(), counters.data(), nullptr);
  const std::vector<unsigned> after_forward = counters.values();

  Guarded<float> dy(nhwc(k, k.dy), offset), dz(total, offset), dx(total, offset);
  Guarded<float> dgamma(cs), dbeta(cs);
  kernels::bn_nhwc_backward(x.data(), dy.data(), relu ? y.data() : nullptr,
                            relu ? dz.data() : nullptr, gamma.data(), save_mean.data(),
                            save_invstd.data(), dx.data(), dgamma.data(), dbeta.data(), rows, c,
                            scratch.data(), counters.data(), nullptr);
  const std::vector<unsigned> after_backward = counters.values();

  Guarded<float> y_eval(total, offset);
  kernels::bn_nhwc_forward_infer(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), nullptr,
                                 kEps, residual ? r.data() : nullptr, relu, y_eval.data(), rows, c,
                                 scratch.data(), nullptr);
  emutest::require_no_pending_error();
  for (const Guarded<float>* b : {&x, &r, &y, &gamma, &beta, &rm, &rv, &save_mean, &save_invstd,
                                  &scratch, &dy, &dz, &dx, &dgamma, &dbeta, &y_eval}) {
    EMU_CHECK_INTACT(*b);
  }
  EMU_CHECK_INTACT(counters);
  // The last block of each tile put its counter back (the next call's starting point).
  CHECK(after_forward == std::vector<unsigned>(kernels::bn_nhwc_counters(c), 0u));
  CHECK(after_backward == std::vector<unsigned>(kernels::bn_nhwc_counters(c), 0u));
  return NhwcResult{
      nchw(k, y.values()), nchw(k, dx.values()), dgamma.values(),          dbeta.values(),
      rm.values(),         rv.values(),          nchw(k, y_eval.values()), y.values(),
      dy.values(),         dz.values(),          counters.values()};
}

/// run_nhwc_kernels against the double reference.
void check_nhwc_kernels(const BnCase& k, bool residual, bool relu, size_t offset) {
  const NhwcResult got = run_nhwc_kernels(k, residual, relu, offset);
  const dptest::BnReference ref = dptest::bn_reference(
      k.x, k.dy, k.gamma, k.beta, k.running_mean, k.running_var, got.y_train, k.n, k.c, k.h * k.w,
      relu, kEps, kMomentum, residual ? k.residual : std::vector<float>{});
  dptest::check_bn_close("training output", got.y_train, ref.y);
  dptest::check_bn_close("dx", got.dx, ref.dx);
  dptest::check_bn_close("dgamma", got.dgamma, ref.dgamma);
  dptest::check_bn_close("dbeta", got.dbeta, ref.dbeta);
  dptest::check_bn_close("running mean", got.running_mean, ref.running_mean);
  dptest::check_bn_close("running var", got.running_var, ref.running_var);
  dptest::check_bn_close("evaluation output", got.y_eval, ref.y_eval);
  if (relu) {  // dz is the masked gradient, exactly
    size_t wrong = 0;
    for (size_t i = 0; i < got.y_nhwc.size(); ++i)
      wrong += got.dz_nhwc[i] != (got.y_nhwc[i] > 0 ? got.dy_nhwc[i] : 0.0f) ? 1 : 0;
    CHECK(wrong == 0);
  }
  CHECK(got.counters == std::vector<unsigned>(kernels::bn_nhwc_counters(k.c), 0u));
}

}  // namespace

TEST_CASE("emulated cuda: channels-last batch norm over the layer sweep's shapes",
          "[emulated][batchnorm]") {
  const int64_t c = GENERATE(1, 3, 4, 8, 64);
  const int64_t n = GENERATE(1, 3);
  const auto [h, w] =
      GENERATE(std::tuple<int64_t, int64_t>{5, 3}, std::tuple<int64_t, int64_t>{2, 7});
  const bool residual = GENERATE(false, true);
  const bool relu = GENERATE(false, true);
  const size_t offset = GENERATE(size_t{0}, size_t{1});
  const bool wide_indices = GENERATE(false, true);
  const emutest::WideIndices forced(wide_indices);
  INFO((wide_indices ? "64-bit indices" : "32-bit indices where they fit"));
  INFO("N " << n << " C " << c << " H " << h << " W " << w << (residual ? ", residual" : "")
            << (relu ? ", ReLU" : "") << ", offset " << offset);
  check_nhwc_kernels(make_case(n, c, h, w), residual, relu, offset);
}

TEST_CASE("emulated cuda: channels-last batch norm over many row groups", "[emulated][batchnorm]") {
  // 297 rows: 3 groups of 99; 66045 rows: the most groups (512) of 129 rows, the last one short.
  // C 40 and 4: the 16-byte kernels; C 41 and 3 (not multiples of 4): the scalar ones.
  const auto [n, c, h, w] =
      GENERATE(std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 40, 9, 11},
               std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 4, 259, 255},
               std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 41, 9, 11},
               std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 3, 259, 255});
  const bool relu = GENERATE(false, true);
  INFO("N " << n << " C " << c << " H " << h << " W " << w << (relu ? ", ReLU" : ""));
  check_nhwc_kernels(make_case(n, c, h, w), relu, relu, 0);
}

TEST_CASE(
    "emulated cuda: channels-last batch norm computes the same bits whatever order its blocks run "
    "in",
    "[emulated][batchnorm]") {
  // The last block of a channel tile to finish its partial sums adds them all (bn_nhwc.cu): which
  // block that is is the scheduler's choice on a GPU, so the emulator runs the grid in index
  // order, reversed and shuffled, and every bit must agree. 2400 and 2500 rows: 19 and 20 groups
  // (more than 16: a last-block thread adds two lanes of several groups each); C 38: the scalar
  // path (not a multiple of 4), a second tile of 6 channels; C 64: two full tiles on the 16-byte
  // path; C 3 over 30 rows: one group, its only block the last.
  const auto [n, c, h, w] = GENERATE(std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 38, 40, 30},
                                     std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 64, 50, 50},
                                     std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 3, 5, 3});
  INFO("N " << n << " C " << c << " H " << h << " W " << w);
  const BnCase k = make_case(n, c, h, w);
  const NhwcResult forward = run_nhwc_kernels(k, true, true, 0);
  for (const auto order : {dp_emu::BlockOrder::reverse, dp_emu::BlockOrder::shuffled}) {
    INFO((order == dp_emu::BlockOrder::reverse ? "reversed" : "shuffled"));
    const dp_emu::BlockOrder before = dp_emu::set_block_order(order, 12345);
    const NhwcResult other = run_nhwc_kernels(k, true, true, 0);
    dp_emu::set_block_order(before);
    // Counts of differing values (a failure then prints a number, not millions of them).
    const auto differing = [](const std::vector<float>& a, const std::vector<float>& b) {
      if (a.size() != b.size()) return a.size() + b.size();
      size_t n = 0;
      for (size_t i = 0; i < a.size(); ++i)
        n += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) ? 1 : 0;
      return n;
    };
    CHECK(differing(other.y_train, forward.y_train) == 0);
    CHECK(differing(other.dx, forward.dx) == 0);
    CHECK(differing(other.dgamma, forward.dgamma) == 0);
    CHECK(differing(other.dbeta, forward.dbeta) == 0);
    CHECK(differing(other.running_mean, forward.running_mean) == 0);
    CHECK(differing(other.running_var, forward.running_var) == 0);
    CHECK(differing(other.dz_nhwc, forward.dz_nhwc) == 0);
    CHECK(differing(other.y_eval, forward.y_eval) == 0);
  }
}

TEST_CASE("emulated cuda: synchronised batch norm kernels on one replica equal batch norm",
          "[emulated][batchnorm]") {
  const int64_t c = GENERATE(1, 3, 4, 64);
  const int64_t n = GENERATE(1, 3);
  const auto [h, w] =
      GENERATE(std::tuple<int64_t, int64_t>{5, 3}, std::tuple<int64_t, int64_t>{17, 19});
  const bool channels_last = GENERATE(false, true);
  // The epilogue runs in the normalising pass, and the ReLU's mask in the summing one (each part
  // alone: the fused-epilogue test below, bit for bit against the separate passes).
  const auto [residual, relu] =
      GENERATE(std::tuple<bool, bool>{false, false}, std::tuple<bool, bool>{true, true});
  INFO("N " << n << " C " << c << " H " << h << " W " << w << (channels_last ? ", NHWC" : ", NCHW")
            << (residual ? ", residual" : "") << (relu ? ", ReLU" : ""));
  const BnCase k = make_case(n, c, h, w);
  const auto mine = [&](const std::vector<float>& v) { return channels_last ? nhwc(k, v) : v; };
  const auto back = [&](const std::vector<float>& v) { return channels_last ? nchw(k, v) : v; };
  const int64_t hw = h * w, count = n * hw;
  const auto total = static_cast<size_t>(n * c * hw), cs = static_cast<size_t>(c);

  Guarded<float> x(mine(k.x)), sums(cs), sq(cs);
  kernels::bn_sums(x.data(), nullptr, sums.data(), n, c, hw, channels_last, nullptr);
  std::vector<float> mean(cs), var(cs);
  for (size_t i = 0; i < cs; ++i) mean[i] = sums.values()[i] / static_cast<float>(count);
  Guarded<float> mean_d(mean);
  kernels::bn_sums(x.data(), mean_d.data(), sq.data(), n, c, hw, channels_last, nullptr);
  for (size_t i = 0; i < cs; ++i) var[i] = sq.values()[i] / static_cast<float>(count);
  Guarded<float> var_d(var), gamma(k.gamma), beta(k.beta), rm(k.running_mean), rv(k.running_var);
  Guarded<float> save_mean(cs), save_invstd(cs), y(total), r(mine(k.residual));
  kernels::bn_apply_stats(x.data(), gamma.data(), beta.data(), mean_d.data(), var_d.data(),
                          rm.data(), rv.data(), nullptr, kMomentum, kEps, count, save_mean.data(),
                          save_invstd.data(), residual ? r.data() : nullptr, relu, y.data(), n, c,
                          hw, channels_last, nullptr);
  Guarded<float> dy(mine(k.dy)), dz(total), grad_sums(2 * cs), dx(total);
  kernels::bn_backward_sums(x.data(), dy.data(), relu ? y.data() : nullptr,
                            relu ? dz.data() : nullptr, save_mean.data(), save_invstd.data(),
                            grad_sums.data(), n, c, hw, channels_last, nullptr);
  kernels::bn_backward_apply(x.data(), relu ? dz.data() : dy.data(), gamma.data(), save_mean.data(),
                             save_invstd.data(), grad_sums.data(), count, dx.data(), n, c, hw,
                             channels_last, nullptr);
  emutest::require_no_pending_error();

  const std::vector<float> y_train = back(y.values());
  const dptest::BnReference ref =
      dptest::bn_reference(k.x, k.dy, k.gamma, k.beta, k.running_mean, k.running_var, y_train, n, c,
                           hw, relu, kEps, kMomentum, residual ? k.residual : std::vector<float>{});
  dptest::check_bn_close("output", y_train, ref.y);
  if (relu) {  // dz is the masked gradient, exactly
    const std::vector<float> yv = y.values(), dyv = dy.values(), dzv = dz.values();
    size_t wrong = 0;
    for (size_t i = 0; i < total; ++i) wrong += dzv[i] != (yv[i] > 0 ? dyv[i] : 0.0f) ? 1 : 0;
    CHECK(wrong == 0);
  }
  dptest::check_bn_close("dx", back(dx.values()), ref.dx);
  const std::vector<float> g = grad_sums.values();
  dptest::check_bn_close("dbeta (sum dy)", std::vector<float>(g.begin(), g.begin() + c), ref.dbeta);
  dptest::check_bn_close("dgamma (sum dy xhat)", std::vector<float>(g.begin() + c, g.end()),
                         ref.dgamma);
  dptest::check_bn_close("running mean", rm.values(), ref.running_mean);
  dptest::check_bn_close("running var", rv.values(), ref.running_var);
  for (const Guarded<float>* b : {&x, &sums, &sq, &mean_d, &var_d, &gamma, &beta, &rm, &rv,
                                  &save_mean, &save_invstd, &y, &r, &dy, &dz, &grad_sums, &dx}) {
    EMU_CHECK_INTACT(*b);
  }
}

TEST_CASE("emulated cuda: synchronised batch norm sums over a replica with no examples",
          "[emulated][batchnorm]") {
  // A replica with an empty shard still takes part in the allreduce: its sums are zeros.
  const int64_t c = 5;
  const bool channels_last = GENERATE(false, true);
  Guarded<float> x(size_t{0}), mean(std::vector<float>(5, 1.0f)), sums(std::vector<float>(5, 7.0f));
  Guarded<float> dy(size_t{0}), save_invstd(std::vector<float>(5, 1.0f)),
      grad_sums(std::vector<float>(10, 7.0f));
  kernels::bn_sums(x.data(), nullptr, sums.data(), 0, c, 12, channels_last, nullptr);
  CHECK(sums.values() == std::vector<float>(5, 0.0f));
  kernels::bn_sums(x.data(), mean.data(), sums.data(), 0, c, 12, channels_last, nullptr);
  CHECK(sums.values() == std::vector<float>(5, 0.0f));
  kernels::bn_backward_sums(x.data(), dy.data(), static_cast<const float*>(nullptr), nullptr,
                            mean.data(), save_invstd.data(), grad_sums.data(), 0, c, 12,
                            channels_last, nullptr);
  CHECK(grad_sums.values() == std::vector<float>(10, 0.0f));
  emutest::require_no_pending_error();
}

namespace {

/// v rounded to bf16: packed (2 bytes each), and widened back to the fp32 tensor precision bf16
/// held before it stored such activations packed.
std::vector<uint16_t> packed_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = dp::packed_bf16_bits(std::bit_cast<uint32_t>(v[i]));
  return out;
}
std::vector<float> widened(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::bit_cast<float>(uint32_t{v[i]} << 16);
  return out;
}

/// Every output of the batch norm kernels for one x type T, one y type Y, one dy type D and one
/// residual type R (float: the widened values; uint16_t: the packed ones, returned widened), in
/// the order they are compared. The epilogue: the residual when `residual`, then a ReLU. dy: the
/// case's, or with rounded_dy (always with a packed D) its values rounded to bf16; the residual
/// likewise with rounded_residual (always with a packed R).
template <typename T, typename Y = float, typename D = float, typename R = float>
std::vector<std::vector<float>> bn_outputs(const BnCase& k, const std::vector<T>& x_values,
                                           bool sync, size_t offset, bool residual = true,
                                           bool rounded_dy = false, bool rounded_residual = false) {
  const int64_t rows = k.n * k.h * k.w, c = k.c, hw = k.h * k.w;
  const auto total = static_cast<size_t>(rows * c), cs = static_cast<size_t>(c);
  Guarded<T> x(x_values, offset);
  Guarded<Y> y(total, offset), y_eval(total, offset);
  const auto residual_values = [&] {
    if constexpr (std::is_same_v<R, uint16_t>) {
      return packed_bf16(nhwc(k, k.residual));
    } else {
      return rounded_residual ? widened(packed_bf16(nhwc(k, k.residual))) : nhwc(k, k.residual);
    }
  };
  Guarded<R> r(residual_values(), offset);
  const R* rs = residual ? r.data() : nullptr;
  Guarded<float> gamma(k.gamma), beta(k.beta), rm(k.running_mean), rv(k.running_var);
  Guarded<float> save_mean(cs), save_invstd(cs), dgamma(cs), dbeta(cs), sums(cs), sq(cs);
  const auto dy_values = [&] {
    if constexpr (std::is_same_v<D, uint16_t>) {
      return packed_bf16(nhwc(k, k.dy));
    } else {
      return rounded_dy ? widened(packed_bf16(nhwc(k, k.dy))) : nhwc(k, k.dy);
    }
  };
  Guarded<D> dy(dy_values(), offset);
  Guarded<float> dz(total, offset);
  Guarded<T> dx(total, offset);  // dx takes x's type
  Guarded<float> grad_sums(2 * cs), scratch(kernels::bn_nhwc_scratch_floats(rows, c));
  Guarded<unsigned> counters(std::vector<unsigned>(kernels::bn_nhwc_counters(c), 0u));
  // The global statistics a synchronised batch norm would have allreduced (any will do here).
  Guarded<float> mean_in(k.running_mean), var_in(k.running_var);
  if (sync) {  // the synchronised pieces, on one replica
    kernels::bn_sums(x.data(), nullptr, sums.data(), k.n, c, hw, true, nullptr);
    kernels::bn_sums(x.data(), mean_in.data(), sq.data(), k.n, c, hw, true, nullptr);
    kernels::bn_apply_stats(x.data(), gamma.data(), beta.data(), mean_in.data(), var_in.data(),
                            rm.data(), rv.data(), nullptr, kMomentum, kEps, rows, save_mean.data(),
                            save_invstd.data(), rs, true, y.data(), k.n, c, hw, true, nullptr);
    kernels::bn_backward_sums(x.data(), dy.data(), y.data(), dz.data(), save_mean.data(),
                              save_invstd.data(), grad_sums.data(), k.n, c, hw, true, nullptr);
    kernels::bn_backward_apply(x.data(), dz.data(), gamma.data(), save_mean.data(),
                               save_invstd.data(), grad_sums.data(), rows, dx.data(), k.n, c, hw,
                               true, nullptr);
  } else {
    kernels::bn_nhwc_forward_train(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                                   nullptr, kMomentum, kEps, save_mean.data(), save_invstd.data(),
                                   rs, true, y.data(), rows, c, scratch.data(), counters.data(),
                                   nullptr);
    kernels::bn_nhwc_backward(x.data(), dy.data(), y.data(), dz.data(), gamma.data(),
                              save_mean.data(), save_invstd.data(), dx.data(), dgamma.data(),
                              dbeta.data(), rows, c, scratch.data(), counters.data(), nullptr);
  }
  // Evaluation runs the channels-last kernel either way (the running statistics as updated).
  kernels::bn_nhwc_forward_infer(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), nullptr,
                                 kEps, rs, true, y_eval.data(), rows, c, scratch.data(), nullptr);
  emutest::require_no_pending_error();
  EMU_CHECK_INTACT(x);
  EMU_CHECK_INTACT(dy);
  EMU_CHECK_INTACT(dx);
  EMU_CHECK_INTACT(y);
  EMU_CHECK_INTACT(y_eval);
  EMU_CHECK_INTACT(r);
  for (const Guarded<float>* b : {&rm, &rv, &save_mean, &save_invstd, &dgamma, &dbeta, &sums, &sq,
                                  &dz, &grad_sums, &scratch}) {
    EMU_CHECK_INTACT(*b);
  }
  const auto wide = [](const auto& buffer) {
    if constexpr (std::is_same_v<std::decay_t<decltype(buffer.values())>, std::vector<uint16_t>>) {
      return widened(buffer.values());
    } else {
      return buffer.values();
    }
  };
  return {wide(y),           wide(y_eval),       rm.values(),
          rv.values(),       save_mean.values(), save_invstd.values(),
          dgamma.values(),   dbeta.values(),     sums.values(),
          sq.values(),       dz.values(),        wide(dx),
          grad_sums.values()};
}

/// bn_outputs' outputs, in its order.
constexpr const char* kOutputNames[] = {
    "y",     "y_eval", "running_mean", "running_var", "save_mean", "save_invstd", "dgamma",
    "dbeta", "sums",   "sq",           "dz",          "dx",        "grad_sums"};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("emulated cuda: batch norm kernels given packed bf16 x compute the bits of its widening",
          "[emulated][batchnorm][bf16]") {
  // Precision bf16 stores a convolution's output that feeds a batch norm as packed bf16: every
  // kernel must read it as the fp32 tensor of the same values, which it was before, and write dx
  // as that fp32 dx rounded to bf16 (what the convolution's backward rounds it to first).
  const int64_t c = GENERATE(3, 4, 64);
  const size_t offset = GENERATE(size_t{0}, size_t{1});
  const bool sync = GENERATE(false, true);
  const bool wide_indices = GENERATE(false, true);
  const emutest::WideIndices forced(wide_indices);
  const BnCase k = make_case(3, c, 5, 7);
  INFO("C " << c << ", offset " << offset << (sync ? ", synchronised kernels" : ", nhwc kernels")
            << (wide_indices ? ", 64-bit indices" : ""));
  const std::vector<uint16_t> x16 = packed_bf16(nhwc(k, k.x));
  const std::vector<float> x32 = widened(x16);
  REQUIRE(x32 != nhwc(k, k.x));  // the rounding changed values: the case tells them apart
  const auto want = bn_outputs(k, x32, sync, offset);
  const auto got = bn_outputs(k, x16, sync, offset);
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(kOutputNames[i]);
    const bool dx = std::string(kOutputNames[i]) == "dx";
    CHECK(same_bits(dx ? widened(packed_bf16(want[i])) : want[i], got[i]));
    if (dx) CHECK_FALSE(same_bits(want[i], got[i]));  // it was rounded
  }
  // And the packed x changes the results where its values differ (the kernels do read it: the
  // statistics, and the one output that the ReLU may clip to 0 either way).
  std::vector<uint16_t> other = x16;
  other[static_cast<size_t>(c)] ^= 0x0040;
  const auto changed = bn_outputs(k, other, sync, offset);
  CHECK_FALSE(same_bits(changed[sync ? 8 : 4], want[sync ? 8 : 4]));  // sums, or save_mean
}

TEST_CASE(
    "emulated cuda: batch norm kernels writing a packed bf16 y store its rounding and take its "
    "sign as the ReLU's mask",
    "[emulated][batchnorm][bf16]") {
  // Precision bf16 stores the output of a batch norm that only a convolution reads (Residual's
  // bn1 -> conv2) as packed bf16, the values the convolution rounds its input to anyway: every
  // kernel must write y (training and evaluation) as the fp32 y rounded, and its backward must
  // take the stored y's sign as the ReLU's mask, which is the fp32 y's (no value of this case
  // lies in (0, 2^-134], which rounds to 0), so every gradient keeps its bits. C = 3 takes the
  // scalar kernels, C = 64 the 16-byte ones (misaligned buffers: the packed-x test above).
  const int64_t c = GENERATE(3, 64);
  const size_t offset = 0;
  const bool sync = GENERATE(false, true);
  const bool residual = GENERATE(false, true);
  const bool bf16_x = GENERATE(false, true);
  const bool wide_indices = GENERATE(false, true);
  const emutest::WideIndices forced(wide_indices);
  const BnCase k = make_case(3, c, 5, 7);
  INFO("C " << c << ", offset " << offset << (sync ? ", synchronised kernels" : ", nhwc kernels")
            << (residual ? ", residual" : "") << (bf16_x ? ", bf16 x" : ", f32 x")
            << (wide_indices ? ", 64-bit indices" : ""));
  const auto outputs = [&](auto y_type) {
    using Y = decltype(y_type);
    if (bf16_x)
      return bn_outputs<uint16_t, Y>(k, packed_bf16(nhwc(k, k.x)), sync, offset, residual);
    return bn_outputs<float, Y>(k, nhwc(k, k.x), sync, offset, residual);
  };
  const auto want = outputs(float{});
  const auto got = outputs(uint16_t{});
  REQUIRE(want.size() == got.size());
  size_t rounded_to_zero = 0, positive = 0;
  for (const float v : want[0]) {
    positive += v > 0.0f ? 1 : 0;
    rounded_to_zero += v > 0.0f && !(widened(packed_bf16({v}))[0] > 0.0f) ? 1 : 0;
  }
  REQUIRE(rounded_to_zero == 0);
  REQUIRE(positive > 0);
  REQUIRE(positive < want[0].size());  // the ReLU's mask has both sides
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(kOutputNames[i]);
    const bool y = i < 2;  // y and y_eval: stored rounded
    CHECK(same_bits(y ? widened(packed_bf16(want[i])) : want[i], got[i]));
    if (y) CHECK_FALSE(same_bits(want[i], got[i]));  // it was rounded
  }
}

TEST_CASE(
    "emulated cuda: batch norm kernels given a packed bf16 dy with their bf16 y compute the bits "
    "of its widening",
    "[emulated][batchnorm][bf16]") {
  // Precision bf16 keeps the input gradient a bf16 convolution writes (rounded) packed where it
  // goes to the batch norm whose bf16 output that convolution alone reads (Residual's conv2 ->
  // bn1, with its ReLU): the backward kernels read dy as the fp32 dy of the same values, so
  // every output keeps its bits. C = 3 takes the scalar kernels, C = 64 the 16-byte ones, one
  // float off the 16-byte alignment the scalar ones again.
  const int64_t c = GENERATE(3, 64);
  const size_t offset = GENERATE(size_t{0}, size_t{1});
  const bool sync = GENERATE(false, true);
  const bool bf16_x = GENERATE(false, true);
  const BnCase k = make_case(3, c, 5, 7);
  INFO("C " << c << ", offset " << offset << (sync ? ", synchronised kernels" : ", nhwc kernels")
            << (bf16_x ? ", bf16 x" : ", f32 x"));
  const auto outputs = [&](auto dy_type) {
    using D = decltype(dy_type);
    if (bf16_x) {
      return bn_outputs<uint16_t, uint16_t, D>(k, packed_bf16(nhwc(k, k.x)), sync, offset, false,
                                               true);
    }
    return bn_outputs<float, uint16_t, D>(k, nhwc(k, k.x), sync, offset, false, true);
  };
  const auto want = outputs(float{});
  const auto got = outputs(uint16_t{});
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(kOutputNames[i]);
    CHECK(same_bits(want[i], got[i]));
  }
  // The kernels do read the packed dy: with every gradient negated, the gradient sums move.
  BnCase flipped = k;
  for (float& v : flipped.dy) v = -v;
  const auto other = bf16_x ? bn_outputs<uint16_t, uint16_t, uint16_t>(
                                  flipped, packed_bf16(nhwc(k, k.x)), sync, offset, false, true)
                            : bn_outputs<float, uint16_t, uint16_t>(flipped, nhwc(k, k.x), sync,
                                                                    offset, false, true);
  const size_t sums = sync ? 12 : 6;  // grad_sums, or dgamma
  CHECK_FALSE(same_bits(other[sums], want[sums]));
}

TEST_CASE(
    "emulated cuda: batch norm kernels given a packed bf16 residual compute the bits of its "
    "widening",
    "[emulated][batchnorm][bf16]") {
  // Precision bf16 stores a residual block's output packed for the next block, whose identity
  // shortcut is bn2's residual: the normalising kernels (training, evaluation, synchronised) must
  // read it as the fp32 tensor of the same values, so every output keeps its bits, into an f32 y
  // or a packed one. C = 3 takes the scalar kernels, C = 64 the 16-byte ones, one float off the
  // 16-byte alignment the scalar ones again.
  const int64_t c = GENERATE(3, 64);
  const size_t offset = GENERATE(size_t{0}, size_t{1});
  const bool sync = GENERATE(false, true);
  const bool bf16_y = GENERATE(false, true);
  const BnCase k = make_case(3, c, 5, 7);
  INFO("C " << c << ", offset " << offset << (sync ? ", synchronised kernels" : ", nhwc kernels")
            << (bf16_y ? ", bf16 y" : ", f32 y"));
  const auto outputs = [&](auto residual_type, const BnCase& kc) {
    using R = decltype(residual_type);
    if (bf16_y) {
      return bn_outputs<float, uint16_t, float, R>(kc, nhwc(kc, kc.x), sync, offset, true, false,
                                                   true);
    }
    return bn_outputs<float, float, float, R>(kc, nhwc(kc, kc.x), sync, offset, true, false, true);
  };
  const auto want = outputs(float{}, k);
  const auto got = outputs(uint16_t{}, k);
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(kOutputNames[i]);
    CHECK(same_bits(want[i], got[i]));
  }
  // The kernels do read the packed residual: with it negated, y moves.
  BnCase flipped = k;
  for (float& v : flipped.residual) v = -v;
  const auto other = outputs(uint16_t{}, flipped);
  CHECK_FALSE(same_bits(other[0], want[0]));
  CHECK_FALSE(same_bits(other[1], want[1]));
}

TEST_CASE(
    "emulated cuda: the synchronised batch norm's fused epilogue computes the bits of the "
    "separate add and relu passes",
    "[emulated][batchnorm]") {
  // bn_apply_stats applies the residual and the ReLU in its normalising pass, and
  // bn_backward_sums the ReLU's mask in its summing pass (writing dz); they used to be the add,
  // relu_forward and relu_backward kernels after and before them. Same bits.
  const int64_t c = GENERATE(3, 4, 64);
  const bool channels_last = GENERATE(false, true);
  const auto [residual, relu] =
      GENERATE(std::tuple<bool, bool>{true, false}, std::tuple<bool, bool>{false, true},
               std::tuple<bool, bool>{true, true});
  INFO("C " << c << (channels_last ? ", NHWC" : ", NCHW") << (residual ? ", residual" : "")
            << (relu ? ", ReLU" : ""));
  const BnCase k = make_case(3, c, 5, 7);
  const int64_t n = k.n, hw = k.h * k.w, count = n * hw, total64 = n * c * hw;
  const auto total = static_cast<size_t>(total64), cs = static_cast<size_t>(c);
  const auto mine = [&](const std::vector<float>& v) { return channels_last ? nhwc(k, v) : v; };
  Guarded<float> x(mine(k.x)), r(mine(k.residual)), dy(mine(k.dy));
  Guarded<float> gamma(k.gamma), beta(k.beta), mean(k.running_mean), var(k.running_var);
  const auto forward = [&](bool fused, Guarded<float>& y) {
    Guarded<float> rm(k.running_mean), rv(k.running_var), save_mean(cs), save_invstd(cs);
    kernels::bn_apply_stats(x.data(), gamma.data(), beta.data(), mean.data(), var.data(), rm.data(),
                            rv.data(), nullptr, kMomentum, kEps, count, save_mean.data(),
                            save_invstd.data(), fused && residual ? r.data() : nullptr,
                            fused && relu, y.data(), n, c, hw, channels_last, nullptr);
    if (!fused && residual) kernels::add(y.data(), r.data(), y.data(), total64, 1.0f, nullptr);
    if (!fused && relu) kernels::relu_forward(y.data(), y.data(), total64, nullptr);
    return std::pair{save_mean.values(), save_invstd.values()};
  };
  Guarded<float> y_fused(total), y_apart(total);
  const auto saved = forward(true, y_fused);
  REQUIRE(forward(false, y_apart) == saved);
  CHECK(same_bits(y_fused.values(), y_apart.values()));
  Guarded<float> save_mean(saved.first), save_invstd(saved.second);
  Guarded<float> dz_fused(total), dz_apart(total), sums_fused(2 * cs), sums_apart(2 * cs);
  kernels::bn_backward_sums(x.data(), dy.data(), relu ? y_fused.data() : nullptr,
                            relu ? dz_fused.data() : nullptr, save_mean.data(), save_invstd.data(),
                            sums_fused.data(), n, c, hw, channels_last, nullptr);
  if (relu) kernels::relu_backward(y_apart.data(), dy.data(), dz_apart.data(), total64, nullptr);
  kernels::bn_backward_sums(
      x.data(), relu ? dz_apart.data() : dy.data(), static_cast<const float*>(nullptr), nullptr,
      save_mean.data(), save_invstd.data(), sums_apart.data(), n, c, hw, channels_last, nullptr);
  emutest::require_no_pending_error();
  CHECK(same_bits(sums_fused.values(), sums_apart.values()));
  if (relu) CHECK(same_bits(dz_fused.values(), dz_apart.values()));
  for (const Guarded<float>* b :
       {&x, &r, &dy, &y_fused, &y_apart, &dz_fused, &dz_apart, &sums_fused, &sums_apart}) {
    EMU_CHECK_INTACT(*b);
  }
}

TEST_CASE(
    "emulated cuda: a bf16 y's ReLU mask passes no gradient where a positive output rounded "
    "to 0",
    "[emulated][batchnorm][bf16]") {
  // The documented corner of bf16 storage: a positive output at most 2^-134 rounds to bf16's 0,
  // so its mask is 0 where the fp32 output's passes dy. Channel 0's middle value equals its mean,
  // so its output is beta = 2^-140 exactly; every other output is far from the corner.
  BnCase k = make_case(1, 4, 1, 3);  // rows 0, 1, 2; channel 0 gets -1, 0, 1
  for (int64_t i = 0; i < 3; ++i) k.x[static_cast<size_t>(i)] = static_cast<float>(i - 1);
  k.beta[0] = std::ldexp(1.0f, -140);
  k.gamma[0] = 1.0f;
  const auto f32 = bn_outputs<float, float>(k, nhwc(k, k.x), false, 0, false);
  const auto b16 = bn_outputs<float, uint16_t>(k, nhwc(k, k.x), false, 0, false);
  const size_t middle = 1 * 4 + 0, dz = 10;  // row 1, channel 0; dz's place in the outputs
  REQUIRE(f32[0][middle] == std::ldexp(1.0f, -140));
  CHECK(b16[0][middle] == 0.0f);
  CHECK(f32[dz][middle] == nhwc(k, k.dy)[middle]);
  CHECK(f32[dz][middle] != 0.0f);
  CHECK(b16[dz][middle] == 0.0f);
  // Everywhere else the masks agree.
  size_t differ = 0;
  for (size_t i = 0; i < f32[dz].size(); ++i) differ += f32[dz][i] != b16[dz][i] ? 1 : 0;
  CHECK(differ == 1);
}

TEST_CASE(
    "emulated cuda: batch norm kernels given a folded convolution bias compute the bits of "
    "Backend::add doing its share",
    "[emulated][batchnorm]") {
  // BatchNorm2d::fold_bias_of: x lacks the convolution's bias. Training adds momentum * bias to
  // the running mean (in bn_nhwc.cu's stats_tile, bn_finalize_stats_kernel), evaluation normalises
  // with running_mean - bias (infer_scale_kernel); before, a Backend::add pass did each.
  const int64_t c = GENERATE(int64_t{3}, int64_t{64});
  const BnCase k = make_case(3, c, 5, 4);
  const int64_t rows = k.n * k.h * k.w, hw = k.h * k.w;
  const auto total = static_cast<size_t>(rows * c), cs = static_cast<size_t>(c);
  INFO("C = " << c);
  const std::vector<float> bias = dptest::random_vector(c, 71, -1.0f, 1.0f);
  Guarded<float> x(nhwc(k, k.x)), gamma(k.gamma), beta(k.beta), b(bias);
  Guarded<float> scratch(kernels::bn_nhwc_scratch_floats(rows, c));
  Guarded<unsigned> counters(std::vector<unsigned>(kernels::bn_nhwc_counters(c), 0u));
  // Training, both forms (nhwc kernels, synchronised on one replica): running mean and var bits.
  for (const bool sync : {false, true}) {
    INFO((sync ? "synchronised" : "channels-last"));
    const auto run = [&](bool folded) {
      Guarded<float> rm(k.running_mean), rv(k.running_var), save_mean(cs), save_invstd(cs),
          y(total), mean(k.running_mean), var(k.running_var);
      const float* conv_bias = folded ? b.data() : nullptr;
      if (sync) {
        kernels::bn_apply_stats(
            x.data(), gamma.data(), beta.data(), mean.data(), var.data(), rm.data(), rv.data(),
            conv_bias, kMomentum, kEps, rows, save_mean.data(), save_invstd.data(),
            static_cast<const float*>(nullptr), true, y.data(), k.n, c, hw, true, nullptr);
      } else {
        kernels::bn_nhwc_forward_train(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                                       conv_bias, kMomentum, kEps, save_mean.data(),
                                       save_invstd.data(), static_cast<const float*>(nullptr), true,
                                       y.data(), rows, c, scratch.data(), counters.data(), nullptr);
      }
      if (!folded) kernels::add(rm.data(), b.data(), rm.data(), c, kMomentum, nullptr);
      emutest::require_no_pending_error();
      return std::tuple{rm.values(), rv.values(), y.values()};
    };
    const auto [rm_f, rv_f, y_f] = run(true);
    const auto [rm_a, rv_a, y_a] = run(false);
    CHECK(rm_f == rm_a);
    CHECK(rv_f == rv_a);
    CHECK(y_f == y_a);  // the output never sees the bias
    CHECK(rm_f != k.running_mean);
  }
  // Evaluation: running_mean - bias, in the scale kernel's pass.
  Guarded<float> rm(k.running_mean), rv(k.running_var), shifted(cs), y_f(total), y_a(total);
  kernels::bn_nhwc_forward_infer(x.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                                 b.data(), kEps, static_cast<const float*>(nullptr), true,
                                 y_f.data(), rows, c, scratch.data(), nullptr);
  kernels::add(rm.data(), b.data(), shifted.data(), c, -1.0f, nullptr);
  kernels::bn_nhwc_forward_infer(x.data(), gamma.data(), beta.data(), shifted.data(), rv.data(),
                                 nullptr, kEps, static_cast<const float*>(nullptr), true,
                                 y_a.data(), rows, c, scratch.data(), nullptr);
  emutest::require_no_pending_error();
  CHECK(y_f.values() == y_a.values());
  CHECK(rm.values() == k.running_mean);  // evaluation leaves the running mean alone
}
