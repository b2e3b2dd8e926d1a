#pragma once
// Launch geometry shared by the kernel files (device code only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/kernels.cuh"
#include "dp/bf16.hpp"

namespace dp::cuda::kernels {

/// The row a DeviceRow's cursor points at, or -1 when it is outside the table.
__device__ __forceinline__ int64_t row_index(const DeviceRow& r) {
  const int64_t at = *r.cursor;
  return at >= 0 && at < r.rows ? at : -1;
}

/// Column `column` of a DeviceRow of f32 (NaN for a cursor outside the table), or `host` when
/// the row has no table.
__device__ __forceinline__ float row_f32(const DeviceRow& r, int64_t column, float host) {
  if (r.table == nullptr) return host;
  const int64_t at = row_index(r);
  return at >= 0 ? static_cast<const float*>(r.table)[at * r.width + column]
                 : __int_as_float(0x7fc00000);
}

constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than needed.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65535 * 8));
}

/// Whether p (or nullptr) may be read and written as float4: the 16-byte paths of the
/// element-wise kernels take their scalar twin otherwise.
inline bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

/// An activation value as fp32: itself, or a packed bf16 (precision bf16 stores the outputs of
/// the convolutions that feed a batch norm so, ConvPlan::output_dtype) widened, exactly.
template <typename I>
__device__ __forceinline__ float load_f32(const float* p, I i) {
  return p[i];
}
template <typename I>
__device__ __forceinline__ float load_f32(const uint16_t* p, I i) {
  return __uint_as_float(static_cast<uint32_t>(p[i]) << 16);
}
/// The four values at i, a multiple of 4, in one load (16 bytes of fp32, 8 of bf16): p must be
/// aligned for it (aligned16 covers both).
template <typename I>
__device__ __forceinline__ float4 load4_f32(const float* p, I i) {
  return *reinterpret_cast<const float4*>(p + i);
}
template <typename I>
__device__ __forceinline__ float4 load4_f32(const uint16_t* p, I i) {
  const uint64_t v = *reinterpret_cast<const uint64_t*>(p + i);
  return make_float4(__uint_as_float(static_cast<uint32_t>(v << 16)),
                     __uint_as_float(static_cast<uint32_t>(v) & 0xFFFF0000u),
                     __uint_as_float(static_cast<uint32_t>(v >> 16) & 0xFFFF0000u),
                     __uint_as_float(static_cast<uint32_t>(v >> 32) & 0xFFFF0000u));
}

/// Stores an fp32 result where load_f32 reads: itself, or its nearest bf16, packed
/// (dp::round_bits_to_bf16's bits, the cpu backend's rounding).
template <typename I>
__device__ __forceinline__ void store_f32(float* p, I i, float v) {
  p[i] = v;
}
template <typename I>
__device__ __forceinline__ void store_f32(uint16_t* p, I i, float v) {
  p[i] = dp::packed_bf16_bits(__float_as_uint(v));
}
/// The four values at i (a multiple of 4) in one store; p aligned as for load4_f32.
template <typename I>
__device__ __forceinline__ void store4_f32(float* p, I i, float4 v) {
  *reinterpret_cast<float4*>(p + i) = v;
}
template <typename I>
__device__ __forceinline__ void store4_f32(uint16_t* p, I i, float4 v) {
  const auto bits = [](float f) {
    return static_cast<uint64_t>(dp::packed_bf16_bits(__float_as_uint(f)));
  };
  *reinterpret_cast<uint64_t*>(p + i) =
      bits(v.x) | bits(v.y) << 16 | bits(v.z) << 32 | bits(v.w) << 48;
}

/// Full unrolling of a loop with a constant trip count (registers indexed by the loop variable stay
/// registers): nvcc's pragma; the kernel emulator's host compiler takes GCC's.
#if defined(__CUDACC__)
#define DP_UNROLL _Pragma("unroll")
#else
#define DP_UNROLL _Pragma("GCC unroll 64")
#endif

#define DP_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

/// DP_GRID_STRIDE in index type I (its bound plus the grid's threads must fit I).
#define DP_GRID_STRIDE_AS(I, i, n)                                                                \
  for (I i =                                                                                      \
           static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); \
       i < (n); i += static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x))

/// Memory offset of logical (n, c, h, w), in index type I (int64_t, or int32_t where every offset
/// of the tensor fits: 32-bit division and multiplication are several times cheaper on the GPU).
template <bool kNhwc, typename I>
__device__ __forceinline__ I offset4(I n, I c, I h, I w, I C, I H, I W) {
  if constexpr (kNhwc) {
    return ((n * H + h) * W + w) * C + c;
  } else {
    return ((n * C + c) * H + h) * W + w;
  }
}

/// Logical (n, c, h, w) of memory offset i.
template <bool kNhwc, typename I>
__device__ __forceinline__ void decode4(I i, I C, I H, I W, I& n, I& c, I& h, I& w) {
  if constexpr (kNhwc) {
    c = i % C;
    i /= C;
    w = i % W;
    i /= W;
    h = i % H;
    n = i / H;
  } else {
    w = i % W;
    i /= W;
    h = i % H;
    i /= H;
    c = i % C;
    n = i / C;
  }
}

/// Whether every offset below `count` fits int32_t: the kernels then index in 32 bits (unless a
/// test forces the 64-bit path: force_wide_indices).
inline bool fits_int32(int64_t count) { return !force_wide_indices && count <= INT32_MAX; }

/// Calls launch(index) with index an int32_t where every offset and grid-stride step a kernel
/// makes stays below `bound`, which fits_int32, else an int64_t: the launch inside instantiates
/// its kernel for decltype(index).
template <typename Launch>
void dispatch_index(int64_t bound, Launch&& launch) {
  if (fits_int32(bound)) {
    launch(int32_t{});
  } else {
    launch(int64_t{});
  }
}

}  // namespace dp::cuda::kernels
