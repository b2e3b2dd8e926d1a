#include "support/bn_reference.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "support/check.hpp"

namespace dptest {

BnReference bn_reference(const std::vector<float>& x, const std::vector<float>& dy,
                         const std::vector<float>& gamma, const std::vector<float>& beta,
                         const std::vector<float>& running_mean0,
                         const std::vector<float>& running_var0, const std::vector<float>& y_mask,
                         int64_t n, int64_t c, int64_t hw, bool relu, double eps, double momentum,
                         const std::vector<float>& residual) {
  BnReference r;
  const auto total = static_cast<size_t>(n * c * hw);
  r.y.resize(total);
  r.dx.resize(total);
  r.y_eval.resize(total);
  const double m = static_cast<double>(n * hw);
  const auto at = [&](int64_t b, int64_t ch, int64_t i) {
    return static_cast<size_t>((b * c + ch) * hw + i);
  };
  const auto epilogue = [&](double z, size_t e) {
    if (!residual.empty()) z += residual[e];
    return static_cast<float>(relu ? std::max(z, 0.0) : z);
  };
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto k = static_cast<size_t>(ch);
    double sum = 0, sq = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) sum += x[at(b, ch, i)];
    const double mean = sum / m;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) sq += (x[at(b, ch, i)] - mean) * (x[at(b, ch, i)] - mean);
    const double var = sq / m, invstd = 1.0 / std::sqrt(var + eps);
    double sum_g = 0, sum_g_xhat = 0;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        const size_t e = at(b, ch, i);
        r.y[e] = epilogue(gamma[k] * (x[e] - mean) * invstd + beta[k], e);
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
    const double rm = (1 - momentum) * running_mean0[k] + momentum * mean;
    const double rv = (1 - momentum) * running_var0[k] + momentum * var * m / (m - 1);
    r.running_mean.push_back(static_cast<float>(rm));
    r.running_var.push_back(static_cast<float>(rv));
    // Evaluation with the statistics as stored (fp32).
    const double eval_invstd = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(rv)) + eps);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < hw; ++i) {
        const size_t e = at(b, ch, i);
        r.y_eval[e] = epilogue(
            gamma[k] * (x[e] - static_cast<double>(static_cast<float>(rm))) * eval_invstd + beta[k],
            e);
      }
  }
  return r;
}

void check_bn_close(const char* what, const std::vector<float>& actual,
                    const std::vector<float>& expected) {
  const Comparison cmp = compare(actual, expected, kBnTolerance);
  INFO(what << ": " << cmp.message);
  CHECK(cmp.ok);
}

}  // namespace dptest
