// Elementwise ops on the CPU: ReLU, add, scale. They see memory as a flat array, so they work in
// every layout (both operands must share it). The loops are compiled per instruction set
// (DP_CPU_LOOPS).
#include <cmath>

#include "cpu/cpu_backend.hpp"

namespace dp::cpu {

namespace {

DP_CPU_LOOPS void relu_forward_loop(int threads, const float* x, float* y, int64_t n) {
#pragma omp parallel for num_threads(threads_for(n, threads)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

DP_CPU_LOOPS void relu_backward_loop(int threads, const float* y, const float* dy, float* dx,
                                     int64_t n) {
#pragma omp parallel for num_threads(threads_for(n, threads)) schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

DP_CPU_LOOPS void add_loop(int threads, const float* a, const float* b, float* y, int64_t n,
                          float alpha) {
  if (alpha == 1.0f) {
#pragma omp parallel for num_threads(threads_for(n, threads)) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    return;
  }
#pragma omp parallel for num_threads(threads_for(n, threads)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(alpha, b[i], a[i]);
}

DP_CPU_LOOPS void scale_loop(int threads, float* p, float alpha, int64_t n) {
#pragma omp parallel for num_threads(threads_for(n, threads)) schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

}  // namespace

// x -> y = max(x, 0), any shape and layout; y may alias x. NaN stays NaN (as PyTorch), so a
// diverging model is not hidden by the activation.
void CpuBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  relu_forward_loop(threads_, x.f32(), y.f32(), x.numel());
}

// y, dy -> dx = dy where y > 0, else 0; dx may alias dy.
void CpuBackend::relu_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  relu_backward_loop(threads_, y.f32(), dy.f32(), dx.f32(), y.numel());
}

// a, b -> y = a + alpha * b (same shape and layout), one rounding (fma, as the cuda kernel);
// y may alias a or b.
void CpuBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y, float alpha) {
  add_loop(threads_, a.f32(), b.f32(), y.f32(), a.numel(), alpha);
}

// t *= alpha, any shape and layout.
void CpuBackend::scale_impl(const Tensor& t, float alpha) {
  scale_loop(threads_, t.f32(), alpha, t.numel());
}

}  // namespace dp::cpu
