// Batch norm over channels-last activations: x is M = N*H*W rows of C channels (NHWC), our own
// kernels. cuDNN's legacy batch norm on an NHWC descriptor runs a strided NCHW kernel: on the
// H100 it took 35.6 of ResNet-18's 44.7 ms per step (bench/results/2026-11-25-...-9060f00.md).
// The epilogue (residual add, ReLU) is applied where y is written, and the ReLU's mask where the
// gradient is first read, so a residual block's bn -> add -> ReLU reads and writes once.
//
// Reductions are two-level and deterministic: block (32 channel lanes x 8 row lanes), grid
// (channel tiles, row groups); each thread sums its rows of one channel in fp32 (at most a few
// hundred values), the 8 row lanes are added in a fixed order. The groups' partial sums are then
// added in double: 16 lanes per channel, lane l the groups l, l + 16, ... in order, then the
// lanes in a fixed pairwise tree. (One thread per channel adding up to 512 groups in a row took
// 32-38 us a launch on the H200, 1.2 of ResNet-18's 10.1 ms per step.) The groups depend on M
// alone, never on the device. The statistics are sums of x - pivot (the channel's first value),
// so the variance does not lose its digits to a large mean.
//
// That second level runs in the partial kernel's launch, not one of its own: the last block of a
// channel tile to write its partials (a counter per tile, counted after a __threadfence, put
// back to 0 by that block) adds them all and writes the tile's statistics or coefficients. Which
// block that is depends on the scheduling, but what it computes does not: it reads every group's
// partials in the fixed order above. (Training used 6 launches a batch norm, 102 of ResNet-18's
// step; now 4.)
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"

namespace dp::cuda::kernels {
namespace {

constexpr int kLanes = 32;        // channels per block (one warp across a row: coalesced)
constexpr int kRowLanes = 8;      // rows per block step
constexpr int64_t kRowsPerGroup = 128;
constexpr int64_t kMaxGroups = 512;
constexpr int kSumLanes = 16;  // group lanes per channel in a tile's last block (a power of 2)

dim3 reduce_grid(int64_t c, int64_t groups) {
  return dim3(static_cast<unsigned>((c + kLanes - 1) / kLanes), static_cast<unsigned>(groups));
}

/// The rows [begin, end) of group g.
__device__ __forceinline__ void group_rows(int64_t rows, int64_t groups, int64_t g,
                                           int64_t& begin, int64_t& end) {
  const int64_t per = (rows + groups - 1) / groups;
  begin = g * per;
  end = begin + per < rows ? begin + per : rows;
}

/// Adds the block's row lanes of (a, b) in a fixed order and writes them at [g * c + ch].
__device__ __forceinline__ void write_partial(float a, float b, int64_t ch, int64_t c, int64_t g,
                                              float* out_a, float* out_b) {
  __shared__ float sa[kRowLanes][kLanes], sb[kRowLanes][kLanes];
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    float ta = 0.0f, tb = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) {
      ta += sa[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    out_a[g * c + ch] = ta;
    out_b[g * c + ch] = tb;
  }
}

constexpr int kTileThreads = 256;  // the partial kernels' blocks (32 x 8 and 8 x 32)
static_assert(kTileThreads == kLanes * kRowLanes && kTileThreads == kLanes / 4 * 32,
              "both partial kernels' blocks are kTileThreads");
static_assert(kTileThreads / kLanes * 2 == kSumLanes, "each thread adds two of a channel's lanes");

/// After every thread of a partial kernel's block has written (or not) its share of the group's
/// partials: whether this block is the last of its channel tile's `groups` blocks to get here,
/// the same answer in every thread. The last one puts the tile's counter back to 0 for the next
/// launch (every other block of the tile has counted by then).
__device__ __forceinline__ bool last_of_tile(unsigned* counters, int64_t groups) {
  __shared__ bool last;
  __threadfence();  // this thread's partials are visible to the whole device before the count
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    const unsigned before = atomicAdd(counters + blockIdx.x, 1u);
    last = static_cast<int64_t>(before) + 1 == groups;
    if (last) counters[blockIdx.x] = 0u;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

/// In the last block of channel tile blockIdx.x (kTileThreads threads, any shape): the sums over
/// the groups of a[g * c + ch] and b[g * c + ch] for the tile's channel ch = blockIdx.x * kLanes
/// + lane, in double, in a fixed order: kSumLanes lanes per channel, lane l the groups l,
/// l + kSumLanes, ... in order, then the lanes in a pairwise tree. Thread t holds channel lane
/// t % kLanes and lanes t / kLanes and t / kLanes + kSumLanes / 2. Every thread of the block
/// must call it; it returns true in the thread that holds a channel's sums (t < kLanes, ch < c).
/// The partials are read past the L1 cache (__ldcg): other blocks wrote them.
__device__ __forceinline__ bool sum_partials(const float* a, const float* b, int64_t c,
                                             int64_t groups, int64_t& ch, double& ta, double& tb) {
  __shared__ double da[kSumLanes][kLanes], db[kSumLanes][kLanes];
  const int t = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  const int lane = t % kLanes;
  ch = static_cast<int64_t>(blockIdx.x) * kLanes + lane;
  const int low = t / kLanes, high = low + kSumLanes / 2;
  double sa = 0.0, sb = 0.0, ha = 0.0, hb = 0.0;
  if (ch < c) {
    // Both lanes in one loop (twice the loads in flight), each its own groups in order.
    for (int64_t g = low; g < groups; g += kSumLanes) {
      sa += __ldcg(a + g * c + ch);
      sb += __ldcg(b + g * c + ch);
      if (g + kSumLanes / 2 < groups) {
        ha += __ldcg(a + (g + kSumLanes / 2) * c + ch);
        hb += __ldcg(b + (g + kSumLanes / 2) * c + ch);
      }
    }
  }
  da[low][lane] = sa;
  db[low][lane] = sb;
  da[high][lane] = ha;
  db[high][lane] = hb;
  __syncthreads();
  for (int stride = kSumLanes / 2; stride > 0; stride /= 2) {
    if (low < stride) {
      da[low][lane] += da[low + stride][lane];
      db[low][lane] += db[low + stride][lane];
    }
    __syncthreads();
  }
  ta = da[0][lane];
  tb = db[0][lane];
  return t < kLanes && ch < c;
}

/// What the forward's second level writes per channel (stats_tile).
struct StatsOut {
  const float* gamma;
  float* running_mean;
  float* running_var;
  const float* conv_bias;  // a folded convolution bias (x lacks it), or null
  float momentum, eps;
  float* save_mean;
  float* save_invstd;
  float* scale;
};

/// What the backward's second level writes per channel (grad_tile).
struct GradOut {
  const float* gamma;
  const float* save_invstd;
  float* dgamma;
  float* dbeta;
  float* coef;
};

// In the last block of a channel tile: per channel, the batch's mean and biased variance from the
// partials, save_mean, save_invstd, the running statistics (PyTorch's update, the variance
// unbiased by M / (M - 1)) and scale = gamma * invstd.
template <typename T>
__device__ __forceinline__ void stats_tile(const T* x, const float* s1, const float* s2,
                                           int64_t rows, int64_t c, int64_t groups,
                                           const StatsOut& o) {
  int64_t ch = 0;
  double t1 = 0.0, t2 = 0.0;
  if (!sum_partials(s1, s2, c, groups, ch, t1, t2)) return;
  const double m = static_cast<double>(rows);
  const double shift = t1 / m;
  double var = t2 / m - shift * shift;
  if (var < 0.0) var = 0.0;
  const double mean = static_cast<double>(load_f32(x, ch)) + shift;
  const double invstd = 1.0 / sqrt(var + static_cast<double>(o.eps));
  o.save_mean[ch] = static_cast<float>(mean);
  o.save_invstd[ch] = static_cast<float>(invstd);
  const double mom = o.momentum;
  const auto updated = static_cast<float>((1.0 - mom) * o.running_mean[ch] + mom * mean);
  // x lacks the folded convolution bias: its share, as Backend::add(mean, bias, mean, momentum).
  o.running_mean[ch] =
      o.conv_bias != nullptr ? fmaf(o.momentum, o.conv_bias[ch], updated) : updated;
  o.running_var[ch] =
      static_cast<float>((1.0 - mom) * o.running_var[ch] + mom * var * m / (m - 1.0));
  o.scale[ch] = static_cast<float>(static_cast<double>(o.gamma[ch]) * invstd);
}

// In the last block of a channel tile: per channel, dbeta = sum g, dgamma = sum g * xhat, and the
// coefficients of dx = A g + B + Cc (x - mean): A = gamma * invstd, B = -A sum g / M,
// Cc = -A invstd^2 sum g (x - mean) / M.
__device__ __forceinline__ void grad_tile(const float* sg, const float* sgx, int64_t rows,
                                          int64_t c, int64_t groups, const GradOut& o) {
  int64_t ch = 0;
  double t1 = 0.0, t2 = 0.0;
  if (!sum_partials(sg, sgx, c, groups, ch, t1, t2)) return;
  const double m = static_cast<double>(rows);
  const double invstd = o.save_invstd[ch];
  const double a = static_cast<double>(o.gamma[ch]) * invstd;
  o.dbeta[ch] = static_cast<float>(t1);
  o.dgamma[ch] = static_cast<float>(t2 * invstd);
  o.coef[ch] = static_cast<float>(a);
  o.coef[c + ch] = static_cast<float>(-a * t1 / m);
  o.coef[2 * c + ch] = static_cast<float>(-a * invstd * invstd * t2 / m);
}

// The 16-byte variants of the partial kernels, for C a multiple of 4 and aligned tensors: block
// (8 lanes of 4 channels, 32 row lanes), the same 32 channels and groups per block as the scalar
// kernels, each thread reading float4s (on the H200 the scalar partials took 0.82 of ResNet-18's
// 10.1 ms per step). The 32 row lanes are added in a fixed order.
constexpr int kQuadLanes = kLanes / 4;
constexpr int kRowLanes4 = 32;

__device__ __forceinline__ void add4(float4& a, float4 v) {
  a.x += v.x;
  a.y += v.y;
  a.z += v.z;
  a.w += v.w;
}
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}
__device__ __forceinline__ float4 sub4(float4 a, float4 b) {
  return make_float4(a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w);
}

/// write_partial for the 16-byte kernels: channels ch .. ch + 3 (ch < c, c % 4 == 0). The 32 row
/// lanes meet in a fixed pairwise tree (5 steps, every lane adding), where one lane adding all 32
/// in a row was as long as a small layer's whole pass.
__device__ __forceinline__ void write_partial4(float4 a, float4 b, int64_t ch, int64_t c, int64_t g,
                                               float* out_a, float* out_b) {
  __shared__ float4 sa[kRowLanes4][kQuadLanes], sb[kRowLanes4][kQuadLanes];
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  for (int stride = kRowLanes4 / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.y) < stride) {
      add4(sa[threadIdx.y][threadIdx.x], sa[threadIdx.y + stride][threadIdx.x]);
      add4(sb[threadIdx.y][threadIdx.x], sb[threadIdx.y + stride][threadIdx.x]);
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && ch < c) {
    *reinterpret_cast<float4*>(out_a + g * c + ch) = sa[0][threadIdx.x];
    *reinterpret_cast<float4*>(out_b + g * c + ch) = sb[0][threadIdx.x];
  }
}

template <typename T>
__global__ void stats_partial4_kernel(const T* x, int64_t rows, int64_t c, int64_t groups,
                                      float* s1, float* s2, unsigned* counters, StatsOut out) {
  const int64_t ch = (static_cast<int64_t>(blockIdx.x) * kQuadLanes + threadIdx.x) * 4;
  const int64_t g = blockIdx.y;
  float4 a1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), a2 = a1;
  if (ch < c) {
    const float4 pivot = load4_f32(x, ch);
    int64_t begin = 0, end = 0;
    group_rows(rows, groups, g, begin, end);
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes4) {
      const float4 d = sub4(load4_f32(x, r * c + ch), pivot);
      add4(a1, d);
      add4(a2, mul4(d, d));
    }
  }
  write_partial4(a1, a2, ch, c, g, s1, s2);
  if (last_of_tile(counters, groups)) stats_tile(x, s1, s2, rows, c, groups, out);
}

template <bool kRelu, typename T, typename Y, typename D>
__global__ void backward_partial4_kernel(const T* x, const D* dy, const Y* y, float* dz,
                                         const float* mean, int64_t rows, int64_t c, int64_t groups,
                                         float* sg, float* sgx, unsigned* counters, GradOut out) {
  const int64_t ch = (static_cast<int64_t>(blockIdx.x) * kQuadLanes + threadIdx.x) * 4;
  const int64_t g = blockIdx.y;
  float4 a1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), a2 = a1;
  if (ch < c) {
    const float4 m = *reinterpret_cast<const float4*>(mean + ch);
    int64_t begin = 0, end = 0;
    group_rows(rows, groups, g, begin, end);
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes4) {
      const int64_t i = r * c + ch;
      float4 gv = load4_f32(dy, i);
      if (kRelu) {
        const float4 yv = load4_f32(y, i);
        gv = make_float4(yv.x > 0.0f ? gv.x : 0.0f, yv.y > 0.0f ? gv.y : 0.0f,
                         yv.z > 0.0f ? gv.z : 0.0f, yv.w > 0.0f ? gv.w : 0.0f);
        *reinterpret_cast<float4*>(dz + i) = gv;
      }
      add4(a1, gv);
      add4(a2, mul4(gv, sub4(load4_f32(x, i), m)));
    }
  }
  write_partial4(a1, a2, ch, c, g, sg, sgx);
  if (last_of_tile(counters, groups)) grad_tile(sg, sgx, rows, c, groups, out);
}

/// Whether the 16-byte partial kernels may run: C a multiple of 4, every tensor (and the partial
/// sums, written at g * c + ch) 16-byte aligned.
bool partials4(int64_t c, std::initializer_list<const void*> ptrs) {
  if (c % 4 != 0) return false;
  for (const void* p : ptrs) {
    if (!aligned16(p)) return false;
  }
  return true;
}

// Partial sums of d = x - x[0, ch] and d^2 per (group, channel).
template <typename T>
__global__ void stats_partial_kernel(const T* x, int64_t rows, int64_t c, int64_t groups, float* s1,
                                     float* s2, unsigned* counters, StatsOut out) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  const int64_t g = blockIdx.y;
  float a1 = 0.0f, a2 = 0.0f;
  if (ch < c) {
    const float pivot = load_f32(x, ch);
    int64_t begin = 0, end = 0;
    group_rows(rows, groups, g, begin, end);
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const float d = load_f32(x, r * c + ch) - pivot;
      a1 += d;
      a2 += d * d;
    }
  }
  write_partial(a1, a2, ch, c, g, s1, s2);
  if (last_of_tile(counters, groups)) stats_tile(x, s1, s2, rows, c, groups, out);
}

// Inference: scale = gamma / sqrt(running_var + eps); with a folded convolution bias (which x
// lacks) also shifted_mean = running_mean - bias, as Backend::add(mean, bias, shifted, -1).
__global__ void infer_scale_kernel(const float* gamma, const float* running_var, float eps,
                                   const float* running_mean, const float* conv_bias, float* scale,
                                   float* shifted_mean, int64_t c) {
  DP_GRID_STRIDE(ch, c) {
    scale[ch] = static_cast<float>(static_cast<double>(gamma[ch]) /
                                   sqrt(static_cast<double>(running_var[ch]) + eps));
    if (conv_bias != nullptr) shifted_mean[ch] = fmaf(-1.0f, conv_bias[ch], running_mean[ch]);
  }
}

template <bool kResidual, bool kRelu>
__device__ __forceinline__ float normalised(float x, float mean, float scale, float beta,
                                            float residual) {
  float v = (x - mean) * scale + beta;
  if (kResidual) v = v + residual;
  if (kRelu) v = v < 0.0f ? 0.0f : v;  // NaN stays NaN, as relu_forward
  return v;
}

// y = epilogue((x - mean) * scale + beta), one element per thread step; a bf16 y (Y = uint16_t)
// holds it rounded (store_f32); a bf16 residual (R = uint16_t) is widened as it is read.
template <bool kResidual, bool kRelu, typename T, typename Y, typename R>
__global__ void apply_kernel(const T* x, const float* mean, const float* scale, const float* beta,
                             const R* residual, Y* y, int64_t total, int64_t c) {
  DP_GRID_STRIDE(i, total) {
    const int64_t ch = i % c;
    store_f32(y, i,
              normalised<kResidual, kRelu>(load_f32(x, i), mean[ch], scale[ch], beta[ch],
                                           kResidual ? load_f32(residual, i) : 0.0f));
  }
}

// The same with 16-byte loads and stores: C a multiple of 4 and every pointer 16-byte aligned.
// I: the index type, int32_t where every offset fits (the channel of each float4 is a division,
// which the GPU emulates in 64 bits).
template <bool kResidual, bool kRelu, typename T, typename Y, typename R, typename I>
__global__ void apply4_kernel(const T* x, const float* mean, const float* scale, const float* beta,
                              const R* residual, Y* y, I total4, I c) {
  DP_GRID_STRIDE_AS(I, i, total4) {
    const I ch = (4 * i) % c;
    const float4 v = load4_f32(x, 4 * i);
    const float4 r = kResidual ? load4_f32(residual, 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 out;
    out.x = normalised<kResidual, kRelu>(v.x, mean[ch], scale[ch], beta[ch], r.x);
    out.y = normalised<kResidual, kRelu>(v.y, mean[ch + 1], scale[ch + 1], beta[ch + 1], r.y);
    out.z = normalised<kResidual, kRelu>(v.z, mean[ch + 2], scale[ch + 2], beta[ch + 2], r.z);
    out.w = normalised<kResidual, kRelu>(v.w, mean[ch + 3], scale[ch + 3], beta[ch + 3], r.w);
    store4_f32(y, 4 * i, out);
  }
}

template <bool kResidual, bool kRelu, typename T, typename Y, typename R>
void launch_apply(const T* x, const float* mean, const float* scale, const float* beta,
                  const R* residual, Y* y, int64_t total, int64_t c, cudaStream_t stream) {
  if (c % 4 == 0 && aligned16(x) && aligned16(residual) && aligned16(y)) {
    const int64_t total4 = total / 4;
    const unsigned grid = grid_for(total4);
    dispatch_index(total + 4 * int64_t{kThreads} * grid, [&](auto index) {
      using I = decltype(index);
      apply4_kernel<kResidual, kRelu, T, Y, R, I><<<grid, kThreads, 0, stream>>>(
          x, mean, scale, beta, residual, y, static_cast<I>(total4), static_cast<I>(c));
    });
    CUDA_CHECK_LAUNCH(apply4_kernel);
  } else {
    apply_kernel<kResidual, kRelu, T, Y, R>
        <<<grid_for(total), kThreads, 0, stream>>>(x, mean, scale, beta, residual, y, total, c);
    CUDA_CHECK_LAUNCH(apply_kernel);
  }
}

// Without a residual the kernels are those of R = float (one set, whatever R).
template <typename T, typename Y, typename R>
void apply(const T* x, const float* mean, const float* scale, const float* beta, const R* residual,
           bool relu, Y* y, int64_t total, int64_t c, cudaStream_t stream) {
  if (total == 0) return;
  const float* none = nullptr;
  if (residual != nullptr) {
    if (relu) {
      launch_apply<true, true, T, Y, R>(x, mean, scale, beta, residual, y, total, c, stream);
    } else {
      launch_apply<true, false, T, Y, R>(x, mean, scale, beta, residual, y, total, c, stream);
    }
  } else if (relu) {
    launch_apply<false, true, T, Y, float>(x, mean, scale, beta, none, y, total, c, stream);
  } else {
    launch_apply<false, false, T, Y, float>(x, mean, scale, beta, none, y, total, c, stream);
  }
}

// Partial sums of g and g * (x - mean) per (group, channel), g = dy, or with the ReLU epilogue
// g = y > 0 ? dy : 0, written to dz (y as stored, rounded to bf16 in precision bf16 whether
// packed or not, so either storage gives one mask). D: dy's type, a packed bf16 dy (the gradient
// a bf16 convolution wrote, rounded) widened as it is read.
template <bool kRelu, typename T, typename Y, typename D>
__global__ void backward_partial_kernel(const T* x, const D* dy, const Y* y, float* dz,
                                        const float* mean, int64_t rows, int64_t c, int64_t groups,
                                        float* sg, float* sgx, unsigned* counters, GradOut out) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x;
  const int64_t g = blockIdx.y;
  float a1 = 0.0f, a2 = 0.0f;
  if (ch < c) {
    const float m = mean[ch];
    int64_t begin = 0, end = 0;
    group_rows(rows, groups, g, begin, end);
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const int64_t i = r * c + ch;
      float gv = load_f32(dy, i);
      if (kRelu) {
        gv = load_f32(y, i) > 0.0f ? gv : 0.0f;
        dz[i] = gv;
      }
      a1 += gv;
      a2 += gv * (load_f32(x, i) - m);
    }
  }
  write_partial(a1, a2, ch, c, g, sg, sgx);
  if (last_of_tile(counters, groups)) grad_tile(sg, sgx, rows, c, groups, out);
}

__device__ __forceinline__ float backward_value(float x, float g, const float* mean,
                                                const float* coef, int64_t ch, int64_t c) {
  return coef[ch] * g + coef[c + ch] + coef[2 * c + ch] * (x - mean[ch]);
}

template <typename T>
__global__ void backward_apply_kernel(const T* x, const float* g, const float* mean,
                                      const float* coef, T* dx, int64_t total, int64_t c) {
  DP_GRID_STRIDE(i, total) {
    store_f32(dx, i, backward_value(load_f32(x, i), g[i], mean, coef, i % c, c));
  }
}

// The same with 16-byte loads and stores (as apply4_kernel; on the H200 the scalar kernel took
// 0.89 ms of ResNet-18's step against the forward's float4 apply's 0.34 for as many bytes).
template <typename T, typename I>
__global__ void backward_apply4_kernel(const T* x, const float4* g, const float* mean,
                                       const float* coef, T* dx, I total4, I c) {
  DP_GRID_STRIDE_AS(I, i, total4) {
    const I ch = (4 * i) % c;
    const float4 xv = load4_f32(x, 4 * i), gv = g[i];
    float4 out;
    out.x = backward_value(xv.x, gv.x, mean, coef, ch, c);
    out.y = backward_value(xv.y, gv.y, mean, coef, ch + 1, c);
    out.z = backward_value(xv.z, gv.z, mean, coef, ch + 2, c);
    out.w = backward_value(xv.w, gv.w, mean, coef, ch + 3, c);
    store4_f32(dx, 4 * i, out);
  }
}

}  // namespace

int64_t bn_nhwc_groups(int64_t rows) {
  const int64_t groups = (rows + kRowsPerGroup - 1) / kRowsPerGroup;
  return groups < 1 ? 1 : (groups > kMaxGroups ? kMaxGroups : groups);
}

size_t bn_nhwc_scratch_floats(int64_t rows, int64_t c) {
  return static_cast<size_t>(2 * bn_nhwc_groups(rows) * c + 3 * c);
}

size_t bn_nhwc_counters(int64_t c) {
  return c <= 0 ? 0 : static_cast<size_t>((c + kLanes - 1) / kLanes);
}

template <typename T, typename Y, typename R>
void bn_nhwc_forward_train(const T* x, const float* gamma, const float* beta, float* running_mean,
                           float* running_var, const float* conv_bias, float momentum, float eps,
                           float* save_mean, float* save_invstd, const R* residual, bool relu, Y* y,
                           int64_t rows, int64_t c, float* scratch, unsigned* counters,
                           cudaStream_t stream) {
  if (rows <= 0 || c <= 0) return;
  const int64_t groups = bn_nhwc_groups(rows);
  float* s1 = scratch;
  float* s2 = scratch + groups * c;
  float* scale = scratch + 2 * groups * c;
  const StatsOut out{gamma, running_mean, running_var, conv_bias, momentum,
                     eps,   save_mean,    save_invstd, scale};
  if (partials4(c, {x, s1, s2})) {
    stats_partial4_kernel<T><<<reduce_grid(c, groups), dim3(kQuadLanes, kRowLanes4), 0, stream>>>(
        x, rows, c, groups, s1, s2, counters, out);
    CUDA_CHECK_LAUNCH(stats_partial4_kernel);
  } else {
    stats_partial_kernel<T><<<reduce_grid(c, groups), dim3(kLanes, kRowLanes), 0, stream>>>(
        x, rows, c, groups, s1, s2, counters, out);
    CUDA_CHECK_LAUNCH(stats_partial_kernel);
  }
  apply(x, save_mean, scale, beta, residual, relu, y, rows * c, c, stream);
}

template <typename T, typename Y, typename R>
void bn_nhwc_forward_infer(const T* x, const float* gamma, const float* beta,
                           const float* running_mean, const float* running_var,
                           const float* conv_bias, float eps, const R* residual, bool relu, Y* y,
                           int64_t rows, int64_t c, float* scratch, cudaStream_t stream) {
  if (rows <= 0 || c <= 0) return;
  float* shifted_mean = scratch + c;
  infer_scale_kernel<<<grid_for(c), kThreads, 0, stream>>>(gamma, running_var, eps, running_mean,
                                                           conv_bias, scratch, shifted_mean, c);
  CUDA_CHECK_LAUNCH(infer_scale_kernel);
  apply(x, conv_bias != nullptr ? shifted_mean : running_mean, scratch, beta, residual, relu, y,
        rows * c, c, stream);
}

template <typename T, typename Y, typename D>
void bn_nhwc_backward(const T* x, const D* dy, const Y* y, float* dz, const float* gamma,
                      const float* save_mean, const float* save_invstd, T* dx, float* dgamma,
                      float* dbeta, int64_t rows, int64_t c, float* scratch, unsigned* counters,
                      cudaStream_t stream) {
  if (rows <= 0 || c <= 0) return;
  const int64_t groups = bn_nhwc_groups(rows);
  float* sg = scratch;
  float* sgx = scratch + groups * c;
  float* coef = scratch + 2 * groups * c;
  const bool relu = y != nullptr;
  const dim3 grid = reduce_grid(c, groups);
  const GradOut out{gamma, save_invstd, dgamma, dbeta, coef};
  if (partials4(c, {x, dy, y, dz, save_mean, sg, sgx})) {
    const dim3 block(kQuadLanes, kRowLanes4);
    if (relu) {
      backward_partial4_kernel<true, T, Y, D><<<grid, block, 0, stream>>>(
          x, dy, y, dz, save_mean, rows, c, groups, sg, sgx, counters, out);
    } else {
      backward_partial4_kernel<false, T, Y, D><<<grid, block, 0, stream>>>(
          x, dy, nullptr, nullptr, save_mean, rows, c, groups, sg, sgx, counters, out);
    }
    CUDA_CHECK_LAUNCH(backward_partial4_kernel);
  } else {
    const dim3 block(kLanes, kRowLanes);
    if (relu) {
      backward_partial_kernel<true, T, Y, D><<<grid, block, 0, stream>>>(
          x, dy, y, dz, save_mean, rows, c, groups, sg, sgx, counters, out);
    } else {
      backward_partial_kernel<false, T, Y, D><<<grid, block, 0, stream>>>(
          x, dy, nullptr, nullptr, save_mean, rows, c, groups, sg, sgx, counters, out);
    }
    CUDA_CHECK_LAUNCH(backward_partial_kernel);
  }
  const int64_t total = rows * c;
  // The ReLU's masked gradient, or dy itself (fp32: a bf16 dy comes with the ReLU epilogue, the
  // contract of Backend::batchnorm_backward).
  const float* g = dz;
  if constexpr (std::is_same_v<D, float>) {
    if (!relu) g = dy;
  } else if (!relu) {
    throw InternalError("bn_nhwc_backward: a packed dy without the ReLU epilogue's dz");
  }
  if (c % 4 == 0 && aligned16(x) && aligned16(g) && aligned16(dx)) {
    const int64_t total4 = total / 4;
    const auto* g4 = reinterpret_cast<const float4*>(g);
    const unsigned grid = grid_for(total4);
    dispatch_index(total + 4 * int64_t{kThreads} * grid, [&](auto index) {
      using I = decltype(index);
      backward_apply4_kernel<T, I><<<grid, kThreads, 0, stream>>>(
          x, g4, save_mean, coef, dx, static_cast<I>(total4), static_cast<I>(c));
    });
    CUDA_CHECK_LAUNCH(backward_apply4_kernel);
  } else {
    backward_apply_kernel<T>
        <<<grid_for(total), kThreads, 0, stream>>>(x, g, save_mean, coef, dx, total, c);
    CUDA_CHECK_LAUNCH(backward_apply_kernel);
  }
}

// fp32 activations, and packed bf16 ones: x the stored output of a bf16 convolution, y the
// stored output of a batch norm whose readers take it so (a bf16 convolution, the next residual
// block), the residual a packed earlier output (an identity shortcut).
#define DP_BN_NHWC_FORWARD(T, Y, R)                                                                \
  template void bn_nhwc_forward_train<T, Y, R>(                                                    \
      const T*, const float*, const float*, float*, float*, const float*, float, float, float*,    \
      float*, const R*, bool, Y*, int64_t, int64_t, float*, unsigned*, cudaStream_t);              \
  template void bn_nhwc_forward_infer<T, Y, R>(const T*, const float*, const float*, const float*, \
                                               const float*, const float*, float, const R*, bool,  \
                                               Y*, int64_t, int64_t, float*, cudaStream_t);
#define DP_BN_NHWC_TYPES(T, Y)                                                                \
  DP_BN_NHWC_FORWARD(T, Y, float)                                                             \
  DP_BN_NHWC_FORWARD(T, Y, uint16_t)                                                          \
  template void bn_nhwc_backward<T, Y, float>(                                                \
      const T*, const float*, const Y*, float*, const float*, const float*, const float*, T*, \
      float*, float*, int64_t, int64_t, float*, unsigned*, cudaStream_t);
DP_BN_NHWC_TYPES(float, float)
DP_BN_NHWC_TYPES(uint16_t, float)
DP_BN_NHWC_TYPES(float, uint16_t)
DP_BN_NHWC_TYPES(uint16_t, uint16_t)
#undef DP_BN_NHWC_TYPES
#undef DP_BN_NHWC_FORWARD
// A packed bf16 dy, with a bf16 y (the ReLU epilogue's, whose sign is the mask): the gradient a
// bf16 convolution wrote for the batch norm that feeds it alone.
template void bn_nhwc_backward<float, uint16_t, uint16_t>(const float*, const uint16_t*,
                                                          const uint16_t*, float*, const float*,
                                                          const float*, const float*, float*,
                                                          float*, float*, int64_t, int64_t, float*,
                                                          unsigned*, cudaStream_t);
template void bn_nhwc_backward<uint16_t, uint16_t, uint16_t>(const uint16_t*, const uint16_t*,
                                                             const uint16_t*, float*, const float*,
                                                             const float*, const float*, uint16_t*,
                                                             float*, float*, int64_t, int64_t,
                                                             float*, unsigned*, cudaStream_t);

}  // namespace dp::cuda::kernels
