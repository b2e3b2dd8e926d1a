// The kernel emulator's scheduler (emu_runtime.hpp): a block's threads are fibers that run, one
// at a time and in thread order, until they exit or wait at a barrier or a shuffle; the
// scheduler then releases whatever barrier is complete, or reports why none can be.
// The fibers switch with Boost.Context's fcontext (a few registers saved in user space), not
// ucontext: swapcontext and getcontext each make a sigprocmask system call, and with one fiber
// per emulated thread those calls were 80 % of an emulated GPU test's time (perf, on a 2-core
// AMD EPYC VM).
#include "emu_runtime.hpp"

#include <boost/context/detail/fcontext.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define DP_EMU_ASAN 1
#endif

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace dp_emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;  // per thread; kernels keep a few scalars there
constexpr unsigned kWarp = 32;

enum class State { ready, block_barrier, warp_barrier, done };

namespace fctx = boost::context::detail;

struct Fiber {
  fctx::fcontext_t context = nullptr;  // where it resumes
  char* stack = nullptr;               // one of its grid's stacks
  dim3 index;
  State state = State::ready;
  // The barrier or shuffle it waits at.
  const char* file = nullptr;
  unsigned line = 0;
  unsigned mask = 0;
  Shuffle mode = Shuffle::index;
  int arg = 0, width = kWarp;
  uint64_t value = 0, result = 0;
#if DP_EMU_ASAN
  void* fake_stack = nullptr;
#endif
};

struct Grid {
  fctx::fcontext_t scheduler = nullptr;  // where a yielding fiber resumes the scheduler
  std::vector<Fiber> fibers;             // reused from block to block
  /// The fibers' stacks, only ever added to: a launch of fewer threads than the last frees none.
  std::vector<std::unique_ptr<char[]>> stacks;
  size_t current = 0;
  const std::function<void()>* body = nullptr;
  std::string error;  // the first error of the launch
#if DP_EMU_ASAN
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

thread_local Grid* running = nullptr;

// Grids between launches, their fibers' stacks kept, shared by every thread that launches: a
// trainer runs each step's replicas on threads of their own (Trainer::Impl::run_all), and a
// grid (up to 1024 stacks of kStackBytes) made anew in each new thread cost more page faults
// than the kernels took time (15 million minor faults, 104 s of system time, in the 338 s of
// emulated_gpu_train on the 2-core AMD EPYC build machine).
std::mutex grid_pool_mutex;
std::vector<std::unique_ptr<Grid>> grid_pool;

/// A grid from the pool (or a new one) for one launch, back in the pool when it ends.
class PooledGrid {
 public:
  PooledGrid() {
    const std::lock_guard lock(grid_pool_mutex);
    if (grid_pool.empty()) {
      grid_ = std::make_unique<Grid>();
    } else {
      grid_ = std::move(grid_pool.back());
      grid_pool.pop_back();
    }
  }
  ~PooledGrid() {
    const std::lock_guard lock(grid_pool_mutex);
    grid_pool.push_back(std::move(grid_));
  }
  PooledGrid(const PooledGrid&) = delete;
  PooledGrid& operator=(const PooledGrid&) = delete;
  Grid& operator*() const { return *grid_; }

 private:
  std::unique_ptr<Grid> grid_;
};
thread_local cudaError_t last_error = cudaSuccess;
thread_local std::string last_message;
thread_local Counters counter_values;

BlockOrder initial_block_order() {
  const char* env = std::getenv("DPRUN_EMULATED_BLOCK_ORDER");
  if (env == nullptr || *env == '\0' || std::string(env) == "forward") return BlockOrder::forward;
  if (std::string(env) == "reverse") return BlockOrder::reverse;
  if (std::string(env) == "shuffled") return BlockOrder::shuffled;
  std::fprintf(stderr,
               "kernel emulator: DPRUN_EMULATED_BLOCK_ORDER=%s: expected forward, reverse or "
               "shuffled\n",
               env);
  std::exit(2);
}
// Global, not per thread: a stream's work may run in a thread of the stream's own.
std::atomic<BlockOrder> block_order{initial_block_order()};
std::atomic<uint64_t> block_order_seed{0}, launch_number{0};

std::string where() {
  return "block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
         std::to_string(blockIdx.z) + ")";
}

std::string site_of(const Fiber& f) {
  return std::string(f.file != nullptr ? f.file : "?") + ":" + std::to_string(f.line);
}

/// Back to the scheduler from a waiting fiber; returns when the scheduler resumes it.
void yield(Fiber& f) {
  Grid& g = *running;
#if DP_EMU_ASAN
  __sanitizer_start_switch_fiber(&f.fake_stack, g.scheduler_stack, g.scheduler_stack_size);
#endif
  g.scheduler = fctx::jump_fcontext(g.scheduler, nullptr).fctx;
#if DP_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

/// A fiber's start: its thread's body, then back to the scheduler for good (an fcontext entry
/// function must never return).
void fiber_entry(fctx::transfer_t from) {
  Grid& g = *running;
  g.scheduler = from.fctx;
#if DP_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g.scheduler_stack, &g.scheduler_stack_size);
#endif
  try {
    (*g.body)();
  } catch (const std::exception& e) {
    if (g.error.empty()) g.error = "a thread threw: " + std::string(e.what());
  } catch (...) {
    if (g.error.empty()) g.error = "a thread threw";
  }
  g.fibers[g.current].state = State::done;
#if DP_EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, g.scheduler_stack, g.scheduler_stack_size);
#endif
  fctx::jump_fcontext(g.scheduler, nullptr);  // never resumed: the next block makes it anew
  std::abort();
}

void resume(Grid& g, size_t i) {
  Fiber& f = g.fibers[i];
  g.current = i;
  threadIdx = f.index;
#if DP_EMU_ASAN
  void* save = nullptr;
  __sanitizer_start_switch_fiber(&save, f.stack, kStackBytes);
#endif
  f.context = fctx::jump_fcontext(f.context, nullptr).fctx;
#if DP_EMU_ASAN
  __sanitizer_finish_switch_fiber(save, nullptr, nullptr);
#endif
}

/// The lane a shuffling lane reads, or -1 for its own value (CUDA's rule for a source outside
/// the lane's segment of `width` lanes).
int source_lane(const Fiber& f, unsigned lane) {
  const int w = f.width, l = static_cast<int>(lane), base = l / w * w;
  switch (f.mode) {
    case Shuffle::index:
      return base + ((f.arg % w) + w) % w;
    case Shuffle::down:
      return l % w + f.arg < w ? l + f.arg : -1;
    case Shuffle::up:
      return l % w - f.arg >= 0 ? l - f.arg : -1;
    case Shuffle::bfly: {
      const int s = l ^ f.arg;
      return s / w * w == base ? s : -1;
    }
  }
  return -1;
}

/// Releases warp `w`'s shuffle when every lane its mask names waits there. Returns whether it
/// did; sets g.error for a shuffle that can never complete correctly.
bool release_warp(Grid& g, size_t w) {
  const size_t first = w * kWarp, lanes = std::min<size_t>(kWarp, g.fibers.size() - first);
  const Fiber* lead = nullptr;
  for (size_t l = 0; l < lanes; ++l)
    if (g.fibers[first + l].state == State::warp_barrier) {
      lead = &g.fibers[first + l];
      break;
    }
  if (lead == nullptr) return false;
  const unsigned mask = lead->mask;
  for (unsigned l = 0; l < kWarp; ++l) {
    if ((mask >> l & 1u) == 0) continue;
    if (l >= lanes) {
      g.error = "a shuffle at " + site_of(*lead) + " names lane " + std::to_string(l) +
                " of warp " + std::to_string(w) + ", which the block does not have";
      return false;
    }
    const Fiber& f = g.fibers[first + l];
    if (f.state == State::done) {
      g.error = "a shuffle at " + site_of(*lead) + " names lane " + std::to_string(l) +
                " of warp " + std::to_string(w) + ", which has exited";
      return false;
    }
    if (f.state != State::warp_barrier) return false;  // not there yet (or elsewhere: deadlock)
    if (f.mask != mask || f.mode != lead->mode || f.line != lead->line || f.width != lead->width) {
      g.error = "lanes of warp " + std::to_string(w) + " shuffle at different sites or masks (" +
                site_of(*lead) + ", " + site_of(f) + ")";
      return false;
    }
  }
  for (unsigned l = 0; l < kWarp; ++l) {
    if ((mask >> l & 1u) == 0) continue;
    Fiber& f = g.fibers[first + l];
    const int src = source_lane(f, l);
    if (src < 0) {
      f.result = f.value;
    } else if (static_cast<size_t>(src) >= lanes || (mask >> src & 1u) == 0) {
      g.error = "lane " + std::to_string(l) + " of warp " + std::to_string(w) + " reads lane " +
                std::to_string(src) + " outside the shuffle's mask at " + site_of(f);
      return false;
    } else {
      f.result = g.fibers[first + static_cast<size_t>(src)].value;
    }
  }
  for (unsigned l = 0; l < kWarp; ++l)
    if ((mask >> l & 1u) != 0) g.fibers[first + l].state = State::ready;
  return true;
}

/// Runs one block to its end; false with g.error set when it cannot finish.
bool run_block(Grid& g) {
  for (;;) {
    bool waiting = false;
    for (size_t i = 0; i < g.fibers.size(); ++i) {
      if (g.fibers[i].state == State::ready) resume(g, i);
      if (!g.error.empty()) return false;
      waiting = waiting || g.fibers[i].state != State::done;
    }
    if (!waiting) return true;
    bool released = false;
    for (size_t w = 0; w * kWarp < g.fibers.size(); ++w) {
      released = release_warp(g, w) || released;
      if (!g.error.empty()) return false;
    }
    if (released) continue;
    // Every thread still alive waits: at one __syncthreads, or it is a deadlock.
    const Fiber* at = nullptr;
    for (const Fiber& f : g.fibers) {
      if (f.state == State::done) continue;
      if (f.state == State::warp_barrier) {
        g.error = "deadlock: a shuffle at " + site_of(f) +
                  " waits for lanes that wait elsewhere or never come";
        return false;
      }
      if (at == nullptr) at = &f;
      if (f.line != at->line || std::string(f.file) != at->file) {
        g.error =
            "divergent __syncthreads: threads wait at " + site_of(*at) + " and at " + site_of(f);
        return false;
      }
    }
    for (Fiber& f : g.fibers)
      if (f.state == State::block_barrier) f.state = State::ready;
  }
}

Fiber& current_fiber(const char* what) {
  if (running == nullptr) {
    std::fprintf(stderr, "kernel emulator: %s outside a kernel\n", what);
    std::abort();
  }
  return running->fibers[running->current];
}

}  // namespace

void fail_launch(cudaError_t error, const char* message) {
  if (last_error != cudaSuccess) return;
  last_error = error;
  last_message = message;
}

void syncthreads(const char* file, int line) {
  Fiber& f = current_fiber("__syncthreads");
  f.state = State::block_barrier;
  f.file = file;
  f.line = static_cast<unsigned>(line);
  yield(f);
}

uint64_t shuffle(unsigned mask, uint64_t bits, Shuffle mode, int arg, int width,
                 const std::source_location& site) {
  Fiber& f = current_fiber("a shuffle");
  if (width <= 0 || width > static_cast<int>(kWarp) || (width & (width - 1)) != 0) {
    running->error = "a shuffle with width " + std::to_string(width) + " (a power of 2 <= 32)";
  }
  const unsigned lane = static_cast<unsigned>(running->current % kWarp);
  if ((mask >> lane & 1u) == 0 && running->error.empty()) {
    running->error = "lane " + std::to_string(lane) +
                     " shuffles with a mask that leaves it out at " +
                     std::string(site.file_name()) + ":" + std::to_string(site.line());
  }
  f.state = State::warp_barrier;
  f.file = site.file_name();
  f.line = site.line();
  f.mask = mask;
  f.mode = mode;
  f.arg = arg;
  f.width = width;
  f.value = bits;
  yield(f);
  return f.result;
}

void run_grid(dim3 grid, dim3 block, const std::function<void()>& thread) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    fail_launch(cudaErrorInvalidConfiguration,
                ("invalid launch configuration: grid (" + std::to_string(grid.x) + "," +
                 std::to_string(grid.y) + "," + std::to_string(grid.z) + "), block (" +
                 std::to_string(block.x) + "," + std::to_string(block.y) + "," +
                 std::to_string(block.z) + ")")
                    .c_str());
    return;
  }
  if (running != nullptr) {
    fail_launch(cudaErrorLaunchFailure, "a kernel launched another kernel");
    return;
  }
  const PooledGrid pooled;
  Grid& g = *pooled;
  g.fibers.resize(threads);
  // Not zeroed: the pages a fiber never touches are never faulted in.
  while (g.stacks.size() < threads)
    g.stacks.push_back(std::make_unique_for_overwrite<char[]>(kStackBytes));
  for (size_t i = 0; i < g.fibers.size(); ++i) g.fibers[i].stack = g.stacks[i].get();
  g.body = &thread;
  g.error.clear();
  running = &g;
  gridDim = grid;
  blockDim = block;
  ++counter_values.launches;
  const uint64_t per_z = uint64_t{grid.x} * grid.y, blocks = per_z * grid.z;
  const BlockOrder order = block_order.load();
  std::vector<uint64_t> shuffled;
  if (order == BlockOrder::shuffled) {
    shuffled.resize(blocks);
    for (uint64_t b = 0; b < blocks; ++b) shuffled[b] = b;
    std::mt19937_64 draw(block_order_seed.load() ^
                         (launch_number.fetch_add(1) * 0x9E3779B97F4A7C15ull));
    std::shuffle(shuffled.begin(), shuffled.end(), draw);
  }
  for (uint64_t k = 0; k < blocks && g.error.empty(); ++k) {
    const uint64_t b = order == BlockOrder::forward   ? k
                       : order == BlockOrder::reverse ? blocks - 1 - k
                                                      : shuffled[k];
    blockIdx = dim3(static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b % per_z / grid.x),
                    static_cast<unsigned>(b / per_z));
    for (size_t i = 0; i < g.fibers.size(); ++i) {
      Fiber& f = g.fibers[i];
      const auto t = static_cast<unsigned>(i);
      f.index = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
      f.state = State::ready;
      // Its stack grows down from the top; a fiber abandoned mid-block (a block's error) is
      // simply made anew, as nothing of it is kept but its stack.
      f.context = fctx::make_fcontext(f.stack + kStackBytes, kStackBytes, fiber_entry);
    }
    counter_values.threads += threads;
    if (!run_block(g)) g.error += " (" + where() + ")";
  }
  running = nullptr;
  if (!g.error.empty()) fail_launch(cudaErrorLaunchFailure, g.error.c_str());
}

Counters& counters() { return counter_values; }

BlockOrder set_block_order(BlockOrder order, uint64_t seed) {
  block_order_seed = seed;
  launch_number = 0;
  return block_order.exchange(order);
}

namespace {
StreamHook stream_hook = nullptr;
}

void set_stream_hook(StreamHook hook) { stream_hook = hook; }

void submit(CUstream_st* stream, Work work) {
  if (stream_hook != nullptr) {
    stream_hook(stream, std::move(work));
  } else {
    work();
  }
}

namespace {
std::mutex census_mutex;
std::map<std::string, uint64_t> census;  // replicas launch from threads of their own
std::vector<std::string> census_order;   // the first kMaxOrder runs since the last reset
constexpr size_t kMaxOrder = 100000;
}  // namespace

void count_work(const std::string& name) {
  const std::lock_guard lock(census_mutex);
  ++census[name];
  if (census_order.size() < kMaxOrder) census_order.push_back(name);
}

std::string take_kernel_error() {
  if (last_error == cudaSuccess) return "";
  last_error = cudaSuccess;
  return last_message;
}

}  // namespace dp_emu

cudaError_t cudaGetLastError() {
  const cudaError_t e = dp_emu::last_error;
  dp_emu::last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : dp_emu::last_message.c_str();
}

const char* dp_emu_census(int reset, int in_order) {
  thread_local std::string text;
  const std::lock_guard lock(dp_emu::census_mutex);
  text.clear();
  if (in_order != 0) {
    for (const std::string& name : dp_emu::census_order) text += "1\t" + name + "\n";
  } else {
    for (const auto& [name, count] : dp_emu::census)
      text += std::to_string(count) + "\t" + name + "\n";
  }
  if (reset != 0) {
    dp_emu::census.clear();
    dp_emu::census_order.clear();
  }
  return text.c_str();
}
