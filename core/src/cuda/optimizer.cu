// The optimizers' updates over flat buffers, one grid-stride pass each: PyTorch's SGD
// (momentum, Nesterov, weight decay) and AdamW. The CPU twins are in cpu/optimizer_cpu.cpp.
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"

namespace dp::cuda::kernels {
namespace {

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, float lr,
                           float momentum, float wd, bool nesterov) {
  DP_GRID_STRIDE(i, n) {
    const float d = g[i] + wd * p[i];
    if (buf != nullptr) {
      const float b = momentum * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + momentum * b : b);
    } else {
      p[i] -= lr * d;
    }
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             float step_size, float decay, float b1, float b2, float eps,
                             float bias2_sqrt) {
  DP_GRID_STRIDE(i, n) {
    const float gi = g[i];
    p[i] *= decay;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * mi / (sqrtf(vi) / bias2_sqrt + eps);
  }
}

}  // namespace

void sgd_update(float* params, const float* grads, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, cudaStream_t stream) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream>>>(params, grads, momentum_buf, n, lr, momentum,
                                                   weight_decay, nesterov);
  CUDA_CHECK_LAUNCH(sgd_kernel);
}

void adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                  float step_size, float decay, float beta1, float beta2, float eps,
                  float bias2_sqrt, cudaStream_t stream) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      params, grads, exp_avg, exp_avg_sq, n, step_size, decay, beta1, beta2, eps, bias2_sqrt);
  CUDA_CHECK_LAUNCH(adamw_kernel);
}

}  // namespace dp::cuda::kernels
