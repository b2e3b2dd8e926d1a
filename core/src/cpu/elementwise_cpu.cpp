// Elementwise ops on the CPU: ReLU, add, scale. They see memory as a flat array, so they work in
// every layout (both operands must share it).
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

void check_like(const Tensor& t, const Tensor& like, const char* op, const char* what,
                const char* like_name) {
  expect_dtype(t, DType::f32, op, what);
  expect_not_null(t.data, op, what);
  expect_shape(t, like.shape, op, what);
  if (t.layout != like.layout) {
    DP_THROW(std::string("cpu backend: ") + op + ": " + what + " has layout " +
             layout_name(t.layout) + " but " + like_name + " has layout " +
             layout_name(like.layout) + "; both must share one layout");
  }
}

void check_f32(const Tensor& t, const char* op, const char* what) {
  expect_dtype(t, DType::f32, op, what);
  if (t.numel() > 0) expect_not_null(t.data, op, what);
}

}  // namespace

// x -> y = max(x, 0), any shape and layout; y may alias x. NaN stays NaN (as PyTorch), so a
// diverging model is not hidden by the activation.
void CpuBackend::relu_forward(const Tensor& x, const Tensor& y) {
  const char* op = "relu_forward";
  check_f32(x, op, "x");
  check_like(y, x, op, "y", "x");
  const float* xp = x.f32();
  float* yp = y.f32();
  const int64_t n = x.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] < 0.0f ? 0.0f : xp[i];
}

// y, dy -> dx = dy where y > 0, else 0; dx may alias dy.
void CpuBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const char* op = "relu_backward";
  check_f32(y, op, "y");
  check_like(dy, y, op, "dy", "y");
  check_like(dx, y, op, "dx", "y");
  const float* yp = y.f32();
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const int64_t n = y.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) dxp[i] = yp[i] > 0.0f ? dyp[i] : 0.0f;
}

// a, b -> y = a + b (same shape and layout); y may alias a or b.
void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  const char* op = "add";
  check_f32(a, op, "a");
  check_like(b, a, op, "b", "a");
  check_like(y, a, op, "y", "a");
  const float* ap = a.f32();
  const float* bp = b.f32();
  float* yp = y.f32();
  const int64_t n = a.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = ap[i] + bp[i];
}

// t *= alpha, any shape and layout.
void CpuBackend::scale(const Tensor& t, float alpha) {
  check_f32(t, "scale", "t");
  float* p = t.f32();
  const int64_t n = t.numel();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= alpha;
}

}  // namespace dp::cpu
