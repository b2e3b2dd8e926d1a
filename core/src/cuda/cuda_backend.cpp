// CudaBackend: construction, memory, elementwise ops, pooling, loss, optimizer, data, and the
// entry points the backend factory calls (cuda_entry.hpp).
#include "cuda/cuda_backend.hpp"

#include <cuda_profiler_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cuda/cuda_entry.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/augment.hpp"
#include "dp/error.hpp"
#include "dp/optimizer.hpp"

namespace dp::cuda {

namespace {
/// A two-way switch from the environment: `fallback` when `name` is unset or empty, true for
/// `on`, false for `off`; any other value is refused, with `usage` saying what each does.
bool env_switch(const char* name, const char* on, const char* off, bool fallback,
                const char* usage) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string v = value;
  if (v != on && v != off) {
    throw Error(std::string("cuda backend: ") + name + " is '" + v + "'; " + usage);
  }
  return v == on;
}
}  // namespace

// ---- errors and checks --------------------------------------------------------------------------

void throw_library_error(const char* library, const char* statement, const char* file, int line,
                         const std::string& what) {
  const std::string message = std::string(library) + " error in `" + statement + "`: " + what;
  if (std::string(library) == "cuDNN") throw CudnnError(located(file, line, message));
  throw_error(file, line, message);
}

bool is_capture_error(cudaError_t status) noexcept {
  switch (status) {
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread:
      return true;
    default:
      return false;
  }
}

void throw_cuda_error(const char* statement, const char* file, int line, int status,
                      const char* text) {
  if (is_capture_error(static_cast<cudaError_t>(status))) {
    throw CaptureRefused(located(
        file, line,
        std::string("CUDA error in `") + statement + "` while a step was being captured: " + text));
  }
  throw_library_error("CUDA", statement, file, line, text);
}

void warn_library_error(const char* library, const char* statement, const char* file, int line,
                        const std::string& what) noexcept {
  std::fprintf(stderr, "dprun: warning: %s error in `%s`: %s (%s:%d)\n", library, statement,
               what.c_str(), file, line);
}

void fail(const char* op, const std::string& message) {
  throw Error(std::string("cuda backend: ") + op + ": " + message);
}

namespace {

/// The kernels' view of a pooling window over the (already checked) input x.
kernels::PoolShape pool_shape(const PoolGeometry& g, const Tensor& x) {
  const Dims d = dims_of(x);
  return {d.n,        d.c,        d.h,        d.w,     g.out_h(d.h), g.out_w(d.w), g.kernel_h,
          g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w,      is_nhwc(x)};
}

/// cuBLAS's workspace, handed over explicitly so cuBLAS never allocates behind our back.
constexpr size_t kCublasWorkspaceBytes = size_t{8} << 20;

}  // namespace

// ---- construction ------------------------------------------------------------------------------

CudaBackend::CudaBackend(const BackendOptions& options)
    : device_(options.device_index),
      precision_(options.precision),
      allow_tf32_(options.allow_tf32 || options.precision == Precision::bf16),
      contract_(conv_contract(options.precision, options.allow_tf32)) {
  const int count = device_count();
  if (device_ < 0 || device_ >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw Error("cuda backend: device " + std::to_string(device_) + " does not exist (" +
                std::to_string(count) + " visible CUDA device(s)" +
                (visible ? std::string(", CUDA_VISIBLE_DEVICES=") + visible : std::string()) +
                "); use a device index below the count or run on the cpu backend");
  }
  try {
    CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    description_ = prop.name;
    int runtime = 0;
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    choice_scope_ = "cuDNN " + std::to_string(cudnnGetVersion()) + ", CUDA runtime " +
                    std::to_string(runtime) + ", " + description_ + " sm_" +
                    std::to_string(prop.major) + std::to_string(prop.minor);
    if (options.conv_choice == ConvChoice::automatic) {
      measure_choices_ = env_switch("DPRUN_CUDNN_CHOICE", "measured", "heuristic", true,
                                    "use measured (cuDNN times the algorithms once per shape, the "
                                    "results kept on disk) or heuristic (cuDNN's heuristics, "
                                    "nothing timed)");
    } else {
      measure_choices_ = options.conv_choice == ConvChoice::measured;
    }
    // Which batch norm computes NHWC activations: ours (bn_nhwc.cu, the default) or cuDNN's
    // legacy one, for benchmarks that compare them.
    own_nhwc_bn_ = env_switch("DPRUN_CUDA_NHWC_BN", "ours", "cudnn", true,
                              "use ours (dprun's channels-last kernels, the default) or cudnn "
                              "(cuDNN's legacy batch norm)");
    // Which dtype holds a bf16 convolution's output that only our batch norm reads, and a batch
    // norm's output whose readers take bf16 (a convolution, the next residual block): packed
    // bf16 (the default) or f32 (the widened copy), for benchmarks and tests that compare them.
    bf16_storage_ = env_switch("DPRUN_CUDA_BF16_CONV_OUTPUT", "bf16", "f32", true,
                               "use bf16 (a bf16 convolution that feeds a batch norm writes its "
                               "output as bf16, and a batch norm whose readers take bf16 its "
                               "output, the default) or f32 (every activation f32)");
    // A check for reads of scratch nobody wrote (scripts/gpu-check runs the op tests under it):
    // each convolution pass's scratch, the operand copies and cuDNN's workspace, is filled with
    // 0xFF bytes (NaN in fp32 and in bf16) right before the pass, so a library's kernel or ours
    // that uses scratch it did not write first makes NaN where the tests compare with the CPU.
    poison_scratch_ =
        env_switch("DPRUN_CUDA_POISON_SCRATCH", "1", "0", false,
                   "use 1 (fill each convolution pass's scratch with NaN first) or 0");
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    CUBLAS_CHECK(
        cublasSetWorkspace(cublas_, allocate(kCublasWorkspaceBytes), kCublasWorkspaceBytes));
    // Exact fp32 unless TF32 is allowed (CUBLAS_DEFAULT_MATH never uses tensor cores for fp32);
    // in bf16 the GEMMs read bf16 values, for which TF32 is exact.
    CUBLAS_CHECK(
        cublasSetMathMode(cublas_, allow_tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bn_x_desc_));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&bn_param_desc_));
  } catch (...) {
    teardown();
    throw;
  }
}

CudaBackend::~CudaBackend() { teardown(); }

void CudaBackend::teardown() noexcept {
  CUDA_WARN(cudaSetDevice(device_));
  if (stream_ != nullptr) CUDA_WARN(cudaStreamSynchronize(stream_));
  if (bn_x_desc_ != nullptr) CUDNN_WARN(cudnnDestroyTensorDescriptor(bn_x_desc_));
  if (bn_param_desc_ != nullptr) CUDNN_WARN(cudnnDestroyTensorDescriptor(bn_param_desc_));
  if (cublas_ != nullptr) CUBLAS_WARN(cublasDestroy(cublas_));
  if (cudnn_ != nullptr) CUDNN_WARN(cudnnDestroy(cudnn_));
  if (stream_ != nullptr) CUDA_WARN(cudaStreamDestroy(stream_));
  if (copy_stream_ != nullptr) {
    CUDA_WARN(cudaStreamSynchronize(copy_stream_));
    CUDA_WARN(cudaStreamDestroy(copy_stream_));
    CUDA_WARN(cudaEventDestroy(queued_event_));
    for (cudaEvent_t e : upload_events_) CUDA_WARN(cudaEventDestroy(e));
    copy_stream_ = nullptr;
  }
  bn_x_desc_ = bn_param_desc_ = nullptr;
  cublas_ = nullptr;
  cudnn_ = nullptr;
  stream_ = nullptr;
  // Whatever the user did not release (and our scratch) goes back to the driver.
  for (auto& [p, bytes] : sizes_) CUDA_WARN(cudaFree(p));
  sizes_.clear();
  in_use_ = 0;
}

void CudaBackend::activate() const { CUDA_CHECK(cudaSetDevice(device_)); }

// ---- memory ------------------------------------------------------------------------------------

void* CudaBackend::allocate_impl(size_t bytes) {
  activate();
  void* p = nullptr;
  // cudaMalloc aligns to 256 bytes at least; never hand out a null pointer for 0 bytes.
  const cudaError_t status = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error("cuda backend: cannot allocate " + std::to_string(bytes >> 20) + " MiB on " +
                device().str() + " (" + cudaGetErrorString(status) + "; this replica holds " +
                std::to_string(memory_in_use() >> 20) + " MiB, the device has " +
                std::to_string(free_bytes >> 20) + " of " + std::to_string(total_bytes >> 20) +
                " MiB free): use a smaller batch or fewer replicas per GPU");
  }
  std::lock_guard<std::mutex> lock(memory_mutex_);
  sizes_[p] = bytes;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void CudaBackend::release(void* p) noexcept {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) {
      std::fprintf(stderr,
                   "dprun: warning: cuda backend: release of %p, which it never allocated\n", p);
      return;
    }
    in_use_ -= it->second;
    sizes_.erase(it);
  }
  CUDA_WARN(cudaSetDevice(device_));
  CUDA_WARN(cudaFree(p));
}

size_t CudaBackend::memory_in_use() const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return in_use_;
}

size_t CudaBackend::peak_memory() const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return peak_;
}

void CudaBackend::upload_impl(void* dst, const void* host_src, size_t bytes) {
  activate();
  // On our stream, so the copy is ordered after queued work that may still use dst.
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download_impl(void* host_dst, const void* src, size_t bytes) {
  activate();
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void* CudaBackend::allocate_host_impl(size_t bytes) {
  activate();
  void* p = nullptr;
  const cudaError_t status = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(
        "cuda backend: cannot allocate " + std::to_string(bytes >> 20) +
        " MiB of page-locked host memory (" + cudaGetErrorString(status) +
        ") for streamed data (a ring slot: at most 16 of the largest batches per replica); a "
        "smaller batch size or data_budget_mib needs less");
  }
  return p;
}

void CudaBackend::release_host(void* p) noexcept {
  if (p != nullptr) CUDA_WARN(cudaFreeHost(p));
}

uint64_t CudaBackend::upload_async_impl(void* dst, const void* host_src, size_t bytes) {
  activate();
  if (copy_stream_ == nullptr) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&queued_event_, cudaEventDisableTiming));
    for (cudaEvent_t& e : upload_events_)
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  cudaEvent_t done = upload_events_[uploads_ % kUploadEvents];
  // The copy waits for every op queued before it (they may read dst); the ops queued after it
  // wait only where await_upload says, so the copy engine runs beside the compute until then.
  CUDA_CHECK(cudaEventRecord(queued_event_, stream_));
  CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, queued_event_, 0));
  if (bytes > 0) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, copy_stream_));
  }
  CUDA_CHECK(cudaEventRecord(done, copy_stream_));
  return ++uploads_;
}

void CudaBackend::await_upload_impl(uint64_t ticket) {
  if (ticket == 0 || ticket > uploads_) return;
  activate();
  // As in wait_upload: a place recorded again since completes later, never earlier.
  CUDA_CHECK(cudaStreamWaitEvent(stream_, upload_events_[(ticket - 1) % kUploadEvents], 0));
}

void CudaBackend::wait_upload_impl(uint64_t ticket) {
  if (ticket == 0 || ticket > uploads_) return;  // none given, or not one of ours
  activate();
  // Ticket t recorded upload_events_[(t - 1) % kUploadEvents]; a later upload may have recorded
  // it again since, which completes later still (one copy stream, in order).
  CUDA_CHECK(cudaEventSynchronize(upload_events_[(ticket - 1) % kUploadEvents]));
}

void CudaBackend::copy_impl(void* dst, const void* src, size_t bytes) {
  activate();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill_impl(const Tensor& t, float value) {
  activate();
  if (t.dtype == DType::f32) {
    kernels::fill_f32(t.f32(), t.numel(), value, stream_);
  } else {
    kernels::fill_i32(t.i32(), t.numel(), static_cast<int32_t>(value), stream_);
  }
}

void CudaBackend::synchronize_impl() {
  activate();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- step capture: a CUDA graph of the stream --------------------------------------------------

namespace {

/// A captured step: the graph and its executable instance, launched whole by replay.
class CudaGraph final : public CapturedOps {
 public:
  explicit CudaGraph(cudaGraph_t graph) : graph_(graph) {
#if CUDART_VERSION >= 12000
    const cudaError_t status = cudaGraphInstantiate(&exec_, graph_, 0);
#else
    const cudaError_t status = cudaGraphInstantiate(&exec_, graph_, nullptr, nullptr, 0);
#endif
    if (status != cudaSuccess) {
      CUDA_WARN(cudaGraphDestroy(graph_));
      throw Error(std::string("cuda backend: end_capture: the captured step cannot be "
                              "instantiated as a CUDA graph: ") +
                  cudaGetErrorString(status));
    }
  }
  ~CudaGraph() override {
    if (exec_ != nullptr) CUDA_WARN(cudaGraphExecDestroy(exec_));
    CUDA_WARN(cudaGraphDestroy(graph_));
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  size_t ops() const override { return 0; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

void CudaBackend::begin_capture_impl() {
  activate();
  // Thread-local: each replica's thread captures its own stream; another thread's CUDA calls
  // (a communicator's watchdog, another replica) are not affected.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

std::unique_ptr<CapturedOps> CudaBackend::end_capture_impl() {
  // Nothing that can throw before the capture ends: the stream must not stay capturing.
  CUDA_WARN(cudaSetDevice(device_));
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(stream_, &graph);
  if (status != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) CUDA_WARN(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    const std::string message =
        std::string("cuda backend: end_capture: the step could not be captured as a CUDA graph: ") +
        cudaGetErrorString(status) +
        " (an op in the step needs the host or another stream; run without graphs)";
    // The runtime's verdict on what the stream did while capturing: the step cannot be
    // captured, and runs as it is without graphs (graphs = "auto" falls back on CaptureRefused).
    if (is_capture_error(status)) throw CaptureRefused(message);
    throw Error(message);
  }
  auto captured = std::make_unique<CudaGraph>(graph);
  ++graphs_captured_;  // scratch replaced from now on is kept (replace_scratch)
  return captured;
}

void CudaBackend::discard_capture_impl() noexcept {
  CUDA_WARN(cudaSetDevice(device_));
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) {
    CUDA_WARN(cudaGraphDestroy(graph));
  }
  (void)cudaGetLastError();  // an invalidated capture's error is the one being reported
}

void CudaBackend::replay_impl(const CapturedOps& ops) {
  activate();  // Backend::replay checked that this backend captured it
  CUDA_CHECK(cudaGraphLaunch(static_cast<const CudaGraph&>(ops).exec(), stream_));
}

// ---- activation and elementwise -----------------------------------------------------------------

void CudaBackend::relu_forward_impl(const Tensor& x, const Tensor& y) {
  activate();
  kernels::relu_forward(x.f32(), y.f32(), x.numel(), stream_);
}

void CudaBackend::relu_backward_impl(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  activate();
  kernels::relu_backward(y.f32(), dy.f32(), dx.f32(), y.numel(), stream_);
}

// The masked channel sum: the reduction of the bias gradient this fused ReLU's layer would
// compute from dx, so the bits are those of relu_backward then its db: a convolution's (rank 4:
// two levels through the reduction scratch, which every convolution plan reserves for its
// channels) or a linear layer's (one pass); in bf16 each value is rounded as it joins the sum.
void CudaBackend::relu_backward_bias_impl(const Tensor& y, const Tensor& dy, const Tensor& dx,
                                          const Tensor& db) {
  activate();
  const int64_t n = y.shape[0], c = y.shape[1];
  float* partial = nullptr;
  bool nhwc = true;
  int64_t hw = 1;
  if (y.shape.rank == 4) {
    // Every convolution plan reserves it for its channels; a call of more channels than any
    // plan grows it, but not while a step is being captured.
    partial = regrow_reduce_scratch(static_cast<size_t>(kernels::kChannelSumGroups * c),
                                    "relu_backward_bias", c);
    nhwc = y.layout == Layout::nhwc;
    hw = y.shape[2] * y.shape[3];
  }
  kernels::channel_sum(dy.f32(), db.f32(), n, c, hw, nhwc, partial, stream_, bf16(), y.f32(),
                       dx.f32());
}

void CudaBackend::add_impl(const Tensor& a, const Tensor& b, const Tensor& y, float alpha) {
  activate();
  kernels::add(a.data, a.dtype == DType::bf16, b.data, b.dtype == DType::bf16, y.f32(), a.numel(),
               alpha, stream_);
}

void CudaBackend::scale_impl(const Tensor& t, float alpha) {
  activate();
  kernels::scale(t.f32(), t.numel(), alpha, stream_);
}

// ---- pooling ------------------------------------------------------------------------------------

void CudaBackend::avgpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  activate();
  kernels::avgpool_forward(pool_shape(g, x), x.f32(), y.f32(), stream_);
}

void CudaBackend::avgpool_backward_impl(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) {
  activate();
  kernels::avgpool_backward(pool_shape(g, dx), dy.f32(), dx.f32(), stream_);
}

void CudaBackend::maxpool_forward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  activate();
  kernels::maxpool_forward(pool_shape(g, x), x.f32(), y.f32(), stream_);
}

void CudaBackend::maxpool_backward_impl(const PoolGeometry& g, const Tensor& x, const Tensor& /*y*/,
                                        const Tensor& dy, const Tensor& dx) {
  // y is not needed: each window's winner is recomputed from x with the forward's tie rule.
  activate();
  kernels::maxpool_backward(pool_shape(g, x), x.f32(), dy.f32(), dx.f32(), stream_);
}

void CudaBackend::global_avgpool_forward_impl(const Tensor& x, const Tensor& y) {
  const Dims d = dims_of(x);
  activate();
  kernels::global_avgpool_forward(x.f32(), y.f32(), d.n, d.c, d.hw(), is_nhwc(x), stream_);
}

void CudaBackend::global_avgpool_backward_impl(const Tensor& dy, const Tensor& dx) {
  const Dims d = dims_of(dx);
  activate();
  kernels::global_avgpool_backward(dy.f32(), dx.f32(), d.n, d.c, d.hw(), is_nhwc(dx), stream_);
}

// ---- loss and metrics ---------------------------------------------------------------------------

void CudaBackend::softmax_cross_entropy_impl(const Tensor& logits, const Tensor& labels,
                                             float grad_scale, const Tensor& dlogits,
                                             const Tensor& loss_sum, const Tensor& correct,
                                             const Tensor* slot) {
  activate();
  kernels::softmax_cross_entropy(logits.f32(), labels.i32(), logits.shape[0], logits.shape[1],
                                 grad_scale, dlogits.f32(), loss_sum.f32(), correct.i32(),
                                 slot != nullptr ? slot->i32() : nullptr, correct.numel(), stream_);
}

void CudaBackend::count_correct_impl(const Tensor& logits, const Tensor& labels,
                                     const Tensor& correct, const Tensor* slot) {
  activate();
  kernels::softmax_cross_entropy(logits.f32(), labels.i32(), logits.shape[0], logits.shape[1], 0.0f,
                                 nullptr, nullptr, correct.i32(),
                                 slot != nullptr ? slot->i32() : nullptr, correct.numel(), stream_);
}

namespace {
kernels::DeviceRow device_row(const StepRow* row) {
  if (row == nullptr) return {};
  return {row->table.data, row->cursor.i32(), row->table.shape[0], row->table.shape[1]};
}
}  // namespace

void CudaBackend::advance_impl(const Tensor& cursor) {
  activate();
  kernels::advance(cursor.i32(), stream_);
}

// ---- optimizer ----------------------------------------------------------------------------------

namespace {
uint16_t* packed(const Tensor* t) {
  return t != nullptr ? static_cast<uint16_t*>(t->data) : nullptr;
}
}  // namespace

void CudaBackend::sgd_update_impl(const Tensor& params, const Tensor& grads,
                                  const Tensor* momentum_buf, const SgdParams& p,
                                  const StepRow* lr_row, const Tensor* params_bf16) {
  float* buf = p.momentum != 0.0f ? momentum_buf->f32() : nullptr;
  activate();
  kernels::sgd_update(params.f32(), grads.f32(), buf, params.numel(), p.lr, p.momentum,
                      p.weight_decay, p.nesterov, device_row(lr_row), packed(params_bf16), stream_);
}

void CudaBackend::adamw_update_impl(const Tensor& params, const Tensor& grads,
                                    const Tensor& exp_avg, const Tensor& exp_avg_sq,
                                    const AdamWParams& p, const StepRow* step_row,
                                    const Tensor* params_bf16) {
  // The step's scalars as the CPU twin computes them (adamw_step), or read from the row.
  const AdamWStep s = adamw_step(p);
  activate();
  kernels::adamw_update(params.f32(), grads.f32(), exp_avg.f32(), exp_avg_sq.f32(), params.numel(),
                        s.step_size, s.decay, p.beta1, p.beta2, p.eps, s.bias2_sqrt,
                        device_row(step_row), packed(params_bf16), stream_);
}

void CudaBackend::pack_bf16_impl(const Tensor& x, const Tensor& y) {
  activate();
  kernels::to_bf16(x.f32(), static_cast<uint16_t*>(y.data), x.numel(), stream_);
}

// ---- data ---------------------------------------------------------------------------------------

static_assert(kernels::kMaxNormChannels == kMaxNormaliseChannels,
              "the kernel's normalisation arguments hold what the trainer accepts");

void CudaBackend::gather_batch_impl(const Tensor& images, const Tensor& labels,
                                    const Tensor& indices, const Tensor& x, const Tensor& y,
                                    const StepRow* start, const GatherTransform* transform) {
  const Dims d = dims_of(x);
  activate();
  kernels::GatherAugment aug;
  if (transform != nullptr) {
    if (transform->mean.size() > static_cast<size_t>(kernels::kMaxNormChannels)) {
      fail("gather_batch", "normalisation of " + std::to_string(transform->mean.size()) +
                               " channels is not supported (at most " +
                               std::to_string(kernels::kMaxNormChannels) + ")");
    }
    aug.active = true;
    aug.pad = transform->crop_padding;
    aug.draws = transform->draws != nullptr ? transform->draws->i32() : nullptr;
    aug.channels = static_cast<int>(transform->mean.size());
    for (size_t c = 0; c < transform->mean.size(); ++c) {
      aug.mean[c] = transform->mean[c];
      aug.std[c] = transform->std[c];
    }
  }
  kernels::gather_batch(images.u8(), labels.u8(), images.shape[0], indices.i32(), indices.shape[0],
                        device_row(start), d.n, d.c, d.h, d.w, is_nhwc(x), aug, x.f32(), y.i32(),
                        stream_);
}

// ---- entry points ------------------------------------------------------------------------------

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return count;
}

CudaVersions versions() noexcept {
  CudaVersions v;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
  (void)cudaGetLastError();
  v.cudnn = cudnnGetVersion();
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    v.cublas = major * 10000 + minor * 100 + patch;
  }
  if (ncclGetVersion(&v.nccl) != ncclSuccess) v.nccl = 0;
  return v;
}

void profiler(bool start) {
  if (start) {
    CUDA_CHECK(cudaProfilerStart());
  } else {
    CUDA_CHECK(cudaProfilerStop());
  }
}

std::string device_name(int index) {
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw Error("CUDA device " + std::to_string(index) + " does not exist (" +
                std::to_string(count) + " visible)");
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

}  // namespace dp::cuda
