// Pooling on the CPU (NCHW): average, max and global average. Every (n, c) plane is independent,
// so planes are spread over the threads; the backward passes scatter into their own plane only.
// NHWC tensors go to pool_nhwc_cpu.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

struct PoolDims {
  Dims in;
  int64_t p, q;
};

// The input's dims and the output size.
PoolDims pool_dims(const PoolGeometry& g, const Tensor& in) {
  const Dims d = dims_of(in);
  return PoolDims{d, g.out_h(d.h), g.out_w(d.w)};
}

// Windows that tile the input without overlap or padding (LeNet's 2x2 stride 2): every input
// belongs to at most one window, so both passes are straight row loops, several times faster
// than the general window walk.
bool tiles(const PoolGeometry& g) {
  return g.stride_h == g.kernel_h && g.stride_w == g.kernel_w && g.pad_h == 0 && g.pad_w == 0;
}

// x (N,C,H,W) -> y (N,C,P,Q) = window sums / (kernel_h * kernel_w), padding counted.
DP_CPU_LOOPS void avgpool_forward_nchw(int threads, const PoolGeometry& g, const Tensor& x,
                                       const Tensor& y) {
  const PoolDims pd = pool_dims(g, x);
  const Dims& d = pd.in;
  const float* xp = x.f32();
  float* yp = y.f32();
  const float inv_area = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  const int64_t planes = d.n * d.c;
#pragma omp parallel for num_threads(threads_for(planes* d.hw(), threads)) schedule(static)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* xc = xp + plane * d.hw();
    float* yc = yp + plane * pd.p * pd.q;
    if (tiles(g) && g.kernel_h == 2 && g.kernel_w == 2) {
      // The common 2x2 window written out, so it vectorises; same summation order as below.
      for (int64_t p = 0; p < pd.p; ++p) {
        float* yrow = yc + p * pd.q;
        const float* r0 = xc + 2 * p * d.w;
        const float* r1 = r0 + d.w;
        for (int64_t q = 0; q < pd.q; ++q)
          yrow[q] = (((r0[2 * q] + r0[2 * q + 1]) + r1[2 * q]) + r1[2 * q + 1]) * inv_area;
      }
      continue;
    }
    if (tiles(g)) {
      for (int64_t p = 0; p < pd.p; ++p) {
        float* yrow = yc + p * pd.q;
        for (int64_t q = 0; q < pd.q; ++q) yrow[q] = 0.0f;
        for (int64_t i = 0; i < g.kernel_h; ++i) {
          const float* xrow = xc + (p * g.kernel_h + i) * d.w;
          for (int64_t q = 0; q < pd.q; ++q)
            for (int64_t j = 0; j < g.kernel_w; ++j) yrow[q] += xrow[q * g.kernel_w + j];
        }
        for (int64_t q = 0; q < pd.q; ++q) yrow[q] *= inv_area;
      }
      continue;
    }
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        const PoolWindow win = pool_window(g, d, p, q);
        float sum = 0.0f;
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) sum += xc[h * d.w + w];
        yc[p * pd.q + q] = sum * inv_area;
      }
    }
  }
}

// dy (N,C,P,Q) -> dx (N,C,H,W): each dy spread evenly over its window.
DP_CPU_LOOPS void avgpool_backward_nchw(int threads, const PoolGeometry& g, const Tensor& dy,
                                        const Tensor& dx) {
  const PoolDims pd = pool_dims(g, dx);
  const Dims& d = pd.in;
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const float inv_area = 1.0f / static_cast<float>(g.kernel_h * g.kernel_w);
  const int64_t planes = d.n * d.c;
#pragma omp parallel for num_threads(threads_for(planes* d.hw(), threads)) schedule(static)
  for (int64_t plane = 0; plane < planes; ++plane) {
    float* dxc = dxp + plane * d.hw();
    const float* dyc = dyp + plane * pd.p * pd.q;
    if (tiles(g)) {
      // Rows and columns past the last window (odd sizes) get no gradient.
      for (int64_t h = 0; h < d.h; ++h) {
        float* dxrow = dxc + h * d.w;
        const int64_t p = h / g.kernel_h;
        int64_t covered = 0;
        if (p < pd.p) {
          const float* dyrow = dyc + p * pd.q;
          if (g.kernel_w == 2) {  // written out, so it vectorises
            for (int64_t q = 0; q < pd.q; ++q) {
              const float grad = dyrow[q] * inv_area;
              dxrow[2 * q] = grad;
              dxrow[2 * q + 1] = grad;
            }
          } else {
            for (int64_t q = 0; q < pd.q; ++q) {
              const float grad = dyrow[q] * inv_area;
              for (int64_t j = 0; j < g.kernel_w; ++j) dxrow[q * g.kernel_w + j] = grad;
            }
          }
          covered = pd.q * g.kernel_w;
        }
        for (int64_t w = covered; w < d.w; ++w) dxrow[w] = 0.0f;
      }
      continue;
    }
    std::fill(dxc, dxc + d.hw(), 0.0f);
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        const PoolWindow win = pool_window(g, d, p, q);
        const float grad = dyc[p * pd.q + q] * inv_area;
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) dxc[h * d.w + w] += grad;
      }
    }
  }
}

// x (N,C,H,W) -> y (N,C,P,Q) = window maxima (padding never wins).
DP_CPU_LOOPS void maxpool_forward_nchw(int threads, const PoolGeometry& g, const Tensor& x,
                                       const Tensor& y) {
  const PoolDims pd = pool_dims(g, x);
  const Dims& d = pd.in;
  const float* xp = x.f32();
  float* yp = y.f32();
  const int64_t planes = d.n * d.c;
#pragma omp parallel for num_threads(threads_for(planes* d.hw(), threads)) schedule(static)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* xc = xp + plane * d.hw();
    float* yc = yp + plane * pd.p * pd.q;
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        const PoolWindow win = pool_window(g, d, p, q);
        float best = -std::numeric_limits<float>::infinity();
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) {
            // The first NaN of a window wins (NaN propagates, as in PyTorch).
            const float v = xc[h * d.w + w];
            if (v > best || (std::isnan(v) && !std::isnan(best))) best = v;
          }
        yc[p * pd.q + q] = best;
      }
    }
  }
}

// x (N,C,H,W), y, dy (N,C,P,Q) -> dx (N,C,H,W): each dy goes to the first position of its window
// (row-major) that holds the maximum y.
DP_CPU_LOOPS void maxpool_backward_nchw(int threads, const PoolGeometry& g, const Tensor& x,
                                        const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const PoolDims pd = pool_dims(g, x);
  const Dims& d = pd.in;
  const float* xp = x.f32();
  const float* yp = y.f32();
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const int64_t planes = d.n * d.c;
#pragma omp parallel for num_threads(threads_for(planes* d.hw(), threads)) schedule(static)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* xc = xp + plane * d.hw();
    const float* yc = yp + plane * pd.p * pd.q;
    const float* dyc = dyp + plane * pd.p * pd.q;
    float* dxc = dxp + plane * d.hw();
    std::fill(dxc, dxc + d.hw(), 0.0f);
    for (int64_t p = 0; p < pd.p; ++p) {
      for (int64_t q = 0; q < pd.q; ++q) {
        const PoolWindow win = pool_window(g, d, p, q);
        const float best = yc[p * pd.q + q];
        int64_t at = -1;
        for (int64_t h = win.h0; h < win.h1 && at < 0; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w)
            if (xc[h * d.w + w] == best || (std::isnan(best) && std::isnan(xc[h * d.w + w]))) {
              at = h * d.w + w;
              break;
            }
        if (at >= 0) dxc[at] += dyc[p * pd.q + q];
      }
    }
  }
}

// x (N,C,H,W) -> y (N,C,1,1) = mean over H*W.
DP_CPU_LOOPS void global_avgpool_forward_nchw(int threads, const Tensor& x, const Tensor& y) {
  const Dims d = dims_of(x);
  const float* xp = x.f32();
  float* yp = y.f32();
  const int64_t planes = d.n * d.c;
  const int64_t hw = d.hw();
#pragma omp parallel for num_threads(threads_for(planes* hw, threads)) schedule(static)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* xc = xp + plane * hw;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < hw; ++i) sum += xc[i];
    yp[plane] = sum / static_cast<float>(hw);
  }
}

// dy (N,C,1,1) -> dx (N,C,H,W) = dy / (H*W).
DP_CPU_LOOPS void global_avgpool_backward_nchw(int threads, const Tensor& dy, const Tensor& dx) {
  const Dims d = dims_of(dx);
  const float* dyp = dy.f32();
  float* dxp = dx.f32();
  const int64_t planes = d.n * d.c;
  const int64_t hw = d.hw();
#pragma omp parallel for num_threads(threads_for(planes* hw, threads)) schedule(static)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float grad = dyp[plane] / static_cast<float>(hw);
    float* dxc = dxp + plane * hw;
    for (int64_t i = 0; i < hw; ++i) dxc[i] = grad;
  }
}

}  // namespace

// The ops: NHWC tensors go to pool_nhwc_cpu.cpp, NCHW ones to the loops above.
void CpuBackend::avgpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  if (is_nhwc(x)) return avgpool_forward_nhwc(threads_, g, x, y);
  avgpool_forward_nchw(threads_, g, x, y);
}

void CpuBackend::avgpool_backward_impl(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) {
  if (is_nhwc(dx)) return avgpool_backward_nhwc(threads_, g, dy, dx);
  avgpool_backward_nchw(threads_, g, dy, dx);
}

void CpuBackend::maxpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  if (is_nhwc(x)) return maxpool_forward_nhwc(threads_, g, x, y);
  maxpool_forward_nchw(threads_, g, x, y);
}

void CpuBackend::maxpool_backward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                                       const Tensor& dy, const Tensor& dx) {
  if (is_nhwc(x)) return maxpool_backward_nhwc(threads_, g, x, y, dy, dx);
  maxpool_backward_nchw(threads_, g, x, y, dy, dx);
}

void CpuBackend::global_avgpool_forward_impl(const Tensor& x, const Tensor& y) {
  if (is_nhwc(x)) return global_avgpool_forward_nhwc(threads_, x, y);
  global_avgpool_forward_nchw(threads_, x, y);
}

void CpuBackend::global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) {
  if (is_nhwc(dx)) return global_avgpool_backward_nhwc(threads_, dy, dx);
  global_avgpool_backward_nchw(threads_, dy, dx);
}

}  // namespace dp::cpu
