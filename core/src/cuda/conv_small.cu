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

// Where filter value i = k * taps + t, tap t = (c * R + r) * S + s, lives in memory: at i in
// (K, C, R, S) order, at ((k * R + r) * S + s) * C + c in (K, R, S, C) order (g.filter_krsc).
__device__ __forceinline__ int filter_at(const SmallConv& g, int i) {
  if (!g.filter_krsc) return i;
  const int rs = g.r * g.s, taps = g.c * rs;
  const int k = i / taps, t = i % taps;
  return (k * rs + t % rs) * g.c + t / rs;
}

// Each thread computes kPer consecutive channels k0 .. k0 + kPer - 1 of one output position (K a
// multiple of kPer), stored together: the lanes of a warp that share a position read its taps
// once, broadcast. The filter is in shared memory as [tap][k], so the lanes read consecutive
// values. Indices fit in 32 bits (small_conv_fits), which divide far faster than 64-bit ones.
template <bool kRound, int kPer>
__global__ void small_conv_forward_kernel(const float* x, const float* w, float* y, SmallConv g,
                                          int total) {
  __shared__ float filter[kSmallConvMaxFilter];
  const int taps = g.c * g.r * g.s, K = g.k, H = static_cast<int>(g.h), W = static_cast<int>(g.w);
  const int P = static_cast<int>(g.out_h), Q = static_cast<int>(g.out_w);
  for (int i = threadIdx.x; i < K * taps; i += blockDim.x) {
    const int k = i / taps, t = i % taps;  // w is (K, taps), in its memory order
    filter[t * K + k] = maybe_bf16<kRound>(w[filter_at(g, i)]);
  }
  __syncthreads();
  const int groups = total / kPer;
  DP_GRID_STRIDE(i64, groups) {
    const int i = static_cast<int>(i64), first = i * kPer;
    const int k0 = first % K, pos = first / K;
    const int q = pos % Q, rest = pos / Q;
    const int p = rest % P, n = rest / P;
    // Taps in the filter's own order, (c, r, s): the same order as the filter gradient's.
    float acc[kPer];
    DP_UNROLL
    for (int j = 0; j < kPer; ++j) acc[j] = 0.0f;
    const float* f = filter + k0;
    const float* xn = x + n * H * W * g.c;
    for (int c = 0; c < g.c; ++c) {
      for (int r = 0; r < g.r; ++r) {
        const int ih = p * g.stride_h - g.pad_h + r;
        const bool row = ih >= 0 && ih < H;
        for (int s = 0; s < g.s; ++s, f += K) {
          const int iw = q * g.stride_w - g.pad_w + s;
          if (!row || iw < 0 || iw >= W) continue;
          const float v = maybe_bf16<kRound>(xn[(ih * W + iw) * g.c + c]);
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
// bf16 as they are read (D: dy's type, float or packed bf16, load_f32). 32-bit indices, as the
// forward's.
template <int kTaps, bool kRound, typename D>
__global__ void small_conv_filter_partial_kernel(const float* x, const D* dy, float* partial,
                                                 SmallConv g, int positions) {
  __shared__ float sums[kThreads * kTaps];
  const int taps = g.c * g.r * g.s, K = g.k, H = static_cast<int>(g.h), W = static_cast<int>(g.w);
  const int P = static_cast<int>(g.out_h), Q = static_cast<int>(g.out_w);
  const int groups = kThreads / K;
  const int k = static_cast<int>(threadIdx.x) % K, group = static_cast<int>(threadIdx.x) / K;
  const int blocks = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int begin = static_cast<int>(int64_t{positions} * b / blocks);
  const int end = static_cast<int>(int64_t{positions} * (b + 1) / blocks);
  // Tap t = (c * R + r) * S + s, the filter's KCRS order: its row and column offsets and its
  // channel, in shared memory (every lane reads the same tap at once: a broadcast), which keeps
  // the registers for the sums.
  __shared__ int tap_r[kTaps], tap_s[kTaps], tap_c[kTaps];
  for (int t = threadIdx.x; t < kTaps; t += blockDim.x) {
    tap_s[t] = t % g.s;
    tap_r[t] = (t / g.s) % g.r;
    tap_c[t] = t / (g.s * g.r);
  }
  __syncthreads();
  float acc[kTaps];
  DP_UNROLL
  for (int t = 0; t < kTaps; ++t) acc[t] = 0.0f;
  if (group < groups && begin + group < end) {
    // The first position's (n, p, q) by division, then each next one (groups further on) by
    // stepping: divisions in the loop cost more than its products (ResNet-18's first layer has
    // 9 products a position).
    int pos = begin + group;
    int q = pos % Q, p = (pos / Q) % P, n = pos / (Q * P);
    const int step_q = groups % Q, step_p = (groups / Q) % P, step_n = groups / (Q * P);
    for (; pos < end; pos += groups) {
      const int ih0 = p * g.stride_h - g.pad_h, iw0 = q * g.stride_w - g.pad_w;
      const float* xn = x + n * H * W * g.c;
      const float d = maybe_bf16<kRound>(load_f32(dy, pos * K + k));
      DP_UNROLL
      for (int t = 0; t < kTaps; ++t) {
        const int ih = ih0 + tap_r[t], iw = iw0 + tap_s[t];
        if (t < taps && ih >= 0 && ih < H && iw >= 0 && iw < W)
          acc[t] = fmaf(d, maybe_bf16<kRound>(xn[(ih * W + iw) * g.c + tap_c[t]]), acc[t]);
      }
      // (n, p, q) += groups, each digit below its base: one carry at most.
      q += step_q;
      p += step_p;
      n += step_n;
      if (q >= Q) {
        q -= Q;
        ++p;
      }
      if (p >= P) {
        p -= P;
        ++n;
      }
    }
  }
  DP_UNROLL
  for (int t = 0; t < kTaps; ++t) sums[threadIdx.x * kTaps + t] = acc[t];
  __syncthreads();
  for (int i = threadIdx.x; i < K * taps; i += blockDim.x) {
    const int kk = i / taps, t = i % taps;
    float s = 0.0f;
    for (int j = 0; j < groups; ++j) s += sums[(j * K + kk) * kTaps + t];
    partial[int64_t{b} * K * taps + i] = s;
  }
}

// The second level: a warp per value i; lane l adds the partials of blocks l, l + 32, ... in
// order, then the lanes' sums meet in a fixed tree (deterministic); kRound: the sum rounded to
// bf16 once.
template <bool kRound>
__global__ void small_conv_filter_finish_kernel(const float* partial, float* dw, SmallConv g,
                                                int values, int blocks) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x * gridDim.x) / 32;
  for (int i = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32); i < values;
       i += warps) {
    float s = 0.0f;
    for (int b = lane; b < blocks; b += 32) s += partial[int64_t{b} * values + i];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
    if (lane == 0) dw[filter_at(g, i)] = maybe_bf16<kRound>(s);
  }
}

}  // namespace

constexpr unsigned kSmallConvForwardBlocks = 2048;

bool small_conv_fits(const SmallConv& g) {
  const int64_t taps = static_cast<int64_t>(g.c) * g.r * g.s;
  // 32-bit indices: x and y of the largest batch (g.n) hold fewer than 2^31 values.
  constexpr int64_t kIndexLimit = int64_t{1} << 31;
  return g.c >= 1 && g.c <= kSmallConvMaxChannels && g.k >= 1 && g.k <= kThreads &&
         taps <= kSmallConvMaxTaps && g.k * taps <= kSmallConvMaxFilter &&
         g.n * g.h * g.w * g.c < kIndexLimit && g.n * g.out_h * g.out_w * g.k < kIndexLimit;
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
  const int total = static_cast<int>(g.n * g.out_h * g.out_w * g.k);  // small_conv_fits
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

template <bool kRound, typename D>
void small_conv_filter_partial(const float* x, const D* dy, float* scratch, const SmallConv& g,
                               int positions, unsigned grid, cudaStream_t stream) {
  const int taps = g.c * g.r * g.s;
  if (taps <= 9) {
    small_conv_filter_partial_kernel<9, kRound, D>
        <<<grid, kThreads, 0, stream>>>(x, dy, scratch, g, positions);
  } else if (taps <= 27) {  // 5x5 of one channel, 3x3 of three (CIFAR-10's first layer)
    small_conv_filter_partial_kernel<27, kRound, D>
        <<<grid, kThreads, 0, stream>>>(x, dy, scratch, g, positions);
  } else {
    small_conv_filter_partial_kernel<kSmallConvMaxTaps, kRound, D>
        <<<grid, kThreads, 0, stream>>>(x, dy, scratch, g, positions);
  }
  CUDA_CHECK_LAUNCH(small_conv_filter_partial_kernel);
}

template <typename D>
void launch_small_conv_filter(const float* x, const D* dy, float* dw, const SmallConv& g,
                              float* scratch, bool round_bf16, cudaStream_t stream) {
  const auto positions = static_cast<int>(g.n * g.out_h * g.out_w);  // small_conv_fits
  const int values = g.k * g.c * g.r * g.s;
  const auto blocks = static_cast<int>(small_conv_filter_blocks(g));
  const auto grid = static_cast<unsigned>(blocks);
  const unsigned finish_grid = grid_for(int64_t{values} * 32);
  if (round_bf16) {
    small_conv_filter_partial<true>(x, dy, scratch, g, positions, grid, stream);
    small_conv_filter_finish_kernel<true>
        <<<finish_grid, kThreads, 0, stream>>>(scratch, dw, g, values, blocks);
  } else {
    small_conv_filter_partial<false>(x, dy, scratch, g, positions, grid, stream);
    small_conv_filter_finish_kernel<false>
        <<<finish_grid, kThreads, 0, stream>>>(scratch, dw, g, values, blocks);
  }
  CUDA_CHECK_LAUNCH(small_conv_filter_finish_kernel);
}

}  // namespace

void small_conv_filter(const float* x, const float* dy, float* dw, const SmallConv& g,
                       float* scratch, bool round_bf16, cudaStream_t stream) {
  launch_small_conv_filter(x, dy, dw, g, scratch, round_bf16, stream);
}

void small_conv_filter(const float* x, const uint16_t* dy, float* dw, const SmallConv& g,
                       float* scratch, bool round_bf16, cudaStream_t stream) {
  launch_small_conv_filter(x, dy, dw, g, scratch, round_bf16, stream);
}

}  // namespace dp::cuda::kernels
