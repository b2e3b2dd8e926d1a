// Elementwise ops on the CPU: ReLU, add, scale. They see memory as a flat array, so they work in
// every layout (both operands must share it).
#include "cpu/cpu_backend.hpp"

namespace dp::cpu {

// x -> y = max(x, 0), any shape and layout; y may alias x. NaN stays NaN (as PyTorch), so a
// diverging model is not hidden by the activation.
void CpuBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  const float* xp = x.f32();
  float* yp = y.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] < 0.0f ? 0.0f : xp[i];
}

// y, dy -> dx = dy where y > 0, else 0; dx may alias dy.
void CpuBackend::relu_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const float* yp = y.f32();
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const int64_t n = y.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) dxp[i] = yp[i] > 0.0f ? dyp[i] : 0.0f;
}

// a, b -> y = a + b (same shape and layout); y may alias a or b.
void CpuBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y) {
  const float* ap = a.f32();
  const float* bp = b.f32();
  float* yp = y.f32();
  const int64_t n = a.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = ap[i] + bp[i];
}

// t *= alpha, any shape and layout.
void CpuBackend::scale_impl(const Tensor& t, float alpha) {
  float* p = t.f32();
  const int64_t n = t.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

}  // namespace dp::cpu
