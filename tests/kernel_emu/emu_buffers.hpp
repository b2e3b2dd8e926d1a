#pragma once
// Buffers for the emulated kernels' tests: each sits between two guard zones of a fixed pattern,
// so a kernel writing one element outside its buffer fails the test. In the sanitizer build
// (DP_EMU_ASAN) the zones are also poisoned, and the kernels instrumented, so a read outside a
// buffer is an AddressSanitizer error too. An `offset` in elements moves the buffer off the
// 16-byte alignment a vectorised path checks for.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels.cuh"

#if DP_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace emutest {

template <typename T>
class Guarded {
 public:
  static constexpr size_t kGuard = 64;  // elements each side

  explicit Guarded(size_t n, size_t offset = 0) : n_(n), begin_(kGuard + offset) {
    storage_.resize(n + 2 * kGuard + offset);
    std::memset(static_cast<void*>(storage_.data()), kPattern, storage_.size() * sizeof(T));
    poison(true);
  }
  ~Guarded() { poison(false); }
  Guarded(Guarded&& o) noexcept : n_(o.n_), begin_(o.begin_) {
    o.poison(false);
    storage_ = std::move(o.storage_);
    poison(true);
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  Guarded& operator=(Guarded&&) = delete;
  explicit Guarded(const std::vector<T>& values, size_t offset = 0)
      : Guarded(values.size(), offset) {
    if (!values.empty()) std::memcpy(data(), values.data(), values.size() * sizeof(T));
  }
  T* data() { return storage_.data() + begin_; }
  std::vector<T> values() const {
    return std::vector<T>(storage_.begin() + static_cast<std::ptrdiff_t>(begin_),
                          storage_.begin() + static_cast<std::ptrdiff_t>(begin_ + n_));
  }
  /// "" when both guard zones are untouched, else which one was written.
  std::string damage() const {
    const auto untouched = [&](size_t from, size_t to) {
      const auto* p = reinterpret_cast<const unsigned char*>(storage_.data() + from);
      for (size_t i = 0; i < (to - from) * sizeof(T); ++i)
        if (p[i] != kPattern) return false;
      return true;
    };
    poison(false);
    const bool before = untouched(0, begin_), after = untouched(begin_ + n_, storage_.size());
    poison(true);
    if (!before) return "written before its start";
    if (!after) return "written past its end";
    return "";
  }

 private:
  static constexpr unsigned char kPattern = 0xA5;  // as floats: -2.87e-16, no value a test makes

  void poison([[maybe_unused]] bool on) const {
#if DP_EMU_ASAN
    if (storage_.empty()) return;
    const auto zone = [&](size_t from, size_t to) {
      void* p = const_cast<T*>(storage_.data() + from);
      const size_t bytes = (to - from) * sizeof(T);
      // The functions, not the ASAN_ macros: this file is compiled without the sanitizer.
      if (on) {
        __asan_poison_memory_region(p, bytes);
      } else {
        __asan_unpoison_memory_region(p, bytes);
      }
    };
    zone(0, begin_);
    zone(begin_ + n_, storage_.size());
#endif
  }

  size_t n_, begin_;
  std::vector<T> storage_;
};

#define EMU_CHECK_INTACT(buffer)               \
  do {                                         \
    INFO(#buffer << " " << (buffer).damage()); \
    CHECK((buffer).damage().empty());          \
  } while (0)

/// Sets kernels::force_wide_indices for its lifetime: the kernels that index in 32 bits where a
/// tensor allows take the 64-bit path that only tensors of over 2^31 values reach on a GPU.
class WideIndices {
 public:
  explicit WideIndices(bool wide) : before_(dp::cuda_emu::kernels::force_wide_indices) {
    dp::cuda_emu::kernels::force_wide_indices = wide;
  }
  ~WideIndices() { dp::cuda_emu::kernels::force_wide_indices = before_; }
  WideIndices(const WideIndices&) = delete;
  WideIndices& operator=(const WideIndices&) = delete;

 private:
  bool before_;
};

/// The launchers throw (CUDA_CHECK_LAUNCH) on a launch error; nothing may be left pending.
inline void require_no_pending_error() {
  const cudaError_t e = cudaGetLastError();
  INFO((e == cudaSuccess ? "" : cudaGetErrorString(e)));
  REQUIRE(e == cudaSuccess);
}

}  // namespace emutest
