#pragma once
// Batch norm in double precision, the naive reference of every batch-norm test (the layer's shape
// sweep in tests/core/test_batchnorm_shapes.cpp, the emulated CUDA kernels in tests/kernel_emu):
// training output, gradients, PyTorch's running-statistics update and the evaluation output.
#include <cstdint>
#include <vector>

namespace dptest {

struct BnReference {
  std::vector<float> y, dx, dgamma, dbeta, running_mean, running_var, y_eval;
};

/// Everything (N, C, HW) in NCHW order. y = relu?(gamma (x - mean) invstd + beta (+ residual)),
/// residual empty for none. `y_mask` is the implementation's own training output: the fused
/// ReLU's gradient passes where it is positive (a reference mask from the double output could
/// differ at values within rounding of zero); unused without relu. dx, dgamma and dbeta are those
/// of the masked dy; y_eval uses the updated running statistics as stored (fp32).
BnReference bn_reference(const std::vector<float>& x, const std::vector<float>& dy,
                         const std::vector<float>& gamma, const std::vector<float>& beta,
                         const std::vector<float>& running_mean0,
                         const std::vector<float>& running_var0, const std::vector<float>& y_mask,
                         int64_t n, int64_t c, int64_t hw, bool relu, double eps, double momentum,
                         const std::vector<float>& residual = {});

/// fp32 batch norm against bn_reference: a few roundings per value, and channel sums of at most
/// a few hundred values (or fp32 partials of at most 129 values, added in double).
constexpr double kBnTolerance = 1e-4;

/// CHECKs (Catch2) that `actual` is within kBnTolerance of `expected`, naming `what` if not.
void check_bn_close(const char* what, const std::vector<float>& actual,
                    const std::vector<float>& expected);

}  // namespace dptest
