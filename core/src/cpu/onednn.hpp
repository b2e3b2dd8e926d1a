#pragma once
// oneDNN for the CPU backend: the checking macro, the engine and stream of a backend, the thread
// count a primitive is created and run with, and what oneDNN runs on this CPU.
//
// Threading: Debian's oneDNN uses the OpenMP runtime. A primitive sizes its work split for
// omp_get_max_threads() of the thread that creates it, and starts its parallel regions on the
// thread that runs it, with that thread's omp_get_max_threads(). Plans are made on the setup
// thread and run on the replica's (another std::thread, and each epoch's may be new), so every
// creation and every run happens inside an OmpThreads scope with the backend's thread count.
// Scratchpads are the user's (scratchpad_mode::user): oneDNN's own would be tied to the
// creating thread and allocated by oneDNN in the step loop; ours come from the backend's
// MemoryTracker at plan time (see SharedScratch).
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#define DNNL_CHECK(statement)                                                         \
  do {                                                                                \
    const dnnl_status_t dp_dnnl_status_ = (statement);                                \
    if (dp_dnnl_status_ != dnnl_success)                                              \
      ::dp::cpu::throw_onednn_error(#statement, __FILE__, __LINE__, dp_dnnl_status_); \
  } while (0)

namespace dp::cpu {

[[noreturn]] void throw_onednn_error(const char* statement, const char* file, int line,
                                     dnnl_status_t status);

/// The engine and stream of one backend. CPU streams run work on the calling thread, so one
/// stream serves whichever thread runs the replica.
struct OnednnContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  /// Convolution passes created outside plan_conv (a batch size or direction the plan's ConvUse
  /// did not declare): each is a primitive creation, and maybe a scratch allocation, mid-run.
  std::atomic<int64_t> late_passes{0};
};

/// While alive, OpenMP regions this thread starts (oneDNN's included) use `threads` threads.
class OmpThreads {
 public:
  explicit OmpThreads(int threads) : saved_(omp_get_max_threads()) {
    if (threads != saved_) omp_set_num_threads(threads);
    changed_ = threads != saved_;
  }
  ~OmpThreads() {
    if (changed_) omp_set_num_threads(saved_);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
  bool changed_;
};

/// The instruction set oneDNN's kernels use here ("avx512_core_bf16", "avx2"): the best the CPU
/// supports, capped by ONEDNN_MAX_CPU_ISA.
std::string onednn_isa();
/// Floats per vector register of that instruction set (16, 8 or 4): the channel block of
/// oneDNN's blocked layouts.
int onednn_simd_floats();
/// True when oneDNN runs its brgemm-based NHWC convolutions ("brgconv"), which 2.6 has for
/// AVX-512 (avx512_core and later) only; below that its NHWC kernels are the plain JIT ones.
bool onednn_has_brgconv();
/// "oneDNN 2.6.3 avx512_core_bf16"
std::string onednn_description();

}  // namespace dp::cpu
