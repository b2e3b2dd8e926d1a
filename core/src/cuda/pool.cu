// Pooling kernels, NCHW and NHWC. Backward passes are written as gathers (one thread per input
// element visits the windows that contain it), so they need no atomics and are deterministic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"

namespace dp::cuda::kernels {
namespace {

/// A PoolShape in the kernels' index type I: int32_t where every offset of x and y fits (32-bit
/// division is several times cheaper than 64-bit, which the GPU emulates; LeNet's average pools
/// spent most of their time decoding indices), else int64_t.
template <typename I>
struct Pool {
  I n, c, h, w, p, q, kh, kw, sh, sw, ph, pw;
  explicit Pool(const PoolShape& s)
      : n(static_cast<I>(s.n)),
        c(static_cast<I>(s.c)),
        h(static_cast<I>(s.h)),
        w(static_cast<I>(s.w)),
        p(static_cast<I>(s.p)),
        q(static_cast<I>(s.q)),
        kh(static_cast<I>(s.kh)),
        kw(static_cast<I>(s.kw)),
        sh(static_cast<I>(s.sh)),
        sw(static_cast<I>(s.sw)),
        ph(static_cast<I>(s.ph)),
        pw(static_cast<I>(s.pw)) {}
};

/// Output rows p (or columns) whose window covers input row h: [lo, hi].
template <typename I>
__device__ __forceinline__ void covering(I h, I k, I stride, I pad, I out, I& lo, I& hi) {
  const I first = h + pad - k + 1;  // smallest window start that still covers h
  lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  hi = min((h + pad) / stride, out - 1);
}

template <bool kNhwc, typename I>
__global__ void avgpool_forward_kernel(Pool<I> s, const float* x, float* y) {
  const float divisor = static_cast<float>(s.kh * s.kw);
  const I total = s.n * s.c * s.p * s.q;
  DP_GRID_STRIDE_AS(I, i, total) {
    I n, c, p, q;
    decode4<kNhwc>(i, s.c, s.p, s.q, n, c, p, q);
    float sum = 0.0f;
    for (I r = 0; r < s.kh; ++r) {
      const I h = p * s.sh - s.ph + r;
      if (h < 0 || h >= s.h) continue;
      for (I t = 0; t < s.kw; ++t) {
        const I w = q * s.sw - s.pw + t;
        if (w < 0 || w >= s.w) continue;
        sum += x[offset4<kNhwc>(n, c, h, w, s.c, s.h, s.w)];
      }
    }
    y[i] = sum / divisor;
  }
}

template <bool kNhwc, typename I>
__global__ void avgpool_backward_kernel(Pool<I> s, const float* dy, float* dx) {
  const float divisor = static_cast<float>(s.kh * s.kw);
  const I total = s.n * s.c * s.h * s.w;
  DP_GRID_STRIDE_AS(I, i, total) {
    I n, c, h, w;
    decode4<kNhwc>(i, s.c, s.h, s.w, n, c, h, w);
    I p_lo, p_hi, q_lo, q_hi;
    covering(h, s.kh, s.sh, s.ph, s.p, p_lo, p_hi);
    covering(w, s.kw, s.sw, s.pw, s.q, q_lo, q_hi);
    float sum = 0.0f;
    for (I p = p_lo; p <= p_hi; ++p) {
      for (I q = q_lo; q <= q_hi; ++q) {
        sum += dy[offset4<kNhwc>(n, c, p, q, s.c, s.p, s.q)] / divisor;
      }
    }
    dx[i] = sum;
  }
}

/// The first maximum of window (p, q) in row-major window order, padded positions excluded; the
/// first NaN wins over any number (NaN propagates, as on the CPU and in PyTorch).
template <bool kNhwc, typename I>
__device__ __forceinline__ float window_max(const Pool<I>& s, const float* x, I n, I c, I p, I q,
                                            I& best_h, I& best_w) {
  float best = -INFINITY;
  best_h = -1;
  best_w = -1;
  for (I r = 0; r < s.kh; ++r) {
    const I h = p * s.sh - s.ph + r;
    if (h < 0 || h >= s.h) continue;
    for (I t = 0; t < s.kw; ++t) {
      const I w = q * s.sw - s.pw + t;
      if (w < 0 || w >= s.w) continue;
      const float v = x[offset4<kNhwc>(n, c, h, w, s.c, s.h, s.w)];
      if (best_h < 0 || v > best || (isnan(v) && !isnan(best))) {
        best = v;
        best_h = h;
        best_w = w;
      }
    }
  }
  return best;
}

template <bool kNhwc, typename I>
__global__ void maxpool_forward_kernel(Pool<I> s, const float* x, float* y) {
  const I total = s.n * s.c * s.p * s.q;
  DP_GRID_STRIDE_AS(I, i, total) {
    I n, c, p, q, bh, bw;
    decode4<kNhwc>(i, s.c, s.p, s.q, n, c, p, q);
    y[i] = window_max<kNhwc>(s, x, n, c, p, q, bh, bw);
  }
}

template <bool kNhwc, typename I>
__global__ void maxpool_backward_kernel(Pool<I> s, const float* x, const float* dy, float* dx) {
  const I total = s.n * s.c * s.h * s.w;
  DP_GRID_STRIDE_AS(I, i, total) {
    I n, c, h, w;
    decode4<kNhwc>(i, s.c, s.h, s.w, n, c, h, w);
    I p_lo, p_hi, q_lo, q_hi;
    covering(h, s.kh, s.sh, s.ph, s.p, p_lo, p_hi);
    covering(w, s.kw, s.sw, s.pw, s.q, q_lo, q_hi);
    float sum = 0.0f;
    for (I p = p_lo; p <= p_hi; ++p) {
      for (I q = q_lo; q <= q_hi; ++q) {
        I bh, bw;
        window_max<kNhwc>(s, x, n, c, p, q, bh, bw);
        if (bh == h && bw == w) sum += dy[offset4<kNhwc>(n, c, p, q, s.c, s.p, s.q)];
      }
    }
    dx[i] = sum;
  }
}

/// Calls launch(nhwc, index) with nhwc a std::bool_constant of s.nhwc and index an int32_t where
/// every offset of the input, the output and the grid-stride loop fits it, else an int64_t.
template <typename Launch>
void dispatch_pool(const PoolShape& s, int64_t total, Launch&& launch) {
  dispatch_index(s.n * s.c * std::max(s.h * s.w, s.p * s.q) + int64_t{kThreads} * grid_for(total),
                 [&](auto index) {
                   if (s.nhwc) {
                     launch(std::true_type{}, index);
                   } else {
                     launch(std::false_type{}, index);
                   }
                 });
}

// NCHW: one warp per (n, c) plane.
__global__ void global_avgpool_nchw_kernel(const float* x, float* y, int64_t planes, int64_t hw) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t plane = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       plane < planes; plane += warps) {
    float sum = 0.0f;
    for (int64_t s = lane; s < hw; s += 32) sum += x[plane * hw + s];
    for (int offset = 16; offset > 0; offset /= 2)
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) y[plane] = sum / static_cast<float>(hw);
  }
}

// NHWC: one thread per (n, c); neighbouring threads read neighbouring channels.
__global__ void global_avgpool_nhwc_kernel(const float* x, float* y, int64_t n, int64_t c,
                                           int64_t hw) {
  DP_GRID_STRIDE(i, n * c) {
    const int64_t b = i / c, ch = i % c;
    float sum = 0.0f;
    for (int64_t s = 0; s < hw; ++s) sum += x[(b * hw + s) * c + ch];
    y[i] = sum / static_cast<float>(hw);
  }
}

template <bool kNhwc>
__global__ void global_avgpool_backward_kernel(const float* dy, float* dx, int64_t n, int64_t c,
                                               int64_t hw) {
  DP_GRID_STRIDE(i, n * c * hw) {
    const int64_t plane = kNhwc ? (i / (hw * c)) * c + i % c : i / hw;
    dx[i] = dy[plane] / static_cast<float>(hw);
  }
}

}  // namespace

void avgpool_forward(const PoolShape& s, const float* x, float* y, cudaStream_t stream) {
  const int64_t total = s.n * s.c * s.p * s.q;
  if (total <= 0) return;
  dispatch_pool(s, total, [&](auto nhwc, auto index) {
    using I = decltype(index);
    avgpool_forward_kernel<decltype(nhwc)::value, I>
        <<<grid_for(total), kThreads, 0, stream>>>(Pool<I>(s), x, y);
  });
  CUDA_CHECK_LAUNCH(avgpool_forward_kernel);
}

void avgpool_backward(const PoolShape& s, const float* dy, float* dx, cudaStream_t stream) {
  const int64_t total = s.n * s.c * s.h * s.w;
  if (total <= 0) return;
  dispatch_pool(s, total, [&](auto nhwc, auto index) {
    using I = decltype(index);
    avgpool_backward_kernel<decltype(nhwc)::value, I>
        <<<grid_for(total), kThreads, 0, stream>>>(Pool<I>(s), dy, dx);
  });
  CUDA_CHECK_LAUNCH(avgpool_backward_kernel);
}

void maxpool_forward(const PoolShape& s, const float* x, float* y, cudaStream_t stream) {
  const int64_t total = s.n * s.c * s.p * s.q;
  if (total <= 0) return;
  dispatch_pool(s, total, [&](auto nhwc, auto index) {
    using I = decltype(index);
    maxpool_forward_kernel<decltype(nhwc)::value, I>
        <<<grid_for(total), kThreads, 0, stream>>>(Pool<I>(s), x, y);
  });
  CUDA_CHECK_LAUNCH(maxpool_forward_kernel);
}

void maxpool_backward(const PoolShape& s, const float* x, const float* dy, float* dx,
                      cudaStream_t stream) {
  const int64_t total = s.n * s.c * s.h * s.w;
  if (total <= 0) return;
  dispatch_pool(s, total, [&](auto nhwc, auto index) {
    using I = decltype(index);
    maxpool_backward_kernel<decltype(nhwc)::value, I>
        <<<grid_for(total), kThreads, 0, stream>>>(Pool<I>(s), x, dy, dx);
  });
  CUDA_CHECK_LAUNCH(maxpool_backward_kernel);
}

void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t c, int64_t hw, bool nhwc,
                            cudaStream_t stream) {
  if (n * c <= 0) return;
  if (nhwc) {
    global_avgpool_nhwc_kernel<<<grid_for(n * c), kThreads, 0, stream>>>(x, y, n, c, hw);
  } else {
    global_avgpool_nchw_kernel<<<grid_for(n * c * 32), kThreads, 0, stream>>>(x, y, n * c, hw);
  }
  CUDA_CHECK_LAUNCH(global_avgpool_forward_kernel);
}

void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t c, int64_t hw,
                             bool nhwc, cudaStream_t stream) {
  const int64_t total = n * c * hw;
  if (total <= 0) return;
  if (nhwc) {
    global_avgpool_backward_kernel<true>
        <<<grid_for(total), kThreads, 0, stream>>>(dy, dx, n, c, hw);
  } else {
    global_avgpool_backward_kernel<false>
        <<<grid_for(total), kThreads, 0, stream>>>(dy, dx, n, c, hw);
  }
  CUDA_CHECK_LAUNCH(global_avgpool_backward_kernel);
}

}  // namespace dp::cuda::kernels
