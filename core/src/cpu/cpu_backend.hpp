#pragma once
// The CPU backend: the readable reference every other backend is tested against.
// GEMM-shaped work (convolution, linear) goes to the kernels selected by dp::CpuKernels (oneDNN,
// or im2col + OpenBLAS); the rest is plain loops parallelised with OpenMP over this replica's
// threads. The op bodies live in one file per
// concern (conv_cpu.cpp, linear_cpu.cpp, batchnorm_cpu.cpp, pool_cpu.cpp, elementwise_cpu.cpp,
// loss_cpu.cpp, data_cpu.cpp); this header holds the class and the checks they share.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dp/backend.hpp"
#include "dp/conv_contract.hpp"
#include "dp/tensor.hpp"

namespace dp::cpu {

/// Creates a CpuBackend (the factory's entry point).
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

/// Counts the bytes a backend has allocated. Shared (shared_ptr) between the backend and its
/// convolution plans, so a plan that outlives its backend still releases its scratch safely.
class MemoryTracker {
 public:
  ~MemoryTracker();
  /// Zero-initialised, 256-byte aligned; throws dp::Error when the system is out of memory.
  void* allocate(size_t bytes);
  void release(void* p) noexcept;
  size_t in_use() const;
  size_t peak() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

/// Logical (N, C, H, W) of an activation; a rank-2 (N, C) tensor is (N, C, 1, 1).
struct Dims {
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t hw() const { return h * w; }
  int64_t chw() const { return c * h * w; }
};

/// The logical dims of an activation the public op already checked (rank 4, or rank 2 as
/// (N, C, 1, 1)).
inline Dims dims_of(const Tensor& t) {
  if (t.shape.rank == 2) return Dims{t.shape[0], t.shape[1], 1, 1};
  return Dims{t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
}
/// The window of pooling output (op, oq) clipped to the input: rows [h0, h1), columns [w0, w1).
struct PoolWindow {
  int64_t h0, h1, w0, w1;
};
inline PoolWindow pool_window(const PoolGeometry& g, const Dims& d, int64_t op, int64_t oq) {
  const int64_t h0 = op * g.stride_h - g.pad_h;
  const int64_t w0 = oq * g.stride_w - g.pad_w;
  return PoolWindow{std::max<int64_t>(h0, 0), std::min(h0 + g.kernel_h, d.h),
                    std::max<int64_t>(w0, 0), std::min(w0 + g.kernel_w, d.w)};
}

/// True for a rank-4 activation in NHWC (a rank-2 (N, C) tensor has one layout only).
inline bool is_nhwc(const Tensor& t) { return t.shape.rank == 4 && t.layout == Layout::nhwc; }

/// A batch norm's epilogue (dp::BnEpilogue) as the loops use it: residual may be null.
struct Epilogue {
  const float* residual = nullptr;
  bool relu = false;
  explicit Epilogue(const BnEpilogue& e)
      : residual(e.residual != nullptr ? e.residual->f32() : nullptr), relu(e.relu) {}
};
/// Its gradient (dp::BnEpilogueGrad): y null when there is no ReLU, and then dz is unused.
struct EpilogueGrad {
  const float* y = nullptr;
  float* dz = nullptr;
  explicit EpilogueGrad(const BnEpilogueGrad& e)
      : y(e.y != nullptr ? e.y->f32() : nullptr), dz(e.dz != nullptr ? e.dz->f32() : nullptr) {}
};
/// The epilogue applied to a normalised value v at element i: the same float operations as add
/// then relu_forward (NaN stays NaN). Inlined into the loops of each instruction set.
[[gnu::always_inline]] inline float finish(float v, const float* residual, int64_t i, bool relu) {
  if (residual != nullptr) v = v + residual[i];
  return relu && v < 0.0f ? 0.0f : v;
}
/// The ReLU's mask on a gradient, as relu_backward: dy where the output y > 0, else 0.
[[gnu::always_inline]] inline float masked(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// The NHWC versions of the pooling and batch-norm ops (pool_nhwc_cpu.cpp, batchnorm_nhwc_cpu.cpp),
// called by the ops for NHWC tensors; arguments as the Backend ops', already checked.
void avgpool_forward_nhwc(int threads, const PoolGeometry& g, const Tensor& x, const Tensor& y);
void avgpool_backward_nhwc(int threads, const PoolGeometry& g, const Tensor& dy, const Tensor& dx);
void maxpool_forward_nhwc(int threads, const PoolGeometry& g, const Tensor& x, const Tensor& y);
void maxpool_backward_nhwc(int threads, const PoolGeometry& g, const Tensor& x, const Tensor& y,
                           const Tensor& dy, const Tensor& dx);
void global_avgpool_forward_nhwc(int threads, const Tensor& x, const Tensor& y);
void global_avgpool_backward_nhwc(int threads, const Tensor& dy, const Tensor& dx);
void batchnorm_forward_train_nhwc(int threads, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, const Tensor& running_mean,
                                  const Tensor& running_var, float momentum, float eps,
                                  const Tensor& save_mean, const Tensor& save_invstd,
                                  const Tensor& y, Epilogue epilogue);
void batchnorm_forward_infer_nhwc(int threads, const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, const Tensor& running_mean,
                                  const Tensor& running_var, float eps, const Tensor& y,
                                  Epilogue epilogue);
void batchnorm_backward_nhwc(int threads, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                             const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                             const Tensor& dgamma, const Tensor& dbeta);

/// Scratch shared by all convolution plans of one backend (oneDNN's reordered arguments and
/// scratchpads, im2col's columns, the Winograd transforms): a replica runs one op at a time, so
/// one buffer sized for the largest pass serves them all. It grows when a plan without a planned
/// workspace is made, or when a pass not declared at plan time needs more than it was given
/// (then also for a plan with one); the plans keep it alive, and it is released with the last
/// of them.
class SharedScratch {
 public:
  explicit SharedScratch(std::shared_ptr<MemoryTracker> memory) : memory_(std::move(memory)) {}
  ~SharedScratch() { memory_->release(data_); }
  SharedScratch(const SharedScratch&) = delete;
  SharedScratch& operator=(const SharedScratch&) = delete;
  /// At least `bytes`, 256-byte aligned; the contents are not kept when it grows.
  void reserve(size_t bytes);
  char* data() const { return static_cast<char*>(data_); }
  size_t size() const { return bytes_; }

 private:
  std::shared_ptr<MemoryTracker> memory_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

struct OnednnContext;  // onednn.hpp: kept out of this header, which every op file includes
class OperandCopies;   // bf16_cpu.hpp
class CpuConvPlan;     // conv_plans.hpp

/// The row a StepRow's (or a slot's) cursor points at when the op runs; throws "cpu backend:
/// <op>: ..." when it is outside [0, rows).
int64_t step_row_index(const Tensor& cursor, int64_t rows, const char* op, const char* what);
template <class T>
const T* step_row_at(const StepRow& row, const char* op, const char* what) {
  const int64_t at = step_row_index(row.cursor, row.table.shape[0], op, what);
  return static_cast<const T*>(row.table.data) + at * row.table.shape[1];
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device{DeviceKind::cpu, 0}; }
  std::string device_description() const override;
  int threads() const { return threads_; }
  CpuKernels kernels() const { return kernels_; }
  Precision precision() const { return precision_; }

  void release(void* p) noexcept override;
  size_t memory_in_use() const override;
  size_t peak_memory() const override;

 private:
  void* allocate_impl(size_t bytes) override;
  void synchronize_impl() override {}
  // The ops (see dp::Backend); arguments are checked before these run. One file per concern.
  void upload_impl(void* dst, const void* host_src, size_t bytes) override;
  void download_impl(void* host_dst, const void* src, size_t bytes) override;
  void copy_impl(void* dst, const void* src, size_t bytes) override;
  void fill_impl(const Tensor& t, float value) override;

  std::unique_ptr<ConvPlan> plan_conv_impl(const ConvGeometry& g, const ConvUse& use) override;
  void prepare_linear_impl(int64_t max_batch, int64_t in, int64_t out) override;
  void conv_forward_impl(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                         const Tensor& y, const Tensor* workspace, const Tensor* w_bf16) override;
  void conv_backward_data_impl(ConvPlan& plan, const Tensor& dy, const Tensor& w, const Tensor& dx,
                               const Tensor* workspace, const Tensor* w_bf16) override;
  void conv_backward_filter_impl(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor* db,
                                 const Tensor* workspace) override;
  /// What a convolution pass of `stage` works in: the copies of its operands
  /// (OperandCopies: bf16's rounded multiplicands, a (K, R, S, C) filter's (K, C, R, S) copy or
  /// its gradient's room; `copy_bytes` of them, pass_copy_bytes) and the plan's scratch. A plan
  /// with a planned workspace has both in the caller's workspace, the copies first
  /// (copy_bytes); any other runs in the shared copy scratch, grown if a pass is larger than any
  /// planned, and the plans' shared scratch.
  struct PassMemory;
  PassMemory pass_memory(const ConvPlan& plan, ConvStage stage, const Tensor* workspace,
                         size_t copy_bytes);
  /// Whether a pass of `plan` in direction d reads a (K, C, R, S) copy of its (K, R, S, C)
  /// filter, or writes its gradient through one (CpuConvPlan::reads_stored_filter).
  static bool copies_filter(const CpuConvPlan& plan, Layout filter_layout, ConvDirection d);
  /// The bytes of the operand copies of one convolution pass on x, w and y of these element
  /// counts (for backward-data, dx and dy): bf16's rounded multiplicands (precision bf16), and
  /// with `filter_copy` the (K, C, R, S) copy of a (K, R, S, C) filter (forward, backward-data;
  /// in bf16 its rounded copy is it) or room for dw in that order (backward-filter). 0 in fp32
  /// without a filter copy.
  size_t pass_copy_bytes(ConvDirection pass, int64_t x, int64_t w, int64_t y,
                         bool filter_copy) const;
  /// The most bytes of operand copies the passes of `stage` of `plan` need at its largest
  /// batch, with filters in `filter_layout`: what a planned workspace of that stage starts with.
  size_t copy_bytes(const CpuConvPlan& plan, Layout filter_layout, ConvStage stage) const;

  void linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
                           bool relu, const Tensor* w_bf16) override;
  void linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                            const Tensor& dw, const Tensor* db, const Tensor* w_bf16) override;

  void batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    float momentum, float eps, const Tensor& save_mean,
                                    const Tensor& save_invstd, const Tensor& y,
                                    const BnEpilogue& epilogue) override;
  void batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    float eps, const Tensor& y,
                                    const BnEpilogue& epilogue) override;
  void batchnorm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                               const Tensor& save_mean, const Tensor& save_invstd, float eps,
                               const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                               const BnEpilogueGrad& epilogue) override;

  void batchnorm_sums_impl(const Tensor& x, const Tensor* mean, const Tensor& sums) override;
  void batchnorm_apply_stats_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& mean, const Tensor& var, const Tensor& running_mean,
                                  const Tensor& running_var, float momentum, float eps,
                                  int64_t count, const Tensor& save_mean, const Tensor& save_invstd,
                                  const Tensor& y, const BnEpilogue& epilogue) override;
  void batchnorm_backward_sums_impl(const Tensor& x, const Tensor& dy, const Tensor& save_mean,
                                    const Tensor& save_invstd, const Tensor& sums,
                                    const BnEpilogueGrad& epilogue) override;
  void batchnorm_backward_apply_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                     const Tensor& save_mean, const Tensor& save_invstd,
                                     const Tensor& sums, int64_t count, const Tensor& dx) override;

  void relu_forward_impl(const Tensor& x, const Tensor& y) override;
  void relu_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx) override;
  void relu_backward_bias_impl(const Tensor& y, const Tensor& dy, const Tensor& dx,
                               const Tensor& db) override;

  void avgpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) override;
  void avgpool_backward_impl(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) override;
  void maxpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) override;
  void maxpool_backward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                             const Tensor& dy, const Tensor& dx) override;
  void global_avgpool_forward_impl(const Tensor& x, const Tensor& y) override;
  void global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) override;

  void add_impl(const Tensor& a, const Tensor& b, const Tensor& y, float alpha) override;
  void scale_impl(const Tensor& t, float alpha) override;

  void softmax_cross_entropy_impl(const Tensor& logits, const Tensor& labels, float grad_scale,
                                  const Tensor& dlogits, const Tensor& loss_sum,
                                  const Tensor& correct, const Tensor* slot) override;
  void count_correct_impl(const Tensor& logits, const Tensor& labels, const Tensor& correct,
                          const Tensor* slot) override;

  void sgd_update_impl(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                       const SgdParams& p, const StepRow* lr_row,
                       const Tensor* params_bf16) override;
  void adamw_update_impl(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, const AdamWParams& p, const StepRow* step_row,
                         const Tensor* params_bf16) override;
  void pack_bf16_impl(const Tensor& x, const Tensor& y) override;
  void advance_impl(const Tensor& cursor) override;

  void gather_batch_impl(const Tensor& images, const Tensor& labels, const Tensor& indices,
                         const Tensor& x, const Tensor& y, const StepRow* start,
                         const GatherTransform* transform) override;
  void gather_transformed(const Tensor& images, const Tensor& labels, const int32_t* index,
                          int64_t first, const Tensor& x, const Tensor& y,
                          const GatherTransform& t);
  void* allocate_host_impl(size_t bytes) override;
  void release_host(void* p) noexcept override;
  uint64_t upload_async_impl(void* dst, const void* host_src, size_t bytes) override;
  void wait_upload_impl(uint64_t ticket) override { finish_uploads(ticket); }
  void await_upload_impl(uint64_t ticket) override { finish_uploads(ticket); }
  // Deferred uploads (DPRUN_CPU_DEFER_UPLOADS=1, for tests): copies in ticket order up to
  // `ticket`, reading their sources now.
  void finish_uploads(uint64_t ticket);

  /// The shared scratch of this backend's plans, made anew when no plan holds it.
  std::shared_ptr<SharedScratch> shared_scratch();
  /// Precision bf16: a batch norm's output y rounded to bf16 in place (after its epilogue; the
  /// contract of Backend::batchnorm_forward_train). Nothing in fp32.
  void round_batchnorm_output(const Tensor& y);
  /// The fp32 linear passes (the bf16 ones round around them).
  void linear_forward_fp32(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y);
  void linear_backward_fp32(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                            const Tensor& dw, const Tensor* db);

  int threads_ = 1;
  uint64_t uploads_ = 0;  // upload_async tickets given
  // With DPRUN_CPU_DEFER_UPLOADS=1, upload_async only records its copy, and wait_upload or
  // await_upload does it, reading the source then: the latest a GPU's copy stream may. A
  // caller that reads the destination before await_upload, or rewrites the source before
  // wait_upload, then computes other bits, which the streamed-data tests would see (on a GPU
  // it would be a race that may or may not show).
  struct PendingUpload {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t ticket;
  };
  bool defer_uploads_ = false;
  std::vector<PendingUpload> pending_uploads_;
  CpuKernels kernels_;               // resolved: onednn or blas
  std::string kernels_description_;  // "oneDNN 2.6.3 avx512_core_bf16", "OpenBLAS 0.3.21 SkylakeX"
  std::shared_ptr<OnednnContext> onednn_;  // with the oneDNN kernels only; plans share it
  std::shared_ptr<MemoryTracker> memory_;
  std::weak_ptr<SharedScratch> shared_scratch_;
  Precision precision_ = Precision::fp32;
  // The copies of a pass's operands (OperandCopies, bf16_cpu.hpp: bf16's rounded multiplicands,
  // (K, C, R, S) copies of (K, R, S, C) filters), reserved at plan_conv (for a plan without a
  // planned workspace, whose copies otherwise go there) and prepare_linear for the largest pass.
  // Separate from the plans' scratch, which the passes use while the copies are read.
  std::unique_ptr<SharedScratch> copy_scratch_;
};

/// The backend's own loops are compiled for three instruction sets, x86-64 (SSE2), x86-64-v3
/// (AVX2) and x86-64-v4 (AVX-512), and the dynamic loader runs the best one this CPU has (GCC's
/// target_clones, resolved by cpuid through an ifunc): like oneDNN's kernels, they are chosen by
/// what the CPU can do, not by the machine that built dprun. Floating-point contraction is off
/// for libdpcore (CMake), so the versions compute the same values; only `omp simd` reductions
/// sum in another order. Virtual functions cannot be cloned: the ops call free functions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DP_CPU_LOOPS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DP_CPU_LOOPS
#endif

/// Threads for a loop of `work` cheap elementwise operations: 1 below a size where waking the
/// team costs more than it saves.
inline int threads_for(int64_t work, int threads) { return work < (1 << 16) ? 1 : threads; }

/// The i-th of `parts` contiguous, nearly equal ranges of [0, n).
inline void split_range(int64_t n, int parts, int i, int64_t& begin, int64_t& end) {
  begin = n * i / parts;
  end = n * (i + 1) / parts;
}

}  // namespace dp::cpu
