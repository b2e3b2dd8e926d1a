// Pooling on the CPU in NHWC: the same ops as pool_cpu.cpp with channels innermost, so every
// inner loop runs over C contiguous floats (and vectorises, per instruction set: DP_CPU_LOOPS).
// Images are spread over the threads; the backward passes scatter into their own image only.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/cpu_backend.hpp"

namespace dp::cpu {

namespace {

struct NhwcPool {
  Dims in;
  int64_t p, q;
  const float* image(const float* base, int64_t n) const { return base + n * in.chw(); }
  float* image(float* base, int64_t n) const { return base + n * in.chw(); }
  int64_t out_image() const { return p * q * in.c; }
};

NhwcPool nhwc_pool(const PoolGeometry& g, const Tensor& in) {
  const Dims d = dims_of(in);
  return NhwcPool{d, g.out_h(d.h), g.out_w(d.w)};
}

// 2x2 windows with stride 2 and no padding (LeNet's): every input in at most one window, so the
// passes are written out (same summation order as the general walk: row-major in the window).
bool tiles_2x2(const PoolGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
         g.pad_w == 0;
}

// Channels handled together by max-pool backward, which keeps a "found" flag per channel on the
// stack.
constexpr int64_t kChannelBlock = 64;

}  // namespace

// x (N,H,W,C) -> y (N,P,Q,C) = window sums / (kernel_h * kernel_w), padding counted.
DP_CPU_LOOPS void avgpool_forward_nhwc(int threads, const PoolGeometry& g, const Tensor& x,
                                       const Tensor& y) {
  const NhwcPool pd = nhwc_pool(g, x);
  const Dims& d = pd.in;
  const float inv_area = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads)) schedule(static)
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xi = pd.image(x.f32(), n);
    float* yi = y.f32() + n * pd.out_image();
    if (tiles_2x2(g)) {
      for (int64_t p = 0; p < pd.p; ++p) {
        for (int64_t q = 0; q < pd.q; ++q) {
          float* out = yi + (p * pd.q + q) * d.c;
          const float* a = xi + (2 * p * d.w + 2 * q) * d.c;
          const float* b = a + d.c;
          const float* c = a + d.w * d.c;
          const float* e = c + d.c;
#pragma omp simd
          for (int64_t k = 0; k < d.c; ++k) out[k] = (((a[k] + b[k]) + c[k]) + e[k]) * inv_area;
        }
      }
      continue;
    }
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        float* out = yi + (p * pd.q + q) * d.c;
        std::fill(out, out + d.c, 0.0f);
        const PoolWindow win = pool_window(g, d, p, q);
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) {
            const float* in = xi + (h * d.w + w) * d.c;
#pragma omp simd
            for (int64_t c = 0; c < d.c; ++c) out[c] += in[c];
          }
#pragma omp simd
        for (int64_t c = 0; c < d.c; ++c) out[c] *= inv_area;
      }
    }
  }
}

// dy (N,P,Q,C) -> dx (N,H,W,C): each dy spread evenly over its window.
DP_CPU_LOOPS void avgpool_backward_nhwc(int threads, const PoolGeometry& g, const Tensor& dy,
                                        const Tensor& dx) {
  const NhwcPool pd = nhwc_pool(g, dx);
  const Dims& d = pd.in;
  const float inv_area = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads)) schedule(static)
  for (int64_t n = 0; n < d.n; ++n) {
    float* dxi = pd.image(dx.f32(), n);
    const float* dyi = dy.f32() + n * pd.out_image();
    // Rows and columns past the last window stay 0; windows that tile the image exactly write
    // every element themselves.
    if (!tiles_2x2(g) || d.h != 2 * pd.p || d.w != 2 * pd.q) std::fill(dxi, dxi + d.chw(), 0.0f);
    if (tiles_2x2(g)) {
      for (int64_t p = 0; p < pd.p; ++p) {
        for (int64_t q = 0; q < pd.q; ++q) {
          const float* grad = dyi + (p * pd.q + q) * d.c;
          float* a = dxi + (2 * p * d.w + 2 * q) * d.c;
          float* b = a + d.c;
          float* c = a + d.w * d.c;
          float* e = c + d.c;
#pragma omp simd
          for (int64_t k = 0; k < d.c; ++k) a[k] = b[k] = c[k] = e[k] = grad[k] * inv_area;
        }
      }
      continue;
    }
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        const float* grad = dyi + (p * pd.q + q) * d.c;
        const PoolWindow win = pool_window(g, d, p, q);
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) {
            float* out = dxi + (h * d.w + w) * d.c;
#pragma omp simd
            for (int64_t c = 0; c < d.c; ++c) out[c] += grad[c] * inv_area;
          }
      }
    }
  }
}

// x (N,H,W,C) -> y (N,P,Q,C) = window maxima (padding never wins; the first NaN wins).
DP_CPU_LOOPS void maxpool_forward_nhwc(int threads, const PoolGeometry& g, const Tensor& x,
                                       const Tensor& y) {
  const NhwcPool pd = nhwc_pool(g, x);
  const Dims& d = pd.in;
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads)) schedule(static)
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xi = pd.image(x.f32(), n);
    float* yi = y.f32() + n * pd.out_image();
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        float* out = yi + (p * pd.q + q) * d.c;
        std::fill(out, out + d.c, -std::numeric_limits<float>::infinity());
        const PoolWindow win = pool_window(g, d, p, q);
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) {
            const float* in = xi + (h * d.w + w) * d.c;
            for (int64_t c = 0; c < d.c; ++c) {
              const float v = in[c];
              if (v > out[c] || (std::isnan(v) && !std::isnan(out[c]))) out[c] = v;
            }
          }
      }
    }
  }
}

// x (N,H,W,C), y, dy (N,P,Q,C) -> dx (N,H,W,C): each dy goes to the first position of its window
// (row-major) that holds the maximum y.
DP_CPU_LOOPS void maxpool_backward_nhwc(int threads, const PoolGeometry& g, const Tensor& x,
                                        const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const NhwcPool pd = nhwc_pool(g, x);
  const Dims& d = pd.in;
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads)) schedule(static)
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xi = pd.image(x.f32(), n);
    const float* yi = y.f32() + n * pd.out_image();
    const float* dyi = dy.f32() + n * pd.out_image();
    float* dxi = pd.image(dx.f32(), n);
    std::fill(dxi, dxi + d.chw(), 0.0f);
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        const int64_t o = (p * pd.q + q) * d.c;
        const PoolWindow win = pool_window(g, d, p, q);
        for (int64_t c0 = 0; c0 < d.c; c0 += kChannelBlock) {
          const int64_t c1 = std::min(d.c, c0 + kChannelBlock);
          bool found[kChannelBlock] = {};
          for (int64_t h = win.h0; h < win.h1; ++h)
            for (int64_t w = win.w0; w < win.w1; ++w) {
              const int64_t at = (h * d.w + w) * d.c;
              for (int64_t c = c0; c < c1; ++c) {
                const float v = xi[at + c], best = yi[o + c];
                if (!found[c - c0] && (v == best || (std::isnan(best) && std::isnan(v)))) {
                  dxi[at + c] += dyi[o + c];
                  found[c - c0] = true;
                }
              }
            }
        }
      }
    }
  }
}

// x (N,H,W,C) -> y (N,1,1,C) = mean over H*W.
DP_CPU_LOOPS void global_avgpool_forward_nhwc(int threads, const Tensor& x, const Tensor& y) {
  const Dims d = dims_of(x);
  const auto count = static_cast<float>(d.hw());
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads)) schedule(static)
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xi = x.f32() + n * d.chw();
    float* out = y.f32() + n * d.c;
    std::fill(out, out + d.c, 0.0f);
    for (int64_t i = 0; i < d.hw(); ++i) {
#pragma omp simd
      for (int64_t c = 0; c < d.c; ++c) out[c] += xi[i * d.c + c];
    }
#pragma omp simd
    for (int64_t c = 0; c < d.c; ++c) out[c] /= count;  // as the NCHW version rounds
  }
}

// dy (N,1,1,C) -> dx (N,H,W,C) = dy / (H*W).
DP_CPU_LOOPS void global_avgpool_backward_nhwc(int threads, const Tensor& dy, const Tensor& dx) {
  const Dims d = dims_of(dx);
  const auto count = static_cast<float>(d.hw());
#pragma omp parallel for num_threads(threads_for(d.n* d.chw(), threads)) schedule(static)
  for (int64_t n = 0; n < d.n; ++n) {
    const float* grad = dy.f32() + n * d.c;
    float* dxi = dx.f32() + n * d.chw();
    for (int64_t i = 0; i < d.hw(); ++i) {
#pragma omp simd
      for (int64_t c = 0; c < d.c; ++c) dxi[i * d.c + c] = grad[c] / count;
    }
  }
}

}  // namespace dp::cpu
