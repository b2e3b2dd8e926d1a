// CpuBackend: memory, copies, fill, the checks every op shares, and construction.
#include "cpu/cpu_backend.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "cpu/conv_plans.hpp"
#include "cpu/cpu_kernels.hpp"
#include "cpu/onednn.hpp"
#include "cpu/openblas.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {
constexpr size_t kAlignment = 256;
}  // namespace

// ---- memory ------------------------------------------------------------------------------------

MemoryTracker::~MemoryTracker() {
  for (auto& [p, bytes] : sizes_) std::free(p);
}

void* MemoryTracker::allocate(size_t bytes) {
  // aligned_alloc needs a size that is a multiple of the alignment; 0 bytes still gets a
  // unique pointer so release() stays symmetric.
  const size_t rounded =
      std::max<size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    DP_THROW("cpu backend: out of host memory allocating " + std::to_string(bytes) +
             " bytes (in use: " + std::to_string(in_use()) +
             " bytes); reduce the batch size or the number of replicas");
  }
  // Zeroed so a freshly allocated buffer never holds garbage that a test could mistake for a
  // result (and so first-touch happens here, at setup, not in the step loop).
  std::memset(p, 0, rounded);
  std::lock_guard<std::mutex> lock(mutex_);
  sizes_[p] = bytes;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void MemoryTracker::release(void* p) noexcept {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sizes_.find(p);
  if (it == sizes_.end()) return;  // not ours: ignoring is safer than freeing foreign memory
  in_use_ -= it->second;
  sizes_.erase(it);
  std::free(p);
}

size_t MemoryTracker::in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

size_t MemoryTracker::peak() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

void SharedScratch::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  void* grown = memory_->allocate(bytes);
  memory_->release(data_);
  data_ = grown;
  bytes_ = bytes;
}

// ---- the backend -------------------------------------------------------------------------------

CpuBackend::CpuBackend(const BackendOptions& options)
    : kernels_(resolve_cpu_kernels(options.cpu_kernels)),
      memory_(std::make_shared<MemoryTracker>()) {
  DP_CHECK(options.cpu_threads >= 0,
           "cpu backend: cpu_threads must be >= 0 (0 = all hardware threads), got " +
               std::to_string(options.cpu_threads));
  threads_ = options.cpu_threads > 0 ? options.cpu_threads : omp_get_max_threads();
  // The kernels' library is loaded now, so a missing one fails here, not in the first step.
  if (kernels_ == CpuKernels::blas) {
    kernels_description_ = "OpenBLAS " + openblas().core;
  } else {
    onednn_ = std::make_shared<OnednnContext>();
    kernels_description_ = "oneDNN " + onednn_isa();
  }
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::device_description() const {
  return "CPU (" + std::to_string(threads_) + (threads_ == 1 ? " thread, " : " threads, ") +
         kernels_description_ + ")";
}

std::shared_ptr<SharedScratch> CpuBackend::shared_scratch() {
  std::shared_ptr<SharedScratch> scratch = shared_scratch_.lock();
  if (!scratch) {
    scratch = std::make_shared<SharedScratch>(memory_);
    shared_scratch_ = scratch;
  }
  return scratch;
}

void* CpuBackend::allocate(size_t bytes) { return memory_->allocate(bytes); }
void CpuBackend::release(void* p) noexcept { memory_->release(p); }
size_t CpuBackend::memory_in_use() const { return memory_->in_use(); }
size_t CpuBackend::peak_memory() const { return memory_->peak(); }

void CpuBackend::upload_impl(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
}
void CpuBackend::download_impl(void* host_dst, const void* src, size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}
void CpuBackend::copy_impl(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}

// t (any shape) f32 or i32 = value.
void CpuBackend::fill_impl(const Tensor& t, float value) {
  const int64_t n = t.numel();
  if (t.dtype == DType::f32) {
    float* p = t.f32();
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = value;
  } else {
    int32_t* p = t.i32();
    const auto v = static_cast<int32_t>(value);
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  }
}

// ---- convolution: the plan does the work (conv_plans.hpp) -----------------------------------

std::unique_ptr<ConvPlan> CpuBackend::plan_conv_impl(const ConvGeometry& g, const ConvUse& use) {
  if (kernels_ == CpuKernels::onednn) {
    std::unique_ptr<CpuConvPlan> plan =
        make_onednn_plan(g, use, onednn_, threads_, shared_scratch(), memory_);
    if (plan) return plan;
  }
  return make_im2col_plan(g, kernels_, threads_, memory_);
}

// The public ops checked that the plan is this backend's, so it is a CpuConvPlan.
void CpuBackend::conv_forward_impl(ConvPlan& plan, const Tensor& x, const Tensor& w,
                                   const Tensor* b, const Tensor& y) {
  static_cast<CpuConvPlan&>(plan).forward(x, w, b, y);
}
void CpuBackend::conv_backward_data_impl(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                                         const Tensor& dx) {
  static_cast<CpuConvPlan&>(plan).backward_data(dy, w, dx);
}
void CpuBackend::conv_backward_filter_impl(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                           const Tensor& dw, const Tensor* db) {
  static_cast<CpuConvPlan&>(plan).backward_filter(x, dy, dw, db);
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace dp::cpu
