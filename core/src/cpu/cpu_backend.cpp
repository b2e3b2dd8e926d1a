// CpuBackend: memory, copies, fill, the checks every op shares, and construction.
#include "cpu/cpu_backend.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "cpu/bf16_cpu.hpp"
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

namespace {

// oneDNN runs below what this CPU can do only when told to (ONEDNN_MAX_CPU_ISA, or its older
// name DNNL_MAX_CPU_ISA): a leftover setting costs 1.5-2x (bench/compare_pytorch.py), so it is
// said once per process, with what to do.
void warn_if_onednn_capped() {
  static std::once_flag once;
  std::call_once(once, [] {
    const CpuFeatures f = cpu_features();
    const std::string isa = onednn_isa();
    const bool has512 = isa.rfind("avx512", 0) == 0;
    const bool has2 = has512 || isa.rfind("avx2", 0) == 0;
    const char* could = f.avx512 && !has512 ? "AVX-512" : f.avx2_fma && !has2 ? "AVX2" : nullptr;
    if (could == nullptr) return;
    std::string why = "; the convolutions are slower than they could be";
    for (const char* var : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
      const char* cap = std::getenv(var);
      if (cap == nullptr || *cap == '\0') continue;
      why = " because " + std::string(var) + "=" + cap + why + ": unset it unless that is intended";
      break;
    }
    std::fprintf(stderr,
                 "dprun: warning: cpu backend: oneDNN runs its %s kernels on a CPU with %s%s\n",
                 isa.c_str(), could, why.c_str());
  });
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : kernels_(resolve_cpu_kernels(options.cpu_kernels)),
      memory_(std::make_shared<MemoryTracker>()) {
  DP_CHECK(options.cpu_threads >= 0,
           "cpu backend: cpu_threads must be >= 0 (0 = all hardware threads), got " +
               std::to_string(options.cpu_threads));
  threads_ = options.cpu_threads > 0 ? options.cpu_threads : omp_get_max_threads();
  if (const char* defer = std::getenv("DPRUN_CPU_DEFER_UPLOADS"))
    defer_uploads_ = std::string(defer) == "1";
  precision_ = options.precision;
  copy_scratch_ = std::make_unique<SharedScratch>(memory_);
  // The kernels' library is loaded now, so a missing one fails here, not in the first step.
  if (kernels_ != CpuKernels::blas) {
    onednn_ = std::make_shared<OnednnContext>();
    warn_if_onednn_capped();
  }
  kernels_description_ = cpu_kernels(kernels_);  // as `dprun --version` prints it
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

void* CpuBackend::allocate_impl(size_t bytes) { return memory_->allocate(bytes); }
void CpuBackend::release(void* p) noexcept { memory_->release(p); }
size_t CpuBackend::memory_in_use() const { return memory_->in_use(); }
size_t CpuBackend::peak_memory() const { return memory_->peak(); }

void CpuBackend::upload_impl(void* dst, const void* host_src, size_t bytes) {
  std::memcpy(dst, host_src, bytes);
}
void* CpuBackend::allocate_host_impl(size_t bytes) {
  void* p = std::malloc(std::max<size_t>(bytes, 1));
  if (p == nullptr) {
    DP_THROW("cpu backend: out of host memory allocating " + std::to_string(bytes) +
             " bytes of staging memory for streamed data (a ring slot: at most 16 of the largest "
             "batches per replica); a smaller batch size or data_budget_mib needs less");
  }
  return p;
}
void CpuBackend::release_host(void* p) noexcept { std::free(p); }
// The cpu runs every op when it is called: the copy is in op order by being done now (or, for
// tests, as late as the contract allows: see defer_uploads_).
uint64_t CpuBackend::upload_async_impl(void* dst, const void* host_src, size_t bytes) {
  ++uploads_;
  if (defer_uploads_) {
    pending_uploads_.push_back({dst, host_src, bytes, uploads_});
  } else if (bytes > 0) {
    std::memcpy(dst, host_src, bytes);
  }
  return uploads_;
}
void CpuBackend::finish_uploads(uint64_t ticket) {
  size_t done = 0;
  for (; done < pending_uploads_.size() && pending_uploads_[done].ticket <= ticket; ++done) {
    const PendingUpload& u = pending_uploads_[done];
    if (u.bytes > 0) std::memcpy(u.dst, u.src, u.bytes);
  }
  pending_uploads_.erase(pending_uploads_.begin(), pending_uploads_.begin() + done);
}
void CpuBackend::download_impl(void* host_dst, const void* src, size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}
void CpuBackend::copy_impl(void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}

void CpuBackend::advance_impl(const Tensor& cursor) { ++*cursor.i32(); }

int64_t step_row_index(const Tensor& cursor, int64_t rows, const char* op, const char* what) {
  const int32_t at = *cursor.i32();
  if (at < 0 || at >= rows) {
    DP_THROW(std::string("cpu backend: ") + op + ": the " + what + " cursor is " +
             std::to_string(at) + ", outside its table of " + std::to_string(rows) +
             " rows (a step replayed more often than its tables have rows?)");
  }
  return at;
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

namespace {
size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

char* CpuConvPlan::scratch_for(const ConvScratch& given, size_t bytes) const {
  if (bytes <= given.bytes) return given.data;
  shared_->reserve(bytes);
  return shared_->data();
}

bool CpuBackend::copies_filter(const CpuConvPlan& plan, Layout filter_layout, ConvDirection d) {
  return filter_layout == Layout::nhwc && !plan.reads_stored_filter(d);
}

size_t CpuBackend::pass_copy_bytes(ConvDirection pass, int64_t x, int64_t w, int64_t y,
                                   bool filter_copy) const {
  using B = OperandCopies;
  const bool bf16 = precision_ == Precision::bf16;
  switch (pass) {
    case ConvDirection::forward:  // (x, w)
      return bf16 ? B::bytes_for(x, w) : filter_copy ? B::bytes_for(w) : 0;
    case ConvDirection::backward_data:  // (dy, w)
      return bf16 ? B::bytes_for(y, w) : filter_copy ? B::bytes_for(w) : 0;
    case ConvDirection::backward_filter:  // (x, dy), then dw's room
      return (bf16 ? B::bytes_for(x, y) : 0) + (filter_copy ? B::bytes_for(w) : 0);
  }
  return 0;
}

size_t CpuBackend::copy_bytes(const CpuConvPlan& plan, Layout filter_layout,
                              ConvStage stage) const {
  const ConvGeometry& g = plan.geometry();
  const int64_t x = g.max_batch * g.in_channels * g.in_h * g.in_w;
  const int64_t w = g.out_channels * g.in_channels * g.kernel_h * g.kernel_w;
  const int64_t y = g.max_batch * g.out_channels * g.out_h() * g.out_w();
  const auto bytes = [&](ConvDirection d) {
    return pass_copy_bytes(d, x, w, y, copies_filter(plan, filter_layout, d));
  };
  using D = ConvDirection;
  if (stage == ConvStage::forward) return aligned(bytes(D::forward));
  // backward-data and backward-filter, one after the other
  return aligned(std::max(bytes(D::backward_data), bytes(D::backward_filter)));
}

std::unique_ptr<ConvPlan> CpuBackend::plan_conv_impl(const ConvGeometry& g, const ConvUse& use) {
  std::shared_ptr<SharedScratch> shared = shared_scratch();
  std::unique_ptr<CpuConvPlan> plan;
  if (kernels_ == CpuKernels::onednn)
    plan = make_onednn_plan(g, use, onednn_, threads_, shared, memory_);
  if (!plan) plan = make_im2col_plan(g, kernels_, threads_, shared);
  const Layout filters = use.filter_layout;
  if (use.planned_workspace) {
    // Everything a pass works in lives in the caller's workspace: the operand copies first,
    // then the plan's scratch.
    for (const ConvStage stage : {ConvStage::forward, ConvStage::backward})
      need_workspace(*plan, stage, copy_bytes(*plan, filters, stage) + plan->scratch_bytes(stage));
    return plan;
  }
  using S = ConvStage;
  shared->reserve(std::max(plan->scratch_bytes(S::forward), plan->scratch_bytes(S::backward)));
  // Every pass's operand copies fit in its stage's (copy_scratch_ grows for a larger one).
  copy_scratch_->reserve(
      std::max(copy_bytes(*plan, filters, S::forward), copy_bytes(*plan, filters, S::backward)));
  return plan;
}

struct CpuBackend::PassMemory {
  OperandCopies copies;
  ConvScratch scratch;
};

CpuBackend::PassMemory CpuBackend::pass_memory(const ConvPlan& plan, ConvStage stage,
                                               const Tensor* workspace, size_t copy_bytes) {
  const auto& cpu_plan = static_cast<const CpuConvPlan&>(plan);
  if (plan.planned_workspace()) {
    if (workspace == nullptr) {
      // A stage the plan said needs nothing (an fp32 pass nobody declared, as backward of a plan
      // made for evaluation): a pass that turns out to need scratch runs in the shared one.
      DP_ASSERT(copy_bytes == 0);
      return {OperandCopies(nullptr, 0, threads_), ConvScratch{}};
    }
    // Checked against the plan's need, which covers every pass up to max_batch.
    const size_t copies = this->copy_bytes(cpu_plan, plan.filter_layout(), stage);
    DP_ASSERT(workspace->bytes() >= copies && copy_bytes <= copies);
    char* const data = static_cast<char*>(workspace->data);
    return {OperandCopies(data, copies, threads_),
            ConvScratch{data + copies, workspace->bytes() - copies}};
  }
  copy_scratch_->reserve(copy_bytes);
  return {OperandCopies(*copy_scratch_, threads_), cpu_plan.shared_scratch()};
}

// The public ops checked that the plan is this backend's, so it is a CpuConvPlan. In bf16 the
// passes run on rounded copies (bf16_cpu.hpp). A filter stored (K, R, S, C) is read as it is by
// oneDNN's passes (their reorder takes either order: the same bits); the others read it from, or
// write its gradient through, a (K, C, R, S) copy (copies_filter): the values, so the bits, are
// those of a (K, C, R, S) filter. The copy scratch grows here only for a pass larger than any
// planned (never in a planned step loop).
// A packed copy of w (w_bf16) goes unread: the passes take fp32 operands, rounded here.
void CpuBackend::conv_forward_impl(ConvPlan& plan, const Tensor& x, const Tensor& w,
                                   const Tensor* b, const Tensor& y, const Tensor* workspace,
                                   const Tensor* /*w_bf16*/) {
  auto& p = static_cast<CpuConvPlan&>(plan);
  const bool bf16 = precision_ == Precision::bf16;
  const bool copy = copies_filter(p, w.layout, ConvDirection::forward);
  PassMemory m =
      pass_memory(plan, ConvStage::forward, workspace,
                  pass_copy_bytes(ConvDirection::forward, x.numel(), w.numel(), y.numel(), copy));
  const Tensor xs = bf16 ? m.copies.rounded(x) : x;
  const Tensor wk = copy ? m.copies.filter(w, bf16) : bf16 ? m.copies.rounded(w) : w;
  p.forward(xs, wk, b, y, m.scratch);
  if (bf16) round_to_bf16_in_place(threads_, y.f32(), y.numel());
  // A fused ReLU (ConvUse::output_relu): relu_forward's values, in place.
  if (plan.output_relu()) relu_forward_impl(y, y);
}
void CpuBackend::conv_backward_data_impl(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                                         const Tensor& dx, const Tensor* workspace,
                                         const Tensor* /*w_bf16*/) {
  auto& p = static_cast<CpuConvPlan&>(plan);
  const bool bf16 = precision_ == Precision::bf16;
  const bool copy = copies_filter(p, w.layout, ConvDirection::backward_data);
  PassMemory m = pass_memory(plan, ConvStage::backward, workspace,
                             pass_copy_bytes(ConvDirection::backward_data, dx.numel(), w.numel(),
                                             dy.numel(), copy));
  const Tensor dys = bf16 ? m.copies.rounded(dy) : dy;
  const Tensor wk = copy ? m.copies.filter(w, bf16) : bf16 ? m.copies.rounded(w) : w;
  p.backward_data(dys, wk, dx, m.scratch);
  if (bf16) round_to_bf16_in_place(threads_, dx.f32(), dx.numel());
}
// dw is rounded to bf16 once, as cuDNN's bf16 filter gradient writes it (and PyTorch's autocast
// keeps it); db stays fp32 and sums the rounded dy, the tensor a bf16 network holds.
void CpuBackend::conv_backward_filter_impl(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                           const Tensor& dw, const Tensor* db,
                                           const Tensor* workspace) {
  auto& p = static_cast<CpuConvPlan&>(plan);
  const bool bf16 = precision_ == Precision::bf16;
  const bool copy = copies_filter(p, dw.layout, ConvDirection::backward_filter);
  PassMemory m = pass_memory(plan, ConvStage::backward, workspace,
                             pass_copy_bytes(ConvDirection::backward_filter, x.numel(), dw.numel(),
                                             dy.numel(), copy));
  const Tensor xs = bf16 ? m.copies.rounded(x) : x, dys = bf16 ? m.copies.rounded(dy) : dy;
  if (!copy) {
    p.backward_filter(xs, dys, dw, db, m.scratch);
    if (bf16) round_to_bf16_in_place(threads_, dw.f32(), dw.numel());
    return;
  }
  // Computed in (K, C, R, S) order, then transposed (and rounded) into the (K, R, S, C) dw.
  const Tensor dw_kcrs = m.copies.room_nchw(dw);
  p.backward_filter(xs, dys, dw_kcrs, db, m.scratch);
  transpose_filter(dw_kcrs.f32(), dw.f32(), dw.shape, false, bf16);
}

// ---- linear: bf16 around the fp32 passes (linear_cpu.cpp) ------------------------------------

void CpuBackend::prepare_linear_impl(int64_t max_batch, int64_t in, int64_t out) {
  if (precision_ == Precision::bf16)
    copy_scratch_->reserve(OperandCopies::bytes_for(max_batch * in, out * in, max_batch * out));
}

// x (N,IN), w (OUT,IN), b (OUT) or null -> y (N,OUT). A packed copy of w (w_bf16) goes unread,
// as the convolutions' does: the GEMM takes fp32 operands, rounded here.
void CpuBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor* b,
                                     const Tensor& y, bool relu, const Tensor* /*w_bf16*/) {
  if (precision_ == Precision::fp32) {
    linear_forward_fp32(x, w, b, y);
  } else {
    copy_scratch_->reserve(OperandCopies::bytes_for(x.numel(), w.numel()));
    OperandCopies copies(*copy_scratch_, threads_);
    const Tensor xr = copies.rounded(x), wr = copies.rounded(w);
    linear_forward_fp32(xr, wr, b, y);
    round_to_bf16_in_place(threads_, y.f32(), y.numel());
  }
  if (relu) relu_forward_impl(y, y);  // relu_forward's values, in place
}

// x (N,IN), w (OUT,IN), dy (N,OUT) -> dx (N,IN) or null, dw (OUT,IN), db (OUT) or null
void CpuBackend::linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy,
                                      const Tensor* dx, const Tensor& dw, const Tensor* db,
                                      const Tensor* /*w_bf16*/) {
  if (precision_ == Precision::fp32) return linear_backward_fp32(x, w, dy, dx, dw, db);
  copy_scratch_->reserve(OperandCopies::bytes_for(x.numel(), w.numel(), dy.numel()));
  OperandCopies copies(*copy_scratch_, threads_);
  // w is read only for dx: without it, the fp32 w goes along unread.
  const Tensor xr = copies.rounded(x), wr = dx ? copies.rounded(w) : w, dyr = copies.rounded(dy);
  linear_backward_fp32(xr, wr, dyr, dx, dw, db);
  if (dx) round_to_bf16_in_place(threads_, dx->f32(), dx->numel());
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace dp::cpu
