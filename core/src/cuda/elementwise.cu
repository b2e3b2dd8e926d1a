// Elementwise kernels, the deterministic per-channel reduction, filter-layout transposes, the
// batch gather and the same-device rank sum. Grid-stride loops; launchers check every launch.
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"
#include "dp/bf16.hpp"

namespace dp::cuda::kernels {
namespace {

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, T value) {
  DP_GRID_STRIDE(i, n) p[i] = value;
}

__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  DP_GRID_STRIDE(i, n) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN stays NaN, as on the CPU
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  DP_GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// The same two with 16-byte loads and stores over the first 4 * n4 elements, then the tail of
// fewer than 4 one by one, in one launch (every pointer 16-byte aligned), as add4_kernel.
__device__ __forceinline__ float relu_of(float v) { return v < 0.0f ? 0.0f : v; }
__device__ __forceinline__ float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

__global__ void relu_forward4_kernel(const float* x, float* y, int64_t n4, int64_t tail) {
  DP_GRID_STRIDE(i, n4 + tail) {
    if (i < n4) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      reinterpret_cast<float4*>(y)[i] =
          make_float4(relu_of(v.x), relu_of(v.y), relu_of(v.z), relu_of(v.w));
    } else {
      const int64_t j = 4 * n4 + (i - n4);
      y[j] = relu_of(x[j]);
    }
  }
}

__global__ void relu_backward4_kernel(const float* y, const float* dy, float* dx, int64_t n4,
                                      int64_t tail) {
  DP_GRID_STRIDE(i, n4 + tail) {
    if (i < n4) {
      const float4 v = reinterpret_cast<const float4*>(y)[i];
      const float4 g = reinterpret_cast<const float4*>(dy)[i];
      reinterpret_cast<float4*>(dx)[i] = make_float4(relu_grad(v.x, g.x), relu_grad(v.y, g.y),
                                                     relu_grad(v.z, g.z), relu_grad(v.w, g.w));
    } else {
      const int64_t j = 4 * n4 + (i - n4);
      dx[j] = relu_grad(y[j], dy[j]);
    }
  }
}

// a and b are fp32 or packed bf16 (A, B: float or uint16_t, widened exactly as read); y fp32.
template <typename A, typename B>
__global__ void add_kernel(const A* a, const B* b, float* y, int64_t n, float alpha) {
  DP_GRID_STRIDE(i, n) y[i] = fmaf(alpha, load_f32(b, i), load_f32(a, i));  // alpha 1: a + b
}

// The same with 16-byte loads and stores over the first 4 * n4 elements, then the tail of
// fewer than 4 one by one, in one launch (every pointer 16-byte aligned). On the H200 the scalar
// kernel took 0.35 of ResNet-18's 10.1 ms per step (25 launches: the residual blocks' input
// gradients). A packed operand is read 8 bytes at a time.
template <typename A, typename B>
__global__ void add4_kernel(const A* a, const B* b, float* y, int64_t n4, int64_t tail,
                            float alpha) {
  DP_GRID_STRIDE(i, n4 + tail) {
    if (i < n4) {
      const float4 u = load4_f32(a, 4 * i);
      const float4 v = load4_f32(b, 4 * i);
      reinterpret_cast<float4*>(y)[i] = make_float4(fmaf(alpha, v.x, u.x), fmaf(alpha, v.y, u.y),
                                                    fmaf(alpha, v.z, u.z), fmaf(alpha, v.w, u.w));
    } else {
      const int64_t j = 4 * n4 + (i - n4);
      y[j] = fmaf(alpha, load_f32(b, j), load_f32(a, j));
    }
  }
}

__global__ void scale_kernel(float* t, int64_t n, float alpha) {
  DP_GRID_STRIDE(i, n) t[i] *= alpha;
}

/// The bf16 nearest to x as a float: dp::round_bits_to_bf16, the cpu backend's bits.
__device__ __forceinline__ float bf16_nearest(float x) {
  return __uint_as_float(dp::round_bits_to_bf16(__float_as_uint(x)));
}

/// The packed bf16 nearest to x (dp::round_bits_to_bf16's high half), and back.
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  return dp::packed_bf16_bits(__float_as_uint(x));
}
__device__ __forceinline__ float widen_bf16(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// The conversions of every bf16 convolution pass's operands and outputs, activation-sized: 16
// bytes of floats a thread step over the first 4 * n4 elements (4 packed bf16 as one 8-byte
// word), the tail of fewer than 4 one by one, in one launch; the scalar kernels where a pointer
// is not aligned for that.
__global__ void round_to_bf16_kernel(const float* x, float* y, int64_t n) {
  DP_GRID_STRIDE(i, n) y[i] = bf16_nearest(x[i]);
}
__global__ void round_to_bf16_4_kernel(const float* x, float* y, int64_t n4, int64_t tail) {
  DP_GRID_STRIDE(i, n4 + tail) {
    if (i < n4) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      reinterpret_cast<float4*>(y)[i] =
          make_float4(bf16_nearest(v.x), bf16_nearest(v.y), bf16_nearest(v.z), bf16_nearest(v.w));
    } else {
      const int64_t j = 4 * n4 + (i - n4);
      y[j] = bf16_nearest(x[j]);
    }
  }
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  DP_GRID_STRIDE(i, n) y[i] = bf16_bits(x[i]);
}
__global__ void to_bf16_4_kernel(const float* x, uint16_t* y, int64_t n4, int64_t tail) {
  DP_GRID_STRIDE(i, n4 + tail) {
    if (i < n4) {
      const float4 v = reinterpret_cast<const float4*>(x)[i];
      reinterpret_cast<uint64_t*>(y)[i] =
          static_cast<uint64_t>(bf16_bits(v.x)) | static_cast<uint64_t>(bf16_bits(v.y)) << 16 |
          static_cast<uint64_t>(bf16_bits(v.z)) << 32 | static_cast<uint64_t>(bf16_bits(v.w)) << 48;
    } else {
      const int64_t j = 4 * n4 + (i - n4);
      y[j] = bf16_bits(x[j]);
    }
  }
}

__global__ void from_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  DP_GRID_STRIDE(i, n) y[i] = widen_bf16(x[i]);
}
__global__ void from_bf16_4_kernel(const uint16_t* x, float* y, int64_t n4, int64_t tail) {
  DP_GRID_STRIDE(i, n4 + tail) {
    if (i < n4) {
      const uint64_t v = reinterpret_cast<const uint64_t*>(x)[i];
      reinterpret_cast<float4*>(y)[i] = make_float4(
          widen_bf16(static_cast<uint16_t>(v)), widen_bf16(static_cast<uint16_t>(v >> 16)),
          widen_bf16(static_cast<uint16_t>(v >> 32)), widen_bf16(static_cast<uint16_t>(v >> 48)));
    } else {
      const int64_t j = 4 * n4 + (i - n4);
      y[j] = widen_bf16(x[j]);
    }
  }
}

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

/// A value as it joins a channel sum: itself, or its bf16 rounding.
template <bool kRound>
__device__ __forceinline__ float summand(float v) {
  return kRound ? bf16_nearest(v) : v;
}

// I: int32_t where every offset fits (the channel of each value is a division: 64-bit ones, which
// the GPU emulates, cost several times more).
// kRelu: then relu_of, a fused ReLU (relu_forward's values after bias_add's).
template <bool kNhwc, bool kRound, bool kRelu, typename I>
__global__ void bias_add_kernel(float* y, const float* b, I total, I c, I hw) {
  DP_GRID_STRIDE_AS(I, i, total) {
    const I ch = kNhwc ? i % c : (i / hw) % c;
    float v = y[i] + b[ch];
    if constexpr (kRound) v = bf16_nearest(v);
    y[i] = kRelu ? relu_of(v) : v;
  }
}

/// Sums a block's values in a fixed tree order; the result is valid in thread 0.
__device__ float block_sum(float v, float* shared /* blockDim.x / 32 */) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += shared[w];
  }
  return total;
}

/// The value at i as it joins a channel sum: x[i], or with a fused ReLU's mask (kMask: a
/// relu_backward in the same pass) x[i] where y[i] > 0, else 0, which is also written to dz[i].
template <bool kMask>
__device__ __forceinline__ float channel_value(const float* x, const float* y, float* dz,
                                               int64_t i) {
  if constexpr (kMask) {
    const float v = relu_grad(y[i], x[i]);
    dz[i] = v;
    return v;
  } else {
    return x[i];
  }
}

// NCHW: block (channel, group) sums the group's contiguous chunk of the channel's N*HW values.
template <bool kRound, bool kMask>
__global__ void channel_sum_nchw_kernel(const float* x, const float* y, float* dz, float* dst,
                                        int64_t c, int64_t hw, int64_t total, int64_t chunk) {
  __shared__ float shared[kThreads / 32];
  const int64_t ch = blockIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = min(begin + chunk, total);
  float acc = 0.0f;
  for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
    acc += summand<kRound>(channel_value<kMask>(x, y, dz, ((e / hw) * c + ch) * hw + e % hw));
  }
  const float s = block_sum(acc, shared);
  if (threadIdx.x == 0) dst[static_cast<int64_t>(blockIdx.y) * c + ch] = s;
}

// NHWC (rows of C): block (32 channels x 8 row lanes) per (channel tile, group).
constexpr int kRowLanes = 8;
template <bool kRound, bool kMask>
__global__ void channel_sum_nhwc_kernel(const float* x, const float* y, float* dz, float* dst,
                                        int64_t c, int64_t rows, int64_t chunk) {
  __shared__ float shared[kRowLanes][32];
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = min(begin + chunk, rows);
  float acc = 0.0f;
  if (ch < c) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes)
      acc += summand<kRound>(channel_value<kMask>(x, y, dz, r * c + ch));
  }
  shared[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    float s = 0.0f;
    for (int l = 0; l < kRowLanes; ++l) s += shared[l][threadIdx.x];
    dst[static_cast<int64_t>(blockIdx.y) * c + ch] = s;
  }
}

// The second level: a warp per channel; lane l adds the partials of groups l, l + 32, ... in
// order, then the lanes' sums meet in a fixed tree (deterministic). A thread per channel adding
// the groups in a row would leave a layer of 20 channels (LeNet's first) 20 threads.
__global__ void sum_groups_kernel(const float* partial, float* out, int64_t c, int groups) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warps = static_cast<int64_t>(blockDim.x) * gridDim.x / 32;
  for (int64_t ch = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; ch < c;
       ch += warps) {
    float s = 0.0f;
    for (int g = lane; g < groups; g += 32) s += partial[static_cast<int64_t>(g) * c + ch];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
    if (lane == 0) out[ch] = s;
  }
}

// The filter transposes, in index type I (int32_t for every real filter: 64-bit division, which
// the GPU emulates, made them cost 8 us a launch on the H200 for ResNet-18's 2.4M-value filters).
// A packed Out holds each value's bf16 bits; a float one the value, or with kRound its nearest
// bf16 (round_to_bf16's, for an fp32 kernel given bf16's operands).
template <typename I, typename Out, bool kRound>
__global__ void kcrs_to_krsc_kernel(const float* in, Out* out, I k, I c, I rs) {
  const I crs = c * rs;
  DP_GRID_STRIDE_AS(I, i, k * crs) {
    const I kk = i / crs, rem = i - kk * crs;
    const I r = rem / c, cc = rem - r * c;
    const float v = in[(kk * c + cc) * rs + r];
    if constexpr (sizeof(Out) == 2) {
      out[i] = bf16_bits(v);
    } else {
      out[i] = kRound ? bf16_nearest(v) : v;
    }
  }
}

// In: float, or packed bf16 widened (a bf16 filter gradient, load_f32).
template <typename I, typename In>
__global__ void krsc_to_kcrs_kernel(const In* in, float* out, I k, I c, I rs) {
  const I crs = c * rs;
  DP_GRID_STRIDE_AS(I, i, k * crs) {
    const I kk = i / crs, rem = i - kk * crs;
    const I cc = rem / rs, r = rem - cc * rs;
    out[i] = load_f32(in, (kk * rs + r) * c + cc);
  }
}

/// Launches a filter transpose of k * c * rs values in 32-bit indices where they fit.
template <typename Out, bool kRound = false>
void launch_kcrs_to_krsc(const float* in, Out* out, int64_t k, int64_t c, int64_t rs,
                         cudaStream_t stream) {
  const int64_t n = k * c * rs;
  if (n <= 0) return;
  const unsigned grid = grid_for(n);
  dispatch_index(n + int64_t{kThreads} * grid, [&](auto index) {
    using I = decltype(index);
    kcrs_to_krsc_kernel<I, Out, kRound><<<grid, kThreads, 0, stream>>>(
        in, out, static_cast<I>(k), static_cast<I>(c), static_cast<I>(rs));
  });
  CUDA_CHECK_LAUNCH(kcrs_to_krsc_kernel);
}

// The pixels a 1x1 convolution of stride (sh, sw) reads, as rows of channels: element (b, i, j, c)
// of the output is x's (b, i * sh, j * sw, c), NHWC, rounded to bf16 when kRound (bf16's operand
// copy in the same pass). V: float, or float4 when C is a multiple of 4 and both are aligned
// (c then counts float4s).
__device__ __forceinline__ float round_if(float v, bool round) {
  return round ? bf16_nearest(v) : v;
}
__device__ __forceinline__ float4 round_if(float4 v, bool round) {
  return round ? make_float4(bf16_nearest(v.x), bf16_nearest(v.y), bf16_nearest(v.z),
                             bf16_nearest(v.w))
               : v;
}
template <typename V, bool kRound>
__global__ void subsample_nhwc_kernel(const V* x, V* out, int64_t h, int64_t w, int64_t c,
                                      int64_t sh, int64_t sw, int64_t ho, int64_t wo,
                                      int64_t total) {
  DP_GRID_STRIDE(i, total) {
    const int64_t cc = i % c;
    int64_t rest = i / c;
    const int64_t j = rest % wo;
    rest /= wo;
    const int64_t r = rest % ho, b = rest / ho;
    out[i] = round_if(x[((b * h + r * sh) * w + j * sw) * c + cc], kRound);
  }
}

template <bool kNhwc>
__global__ void gather_kernel(const uint8_t* images, const uint8_t* labels, int64_t m,
                              const int32_t* indices, int64_t index_count, DeviceRow start,
                              int64_t n, int64_t C, int64_t H, int64_t W, float* x, int32_t* y) {
  // The window's first row; -1 marks a window outside the buffer (every example then bad).
  int64_t first = 0;
  if (start.table != nullptr) {
    const int64_t at = row_index(start);
    first = at >= 0 ? static_cast<const int32_t*>(start.table)[at] : -1;
    if (first < 0 || first + n > index_count) first = -1;
  }
  DP_GRID_STRIDE(i, n * C * H * W) {
    int64_t b, c, h, w;
    decode4<kNhwc>(i, C, H, W, b, c, h, w);
    const int64_t idx = first >= 0 ? indices[first + b] : -1;
    x[i] = (idx >= 0 && idx < m)
               ? static_cast<float>(images[idx * C * H * W + (c * H + h) * W + w]) / 255.0f
               : __int_as_float(0x7fc00000);
  }
  DP_GRID_STRIDE(j, n) {
    const int64_t idx = first >= 0 ? indices[first + j] : -1;
    y[j] = (idx >= 0 && idx < m) ? static_cast<int32_t>(labels[idx]) : -1;
  }
}

// The transformed gather: the same rows and marks as gather_kernel, then per output element
// the draw's crop (zero outside the image), flip and normalisation; the arithmetic is the cpu
// backend's (v / 255, then (v - mean) / std: IEEE division, no contraction possible).
template <bool kNhwc>
__global__ void gather_augment_kernel(const uint8_t* images, const uint8_t* labels, int64_t m,
                                      const int32_t* indices, int64_t index_count, DeviceRow start,
                                      int64_t n, int64_t C, int64_t H, int64_t W, GatherAugment aug,
                                      float* x, int32_t* y) {
  int64_t first = 0;
  if (start.table != nullptr) {
    const int64_t at = row_index(start);
    first = at >= 0 ? static_cast<const int32_t*>(start.table)[at] : -1;
    if (first < 0 || first + n > index_count) first = -1;
  }
  const int64_t pad = aug.pad;
  DP_GRID_STRIDE(i, n * C * H * W) {
    int64_t b, c, h, w;
    decode4<kNhwc>(i, C, H, W, b, c, h, w);
    const int64_t idx = first >= 0 ? indices[first + b] : -1;
    const int32_t d = first < 0 ? -1
                      : aug.draws != nullptr
                          ? aug.draws[first + b]
                          : static_cast<int32_t>(pad | (pad << 12));
    const int64_t oy = d & 0xfff, ox = (d >> 12) & 0xfff;
    const bool flip = ((d >> 24) & 1) != 0;
    const bool valid = idx >= 0 && idx < m && d >= 0 && oy <= 2 * pad && ox <= 2 * pad;
    float v = __int_as_float(0x7fc00000);
    if (valid) {
      const int64_t sr = h + oy - pad, sc = (flip ? W - 1 - w : w) + ox - pad;
      const bool inside = sr >= 0 && sr < H && sc >= 0 && sc < W;
      v = static_cast<float>(inside ? images[idx * C * H * W + (c * H + sr) * W + sc] : 0) /
          255.0f;
      if (aug.channels > 0) v = (v - aug.mean[c]) / aug.std[c];
    }
    x[i] = v;
  }
  DP_GRID_STRIDE(j, n) {
    const int64_t idx = first >= 0 ? indices[first + j] : -1;
    y[j] = (idx >= 0 && idx < m) ? static_cast<int32_t>(labels[idx]) : -1;
  }
}

__global__ void rank_sum_kernel(RankPointers ranks, int64_t begin, int64_t end) {
  DP_GRID_STRIDE(j, end - begin) {
    const int64_t i = begin + j;
    float s = ranks.p[0][i];
    for (int r = 1; r < ranks.count; ++r) s += ranks.p[r][i];
    for (int r = 0; r < ranks.count; ++r) ranks.p[r][i] = s;
  }
}

}  // namespace

void fill_f32(float* p, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, value);
  CUDA_CHECK_LAUNCH(fill_kernel);
}

void fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, value);
  CUDA_CHECK_LAUNCH(fill_kernel);
}

void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(x) && aligned16(y)) {
    const int64_t n4 = n / 4;
    relu_forward4_kernel<<<grid_for(n4 + n % 4), kThreads, 0, stream>>>(x, y, n4, n % 4);
    CUDA_CHECK_LAUNCH(relu_forward4_kernel);
    return;
  }
  relu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH(relu_forward_kernel);
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(y) && aligned16(dy) && aligned16(dx)) {
    const int64_t n4 = n / 4;
    relu_backward4_kernel<<<grid_for(n4 + n % 4), kThreads, 0, stream>>>(y, dy, dx, n4, n % 4);
    CUDA_CHECK_LAUNCH(relu_backward4_kernel);
    return;
  }
  relu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, dy, dx, n);
  CUDA_CHECK_LAUNCH(relu_backward_kernel);
}

namespace {
template <typename A, typename B>
void launch_add(const A* a, const B* b, float* y, int64_t n, float alpha, cudaStream_t stream) {
  if (aligned16(a) && aligned16(b) && aligned16(y)) {
    const int64_t n4 = n / 4;
    add4_kernel<A, B><<<grid_for(n4 + n % 4), kThreads, 0, stream>>>(a, b, y, n4, n % 4, alpha);
    CUDA_CHECK_LAUNCH(add4_kernel);
    return;
  }
  add_kernel<A, B><<<grid_for(n), kThreads, 0, stream>>>(a, b, y, n, alpha);
  CUDA_CHECK_LAUNCH(add_kernel);
}
}  // namespace

void add(const float* a, const float* b, float* y, int64_t n, float alpha, cudaStream_t stream) {
  if (n > 0) launch_add(a, b, y, n, alpha, stream);
}

void add(const void* a, bool a_bf16, const void* b, bool b_bf16, float* y, int64_t n, float alpha,
         cudaStream_t stream) {
  if (n <= 0) return;
  const auto with_b = [&](const auto* ta) {
    if (b_bf16) {
      launch_add(ta, static_cast<const uint16_t*>(b), y, n, alpha, stream);
    } else {
      launch_add(ta, static_cast<const float*>(b), y, n, alpha, stream);
    }
  };
  if (a_bf16) {
    with_b(static_cast<const uint16_t*>(a));
  } else {
    with_b(static_cast<const float*>(a));
  }
}

void scale(float* t, int64_t n, float alpha, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(t, n, alpha);
  CUDA_CHECK_LAUNCH(scale_kernel);
}

namespace {
template <bool kRound>
void launch_bias_add(float* y, const float* b, int64_t n, int64_t c, int64_t hw, bool nhwc,
                     bool relu, cudaStream_t stream) {
  const int64_t total = n * c * hw;
  if (total <= 0) return;
  const unsigned grid = grid_for(total);
  dispatch_index(total + int64_t{kThreads} * grid, [&](auto index) {
    using I = decltype(index);
    const auto t = static_cast<I>(total), cc = static_cast<I>(c), hwi = static_cast<I>(hw);
    const auto go = [&](auto layout, auto fused) {
      bias_add_kernel<decltype(layout)::value, kRound, decltype(fused)::value, I>
          <<<grid, kThreads, 0, stream>>>(y, b, t, cc, hwi);
    };
    const auto with_relu = [&](auto layout) {
      if (relu) {
        go(layout, std::true_type{});
      } else {
        go(layout, std::false_type{});
      }
    };
    if (nhwc) {
      with_relu(std::true_type{});
    } else {
      with_relu(std::false_type{});
    }
  });
  CUDA_CHECK_LAUNCH(bias_add_kernel);
}
}  // namespace

void bias_add(float* y, const float* b, int64_t n, int64_t c, int64_t hw, bool nhwc,
              cudaStream_t stream, bool relu) {
  launch_bias_add<false>(y, b, n, c, hw, nhwc, relu, stream);
}

void bias_add_round_bf16(float* y, const float* b, int64_t n, int64_t c, int64_t hw, bool nhwc,
                         cudaStream_t stream, bool relu) {
  launch_bias_add<true>(y, b, n, c, hw, nhwc, relu, stream);
}

void round_to_bf16(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(x) && aligned16(y)) {
    round_to_bf16_4_kernel<<<grid_for(n / 4 + n % 4), kThreads, 0, stream>>>(x, y, n / 4, n % 4);
    CUDA_CHECK_LAUNCH(round_to_bf16_4_kernel);
    return;
  }
  round_to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH(round_to_bf16_kernel);
}

void to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(x) && aligned8(y)) {
    to_bf16_4_kernel<<<grid_for(n / 4 + n % 4), kThreads, 0, stream>>>(x, y, n / 4, n % 4);
    CUDA_CHECK_LAUNCH(to_bf16_4_kernel);
    return;
  }
  to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH(to_bf16_kernel);
}

void from_bf16(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned8(x) && aligned16(y)) {
    from_bf16_4_kernel<<<grid_for(n / 4 + n % 4), kThreads, 0, stream>>>(x, y, n / 4, n % 4);
    CUDA_CHECK_LAUNCH(from_bf16_4_kernel);
    return;
  }
  from_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH(from_bf16_kernel);
}

void channel_sum(const float* x, float* out, int64_t n, int64_t c, int64_t hw, bool nhwc,
                 float* partial, cudaStream_t stream, bool round_bf16, const float* relu_y,
                 float* masked) {
  if (c <= 0) return;
  const int64_t total = n * hw;  // values per channel
  if (total <= 0) {
    fill_f32(out, c, 0.0f, stream);
    return;
  }
  // The group count depends only on the shape, so the summation order is fixed. Groups of 256
  // values or more: LeNet's first layer (20 channels of 173056 values at batch 256) then runs
  // 256 blocks, where 64 blocks of 2704 values a group left the GPU mostly waiting.
  const int64_t groups =
      partial == nullptr ? 1 : std::min<int64_t>(kChannelSumGroups, (total + 255) / 256);
  const int64_t chunk = (total + groups - 1) / groups;
  float* dst = groups == 1 ? out : partial;
  const auto go = [&](auto round, auto mask) {
    constexpr bool kRound = decltype(round)::value, kMask = decltype(mask)::value;
    if (nhwc) {
      const dim3 grid(static_cast<unsigned>((c + 31) / 32), static_cast<unsigned>(groups));
      channel_sum_nhwc_kernel<kRound, kMask>
          <<<grid, dim3(32, kRowLanes), 0, stream>>>(x, relu_y, masked, dst, c, total, chunk);
    } else {
      const dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(groups));
      channel_sum_nchw_kernel<kRound, kMask>
          <<<grid, kThreads, 0, stream>>>(x, relu_y, masked, dst, c, hw, total, chunk);
    }
  };
  const auto with_mask = [&](auto round) {
    if (relu_y != nullptr) {
      go(round, std::true_type{});
    } else {
      go(round, std::false_type{});
    }
  };
  if (round_bf16) {
    with_mask(std::true_type{});
  } else {
    with_mask(std::false_type{});
  }
  CUDA_CHECK_LAUNCH(channel_sum_kernel);
  if (groups > 1) {
    sum_groups_kernel<<<grid_for(c * 32), kThreads, 0, stream>>>(partial, out, c,
                                                                 static_cast<int>(groups));
    CUDA_CHECK_LAUNCH(sum_groups_kernel);
  }
}

void kcrs_to_krsc(const float* in, float* out, int64_t k, int64_t c, int64_t rs,
                  cudaStream_t stream, bool round_bf16) {
  if (round_bf16) {
    launch_kcrs_to_krsc<float, true>(in, out, k, c, rs, stream);
  } else {
    launch_kcrs_to_krsc(in, out, k, c, rs, stream);
  }
}

// Each value packed as bf16: a bf16 NHWC pass's filter in one launch.
void kcrs_to_krsc_bf16(const float* in, uint16_t* out, int64_t k, int64_t c, int64_t rs,
                       cudaStream_t stream) {
  launch_kcrs_to_krsc(in, out, k, c, rs, stream);
}

namespace {
template <typename In>
void launch_krsc_to_kcrs(const In* in, float* out, int64_t k, int64_t c, int64_t rs,
                         cudaStream_t stream) {
  const int64_t n = k * c * rs;
  if (n <= 0) return;
  const unsigned grid = grid_for(n);
  dispatch_index(n + int64_t{kThreads} * grid, [&](auto index) {
    using I = decltype(index);
    krsc_to_kcrs_kernel<I, In><<<grid, kThreads, 0, stream>>>(
        in, out, static_cast<I>(k), static_cast<I>(c), static_cast<I>(rs));
  });
  CUDA_CHECK_LAUNCH(krsc_to_kcrs_kernel);
}
}  // namespace

void krsc_to_kcrs(const float* in, float* out, int64_t k, int64_t c, int64_t rs,
                  cudaStream_t stream) {
  launch_krsc_to_kcrs(in, out, k, c, rs, stream);
}

// A bf16 NHWC filter gradient widened as it is transposed back, in one launch.
void krsc_bf16_to_kcrs(const uint16_t* in, float* out, int64_t k, int64_t c, int64_t rs,
                       cudaStream_t stream) {
  launch_krsc_to_kcrs(in, out, k, c, rs, stream);
}

void subsample_nhwc(const float* x, float* out, int64_t n, int64_t h, int64_t w, int64_t c,
                    int64_t sh, int64_t sw, int64_t ho, int64_t wo, bool round_bf16,
                    cudaStream_t stream) {
  const int64_t total = n * ho * wo * c;
  if (total <= 0) return;
  if (c % 4 == 0 && aligned16(x) && aligned16(out)) {
    const auto* x4 = reinterpret_cast<const float4*>(x);
    auto* out4 = reinterpret_cast<float4*>(out);
    if (round_bf16) {
      subsample_nhwc_kernel<float4, true><<<grid_for(total / 4), kThreads, 0, stream>>>(
          x4, out4, h, w, c / 4, sh, sw, ho, wo, total / 4);
    } else {
      subsample_nhwc_kernel<float4, false><<<grid_for(total / 4), kThreads, 0, stream>>>(
          x4, out4, h, w, c / 4, sh, sw, ho, wo, total / 4);
    }
    CUDA_CHECK_LAUNCH(subsample_nhwc_kernel);
    return;
  }
  if (round_bf16) {
    subsample_nhwc_kernel<float, true>
        <<<grid_for(total), kThreads, 0, stream>>>(x, out, h, w, c, sh, sw, ho, wo, total);
  } else {
    subsample_nhwc_kernel<float, false>
        <<<grid_for(total), kThreads, 0, stream>>>(x, out, h, w, c, sh, sw, ho, wo, total);
  }
  CUDA_CHECK_LAUNCH(subsample_nhwc_kernel);
}

void gather_batch(const uint8_t* images, const uint8_t* labels, int64_t m, const int32_t* indices,
                  int64_t index_count, DeviceRow start, int64_t n, int64_t c, int64_t h, int64_t w,
                  bool nhwc, const GatherAugment& aug, float* x, int32_t* y,
                  cudaStream_t stream) {
  const int64_t total = n * c * h * w;
  if (n <= 0) return;
  if (aug.active) {
    if (nhwc) {
      gather_augment_kernel<true><<<grid_for(total), kThreads, 0, stream>>>(
          images, labels, m, indices, index_count, start, n, c, h, w, aug, x, y);
    } else {
      gather_augment_kernel<false><<<grid_for(total), kThreads, 0, stream>>>(
          images, labels, m, indices, index_count, start, n, c, h, w, aug, x, y);
    }
    CUDA_CHECK_LAUNCH(gather_augment_kernel);
    return;
  }
  if (nhwc) {
    gather_kernel<true><<<grid_for(total), kThreads, 0, stream>>>(
        images, labels, m, indices, index_count, start, n, c, h, w, x, y);
  } else {
    gather_kernel<false><<<grid_for(total), kThreads, 0, stream>>>(
        images, labels, m, indices, index_count, start, n, c, h, w, x, y);
  }
  CUDA_CHECK_LAUNCH(gather_kernel);
}

void sum_across_ranks(const RankPointers& ranks, int64_t begin, int64_t end, cudaStream_t stream) {
  if (end <= begin) return;
  rank_sum_kernel<<<grid_for(end - begin), kThreads, 0, stream>>>(ranks, begin, end);
  CUDA_CHECK_LAUNCH(rank_sum_kernel);
}

}  // namespace dp::cuda::kernels
