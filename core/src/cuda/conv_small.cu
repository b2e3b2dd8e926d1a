// dprun's own convolution passes for layers with few input channels (an image model's first
// layer: 1 channel for Fashion-MNIST, 3 for CIFAR-10), channels-last. cuDNN's kernels are built
// for channel counts that fill a tensor-core tile: on an H200, ResNet-18's first convolution
// (1 -> 64 channels, 3x3, batch 256, 28x28) took 64 us forward and 294 us for its filter gradient
// per step, where writing y, or reading dy, once takes about 13 us. Both passes here are plain
// fp32 dot products (the "direct" family of the precision contract, dp/conv_contract.hpp).
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"
#include "dp/bf16.hpp"

namespace dp::cuda::kernels {

namespace {

/// The bf16 nearest to v (dp::round_bits_to_bf16's bits) when kRound, else v.
template <bool kRound>
__device__ __forceinline__ float maybe_bf16(float v) {
  if constexpr (kRound) {
    return __uint_as_float(dp::round_bits_to_bf16(__float_as_uint(v)));
  } else {
    return v;
  }
}

// Each thread computes kPer consecutive channels k0 .. k0 + kPer - 1 of one output position (K a
// multiple of kPer), stored together: the lanes of a warp that share a position read its taps
// once, broadcast. The filter is in shared memory as [tap][k], so the lanes
// read consecutive values.
template <bool kRound, int kPer>
__global__ void small_conv_forward_kernel(const float* x, const float* w, float* y, SmallConv g,
                                          int64_t total) {
  __shared__ float filter[kSmallConvMaxFilter];
  const int taps = g.c * g.r * g.s;
  for (int i = threadIdx.x; i < g.k * taps; i += blockDim.x) {
    const int k = i / taps, t = i % taps;  // w is (K, taps)
    filter[t * g.k + k] = maybe_bf16<kRound>(w[i]);
  }
  __syncthreads();
  const int64_t groups = total / kPer;
  DP_GRID_STRIDE(i, groups) {
    const int64_t first = i * kPer;
    const int k0 = static_cast<int>(first % g.k);
    int64_t rest = first / g.k;
    const int64_t ow = rest % g.out_w;
    rest /= g.out_w;
    const int64_t oh = rest % g.out_h, n = rest / g.out_h;
    // Taps in the filter's own order, (c, r, s): the same order as the filter gradient's.
    float acc[kPer];
    DP_UNROLL
    for (int j = 0; j < kPer; ++j) acc[j] = 0.0f;
    const float* f = filter + k0;
    for (int c = 0; c < g.c; ++c) {
      for (int r = 0; r < g.r; ++r) {
        const int64_t ih = oh * g.stride_h - g.pad_h + r;
        const bool row = ih >= 0 && ih < g.h;
        for (int s = 0; s < g.s; ++s, f += g.k) {
          const int64_t iw = ow * g.stride_w - g.pad_w + s;
          if (!row || iw < 0 || iw >= g.w) continue;
          const float v = maybe_bf16<kRound>(x[((n * g.h + ih) * g.w + iw) * g.c + c]);
          DP_UNROLL
          for (int j = 0; j < kPer; ++j) acc[j] = fmaf(v, f[j], acc[j]);
        }
      }
    }
    if constexpr (kPer == 4) {
      reinterpret_cast<float4*>(y)[i] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    } else {
      DP_UNROLL
      for (int j = 0; j < kPer; ++j) y[first + j] = acc[j];
    }
  }
}

// The filter gradient's first level: block b sums the products of positions [begin_b, end_b)
// (a fixed split of the N*P*Q positions) into partial[b][k][tap]. Thread t takes channel
// t % K and every (256 / K)-th position of the block's range, from the (t / K)-th; the groups'
// sums are added in group order. kTaps bounds the taps (registers); kRound rounds x and dy to
// bf16 as they are read.
template <int kTaps, bool kRound>
__global__ void small_conv_filter_partial_kernel(const float* x, const float* dy, float* partial,
                                                 SmallConv g, int64_t positions) {
  __shared__ float sums[kThreads * kTaps];
  const int taps = g.c * g.r * g.s;
  const int groups = kThreads / g.k;
  const int k = static_cast<int>(threadIdx.x) % g.k, group = static_cast<int>(threadIdx.x) / g.k;
  const int64_t blocks = gridDim.x, b = blockIdx.x;
  const int64_t begin = positions * b / blocks, end = positions * (b + 1) / blocks;
  // Tap t = (c * R + r) * S + s, the filter's KCRS order: its row, column and channel offsets.
  float acc[kTaps];
  int tap_r[kTaps], tap_s[kTaps], tap_c[kTaps];
  DP_UNROLL
  for (int t = 0; t < kTaps; ++t) {
    acc[t] = 0.0f;
    tap_s[t] = t % g.s;
    tap_r[t] = (t / g.s) % g.r;
    tap_c[t] = t / (g.s * g.r);
  }
  if (group < groups) {
    for (int64_t p = begin + group; p < end; p += groups) {
      const int64_t ow = p % g.out_w, rest = p / g.out_w;
      const int64_t oh = rest % g.out_h, n = rest / g.out_h;
      const int64_t ih0 = oh * g.stride_h - g.pad_h, iw0 = ow * g.stride_w - g.pad_w;
      const float* xn = x + n * g.h * g.w * g.c;
      const float d = maybe_bf16<kRound>(dy[p * g.k + k]);
      DP_UNROLL
      for (int t = 0; t < kTaps; ++t) {
        const int64_t ih = ih0 + tap_r[t], iw = iw0 + tap_s[t];
        if (t < taps && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
          acc[t] = fmaf(d, maybe_bf16<kRound>(xn[(ih * g.w + iw) * g.c + tap_c[t]]), acc[t]);
      }
    }
  }
  DP_UNROLL
  for (int t = 0; t < kTaps; ++t) sums[threadIdx.x * kTaps + t] = acc[t];
  __syncthreads();
  for (int i = threadIdx.x; i < g.k * taps; i += blockDim.x) {
    const int kk = i / taps, t = i % taps;
    float s = 0.0f;
    for (int j = 0; j < groups; ++j) s += sums[(j * g.k + kk) * kTaps + t];
    partial[b * g.k * taps + i] = s;
  }
}

// The second level: dw[i] = the blocks' partial sums, added in block order.
__global__ void small_conv_filter_finish_kernel(const float* partial, float* dw, int64_t values,
                                                int64_t blocks) {
  DP_GRID_STRIDE(i, values) {
    float s = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) s += partial[b * values + i];
    dw[i] = s;
  }
}

}  // namespace

constexpr unsigned kSmallConvForwardBlocks = 2048;

bool small_conv_fits(const SmallConv& g) {
  const int64_t taps = static_cast<int64_t>(g.c) * g.r * g.s;
  return g.c >= 1 && g.c <= kSmallConvMaxChannels && g.k >= 1 && g.k <= kThreads &&
         taps <= kSmallConvMaxTaps && g.k * taps <= kSmallConvMaxFilter;
}

int64_t small_conv_filter_blocks(const SmallConv& g) {
  const int64_t positions = g.n * g.out_h * g.out_w;
  return std::clamp<int64_t>(
      (positions + kSmallConvPositionsPerBlock - 1) / kSmallConvPositionsPerBlock, 1,
      kSmallConvMaxBlocks);
}

size_t small_conv_filter_scratch_floats(const SmallConv& g) {
  return static_cast<size_t>(small_conv_filter_blocks(g) * g.k * g.c * g.r * g.s);
}

void small_conv_forward(const float* x, const float* w, float* y, const SmallConv& g,
                        bool round_bf16, cudaStream_t stream) {
  const int64_t total = g.n * g.out_h * g.out_w * g.k;
  if (total <= 0) return;
  // Each block first loads the filter: a few thousand blocks stride over the outputs, not one
  // block per 256 of them.
  // Four channels a thread, stored as one float4, where K and y allow it.
  const bool four = g.k % 4 == 0 && aligned16(y);
  const unsigned blocks = std::min(grid_for(four ? total / 4 : total), kSmallConvForwardBlocks);
  if (four) {
    if (round_bf16) {
      small_conv_forward_kernel<true, 4><<<blocks, kThreads, 0, stream>>>(x, w, y, g, total);
    } else {
      small_conv_forward_kernel<false, 4><<<blocks, kThreads, 0, stream>>>(x, w, y, g, total);
    }
  } else if (round_bf16) {
    small_conv_forward_kernel<true, 1><<<blocks, kThreads, 0, stream>>>(x, w, y, g, total);
  } else {
    small_conv_forward_kernel<false, 1><<<blocks, kThreads, 0, stream>>>(x, w, y, g, total);
  }
  CUDA_CHECK_LAUNCH(small_conv_forward_kernel);
}

namespace {

template <bool kRound>
void small_conv_filter_partial(const float* x, const float* dy, float* scratch, const SmallConv& g,
                               int64_t positions, unsigned grid, cudaStream_t stream) {
  const int taps = g.c * g.r * g.s;
  if (taps <= 9) {
    small_conv_filter_partial_kernel<9, kRound>
        <<<grid, kThreads, 0, stream>>>(x, dy, scratch, g, positions);
  } else if (taps <= 25) {
    small_conv_filter_partial_kernel<25, kRound>
        <<<grid, kThreads, 0, stream>>>(x, dy, scratch, g, positions);
  } else {
    small_conv_filter_partial_kernel<kSmallConvMaxTaps, kRound>
        <<<grid, kThreads, 0, stream>>>(x, dy, scratch, g, positions);
  }
  CUDA_CHECK_LAUNCH(small_conv_filter_partial_kernel);
}

}  // namespace

void small_conv_filter(const float* x, const float* dy, float* dw, const SmallConv& g,
                       float* scratch, bool round_bf16, cudaStream_t stream) {
  const int64_t positions = g.n * g.out_h * g.out_w, values = g.k * g.c * g.r * g.s;
  const int64_t blocks = small_conv_filter_blocks(g);
  const auto grid = static_cast<unsigned>(blocks);
  if (round_bf16) {
    small_conv_filter_partial<true>(x, dy, scratch, g, positions, grid, stream);
  } else {
    small_conv_filter_partial<false>(x, dy, scratch, g, positions, grid, stream);
  }
  small_conv_filter_finish_kernel<<<grid_for(values), kThreads, 0, stream>>>(scratch, dw, values,
                                                                             blocks);
  CUDA_CHECK_LAUNCH(small_conv_filter_finish_kernel);
}

}  // namespace dp::cuda::kernels
