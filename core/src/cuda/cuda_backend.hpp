#pragma once
// The CUDA backend: one per replica, bound to one device. Every op is enqueued on the replica's
// own non-blocking stream (cuDNN and cuBLAS handles are bound to it) and never waits for the
// GPU; only upload/download/synchronize block. Convolutions and batch norm go to cuDNN (legacy
// API), linear layers to cuBLAS, the rest to our kernels (kernels.cuh).
//
// Memory: allocate() is cudaMalloc, counted (in use, peak). The backend's own scratch (the cuDNN
// workspace shared by all convolution plans, filter-transpose and reduction scratch) is grown
// only in plan_conv and counted too, so the step loop never allocates.
//
// The op bodies live in one file per concern: cuda_backend.cpp (memory, elementwise, pooling,
// loss, optimizer, data), cuda_conv.cpp (convolution plans), cuda_dnn.cpp (batch norm, linear).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dp/backend.hpp"
#include "dp/tensor.hpp"

namespace dp::cuda {

/// Logical (N, C, H, W) of an activation; a rank-2 (N, C) tensor is (N, C, 1, 1).
struct Dims {
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t hw() const { return h * w; }
};

class CudnnConvPlan;
struct ConvBatch;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return {DeviceKind::cuda, device_}; }
  std::string device_description() const override { return description_; }

  void* allocate(size_t bytes) override;
  void release(void* p) noexcept override;
  size_t memory_in_use() const override;
  size_t peak_memory() const override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill(const Tensor& t, float value) override;
  void synchronize() override;

  std::unique_ptr<ConvPlan> plan_conv(const ConvGeometry& g) override;
  void conv_forward(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                    const Tensor& y) override;
  void conv_backward_data(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                          const Tensor& dx) override;
  void conv_backward_filter(ConvPlan& plan, const Tensor& x, const Tensor& dy, const Tensor& dw,
                            const Tensor* db) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                       const Tensor& dw, const Tensor* db) override;

  void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var,
                               float momentum, float eps, const Tensor& save_mean,
                               const Tensor& save_invstd, const Tensor& y) override;
  void batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               const Tensor& y) override;
  void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                          const Tensor& dgamma, const Tensor& dbeta) override;

  void relu_forward(const Tensor& x, const Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override;

  void avgpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) override;
  void avgpool_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) override;
  void maxpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) override;
  void maxpool_backward(const PoolGeometry& g, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx) override;
  void global_avgpool_forward(const Tensor& x, const Tensor& y) override;
  void global_avgpool_backward(const Tensor& dy, const Tensor& dx) override;

  void add(const Tensor& a, const Tensor& b, const Tensor& y) override;
  void scale(const Tensor& t, float alpha) override;

  void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                             const Tensor& dlogits, const Tensor& loss_sum,
                             const Tensor& correct) override;
  void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct) override;

  void sgd_update(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                  const SgdParams& p) override;

  void gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices,
                    const Tensor& x, const Tensor& y) override;

  // ---- for the communicators ----------------------------------------------------------------
  int device_index() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  /// Makes this backend's device current on the calling thread (replicas run on their own
  /// threads, and the CUDA runtime's current device is per thread).
  void activate() const;

 private:
  void teardown() noexcept;
  // Scratch shared by every plan, grown only at plan time (cuda_conv.cpp).
  void reserve_workspace(size_t bytes);
  void reserve_filter_scratch(size_t floats);
  void reserve_reduce_scratch(size_t floats);
  /// Per-batch-size cuDNN state of a plan; created on first use of a batch size, choosing
  /// algorithms that fit the workspace reserved at plan time (no device allocation).
  ConvBatch& conv_batch(CudnnConvPlan& plan, int64_t n, bool at_plan_time);
  void choose_algorithms(CudnnConvPlan& plan, ConvBatch& b, size_t workspace_limit);
  /// The (K, R, S, C) filter cuDNN needs for NHWC activations, transposed into scratch.
  const float* filter_for(const CudnnConvPlan& plan, const Tensor& w);
  /// Sets the backend's scratch descriptors for a batch-norm input (NCHW or NHWC; rank 2 is
  /// (N, C, 1, 1)) and its per-channel parameters.
  void set_bn_descriptors(const Dims& d, Layout layout);

  int device_ = 0;
  bool allow_tf32_ = true;
  std::string description_;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;

  mutable std::mutex memory_mutex_;
  std::unordered_map<void*, size_t> sizes_;
  size_t in_use_ = 0;
  size_t peak_ = 0;

  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  float* filter_scratch_ = nullptr;  // two filters: the transposed input and the KRSC gradient
  size_t filter_scratch_floats_ = 0;
  float* reduce_scratch_ = nullptr;  // partial sums of the bias-gradient reduction
  size_t reduce_scratch_floats_ = 0;

  cudnnTensorDescriptor_t bn_x_desc_ = nullptr;
  cudnnTensorDescriptor_t bn_param_desc_ = nullptr;
  /// eps of each batch-norm layer's last training forward, keyed by its save_invstd buffer
  /// (cuDNN's backward takes eps; the interface's backward does not).
  std::unordered_map<const void*, float> bn_eps_;
};

/// Logical dims of a rank-4 (or, when allowed, rank-2) f32 activation; throws dp::Error naming
/// the op and argument otherwise.
Dims activation_dims(const Tensor& t, const char* op, const char* what, bool allow_rank2 = false);
void expect_f32(const Tensor& t, const char* op, const char* what);
void expect_numel(const Tensor& t, int64_t numel, const char* op, const char* what);
void expect_same_layout(const Tensor& a, const Tensor& b, const char* op);
/// "cuda backend: <op>: <message>"
[[noreturn]] void fail(const char* op, const std::string& message);

}  // namespace dp::cuda
