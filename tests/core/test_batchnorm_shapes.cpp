// Batch norm over the shapes where a layout or indexing mistake shows: C in {1, 3, 4, 8, 64},
// H != W, N in {1, 3}; training (output, running statistics, dx, dgamma, dbeta) and evaluation,
// plain and with the fused ReLU, in both layouts, on every backend present (the CUDA pass runs on
// the GPU machine), each against a naive reference in double. Found by the first GPU run: an NHWC
// module was once compared with an NCHW oracle fed the same memory, which looked like a wrong
// CUDA batch norm at (N 3, C 4, H 5, W 3).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dp/layers.hpp"
#include "support/check.hpp"
#include "support/module_check.hpp"

using dptest::entry_values;
using dptest::ModuleRunner;

namespace {

constexpr double kEps = 1e-5, kMomentum = 0.1;
// fp32 batch norm against the double reference: a few roundings per value, and channel sums of
// at most a few hundred values here.
constexpr double kTol = 1e-4;

struct Reference {
  std::vector<float> y, dx, dgamma, dbeta, running_mean, running_var, y_eval;
};

/// Everything in NCHW order. `y_mask` is the backend's own training output: the fused ReLU's
/// gradient passes where it is positive (a reference mask from the double output could differ
/// at values within rounding of zero).
Reference reference(const std::vector<float>& x, const std::vector<float>& dy,
                    const std::vector<float>& gamma, const std::vector<float>& beta,
                    const std::vector<float>& rm0, const std::vector<float>& rv0,
                    const std::vector<float>& y_mask, int64_t n, int64_t c, int64_t hw, bool relu) {
  Reference r;
  const auto total = static_cast<size_t>(n * c * hw);
  r.y.resize(total);
  r.dx.resize(total);
  r.y_eval.resize(total);
  const double m = static_cast<double>(n * hw);
  const auto at = [&](int64_t b, int64_t ch, int64_t i) {
    return static_cast<size_t>((b * c + ch) * hw + i);
  };
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto k = static_cast<size_t>(ch);
    double sum = 0, sq = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) sum += x[at(b, ch, i)];
    const double mean = sum / m;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) sq += (x[at(b, ch, i)] - mean) * (x[at(b, ch, i)] - mean);
    const double var = sq / m, invstd = 1.0 / std::sqrt(var + kEps);
    double sum_g = 0, sum_g_xhat = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        const size_t e = at(b, ch, i);
        const double z = gamma[k] * (x[e] - mean) * invstd + beta[k];
        r.y[e] = static_cast<float>(relu ? std::max(z, 0.0) : z);
        const double g = relu && !(y_mask[e] > 0) ? 0.0 : dy[e];
        sum_g += g;
        sum_g_xhat += g * (x[e] - mean) * invstd;
      }
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        const size_t e = at(b, ch, i);
        const double g = relu && !(y_mask[e] > 0) ? 0.0 : dy[e];
        const double xhat = (x[e] - mean) * invstd;
        r.dx[e] = static_cast<float>(gamma[k] * invstd / m * (m * g - sum_g - xhat * sum_g_xhat));
      }
    r.dgamma.push_back(static_cast<float>(sum_g_xhat));
    r.dbeta.push_back(static_cast<float>(sum_g));
    // PyTorch's update: the running variance takes the unbiased variance.
    const double rm = (1 - kMomentum) * rm0[k] + kMomentum * mean;
    const double rv = (1 - kMomentum) * rv0[k] + kMomentum * var * m / (m - 1);
    r.running_mean.push_back(static_cast<float>(rm));
    r.running_var.push_back(static_cast<float>(rv));
    // Evaluation with the statistics as stored (fp32).
    const double eval_invstd = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(rv)) + kEps);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        const size_t e = at(b, ch, i);
        const double z =
            gamma[k] * (x[e] - static_cast<double>(static_cast<float>(rm))) * eval_invstd + beta[k];
        r.y_eval[e] = static_cast<float>(relu ? std::max(z, 0.0) : z);
      }
  }
  return r;
}

void check_close(const char* what, const std::vector<float>& actual,
                 const std::vector<float>& expected) {
  const dptest::Comparison cmp = dptest::compare(actual, expected, kTol);
  INFO(what << ": " << cmp.message);
  CHECK(cmp.ok);
}

}  // namespace

TEST_CASE("BatchNorm2d over channel counts, non-square images and batches of 1 and 3",
          "[engine][layers][batchnorm]") {
  const int64_t c = GENERATE(1, 3, 4, 8, 64);
  const int64_t n = GENERATE(1, 3);
  const auto hw_pair = GENERATE(std::pair<int64_t, int64_t>{5, 3}, std::pair<int64_t, int64_t>{2, 7});
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const bool relu = GENERATE(false, true);
  const auto [h, w] = hw_pair;
  const dp::Shape in{n, c, h, w};
  INFO("N " << n << " C " << c << " H " << h << " W " << w << ", " << dp::layout_name(layout)
            << (relu ? ", fused ReLU" : ", plain"));
  DP_FOR_EACH_BACKEND(kind) {
    ModuleRunner run(std::make_unique<dp::BatchNorm2d>(c, static_cast<float>(kEps),
                                                       static_cast<float>(kMomentum),
                                                       dp::BatchNorm2d::Fused{false, relu}),
                     in, 3, kind, layout);
    // gamma of both signs and away from 1, beta away from 0; inputs with a per-channel offset so
    // the means differ between channels (a channel mix-up changes the result).
    std::vector<float> params = run.params();
    const auto& reg = run.registry();
    for (const auto& e : reg.entries()) {
      if (!e.trainable) continue;
      const auto v = dptest::random_vector(e.shape.numel(), e.name == "weight" ? 5 : 6, -1.5f, 1.5f);
      for (size_t i = 0; i < v.size(); ++i) params[e.offset + i] = v[i];
    }
    run.set_params(params);
    std::vector<float> x = dptest::random_vector(in.numel(), 7, -2.0f, 2.0f);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t i = 0; i < h * w; ++i)
          x[static_cast<size_t>((b * c + ch) * h * w + i)] += 0.5f * static_cast<float>(ch % 5);
    const std::vector<float> dy = dptest::random_vector(in.numel(), 8);
    const bool nhwc = layout == dp::Layout::nhwc;
    const auto mine = [&](const std::vector<float>& v) {
      return nhwc ? dptest::to_nhwc(v, n, c, h, w) : v;
    };
    const auto nchw = [&](const std::vector<float>& v) {
      return nhwc ? dptest::to_nchw(v, n, c, h, w) : v;
    };

    const std::vector<float> buffers0 = reg.download_buffers();
    const std::vector<float> y = nchw(run.forward(mine(x), true));
    const std::vector<float> dx = nchw(run.backward(mine(dy)));
    const std::vector<float> grads = run.grads();
    const std::vector<float> buffers = reg.download_buffers();
    const std::vector<float> y_eval = nchw(run.forward(mine(x), false));

    const Reference ref = reference(
        x, dy, entry_values(reg, params, "weight"), entry_values(reg, params, "bias"),
        entry_values(reg, buffers0, "running_mean"), entry_values(reg, buffers0, "running_var"),
        y, n, c, h * w, relu);
    check_close("training output", y, ref.y);
    check_close("dx", dx, ref.dx);
    check_close("dgamma", entry_values(reg, grads, "weight"), ref.dgamma);
    check_close("dbeta", entry_values(reg, grads, "bias"), ref.dbeta);
    check_close("running mean", entry_values(reg, buffers, "running_mean"), ref.running_mean);
    check_close("running var", entry_values(reg, buffers, "running_var"), ref.running_var);
    check_close("evaluation output", y_eval, ref.y_eval);
  }
}
