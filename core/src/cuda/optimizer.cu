// The optimizers' updates over flat buffers, one grid-stride pass each: PyTorch's SGD
// (momentum, Nesterov, weight decay) and AdamW. The CPU twins are in cpu/optimizer_cpu.cpp.
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"
#include "dp/bf16.hpp"

namespace dp::cuda::kernels {
namespace {

// The packed bf16 rounding of the updated value p[i], where there is a copy to keep.
__device__ __forceinline__ void pack(const float* p, uint16_t* packed, int64_t i) {
  if (packed != nullptr) {
    packed[i] = dp::packed_bf16_bits(__float_as_uint(p[i]));
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, float host_lr,
                           float momentum, float wd, bool nesterov, DeviceRow lr_row,
                           uint16_t* packed) {
  const float lr = row_f32(lr_row, 0, host_lr);
  DP_GRID_STRIDE(i, n) {
    const float d = g[i] + wd * p[i];
    if (buf != nullptr) {
      const float b = momentum * buf[i] + d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + momentum * b : b);
    } else {
      p[i] -= lr * d;
    }
    pack(p, packed, i);
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                             float host_step_size, float host_decay, float b1, float b2, float eps,
                             float host_bias2_sqrt, DeviceRow step_row, uint16_t* packed) {
  const float step_size = row_f32(step_row, 0, host_step_size);
  const float decay = row_f32(step_row, 1, host_decay);
  const float bias2_sqrt = row_f32(step_row, 2, host_bias2_sqrt);
  DP_GRID_STRIDE(i, n) {
    const float gi = g[i];
    p[i] *= decay;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * mi / (sqrtf(vi) / bias2_sqrt + eps);
    pack(p, packed, i);
  }
}

__global__ void advance_kernel(int32_t* cursor) { ++*cursor; }

}  // namespace

void advance(int32_t* cursor, cudaStream_t stream) {
  advance_kernel<<<1, 1, 0, stream>>>(cursor);
  CUDA_CHECK_LAUNCH(advance_kernel);
}

void sgd_update(float* params, const float* grads, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, DeviceRow lr_row,
                uint16_t* packed, cudaStream_t stream) {
  if (n <= 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, stream>>>(params, grads, momentum_buf, n, lr, momentum,
                                                   weight_decay, nesterov, lr_row, packed);
  CUDA_CHECK_LAUNCH(sgd_kernel);
}

void adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                  float step_size, float decay, float beta1, float beta2, float eps,
                  float bias2_sqrt, DeviceRow step_row, uint16_t* packed, cudaStream_t stream) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(params, grads, exp_avg, exp_avg_sq, n,
                                                     step_size, decay, beta1, beta2, eps,
                                                     bias2_sqrt, step_row, packed);
  CUDA_CHECK_LAUNCH(adamw_kernel);
}

}  // namespace dp::cuda::kernels
