// Batch normalisation on the CPU, per channel of (N,C,H,W) or per feature of (N,C), with
// PyTorch's semantics. Channels are independent, so they are spread over the threads; each
// channel's sums are accumulated in double so the reference stays accurate for large N*H*W.
// NHWC tensors go to batchnorm_nhwc_cpu.cpp. The epilogue (residual add, ReLU) is applied where
// the output is written and its gradient where the gradient is first read, so a fused block
// passes over its activations once fewer than bn, add and relu one after the other.
#include <cmath>
#include <string>

#include "cpu/bf16_cpu.hpp"
#include "cpu/cpu_backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

// x (N,C,H,W); gamma, beta, running_mean, running_var (C) -> save_mean, save_invstd (C),
// y (N,C,H,W); running stats updated in place.
namespace {

DP_CPU_LOOPS void batchnorm_forward_train_nchw(int threads, const Tensor& x, const Tensor& gamma,
                                               const Tensor& beta, const Tensor& running_mean,
                                               const Tensor& running_var, float momentum, float eps,
                                               const Tensor& save_mean, const Tensor& save_invstd,
                                               const Tensor& y, Epilogue ep) {
  const Dims d = dims_of(x);
  const int64_t count = d.n * d.hw();
  const float* xp = x.f32();
  float* yp = y.f32();
  const float* gp = gamma.f32();
  const float* bp = beta.f32();
  float* rm = running_mean.f32();
  float* rv = running_var.f32();
  float* sm = save_mean.f32();
  float* si = save_invstd.f32();
  const int64_t hw = d.hw();
  const int64_t chw = d.chw();
  const int team = threads_for(count * d.c, threads);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t c = 0; c < d.c; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const float* xc = xp + n * chw + c * hw;
      // simd: several partial sums instead of one serial chain of dependent adds.
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < hw; ++i) sum += xc[i];
    }
    const double mean = sum / static_cast<double>(count);
    double squares = 0;  // second pass: no cancellation from E[x^2] - E[x]^2
    for (int64_t n = 0; n < d.n; ++n) {
      const float* xc = xp + n * chw + c * hw;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < hw; ++i) {
        const double dev = xc[i] - mean;
        squares += dev * dev;
      }
    }
    const double var = squares / static_cast<double>(count);
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    const double unbiased = var * static_cast<double>(count) / static_cast<double>(count - 1);
    sm[c] = static_cast<float>(mean);
    si[c] = static_cast<float>(invstd);
    rm[c] = static_cast<float>((1.0 - momentum) * rm[c] + momentum * mean);
    rv[c] = static_cast<float>((1.0 - momentum) * rv[c] + momentum * unbiased);
    const auto scale = static_cast<float>(gp[c] * invstd);
    const auto shift = static_cast<float>(bp[c] - mean * gp[c] * invstd);
    for (int64_t n = 0; n < d.n; ++n) {
      const int64_t at = n * chw + c * hw;
      const float* rc = ep.residual != nullptr ? ep.residual + at : nullptr;
      for (int64_t i = 0; i < hw; ++i)
        yp[at + i] = finish(xp[at + i] * scale + shift, rc, i, ep.relu);
    }
  }
}

// x (N,C,H,W); gamma, beta, running_mean, running_var (C) -> y (N,C,H,W)
DP_CPU_LOOPS void batchnorm_forward_infer_nchw(int threads, const Tensor& x, const Tensor& gamma,
                                               const Tensor& beta, const Tensor& running_mean,
                                               const Tensor& running_var, float eps,
                                               const Tensor& y, Epilogue ep) {
  const Dims d = dims_of(x);
  const float* xp = x.f32();
  float* yp = y.f32();
  const float* gp = gamma.f32();
  const float* bp = beta.f32();
  const float* rm = running_mean.f32();
  const float* rv = running_var.f32();
  const int64_t hw = d.hw();
  const int64_t chw = d.chw();
  const int team = threads_for(d.n * chw, threads);
#pragma omp parallel for num_threads(team) schedule(static) collapse(2)
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t c = 0; c < d.c; ++c) {
      const double invstd = 1.0 / std::sqrt(static_cast<double>(rv[c]) + eps);
      const auto scale = static_cast<float>(gp[c] * invstd);
      const auto shift = static_cast<float>(bp[c] - rm[c] * gp[c] * invstd);
      const int64_t at = n * chw + c * hw;
      const float* rc = ep.residual != nullptr ? ep.residual + at : nullptr;
      for (int64_t i = 0; i < hw; ++i)
        yp[at + i] = finish(xp[at + i] * scale + shift, rc, i, ep.relu);
    }
  }
}

// x, dy (N,C,H,W); gamma, save_mean, save_invstd (C) -> dx (N,C,H,W), dgamma, dbeta (C).
// With xhat = (x - mean) * invstd and m = N*H*W:
//   dbeta = sum dy, dgamma = sum dy * xhat,
//   dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma).
// (eps is not needed: save_invstd already holds 1/sqrt(var + eps).) With a ReLU epilogue the
// first pass masks dy and writes it to dz, and the second reads dz.
DP_CPU_LOOPS void batchnorm_backward_nchw(int threads, const Tensor& x, const Tensor& dy,
                                          const Tensor& gamma, const Tensor& save_mean,
                                          const Tensor& save_invstd, const Tensor& dx,
                                          const Tensor& dgamma, const Tensor& dbeta,
                                          EpilogueGrad ep) {
  const Dims d = dims_of(x);
  const float* xp = x.f32();
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const float* gp = gamma.f32();
  const float* sm = save_mean.f32();
  const float* si = save_invstd.f32();
  float* dgp = dgamma.f32();
  float* dbp = dbeta.f32();
  const int64_t hw = d.hw();
  const int64_t chw = d.chw();
  const int64_t count = d.n * hw;
  const int team = threads_for(count * d.c, threads);
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t c = 0; c < d.c; ++c) {
    const double mean = sm[c];
    const double invstd = si[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const float* xc = xp + n * chw + c * hw;
      const float* dyc = dyp + n * chw + c * hw;
      if (ep.y != nullptr) {
        // The mask first, into dz (a row of one image and channel, still in cache when the sums
        // read it): a loop that also reduced was left scalar by GCC and ran 5x slower.
        const float* yc = ep.y + n * chw + c * hw;
        float* dzc = ep.dz + n * chw + c * hw;
        for (int64_t i = 0; i < hw; ++i) dzc[i] = masked(yc[i], dyc[i]);
        dyc = dzc;
      }
#pragma omp simd reduction(+ : sum_dy, sum_dy_xhat)
      for (int64_t i = 0; i < hw; ++i) {
        sum_dy += dyc[i];
        sum_dy_xhat += dyc[i] * ((xc[i] - mean) * invstd);
      }
    }
    const float* gp_dy = ep.y != nullptr ? ep.dz : dyp;  // the gradient of bn(x)
    dbp[c] = static_cast<float>(sum_dy);
    dgp[c] = static_cast<float>(sum_dy_xhat);
    const double k = gp[c] * invstd / static_cast<double>(count);
    const auto dy_scale = static_cast<float>(k * static_cast<double>(count));
    const auto offset = static_cast<float>(-k * sum_dy);
    const auto xhat_scale = static_cast<float>(-k * sum_dy_xhat);
    const auto mean_f = static_cast<float>(mean);
    const auto invstd_f = static_cast<float>(invstd);
    for (int64_t n = 0; n < d.n; ++n) {
      const float* xc = xp + n * chw + c * hw;
      const float* dyc = gp_dy + n * chw + c * hw;
      float* dxc = dxp + n * chw + c * hw;
      for (int64_t i = 0; i < hw; ++i)
        dxc[i] = dy_scale * dyc[i] + offset + xhat_scale * ((xc[i] - mean_f) * invstd_f);
    }
  }
}

}  // namespace

// A separate pass: the bf16 reference is not the speed path, and the loops stay fp32's.
void CpuBackend::round_batchnorm_output(const Tensor& y) {
  if (precision_ == Precision::bf16) round_to_bf16_in_place(threads_, y.f32(), y.numel());
}

void CpuBackend::batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma,
                                              const Tensor& beta, const Tensor& running_mean,
                                              const Tensor& running_var, float momentum, float eps,
                                              const Tensor& save_mean, const Tensor& save_invstd,
                                              const Tensor& y, const BnEpilogue& epilogue) {
  if (is_nhwc(x)) {
    batchnorm_forward_train_nhwc(threads_, x, gamma, beta, running_mean, running_var, momentum, eps,
                                 save_mean, save_invstd, y, Epilogue(epilogue));
  } else {
    batchnorm_forward_train_nchw(threads_, x, gamma, beta, running_mean, running_var, momentum, eps,
                                 save_mean, save_invstd, y, Epilogue(epilogue));
  }
  round_batchnorm_output(y);
}

void CpuBackend::batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma,
                                              const Tensor& beta, const Tensor& running_mean,
                                              const Tensor& running_var, float eps, const Tensor& y,
                                              const BnEpilogue& epilogue) {
  if (is_nhwc(x)) {
    batchnorm_forward_infer_nhwc(threads_, x, gamma, beta, running_mean, running_var, eps, y,
                                 Epilogue(epilogue));
  } else {
    batchnorm_forward_infer_nchw(threads_, x, gamma, beta, running_mean, running_var, eps, y,
                                 Epilogue(epilogue));
  }
  round_batchnorm_output(y);
}

void CpuBackend::batchnorm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                         const Tensor& save_mean, const Tensor& save_invstd,
                                         float /*eps*/, const Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta, const BnEpilogueGrad& epilogue) {
  if (is_nhwc(x)) {
    // NHWC: the ReLU's mask as one flat pass into dz, then the backward of dz. Masking inside
    // the sums, row by row (rows of C = 64 floats), measured slower than the separate pass
    // (2.15 against 1.46 ms for 64x64x28x28 on 2 threads; bench_cpu_ops).
    if (epilogue.y != nullptr) relu_backward_impl(*epilogue.y, dy, *epilogue.dz);
    batchnorm_backward_nhwc(threads_, x, epilogue.y != nullptr ? *epilogue.dz : dy, gamma,
                            save_mean, save_invstd, dx, dgamma, dbeta);
    return;
  }
  batchnorm_backward_nchw(threads_, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                          EpilogueGrad(epilogue));
}

}  // namespace dp::cpu

// ---- synchronised batch norm: the pieces between the allreduces --------------------------------

namespace dp::cpu {

namespace {

// Where value i (0 <= i < H*W) of channel c of image n lies, in either layout: these ops are
// memory-bound and run once per BN layer per step, so one strided loop serves NCHW and NHWC.
struct ChannelAddressing {
  int64_t image, channel, pixel;  // strides
  explicit ChannelAddressing(const Tensor& x) {
    const Dims d = dims_of(x);
    image = d.chw();
    channel = is_nhwc(x) ? 1 : d.hw();
    pixel = is_nhwc(x) ? d.c : 1;
  }
  int64_t at(int64_t n, int64_t c) const { return n * image + c * channel; }
};

}  // namespace

// x (N,C,H,W) or NHWC, mean (C) or null -> sums (C) = sum x, or sum (x - mean)^2 (double
// accumulation).
void CpuBackend::batchnorm_sums_impl(const Tensor& x, const Tensor* mean, const Tensor& sums) {
  const Dims d = dims_of(x);
  const ChannelAddressing a(x);
  const float* xp = x.f32();
  const float* mp = mean != nullptr ? mean->f32() : nullptr;
  float* sp = sums.f32();
  const int64_t hw = d.hw(), step = a.pixel;
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads_)) schedule(static)
  for (int64_t c = 0; c < d.c; ++c) {
    const double m = mp != nullptr ? mp[c] : 0.0;
    double acc = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const float* xc = xp + a.at(n, c);
      if (mp == nullptr) {
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < hw; ++i) acc += xc[i * step];
      } else {
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < hw; ++i) acc += (xc[i * step] - m) * (xc[i * step] - m);
      }
    }
    sp[c] = static_cast<float>(acc);
  }
}

// x (N,C,H,W) or NHWC, the batch's mean and biased var (C) over `count` values -> y, save_mean,
// save_invstd; running statistics updated (unbiased variance).
void CpuBackend::batchnorm_apply_stats_impl(const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, const Tensor& mean,
                                            const Tensor& var, const Tensor& running_mean,
                                            const Tensor& running_var, float momentum, float eps,
                                            int64_t count, const Tensor& save_mean,
                                            const Tensor& save_invstd, const Tensor& y,
                                            const BnEpilogue& epilogue) {
  const Dims d = dims_of(x);
  const ChannelAddressing a(x);
  const Epilogue ep(epilogue);
  const float* xp = x.f32();
  float* yp = y.f32();
  const int64_t hw = d.hw(), step = a.pixel;
  for (int64_t c = 0; c < d.c; ++c) {
    const double m = mean.f32()[c], v = var.f32()[c];
    const double invstd = 1.0 / std::sqrt(v + static_cast<double>(eps));
    const double unbiased = v * static_cast<double>(count) / static_cast<double>(count - 1);
    save_mean.f32()[c] = static_cast<float>(m);
    save_invstd.f32()[c] = static_cast<float>(invstd);
    float& rm = running_mean.f32()[c];
    float& rv = running_var.f32()[c];
    rm = static_cast<float>((1.0 - momentum) * rm + momentum * m);
    rv = static_cast<float>((1.0 - momentum) * rv + momentum * unbiased);
  }
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads_)) schedule(static) \
    collapse(2)
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t c = 0; c < d.c; ++c) {
      const double g = gamma.f32()[c], invstd = save_invstd.f32()[c];
      const auto scale = static_cast<float>(g * invstd);
      const auto shift = static_cast<float>(beta.f32()[c] - mean.f32()[c] * g * invstd);
      const int64_t at = a.at(n, c);
      const float* rc = ep.residual != nullptr ? ep.residual + at : nullptr;
      for (int64_t i = 0; i < hw; ++i) {
        yp[at + i * step] = finish(xp[at + i * step] * scale + shift, rc, i * step, ep.relu);
      }
    }
  }
  round_batchnorm_output(y);
}

// x, dy (N,C,H,W) or NHWC, save_mean, save_invstd (C) -> sums (2C) = [sum dy, sum dy * xhat];
// with a ReLU epilogue, of dz = the masked dy, which is written.
void CpuBackend::batchnorm_backward_sums_impl(const Tensor& x, const Tensor& dy,
                                              const Tensor& save_mean, const Tensor& save_invstd,
                                              const Tensor& sums, const BnEpilogueGrad& epilogue) {
  const Dims d = dims_of(x);
  const ChannelAddressing a(x);
  const float* xp = x.f32();
  // The ReLU's mask as one flat pass into dz (this op's loops are strided in NHWC), then the
  // sums of dz.
  if (epilogue.y != nullptr && d.n > 0) relu_backward_impl(*epilogue.y, dy, *epilogue.dz);
  const float* dyp = epilogue.y != nullptr ? epilogue.dz->f32() : dy.f32();
  float* sp = sums.f32();
  const int64_t hw = d.hw(), step = a.pixel;
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads_)) schedule(static)
  for (int64_t c = 0; c < d.c; ++c) {
    const double mean = save_mean.f32()[c], invstd = save_invstd.f32()[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t n = 0; n < d.n; ++n) {
      const float* xc = xp + a.at(n, c);
      const float* dyc = dyp + a.at(n, c);
#pragma omp simd reduction(+ : sum_dy, sum_dy_xhat)
      for (int64_t i = 0; i < hw; ++i) {
        sum_dy += dyc[i * step];
        sum_dy_xhat += dyc[i * step] * ((xc[i * step] - mean) * invstd);
      }
    }
    sp[c] = static_cast<float>(sum_dy);
    sp[d.c + c] = static_cast<float>(sum_dy_xhat);
  }
}

// dx = gamma * invstd / count * (count * dy - sum_dy - xhat * sum_dy_xhat), the sums global.
void CpuBackend::batchnorm_backward_apply_impl(const Tensor& x, const Tensor& dy,
                                               const Tensor& gamma, const Tensor& save_mean,
                                               const Tensor& save_invstd, const Tensor& sums,
                                               int64_t count, const Tensor& dx) {
  const Dims d = dims_of(x);
  const ChannelAddressing a(x);
  const float* xp = x.f32();
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const float* sp = sums.f32();
  const int64_t hw = d.hw(), step = a.pixel;
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads_)) schedule(static) \
    collapse(2)
  for (int64_t n = 0; n < d.n; ++n) {
    for (int64_t c = 0; c < d.c; ++c) {
      // As batchnorm_backward_impl: the same float expressions, so one replica matches it.
      const double invstd = save_invstd.f32()[c];
      const double k = gamma.f32()[c] * invstd / static_cast<double>(count);
      const auto dy_scale = static_cast<float>(k * static_cast<double>(count));
      const auto offset = static_cast<float>(-k * static_cast<double>(sp[c]));
      const auto xhat_scale = static_cast<float>(-k * static_cast<double>(sp[d.c + c]));
      const float mean_f = save_mean.f32()[c];
      const auto invstd_f = static_cast<float>(invstd);
      const float* xc = xp + a.at(n, c);
      const float* dyc = dyp + a.at(n, c);
      float* dxc = dxp + a.at(n, c);
      for (int64_t i = 0; i < hw; ++i)
        dxc[i * step] =
            dy_scale * dyc[i * step] + offset + xhat_scale * ((xc[i * step] - mean_f) * invstd_f);
    }
  }
}

}  // namespace dp::cpu
