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
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dp/tensor.hpp"

namespace dp {

class Backend;
struct GatherTransform;  // dp/augment.hpp

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

/// What a convolution plan will be used for, so a backend prepares exactly that before the step
/// loop (cuDNN: one algorithm per direction and batch size, chosen and sized at plan time; a
/// batch size first met mid-epoch would otherwise be planned mid-epoch). Every batch size must be
/// in [1, max_batch]. Empty lists mean: training at max_batch only. A call outside what was
/// declared still works; the backend may then prepare it on first use.
struct ConvUse {
  std::string layer;                   // for messages: "resnet_block2.0.conv1"
  std::vector<int64_t> train_batches;  // forward, backward-filter (and backward-data, see below)
  std::vector<int64_t> infer_batches;  // forward only (evaluation)
  bool input_grad = true;              // false: backward-data never runs (a model's first layer)
  /// The caller gives each pass its workspace (the `workspace` argument of the passes, 256-byte
  /// aligned) from memory it plans, as a Conv2d under the memory plan does: the backend then
  /// keeps no convolution workspace of its own for this plan (cuDNN's, the CPU's convolution
  /// scratch, bf16's rounded operand copies, the CPU's (K, C, R, S) copies of a (K, R, S, C)
  /// filter and its gradient; a pass nobody declared that needs more runs in the
  /// backend's own), and says how much each stage needs
  /// (ConvPlan::workspace_bytes). A workspace used only while one pass runs can share memory
  /// with buffers alive at other steps; one of the backend's own is held for the whole run.
  bool planned_workspace = false;
  /// Whether forward passes may be given a bias. false lets a backend run the forward on
  /// kernels that round their output themselves (precision bf16 on the GPU: cuDNN's bf16
  /// kernels, whose rounding the bias could no longer join), and a bias is then refused.
  bool forward_bias = true;
  /// Whether the output is read only by a batch norm's ops (a Conv2d whose output goes to a
  /// BatchNorm2d alone). A backend may then store it in a narrower type that its batch norm
  /// takes (Backend::batchnorm_takes): ConvPlan::output_dtype says which.
  bool output_to_batchnorm = false;
  /// The dtype of the x the forward and backward-filter passes are given: f32, or a type the
  /// backend's convolutions take (Backend::conv_takes; a batch norm's output stored narrower,
  /// for this convolution alone, BatchNorm2d::feeds, or for readers that all take it, such as
  /// the next residual block's conv1 and conv3: Module::set_input_dtype). ConvPlan::input_dtype.
  DType input_dtype = DType::f32;
  /// Whether the forward passes write relu(conv(x, w) + b) instead of conv(x, w) + b: a ReLU
  /// that alone reads the output is fused into the pass that writes it (a Conv2d followed by a
  /// ReLU, ReLU::fold_previous). The values are those of conv_forward then relu_forward (in
  /// precision bf16 the rounded sum's ReLU, itself a bf16 value). Refused with
  /// output_to_batchnorm (a batch norm reads the convolution's own output).
  bool output_relu = false;
  /// The memory order of the filter w and of its gradient dw (Tensor::layout of both): nchw,
  /// (K, C, R, S) as PyTorch keeps it; or, for a plan of NHWC activations only, nhwc, (K, R, S, C),
  /// the order NHWC kernels read (cuDNN's), which an NHWC model's Conv2d stores its weight in
  /// (ParamRegistry::layout). The values are the same either way; a (K, C, R, S) filter for
  /// NHWC activations costs the cuda backend a transposed copy per pass.
  Layout filter_layout = Layout::nchw;
};

/// The passes of a convolution that run together in a training step: forward (also in
/// evaluation), and backward (the data and filter gradients, one after the other).
enum class ConvStage { forward = 0, backward = 1 };

/// Per-shape state a backend keeps for one convolution (chosen algorithms, workspace sizes,
/// descriptors, scratch buffers). Created once at setup; reused every step.
class ConvPlan {
 public:
  explicit ConvPlan(const ConvGeometry& g) : geometry_(g) {}
  virtual ~ConvPlan() = default;
  const ConvGeometry& geometry() const { return geometry_; }
  /// What computes each pass, for logs and benchmarks: on the CPU per direction the formulation
  /// and kernel of each batch size ("forward: batch 256 blocked jit:avx2; backward-data: ...",
  /// or im2col / our Winograd), on the GPU the cuDNN algorithm chosen per batch size.
  virtual std::string implementation() const = 0;
  /// Made with ConvUse::planned_workspace: each pass takes its workspace from the caller.
  bool planned_workspace() const { return planned_workspace_; }
  /// With planned_workspace(): the bytes of workspace the passes of `stage` need at most, for
  /// every batch size declared in ConvUse (0: none); the two passes of backward share it. 0
  /// without it.
  size_t workspace_bytes(ConvStage stage) const {
    return workspace_bytes_[static_cast<int>(stage)];
  }
  /// Made with ConvUse::forward_bias: its forward passes take a bias.
  bool forward_bias() const { return forward_bias_; }
  /// The dtype of the forward passes' y: f32, or with ConvUse::output_to_batchnorm a type the
  /// backend's batch norm takes in this layout (the cuda backend in precision bf16, NHWC: the
  /// bf16 its cuDNN kernels write, the values of the f32 tensor that precision bf16 would hold,
  /// in half the memory and without a widening pass). The backward passes' dy has it too: the
  /// batch norm's dx, which takes its x's dtype (a bf16 dy holds the values precision bf16 rounds
  /// the output gradient to before it multiplies).
  DType output_dtype() const { return output_dtype_; }
  /// The dtype of the x its forward and backward-filter passes take (ConvUse::input_dtype).
  DType input_dtype() const { return input_dtype_; }
  /// Made with ConvUse::output_relu: its forward passes write the ReLU of the output.
  bool output_relu() const { return output_relu_; }
  /// The layout its passes' w and dw are in (ConvUse::filter_layout).
  Layout filter_layout() const { return filter_layout_; }

 private:
  friend class Backend;
  ConvGeometry geometry_;
  const Backend* owner_ = nullptr;  // set by Backend::plan_conv: a plan works with its backend only
  bool planned_workspace_ = false;
  bool forward_bias_ = true;
  DType output_dtype_ = DType::f32;
  DType input_dtype_ = DType::f32;
  bool output_relu_ = false;
  Layout filter_layout_ = Layout::nchw;
  size_t workspace_bytes_[2] = {0, 0};
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

/// PyTorch's SGD (dampening 0): g += weight_decay * p; buf = momentum * buf + g (buf starts at
/// 0); then p -= lr * buf, or with Nesterov p -= lr * (g + momentum * buf). With momentum == 0
/// no buffer is used: p -= lr * g.
struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;  // needs momentum > 0 (as PyTorch)
};

/// PyTorch's AdamW (amsgrad off): p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g;
/// v = beta2 v + (1 - beta2) g^2; p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 -
/// beta2^step) + eps). m and v start at 0; step counts from 1.
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  int64_t step = 1;
};

/// What a batch norm's output goes through before it is written (see the batch norm ops):
/// y = bn(x), + residual when given, then max(., 0) when relu. residual has x's shape and layout
/// and must not alias y.
struct BnEpilogue {
  const Tensor* residual = nullptr;
  bool relu = false;
  /// Around the batch norm's front rather than after it: the bias (C, f32) of the convolution
  /// whose output x is, left out of x (BatchNorm2d::fold_bias_of). Training adds momentum *
  /// conv_bias to the running mean after its update; inference normalises with running_mean -
  /// conv_bias (each the bits of Backend::add doing it). Only where batchnorm_folds_bias says so.
  const Tensor* conv_bias = nullptr;
};

/// The backward of an epilogue with relu (cuDNN's DReluForkDNorm): dy is the gradient of the
/// epilogue's output y; dz = dy where y > 0, else 0, is written, and the batch norm's gradients
/// are those of dz. dz is also the residual's gradient, which is why it is kept. Both tensors
/// have x's shape and layout; dz must not alias dy, y, x or dx. Without a relu the epilogue needs
/// nothing in backward: dy is the gradient of bn(x) and of the residual alike, so both are null.
struct BnEpilogueGrad {
  const Tensor* y = nullptr;   // the forward's output: its sign is the ReLU's mask
  const Tensor* dz = nullptr;  // written: the masked gradient
};

/// A per-step value an op reads from device memory when it runs, not from the host when it is
/// enqueued: row cursor[0] of table, table (rows, width) (the op says its dtype and width),
/// cursor (1) i32. A training step that takes everything that changes from step to step this
/// way (its shard's place in the epoch's permutation, its learning rate, its loss slot) and
/// advances the cursor itself (Backend::advance) is the same ops with the same arguments every
/// step, so one capture of it replays as every step (Backend::begin_capture). A cursor outside
/// [0, rows) is refused when the op runs on the cpu backend; on the cuda backend it makes the
/// op's values NaN (a gathered batch, an update) or writes nothing (a loss slot), as a kernel
/// cannot throw.
struct StepRow {
  Tensor table;
  Tensor cursor;
};

/// The per-step scalars of one AdamW update, as every backend computes them from AdamWParams
/// (double powers, then float): step_size = lr / (1 - beta1^step), decay = 1 - lr *
/// weight_decay, bias2_sqrt = sqrt(1 - beta2^step). A StepRow of AdamW holds these three.
struct AdamWStep {
  float step_size = 0.0f, decay = 1.0f, bias2_sqrt = 1.0f;
};
/// (adamw_step, which computes them, is the optimizer's: dp/optimizer.hpp.)

/// A step recorded by Backend::end_capture, for Backend::replay on the same backend.
class CapturedOps {
 public:
  virtual ~CapturedOps() = default;
  /// The ops recorded (backends that record them), or 0 where the backend does not count them
  /// (a CUDA graph).
  virtual size_t ops() const = 0;

 private:
  friend class Backend;
  const Backend* owner_ = nullptr;  // set by Backend::end_capture: it replays there only
};

/// The ops every backend provides. Each public op is non-virtual: it validates its arguments
/// once, for every backend alike (backend_checks.cpp), handles the empty cases (a batch of 0
/// examples) the same way everywhere, and only then calls the backend's *_impl. So two backends
/// accept exactly the same inputs and fail with the same message, prefixed by the backend's
/// name ("cpu backend: conv_forward: w has shape ..."). The checks cover dtypes, shapes, layouts
/// agreeing between arguments, null data (allowed only for tensors with no elements), tensors
/// living on this backend's device, and the scalar arguments' ranges. What a backend does not
/// implement (the cpu backend's NCHW-only convolution, pooling and batch norm) it refuses in its
/// *_impl with an error naming the op and what is unsupported. Values in device memory (labels,
/// gather indices) are checked where the backend can read them without waiting for the device:
/// the cpu backend throws on a label or index outside its range; the cuda backend cannot, and
/// marks the batch instead (NaN images, so the loss is NaN and the trial is recorded diverged).
class Backend {
 public:
  Backend();
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string name() const = 0;                // "cpu" or "cuda"
  virtual Device device() const = 0;                   // where this backend's memory lives
  virtual std::string device_description() const = 0;  // "NVIDIA H100 80GB HBM3", "CPU (2 threads)"

  // ---- memory (allocation happens only at setup, never in the step loop) -----------------------
  /// Aligned to at least 256 bytes; throws on failure (and while capturing: see begin_capture).
  void* allocate(size_t bytes);
  virtual void release(void* p) noexcept = 0;
  /// Bytes currently allocated through allocate(), and the most ever at once (library
  /// workspaces included where the backend can see them).
  virtual size_t memory_in_use() const = 0;
  virtual size_t peak_memory() const = 0;
  /// Host -> device, blocking.
  void upload(void* dst, const void* host_src, size_t bytes);
  /// Device -> host, blocking: waits for all queued work first.
  void download(void* host_dst, const void* src, size_t bytes);
  /// Host memory the device copies from asynchronously (upload_async): page-locked on a GPU
  /// (cudaHostAlloc), plain on the cpu. Not counted in memory_in_use(). Throws on failure.
  void* allocate_host(size_t bytes);
  virtual void release_host(void* p) noexcept = 0;
  /// Host -> device without waiting: the copy starts after every op called before it (so it
  /// may overwrite what they read), on a stream of its own on a GPU, so it overlaps the ops
  /// called after it until await_upload(ticket) orders them after it. host_src must come from
  /// allocate_host and stay unchanged until wait_upload(the returned ticket) returns. Tickets
  /// complete in the order they were given. cpu: copies at once. upload_async, wait_upload and
  /// await_upload are refused while capturing (host copies are not a step's ops).
  uint64_t upload_async(void* dst, const void* host_src, size_t bytes);
  /// Blocks the host until the upload of `ticket` (and every one before it) has finished.
  void wait_upload(uint64_t ticket);
  /// The ops called after this run after the upload of `ticket` (and every one before it) has
  /// finished; the host does not wait. 0: nothing to wait for.
  void await_upload(uint64_t ticket);
  /// Device -> device on this backend, asynchronous. dst == src is a no-op.
  void copy(void* dst, const void* src, size_t bytes);
  /// Every element of t = value (f32 or i32; for i32 value is converted).
  void fill(const Tensor& t, float value);
  /// Waits until all queued work on this backend has finished.
  void synchronize();

  // ---- step capture (CUDA graphs) ------------------------------------------------------------
  /// From begin_capture() until end_capture(), the ops called on this backend are recorded, not
  /// run; replay() then runs the recording, the same ops with the same arguments, as often as
  /// asked. cuda: the replica's stream is captured into a CUDA graph that replay launches whole
  /// (no host work inside a step; NCCL's collectives are captured with it). cpu: the checked ops
  /// are recorded with their arguments and replayed in order, which proves on any machine what a
  /// graph needs: that the step reads everything that changes between steps from device memory
  /// (StepRow). While capturing, what needs the host is refused with an error naming it:
  /// upload, download, synchronize, allocate, plan_conv, prepare_linear, prepare_batchnorm, a
  /// second begin_capture.
  /// release() must not be called either (it cannot throw: a recorded op would use freed
  /// memory, a CUDA capture is invalidated). After any error, discard_capture() ends the
  /// capture and the backend works as before.
  void begin_capture();
  std::unique_ptr<CapturedOps> end_capture();
  void discard_capture() noexcept;
  /// Runs a recording made by this backend.
  void replay(const CapturedOps& ops);
  bool capturing() const { return capturing_; }
  /// True when capture is the device's own (a CUDA graph: communicators' device work is captured
  /// with the ops); false when the backend records its ops and host work must be recorded
  /// through host_work (the cpu communicators, which sum on the host).
  virtual bool native_capture() const { return false; }
  /// Host work in this backend's op order: runs now, or while a recording backend captures, is
  /// recorded to run at that point of every replay. A backend with native capture refuses it
  /// while capturing (the host cannot run inside a graph).
  void host_work(std::function<void()> work);

  // ---- convolution: x (N,C,H,W), w (K,C,R,S), b (K) -> y (N,K,P,Q) ---------------------------
  // w and dw are in the plan's filter_layout (ConvUse::filter_layout): (K, C, R, S) or, for
  // NHWC activations, (K, R, S, C) in memory; the same values either way.
  /// Checks the geometry (and `use`) and prepares the plan; the plan works with this backend only.
  std::unique_ptr<ConvPlan> plan_conv(const ConvGeometry& g, const ConvUse& use = {});
  /// y = conv(x, w) + b (with ConvPlan::output_relu its ReLU); b may be null. x and y in the
  /// plan's layout, of its input_dtype and
  /// output_dtype (as conv_backward_filter's x and dy). workspace: a plan made
  /// with ConvUse::planned_workspace runs in it (at least workspace_bytes(forward) bytes; null
  /// when that is 0); any other plan takes none. w_bf16 (may be null): w rounded to bf16 and
  /// packed (bf16, w's shape and layout), which the caller keeps current (ParamRegistry's
  /// packed copy, written by the optimizer's update): a pass that would round w to bf16 (precision
  /// bf16) may read it instead, with the same values; nothing else reads it.
  void conv_forward(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                    const Tensor& y, const Tensor* workspace = nullptr,
                    const Tensor* w_bf16 = nullptr);
  /// Whether convolution plans take an x of `dtype` (ConvUse::input_dtype; f32: always; bf16:
  /// the cuda backend in precision bf16, whose passes round x to bf16 anyway, unless
  /// DPRUN_CUDA_BF16_CONV_OUTPUT=f32 keeps its activations f32).
  bool conv_takes(DType dtype) const;
  /// Whether this backend's convolution and linear passes read a weight's packed bf16 copy
  /// (conv_forward's and linear_forward's w_bf16) where one is given: the cuda backend in
  /// precision bf16, whose cuDNN and cuBLAS bf16 kernels take packed operands. Elsewhere a copy
  /// would go unread (the cpu backend's passes round fp32 operands of their own).
  bool reads_packed_weights() const { return reads_packed_weights_impl(); }
  /// dx (N,C,H,W) = conv_transpose(dy (N,K,P,Q), w). dy is of the plan's output_dtype (as are
  /// conv_backward_filter's); dx is f32 or of the plan's input_dtype (a bf16 dx holds the rounded
  /// values, for the batch norm whose output x is, BatchNorm2d::feeds). workspace: as
  /// conv_forward's, for backward; w_bf16 as conv_forward's.
  void conv_backward_data(ConvPlan& plan, const Tensor& dy, const Tensor& w, const Tensor& dx,
                          const Tensor* workspace = nullptr, const Tensor* w_bf16 = nullptr);
  /// dw (K,C,R,S) = sum_n corr(x, dy); db (K) = sum_{n,p,q} dy (db may be null; refused when the
  /// plan's output is not f32: such a plan has no bias). Overwrites; zero for a batch of 0
  /// examples. workspace: as conv_forward's, for backward.
  void conv_backward_filter(ConvPlan& plan, const Tensor& x, const Tensor& dy, const Tensor& dw,
                            const Tensor* db, const Tensor* workspace = nullptr);

  // ---- linear: x (N,IN), w (OUT,IN) (PyTorch nn.Linear layout), b (OUT) -> y (N,OUT) -----------
  /// Declares, at setup, a linear layer's largest shape, so a backend that needs scratch for it
  /// (precision bf16's rounded operand copies, on either backend) reserves it before the step
  /// loop. Optional: a call larger than declared still works, preparing then (on the cuda
  /// backend not while a step is being captured: it then fails, naming what to prepare).
  /// max_batch, in, out >= 1.
  void prepare_linear(int64_t max_batch, int64_t in, int64_t out);
  /// y = x w^T + b; b may be null. relu: y = relu(x w^T + b) in the same pass, the values of
  /// linear_forward then relu_forward (a Linear followed by a ReLU, ReLU::fold_previous).
  /// w_bf16 (may be null): w's packed bf16 copy, as conv_forward's: the GEMM of precision bf16
  /// may read it instead of rounding w, with the same values.
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
                      bool relu = false, const Tensor* w_bf16 = nullptr);
  /// dx (N,IN) = dy w (skipped when dx is null); dw (OUT,IN) = dy^T x; db (OUT) = sum_n dy
  /// (skipped when db is null). Overwrites; dw and db are zero for a batch of 0 examples.
  /// w_bf16 as linear_forward's (dx's GEMM is the only one that reads w).
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                       const Tensor& dw, const Tensor* db, const Tensor* w_bf16 = nullptr);

  // ---- batch norm over (N,C,H,W) per channel (or (N,C) per feature) ---------------------------
  // Every op that writes a batch norm's output takes a BnEpilogue: what the normalised value goes
  // through before it is written, in the same pass (cuDNN's NormAddRelu pattern), so a residual
  // block's bn -> add -> ReLU reads and writes its activations once. The ops that take the
  // gradient of that output take the matching BnEpilogueGrad. Fused or not, the values are those
  // of the separate ops: y = relu(bn(x) + residual) computed as bn(x) rounded to f32, plus the
  // residual rounded to f32, then max(., 0) (NaN stays NaN), which is what batch norm, add and
  // relu_forward compute one after the other.
  /// Declares, at setup, a batch norm's largest input ((N, C, H, W) or (N, C)) in its layout, so
  /// a backend that needs scratch for it (the cuda backend's channels-last kernels) reserves it
  /// before the step loop. Optional: a larger call than declared still works, preparing then,
  /// but not while a step is being captured.
  void prepare_batchnorm(const Shape& max_input, Layout layout);
  /// Whether the batch-norm ops take an (N, C, H, W) x, write a y, and add an epilogue residual,
  /// of `dtype` in `layout` (f32: always; bf16: the cuda backend's channels-last kernels, which
  /// widen x and the residual as they read them and round y as they write it; x, y and the
  /// residual choose apart). dx takes x's dtype (a bf16 dx is the fp32 gradient rounded to bf16,
  /// as the convolution that wrote x rounds its output gradient anyway). A bf16 y holds the
  /// epilogue's output packed: in precision bf16 the output is rounded to bf16 whatever its
  /// storage (see batchnorm_forward_train), so packing loses nothing, and the ReLU epilogue's
  /// backward takes the rounded y's sign as the mask in either storage. A bf16 residual is a
  /// packed earlier output (a residual block's identity shortcut).
  /// Everything else (dz, the per-channel vectors, dy but for batchnorm_backward's and
  /// batchnorm_backward_sums') stays f32.
  bool batchnorm_takes(DType dtype, Layout layout) const;
  /// Whether the batch norms of rank-4 x in `layout` take BnEpilogue::conv_bias (the cuda
  /// backend's channels-last kernels, in the passes they make anyway); elsewhere the caller adds
  /// the bias's share itself (Backend::add).
  bool batchnorm_folds_bias(Layout layout) const;
  /// Training: normalise with this batch's mean and biased variance; update running stats as
  /// PyTorch does (running = (1-momentum)*running + momentum*stat, the variance unbiased by
  /// n/(n-1) where n = N*H*W, which must be > 1); save_mean, save_invstd (C) = mean and
  /// 1/sqrt(var_biased + eps) for the backward pass. y = gamma * (x - mean) * invstd + beta.
  /// momentum in [0, 1], eps > 0. With an epilogue, y is its output. In precision bf16 y is
  /// rounded to bf16 (after the epilogue), as every op that writes a batch norm's output does:
  /// the activations a network's batch norms give its next layers are bf16 values, as autocast's
  /// bf16 batch norm writes them (Precision).
  void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var,
                               float momentum, float eps, const Tensor& save_mean,
                               const Tensor& save_invstd, const Tensor& y,
                               const BnEpilogue& epilogue = {});
  /// Inference: y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta.
  void batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               const Tensor& y, const BnEpilogue& epilogue = {});
  /// Gradients of the training-mode forward (the same eps). dx (N,C,H,W); dgamma, dbeta (C).
  /// Overwrites. With a ReLU epilogue, dy is the gradient of the epilogue's output and the
  /// gradients are those of the masked dz (see BnEpilogueGrad). dy is f32, or of the epilogue
  /// y's dtype (a bf16 y's gradient from the convolution it alone feeds, which rounds it).
  void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                          const Tensor& save_mean, const Tensor& save_invstd, float eps,
                          const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                          const BnEpilogueGrad& epilogue = {});

  // ---- batch norm with statistics over every replica (synchronised BN) ----------------------
  // One layer's training forward is: batchnorm_sums of x -> allreduce -> mean = sums / count;
  // batchnorm_sums of (x - mean)^2 -> allreduce -> var = sums / count; batchnorm_apply_stats.
  // Backward: batchnorm_backward_sums -> allreduce -> batchnorm_backward_apply. count is the
  // number of values per channel over every replica (> 1). On one replica this is what
  // batchnorm_forward_train and batchnorm_backward compute. x may hold N = 0 examples (a replica
  // with an empty shard still takes part in the sums).
  /// sums (C) = sum over N, H, W of x, or of (x - mean)^2 when mean (C) is given.
  void batchnorm_sums(const Tensor& x, const Tensor* mean, const Tensor& sums);
  /// With the batch's (global) mean and biased var (C): y = gamma * (x - mean) * invstd + beta,
  /// invstd = 1/sqrt(var + eps); save_mean = mean, save_invstd = invstd; running statistics
  /// updated as by batchnorm_forward_train (the variance unbiased by count / (count - 1)).
  void batchnorm_apply_stats(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                             const Tensor& mean, const Tensor& var, const Tensor& running_mean,
                             const Tensor& running_var, float momentum, float eps, int64_t count,
                             const Tensor& save_mean, const Tensor& save_invstd, const Tensor& y,
                             const BnEpilogue& epilogue = {});
  /// sums (2C) = [sum dy (C), sum dy * xhat (C)] over N, H, W, xhat = (x - save_mean) *
  /// save_invstd: this replica's dbeta and dgamma. With a ReLU epilogue the sums are of the
  /// masked dz, which is written too: batchnorm_backward_apply then takes dz as its dy.
  void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& save_mean,
                               const Tensor& save_invstd, const Tensor& sums,
                               const BnEpilogueGrad& epilogue = {});
  /// With the sums of every replica: dx = gamma * invstd / count * (count * dy - sums[0:C] -
  /// xhat * sums[C:2C]).
  void batchnorm_backward_apply(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                const Tensor& save_mean, const Tensor& save_invstd,
                                const Tensor& sums, int64_t count, const Tensor& dx);

  // ---- activation --------------------------------------------------------------------------
  /// y = max(x, 0); NaN stays NaN (as PyTorch). Any shape; y may alias x.
  void relu_forward(const Tensor& x, const Tensor& y);
  /// dx = dy where y > 0, else 0. dx may alias dy.
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);
  /// relu_backward, and in the same pass db (C) = the sum of dx over every position but the
  /// channel: the bias gradient of the layer whose output y is, when a ReLU is fused into it
  /// (ConvUse::output_relu, linear_forward's relu), which then asks its own backward for no db.
  /// y (N, C, H, W) in its layout, or (N, C); dx may alias dy. In precision bf16 each value
  /// is rounded to bf16 as it joins the sum (conv_backward_filter's and linear_backward's db sum
  /// the rounded dy). The order of the sum: on the cuda backend that of those ops' db (bit for
  /// bit); on the cpu backend that of linear_backward for (N, C), and for rank 4 a fixed one of
  /// its own, in double (its convolutions' bias gradients each sum in their algorithm's order).
  /// Zero for a batch of 0 examples.
  void relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx, const Tensor& db);

  // ---- pooling: x (N,C,H,W) -> y (N,C,P,Q)
  // -------------------------------------------------------
  /// The window: kernel and stride >= 1, 0 <= pad <= kernel / 2 (as PyTorch), and the padded
  /// input at least as large as the kernel.
  void avgpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y);
  void avgpool_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& dx);
  /// Max pooling; padded positions never win. Ties go to the first maximum in window order
  /// (row-major), which backward routes the gradient to. The first NaN of a window wins over
  /// any number (NaN propagates, as PyTorch's). y is the forward's output.
  void maxpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y);
  void maxpool_backward(const PoolGeometry& g, const Tensor& x, const Tensor& y, const Tensor& dy,
                        const Tensor& dx);
  /// x (N,C,H,W) -> y (N,C,1,1): the mean over H*W.
  void global_avgpool_forward(const Tensor& x, const Tensor& y);
  /// dy (N,C,1,1) -> dx (N,C,H,W) = dy / (H*W).
  void global_avgpool_backward(const Tensor& dy, const Tensor& dx);

  // ---- elementwise (same shape and layout) ----------------------------------------------------
  /// y = a + alpha * b; y may alias a or b. With alpha = 1 (the default) exactly a + b. y is f32;
  /// a and b are f32 or of a dtype this backend's convolutions take (conv_takes: a residual
  /// block's packed input gradients), widened exactly as read; y may alias an f32 operand, never
  /// a packed one.
  void add(const Tensor& a, const Tensor& b, const Tensor& y, float alpha = 1.0f);
  /// t *= alpha.
  void scale(const Tensor& t, float alpha);

  // ---- loss and metrics -------------------------------------------------------------------------
  /// Softmax cross-entropy with its gradient and the count of correct predictions, in one pass.
  /// logits (N,K) f32 with K >= 1, labels (N) i32 in [0,K).
  /// dlogits (N,K) = (softmax(logits) - onehot(labels)) * grad_scale
  ///   (grad_scale = 1 / global batch size gives the mean loss over the global batch).
  /// loss_sum (1) f32 = sum over n of -log softmax(logits)[n, label]  (written, not accumulated).
  /// correct (1) i32 = #n with argmax(logits[n]) == label (first maximum wins).
  /// With `slot` ((1) i32, read when the op runs): loss_sum (S) f32 and correct (S) i32 are
  /// tables and the results go to row slot[0] (a step's loss, written where its step says).
  void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float grad_scale,
                             const Tensor& dlogits, const Tensor& loss_sum, const Tensor& correct,
                             const Tensor* slot = nullptr);
  /// correct (1) i32 = #n with argmax(logits[n]) == label (written, not accumulated); with
  /// `slot`, as softmax_cross_entropy's.
  void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct,
                     const Tensor* slot = nullptr);

  // ---- optimizer ------------------------------------------------------------------------------
  /// One SGD step over flat buffers of equal length. momentum_buf may be null when
  /// p.momentum == 0. lr, momentum and weight_decay finite and >= 0. With `lr_row` (a StepRow of
  /// (steps, 1) f32) the learning rate is read from it when the update runs, not from p.lr.
  /// With `params_bf16` (bf16, params' shape) the updated parameters are also written there,
  /// rounded to bf16 and packed, in the same pass (pack_bf16's values): the copy the passes of
  /// precision bf16 read (conv_forward's w_bf16).
  void sgd_update(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                  const SgdParams& p, const StepRow* lr_row = nullptr,
                  const Tensor* params_bf16 = nullptr);
  /// One AdamW step over flat buffers of equal length; exp_avg (m) and exp_avg_sq (v) are its
  /// state. lr, weight_decay >= 0, betas in [0, 1), eps > 0, step >= 1. With `step_row` (a StepRow
  /// of (steps, 3) f32 holding AdamWStep's three scalars), p.lr, p.step and p.weight_decay are not
  /// used: the row's scalars, read when the update runs, are.
  /// params_bf16 as sgd_update's.
  void adamw_update(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const AdamWParams& p,
                    const StepRow* step_row = nullptr, const Tensor* params_bf16 = nullptr);
  /// y (bf16, x's shape) = x (f32) rounded to bf16, round to nearest even (dp::round_bits_to_bf16),
  /// packed: 2 bytes a value.
  void pack_bf16(const Tensor& x, const Tensor& y);
  /// cursor (1) i32 += 1: the last op of a step that reads its values at a cursor.
  void advance(const Tensor& cursor);

  // ---- data -------------------------------------------------------------------------------------
  /// Gathers examples by index from a dataset resident in this backend's memory.
  /// images (M,C,H,W) u8 NCHW, labels (M) u8, indices (n) i32 -> x (n,C,H,W) f32 = image / 255
  /// in x.layout, y (n) i32 = label. With `start` (a StepRow of (steps, 1) i32), indices is a
  /// longer buffer (L) and the rows are indices[start .. start + n), the start read when the op
  /// runs; start + n beyond L is refused (cpu) or gives NaN images (cuda), as a bad index does.
  /// With `transform` each example is cropped, flipped and normalised as dp/augment.hpp says,
  /// its draw read at the same row as its index; a draw with an offset outside [0, 2P] is
  /// refused (cpu) or gives a NaN image (cuda). Without it, or with a transform that asks for
  /// nothing, x = image / 255 exactly.
  void gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices,
                    const Tensor& x, const Tensor& y, const StepRow* start = nullptr,
                    const GatherTransform* transform = nullptr);

 private:
  // The implementations. Called only after the public op's checks passed, so they may assume
  // every shape, dtype and layout relation above, non-null data, and a non-empty batch (the
  // public ops handle N == 0 themselves; softmax_cross_entropy_impl and count_correct_impl run
  // for N == 0 too and write zeros, at their slot when given). Values read from device memory
  // when the op runs (StepRow, slots) are not checked: the implementations check what they can. A
  // plan passed in was made by this backend's plan_conv_impl.
  virtual void* allocate_impl(size_t bytes) = 0;
  virtual void synchronize_impl() = 0;
  /// Native capture (native_capture() true): start capturing this backend's work; end it and
  /// return what replay_impl launches (replay_impl gets only what this backend's
  /// end_capture_impl made); end it after an error, dropping what was captured.
  virtual void begin_capture_impl() {}
  virtual std::unique_ptr<CapturedOps> end_capture_impl() { return nullptr; }
  virtual void discard_capture_impl() noexcept {}
  virtual void replay_impl(const CapturedOps& /*ops*/) {}
  virtual void upload_impl(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download_impl(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_impl(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_impl(const Tensor& t, float value) = 0;
  virtual std::unique_ptr<ConvPlan> plan_conv_impl(const ConvGeometry& g, const ConvUse& use) = 0;
  /// Nothing to prepare by default.
  virtual void prepare_linear_impl(int64_t /*max_batch*/, int64_t /*in*/, int64_t /*out*/) {}
  virtual void prepare_batchnorm_impl(const Shape& /*max_input*/, Layout /*layout*/) {}
  /// batchnorm_takes for a dtype other than f32: none by default.
  virtual bool batchnorm_takes_impl(DType /*dtype*/, Layout /*layout*/) const { return false; }
  /// batchnorm_folds_bias: none by default.
  virtual bool batchnorm_folds_bias_impl(Layout /*layout*/) const { return false; }
  /// The output dtype of a plan plan_conv_impl made (ConvPlan::output_dtype): f32 by default.
  virtual DType conv_output_dtype_impl(const ConvPlan& /*plan*/) const { return DType::f32; }
  /// conv_takes for a dtype other than f32: none by default.
  virtual bool conv_takes_impl(DType /*dtype*/) const { return false; }
  virtual bool reads_packed_weights_impl() const { return false; }
  /// workspace: the caller's, checked, for a plan with planned_workspace() (null when it needs
  /// none); null for any other plan.
  virtual void conv_forward_impl(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                                 const Tensor& y, const Tensor* workspace,
                                 const Tensor* w_bf16) = 0;
  virtual void conv_backward_data_impl(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                                       const Tensor& dx, const Tensor* workspace,
                                       const Tensor* w_bf16) = 0;
  virtual void conv_backward_filter_impl(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                         const Tensor& dw, const Tensor* db,
                                         const Tensor* workspace) = 0;

  virtual void linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor* b,
                                   const Tensor& y, bool relu, const Tensor* w_bf16) = 0;
  virtual void linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy,
                                    const Tensor* dx, const Tensor& dw, const Tensor* db,
                                    const Tensor* w_bf16) = 0;
  virtual void batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, const Tensor& running_mean,
                                            const Tensor& running_var, float momentum, float eps,
                                            const Tensor& save_mean, const Tensor& save_invstd,
                                            const Tensor& y, const BnEpilogue& epilogue) = 0;
  virtual void batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma,
                                            const Tensor& beta, const Tensor& running_mean,
                                            const Tensor& running_var, float eps, const Tensor& y,
                                            const BnEpilogue& epilogue) = 0;
  virtual void batchnorm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                       const Tensor& save_mean, const Tensor& save_invstd,
                                       float eps, const Tensor& dx, const Tensor& dgamma,
                                       const Tensor& dbeta, const BnEpilogueGrad& epilogue) = 0;
  virtual void batchnorm_sums_impl(const Tensor& x, const Tensor* mean, const Tensor& sums) = 0;
  virtual void batchnorm_apply_stats_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          const Tensor& mean, const Tensor& var,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          float momentum, float eps, int64_t count,
                                          const Tensor& save_mean, const Tensor& save_invstd,
                                          const Tensor& y, const BnEpilogue& epilogue) = 0;
  virtual void batchnorm_backward_sums_impl(const Tensor& x, const Tensor& dy,
                                            const Tensor& save_mean, const Tensor& save_invstd,
                                            const Tensor& sums, const BnEpilogueGrad& epilogue) = 0;
  virtual void batchnorm_backward_apply_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                             const Tensor& save_mean, const Tensor& save_invstd,
                                             const Tensor& sums, int64_t count,
                                             const Tensor& dx) = 0;
  virtual void relu_forward_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void relu_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
  virtual void relu_backward_bias_impl(const Tensor& y, const Tensor& dy, const Tensor& dx,
                                       const Tensor& db) = 0;
  virtual void avgpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) = 0;
  virtual void avgpool_backward_impl(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) = 0;
  virtual void maxpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) = 0;
  virtual void maxpool_backward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                                     const Tensor& dy, const Tensor& dx) = 0;
  virtual void global_avgpool_forward_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) = 0;
  virtual void add_impl(const Tensor& a, const Tensor& b, const Tensor& y, float alpha) = 0;
  virtual void scale_impl(const Tensor& t, float alpha) = 0;
  virtual void softmax_cross_entropy_impl(const Tensor& logits, const Tensor& labels,
                                          float grad_scale, const Tensor& dlogits,
                                          const Tensor& loss_sum, const Tensor& correct,
                                          const Tensor* slot) = 0;
  virtual void count_correct_impl(const Tensor& logits, const Tensor& labels, const Tensor& correct,
                                  const Tensor* slot) = 0;
  virtual void sgd_update_impl(const Tensor& params, const Tensor& grads,
                               const Tensor* momentum_buf, const SgdParams& p,
                               const StepRow* lr_row, const Tensor* params_bf16) = 0;
  virtual void adamw_update_impl(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
                                 const Tensor& exp_avg_sq, const AdamWParams& p,
                                 const StepRow* step_row, const Tensor* params_bf16) = 0;
  virtual void pack_bf16_impl(const Tensor& x, const Tensor& y) = 0;
  virtual void advance_impl(const Tensor& cursor) = 0;
  virtual void gather_batch_impl(const Tensor& images, const Tensor& labels, const Tensor& indices,
                                 const Tensor& x, const Tensor& y, const StepRow* start,
                                 const GatherTransform* transform) = 0;
  /// Page-locked host memory where the device has it (cudaHostAlloc), else plain host memory.
  virtual void* allocate_host_impl(size_t bytes) = 0;
  virtual uint64_t upload_async_impl(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void wait_upload_impl(uint64_t ticket) = 0;
  virtual void await_upload_impl(uint64_t ticket) = 0;

 protected:
  /// For plan_conv_impl: marks the plan as taking its workspace from the caller when `use` says
  /// so (planned_workspace() is true from then on; plan_conv marks it after plan_conv_impl too),
  /// and as taking a forward bias or not (ConvUse::forward_bias).
  static void plan_workspace(ConvPlan& plan, const ConvUse& use) {
    plan.planned_workspace_ = use.planned_workspace;
    plan.forward_bias_ = use.forward_bias;
  }
  /// For plan_conv_impl with ConvUse::planned_workspace: the passes of `stage` need at least
  /// `bytes` of the caller's workspace (the largest of the calls is kept).
  static void need_workspace(ConvPlan& plan, ConvStage stage, size_t bytes);
  // For a backend's own public entry points beyond this interface (the CUDA backend's algorithm
  // introspection, dp/conv_contract.hpp), checked like the ops.
  /// "cpu backend: <op>: " (the prefix of every argument error).
  std::string prefix(const char* op) const;
  /// The plan's checks shared by the three convolution passes; returns the plan's geometry.
  const ConvGeometry& check_plan(const ConvPlan& plan, const char* op) const;
  /// Throws while capturing: `what` needs the host and cannot be part of a replayed step.
  void refuse_while_capturing(const char* what) const;

 private:
  /// Runs `op` (an *_impl call, its arguments copied into it), or records it while a recording
  /// backend captures.
  template <class Op>
  void run(Op&& op) {
    if (recording_ != nullptr) {
      record(std::function<void()>(std::forward<Op>(op)));
    } else {
      op();
    }
  }
  void record(std::function<void()> op);

  class Recording;
  bool capturing_ = false;
  std::unique_ptr<Recording> recording_;  // while a recording backend captures
};

enum class BackendKind { cpu, cuda };
const char* backend_kind_name(BackendKind k);

/// The kernels the CPU backend computes with. onednn: oneDNN's convolutions and SGEMM, whose
/// instruction set oneDNN picks from the CPU's cpuid features (capped by ONEDNN_MAX_CPU_ISA).
/// blas: im2col + OpenBLAS SGEMM for the GEMM-shaped work (the earlier reference path).
/// automatic: the DPRUN_CPU_KERNELS environment variable ("onednn" or "blas") when set, else
/// onednn. Ops that are not GEMM-shaped are the backend's own loops in both.
enum class CpuKernels { automatic, onednn, blas };
const char* cpu_kernels_name(CpuKernels k);  // "automatic", "onednn", "blas"

/// The arithmetic of convolutions and linear layers. fp32: fp32 throughout. bf16: their
/// multiplicands (activations, weights, output gradients) rounded to bfloat16 (round to nearest
/// even), products accumulated in fp32, and the activations (forward) and input gradients
/// (backward-data) they produce rounded to bf16, as a network storing those tensors in bf16
/// computes them; a convolution's weight gradient is rounded to bf16 once too (cuDNN's bf16
/// filter gradient writes bf16, as PyTorch's autocast keeps it), then held in the fp32 gradient;
/// linear layers' weight gradients, bias gradients, master weights, optimizer state, batch norm,
/// the loss and softmax stay fp32. The cpu backend emulates it on fp32 tensors (round_to_bf16,
/// bf16_cpu.hpp) and is the reference; the cuda backend computes it the same way on the GPU
/// (rounded operand copies into cuBLAS's and cuDNN's bf16 kernels where they give these values,
/// else TF32 math, which is exact for bf16 values: cuda_backend.hpp).
///
/// What the reference fixes, so the cuda path must match it (or both change together): the bias
/// is added to the fp32 sum before the one rounding of the output (a separate bias kernel after
/// a bf16 cuDNN/cuBLAS output would round twice: fuse it, or give the GEMM an fp32 output); a
/// convolution's weight gradient is rounded once, from one fp32 sum over the replica's batch
/// (not per chunk of it); a linear layer's comes out fp32 from bf16 x and dy; a batch norm's
/// output is rounded to bf16 once, after its fused residual add and ReLU, so the activations
/// between a ResNet's blocks are bf16 values, which its identity shortcuts add and its pooling
/// averages (batch norm's statistics and arithmetic, its gradients, and pooling and adds outside
/// a batch norm stay fp32). NaN keeps its payload here; compare NaN with isnan only.
enum class Precision { fp32, bf16 };
const char* precision_name(Precision p);  // "fp32", "bf16"
/// Every precision by its name; parse_precision throws dp::Error naming the known ones.
const std::vector<std::string>& precision_names();
Precision parse_precision(const std::string& name);

/// How the CUDA backend picks each convolution's algorithm among those its precision contract
/// allows (dp/conv_contract.hpp). measured: cuDNN times them once per shape on this machine and
/// the choice is kept on disk (the fastest; machines of one kind may choose differently, and a
/// machine keeps its first choice). heuristic: cuDNN's heuristics, nothing timed (the same
/// choice on every machine with the same GPU model and libraries). automatic: the environment
/// variable DPRUN_CUDNN_CHOICE ("measured" or "heuristic") when set, else measured.
enum class ConvChoice { automatic, measured, heuristic };
const char* conv_choice_name(ConvChoice c);  // "automatic", "measured", "heuristic"

struct BackendOptions {
  BackendKind kind = BackendKind::cpu;
  Precision precision = Precision::fp32;
  int device_index = 0;  // CUDA device ordinal (among visible devices)
  int cpu_threads = 0;   // CPU backend: worker threads for this replica (0: all hardware threads)
  CpuKernels cpu_kernels = CpuKernels::automatic;  // CPU backend: see CpuKernels
  bool allow_tf32 = true;  // CUDA: tensor-core TF32 for fp32 convolutions and GEMMs
  ConvChoice conv_choice = ConvChoice::automatic;  // CUDA: see ConvChoice
};

/// What `choice` resolves to in this process (automatic: DPRUN_CPU_KERNELS, else onednn).
/// Throws dp::Error when DPRUN_CPU_KERNELS holds anything but "onednn" or "blas".
CpuKernels resolve_cpu_kernels(CpuKernels choice = CpuKernels::automatic);

/// The CPU kernels as they run in this process, for `dprun --version` and the record of a trial:
/// "oneDNN 2.6.3 avx512_core_bf16" (the library's version and the instruction set its kernels
/// use) or "OpenBLAS 0.3.21 SkylakeX" (the library's version and kernel core; loading OpenBLAS
/// is part of the answer). Throws dp::Error like resolve_cpu_kernels, or when OpenBLAS cannot
/// be loaded.
std::string cpu_kernels(CpuKernels choice = CpuKernels::automatic);

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
/// The CUDA stack as loaded at run time (not as compiled): versions as the libraries report them
/// (driver and runtime 13000 = 13.0, cuDNN 91900 = 9.19.0, cuBLAS 130100, NCCL 22809). All zero
/// when not compiled with CUDA; the driver's is zero without a driver.
struct CudaVersions {
  int driver = 0, runtime = 0, cublas = 0, nccl = 0;
  size_t cudnn = 0;
};
CudaVersions cuda_versions();
/// Bracket the region a profiler started with `--profile-from-start off` records (nsys, ncu):
/// cudaProfilerStart / cudaProfilerStop. No-ops in a build without CUDA; throw dp::Error when the
/// runtime refuses.
void cuda_profiler_start();
void cuda_profiler_stop();

}  // namespace dp
