// Convolutions through cuDNN's legacy (v7-style) API. A plan holds the filter descriptor and, per
// batch size seen, the tensor/convolution descriptors and the algorithms chosen once by cuDNN's
// heuristics (cudnnGet*_v7): the fastest that fits the workspace bound, exact fp32 (FMA math)
// unless TF32 is allowed, and deterministic for the two backward passes, so a run is
// reproducible. The workspace is one buffer per backend, grown at plan time only; a batch size
// first seen in the step loop (a last partial batch) gets algorithms that fit what is there.
//
// Filters are (K, C, R, S) in memory whatever the activation layout (PyTorch's parameter
// layout). For NHWC activations cuDNN is given the all-NHWC configuration (its fast path):
// the filter is transposed to (K, R, S, C) into scratch for forward/backward-data, and the
// filter gradient is computed as (K, R, S, C) and transposed back.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/error.hpp"

namespace dp::cuda {

/// The most workspace one convolution may use (PyTorch lets cuDNN use what is free; a bound
/// keeps k replicas on one GPU predictable).
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

struct ConvBatch {
  int64_t n = 0;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnConvolutionDescriptor_t fwd_conv = nullptr, data_conv = nullptr, filter_conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnConvolutionBwdDataAlgo_t data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  cudnnConvolutionBwdFilterAlgo_t filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;

  ConvBatch() = default;
  ConvBatch(const ConvBatch&) = delete;
  ConvBatch& operator=(const ConvBatch&) = delete;
  ~ConvBatch() {
    if (x != nullptr) CUDNN_WARN(cudnnDestroyTensorDescriptor(x));
    if (y != nullptr) CUDNN_WARN(cudnnDestroyTensorDescriptor(y));
    for (auto* c : {fwd_conv, data_conv, filter_conv}) {
      if (c != nullptr) CUDNN_WARN(cudnnDestroyConvolutionDescriptor(c));
    }
  }
  size_t max_workspace() const { return std::max({fwd_ws, data_ws, filter_ws}); }
};

class CudnnConvPlan final : public ConvPlan {
 public:
  explicit CudnnConvPlan(const ConvGeometry& g) : ConvPlan(g) {
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc));
    const cudnnStatus_t status = cudnnSetFilter4dDescriptor(
        w_desc, CUDNN_DATA_FLOAT, nhwc() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
        static_cast<int>(g.out_channels), static_cast<int>(g.in_channels),
        static_cast<int>(g.kernel_h), static_cast<int>(g.kernel_w));
    if (status != CUDNN_STATUS_SUCCESS) {
      CUDNN_WARN(cudnnDestroyFilterDescriptor(w_desc));
      CUDNN_CHECK(status);
    }
  }
  ~CudnnConvPlan() override {
    batches.clear();
    CUDNN_WARN(cudnnDestroyFilterDescriptor(w_desc));
  }
  bool nhwc() const { return geometry().layout == Layout::nhwc; }
  int64_t filter_numel() const {
    const ConvGeometry& g = geometry();
    return g.out_channels * g.in_channels * g.kernel_h * g.kernel_w;
  }

  cudnnFilterDescriptor_t w_desc = nullptr;
  std::vector<std::unique_ptr<ConvBatch>> batches;
};

namespace {

CudnnConvPlan& as_cudnn(ConvPlan& plan, const char* op) {
  auto* p = dynamic_cast<CudnnConvPlan*>(&plan);
  if (p == nullptr) fail(op, "the plan was not made by this cuda backend's plan_conv");
  return *p;
}

int to_int(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > (int64_t{1} << 30)) fail(op, std::string(what) + " out of range for cuDNN");
  return static_cast<int>(v);
}

void set_tensor(cudnnTensorDescriptor_t d, bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w) {
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, to_int(n, "conv", "N"),
      to_int(c, "conv", "C"), to_int(h, "conv", "H"), to_int(w, "conv", "W")));
}

void set_conv(cudnnConvolutionDescriptor_t d, const ConvGeometry& g, cudnnMathType_t math) {
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      d, static_cast<int>(g.pad_h), static_cast<int>(g.pad_w), static_cast<int>(g.stride_h),
      static_cast<int>(g.stride_w), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
}

/// Exact fp32 mode accepts only FMA (or default, which the FMA descriptor resolves to) math;
/// TF32 mode accepts tensor-op math but never down-conversion to fp16.
bool math_ok(cudnnMathType_t m, bool allow_tf32) {
  if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return allow_tf32 || m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
}

/// Validates the (N,C,H,W) activation `t` against the plan's geometry; returns N.
int64_t check_activation(const ConvGeometry& g, const Tensor& t, int64_t c, int64_t h, int64_t w,
                         const char* op, const char* what) {
  const Dims d = activation_dims(t, op, what);
  if (d.c != c || d.h != h || d.w != w || d.n > g.max_batch) {
    fail(op, std::string(what) + " has shape " + t.shape.str() +
                 ", expected (N <= " + std::to_string(g.max_batch) + ", " + std::to_string(c) +
                 ", " + std::to_string(h) + ", " + std::to_string(w) + ") for the plan " + g.str());
  }
  if (t.layout != g.layout) {
    fail(op, std::string(what) + " is " + layout_name(t.layout) + " but the plan is " +
                 layout_name(g.layout));
  }
  return d.n;
}

void check_filter(const CudnnConvPlan& plan, const Tensor& w, const char* op, const char* what) {
  expect_f32(w, op, what);
  const ConvGeometry& g = plan.geometry();
  expect_numel(w, plan.filter_numel(), op, what);
  if (w.shape.rank == 4 && (w.shape[0] != g.out_channels || w.shape[1] != g.in_channels ||
                            w.shape[2] != g.kernel_h || w.shape[3] != g.kernel_w)) {
    fail(op, std::string(what) + " has shape " + w.shape.str() + ", expected (K, C, R, S) = (" +
                 std::to_string(g.out_channels) + ", " + std::to_string(g.in_channels) + ", " +
                 std::to_string(g.kernel_h) + ", " + std::to_string(g.kernel_w) + ")");
  }
}

}  // namespace

// ---- scratch, grown at plan time only -----------------------------------------------------------

void CudaBackend::reserve_workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return;
  // Queued work may still use the old buffer.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  release(workspace_);
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  workspace_ = allocate(bytes);
  workspace_bytes_ = bytes;
}

void CudaBackend::reserve_filter_scratch(size_t floats) {
  if (floats <= filter_scratch_floats_) return;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  release(filter_scratch_);
  filter_scratch_ = nullptr;
  filter_scratch_floats_ = 0;
  filter_scratch_ = static_cast<float*>(allocate(floats * sizeof(float)));
  filter_scratch_floats_ = floats;
}

void CudaBackend::reserve_reduce_scratch(size_t floats) {
  if (floats <= reduce_scratch_floats_) return;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  release(reduce_scratch_);
  reduce_scratch_ = nullptr;
  reduce_scratch_floats_ = 0;
  reduce_scratch_ = static_cast<float*>(allocate(floats * sizeof(float)));
  reduce_scratch_floats_ = floats;
}

// ---- plans --------------------------------------------------------------------------------------

std::unique_ptr<ConvPlan> CudaBackend::plan_conv(const ConvGeometry& g) {
  const char* op = "plan_conv";
  if (g.dtype != DType::f32)
    fail(op, std::string("dtype ") + dtype_name(g.dtype) + " is not supported (f32)");
  if (g.max_batch < 1 || g.in_channels < 1 || g.in_h < 1 || g.in_w < 1 || g.out_channels < 1 ||
      g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 ||
      g.pad_w < 0) {
    fail(op, "every size must be positive and padding non-negative, got " + g.str());
  }
  // out_h() >= 1 is not enough: the division truncates toward zero.
  if (g.in_h + 2 * g.pad_h < g.kernel_h || g.in_w + 2 * g.pad_w < g.kernel_w) {
    fail(op, "the kernel is larger than the padded input in " + g.str());
  }
  activate();
  auto plan = std::make_unique<CudnnConvPlan>(g);
  if (plan->nhwc()) reserve_filter_scratch(2 * static_cast<size_t>(plan->filter_numel()));
  reserve_reduce_scratch(static_cast<size_t>(kernels::kChannelSumGroups * g.out_channels));
  conv_batch(*plan, g.max_batch, /*at_plan_time=*/true);
  return plan;
}

ConvBatch& CudaBackend::conv_batch(CudnnConvPlan& plan, int64_t n, bool at_plan_time) {
  for (auto& b : plan.batches) {
    if (b->n == n) return *b;
  }
  const ConvGeometry& g = plan.geometry();
  auto b = std::make_unique<ConvBatch>();
  b->n = n;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&b->x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&b->y));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&b->fwd_conv));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&b->data_conv));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&b->filter_conv));
  set_tensor(b->x, plan.nhwc(), n, g.in_channels, g.in_h, g.in_w);
  set_tensor(b->y, plan.nhwc(), n, g.out_channels, g.out_h(), g.out_w());
  const cudnnMathType_t math = allow_tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  for (auto* c : {b->fwd_conv, b->data_conv, b->filter_conv}) set_conv(c, g, math);
  int on = 0, oc = 0, oh = 0, ow = 0;
  CUDNN_CHECK(
      cudnnGetConvolution2dForwardOutputDim(b->fwd_conv, b->x, plan.w_desc, &on, &oc, &oh, &ow));
  if (on != n || oc != g.out_channels || oh != g.out_h() || ow != g.out_w()) {
    throw InternalError("cuda backend: cuDNN's output shape (" + std::to_string(on) + ", " +
                        std::to_string(oc) + ", " + std::to_string(oh) + ", " + std::to_string(ow) +
                        ") differs from the plan " + g.str());
  }
  choose_algorithms(plan, *b, at_plan_time ? kMaxWorkspaceBytes : workspace_bytes_);
  if (at_plan_time) reserve_workspace(b->max_workspace());
  plan.batches.push_back(std::move(b));
  return *plan.batches.back();
}

namespace {

/// The first algorithm, in cuDNN's heuristic order, that succeeded, has an acceptable math type,
/// is deterministic when asked, and whose workspace (queried with the math type it will run with)
/// fits `limit`. In TF32 mode the descriptor takes the algorithm's math type, as cuDNN asks for
/// _v7 results; in exact mode it stays FMA.
template <typename Perf, typename Algo, typename WorkspaceQuery>
bool pick_algorithm(const Perf* perf, int returned, bool deterministic, bool allow_tf32,
                    size_t limit, cudnnConvolutionDescriptor_t conv, WorkspaceQuery query,
                    Algo& algo, size_t& workspace) {
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || !math_ok(perf[i].mathType, allow_tf32)) continue;
    if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (allow_tf32) CUDNN_CHECK(cudnnSetConvolutionMathType(conv, perf[i].mathType));
    size_t ws = 0;
    if (query(perf[i].algo, &ws) != CUDNN_STATUS_SUCCESS || ws > limit) continue;
    algo = perf[i].algo;
    workspace = ws;
    return true;
  }
  return false;
}

}  // namespace

void CudaBackend::choose_algorithms(CudnnConvPlan& plan, ConvBatch& b, size_t limit) {
  const ConvGeometry& g = plan.geometry();
  // Deterministic algorithms first (a run is reproducible); if cuDNN offers none within the
  // workspace, the fastest other one, with a warning, rather than failing the trial.
  const auto choose = [&](const char* direction, auto&& try_pick) {
    if (try_pick(true)) return;
    if (try_pick(false)) {
      std::fprintf(stderr,
                   "dprun: warning: cuda backend: no deterministic %s algorithm for %s at batch "
                   "%lld; using a non-deterministic one\n",
                   direction, g.str().c_str(), static_cast<long long>(b.n));
      return;
    }
    fail("plan_conv", std::string("cuDNN offers no ") + direction +
                          " algorithm within a workspace of " + std::to_string(limit >> 20) +
                          " MiB for " + g.str() + " at batch " + std::to_string(b.n));
  };
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, b.x, plan.w_desc, b.fwd_conv, b.y,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned,
                                                       perf));
    const auto query = [&](cudnnConvolutionFwdAlgo_t algo, size_t* ws) {
      return cudnnGetConvolutionForwardWorkspaceSize(cudnn_, b.x, plan.w_desc, b.fwd_conv, b.y,
                                                     algo, ws);
    };
    choose("forward", [&](bool deterministic) {
      return pick_algorithm(perf, returned, deterministic, allow_tf32_, limit, b.fwd_conv, query,
                            b.fwd_algo, b.fwd_ws);
    });
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        cudnn_, plan.w_desc, b.y, b.data_conv, b.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        &returned, perf));
    const auto query = [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* ws) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, plan.w_desc, b.y, b.data_conv,
                                                          b.x, algo, ws);
    };
    choose("backward-data", [&](bool deterministic) {
      return pick_algorithm(perf, returned, deterministic, allow_tf32_, limit, b.data_conv, query,
                            b.data_algo, b.data_ws);
    });
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        cudnn_, b.x, b.y, b.filter_conv, plan.w_desc, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        &returned, perf));
    const auto query = [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* ws) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, b.x, b.y, b.filter_conv,
                                                            plan.w_desc, algo, ws);
    };
    choose("backward-filter", [&](bool deterministic) {
      return pick_algorithm(perf, returned, deterministic, allow_tf32_, limit, b.filter_conv, query,
                            b.filter_algo, b.filter_ws);
    });
  }
}

const float* CudaBackend::filter_for(const CudnnConvPlan& plan, const Tensor& w) {
  if (!plan.nhwc()) return w.f32();
  const ConvGeometry& g = plan.geometry();
  kernels::kcrs_to_krsc(w.f32(), filter_scratch_, g.out_channels, g.in_channels,
                        g.kernel_h * g.kernel_w, stream_);
  return filter_scratch_;
}

// ---- ops ----------------------------------------------------------------------------------------

void CudaBackend::conv_forward(ConvPlan& plan_base, const Tensor& x, const Tensor& w,
                               const Tensor* b, const Tensor& y) {
  const char* op = "conv_forward";
  CudnnConvPlan& plan = as_cudnn(plan_base, op);
  const ConvGeometry& g = plan.geometry();
  const int64_t n = check_activation(g, x, g.in_channels, g.in_h, g.in_w, op, "x");
  check_filter(plan, w, op, "w");
  if (check_activation(g, y, g.out_channels, g.out_h(), g.out_w(), op, "y") != n) {
    fail(op, "x has " + std::to_string(n) + " examples but y has shape " + y.shape.str());
  }
  if (b != nullptr) {
    expect_f32(*b, op, "b");
    expect_numel(*b, g.out_channels, op, "b");
  }
  if (n == 0) return;
  activate();
  ConvBatch& cb = conv_batch(plan, n, false);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, cb.x, x.data, plan.w_desc, filter_for(plan, w),
                                      cb.fwd_conv, cb.fwd_algo, workspace_, workspace_bytes_, &zero,
                                      cb.y, y.data));
  if (b != nullptr) {
    kernels::bias_add(y.f32(), b->f32(), n, g.out_channels, g.out_h() * g.out_w(), plan.nhwc(),
                      stream_);
  }
}

void CudaBackend::conv_backward_data(ConvPlan& plan_base, const Tensor& dy, const Tensor& w,
                                     const Tensor& dx) {
  const char* op = "conv_backward_data";
  CudnnConvPlan& plan = as_cudnn(plan_base, op);
  const ConvGeometry& g = plan.geometry();
  const int64_t n = check_activation(g, dy, g.out_channels, g.out_h(), g.out_w(), op, "dy");
  check_filter(plan, w, op, "w");
  if (check_activation(g, dx, g.in_channels, g.in_h, g.in_w, op, "dx") != n) {
    fail(op, "dy has " + std::to_string(n) + " examples but dx has shape " + dx.shape.str());
  }
  if (n == 0) return;
  activate();
  ConvBatch& cb = conv_batch(plan, n, false);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, plan.w_desc, filter_for(plan, w), cb.y,
                                           dy.data, cb.data_conv, cb.data_algo, workspace_,
                                           workspace_bytes_, &zero, cb.x, dx.data));
}

void CudaBackend::conv_backward_filter(ConvPlan& plan_base, const Tensor& x, const Tensor& dy,
                                       const Tensor& dw, const Tensor* db) {
  const char* op = "conv_backward_filter";
  CudnnConvPlan& plan = as_cudnn(plan_base, op);
  const ConvGeometry& g = plan.geometry();
  const int64_t n = check_activation(g, x, g.in_channels, g.in_h, g.in_w, op, "x");
  if (check_activation(g, dy, g.out_channels, g.out_h(), g.out_w(), op, "dy") != n) {
    fail(op, "x has " + std::to_string(n) + " examples but dy has shape " + dy.shape.str());
  }
  check_filter(plan, dw, op, "dw");
  if (db != nullptr) {
    expect_f32(*db, op, "db");
    expect_numel(*db, g.out_channels, op, "db");
  }
  activate();
  if (n == 0) {  // the sum over no examples
    kernels::fill_f32(dw.f32(), plan.filter_numel(), 0.0f, stream_);
    if (db != nullptr) kernels::fill_f32(db->f32(), g.out_channels, 0.0f, stream_);
    return;
  }
  ConvBatch& cb = conv_batch(plan, n, false);
  const float one = 1.0f, zero = 0.0f;
  float* target = plan.nhwc() ? filter_scratch_ + plan.filter_numel() : dw.f32();
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, cb.x, x.data, cb.y, dy.data,
                                             cb.filter_conv, cb.filter_algo, workspace_,
                                             workspace_bytes_, &zero, plan.w_desc, target));
  if (plan.nhwc()) {
    kernels::krsc_to_kcrs(target, dw.f32(), g.out_channels, g.in_channels, g.kernel_h * g.kernel_w,
                          stream_);
  }
  if (db != nullptr) {
    kernels::channel_sum(dy.f32(), db->f32(), n, g.out_channels, g.out_h() * g.out_w(), plan.nhwc(),
                         reduce_scratch_, stream_);
  }
}

}  // namespace dp::cuda
