#pragma once
// The backend interface: every numeric op the engine needs, forward and backward, on one device.
// One Backend instance per replica. On GPU backends every op is asynchronous on the replica's
// compute stream; only download() and synchronize() wait. The CPU backend is the readable
// reference the CUDA backend is tested against.
//
// Conventions for every op:
//  - Shapes are logical (N, C, H, W) for activations whatever the layout; x.layout says the memory
//    order. A backend that does not support a layout or dtype throws dp::Error naming it.
//  - Outputs are passed as const Tensor& (a Tensor is a view; the data it points to is written).
//  - Gradients of parameters are overwritten, not accumulated (each parameter is used once per
//    step in every model we build; Residual sums its branches explicitly).
//  - Unless stated, outputs must not alias inputs.
#include <cstddef>
#include <memory>
#include <string>

#include "dp/tensor.hpp"

namespace dp {

/// A 2-D convolution with its shapes fixed at setup. Output size follows PyTorch:
/// P = (H + 2*pad_h - kernel_h) / stride_h + 1 (floor), Q likewise.
struct ConvGeometry {
  int64_t max_batch = 1;  // largest N the plan will see
  int64_t in_channels = 1, in_h = 1, in_w = 1;
  int64_t out_channels = 1;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  Layout layout = Layout::nchw;
  DType dtype = DType::f32;

  int64_t out_h() const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
  std::string str() const;
};

/// Per-shape state a backend keeps for one convolution (chosen algorithms, workspace sizes,
/// descriptors, scratch buffers). Created once at setup; reused every step.
class ConvPlan {
 public:
  explicit ConvPlan(const ConvGeometry& g) : geometry_(g) {}
  virtual ~ConvPlan() = default;
  const ConvGeometry& geometry() const { return geometry_; }

 private:
  ConvGeometry geometry_;
};

/// Pooling window. Output size: (H + 2*pad - kernel) / stride + 1 (floor), as PyTorch.
/// Average pooling counts padded positions in the divisor (PyTorch's count_include_pad=True).
struct PoolGeometry {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
  int64_t out_h(int64_t in_h) const { return (in_h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w(int64_t in_w) const { return (in_w + 2 * pad_w - kernel_w) / stride_w + 1; }
};

/// PyTorch's SGD: g += weight_decay * p; buf = momentum * buf + g (buf starts at 0); p -= lr * buf.
/// With momentum == 0 no buffer is used: p -= lr * g.
struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;                // "cpu" or "cuda"
  virtual Device device() const = 0;                   // where this backend's memory lives
  virtual std::string device_description() const = 0;  // "NVIDIA H100 80GB HBM3", "CPU (2 threads)"

  // ---- memory (allocation happens only at setup, never in the step loop) -----------------------
  virtual void* allocate(size_t bytes) = 0;  // aligned to at least 256 bytes; throws on failure
  virtual void release(void* p) noexcept = 0;
  /// Bytes currently allocated through allocate(), and the most ever at once (library
  /// workspaces included where the backend can see them).
  virtual size_t memory_in_use() const = 0;
  virtual size_t peak_memory() const = 0;
  /// Host -> device, blocking.
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  /// Device -> host, blocking: waits for all queued work first.
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  /// Device -> device on this backend, asynchronous.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  /// Every element of t = value (f32 or i32; for i32 value is converted).
  virtual void fill(const Tensor& t, float value) = 0;
  /// Waits until all queued work on this backend has finished.
  virtual void synchronize() = 0;

  // ---- convolution: x (N,C,H,W), w (K,C,R,S), b (K) -> y (N,K,P,Q) ---------------------------
  virtual std::unique_ptr<ConvPlan> plan_conv(const ConvGeometry& g) = 0;
  /// y = conv(x, w) + b; b may be null.
  virtual void conv_forward(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                            const Tensor& y) = 0;
  /// dx (N,C,H,W) = conv_transpose(dy (N,K,P,Q), w).
  virtual void conv_backward_data(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                                  const Tensor& dx) = 0;
  /// dw (K,C,R,S) = sum_n corr(x, dy); db (K) = sum_{n,p,q} dy (db may be null). Overwrites.
  virtual void conv_backward_filter(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                    const Tensor& dw, const Tensor* db) = 0;

  // ---- linear: x (N,IN), w (OUT,IN) (PyTorch nn.Linear layout), b (OUT) -> y (N,OUT) -----------
  /// y = x w^T + b; b may be null.
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b,
                              const Tensor& y) = 0;
  /// dx (N,IN) = dy w (skipped when dx is null); dw (OUT,IN) = dy^T x; db (OUT) = sum_n dy
  /// (skipped when db is null). Overwrites.
  virtual void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                               const Tensor* dx, const Tensor& dw, const Tensor* db) = 0;

  // ---- batch norm over (N,C,H,W) per channel (or (N,C) per feature) ---------------------------
  /// Training: normalise with this batch's mean and biased variance; update running stats as
  /// PyTorch does (running = (1-momentum)*running + momentum*stat, the variance unbiased by
  /// n/(n-1) where n = N*H*W); save_mean, save_invstd (C) = mean and 1/sqrt(var_biased + eps)
  /// for the backward pass. y = gamma * (x - mean) * invstd + beta.
  virtual void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       float momentum, float eps, const Tensor& save_mean,
                                       const Tensor& save_invstd, const Tensor& y) = 0;
  /// Inference: y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta.
  virtual void batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       float eps, const Tensor& y) = 0;
  /// Gradients of the training-mode forward. dx (N,C,H,W); dgamma, dbeta (C). Overwrites.
  virtual void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                  const Tensor& save_mean, const Tensor& save_invstd,
                                  const Tensor& dx, const Tensor& dgamma,
                                  const Tensor& dbeta) = 0;

  // ---- activation --------------------------------------------------------------------------
  /// y = max(x, 0); NaN stays NaN (as PyTorch). y may alias x.
  virtual void relu_forward(const Tensor& x, const Tensor& y) = 0;
  /// dx = dy where y > 0, else 0. dx may alias dy.
  virtual void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;

  // ---- pooling: x (N,C,H,W) -> y (N,C,P,Q) -------------------------------------------------------
  virtual void avgpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) = 0;
  virtual void avgpool_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) = 0;
  /// Max pooling; padded positions never win. Ties go to the first maximum in window order
  /// (row-major), which backward routes the gradient to. The first NaN of a window wins over
  /// any number (NaN propagates, as PyTorch's).
  virtual void maxpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) = 0;
  virtual void maxpool_backward(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                                const Tensor& dy, const Tensor& dx) = 0;
  /// x (N,C,H,W) -> y (N,C,1,1): the mean over H*W.
  virtual void global_avgpool_forward(const Tensor& x, const Tensor& y) = 0;
  /// dy (N,C,1,1) -> dx (N,C,H,W) = dy / (H*W).
  virtual void global_avgpool_backward(const Tensor& dy, const Tensor& dx) = 0;

  // ---- elementwise (same shape and layout) ----------------------------------------------------
  /// y = a + b; y may alias a or b.
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  /// t *= alpha.
  virtual void scale(const Tensor& t, float alpha) = 0;

  // ---- loss and metrics -------------------------------------------------------------------------
  /// Softmax cross-entropy with its gradient and the count of correct predictions, in one pass.
  /// logits (N,K) f32, labels (N) i32 in [0,K).
  /// dlogits (N,K) = (softmax(logits) - onehot(labels)) * grad_scale
  ///   (grad_scale = 1 / global batch size gives the mean loss over the global batch).
  /// loss_sum (1) f32 = sum over n of -log softmax(logits)[n, label]  (written, not accumulated).
  /// correct (1) i32 = #n with argmax(logits[n]) == label (first maximum wins).
  virtual void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                                     const Tensor& dlogits, const Tensor& loss_sum,
                                     const Tensor& correct) = 0;
  /// correct (1) i32 = #n with argmax(logits[n]) == label (written, not accumulated).
  virtual void count_correct(const Tensor& logits, const Tensor& labels,
                             const Tensor& correct) = 0;

  // ---- optimizer ------------------------------------------------------------------------------
  /// One SGD step over flat buffers of equal length. momentum_buf may be null when
  /// p.momentum == 0.
  virtual void sgd_update(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                          const SgdParams& p) = 0;

  // ---- data -------------------------------------------------------------------------------------
  /// Gathers examples by index from a dataset resident in this backend's memory.
  /// images (M,C,H,W) u8, labels (M) u8, indices (n) i32 -> x (n,C,H,W) f32 = image / 255 in
  /// x.layout, y (n) i32 = label.
  virtual void gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices,
                            const Tensor& x, const Tensor& y) = 0;
};

enum class BackendKind { cpu, cuda };
const char* backend_kind_name(BackendKind k);

struct BackendOptions {
  BackendKind kind = BackendKind::cpu;
  int device_index = 0;  // CUDA device ordinal (among visible devices)
  int cpu_threads = 0;   // CPU backend: worker threads for this replica (0: all hardware threads)
  bool allow_tf32 = true;  // CUDA: tensor-core TF32 for fp32 convolutions and GEMMs
};

/// Creates a backend. Throws dp::Error when the kind is not available in this build
/// ("dprun was built without CUDA") or the device does not exist.
std::unique_ptr<Backend> create_backend(const BackendOptions& options);

/// True when libdpcore was compiled with the CUDA backend.
bool cuda_compiled();
/// Number of visible CUDA devices; 0 when not compiled with CUDA or no driver/device
/// (never throws). Initialises the CUDA driver: the runner process never calls this.
int cuda_device_count();
/// Device name ("NVIDIA H100 80GB HBM3"); throws when the device does not exist.
std::string cuda_device_name(int index);

}  // namespace dp
