#pragma once
// The CUDA backend: one per replica, bound to one device. Every op is enqueued on the replica's
// own non-blocking stream (cuDNN and cuBLAS handles are bound to it) and never waits for the
// GPU; only upload/download/synchronize block. Convolutions go to cuDNN (legacy API), batch norm
// to cuDNN in NCHW and to our channels-last kernels in NHWC (bn_nhwc.cu), linear layers to
// cuBLAS, the rest to our kernels (kernels.cuh).
//
// precision = "bf16" (dp::Precision) as the cpu backend computes it: each convolution or linear
// pass reads copies of its operands rounded to bf16 (the bf16 scratch, below) and sums their
// exact products in fp32; its activation or input gradient is rounded to bf16 once (a bias first
// joins the fp32 sum), and so is a convolution's weight gradient. A linear layer's weight
// gradient stays fp32. Where the library can take bf16 data with fp32 sums and our rounding rule,
// the copies are packed bf16 (2 bytes) and the library's bf16 kernels run: every GEMM of the
// linear layers (cublasGemmEx, bf16 in, fp32 out), and cuDNN's convolution forward without a
// bias (ConvUse::forward_bias), backward-data and backward-filter, whose bf16 output is the
// rounded fp32 sum, widened back into the fp32 tensor. A forward with a bias, whose bias must
// join before the rounding, and any pass cuDNN cannot run on bf16 data, run fp32 kernels with
// TF32 tensor-core math on copies rounded to bf16 but kept as floats (exact for bf16 values: an
// 8-bit significand fits TF32's 11), their outputs rounded after. In NHWC, tensors a batch norm
// and a convolution alone exchange are stored packed (ConvPlan::output_dtype,
// ConvPlan::input_dtype), and so is a batch norm's output whose every reader takes it (the
// activations between residual blocks: Module::takes_input); the rest stays fp32, each operand
// costing a rounding pass, and a batch norm's f32 output a rounding pass of its own.

// Memory: allocate() is cudaMalloc, counted (in use, peak). The backend's own scratch (the cuDNN
// workspace shared by all convolution plans, filter-transpose and reduction scratch, the
// channels-last batch norm's and bf16's operand scratch) is grown at setup (plan_conv,
// prepare_linear, prepare_batchnorm) and counted too, so the step loop never allocates; a pass
// larger than what was prepared grows it on first use, never while capturing, and never frees
// what an earlier CUDA graph may use (replace_scratch).
//
// The op bodies live in one file per concern: cuda_backend.cpp (memory, elementwise, pooling,
// loss, optimizer, data), cuda_conv.cpp (convolution plans), cuda_dnn.cpp (batch norm, linear).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dp/backend.hpp"
#include "dp/conv_contract.hpp"
#include "dp/error.hpp"
#include "dp/tensor.hpp"

namespace dp::cuda {

/// Logical (N, C, H, W) of an activation; a rank-2 (N, C) tensor is (N, C, 1, 1).
struct Dims {
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t hw() const { return h * w; }
};

class CudnnConvPlan;
struct ConvBatch;

/// A linear layer's GEMM operand: the tensor's fp32 data, or (precision bf16) its packed bf16
/// copy (null data: none).
struct GemmOperand {
  const void* data = nullptr;
  bool packed = false;
};
using GemmOperands = std::array<GemmOperand, 3>;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return {DeviceKind::cuda, device_}; }
  std::string device_description() const override { return description_; }

  void release(void* p) noexcept override;
  size_t memory_in_use() const override;
  size_t peak_memory() const override;
  /// Step capture is a CUDA graph of the replica's stream (cuda_backend.cpp).
  bool native_capture() const override { return true; }

  // ---- for the communicators ----------------------------------------------------------------
  int device_index() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  /// Makes this backend's device current on the calling thread (replicas run on their own
  /// threads, and the CUDA runtime's current device is per thread).
  void activate() const;

  // ---- convolution algorithms (dp/conv_contract.hpp's introspection; cuda_conv.cpp) ----------
  ConvContract contract() const { return contract_; }
  /// Every algorithm the contract allows and cuDNN can run for (plan, d, n) within the workspace
  /// limit.
  std::vector<ConvAlgorithm> conv_algorithms(ConvPlan& plan, ConvDirection d, int64_t n);
  /// The algorithm chosen for (plan, d, n), chosen now (as at plan time) when it was not yet.
  ConvAlgorithm conv_choice(ConvPlan& plan, ConvDirection d, int64_t n);
  /// Runs `a` from now on; refused (nothing changed) when the contract forbids it or cuDNN
  /// cannot run it within the limit.
  void use_conv_algorithm(ConvPlan& plan, const ConvAlgorithm& a);
  /// The choice cache's scope and the key of (plan, d, n)'s measured choice at plan time.
  ConvChoiceKey conv_choice_key(ConvPlan& plan, ConvDirection d, int64_t n);

 private:
  // The ops (see dp::Backend); arguments are checked before these run. Bodies: cuda_backend.cpp
  // (memory, elementwise, pooling, loss, optimizer, data), cuda_conv.cpp, cuda_dnn.cpp.
  void* allocate_impl(size_t bytes) override;
  void synchronize_impl() override;
  void begin_capture_impl() override;
  std::unique_ptr<CapturedOps> end_capture_impl() override;
  void discard_capture_impl() noexcept override;
  void replay_impl(const CapturedOps& ops) override;
  void upload_impl(void* dst, const void* host_src, size_t bytes) override;
  void download_impl(void* host_dst, const void* src, size_t bytes) override;
  void copy_impl(void* dst, const void* src, size_t bytes) override;
  void fill_impl(const Tensor& t, float value) override;

  std::unique_ptr<ConvPlan> plan_conv_impl(const ConvGeometry& g, const ConvUse& use) override;
  DType conv_output_dtype_impl(const ConvPlan& plan) const override;
  bool batchnorm_takes_impl(DType dtype, Layout layout) const override;
  bool batchnorm_folds_bias_impl(Layout layout) const override;
  bool conv_takes_impl(DType dtype) const override;
  bool reads_packed_weights_impl() const override { return bf16(); }
  void conv_forward_impl(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                         const Tensor& y, const Tensor* workspace, const Tensor* w_bf16) override;
  void conv_backward_data_impl(ConvPlan& plan, const Tensor& dy, const Tensor& w, const Tensor& dx,
                               const Tensor* workspace, const Tensor* w_bf16) override;
  void conv_backward_filter_impl(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor* db,
                                 const Tensor* workspace) override;

  void prepare_linear_impl(int64_t max_batch, int64_t in, int64_t out) override;
  void linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
                           bool relu, const Tensor* w_bf16) override;
  void linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                            const Tensor& dw, const Tensor* db, const Tensor* w_bf16) override;

  void prepare_batchnorm_impl(const Shape& max_input, Layout layout) override;
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
  void* allocate_host_impl(size_t bytes) override;
  void release_host(void* p) noexcept override;
  uint64_t upload_async_impl(void* dst, const void* host_src, size_t bytes) override;
  void wait_upload_impl(uint64_t ticket) override;
  void await_upload_impl(uint64_t ticket) override;

  void teardown() noexcept;
  // Scratch shared by every plan, grown only at plan time (cuda_conv.cpp).
  void reserve_workspace(size_t bytes);
  void reserve_filter_scratch(size_t floats);
  void reserve_reduce_scratch(size_t floats);
  /// The bias-gradient reduction's scratch, grown to `floats` if smaller; never while capturing
  /// (`op` then fails, as regrow_scratch).
  float* regrow_reduce_scratch(size_t floats, const char* op, int64_t channels);
  /// The channels-last batch norm's scratch for (rows, c), grown now if it is smaller, and its
  /// counters (bn_counters_) likewise: at prepare_batchnorm, or on first use of a larger shape,
  /// but never while capturing (`op` then fails naming what was not prepared).
  float* bn_scratch_for(int64_t rows, int64_t c, const char* op);
  /// Scratch `buffer` (holding `held` units of T) replaced by one of `count` (replace_scratch);
  /// while a step is being captured `op` fails instead, saying what it `needs` and the `remedy`
  /// (what to prepare at setup).
  template <class T>
  T* regrow_scratch(T*& buffer, size_t& held, size_t count, const char* op,
                    const std::string& needs, const char* remedy) {
    if (capturing()) {
      throw CaptureRefused(std::string("cuda backend: ") + op + ": " + needs +
                           ", which cannot be allocated while a step is being captured: " + remedy);
    }
    replace_scratch(buffer, held, count, sizeof(T));
    return buffer;
  }
  /// Scratch `buffer` (holding `held` units) replaced by one of `count` units of `unit_bytes`.
  /// While no CUDA graph has been captured on this backend the old buffer is freed first, after
  /// the queued work that may use it (a failed allocation then leaves none). Once one has been, a
  /// graph may hold the old buffer's address, so it stays allocated (and counted in
  /// memory_in_use) until teardown, and a failed allocation changes nothing.
  template <class T>
  void replace_scratch(T*& buffer, size_t& held, size_t count, size_t unit_bytes) {
    if (graphs_captured_ == 0) {
      sync_for_scratch();
      release(buffer);
      buffer = nullptr;
      held = 0;
    }
    buffer = static_cast<T*>(allocate(count * unit_bytes));
    held = count;
  }
  void sync_for_scratch();  // waits for stream_ (replace_scratch), throwing on a CUDA error
  /// The cuDNN state of one batch size of a plan (descriptors; algorithms chosen per direction),
  /// created on first use. `direction` is chosen now if it was not yet: at plan time within
  /// kMaxWorkspaceBytes (the backend's workspace then grows to fit, or a plan with a planned
  /// workspace says it needs that much more), later within `run_limit` (the workspace the pass
  /// has), so a step never allocates.
  ConvBatch& conv_batch(CudnnConvPlan& plan, int64_t n, int direction, bool at_plan_time,
                        size_t run_limit = 0);
  /// Where a convolution pass's scratch is: the bf16 operand copies (null in fp32: the bf16
  /// scratch is then not used) and cuDNN's workspace. A plan with a planned workspace has both in
  /// the caller's `workspace` (the copies first); any other uses the backend's own.
  struct PassScratch {
    float* bf16 = nullptr;
    void* cudnn = nullptr;
    size_t cudnn_bytes = 0;
    size_t copy_bytes = 0;  // what this pass's operand copies use of bf16
  };
  PassScratch pass_scratch(const CudnnConvPlan& plan, int direction, const Tensor* workspace,
                           size_t bf16_floats, const char* op);
  /// Under DPRUN_CUDA_POISON_SCRATCH=1: fills the pass's copies and the cuDNN workspace its
  /// algorithm needs (cudnn_need bytes) with 0xFF bytes, in stream order before the pass.
  void poison_pass(const PassScratch& s, size_t cudnn_need);
  /// plan_conv_impl's plan, cuDNN given packed bf16 data in the directions io_bf16 says
  /// (forward, backward-data, backward-filter); bf16_output: y is packed bf16
  /// (CudnnConvPlan::bf16_output, with io_bf16[forward]).
  std::unique_ptr<CudnnConvPlan> make_conv_plan(const ConvGeometry& g, const ConvUse& use,
                                                std::array<bool, 3> io_bf16,
                                                bool bf16_output = false);
  /// The descriptors of batch size n of a plan, created on first use; nothing chosen.
  ConvBatch& batch_state(CudnnConvPlan& plan, int64_t n);
  void choose_algorithm(CudnnConvPlan& plan, ConvBatch& b, int direction, size_t workspace_limit,
                        bool at_plan_time);
  /// The measured choice (DPRUN_CUDNN_CHOICE=measured, the default): cuDNN's Find*Ex timings,
  /// the fastest deterministic algorithm with the wanted math within the limit, kept in the
  /// ChoiceCache of this device and these libraries so later runs reuse it. False when nothing
  /// usable came out, and the heuristics then choose: silently when no timed algorithm
  /// qualified, with a warning when timing failed or a recorded choice cannot be used.
  bool choose_measured(CudnnConvPlan& plan, ConvBatch& b, int direction, size_t workspace_limit);
  /// The ChoiceCache key of a measured choice: direction, shape at batch n, contract, limit.
  std::string choice_key(const CudnnConvPlan& plan, int64_t n, int direction,
                         size_t workspace_limit) const;
  /// "cuDNN 91900, CUDA runtime 13000, NVIDIA H100 80GB HBM3 sm_90": what choices depend on.
  std::string choice_scope_;
  bool measure_choices_ = true;
  // dprun's own passes beside cuDNN's (dp/conv_contract.hpp): the forward of an NHWC 1x1
  // convolution as one cuBLAS GEMM (dp::kConvAlgoDprunGemm1x1: the strided rows gathered, with
  // bf16 rounded, into its workspace, then the (K, C) filter as it is), and the direct forward
  // and filter gradient of an NHWC convolution with few input channels (dp::kConvAlgoDprunSmallC,
  // conv_small.cu). The measured choice times them against cuDNN's fastest (cuda_conv.cpp).
  /// dprun's own algorithms that can run the plan's `direction`, in the order they are timed.
  static std::vector<int> own_algorithms(const CudnnConvPlan& plan, int direction);
  static bool own_algorithm_runs(const CudnnConvPlan& plan, int algo, int direction);
  /// Whether the plan's forward can run the GEMM: NHWC, a 1x1 kernel, no padding.
  static bool own_gemm_1x1(const CudnnConvPlan& plan);
  /// Whether the plan can run the few-channel passes (NHWC, kernels::small_conv_fits).
  static bool own_small_c(const CudnnConvPlan& plan);
  /// The workspace own algorithm `algo` needs in `direction` at batch n: its own_scratch, then,
  /// for a forward, the fp32 sums of a bf16 y (CudnnConvPlan::bf16_output) and the widened copy
  /// of a bf16 x (CudnnConvPlan::bf16_input), in that order.
  size_t own_workspace(const CudnnConvPlan& plan, int algo, int direction, int64_t n) const;
  /// What the algorithm itself uses at the start of its workspace: the GEMM's gathered rows
  /// (when strided, or rounded in bf16) and, in bf16, its filter's rounded copy; the few-channel
  /// filter gradient's partial sums.
  size_t own_scratch(const CudnnConvPlan& plan, int algo, int direction, int64_t n) const;
  /// The math it runs with, as cuDNN's math types say it: the GEMM's is the cuBLAS handle's
  /// (TF32 when allow_tf32, else FMA); the direct passes' FMA.
  cudnnMathType_t own_math(int algo) const;
  /// Enqueues own algorithm `algo`: forward, out = y (fp32, no bias, not rounded) from a = x and
  /// b = w; backward-filter, out = dw (K, C, R, S), in `filters` order, from a = x and b = dy. With bf16 the operands
  /// are rounded as they are read (the GEMM: into its workspace).
  /// `filters`: the memory order of w (forward) or dw (backward-filter), Tensor::layout.
  void run_own(const CudnnConvPlan& plan, int algo, int direction, int64_t n, const float* a,
               const float* b, float* out, void* workspace, Layout filters = Layout::nchw);
  /// Its time at batch n in ms (the best of three after a warm-up, on scratch buffers of its
  /// own), at plan time; a negative value when its workspace would exceed `limit`.
  float time_own(const CudnnConvPlan& plan, int algo, int direction, int64_t n, size_t limit);
  /// Whether a pass must transpose w (or dw) between its (K, C, R, S) memory order and the
  /// (K, R, S, C) that cuDNN's NHWC configuration reads: NHWC activations with a filter stored
  /// (K, C, R, S) (ConvUse::filter_layout nchw).
  static bool transposes_filter(const CudnnConvPlan& plan, const Tensor& w);
  /// The (K, R, S, C) filter cuDNN needs for NHWC activations, from a (K, C, R, S) w, transposed
  /// into scratch (where transposes_filter).
  const float* filter_for(const CudnnConvPlan& plan, const float* w);
  /// A convolution pass given bf16 data (forward, backward-data), in `scratch` (pass_scratch's):
  /// the packed copies of its data operand (x or dy) and of its filter (as filter_for lays it
  /// out), and room for its packed output.
  struct PackedOperands {
    const uint16_t* data;
    const uint16_t* filter;
    uint16_t* out;
  };
  /// w_bf16: the caller's packed copy of w (conv_forward's), read as the filter operand where
  /// no transpose is needed, instead of packing one.
  PackedOperands packed_operands(const CudnnConvPlan& plan, float* scratch, const Tensor& data,
                                 const Tensor& w, const Tensor* w_bf16, int64_t out_numel);
  /// precision bf16: the bf16 scratch holding at least `floats`, grown now if it is smaller (at
  /// plan_conv and prepare_linear, or on first use of a larger pass, but never while capturing:
  /// `op` then fails naming what was not prepared).
  float* bf16_scratch_for(size_t floats, const char* op);
  /// The fp32 operands a convolution pass reads: the tensors' own data, or in bf16 their copies
  /// rounded to bf16 but kept as floats, in `bf16_scratch` (pass_scratch's).
  std::array<const float*, 2> pass_operands(const Tensor& a, const Tensor& b, float* bf16_scratch);
  /// pass_operands for a pass reading data (x or dy) and the filter w, the filter as cuDNN reads
  /// it (filter_for): in bf16 NHWC transposed and rounded in one pass.
  std::array<const float*, 2> data_and_filter(const CudnnConvPlan& plan, const Tensor& data,
                                              const Tensor& w, float* bf16_scratch);
  /// A linear pass's GEMM operands: the tensors' own data (a null tensor gives null), or in
  /// bf16 their packed copies in the bf16 scratch; b_bf16 (may be null): b's packed copy, kept
  /// by the caller (the weight's, linear_forward's w_bf16), b's operand in bf16 as it is.
  GemmOperands gemm_operands(const char* op, const Tensor* a, const Tensor* b, const Tensor* c,
                             const Tensor* b_bf16 = nullptr);
  /// A convolution's or linear layer's output y (N, C, HW) after its GEMM: the bias b (may be
  /// null) added, and in bf16 y rounded once, the bias joining the fp32 sum first; relu: then
  /// its ReLU (a fused ReLU: ConvUse::output_relu, linear_forward's relu), in the same pass.
  void finish_forward(const Tensor& y, const Tensor* b, int64_t n, int64_t c, int64_t hw, bool nhwc,
                      bool relu = false);
  /// Sets the backend's scratch descriptors for a batch-norm input (NCHW or NHWC; rank 2 is
  /// (N, C, 1, 1)) and its per-channel parameters.
  void set_bn_descriptors(const Dims& d, Layout layout);
  /// A batch norm's epilogue as separate passes over y (add, then relu), and its gradient (the
  /// ReLU's mask into dz; returns the gradient the batch norm takes). The values are those of
  /// the CPU backend's fused loops; one fused pass is GPU work still to be measured.
  void apply_epilogue(const Tensor& y, const BnEpilogue& epilogue);
  const Tensor& epilogue_gradient(const Tensor& dy, const BnEpilogueGrad& epilogue);
  /// Precision bf16: an f32 batch-norm output rounded to bf16 in place, the values a packed one
  /// holds (Backend::batchnorm_forward_train). Nothing otherwise.
  void round_batchnorm_output(const Tensor& y);

  /// A plan of this backend (refused otherwise, like every op's plan).
  CudnnConvPlan& own_plan(ConvPlan& plan, const char* op);

  int device_ = 0;
  Precision precision_ = Precision::fp32;
  bool bf16() const { return precision_ == Precision::bf16; }
  /// TF32 tensor cores for convolutions and GEMMs: allow_tf32, or precision bf16 (exact there).
  bool allow_tf32_ = true;
  /// Which algorithms and math types may compute the convolutions: from precision and
  /// allow_tf32 alone (dp/conv_contract.hpp).
  ConvContract contract_ = ConvContract::tf32;
  std::string description_;
  cudaStream_t stream_ = nullptr;
  // upload_async: copies on a stream of their own, after what stream_ queued before them (an
  // event); stream_ waits for a copy where await_upload says (its event). Made on first use. A ticket's completion is the event of its ring place: a later upload
  // that reused the place completes later, so waiting on it is later, never early.
  static constexpr int kUploadEvents = 8;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t queued_event_ = nullptr;
  cudaEvent_t upload_events_[kUploadEvents] = {};
  uint64_t uploads_ = 0;  // tickets given
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;

  mutable std::mutex memory_mutex_;
  std::unordered_map<void*, size_t> sizes_;
  size_t in_use_ = 0;
  size_t peak_ = 0;

  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // Two filters, for a (K, C, R, S) filter of NHWC activations: its (K, R, S, C) copy and gradient.
  float* filter_scratch_ = nullptr;
  size_t filter_scratch_floats_ = 0;
  float* reduce_scratch_ = nullptr;  // partial sums of the bias-gradient reduction
  size_t reduce_scratch_floats_ = 0;
  /// NHWC batch norm by bn_nhwc.cu (true) or cuDNN (DPRUN_CUDA_NHWC_BN=cudnn, for comparisons).
  bool own_nhwc_bn_ = true;
  /// Precision bf16: a convolution whose output only a batch norm of ours reads writes it as
  /// packed bf16, and convolutions take a packed bf16 x (a batch norm's output, stored so where
  /// every reader takes it), when true; f32 tensors (DPRUN_CUDA_BF16_CONV_OUTPUT=f32, for
  /// comparisons) when false.
  bool bf16_storage_ = true;
  bool poison_scratch_ = false;  // DPRUN_CUDA_POISON_SCRATCH=1: see the constructor
  /// Whether x's batch norm goes to bn_nhwc.cu.
  bool own_bn(const Tensor& x) const {
    return own_nhwc_bn_ && x.shape.rank == 4 && x.layout == Layout::nhwc;
  }
  float* bn_scratch_ = nullptr;  // the channels-last batch norm's partial sums and coefficients
  size_t bn_scratch_floats_ = 0;
  /// Its reductions' per-tile counters (kernels::bn_nhwc_counters), 0 between calls; grown
  /// with the scratch (bn_scratch_for), zeroed when allocated.
  unsigned* bn_counters_ = nullptr;
  size_t bn_counters_held_ = 0;
  float* bf16_scratch_ = nullptr;  // precision bf16: a pass's operand copies (Bf16Operands)
  size_t bf16_scratch_floats_ = 0;
  /// CUDA graphs captured on this backend so far (never decremented: scratch replaced after the
  /// first is kept until teardown, replace_scratch).
  int64_t graphs_captured_ = 0;

  cudnnTensorDescriptor_t bn_x_desc_ = nullptr;
  cudnnTensorDescriptor_t bn_param_desc_ = nullptr;
};

/// precision bf16: floats of bf16 scratch for a pass whose operands have these element counts,
/// rounded copies kept as floats (each copy's start aligned to 256 bytes, as cuDNN and cuBLAS
/// like them).
size_t bf16_operand_floats(std::initializer_list<int64_t> counts);
/// The same for packed bf16 copies (2 bytes an element), and room for packed bf16 outputs.
size_t bf16_packed_floats(std::initializer_list<int64_t> counts);
/// A pass's operand copies, carved in order from scratch holding bf16_operand_floats (take) and
/// bf16_packed_floats (take_packed, room_packed) of them: take and take_packed enqueue the
/// rounding (or widening) on `stream` and return the copy; room_packed returns room for a packed
/// output.
class Bf16Operands {
 public:
  Bf16Operands(float* scratch, cudaStream_t stream) : next_(scratch), stream_(stream) {}
  /// t rounded to bf16 (fp32 values) in an fp32 copy; a packed bf16 t widened into it.
  const float* take(const Tensor& t);
  const uint16_t* take_packed(const float* src, int64_t n);
  uint16_t* room_packed(int64_t n);

 private:
  float* next_;
  cudaStream_t stream_;
};

/// Logical dims of an activation the public op already checked (rank 4, or rank 2 as
/// (N, C, 1, 1)).
inline Dims dims_of(const Tensor& t) {
  if (t.shape.rank == 2) return {t.shape[0], t.shape[1], 1, 1};
  return {t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
}
inline bool is_nhwc(const Tensor& t) { return t.shape.rank == 4 && t.layout == Layout::nhwc; }
/// "cuda backend: <op>: <message>"
[[noreturn]] void fail(const char* op, const std::string& message);

}  // namespace dp::cuda
