#pragma once
// The CPU backend: the readable reference every other backend is tested against.
// GEMM-shaped work (convolution through im2col, linear) goes to CBLAS; the rest is plain loops
// parallelised with OpenMP over this replica's threads. The op bodies live in one file per
// concern (conv_cpu.cpp, linear_cpu.cpp, batchnorm_cpu.cpp, pool_cpu.cpp, elementwise_cpu.cpp,
// loss_cpu.cpp, data_cpu.cpp); this header holds the class and the checks they share.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dp/backend.hpp"
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
/// What the cpu backend does not implement: ops written for NCHW refuse NHWC with an error that
/// names the op and the layout ("use nchw, or the cuda backend").
void expect_nchw(const Tensor& t, const char* op, const char* what);

/// Convolution scratch, allocated once by plan_conv for max_batch and the backend's thread
/// count, so conv_forward/backward never allocate. Images are processed in chunks of
/// `chunk` so the GEMM's N dimension (chunk * P * Q) is large enough to run near peak; each
/// thread owns one set of buffers.
class CpuConvPlan : public ConvPlan {
 public:
  CpuConvPlan(const ConvGeometry& g, int threads, std::shared_ptr<MemoryTracker> memory);
  ~CpuConvPlan() override;
  CpuConvPlan(const CpuConvPlan&) = delete;
  CpuConvPlan& operator=(const CpuConvPlan&) = delete;

  int threads() const { return threads_; }
  int64_t chunk() const { return chunk_; }
  /// (C*R*S, chunk*P*Q): the unfolded input of one chunk.
  float* columns(int thread) const { return columns_ + thread * columns_stride_; }
  /// (K, chunk*P*Q): the output (forward) or output gradient (backward) of one chunk.
  float* outputs(int thread) const { return outputs_ + thread * outputs_stride_; }
  /// (K*C*R*S + K): this thread's partial filter and bias gradient.
  float* filter_partial(int thread) const { return partials_ + thread * partials_stride_; }

 private:
  std::shared_ptr<MemoryTracker> memory_;
  int threads_ = 1;
  int64_t chunk_ = 1;
  float* columns_ = nullptr;
  float* outputs_ = nullptr;
  float* partials_ = nullptr;
  int64_t columns_stride_ = 0, outputs_stride_ = 0, partials_stride_ = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device{DeviceKind::cpu, 0}; }
  std::string device_description() const override;
  int threads() const { return threads_; }

  void* allocate(size_t bytes) override;
  void release(void* p) noexcept override;
  size_t memory_in_use() const override;
  size_t peak_memory() const override;
  void synchronize() override {}

 private:
  // The ops (see dp::Backend); arguments are checked before these run. One file per concern.
  void upload_impl(void* dst, const void* host_src, size_t bytes) override;
  void download_impl(void* host_dst, const void* src, size_t bytes) override;
  void copy_impl(void* dst, const void* src, size_t bytes) override;
  void fill_impl(const Tensor& t, float value) override;

  std::unique_ptr<ConvPlan> plan_conv_impl(const ConvGeometry& g, const ConvUse& use) override;
  void conv_forward_impl(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                         const Tensor& y) override;
  void conv_backward_data_impl(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                               const Tensor& dx) override;
  void conv_backward_filter_impl(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor* db) override;

  void linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor* b,
                           const Tensor& y) override;
  void linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                            const Tensor& dw, const Tensor* db) override;

  void batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    float momentum, float eps, const Tensor& save_mean,
                                    const Tensor& save_invstd, const Tensor& y) override;
  void batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    float eps, const Tensor& y) override;
  void batchnorm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                               const Tensor& save_mean, const Tensor& save_invstd, float eps,
                               const Tensor& dx, const Tensor& dgamma,
                               const Tensor& dbeta) override;

  void batchnorm_sums_impl(const Tensor& x, const Tensor* mean, const Tensor& sums) override;
  void batchnorm_apply_stats_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& mean, const Tensor& var,
                                  const Tensor& running_mean, const Tensor& running_var,
                                  float momentum, float eps, int64_t count,
                                  const Tensor& save_mean, const Tensor& save_invstd,
                                  const Tensor& y) override;
  void batchnorm_backward_sums_impl(const Tensor& x, const Tensor& dy, const Tensor& save_mean,
                                    const Tensor& save_invstd, const Tensor& sums) override;
  void batchnorm_backward_apply_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                     const Tensor& save_mean, const Tensor& save_invstd,
                                     const Tensor& sums, int64_t count, const Tensor& dx) override;

  void relu_forward_impl(const Tensor& x, const Tensor& y) override;
  void relu_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx) override;

  void avgpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) override;
  void avgpool_backward_impl(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) override;
  void maxpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) override;
  void maxpool_backward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                             const Tensor& dy, const Tensor& dx) override;
  void global_avgpool_forward_impl(const Tensor& x, const Tensor& y) override;
  void global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) override;

  void add_impl(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void scale_impl(const Tensor& t, float alpha) override;

  void softmax_cross_entropy_impl(const Tensor& logits, const Tensor& labels, float grad_scale,
                                  const Tensor& dlogits, const Tensor& loss_sum,
                                  const Tensor& correct) override;
  void count_correct_impl(const Tensor& logits, const Tensor& labels,
                          const Tensor& correct) override;

  void sgd_update_impl(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                       const SgdParams& p) override;
  void adamw_update_impl(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, const AdamWParams& p) override;

  void gather_batch_impl(const Tensor& images, const Tensor& labels, const Tensor& indices,
                         const Tensor& x, const Tensor& y) override;

  int threads_ = 1;
  std::shared_ptr<MemoryTracker> memory_;
};

/// Threads for a loop of `work` cheap elementwise operations: 1 below a size where waking the
/// team costs more than it saves.
inline int threads_for(int64_t work, int threads) { return work < (1 << 16) ? 1 : threads; }

/// The i-th of `parts` contiguous, nearly equal ranges of [0, n).
inline void split_range(int64_t n, int parts, int i, int64_t& begin, int64_t& end) {
  begin = n * i / parts;
  end = n * (i + 1) / parts;
}

}  // namespace dp::cpu
