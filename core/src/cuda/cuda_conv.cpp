// Convolutions through cuDNN's legacy (v7-style) API. A plan holds the filter descriptor and, per
// batch size, the tensor/convolution descriptors and one algorithm per direction (forward,
// backward-data, backward-filter). The directions and batch sizes a layer will use are declared
// at plan time (dp::ConvUse), so every algorithm is chosen, and the shared workspace grown,
// before the step loop; a layer whose input needs no gradient never asks cuDNN for a
// backward-data algorithm. A batch size or direction first met later still works: its algorithm
// is chosen then, within the workspace already reserved, without allocating.
//
// Choice, measured (the default; DPRUN_CUDNN_CHOICE=measured): cuDNN times its algorithms for
// the shape (cudnnFind*AlgorithmEx on scratch buffers, at plan time) and the fastest that is
// deterministic, runs with the wanted math (exact fp32 = FMA unless TF32 is allowed) and fits
// the workspace is kept, in memory and on disk (dp::ChoiceCache, one file per cuDNN, CUDA and
// device), so the next run, and every replica of this one, takes the same algorithm without
// timing again. Timings vary, so a shape's first measurement decides for every later run on that
// machine; DPRUN_CUDNN_CHOICE=heuristic never times. Heuristic (and the fallback when
// measuring gives nothing usable): cuDNN's heuristics (cudnnGet*_v7) in their order, then the
// algorithms every configuration supports; the first that runs with the wanted math, is
// deterministic (a run is reproducible; a non-deterministic one only when nothing else fits,
// with a warning), and whose workspace fits. DPRUN_CUDNN_LOG=1 prints every choice.
//
// Filters are (K, C, R, S) in memory whatever the activation layout (PyTorch's parameter
// layout). For NHWC activations cuDNN is given the all-NHWC configuration (its fast path):
// the filter is transposed to (K, R, S, C) into scratch for forward/backward-data, and the
// filter gradient is computed as (K, R, S, C) and transposed back.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/choice_cache.hpp"
#include "dp/error.hpp"

namespace dp::cuda {

/// The most workspace one convolution may use (PyTorch lets cuDNN use what is free; a bound
/// keeps k replicas on one GPU predictable).
constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

namespace {
enum Direction : int { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
constexpr std::array<const char*, 3> kDirectionNames = {"forward", "backward-data",
                                                        "backward-filter"};
}  // namespace

struct ConvBatch {
  struct Choice {
    bool chosen = false;
    int algo = 0;
    size_t workspace = 0;
    cudnnMathType_t math = CUDNN_FMA_MATH;
  };
  int64_t n = 0;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  // One convolution descriptor per direction: each carries its algorithm's math type.
  std::array<cudnnConvolutionDescriptor_t, 3> conv{};
  std::array<Choice, 3> choice{};

  ConvBatch() = default;
  ConvBatch(const ConvBatch&) = delete;
  ConvBatch& operator=(const ConvBatch&) = delete;
  ~ConvBatch() {
    if (x != nullptr) CUDNN_WARN(cudnnDestroyTensorDescriptor(x));
    if (y != nullptr) CUDNN_WARN(cudnnDestroyTensorDescriptor(y));
    for (auto* c : conv) {
      if (c != nullptr) CUDNN_WARN(cudnnDestroyConvolutionDescriptor(c));
    }
  }
};

class CudnnConvPlan final : public ConvPlan {
 public:
  CudnnConvPlan(const ConvGeometry& g, std::string layer) : ConvPlan(g), layer_(std::move(layer)) {
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
  /// Per batch size and direction: cuDNN's algorithm, its math type and workspace.
  std::string implementation() const override {
    std::string out;
    for (const auto& b : batches) {
      for (int d = 0; d < 3; ++d) {
        if (!b->choice[d].chosen) continue;
        const ConvBatch::Choice& c = b->choice[d];
        out += std::string(out.empty() ? "" : "; ") + "batch " + std::to_string(b->n) + " " +
               kDirectionNames[d] + ": cuDNN algo " + std::to_string(c.algo) +
               (c.math == CUDNN_DEFAULT_MATH ? ", default math"
                : c.math == CUDNN_FMA_MATH   ? ", fp32 math"
                                             : ", tensor-op math") +
               ", workspace " + std::to_string(c.workspace) + " bytes";
      }
    }
    return out.empty() ? "cuDNN, no algorithm chosen yet" : out;
  }
  /// "layer resnet_block2.0.conv1 (conv 64->128 ... nhwc f32)", or the geometry alone.
  std::string describe() const {
    return layer_.empty() ? geometry().str() : "layer " + layer_ + " (" + geometry().str() + ")";
  }

  cudnnFilterDescriptor_t w_desc = nullptr;
  std::vector<std::unique_ptr<ConvBatch>> batches;

 private:
  std::string layer_;
};

namespace {

CudnnConvPlan& as_cudnn(ConvPlan& plan) { return static_cast<CudnnConvPlan&>(plan); }

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > (int64_t{1} << 30))
    fail("plan_conv", std::string(what) + " too large for cuDNN");
  return static_cast<int>(v);
}

void set_tensor(cudnnTensorDescriptor_t d, bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w) {
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                         CUDNN_DATA_FLOAT, to_int(n, "N"), to_int(c, "C"),
                                         to_int(h, "H"), to_int(w, "W")));
}

void set_conv(cudnnConvolutionDescriptor_t d, const ConvGeometry& g, cudnnMathType_t math) {
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      d, static_cast<int>(g.pad_h), static_cast<int>(g.pad_w), static_cast<int>(g.stride_h),
      static_cast<int>(g.stride_w), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "default";
    case CUDNN_TENSOR_OP_MATH:
      return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "tensor-op-conversion";
    case CUDNN_FMA_MATH:
      return "fma";
  }
  return "?";
}

bool log_choices() {
  static const bool on = [] {
    const char* v = std::getenv("DPRUN_CUDNN_LOG");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return on;
}

/// One algorithm to try: from cuDNN's heuristics (with what they reported) or from the fallback
/// list (every configuration supports these).
struct Candidate {
  int algo = 0;
  bool deterministic = true;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;  // what the heuristics suggested
};

/// cuDNN's heuristic order, then the fallbacks not already listed. Entries cuDNN reports as
/// failed are dropped; everything else is verified by the workspace query.
template <typename Perf>
std::vector<Candidate> candidates(const Perf* perf, int returned,
                                  std::initializer_list<std::pair<int, bool>> fallbacks) {
  std::vector<Candidate> out;
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    out.push_back({static_cast<int>(perf[i].algo), perf[i].determinism == CUDNN_DETERMINISTIC,
                   perf[i].mathType});
  }
  for (const auto& [algo, deterministic] : fallbacks) {
    const bool listed =
        std::any_of(out.begin(), out.end(), [&](const Candidate& c) { return c.algo == algo; });
    if (!listed) out.push_back({algo, deterministic, CUDNN_DEFAULT_MATH});
  }
  return out;
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

std::unique_ptr<ConvPlan> CudaBackend::plan_conv_impl(const ConvGeometry& g, const ConvUse& use) {
  if (g.dtype != DType::f32) {
    fail("plan_conv",
         std::string("dtype ") + dtype_name(g.dtype) + " is not supported (f32) in " + g.str());
  }
  activate();
  auto plan = std::make_unique<CudnnConvPlan>(g, use.layer);
  if (plan->nhwc()) reserve_filter_scratch(2 * static_cast<size_t>(plan->filter_numel()));
  reserve_reduce_scratch(static_cast<size_t>(kernels::kChannelSumGroups * g.out_channels));
  std::vector<int64_t> train = use.train_batches;
  if (train.empty() && use.infer_batches.empty()) train.push_back(g.max_batch);
  for (int64_t n : train) {
    conv_batch(*plan, n, kForward, true);
    conv_batch(*plan, n, kBackwardFilter, true);
    if (use.input_grad) conv_batch(*plan, n, kBackwardData, true);
  }
  for (int64_t n : use.infer_batches) conv_batch(*plan, n, kForward, true);
  return plan;
}

ConvBatch& CudaBackend::conv_batch(CudnnConvPlan& plan, int64_t n, int direction,
                                   bool at_plan_time) {
  ConvBatch* b = nullptr;
  for (auto& existing : plan.batches) {
    if (existing->n == n) b = existing.get();
  }
  if (b == nullptr) {
    const ConvGeometry& g = plan.geometry();
    auto fresh = std::make_unique<ConvBatch>();
    fresh->n = n;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&fresh->x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&fresh->y));
    for (auto& c : fresh->conv) CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&c));
    set_tensor(fresh->x, plan.nhwc(), n, g.in_channels, g.in_h, g.in_w);
    set_tensor(fresh->y, plan.nhwc(), n, g.out_channels, g.out_h(), g.out_w());
    for (auto* c : fresh->conv) set_conv(c, g, allow_tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
    int on = 0, oc = 0, oh = 0, ow = 0;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(fresh->conv[kForward], fresh->x, plan.w_desc,
                                                      &on, &oc, &oh, &ow));
    if (on != n || oc != g.out_channels || oh != g.out_h() || ow != g.out_w()) {
      throw InternalError("cuda backend: cuDNN's output shape (" + std::to_string(on) + ", " +
                          std::to_string(oc) + ", " + std::to_string(oh) + ", " +
                          std::to_string(ow) + ") differs from the plan " + g.str());
    }
    plan.batches.push_back(std::move(fresh));
    b = plan.batches.back().get();
  }
  if (!b->choice[static_cast<size_t>(direction)].chosen) {
    choose_algorithm(plan, *b, direction, at_plan_time ? kMaxWorkspaceBytes : workspace_bytes_,
                     at_plan_time);
    if (at_plan_time) reserve_workspace(b->choice[static_cast<size_t>(direction)].workspace);
  }
  return *b;
}

namespace {

/// Backend memory for one measurement, released when it goes (after the stream is idle).
class Scratch {
 public:
  Scratch(CudaBackend& backend, cudaStream_t stream, size_t bytes)
      : backend_(backend), stream_(stream), p_(backend.allocate(bytes == 0 ? 256 : bytes)) {
    const cudaError_t status = cudaMemsetAsync(p_, 0, bytes, stream_);
    if (status != cudaSuccess) {
      backend_.release(p_);  // the destructor of a half-made object does not run
      throw_library_error("CUDA", "cudaMemsetAsync(measurement scratch)", __FILE__, __LINE__,
                          cudaGetErrorString(status));
    }
  }
  ~Scratch() {
    CUDA_WARN(cudaStreamSynchronize(stream_));
    backend_.release(p_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }

 private:
  CudaBackend& backend_;
  cudaStream_t stream_;
  void* p_;
};

/// The fastest of cuDNN's timed results that succeeded, is deterministic, fits `limit` and runs
/// with acceptable math ("algo A math M workspace W ms T"), or "" (nothing is then cached). Exact
/// fp32 accepts FMA math only (default math may use TF32 on Ampere and later).
template <typename Perf>
std::string fastest(const Perf* perf, int returned, size_t limit, bool allow_tf32) {
  for (int i = 0; i < returned; ++i) {  // cuDNN sorts them by time
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC ||
        p.memory > limit || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
        (!allow_tf32 && p.mathType != CUDNN_FMA_MATH)) {
      continue;
    }
    char text[128];
    std::snprintf(text, sizeof text, "algo %d math %d workspace %zu ms %.4f",
                  static_cast<int>(p.algo), static_cast<int>(p.mathType), p.memory,
                  static_cast<double>(p.time));
    return text;
  }
  return "";
}

}  // namespace

bool CudaBackend::choose_measured(CudnnConvPlan& plan, ConvBatch& b, int direction, size_t limit) {
  const auto d = static_cast<size_t>(direction);
  cudnnConvolutionDescriptor_t conv = b.conv[d];
  const cudnnMathType_t wanted = allow_tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  ConvGeometry shape = plan.geometry();
  shape.max_batch = b.n;  // the key names the batch measured, not the plan's largest
  const std::string key = std::string(kDirectionNames[d]) + " " + shape.str() +
                          (allow_tf32_ ? " tf32" : " fp32") +
                          " workspace<=" + std::to_string(limit);
  const auto measure = [&]() -> std::string {
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, wanted));
    const ConvGeometry& g = plan.geometry();
    const auto floats = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
    Scratch x(*this, stream_, floats(b.n * g.in_channels * g.in_h * g.in_w));
    Scratch y(*this, stream_, floats(b.n * g.out_channels * g.out_h() * g.out_w()));
    Scratch w(*this, stream_, floats(plan.filter_numel()));
    Scratch ws(*this, stream_, limit);
    int returned = 0;
    if (direction == kForward) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
          cudnn_, b.x, x.get(), plan.w_desc, w.get(), conv, b.y, y.get(),
          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf, ws.get(), limit));
      return fastest(perf, returned, limit, allow_tf32_);
    }
    if (direction == kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          cudnn_, plan.w_desc, w.get(), b.y, y.get(), conv, b.x, x.get(),
          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf, ws.get(), limit));
      return fastest(perf, returned, limit, allow_tf32_);
    }
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        cudnn_, b.x, x.get(), b.y, y.get(), conv, plan.w_desc, w.get(),
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf, ws.get(), limit));
    return fastest(perf, returned, limit, allow_tf32_);
  };
  const auto give_up = [&](const std::string& why) {
    CUDNN_WARN(cudnnSetConvolutionMathType(conv, wanted));
    std::fprintf(stderr,
                 "dprun: warning: cuda backend: %s %s at batch %lld: %s; using cuDNN's "
                 "heuristics\n",
                 plan.describe().c_str(), kDirectionNames[d], static_cast<long long>(b.n),
                 why.c_str());
    return false;
  };
  std::string value;
  try {
    value = ChoiceCache::shared(choice_scope_).find_or_measure(key, measure);
  } catch (const Error& e) {
    return give_up(std::string("timing the algorithms failed (") + e.what() + ")");
  }
  if (value.empty()) return false;  // nothing deterministic within the limit: heuristics
  int algo = 0, math = 0;
  unsigned long long recorded_ws = 0;
  double ms = 0;
  if (std::sscanf(value.c_str(), "algo %d math %d workspace %llu ms %lf", &algo, &math,
                  &recorded_ws, &ms) != 4) {
    return give_up("the recorded choice '" + value + "' does not parse");
  }
  const auto m = static_cast<cudnnMathType_t>(math);
  const bool known = m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH;
  if (!known || (!allow_tf32_ && m != CUDNN_FMA_MATH)) {
    return give_up("the recorded choice '" + value + "' has a math type this run cannot use");
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv, m));
  size_t need = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  if (direction == kForward) {
    status = cudnnGetConvolutionForwardWorkspaceSize(
        cudnn_, b.x, plan.w_desc, conv, b.y, static_cast<cudnnConvolutionFwdAlgo_t>(algo), &need);
  } else if (direction == kBackwardData) {
    status = cudnnGetConvolutionBackwardDataWorkspaceSize(
        cudnn_, plan.w_desc, b.y, conv, b.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo),
        &need);
  } else {
    status = cudnnGetConvolutionBackwardFilterWorkspaceSize(
        cudnn_, b.x, b.y, conv, plan.w_desc, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo),
        &need);
  }
  if (status != CUDNN_STATUS_SUCCESS || need > limit) {
    return give_up("the recorded algorithm " + std::to_string(algo) +
                   " does not run here within the workspace (" + cudnnGetErrorString(status) + ")");
  }
  b.choice[d] = {true, algo, need, m};
  if (log_choices()) {
    std::fprintf(stderr,
                 "dprun: cudnn: %s batch %lld %s: algo %d, %s math, workspace %zu bytes, "
                 "measured %.4f ms%s\n",
                 plan.describe().c_str(), static_cast<long long>(b.n), kDirectionNames[d], algo,
                 math_name(m), need, ms,
                 limit == kMaxWorkspaceBytes ? "" : " (chosen after setup)");
  }
  return true;
}

void CudaBackend::choose_algorithm(CudnnConvPlan& plan, ConvBatch& b, int direction, size_t limit,
                                   bool at_plan_time) {
  // Timing needs scratch memory: only at plan time, never in a step.
  if (measure_choices_ && at_plan_time && choose_measured(plan, b, direction, limit)) return;
  cudnnConvolutionDescriptor_t conv = b.conv[static_cast<size_t>(direction)];
  std::vector<Candidate> list;
  // The workspace of `algo` run with the math type now set on `conv`.
  std::function<cudnnStatus_t(int, size_t*)> query;
  if (direction == kForward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        cudnn_, b.x, plan.w_desc, conv, b.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
    list = candidates(perf, returned,
                      {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true},
                       {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true}});
    query = [&](int algo, size_t* ws) {
      return cudnnGetConvolutionForwardWorkspaceSize(
          cudnn_, b.x, plan.w_desc, conv, b.y, static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws);
    };
  } else if (direction == kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, plan.w_desc, b.y, conv, b.x,
                                                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                            &returned, perf));
    list = candidates(
        perf, returned,
        {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true}, {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false}});
    query = [&](int algo, size_t* ws) {
      return cudnnGetConvolutionBackwardDataWorkspaceSize(
          cudnn_, plan.w_desc, b.y, conv, b.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo),
          ws);
    };
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        cudnn_, b.x, b.y, conv, plan.w_desc, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned,
        perf));
    list = candidates(perf, returned,
                      {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true},
                       {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false},
                       {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, false}});
    query = [&](int algo, size_t* ws) {
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(
          cudnn_, b.x, b.y, conv, plan.w_desc, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo),
          ws);
    };
  }
  const char* name = kDirectionNames[static_cast<size_t>(direction)];
  ConvBatch::Choice& choice = b.choice[static_cast<size_t>(direction)];
  // Exact fp32 runs every algorithm with FMA math, whatever the heuristics suggested for it (the
  // descriptor's math type decides what runs; an algorithm without an FMA kernel fails the
  // query). With TF32 allowed the heuristics' math type is used, never a down-conversion.
  const auto math_for = [&](const Candidate& c) {
    if (!allow_tf32_) return CUDNN_FMA_MATH;
    return c.math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? CUDNN_TENSOR_OP_MATH : c.math;
  };
  const auto try_pass = [&](bool deterministic_only) {
    for (const Candidate& c : list) {
      if (deterministic_only && !c.deterministic) continue;
      const cudnnMathType_t math = math_for(c);
      CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
      size_t ws = 0;
      if (query(c.algo, &ws) != CUDNN_STATUS_SUCCESS || ws > limit) continue;
      choice = {true, c.algo, ws, math};
      return true;
    }
    return false;
  };
  if (!try_pass(true)) {
    if (!try_pass(false)) {
      CUDNN_WARN(
          cudnnSetConvolutionMathType(conv, allow_tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
      fail("plan_conv", std::string("cuDNN offers no ") + name + " algorithm for " +
                            plan.describe() + " at batch " + std::to_string(b.n) +
                            " within a workspace of " + std::to_string(limit >> 20) + " MiB" +
                            (allow_tf32_ ? ": use a smaller batch per replica"
                                         : " with exact fp32 (FMA) math: allow TF32, or use a "
                                           "smaller batch per replica"));
    }
    std::fprintf(
        stderr,
        "dprun: warning: cuda backend: no deterministic %s algorithm for %s at batch %lld; "
        "using a non-deterministic one (results may vary from run to run)\n",
        name, plan.describe().c_str(), static_cast<long long>(b.n));
  }
  if (log_choices()) {
    std::fprintf(stderr,
                 "dprun: cudnn: %s batch %lld %s: algo %d, %s math, workspace %zu bytes%s\n",
                 plan.describe().c_str(), static_cast<long long>(b.n), name, choice.algo,
                 math_name(choice.math), choice.workspace,
                 limit == kMaxWorkspaceBytes ? "" : " (chosen after setup)");
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

void CudaBackend::conv_forward_impl(ConvPlan& plan_base, const Tensor& x, const Tensor& w,
                                    const Tensor* b, const Tensor& y) {
  CudnnConvPlan& plan = as_cudnn(plan_base);
  const ConvGeometry& g = plan.geometry();
  const int64_t n = x.shape[0];
  activate();
  ConvBatch& cb = conv_batch(plan, n, kForward, false);
  const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(cb.choice[kForward].algo);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, cb.x, x.data, plan.w_desc, filter_for(plan, w),
                                      cb.conv[kForward], algo, workspace_, workspace_bytes_, &zero,
                                      cb.y, y.data));
  if (b != nullptr) {
    kernels::bias_add(y.f32(), b->f32(), n, g.out_channels, g.out_h() * g.out_w(), plan.nhwc(),
                      stream_);
  }
}

void CudaBackend::conv_backward_data_impl(ConvPlan& plan_base, const Tensor& dy, const Tensor& w,
                                          const Tensor& dx) {
  CudnnConvPlan& plan = as_cudnn(plan_base);
  activate();
  ConvBatch& cb = conv_batch(plan, dy.shape[0], kBackwardData, false);
  const auto algo = static_cast<cudnnConvolutionBwdDataAlgo_t>(cb.choice[kBackwardData].algo);
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, plan.w_desc, filter_for(plan, w), cb.y,
                                           dy.data, cb.conv[kBackwardData], algo, workspace_,
                                           workspace_bytes_, &zero, cb.x, dx.data));
}

void CudaBackend::conv_backward_filter_impl(ConvPlan& plan_base, const Tensor& x, const Tensor& dy,
                                            const Tensor& dw, const Tensor* db) {
  CudnnConvPlan& plan = as_cudnn(plan_base);
  const ConvGeometry& g = plan.geometry();
  const int64_t n = x.shape[0];
  activate();
  ConvBatch& cb = conv_batch(plan, n, kBackwardFilter, false);
  const auto algo = static_cast<cudnnConvolutionBwdFilterAlgo_t>(cb.choice[kBackwardFilter].algo);
  const float one = 1.0f, zero = 0.0f;
  float* target = plan.nhwc() ? filter_scratch_ + plan.filter_numel() : dw.f32();
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, cb.x, x.data, cb.y, dy.data,
                                             cb.conv[kBackwardFilter], algo, workspace_,
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
