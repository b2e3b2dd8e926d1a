#pragma once
// Launch geometry shared by the kernel files (device code only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace dp::cuda::kernels {

constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never more than needed.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65535 * 8));
}

#define DP_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

/// Memory offset of logical (n, c, h, w).
template <bool kNhwc>
__device__ __forceinline__ int64_t offset4(int64_t n, int64_t c, int64_t h, int64_t w, int64_t C,
                                           int64_t H, int64_t W) {
  if constexpr (kNhwc) {
    return ((n * H + h) * W + w) * C + c;
  } else {
    return ((n * C + c) * H + h) * W + w;
  }
}

/// Logical (n, c, h, w) of memory offset i.
template <bool kNhwc>
__device__ __forceinline__ void decode4(int64_t i, int64_t C, int64_t H, int64_t W, int64_t& n,
                                        int64_t& c, int64_t& h, int64_t& w) {
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

}  // namespace dp::cuda::kernels
