// Elementwise ops on the CPU: ReLU, add, scale. They see memory as a flat array, so they work in
// every layout (both operands must share it). The loops are compiled per instruction set
// (DP_CPU_LOOPS).
#include <cmath>

#include "cpu/cpu_backend.hpp"
#include "dp/bf16.hpp"

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

// db[c] = the sum over the positions of channel c of dx, in position order (each value rounded
// to bf16 first when `round`), accumulated in T: channels split over the threads, so the order
// does not depend on their number. dx is (outer, c, inner) in memory: (N, C) and NHWC have
// inner 1, NCHW inner H*W. (Plain functions, not a template: target_clones takes no templates.)
template <typename T>
inline void channel_sums(const float* dx, float* db, int64_t ch, int64_t outer, int64_t c,
                         int64_t inner, bool round) {
  T s = 0;
  for (int64_t o = 0; o < outer; ++o) {
    const float* row = dx + (o * c + ch) * inner;
    for (int64_t i = 0; i < inner; ++i) s += round ? dp::round_to_bf16(row[i]) : row[i];
  }
  db[ch] = static_cast<float>(s);
}
// In float, as linear_backward's bias gradient sums its rows.
DP_CPU_LOOPS void channel_sums_f32_loop(int threads, const float* dx, float* db, int64_t outer,
                                        int64_t c, int64_t inner, bool round) {
#pragma omp parallel for num_threads(threads_for(outer* c* inner, threads)) schedule(static)
  for (int64_t ch = 0; ch < c; ++ch) channel_sums<float>(dx, db, ch, outer, c, inner, round);
}
// In double, rounded once: a convolution's bias gradient sums N*H*W values (173056 a channel in
// LeNet's first layer at batch 256), too many for a float running sum, whose error grows with the
// count and which k replicas, each summing a share, would not reproduce.
DP_CPU_LOOPS void channel_sums_f64_loop(int threads, const float* dx, float* db, int64_t outer,
                                        int64_t c, int64_t inner, bool round) {
#pragma omp parallel for num_threads(threads_for(outer* c* inner, threads)) schedule(static)
  for (int64_t ch = 0; ch < c; ++ch) channel_sums<double>(dx, db, ch, outer, c, inner, round);
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

// relu_backward, then db = the per-channel sums of dx: for (N, C) in linear_backward's order
// (row by row from 0, in float), for rank 4 position by position (in NCHW each example's plane in
// turn) in double. In precision bf16 the values summed are rounded, as the rounded dy the
// layers' own bias gradients sum.
void CpuBackend::relu_backward_bias_impl(const Tensor& y, const Tensor& dy, const Tensor& dx,
                                         const Tensor& db) {
  relu_backward_impl(y, dy, dx);
  const int64_t n = y.shape[0], c = y.shape[1];
  const int64_t positions = y.numel() / (n * c);  // H*W, or 1
  const bool channels_last = y.shape.rank == 2 || y.layout == Layout::nhwc;
  const int64_t outer = channels_last ? n * positions : n;
  const int64_t inner = channels_last ? 1 : positions;
  const bool round = precision_ == Precision::bf16;
  if (y.shape.rank == 2) {
    channel_sums_f32_loop(threads_, dx.f32(), db.f32(), outer, c, inner, round);
  } else {
    channel_sums_f64_loop(threads_, dx.f32(), db.f32(), outer, c, inner, round);
  }
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
