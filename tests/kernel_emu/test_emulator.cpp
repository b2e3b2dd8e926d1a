// The kernel emulator itself (emu_runtime.hpp): barriers, shuffles and shared memory behave as
// on a GPU, and the mistakes it promises to report are reported, so a kernel test that passes
// under it means something.
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace {

/// Launches a test's stream hook holds back (as a captured stream's are).
std::vector<dp_emu::Work>& pending() {
  static std::vector<dp_emu::Work> work;
  return work;
}

/// The last launch's error message, or "" when it succeeded.
std::string launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

// Each block sums its 256 values through shared memory in a tree: wrong without the barriers.
__global__ void tree_sum(const float* x, float* out) {
  __shared__ float s[256];
  const unsigned t = threadIdx.x;
  s[t] = x[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

__global__ void shuffles(int* down, int* bfly, int* idx, int* up) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int t = static_cast<int>(threadIdx.x);
  down[t] = __shfl_down_sync(0xffffffffu, 100 + lane, 3);
  bfly[t] = __shfl_xor_sync(0xffffffffu, 100 + lane, 5);
  idx[t] = __shfl_sync(0xffffffffu, 100 + lane, 7);
  up[t] = __shfl_up_sync(0xffffffffu, 100 + lane, 2, 8);
}

__global__ void divergent_barrier(int* p) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  p[threadIdx.x] = 1;
}

__global__ void shuffle_after_exit(int* p) {
  if (threadIdx.x == 5) return;
  p[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1);
}

__global__ void barrier_and_shuffle(int* p) {
  if (threadIdx.x < 32) {
    p[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1);
  } else {
    __syncthreads();
  }
}

__global__ void shuffle_against_barrier(int* p) {
  if (threadIdx.x < 16) {
    p[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1);
  } else {
    __syncthreads();
  }
}

__global__ void record_index(unsigned* out) {
  const unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

// Block (0, 0, 0)'s thread 0 takes a ticket per block in the order the blocks run.
__global__ void arrival_order(unsigned* next, unsigned* order) {
  if (threadIdx.x != 0) return;
  const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  __threadfence();
  order[atomicAdd(next, 1u)] = b;
}

}  // namespace

TEST_CASE("kernel emulator: __syncthreads orders a block's shared-memory tree sum", "[emulator]") {
  std::vector<float> x(3 * 256), out(3, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);
  ::dp_emu::Launch(3, 256).with([](auto... a) { tree_sum(a...); })(x.data(), out.data());
  REQUIRE(launch_error().empty());
  for (int b = 0; b < 3; ++b) {
    float expected = 0;
    for (int i = 0; i < 256; ++i) expected += x[static_cast<size_t>(b * 256 + i)];
    CHECK(out[static_cast<size_t>(b)] == expected);
  }
}

TEST_CASE("kernel emulator: shuffles read the lanes CUDA's rules name", "[emulator]") {
  std::vector<int> down(64), bfly(64), idx(64), up(64);
  ::dp_emu::Launch(1, 64).with([](auto... a) { shuffles(a...); })(down.data(), bfly.data(),
                                                                  idx.data(), up.data());
  REQUIRE(launch_error().empty());
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    const auto i = static_cast<size_t>(t);
    CHECK(down[i] == 100 + (lane + 3 < 32 ? lane + 3 : lane));  // beyond the warp: own value
    CHECK(bfly[i] == 100 + (lane ^ 5));
    CHECK(idx[i] == 107);
    CHECK(up[i] == 100 + (lane % 8 >= 2 ? lane - 2 : lane));  // within segments of 8
  }
}

TEST_CASE("kernel emulator: threads and blocks get every index once", "[emulator]") {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const unsigned per_block = 24, blocks = 12;
  std::vector<unsigned> out(per_block * blocks, 0xffffffffu);
  const auto before = dp_emu::counters();
  ::dp_emu::Launch(grid, block).with([](auto... a) { record_index(a...); })(out.data());
  REQUIRE(launch_error().empty());
  CHECK(dp_emu::counters().launches == before.launches + 1);
  CHECK(dp_emu::counters().threads == before.threads + per_block * blocks);
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < per_block; ++t) CHECK(out[b * per_block + t] == b * 1000 + t);
}

TEST_CASE("kernel emulator: the launch census counts each run by the name its launch wrote",
          "[emulator]") {
  std::vector<unsigned> out(8, 0);
  dp_emu_census(1, 0);
  // As translate.cmake writes a launch of record_index (twice) and of a template instance.
  for (int i = 0; i < 2; ++i)
    ::dp_emu::Launch(1, 8).named(DP_EMU_NAME(record_index)).with([](auto... a) {
      record_index(a...);
    })(out.data());
  ::dp_emu::Launch(1, 8).named(DP_EMU_NAME(some_kernel<float, 4>)).with([](auto... a) {
    record_index(a...);
  })(out.data());
  ::dp_emu::Launch(1, 8).with([](auto... a) { record_index(a...); })(out.data());  // unnamed
  REQUIRE(launch_error().empty());
  CHECK(std::string(dp_emu_census(0, 0)) == "2\trecord_index\n1\tsome_kernel<float, 4>\n");
  CHECK(std::string(dp_emu_census(1, 1)) ==
        "1\trecord_index\n1\trecord_index\n1\tsome_kernel<float, 4>\n");
  CHECK(std::string(dp_emu_census(0, 0)).empty());  // reset
  // A captured or queued launch counts when its work runs, not when it is launched.
  dp_emu::set_stream_hook([](CUstream_st*, dp_emu::Work w) { pending().push_back(std::move(w)); });
  ::dp_emu::Launch(1, 8).named("later").with([](auto... a) { record_index(a...); })(out.data());
  dp_emu::set_stream_hook(nullptr);
  CHECK(std::string(dp_emu_census(0, 0)).empty());
  for (dp_emu::Work& w : pending()) w();
  pending().clear();
  CHECK(std::string(dp_emu_census(1, 0)) == "1\tlater\n");
}

TEST_CASE("kernel emulator: reports the mistakes a GPU would punish", "[emulator]") {
  std::vector<int> p(64);
  SECTION("threads waiting at different __syncthreads") {
    ::dp_emu::Launch(1, 32).with([](auto... a) { divergent_barrier(a...); })(p.data());
    CHECK_THAT(launch_error(), Catch::Contains("divergent __syncthreads"));
  }
  SECTION("a shuffle naming a lane that has exited") {
    ::dp_emu::Launch(1, 32).with([](auto... a) { shuffle_after_exit(a...); })(p.data());
    CHECK_THAT(launch_error(), Catch::Contains("lane 5 of warp 0, which has exited"));
  }
  SECTION("a shuffle naming lanes the block does not have") {
    std::vector<int> a(64), b(64), c(64), d(64);
    ::dp_emu::Launch(1, 20).with([](auto... x) { shuffles(x...); })(a.data(), b.data(), c.data(),
                                                                    d.data());
    CHECK_THAT(launch_error(), Catch::Contains("which the block does not have"));
  }
  SECTION("a warp shuffling while the others wait at __syncthreads") {
    ::dp_emu::Launch(1, 64).with([](auto... a) { barrier_and_shuffle(a...); })(p.data());
    CHECK(launch_error().empty());  // warp 0 finishes its shuffle, then exits: legal
  }
  SECTION("a shuffle waiting for lanes that wait at __syncthreads") {
    ::dp_emu::Launch(1, 32).with([](auto... a) { shuffle_against_barrier(a...); })(p.data());
    CHECK_THAT(launch_error(), Catch::Contains("deadlock"));
  }
  SECTION("an invalid configuration") {
    ::dp_emu::Launch(1, 2048).with([](auto... a) { record_index(a...); })(nullptr);
    CHECK_THAT(launch_error(), Catch::Contains("invalid launch configuration"));
    ::dp_emu::Launch(0, 32).with([](auto... a) { record_index(a...); })(nullptr);
    CHECK_THAT(launch_error(), Catch::Contains("invalid launch configuration"));
  }
  CHECK(launch_error().empty());  // read once, then cleared
}

TEST_CASE("kernel emulator: runs a grid's blocks in the order it is set to", "[emulator]") {
  // A kernel that depends on which block runs first (a last-block-finalises reduction done
  // wrong) shows it when the same launch runs in another order.
  const dim3 grid(3, 2, 2);
  const unsigned blocks = 12;
  const auto run = [&](dp_emu::BlockOrder order, uint64_t seed) {
    const dp_emu::BlockOrder before = dp_emu::set_block_order(order, seed);
    std::vector<unsigned> out(blocks, 0xffffffffu);
    unsigned next = 0;
    ::dp_emu::Launch(grid, 32).with([](auto... a) { arrival_order(a...); })(&next, out.data());
    dp_emu::set_block_order(before);
    REQUIRE(launch_error().empty());
    CHECK(next == blocks);
    return out;
  };
  std::vector<unsigned> forward(blocks), reverse(blocks);
  for (unsigned b = 0; b < blocks; ++b) {
    forward[b] = b;
    reverse[b] = blocks - 1 - b;
  }
  CHECK(run(dp_emu::BlockOrder::forward, 0) == forward);
  CHECK(run(dp_emu::BlockOrder::reverse, 0) == reverse);
  const std::vector<unsigned> shuffled = run(dp_emu::BlockOrder::shuffled, 7);
  CHECK(shuffled != forward);
  CHECK(shuffled != reverse);
  std::vector<unsigned> sorted = shuffled;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == forward);                                 // every block once
  CHECK(run(dp_emu::BlockOrder::shuffled, 7) == shuffled);  // the seed decides the order
  CHECK(run(dp_emu::BlockOrder::shuffled, 8) != shuffled);
}
