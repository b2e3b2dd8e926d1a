// The pieces of synchronised batch norm between its allreduces (Backend::batchnorm_sums,
// _apply_stats, _backward_sums, _backward_apply). Reductions: one block per channel, each thread
// accumulating in double over a fixed stride, then a fixed tree: deterministic, and accurate for
// the 200k values per channel of a ResNet-18 stem at batch 256. The elementwise passes are
// grid-stride loops.
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"

namespace dp::cuda::kernels {
namespace {

/// Sums a block's doubles in a fixed order; valid in thread 0.
__device__ double block_sum_f64(double v, double* shared /* kThreads */) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  return shared[0];
}

/// Memory offset of the e-th value (n-major, then h, w) of channel ch.
template <bool kNhwc>
__device__ __forceinline__ int64_t channel_offset(int64_t e, int64_t ch, int64_t c, int64_t hw) {
  return kNhwc ? e * c + ch : ((e / hw) * c + ch) * hw + e % hw;
}

// Block `ch`: out[ch] = sum x, or sum (x - mean[ch])^2 when mean is given.
template <bool kNhwc, typename T>
__global__ void bn_sums_kernel(const T* x, const float* mean, float* out, int64_t c, int64_t hw,
                               int64_t total) {
  __shared__ double shared[kThreads];
  const int64_t ch = blockIdx.x;
  const double m = mean != nullptr ? mean[ch] : 0.0;
  double acc = 0.0;
  for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
    const double v = load_f32(x, channel_offset<kNhwc>(e, ch, c, hw));
    acc += mean != nullptr ? (v - m) * (v - m) : v;
  }
  const double s = block_sum_f64(acc, shared);
  if (threadIdx.x == 0) out[ch] = static_cast<float>(s);
}

// Block `ch`: sums[ch] = sum g, sums[C + ch] = sum g * (x - mean) * invstd; g = dy, or with the
// ReLU epilogue (kRelu) g = y > 0 ? dy : 0, written to dz (relu_backward's mask, y as stored).
template <bool kNhwc, bool kRelu, typename T, typename Y, typename D>
__global__ void bn_backward_sums_kernel(const T* x, const D* dy, const Y* y, float* dz,
                                        const float* mean, const float* invstd, float* sums,
                                        int64_t c, int64_t hw, int64_t total) {
  __shared__ double shared[kThreads];
  const int64_t ch = blockIdx.x;
  const double m = mean[ch], is = invstd[ch];
  double sum_dy = 0.0, sum_dy_xhat = 0.0;
  for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
    const int64_t i = channel_offset<kNhwc>(e, ch, c, hw);
    float g = load_f32(dy, i);
    if (kRelu) {
      g = load_f32(y, i) > 0.0f ? g : 0.0f;
      dz[i] = g;
    }
    sum_dy += g;
    sum_dy_xhat += static_cast<double>(g) * ((load_f32(x, i) - m) * is);
  }
  const double a = block_sum_f64(sum_dy, shared);
  if (threadIdx.x == 0) sums[ch] = static_cast<float>(a);
  __syncthreads();  // shared is reused
  const double b = block_sum_f64(sum_dy_xhat, shared);
  if (threadIdx.x == 0) sums[c + ch] = static_cast<float>(b);
}

// Per channel: save_mean, save_invstd and the running statistics.
__global__ void bn_finalize_stats_kernel(const float* mean, const float* var, float* running_mean,
                                         float* running_var, const float* conv_bias, float momentum,
                                         float eps, int64_t count, float* save_mean,
                                         float* save_invstd, int64_t c) {
  DP_GRID_STRIDE(ch, c) {
    const double m = mean[ch], v = var[ch];
    const double unbiased = v * static_cast<double>(count) / static_cast<double>(count - 1);
    save_mean[ch] = static_cast<float>(m);
    save_invstd[ch] = static_cast<float>(1.0 / sqrt(v + static_cast<double>(eps)));
    const auto updated = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * m);
    // x lacks the folded convolution bias: its share, as Backend::add(mean, bias, mean, momentum).
    running_mean[ch] = conv_bias != nullptr ? fmaf(momentum, conv_bias[ch], updated) : updated;
    running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
  }
}

// y = relu?(normalised x (+ residual)): the values of the normalisation, add and relu_forward
// one after the other (NaN stays NaN), stored as Y; a residual of R (a packed bf16 one widened).
template <bool kNhwc, bool kResidual, bool kRelu, typename T, typename Y, typename R>
__global__ void bn_normalize_kernel(const T* x, const float* gamma, const float* beta,
                                    const float* mean, const float* invstd, const R* residual, Y* y,
                                    int64_t n, int64_t c, int64_t hw) {
  DP_GRID_STRIDE(i, n) {
    const int64_t ch = kNhwc ? i % c : (i / hw) % c;
    const float scale = gamma[ch] * invstd[ch];
    float v = load_f32(x, i) * scale + (beta[ch] - mean[ch] * scale);
    if (kResidual) v = v + load_f32(residual, i);
    if (kRelu) v = v < 0.0f ? 0.0f : v;
    store_f32(y, i, v);
  }
}

// Without a residual the kernels are those of R = float (one set, whatever R).
template <bool kNhwc, typename T, typename Y, typename R>
void launch_normalize(const T* x, const float* gamma, const float* beta, const float* mean,
                      const float* invstd, const R* residual, bool relu, Y* y, int64_t total,
                      int64_t c, int64_t hw, cudaStream_t stream) {
  const unsigned grid = grid_for(total);
  const float* none = nullptr;
  if (residual != nullptr && relu) {
    bn_normalize_kernel<kNhwc, true, true, T, Y, R>
        <<<grid, kThreads, 0, stream>>>(x, gamma, beta, mean, invstd, residual, y, total, c, hw);
  } else if (residual != nullptr) {
    bn_normalize_kernel<kNhwc, true, false, T, Y, R>
        <<<grid, kThreads, 0, stream>>>(x, gamma, beta, mean, invstd, residual, y, total, c, hw);
  } else if (relu) {
    bn_normalize_kernel<kNhwc, false, true, T, Y, float>
        <<<grid, kThreads, 0, stream>>>(x, gamma, beta, mean, invstd, none, y, total, c, hw);
  } else {
    bn_normalize_kernel<kNhwc, false, false, T, Y, float>
        <<<grid, kThreads, 0, stream>>>(x, gamma, beta, mean, invstd, none, y, total, c, hw);
  }
  CUDA_CHECK_LAUNCH(bn_normalize_kernel);
}

template <bool kNhwc, typename T, typename Y, typename D>
void launch_backward_sums(const T* x, const D* dy, const Y* y, float* dz, const float* mean,
                          const float* invstd, float* sums, int64_t c, int64_t hw, int64_t total,
                          cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(c);
  if (y != nullptr) {
    bn_backward_sums_kernel<kNhwc, true, T, Y, D>
        <<<grid, kThreads, 0, stream>>>(x, dy, y, dz, mean, invstd, sums, c, hw, total);
  } else {
    bn_backward_sums_kernel<kNhwc, false, T, Y, D>
        <<<grid, kThreads, 0, stream>>>(x, dy, y, dz, mean, invstd, sums, c, hw, total);
  }
  CUDA_CHECK_LAUNCH(bn_backward_sums_kernel);
}

template <bool kNhwc, typename T>
__global__ void bn_backward_apply_kernel(const T* x, const float* dy, const float* gamma,
                                         const float* mean, const float* invstd, const float* sums,
                                         int64_t count, T* dx, int64_t n, int64_t c, int64_t hw) {
  DP_GRID_STRIDE(i, n) {
    const int64_t ch = kNhwc ? i % c : (i / hw) % c;
    const double k = static_cast<double>(gamma[ch]) * invstd[ch] / static_cast<double>(count);
    const auto dy_scale = static_cast<float>(k * static_cast<double>(count));
    const auto offset = static_cast<float>(-k * static_cast<double>(sums[ch]));
    const auto xhat_scale = static_cast<float>(-k * static_cast<double>(sums[c + ch]));
    store_f32(dx, i,
              dy_scale * dy[i] + offset + xhat_scale * ((load_f32(x, i) - mean[ch]) * invstd[ch]));
  }
}

}  // namespace

template <typename T>
void bn_sums(const T* x, const float* mean, float* out, int64_t n, int64_t c, int64_t hw, bool nhwc,
             cudaStream_t stream) {
  if (c <= 0) return;
  const auto grid = static_cast<unsigned>(c);
  if (nhwc) {
    bn_sums_kernel<true, T><<<grid, kThreads, 0, stream>>>(x, mean, out, c, hw, n * hw);
  } else {
    bn_sums_kernel<false, T><<<grid, kThreads, 0, stream>>>(x, mean, out, c, hw, n * hw);
  }
  CUDA_CHECK_LAUNCH(bn_sums_kernel);
}

template <typename T, typename Y, typename R>
void bn_apply_stats(const T* x, const float* gamma, const float* beta, const float* mean,
                    const float* var, float* running_mean, float* running_var,
                    const float* conv_bias, float momentum, float eps, int64_t count,
                    float* save_mean, float* save_invstd, const R* residual, bool relu, Y* y,
                    int64_t n, int64_t c, int64_t hw, bool nhwc, cudaStream_t stream) {
  bn_finalize_stats_kernel<<<grid_for(c), kThreads, 0, stream>>>(
      mean, var, running_mean, running_var, conv_bias, momentum, eps, count, save_mean, save_invstd,
      c);
  CUDA_CHECK_LAUNCH(bn_finalize_stats_kernel);
  const int64_t total = n * c * hw;
  if (total == 0) return;
  if (nhwc) {
    launch_normalize<true>(x, gamma, beta, save_mean, save_invstd, residual, relu, y, total, c, hw,
                           stream);
  } else {
    launch_normalize<false>(x, gamma, beta, save_mean, save_invstd, residual, relu, y, total, c, hw,
                            stream);
  }
}

template <typename T, typename Y, typename D>
void bn_backward_sums(const T* x, const D* dy, const Y* y, float* dz, const float* save_mean,
                      const float* save_invstd, float* sums, int64_t n, int64_t c, int64_t hw,
                      bool nhwc, cudaStream_t stream) {
  if (c <= 0) return;
  if (nhwc) {
    launch_backward_sums<true>(x, dy, y, dz, save_mean, save_invstd, sums, c, hw, n * hw, stream);
  } else {
    launch_backward_sums<false>(x, dy, y, dz, save_mean, save_invstd, sums, c, hw, n * hw, stream);
  }
}

template <typename T>
void bn_backward_apply(const T* x, const float* dy, const float* gamma, const float* save_mean,
                       const float* save_invstd, const float* sums, int64_t count, T* dx, int64_t n,
                       int64_t c, int64_t hw, bool nhwc, cudaStream_t stream) {
  const int64_t total = n * c * hw;
  if (total == 0) return;
  if (nhwc) {
    bn_backward_apply_kernel<true, T><<<grid_for(total), kThreads, 0, stream>>>(
        x, dy, gamma, save_mean, save_invstd, sums, count, dx, total, c, hw);
  } else {
    bn_backward_apply_kernel<false, T><<<grid_for(total), kThreads, 0, stream>>>(
        x, dy, gamma, save_mean, save_invstd, sums, count, dx, total, c, hw);
  }
  CUDA_CHECK_LAUNCH(bn_backward_apply_kernel);
}

// fp32 activations, and packed bf16 ones: x the stored output of a bf16 convolution, y the
// stored output of a batch norm whose readers take it so, the residual a packed earlier output.
#define DP_BN_SYNC_INPUT(T)                                                                     \
  template void bn_sums<T>(const T*, const float*, float*, int64_t, int64_t, int64_t, bool,     \
                           cudaStream_t);                                                       \
  template void bn_backward_apply<T>(const T*, const float*, const float*, const float*,        \
                                     const float*, const float*, int64_t, T*, int64_t, int64_t, \
                                     int64_t, bool, cudaStream_t);
#define DP_BN_SYNC_APPLY(T, Y, R)                                                                 \
  template void bn_apply_stats<T, Y, R>(const T*, const float*, const float*, const float*,       \
                                        const float*, float*, float*, const float*, float, float, \
                                        int64_t, float*, float*, const R*, bool, Y*, int64_t,     \
                                        int64_t, int64_t, bool, cudaStream_t);
#define DP_BN_SYNC_TYPES(T, Y)                                                             \
  DP_BN_SYNC_APPLY(T, Y, float)                                                            \
  DP_BN_SYNC_APPLY(T, Y, uint16_t)                                                         \
  template void bn_backward_sums<T, Y, float>(const T*, const float*, const Y*, float*,    \
                                              const float*, const float*, float*, int64_t, \
                                              int64_t, int64_t, bool, cudaStream_t);
DP_BN_SYNC_INPUT(float)
DP_BN_SYNC_INPUT(uint16_t)
DP_BN_SYNC_TYPES(float, float)
DP_BN_SYNC_TYPES(uint16_t, float)
DP_BN_SYNC_TYPES(float, uint16_t)
DP_BN_SYNC_TYPES(uint16_t, uint16_t)
#undef DP_BN_SYNC_INPUT
#undef DP_BN_SYNC_APPLY
#undef DP_BN_SYNC_TYPES
// A packed bf16 dy, with a bf16 y: the gradient a bf16 convolution wrote for the batch norm that
// feeds it alone.
template void bn_backward_sums<float, uint16_t, uint16_t>(const float*, const uint16_t*,
                                                          const uint16_t*, float*, const float*,
                                                          const float*, float*, int64_t, int64_t,
                                                          int64_t, bool, cudaStream_t);
template void bn_backward_sums<uint16_t, uint16_t, uint16_t>(const uint16_t*, const uint16_t*,
                                                             const uint16_t*, float*, const float*,
                                                             const float*, float*, int64_t, int64_t,
                                                             int64_t, bool, cudaStream_t);

}  // namespace dp::cuda::kernels
