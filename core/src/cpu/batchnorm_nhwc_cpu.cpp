// Batch normalisation on the CPU in NHWC: the same ops and arithmetic as batchnorm_cpu.cpp
// (statistics accumulated in double, two passes for the variance). A channel's values are
// spread over every row (N*H*W rows of C floats), so the work is split by blocks of channels
// (one cache line of floats each): a thread walks all rows but reads only its own lines, and
// keeps its block's sums on the stack.
#include <algorithm>
#include <cmath>

#include "cpu/cpu_backend.hpp"

namespace dp::cpu {

namespace {

constexpr int64_t kBlock = 16;  // channels per block: 64 bytes of floats

struct Rows {
  int64_t count, c;  // N*H*W rows of C channels
};
Rows rows_of(const Tensor& x) {
  const Dims d = dims_of(x);
  return Rows{d.n * d.hw(), d.c};
}
int64_t blocks(const Rows& r) { return (r.c + kBlock - 1) / kBlock; }

}  // namespace

// x (N,H,W,C); gamma, beta, running_mean, running_var (C) -> save_mean, save_invstd (C),
// y (N,H,W,C); running stats updated in place.
void batchnorm_forward_train_nhwc(int threads, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, const Tensor& running_mean,
                                  const Tensor& running_var, float momentum, float eps,
                                  const Tensor& save_mean, const Tensor& save_invstd,
                                  const Tensor& y) {
  const Rows rows = rows_of(x);
  const auto m = static_cast<double>(rows.count);
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for num_threads(threads_for(rows.count* rows.c, threads)) schedule(static)
  for (int64_t b = 0; b < blocks(rows); ++b) {
    const int64_t c0 = b * kBlock, width = std::min(kBlock, rows.c - c0);
    double sum[kBlock] = {}, squares[kBlock] = {}, mean[kBlock];
    for (int64_t r = 0; r < rows.count; ++r) {
      const float* xr = xp + r * rows.c + c0;
      for (int64_t j = 0; j < width; ++j) sum[j] += xr[j];
    }
    for (int64_t j = 0; j < width; ++j) mean[j] = sum[j] / m;
    // Second pass: no cancellation from E[x^2] - E[x]^2.
    for (int64_t r = 0; r < rows.count; ++r) {
      const float* xr = xp + r * rows.c + c0;
      for (int64_t j = 0; j < width; ++j) {
        const double dev = xr[j] - mean[j];
        squares[j] += dev * dev;
      }
    }
    float scale[kBlock], shift[kBlock];
    for (int64_t j = 0; j < width; ++j) {
      const int64_t c = c0 + j;
      const double var = squares[j] / m;
      const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
      save_mean.f32()[c] = static_cast<float>(mean[j]);
      save_invstd.f32()[c] = static_cast<float>(invstd);
      float& rm = running_mean.f32()[c];
      float& rv = running_var.f32()[c];
      rm = static_cast<float>((1.0 - momentum) * rm + momentum * mean[j]);
      rv = static_cast<float>((1.0 - momentum) * rv + momentum * var * m / (m - 1));
      const double g = gamma.f32()[c];
      scale[j] = static_cast<float>(g * invstd);
      shift[j] = static_cast<float>(beta.f32()[c] - mean[j] * g * invstd);
    }
    for (int64_t r = 0; r < rows.count; ++r) {
      const float* xr = xp + r * rows.c + c0;
      float* yr = yp + r * rows.c + c0;
      for (int64_t j = 0; j < width; ++j) yr[j] = xr[j] * scale[j] + shift[j];
    }
  }
}

// x (N,H,W,C); gamma, beta, running_mean, running_var (C) -> y (N,H,W,C)
void batchnorm_forward_infer_nhwc(int threads, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, const Tensor& running_mean,
                                  const Tensor& running_var, float eps, const Tensor& y) {
  const Rows rows = rows_of(x);
  const float* xp = x.f32();
  float* yp = y.f32();
#pragma omp parallel for num_threads(threads_for(rows.count* rows.c, threads)) schedule(static)
  for (int64_t b = 0; b < blocks(rows); ++b) {
    const int64_t c0 = b * kBlock, width = std::min(kBlock, rows.c - c0);
    float scale[kBlock], shift[kBlock];
    for (int64_t j = 0; j < width; ++j) {
      const int64_t c = c0 + j;
      const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var.f32()[c]) + eps);
      const double g = gamma.f32()[c];
      scale[j] = static_cast<float>(g * invstd);
      shift[j] = static_cast<float>(beta.f32()[c] - running_mean.f32()[c] * g * invstd);
    }
    for (int64_t r = 0; r < rows.count; ++r) {
      const float* xr = xp + r * rows.c + c0;
      float* yr = yp + r * rows.c + c0;
      for (int64_t j = 0; j < width; ++j) yr[j] = xr[j] * scale[j] + shift[j];
    }
  }
}

// x, dy (N,H,W,C); gamma, save_mean, save_invstd (C) -> dx (N,H,W,C), dgamma, dbeta (C), with
// batchnorm_cpu.cpp's formulas.
void batchnorm_backward_nhwc(int threads, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                             const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                             const Tensor& dgamma, const Tensor& dbeta) {
  const Rows rows = rows_of(x);
  const auto m = static_cast<double>(rows.count);
  const float* xp = x.f32();
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
#pragma omp parallel for num_threads(threads_for(rows.count* rows.c, threads)) schedule(static)
  for (int64_t b = 0; b < blocks(rows); ++b) {
    const int64_t c0 = b * kBlock, width = std::min(kBlock, rows.c - c0);
    double mean[kBlock], invstd[kBlock], sum_dy[kBlock] = {}, sum_dy_xhat[kBlock] = {};
    for (int64_t j = 0; j < width; ++j) {
      mean[j] = save_mean.f32()[c0 + j];
      invstd[j] = save_invstd.f32()[c0 + j];
    }
    for (int64_t r = 0; r < rows.count; ++r) {
      const float* xr = xp + r * rows.c + c0;
      const float* dyr = dyp + r * rows.c + c0;
      for (int64_t j = 0; j < width; ++j) {
        sum_dy[j] += dyr[j];
        sum_dy_xhat[j] += dyr[j] * ((xr[j] - mean[j]) * invstd[j]);
      }
    }
    float dy_scale[kBlock], offset[kBlock], xhat_scale[kBlock], mean_f[kBlock], invstd_f[kBlock];
    for (int64_t j = 0; j < width; ++j) {
      const int64_t c = c0 + j;
      dbeta.f32()[c] = static_cast<float>(sum_dy[j]);
      dgamma.f32()[c] = static_cast<float>(sum_dy_xhat[j]);
      const double k = gamma.f32()[c] * invstd[j] / m;
      dy_scale[j] = static_cast<float>(k * m);
      offset[j] = static_cast<float>(-k * sum_dy[j]);
      xhat_scale[j] = static_cast<float>(-k * sum_dy_xhat[j]);
      mean_f[j] = static_cast<float>(mean[j]);
      invstd_f[j] = static_cast<float>(invstd[j]);
    }
    for (int64_t r = 0; r < rows.count; ++r) {
      const float* xr = xp + r * rows.c + c0;
      const float* dyr = dyp + r * rows.c + c0;
      float* dxr = dxp + r * rows.c + c0;
      for (int64_t j = 0; j < width; ++j)
        dxr[j] =
            dy_scale[j] * dyr[j] + offset[j] + xhat_scale[j] * ((xr[j] - mean_f[j]) * invstd_f[j]);
    }
  }
}

}  // namespace dp::cpu
