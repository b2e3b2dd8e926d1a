#pragma once
// A CPU emulator for the CUDA backend's own kernels (core/src/cuda/*.cu), so that CI, which has
// no GPU, runs their code: the indexing, the reductions, the shuffles and the barriers. The
// kernel files are compiled unchanged apart from two mechanical rewrites (translate.cmake): a
// launch `k<<<grid, block, smem, stream>>>(args)` becomes `::dp_emu::Launch(grid, block, smem,
// stream).named("k").with([](auto... a) { k(a...); })(args)`, and namespace dp::cuda becomes
// dp::cuda_emu (so the emulated launchers never clash with the real ones in libdpcore).
//
// Semantics, and what the emulator reports as a launch error (cudaGetLastError, so the
// launchers' CUDA_CHECK_LAUNCH throws it at the launch site):
//  - every thread of a block is a fiber (Boost.Context's fcontext); blocks run one after
//    another, so __shared__ (a function-local static thread_local here) is the block's own while
//    it runs, and replicas launching the same kernel from their own threads each have their own;
//  - __syncthreads waits for every thread of the block that has not exited; threads waiting at
//    different __syncthreads call sites is an error (divergent barrier), as is a block where some
//    threads wait at a barrier that the others can never reach (deadlock);
//  - __shfl_*_sync exchanges values between the lanes of a warp (32 consecutive linear thread
//    ids); every lane its mask names must take part: a named lane that exited, does not exist,
//    or waits elsewhere is an error;
//  - a block of more than 1024 threads or an empty grid or block is cudaErrorInvalidConfiguration;
//  - the blocks run in index order (x fastest), or reversed, or in a shuffled order
//    (set_block_order, or DPRUN_EMULATED_BLOCK_ORDER=reverse|shuffled for a whole process): a
//    kernel whose result depends on which block runs first shows it there. atomicAdd,
//    __threadfence and __ldcg are the sequential machine's plain operations.
// What it cannot see: blocks running at the same time, races between warps that real hardware would
// interleave differently (the fibers run in a fixed order), the device's math library (expf, logf:
// the host's here, a few ulp apart), and anything of cuDNN, cuBLAS or NCCL.
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <type_traits>

#include "emu_stream.hpp"

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

typedef struct CUstream_st* cudaStream_t;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
/// The last launch's error, then cudaSuccess (as CUDA's runtime does).
cudaError_t cudaGetLastError();
/// The message of the last error (the emulator's own words: what went wrong, in which block).
const char* cudaGetErrorString(cudaError_t error);

extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __syncthreads() ::dp_emu::syncthreads(__FILE__, __LINE__)

inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline float __uint_as_float(unsigned v) { return std::bit_cast<float>(v); }
inline int __float_as_int(float v) { return std::bit_cast<int>(v); }
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }

// Blocks run one at a time and threads one at a time between barriers, so these are the plain
// operations (a replica's kernels may run in a thread of their own, hence the atomic add).
template <typename T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T>
T __ldcg(const T* address) {
  return *address;
}

// The classification functions device code finds in the global namespace.
using std::isfinite;
using std::isinf;
using std::isnan;

// CUDA's device min/max overloads (one template for the integer and floating pairs).
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(b) < static_cast<T>(a) ? static_cast<T>(b) : static_cast<T>(a);
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(a) < static_cast<T>(b) ? static_cast<T>(b) : static_cast<T>(a);
}

namespace dp_emu {

enum class Shuffle { index, down, up, bfly };

void syncthreads(const char* file, int line);
uint64_t shuffle(unsigned mask, uint64_t bits, Shuffle mode, int arg, int width,
                 const std::source_location& site);
/// Makes `message` the next cudaGetLastError (the first one wins until it is read).
void fail_launch(cudaError_t error, const char* message);

/// Runs `thread` once as each thread of each block of the grid (see the file comment). Any
/// error becomes the next cudaGetLastError.
void run_grid(dim3 grid, dim3 block, const std::function<void()>& thread);

/// The order in which run_grid runs a grid's blocks: index order (x fastest, then y, then z), the
/// reverse, or a permutation drawn from `seed` and the launch's number (counted from this call).
/// For the whole process (a stream's work may run in a thread of its own); the initial order is
/// DPRUN_EMULATED_BLOCK_ORDER's (forward, reverse or shuffled; unset: forward). Returns the
/// order it replaces.
enum class BlockOrder { forward, reverse, shuffled };
BlockOrder set_block_order(BlockOrder order, uint64_t seed = 0);

/// How many launches and threads ran since the counters were reset (tests check that a launcher
/// really launched).
struct Counters {
  uint64_t launches = 0, threads = 0;
};
Counters& counters();

/// A kernel's name as its launch wrote it (translate.cmake), template arguments and all.
#define DP_EMU_NAME(...) #__VA_ARGS__

class Launch {
 public:
  Launch(dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = nullptr)
      : grid_(grid), block_(block), shared_bytes_(shared_bytes), stream_(stream) {}
  /// The kernel's name, for the launch census (count_work).
  Launch& named(const char* name) {
    name_ = name;
    return *this;
  }
  /// `kernel` is a generic lambda that calls the kernel (translate.cmake writes it), so a kernel
  /// template's arguments are deduced from the launch's arguments, as nvcc does.
  template <typename K>
  auto with(K kernel) const {
    return [grid = grid_, block = block_, shared_bytes = shared_bytes_, stream = stream_,
            name = name_, kernel](auto... args) {
      if (shared_bytes != 0) {
        fail_launch(cudaErrorInvalidValue,
                    "dynamic shared memory is not emulated (no kernel of dprun's uses it)");
        return;
      }
      // The arguments by value, as a launch takes them: a recorded launch keeps its own.
      submit(stream, [grid, block, name, kernel, args...] {
        if (name != nullptr) count_work(name);
        run_grid(grid, block, [&] { kernel(args...); });
      });
    };
  }

 private:
  dim3 grid_, block_;
  size_t shared_bytes_;
  cudaStream_t stream_;
  const char* name_ = nullptr;
};

template <typename T>
T shuffle_value(unsigned mask, T value, Shuffle mode, int arg, int width,
                const std::source_location& site) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of a value > 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = shuffle(mask, bits, mode, arg, width, site);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

}  // namespace dp_emu

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32,
              const std::source_location& site = std::source_location::current()) {
  return dp_emu::shuffle_value(mask, v, dp_emu::Shuffle::index, src_lane, width, site);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                   const std::source_location& site = std::source_location::current()) {
  return dp_emu::shuffle_value(mask, v, dp_emu::Shuffle::down, static_cast<int>(delta), width,
                               site);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32,
                 const std::source_location& site = std::source_location::current()) {
  return dp_emu::shuffle_value(mask, v, dp_emu::Shuffle::up, static_cast<int>(delta), width, site);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                  const std::source_location& site = std::source_location::current()) {
  return dp_emu::shuffle_value(mask, v, dp_emu::Shuffle::bfly, lane_mask, width, site);
}
