// Convolutions through cuDNN's legacy (v7-style) API. A plan holds the filter descriptor and, per
// batch size, the tensor/convolution descriptors and one algorithm per direction (forward,
// backward-data, backward-filter). The directions and batch sizes a layer will use are declared
// at plan time (dp::ConvUse), so every algorithm is chosen, and the shared workspace grown,
// before the step loop; a layer whose input needs no gradient never asks cuDNN for a
// backward-data algorithm. A batch size or direction first met later still works: its algorithm
// is chosen then, within the workspace already reserved, without allocating.
//
// Every choice stays inside the trial's precision contract (dp/conv_contract.hpp): exact fp32 takes
// GEMM and direct algorithms with FMA math only; TF32 takes what cuDNN offers; bf16 GEMM and
// direct algorithms with tensor-core or FMA math (no FFT or Winograd, which would round its bf16
// operands' transforms again); none a down-conversion to fp16. Timing and heuristics only order
// what the contract allows, and a cached choice outside it is refused, so no timing can change
// which contract holds.
//
// Choice, measured (the default; ConvChoice / DPRUN_CUDNN_CHOICE=measured): cuDNN times its
// algorithms for the shape (cudnnFind*AlgorithmEx on scratch buffers, at plan time) and the
// fastest that the contract allows, is deterministic and fits the workspace is kept, in memory and
// on disk (dp::ChoiceCache, one file per cuDNN, CUDA and device), so the next run, and every
// replica of this one, takes the same algorithm without timing again. Timings vary, so a shape's
// first measurement decides for every later run on that machine; the heuristic choice never times.
// Heuristic (and the fallback when measuring gives nothing usable): cuDNN's heuristics
// (cudnnGet*_v7) in their order, then the algorithms every configuration supports; the first that
// the contract allows, runs with its math, is deterministic (a run is reproducible; a
// non-deterministic one only when nothing else fits, with a warning), and whose workspace fits.
// DPRUN_CUDNN_LOG=1 prints every choice.
//
// For NHWC activations cuDNN is given the all-NHWC configuration (its fast path), whose filters
// are (K, R, S, C) in memory: the order an NHWC model's Conv2d stores its weight in
// (ConvUse::filter_layout nhwc), read and written as it is. A (K, C, R, S) filter (PyTorch's
// order, ConvUse::filter_layout nchw) for NHWC activations is transposed into scratch for
// forward/backward-data, and its gradient computed as (K, R, S, C) and transposed back.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_entry.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/choice_cache.hpp"
#include "dp/error.hpp"

namespace dp::cuda {

// The contract's tables (conv_contract.cpp) use cuDNN's numbers without cudnn.h: hold them to it.
static_assert(static_cast<int>(ConvMath::default_math) == CUDNN_DEFAULT_MATH &&
              static_cast<int>(ConvMath::tensor_op) == CUDNN_TENSOR_OP_MATH &&
              static_cast<int>(ConvMath::tensor_op_allow_conversion) ==
                  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
              static_cast<int>(ConvMath::fma) == CUDNN_FMA_MATH);
static_assert(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM == 0 &&
              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM == 1 &&
              CUDNN_CONVOLUTION_FWD_ALGO_GEMM == 2 && CUDNN_CONVOLUTION_FWD_ALGO_DIRECT == 3 &&
              CUDNN_CONVOLUTION_FWD_ALGO_FFT == 4 && CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING == 5 &&
              CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD == 6 &&
              CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED == 7 &&
              CUDNN_CONVOLUTION_FWD_ALGO_COUNT == 8);
static_assert(CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 == 0 && CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 == 1 &&
              CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT == 2 &&
              CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING == 3 &&
              CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD == 4 &&
              CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED == 5 &&
              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT == 6);
static_assert(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 == 0 && CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 == 1 &&
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT == 2 &&
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 == 3 &&
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD == 4 &&
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED == 5 &&
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING == 6 &&
              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT == 7);

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
  // The same tensors as packed bf16, for the directions whose data is bf16
  // (CudnnConvPlan::io_bf16).
  cudnnTensorDescriptor_t x16 = nullptr, y16 = nullptr;
  // One convolution descriptor per direction: each carries its algorithm's math type.
  std::array<cudnnConvolutionDescriptor_t, 3> conv{};
  std::array<Choice, 3> choice{};

  ConvBatch() = default;
  ConvBatch(const ConvBatch&) = delete;
  ConvBatch& operator=(const ConvBatch&) = delete;
  ~ConvBatch() {
    for (auto* t : {x, y, x16, y16}) {
      if (t != nullptr) CUDNN_WARN(cudnnDestroyTensorDescriptor(t));
    }
    for (auto* c : conv) {
      if (c != nullptr) CUDNN_WARN(cudnnDestroyConvolutionDescriptor(c));
    }
  }
};

class CudnnConvPlan final : public ConvPlan {
 public:
  /// io_bf16: per direction (forward, backward-data, backward-filter), whether cuDNN is given
  /// packed bf16 data (precision bf16, where the contract's values come out of cuDNN's bf16
  /// kernels: see cuda_backend.hpp).
  CudnnConvPlan(const ConvGeometry& g, std::string layer, std::array<bool, 3> io_bf16)
      : ConvPlan(g), io_bf16(io_bf16), layer_(std::move(layer)) {
    w_desc = filter_descriptor(CUDNN_DATA_FLOAT);
    if (any_bf16()) w_desc16 = filter_descriptor(CUDNN_DATA_BFLOAT16);
  }
  ~CudnnConvPlan() override {
    batches.clear();
    for (auto* w : {w_desc, w_desc16}) {
      if (w != nullptr) CUDNN_WARN(cudnnDestroyFilterDescriptor(w));
    }
  }
  bool nhwc() const { return geometry().layout == Layout::nhwc; }
  const std::array<bool, 3> io_bf16;
  bool any_bf16() const { return io_bf16[0] || io_bf16[1] || io_bf16[2]; }
  /// Precision bf16, NHWC, with ConvUse::output_to_batchnorm and io_bf16[forward]: y is packed
  /// bf16 (ConvPlan::output_dtype), written by cuDNN itself. A forward on one of dprun's own
  /// algorithms writes its fp32 sums at the end of its workspace (CudaBackend::own_workspace),
  /// then rounds them into y.
  bool bf16_output = false;
  /// Precision bf16 with ConvUse::input_dtype bf16: x is packed bf16 (ConvPlan::input_dtype), the
  /// output of a batch norm that only this convolution reads. cuDNN's bf16 data takes it as it
  /// is; fp32 kernels widen it into their operand copy where they would round an fp32 x; dprun's
  /// own forward algorithms widen it at the end of their workspace (CudaBackend::own_workspace).
  bool bf16_input = false;
  /// With a planned workspace in bf16: the floats of operand copies (and packed outputs) at its
  /// start, per stage (forward, backward), before cuDNN's workspace.
  size_t bf16_floats[2] = {0, 0};
  /// precision bf16: the floats of scratch a pass in `direction` needs for its copies, with
  /// these element counts of x, w and y (bf16_operand_floats or bf16_packed_floats).
  /// A bf16 x (bf16_input) or dy (bf16_output: the batch norm's dx) is cuDNN's operand as it is.
  size_t copy_floats(int direction, int64_t x, int64_t w, int64_t y) const {
    const int64_t packed_x = bf16_input ? 0 : x;
    const int64_t packed_dy = bf16_output ? 0 : y;
    if (direction == kForward && bf16_output) return bf16_packed_floats({packed_x, w});  // y too
    if (direction == kForward)
      return io_bf16[kForward] ? bf16_packed_floats({packed_x, w, y}) : bf16_operand_floats({x, w});
    if (direction == kBackwardData) {  // after fp32 kernels, room for a bf16 dx's fp32 sums
      return io_bf16[kBackwardData] ? bf16_packed_floats({packed_dy, w, x})
                                    : bf16_operand_floats({y, w, bf16_input ? x : 0});
    }
    // backward-filter: x, dy, and room for cuDNN's packed dw, widened into the fp32 dw after.
    return io_bf16[kBackwardFilter] ? bf16_packed_floats({packed_x, packed_dy, w})
                                    : bf16_operand_floats({x, y});
  }
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
        const auto dir = static_cast<ConvDirection>(d);
        const bool own = c.algo == kConvAlgoDprunGemm1x1 || c.algo == kConvAlgoDprunSmallC;
        const char* how = c.algo == kConvAlgoDprunGemm1x1 ? " (gather, cuBLAS GEMM), "
                                                          : " (direct, few channels), ";
        out += std::string(out.empty() ? "" : "; ") + "batch " + std::to_string(b->n) + " " +
               kDirectionNames[d] + (own ? ": dprun's " : ": cuDNN ") +
               conv_algorithm_name(dir, c.algo) +
               (own ? how : " (algo " + std::to_string(c.algo) + "), ") +
               (io_bf16[d] && !own ? "bf16 data, " : "") +
               conv_math_name(static_cast<ConvMath>(c.math)) + " math, workspace " +
               std::to_string(c.workspace) + " bytes";
      }
    }
    return out.empty() ? "cuDNN, no algorithm chosen yet" : out;
  }
  /// "layer resnet_block2.0.conv1 (conv 64->128 ... nhwc f32)", or the geometry alone.
  std::string describe() const {
    return layer_.empty() ? geometry().str() : "layer " + layer_ + " (" + geometry().str() + ")";
  }

  cudnnFilterDescriptor_t w_desc = nullptr, w_desc16 = nullptr;  // fp32, packed bf16
  std::vector<std::unique_ptr<ConvBatch>> batches;

 private:
  /// A filter descriptor of this plan's filter; on failure the ones made before are destroyed
  /// (the constructor throws, so the destructor does not run).
  cudnnFilterDescriptor_t filter_descriptor(cudnnDataType_t type) const {
    const ConvGeometry& g = geometry();
    cudnnFilterDescriptor_t d = nullptr;
    cudnnStatus_t status = cudnnCreateFilterDescriptor(&d);
    if (status == CUDNN_STATUS_SUCCESS) {
      status = cudnnSetFilter4dDescriptor(
          d, type, nhwc() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, static_cast<int>(g.out_channels),
          static_cast<int>(g.in_channels), static_cast<int>(g.kernel_h),
          static_cast<int>(g.kernel_w));
      if (status != CUDNN_STATUS_SUCCESS) CUDNN_WARN(cudnnDestroyFilterDescriptor(d));
    }
    if (status != CUDNN_STATUS_SUCCESS) {
      if (w_desc != nullptr) CUDNN_WARN(cudnnDestroyFilterDescriptor(w_desc));
      CUDNN_CHECK(status);
    }
    return d;
  }
  std::string layer_;
};

namespace {

CudnnConvPlan& as_cudnn(ConvPlan& plan) { return static_cast<CudnnConvPlan&>(plan); }

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > (int64_t{1} << 30))
    fail("plan_conv", std::string(what) + " too large for cuDNN");
  return static_cast<int>(v);
}

void set_tensor(cudnnTensorDescriptor_t d, bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w,
                cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, type,
                                         to_int(n, "N"), to_int(c, "C"), to_int(h, "H"),
                                         to_int(w, "W")));
}

/// The data descriptors of a direction's calls: packed bf16 where the plan gives it bf16 data.
struct Descriptors {
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  size_t element_bytes;
};
Descriptors descriptors(const CudnnConvPlan& plan, const ConvBatch& b, int direction) {
  if (plan.io_bf16[static_cast<size_t>(direction)]) return {b.x16, b.y16, plan.w_desc16, 2};
  return {b.x, b.y, plan.w_desc, sizeof(float)};
}

/// The math type a direction's descriptor asks of cuDNN (what its heuristics and timing look
/// at): for bf16 data tensor-op math, which cuDNN's bf16 tensor-core kernels need (PyTorch sets
/// it for 16-bit data too); for fp32 data the default (TF32 allowed) or FMA (exact fp32).
cudnnMathType_t wanted_math(const CudnnConvPlan& plan, int direction, bool allow_tf32) {
  if (plan.io_bf16[static_cast<size_t>(direction)]) return CUDNN_TENSOR_OP_MATH;
  return allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

void set_conv(cudnnConvolutionDescriptor_t d, const ConvGeometry& g, cudnnMathType_t math) {
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      d, static_cast<int>(g.pad_h), static_cast<int>(g.pad_w), static_cast<int>(g.stride_h),
      static_cast<int>(g.stride_w), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
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

constexpr std::array<int, 3> kAlgoCount = {CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};

/// The workspace algorithm `algo` needs in `direction`, run with the math type now set on the
/// batch's descriptor of that direction.
cudnnStatus_t workspace_size(cudnnHandle_t cudnn, const CudnnConvPlan& plan, const ConvBatch& b,
                             int direction, int algo, size_t* bytes) {
  cudnnConvolutionDescriptor_t conv = b.conv[static_cast<size_t>(direction)];
  const Descriptors d = descriptors(plan, b, direction);
  if (direction == kForward) {
    return cudnnGetConvolutionForwardWorkspaceSize(
        cudnn, d.x, d.w, conv, d.y, static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
  }
  if (direction == kBackwardData) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(
        cudnn, d.w, d.y, conv, d.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
  }
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(
      cudnn, d.x, d.y, conv, d.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
}

/// The most workspace, up to `limit`, that an algorithm contract c allows needs in `direction`
/// at this batch, with any math type c may run it with: what timing them takes. Leaves the
/// descriptor's math type as it found it.
size_t timing_workspace(cudnnHandle_t cudnn, const CudnnConvPlan& plan, const ConvBatch& b,
                        int direction, ConvContract c, size_t limit) {
  cudnnConvolutionDescriptor_t conv = b.conv[static_cast<size_t>(direction)];
  cudnnMathType_t before = CUDNN_DEFAULT_MATH;
  CUDNN_CHECK(cudnnGetConvolutionMathType(conv, &before));
  const auto d = static_cast<ConvDirection>(direction);
  size_t most = 0;
  for (int algo = 0; algo < kAlgoCount[static_cast<size_t>(direction)]; ++algo) {
    for (const ConvMath math : {ConvMath::fma, ConvMath::default_math, ConvMath::tensor_op}) {
      if (!conv_contract_allows(c, d, algo, math)) continue;
      CUDNN_CHECK(cudnnSetConvolutionMathType(conv, static_cast<cudnnMathType_t>(math)));
      size_t ws = 0;
      if (workspace_size(cudnn, plan, b, direction, algo, &ws) == CUDNN_STATUS_SUCCESS &&
          ws <= limit) {
        most = std::max(most, ws);
      }
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv, before));
  return most;
}

}  // namespace

// ---- scratch, grown at setup -------------------------------------------------------------------

void CudaBackend::sync_for_scratch() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaBackend::reserve_workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return;
  replace_scratch(workspace_, workspace_bytes_, bytes, 1);
}

void CudaBackend::reserve_filter_scratch(size_t floats) {
  if (floats <= filter_scratch_floats_) return;
  replace_scratch(filter_scratch_, filter_scratch_floats_, floats, sizeof(float));
}

float* CudaBackend::bf16_scratch_for(size_t floats, const char* op) {
  if (floats <= bf16_scratch_floats_) return bf16_scratch_;
  return regrow_scratch(bf16_scratch_, bf16_scratch_floats_, floats, op,
                        "its bf16 operand copies need " + std::to_string(floats) +
                            " floats of scratch, more than was prepared",
                        "plan the convolution (plan_conv) or the linear layer (prepare_linear) "
                        "at setup with this batch size");
}

namespace {
constexpr int64_t kOperandAlignFloats = 64;  // 256 bytes
int64_t aligned_floats(int64_t n) {
  return (n + kOperandAlignFloats - 1) / kOperandAlignFloats * kOperandAlignFloats;
}
}  // namespace

size_t bf16_operand_floats(std::initializer_list<int64_t> counts) {
  int64_t total = 0;
  for (int64_t n : counts) total += aligned_floats(n);
  return static_cast<size_t>(total);
}

size_t bf16_packed_floats(std::initializer_list<int64_t> counts) {
  int64_t total = 0;
  for (int64_t n : counts) total += aligned_floats((n + 1) / 2);
  return static_cast<size_t>(total);
}

void CudaBackend::finish_forward(const Tensor& y, const Tensor* b, int64_t n, int64_t c, int64_t hw,
                                 bool nhwc, bool relu) {
  if (b != nullptr) {
    // The bias joins the fp32 sum before the output's one rounding (bf16); a fused ReLU in the
    // same pass.
    if (bf16()) {
      kernels::bias_add_round_bf16(y.f32(), b->f32(), n, c, hw, nhwc, stream_, relu);
    } else {
      kernels::bias_add(y.f32(), b->f32(), n, c, hw, nhwc, stream_, relu);
    }
    return;
  }
  if (bf16()) kernels::round_to_bf16(y.f32(), y.f32(), y.numel(), stream_);
  if (relu) kernels::relu_forward(y.f32(), y.f32(), y.numel(), stream_);
}

std::array<const float*, 2> CudaBackend::pass_operands(const Tensor& a, const Tensor& b,
                                                       float* bf16_scratch) {
  if (!bf16()) return {a.f32(), b.f32()};
  Bf16Operands copies(bf16_scratch, stream_);
  const float* first = copies.take(a);
  return {first, copies.take(b)};
}

std::array<const float*, 2> CudaBackend::data_and_filter(const CudnnConvPlan& plan,
                                                         const Tensor& data, const Tensor& w,
                                                         float* bf16_scratch) {
  if (!bf16() || !transposes_filter(plan, w)) {
    const auto [d, f] = pass_operands(data, w, bf16_scratch);
    return {d, transposes_filter(plan, w) ? filter_for(plan, f) : f};
  }
  Bf16Operands copies(bf16_scratch, stream_);
  const float* d = copies.take(data);
  const ConvGeometry& g = plan.geometry();
  kernels::kcrs_to_krsc(w.f32(), filter_scratch_, g.out_channels, g.in_channels,
                        g.kernel_h * g.kernel_w, stream_, /*round_bf16=*/true);
  return {d, filter_scratch_};
}

const float* Bf16Operands::take(const Tensor& t) {
  float* copy = next_;
  if (t.dtype == DType::bf16) {  // already rounded: widened
    kernels::from_bf16(static_cast<const uint16_t*>(t.data), copy, t.numel(), stream_);
  } else {
    kernels::round_to_bf16(t.f32(), copy, t.numel(), stream_);
  }
  next_ += aligned_floats(t.numel());
  return copy;
}

uint16_t* Bf16Operands::room_packed(int64_t n) {
  auto* room = reinterpret_cast<uint16_t*>(next_);
  next_ += aligned_floats((n + 1) / 2);
  return room;
}

const uint16_t* Bf16Operands::take_packed(const float* src, int64_t n) {
  uint16_t* copy = room_packed(n);
  kernels::to_bf16(src, copy, n, stream_);
  return copy;
}

void CudaBackend::reserve_reduce_scratch(size_t floats) {
  if (floats <= reduce_scratch_floats_) return;
  replace_scratch(reduce_scratch_, reduce_scratch_floats_, floats, sizeof(float));
}

float* CudaBackend::regrow_reduce_scratch(size_t floats, const char* op, int64_t channels) {
  if (floats <= reduce_scratch_floats_) return reduce_scratch_;
  return regrow_scratch(reduce_scratch_, reduce_scratch_floats_, floats, op,
                        "a bias gradient of " + std::to_string(channels) +
                            " channels needs more reduction scratch than any convolution "
                            "planned",
                        "plan a convolution of that many output channels first");
}

// ---- plans --------------------------------------------------------------------------------------

std::unique_ptr<ConvPlan> CudaBackend::plan_conv_impl(const ConvGeometry& g, const ConvUse& use) {
  if (g.dtype != DType::f32) {
    fail("plan_conv",
         std::string("dtype ") + dtype_name(g.dtype) + " is not supported (f32) in " + g.str());
  }
  activate();
  if (bf16()) {
    // bf16 data for cuDNN where its bf16 kernels give the contract's values (cuda_backend.hpp):
    // a forward without a bias, backward-data and backward-filter. Where cuDNN cannot run them
    // (a descriptor, no deterministic algorithm within the workspace), fp32 kernels on rounded
    // copies, their outputs rounded, give the same values: for backward-filter alone if only it
    // fails, else for every pass. Decided here, at setup only: a batch size first met later
    // takes what its plan has.
    // A forward without a bias whose output only our batch norm reads keeps cuDNN's bf16 output
    // as it is: y is packed bf16 (the values the f32 y would hold, in half the memory).
    const bool bf16_output = use.output_to_batchnorm && !use.forward_bias && bf16_storage_ &&
                             batchnorm_takes_impl(DType::bf16, g.layout);
    const std::string name = use.layer.empty() ? g.str() : use.layer;
    // Only cuDNN's own refusals: anything else (memory, a bug) is no reason to change kernels.
    // What an attempt reserved stays (workspace, scratch), as its timed choices stay cached.
    std::string refusal;
    try {
      return make_conv_plan(g, use, {!use.forward_bias, true, true}, bf16_output);
    } catch (const CudnnError& e) {
      refusal = e.what();
    }
    try {
      auto plan = make_conv_plan(g, use, {!use.forward_bias, true, false}, bf16_output);
      std::fprintf(stderr,
                   "dprun: warning: cuda backend: %s: cuDNN's bf16 filter-gradient kernels cannot "
                   "run it (%s); its filter gradient runs fp32 kernels on copies rounded to bf16, "
                   "then rounds it (the same values, more memory traffic)\n",
                   name.c_str(), refusal.c_str());
      return plan;
    } catch (const CudnnError& e) {
      std::fprintf(stderr,
                   "dprun: warning: cuda backend: %s: cuDNN's bf16 kernels cannot run it (%s); "
                   "its passes run fp32 kernels on copies rounded to bf16 (the same values, "
                   "more memory traffic)\n",
                   name.c_str(), e.what());
    }
  }
  return make_conv_plan(g, use, {false, false, false});
}

std::unique_ptr<CudnnConvPlan> CudaBackend::make_conv_plan(const ConvGeometry& g,
                                                           const ConvUse& use,
                                                           std::array<bool, 3> io_bf16,
                                                           bool bf16_output) {
  auto plan = std::make_unique<CudnnConvPlan>(g, use.layer, io_bf16);
  plan->bf16_output = bf16_output && io_bf16[kForward];
  plan->bf16_input = use.input_dtype == DType::bf16;
  // Known before the algorithms are chosen (conv_batch sizes the caller's workspace, not ours).
  plan_workspace(*plan, use);
  // A (K, C, R, S) filter for NHWC activations: its transposed copy and its gradient's.
  if (plan->nhwc() && use.filter_layout == Layout::nchw)
    reserve_filter_scratch(2 * static_cast<size_t>(plan->filter_numel()));
  if (bf16()) {
    // Copies per pass: (x, w) forward, (dy, w) backward-data, (x, dy) backward-filter, with
    // room for the packed output of a pass given bf16 data.
    const int64_t x = g.max_batch * g.in_channels * g.in_h * g.in_w;
    const int64_t y = g.max_batch * g.out_channels * g.out_h() * g.out_w();
    const int64_t w = plan->filter_numel();
    const size_t forward = plan->copy_floats(kForward, x, w, y);
    const size_t backward = std::max(plan->copy_floats(kBackwardData, x, w, y),
                                     plan->copy_floats(kBackwardFilter, x, w, y));
    if (use.planned_workspace) {
      // In the caller's workspace, before cuDNN's (a multiple of 256 bytes: aligned_floats).
      plan->bf16_floats[0] = forward;
      plan->bf16_floats[1] = backward;
      for (int stage = 0; stage < 2; ++stage) {
        need_workspace(*plan, static_cast<ConvStage>(stage),
                       plan->bf16_floats[stage] * sizeof(float));
      }
    } else {
      bf16_scratch_for(std::max(forward, backward), "plan_conv");
    }
  }
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

ConvBatch& CudaBackend::conv_batch(CudnnConvPlan& plan, int64_t n, int direction, bool at_plan_time,
                                   size_t run_limit) {
  ConvBatch& b = batch_state(plan, n);
  if (!b.choice[static_cast<size_t>(direction)].chosen) {
    choose_algorithm(plan, b, direction, at_plan_time ? kMaxWorkspaceBytes : run_limit,
                     at_plan_time);
    const size_t ws = b.choice[static_cast<size_t>(direction)].workspace;
    if (at_plan_time && plan.planned_workspace()) {
      const int stage = direction == kForward ? 0 : 1;
      need_workspace(plan, static_cast<ConvStage>(stage),
                     plan.bf16_floats[stage] * sizeof(float) + ws);
    } else if (at_plan_time) {
      reserve_workspace(ws);
    }
  }
  return b;
}

CudaBackend::PassScratch CudaBackend::pass_scratch(const CudnnConvPlan& plan, int direction,
                                                   const Tensor* workspace, size_t bf16_floats,
                                                   const char* op) {
  const size_t copy_bytes = bf16() ? bf16_floats * sizeof(float) : 0;
  if (!plan.planned_workspace()) {
    return {bf16() ? bf16_scratch_for(bf16_floats, op) : nullptr, workspace_, workspace_bytes_,
            copy_bytes};
  }
  // Checked against the plan's need (Backend::conv_*): the copies, then cuDNN's workspace.
  const int stage = direction == kForward ? 0 : 1;
  const size_t copies = plan.bf16_floats[stage] * sizeof(float);
  if (workspace == nullptr) return {};  // the plan needs none at all
  char* base = static_cast<char*>(workspace->data);
  // What the plan said it needs, not what the caller happened to give: a choice made later (a
  // batch size not declared) then fits every workspace the plan accepts.
  const size_t room = plan.workspace_bytes(static_cast<ConvStage>(stage)) - copies;
  return {bf16() ? reinterpret_cast<float*>(base) : nullptr, base + copies, room, copy_bytes};
}

void CudaBackend::poison_pass(const PassScratch& s, size_t cudnn_need) {
  if (!poison_scratch_) return;
  if (s.bf16 != nullptr && s.copy_bytes > 0) {
    CUDA_CHECK(cudaMemsetAsync(s.bf16, 0xFF, s.copy_bytes, stream_));
  }
  if (s.cudnn != nullptr && cudnn_need > 0) {
    CUDA_CHECK(cudaMemsetAsync(s.cudnn, 0xFF, cudnn_need, stream_));
  }
}

ConvBatch& CudaBackend::batch_state(CudnnConvPlan& plan, int64_t n) {
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
    if (plan.any_bf16()) {
      CUDNN_CHECK(cudnnCreateTensorDescriptor(&fresh->x16));
      CUDNN_CHECK(cudnnCreateTensorDescriptor(&fresh->y16));
      set_tensor(fresh->x16, plan.nhwc(), n, g.in_channels, g.in_h, g.in_w, CUDNN_DATA_BFLOAT16);
      set_tensor(fresh->y16, plan.nhwc(), n, g.out_channels, g.out_h(), g.out_w(),
                 CUDNN_DATA_BFLOAT16);
    }
    for (int d = 0; d < 3; ++d)
      set_conv(fresh->conv[static_cast<size_t>(d)], g, wanted_math(plan, d, allow_tf32_));
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

/// The fastest of cuDNN's timed results that succeeded, is deterministic, fits `limit` and that
/// the contract allows with the math it ran ("algo A math M workspace W ms T"), or "" (nothing is
/// then cached).
template <typename Perf>
std::string fastest(const Perf* perf, int returned, size_t limit, ConvContract contract,
                    ConvDirection direction) {
  for (int i = 0; i < returned; ++i) {  // cuDNN sorts them by time
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC ||
        p.memory > limit ||
        !conv_contract_allows(contract, direction, static_cast<int>(p.algo),
                              static_cast<ConvMath>(p.mathType))) {
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

// ---- dprun's own passes (dp::kConvAlgoDprunGemm1x1, dp::kConvAlgoDprunSmallC) -----------------

namespace {

/// filters: the memory order of w and dw (timing takes any: the same work).
kernels::SmallConv small_conv_shape(const ConvGeometry& g, int64_t n,
                                    Layout filters = Layout::nchw) {
  kernels::SmallConv s;
  s.filter_krsc = filters == Layout::nhwc;
  s.n = n;
  s.h = g.in_h;
  s.w = g.in_w;
  s.out_h = g.out_h();
  s.out_w = g.out_w();
  // Clamped, not narrowed: a shape beyond int is refused by small_conv_fits.
  const auto narrow = [](int64_t v) { return static_cast<int>(std::min<int64_t>(v, 1 << 30)); };
  s.c = narrow(g.in_channels);
  s.k = narrow(g.out_channels);
  s.r = narrow(g.kernel_h);
  s.s = narrow(g.kernel_w);
  s.stride_h = narrow(g.stride_h);
  s.stride_w = narrow(g.stride_w);
  s.pad_h = narrow(g.pad_h);
  s.pad_w = narrow(g.pad_w);
  return s;
}

}  // namespace

bool CudaBackend::own_gemm_1x1(const CudnnConvPlan& plan) {
  const ConvGeometry& g = plan.geometry();
  return plan.nhwc() && g.kernel_h == 1 && g.kernel_w == 1 && g.pad_h == 0 && g.pad_w == 0;
}

bool CudaBackend::own_small_c(const CudnnConvPlan& plan) {
  const ConvGeometry& g = plan.geometry();
  return plan.nhwc() && kernels::small_conv_fits(small_conv_shape(g, g.max_batch));
}

std::vector<int> CudaBackend::own_algorithms(const CudnnConvPlan& plan, int direction) {
  std::vector<int> out;
  if (direction == kForward && own_gemm_1x1(plan)) out.push_back(kConvAlgoDprunGemm1x1);
  if (direction != kBackwardData && own_small_c(plan)) out.push_back(kConvAlgoDprunSmallC);
  return out;
}

bool CudaBackend::own_algorithm_runs(const CudnnConvPlan& plan, int algo, int direction) {
  const std::vector<int> own = own_algorithms(plan, direction);
  return std::find(own.begin(), own.end(), algo) != own.end();
}

size_t CudaBackend::own_workspace(const CudnnConvPlan& plan, int algo, int direction,
                                  int64_t n) const {
  size_t bytes = own_scratch(plan, algo, direction, n);
  const ConvGeometry& g = plan.geometry();
  if (direction == kForward && plan.bf16_output) {  // the fp32 sums, packed into y after
    bytes += static_cast<size_t>(aligned_floats(n * g.out_channels * g.out_h() * g.out_w())) *
             sizeof(float);
  }
  if (direction != kBackwardData && plan.bf16_input) {  // a bf16 x widened, after the sums
    bytes +=
        static_cast<size_t>(aligned_floats(n * g.in_channels * g.in_h * g.in_w)) * sizeof(float);
  }
  return bytes;
}

size_t CudaBackend::own_scratch(const CudnnConvPlan& plan, int algo, int direction,
                                int64_t n) const {
  const ConvGeometry& g = plan.geometry();
  if (algo == kConvAlgoDprunSmallC) {
    if (direction != kBackwardFilter) return 0;
    return kernels::small_conv_filter_scratch_floats(small_conv_shape(g, n)) * sizeof(float);
  }
  const bool strided = g.stride_h != 1 || g.stride_w != 1;
  int64_t floats = 0;
  if (strided || bf16()) floats += aligned_floats(n * g.out_h() * g.out_w() * g.in_channels);
  if (bf16()) floats += aligned_floats(g.out_channels * g.in_channels);
  return static_cast<size_t>(floats) * sizeof(float);
}

cudnnMathType_t CudaBackend::own_math(int algo) const {
  if (algo == kConvAlgoDprunSmallC) return CUDNN_FMA_MATH;
  return allow_tf32_ ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;  // the cuBLAS handle's math mode
}

void CudaBackend::run_own(const CudnnConvPlan& plan, int algo, int direction, int64_t n,
                          const float* a, const float* b, float* out, void* workspace,
                          Layout filters) {
  const ConvGeometry& g = plan.geometry();
  if (algo == kConvAlgoDprunSmallC) {
    const kernels::SmallConv shape = small_conv_shape(g, n, filters);
    if (direction == kForward) {
      kernels::small_conv_forward(a, b, out, shape, bf16(), stream_);
    } else {
      kernels::small_conv_filter(a, b, out, shape, static_cast<float*>(workspace), bf16(), stream_);
    }
    return;
  }
  const float* x = a;
  const float* w = b;
  float* y = out;
  const int64_t ho = g.out_h(), wo = g.out_w(), rows = n * ho * wo;
  auto* room = static_cast<float*>(workspace);
  // The rows it reads: x itself when every pixel is read and kept as it is.
  const float* xs = x;
  if (g.stride_h != 1 || g.stride_w != 1 || bf16()) {
    kernels::subsample_nhwc(x, room, n, g.in_h, g.in_w, g.in_channels, g.stride_h, g.stride_w, ho,
                            wo, bf16(), stream_);
    xs = room;
    room += aligned_floats(rows * g.in_channels);
  }
  // A 1x1 filter (K, C, 1, 1) is the (K, C) matrix the GEMM wants, in either layout, and so
  // are its (K, 1, 1, C) and (K, C, 1, 1) memory orders.
  const float* wk = w;
  if (bf16()) {
    kernels::round_to_bf16(w, room, g.out_channels * g.in_channels, stream_);
    wk = room;
  }
  // Row-major y (rows, K) = xs (rows, C) w^T: column-major y^T (K x rows) = w^T (K x C) xs^T.
  const float one = 1.0f, zero = 0.0f;
  const int k = to_int(g.out_channels, "K"), m = to_int(rows, "N*P*Q"),
            c = to_int(g.in_channels, "C");
  CUBLAS_CHECK(
      cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, k, m, c, &one, wk, c, xs, c, &zero, y, k));
}

namespace {

/// A CUDA event, destroyed when it goes.
struct Event {
  cudaEvent_t e = nullptr;
  Event() { CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() { CUDA_WARN(cudaEventDestroy(e)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

}  // namespace

float CudaBackend::time_own(const CudnnConvPlan& plan, int algo, int direction, int64_t n,
                            size_t limit) {
  const size_t need = own_workspace(plan, algo, direction, n);
  if (need > limit) return -1.0f;
  const ConvGeometry& g = plan.geometry();
  const auto bytes = [](int64_t count) { return static_cast<size_t>(count) * sizeof(float); };
  Scratch x(*this, stream_, bytes(n * g.in_channels * g.in_h * g.in_w));
  Scratch y(*this, stream_, bytes(n * g.out_channels * g.out_h() * g.out_w()));
  Scratch w(*this, stream_, bytes(plan.filter_numel()));
  Scratch ws(*this, stream_, need);
  const auto run = [&] {
    // Forward reads x and w into y; the filter gradient reads x and dy (y's buffer) into w's.
    const auto* xs = static_cast<const float*>(x.get());
    if (direction == kForward) {
      run_own(plan, algo, direction, n, xs, static_cast<const float*>(w.get()),
              static_cast<float*>(y.get()), ws.get());
    } else {
      run_own(plan, algo, direction, n, xs, static_cast<const float*>(y.get()),
              static_cast<float*>(w.get()), ws.get());
    }
  };
  run();  // warm-up: cuBLAS picks and loads its kernel, the kernels are loaded
  Event start, stop;
  float best = -1.0f;
  for (int i = 0; i < 3; ++i) {
    CUDA_CHECK(cudaEventRecord(start.e, stream_));
    run();
    CUDA_CHECK(cudaEventRecord(stop.e, stream_));
    CUDA_CHECK(cudaEventSynchronize(stop.e));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
    if (best < 0 || ms < best) best = ms;
  }
  return best;
}

std::string CudaBackend::choice_key(const CudnnConvPlan& plan, int64_t n, int direction,
                                    size_t limit) const {
  ConvGeometry shape = plan.geometry();
  shape.max_batch = n;  // the key names the batch measured, not the plan's largest
  // The contract is part of the key: choices cached before the contract existed ("fp32") are
  // never read as fp32-exact ones.
  // bf16 data ("data bf16") runs other kernels than its contract's fp32 data: timed apart.
  // A choice that dprun's own passes took part in names them: one cached before they existed
  // (cuDNN's alone) is measured again, once.
  std::string own;
  for (const int algo : own_algorithms(plan, direction))
    own += algo == kConvAlgoDprunGemm1x1 ? " with dprun-gemm-1x1" : " with dprun-small-c";
  return std::string(kDirectionNames[static_cast<size_t>(direction)]) + " " + shape.str() + " " +
         conv_contract_name(contract_) +
         (plan.io_bf16[static_cast<size_t>(direction)] ? " data bf16" : "") +
         " workspace<=" + std::to_string(limit) + own;
}

bool CudaBackend::choose_measured(CudnnConvPlan& plan, ConvBatch& b, int direction, size_t limit) {
  const auto d = static_cast<size_t>(direction);
  cudnnConvolutionDescriptor_t conv = b.conv[d];
  const cudnnMathType_t wanted = wanted_math(plan, direction, allow_tf32_);
  const auto dir = static_cast<ConvDirection>(direction);
  const std::string key = choice_key(plan, b.n, direction, limit);
  const auto measure_cudnn = [&]() -> std::string {
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, wanted));
    const ConvGeometry& g = plan.geometry();
    const Descriptors dd = descriptors(plan, b, direction);
    const auto bytes = [&](int64_t n) { return static_cast<size_t>(n) * dd.element_bytes; };
    Scratch x(*this, stream_, bytes(b.n * g.in_channels * g.in_h * g.in_w));
    Scratch y(*this, stream_, bytes(b.n * g.out_channels * g.out_h() * g.out_w()));
    Scratch w(*this, stream_, bytes(plan.filter_numel()));
    // Not the whole limit: for most layers the algorithms need far less, and the run's peak
    // (recorded with each trial) would show a 256 MiB allocation that only timing made.
    const size_t room = timing_workspace(cudnn_, plan, b, direction, contract_, limit);
    Scratch ws(*this, stream_, room);
    int returned = 0;
    if (direction == kForward) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
          cudnn_, dd.x, x.get(), dd.w, w.get(), conv, dd.y, y.get(),
          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf, ws.get(), room));
      return fastest(perf, returned, limit, contract_, dir);
    }
    if (direction == kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          cudnn_, dd.w, w.get(), dd.y, y.get(), conv, dd.x, x.get(),
          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf, ws.get(), room));
      return fastest(perf, returned, limit, contract_, dir);
    }
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        cudnn_, dd.x, x.get(), dd.y, y.get(), conv, dd.w, w.get(),
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf, ws.get(), room));
    return fastest(perf, returned, limit, contract_, dir);
  };
  // dprun's own passes, each timed after cuDNN's buffers are gone (the peak at setup is the
  // largest of the timings, not their sum), and kept when faster than the best so far. All are
  // events around the launches; cuDNN's time leaves out its filter transposes and bf16 packing,
  // the GEMM's includes its gather: a tie goes to the earlier. A failure to time one keeps the
  // best so far.
  const auto measure = [&]() -> std::string {
    std::string best = measure_cudnn();
    for (const int algo : own_algorithms(plan, direction)) {
      const auto math = static_cast<ConvMath>(own_math(algo));
      if (!conv_contract_allows(contract_, dir, algo, math)) continue;
      float own_ms = -1.0f;
      try {
        own_ms = time_own(plan, algo, direction, b.n, limit);
      } catch (const Error& e) {
        std::fprintf(stderr,
                     "dprun: warning: cuda backend: %s %s at batch %lld: timing dprun's %s "
                     "failed (%s); the other measurements decide\n",
                     plan.describe().c_str(), kDirectionNames[d], static_cast<long long>(b.n),
                     conv_algorithm_name(dir, algo).c_str(), e.what());
      }
      double best_ms = 0;
      const bool faster =
          own_ms >= 0 &&
          (best.empty() ||
           (std::sscanf(best.c_str(), "algo %*d math %*d workspace %*u ms %lf", &best_ms) == 1 &&
            own_ms < best_ms));
      if (!faster) continue;
      char text[128];
      std::snprintf(text, sizeof text, "algo %d math %d workspace %zu ms %.4f", algo,
                    static_cast<int>(math), own_workspace(plan, algo, direction, b.n),
                    static_cast<double>(own_ms));
      best = text;
    }
    return best;
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
  if (const std::string refusal =
          conv_contract_refusal(contract_, dir, algo, static_cast<ConvMath>(math));
      !refusal.empty()) {
    return give_up("the recorded choice '" + value + "' is outside the contract (" + refusal + ")");
  }
  if (algo == kConvAlgoDprunGemm1x1 || algo == kConvAlgoDprunSmallC) {
    // dprun's own: its math and its workspace are its own.
    const size_t own = own_workspace(plan, algo, direction, b.n);
    if (!own_algorithm_runs(plan, algo, direction) || m != own_math(algo) || own > limit)
      return give_up("the recorded choice '" + value + "' does not fit this plan");
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, wanted));
    b.choice[d] = {true, algo, own, m};
    if (log_choices()) {
      std::fprintf(stderr,
                   "dprun: cudnn: %s batch %lld %s: dprun's %s, %s math, workspace %zu bytes, "
                   "measured %.4f ms\n",
                   plan.describe().c_str(), static_cast<long long>(b.n), kDirectionNames[d],
                   conv_algorithm_name(dir, algo).c_str(), conv_math_name(static_cast<ConvMath>(m)),
                   own, ms);
    }
    return true;
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv, m));
  size_t need = 0;
  const cudnnStatus_t status = workspace_size(cudnn_, plan, b, direction, algo, &need);
  if (status != CUDNN_STATUS_SUCCESS || need > limit) {
    return give_up("the recorded algorithm " + std::to_string(algo) +
                   " does not run here within the workspace (" + cudnnGetErrorString(status) + ")");
  }
  b.choice[d] = {true, algo, need, m};
  if (log_choices()) {
    std::fprintf(stderr,
                 "dprun: cudnn: %s batch %lld %s: algo %d, %s%s math, workspace %zu bytes, "
                 "measured %.4f ms%s\n",
                 plan.describe().c_str(), static_cast<long long>(b.n), kDirectionNames[d], algo,
                 plan.io_bf16[d] ? "bf16 data, " : "", conv_math_name(static_cast<ConvMath>(m)),
                 need, ms, limit == kMaxWorkspaceBytes ? "" : " (chosen after setup)");
  }
  return true;
}

void CudaBackend::choose_algorithm(CudnnConvPlan& plan, ConvBatch& b, int direction, size_t limit,
                                   bool at_plan_time) {
  // Timing needs scratch memory: only at plan time, never in a step.
  if (measure_choices_ && at_plan_time && choose_measured(plan, b, direction, limit)) return;
  cudnnConvolutionDescriptor_t conv = b.conv[static_cast<size_t>(direction)];
  const Descriptors dd = descriptors(plan, b, direction);
  std::vector<Candidate> list;
  if (direction == kForward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        cudnn_, dd.x, dd.w, conv, dd.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
    list = candidates(perf, returned,
                      {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true},
                       {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, true}});
  } else if (direction == kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        cudnn_, dd.w, dd.y, conv, dd.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
    list = candidates(
        perf, returned,
        {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true}, {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false}});
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int returned = 0;
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        cudnn_, dd.x, dd.y, conv, dd.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf));
    list = candidates(perf, returned,
                      {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true},
                       {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false},
                       {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, false}});
  }
  const char* name = kDirectionNames[static_cast<size_t>(direction)];
  ConvBatch::Choice& choice = b.choice[static_cast<size_t>(direction)];
  // Exact fp32 runs every algorithm with FMA math, whatever the heuristics suggested for it (the
  // descriptor's math type decides what runs; an algorithm without an FMA kernel fails the
  // query). With TF32 allowed the heuristics' math type is used, never a down-conversion.
  const auto math_for = [&](const Candidate& c) {
    return static_cast<cudnnMathType_t>(
        conv_contract_math(contract_, static_cast<ConvMath>(c.math)));
  };
  const auto dir = static_cast<ConvDirection>(direction);
  const auto try_pass = [&](bool deterministic_only) {
    for (const Candidate& c : list) {
      if (deterministic_only && !c.deterministic) continue;
      const cudnnMathType_t math = math_for(c);
      if (!conv_contract_allows(contract_, dir, c.algo, static_cast<ConvMath>(math))) continue;
      CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
      size_t ws = 0;
      if (workspace_size(cudnn_, plan, b, direction, c.algo, &ws) != CUDNN_STATUS_SUCCESS ||
          ws > limit) {
        continue;
      }
      choice = {true, c.algo, ws, math};
      return true;
    }
    return false;
  };
  const bool bf16_data = plan.io_bf16[static_cast<size_t>(direction)];
  // bf16 data never takes a non-deterministic algorithm: those sum into the output with atomic
  // adds, which in a bf16 output would round more than once. The plan then falls back to fp32
  // data (plan_conv_impl), where the deterministic ones may fit.
  const bool deterministic = try_pass(true);
  if (!deterministic && (bf16_data || !try_pass(false))) {
    CUDNN_WARN(cudnnSetConvolutionMathType(conv, wanted_math(plan, direction, allow_tf32_)));
    throw CudnnError("cuda backend: plan_conv: cuDNN offers no " +
                     std::string(bf16_data ? "deterministic " : "") + name + " algorithm for " +
                     (bf16_data ? "bf16 data of " : "") + plan.describe() + " at batch " +
                     std::to_string(b.n) + " within a workspace of " + std::to_string(limit >> 20) +
                     " MiB under the " + conv_contract_name(contract_) + " contract" +
                     (bf16_data     ? ""
                      : allow_tf32_ ? ": use a smaller batch per replica"
                                    : " (GEMM or direct, FMA math): allow TF32, or use a smaller "
                                      "batch per replica"));
  }
  if (!deterministic) {
    std::fprintf(
        stderr,
        "dprun: warning: cuda backend: no deterministic %s algorithm for %s at batch %lld; "
        "using a non-deterministic one (results may vary from run to run)\n",
        name, plan.describe().c_str(), static_cast<long long>(b.n));
  }
  if (log_choices()) {
    std::fprintf(stderr,
                 "dprun: cudnn: %s batch %lld %s: algo %d, %s%s math, workspace %zu bytes%s\n",
                 plan.describe().c_str(), static_cast<long long>(b.n), name, choice.algo,
                 bf16_data ? "bf16 data, " : "", conv_math_name(static_cast<ConvMath>(choice.math)),
                 choice.workspace, limit == kMaxWorkspaceBytes ? "" : " (chosen after setup)");
  }
}

// ---- introspection (dp/conv_contract.hpp) ---------------------------------------------------------

CudnnConvPlan& CudaBackend::own_plan(ConvPlan& plan, const char* op) {
  check_plan(plan, op);
  return as_cudnn(plan);
}

namespace {

void check_batch(const CudnnConvPlan& plan, int64_t n, const char* op) {
  if (n < 1 || n > plan.geometry().max_batch) {
    fail(op, "batch " + std::to_string(n) + " is outside [1, max_batch = " +
                 std::to_string(plan.geometry().max_batch) + "] of " + plan.describe());
  }
}

/// cuDNN's own word on determinism where its heuristics listed the algorithm; else what the
/// algorithm is known for (backward-data ALGO_0, backward-filter ALGO_0 and ALGO_3 sum in a
/// non-deterministic order).
bool known_deterministic(ConvDirection d, int algo) {
  if (d == ConvDirection::backward_data) return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  if (d == ConvDirection::backward_filter) {
    return algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 && algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  }
  return true;
}

}  // namespace

std::vector<ConvAlgorithm> CudaBackend::conv_algorithms(ConvPlan& plan_base, ConvDirection d,
                                                        int64_t n) {
  const char* op = "cuda_conv_algorithms";
  refuse_while_capturing(op);
  CudnnConvPlan& plan = own_plan(plan_base, op);
  check_batch(plan, n, op);
  activate();
  ConvBatch& b = batch_state(plan, n);
  const int direction = static_cast<int>(d);
  cudnnConvolutionDescriptor_t conv = b.conv[static_cast<size_t>(direction)];
  cudnnMathType_t before = CUDNN_DEFAULT_MATH;
  CUDNN_CHECK(cudnnGetConvolutionMathType(conv, &before));
  // Every math type the contract may run: FMA always; with TF32 or bf16 allowed also the
  // tensor-core kinds (cuDNN's default math permits TF32 for fp32 data; bf16 data's tensor-core
  // kernels need tensor-op math). bf16 data takes deterministic algorithms only (choose_algorithm).
  std::vector<ConvMath> maths{ConvMath::fma};
  if (contract_ != ConvContract::fp32_exact) maths.push_back(ConvMath::default_math);
  if (contract_ == ConvContract::bf16) maths.push_back(ConvMath::tensor_op);
  const bool bf16_data = plan.io_bf16[static_cast<size_t>(direction)];
  std::vector<ConvAlgorithm> out;
  for (int algo = 0; algo < kAlgoCount[static_cast<size_t>(direction)]; ++algo) {
    if (bf16_data && !known_deterministic(d, algo)) continue;
    for (ConvMath math : maths) {
      if (!conv_contract_allows(contract_, d, algo, math)) continue;
      CUDNN_CHECK(cudnnSetConvolutionMathType(conv, static_cast<cudnnMathType_t>(math)));
      size_t ws = 0;
      if (workspace_size(cudnn_, plan, b, direction, algo, &ws) != CUDNN_STATUS_SUCCESS ||
          ws > kMaxWorkspaceBytes) {
        continue;
      }
      out.push_back({d, n, algo, math, ws, known_deterministic(d, algo)});
    }
  }
  CUDNN_CHECK(cudnnSetConvolutionMathType(conv, before));
  for (const int algo : own_algorithms(plan, direction)) {
    const auto math = static_cast<ConvMath>(own_math(algo));
    const size_t ws = own_workspace(plan, algo, direction, n);
    if (conv_contract_allows(contract_, d, algo, math) && ws <= kMaxWorkspaceBytes)
      out.push_back({d, n, algo, math, ws, true});
  }
  return out;
}

ConvAlgorithm CudaBackend::conv_choice(ConvPlan& plan_base, ConvDirection d, int64_t n) {
  const char* op = "cuda_conv_choice";
  CudnnConvPlan& plan = own_plan(plan_base, op);
  check_batch(plan, n, op);
  activate();
  const int direction = static_cast<int>(d);
  const bool chosen = batch_state(plan, n).choice[static_cast<size_t>(direction)].chosen;
  if (!chosen) refuse_while_capturing(op);  // choosing may time and grow the workspace
  if (!chosen && plan.planned_workspace()) {
    // Its caller sized the workspace at plan time; a choice made now could need more.
    fail(op, plan.describe() + ": no algorithm was chosen for batch " + std::to_string(n) + " " +
                 kDirectionNames[static_cast<size_t>(direction)] +
                 " when the plan was made, and its workspace is its caller's, sized then "
                 "(ConvUse::planned_workspace): declare the batch size in ConvUse");
  }
  const ConvBatch::Choice& c = conv_batch(plan, n, direction, true).choice[static_cast<size_t>(direction)];
  return {d, n, c.algo, static_cast<ConvMath>(c.math), c.workspace, known_deterministic(d, c.algo)};
}

void CudaBackend::use_conv_algorithm(ConvPlan& plan_base, const ConvAlgorithm& a) {
  const char* op = "cuda_use_conv_algorithm";
  refuse_while_capturing(op);
  CudnnConvPlan& plan = own_plan(plan_base, op);
  check_batch(plan, a.batch, op);
  if (const std::string refusal = conv_contract_refusal(contract_, a.direction, a.algo, a.math);
      !refusal.empty()) {
    fail(op, plan.describe() + ": " + refusal);
  }
  if (plan.io_bf16[static_cast<size_t>(a.direction)] && !known_deterministic(a.direction, a.algo)) {
    fail(op, plan.describe() + ": " + a.str() +
                 " is not deterministic, which bf16 data never takes (its atomic sums would round "
                 "the bf16 output more than once)");
  }
  activate();
  ConvBatch& b = batch_state(plan, a.batch);
  const int direction = static_cast<int>(a.direction);
  const bool own = a.algo == kConvAlgoDprunGemm1x1 || a.algo == kConvAlgoDprunSmallC;
  if (own) {
    if (!own_algorithm_runs(plan, a.algo, direction)) {
      fail(op, plan.describe() + ": " + a.str() +
                   (a.algo == kConvAlgoDprunGemm1x1
                        ? " computes NHWC 1x1 convolutions without padding"
                        : " computes NHWC convolutions of at most 4 input and 256 output "
                          "channels (at most 36 filter taps per output channel, 8192 filter "
                          "values in all)"));
    }
    if (static_cast<cudnnMathType_t>(a.math) != own_math(a.algo)) {
      fail(op, plan.describe() + ": " + a.str() + ": it runs with " +
                   (a.algo == kConvAlgoDprunGemm1x1 ? "the cuBLAS handle's " : "") +
                   conv_math_name(static_cast<ConvMath>(own_math(a.algo))) + " math");
    }
  }
  cudnnConvolutionDescriptor_t conv = b.conv[static_cast<size_t>(direction)];
  cudnnMathType_t before = CUDNN_DEFAULT_MATH;
  CUDNN_CHECK(cudnnGetConvolutionMathType(conv, &before));
  if (!own) CUDNN_CHECK(cudnnSetConvolutionMathType(conv, static_cast<cudnnMathType_t>(a.math)));
  size_t ws = own ? own_workspace(plan, a.algo, direction, a.batch) : 0;
  const cudnnStatus_t status =
      own ? CUDNN_STATUS_SUCCESS : workspace_size(cudnn_, plan, b, direction, a.algo, &ws);
  if (status != CUDNN_STATUS_SUCCESS || ws > kMaxWorkspaceBytes) {
    CUDNN_WARN(cudnnSetConvolutionMathType(conv, before));
    fail(op, plan.describe() + ": cuDNN cannot run " + a.str() + " (" +
                 (status != CUDNN_STATUS_SUCCESS
                      ? std::string(cudnnGetErrorString(status))
                      : "workspace " + std::to_string(ws) + " bytes over the limit") +
                 ")");
  }
  if (plan.planned_workspace()) {
    // Its passes run in the caller's workspace, sized at plan time: the algorithm must fit it.
    const int stage = direction == kForward ? 0 : 1;
    const size_t room = plan.workspace_bytes(static_cast<ConvStage>(stage)) -
                        plan.bf16_floats[stage] * sizeof(float);
    if (ws > room) {
      CUDNN_WARN(cudnnSetConvolutionMathType(conv, before));
      fail(op, plan.describe() + ": " + a.str() + " needs a workspace of " + std::to_string(ws) +
                   " bytes, more than the " + std::to_string(room) +
                   " the plan's caller gives it (ConvUse::planned_workspace)");
    }
  } else {
    reserve_workspace(ws);
  }
  b.choice[static_cast<size_t>(direction)] = {true, a.algo, ws, static_cast<cudnnMathType_t>(a.math)};
}

ConvChoiceKey CudaBackend::conv_choice_key(ConvPlan& plan_base, ConvDirection d, int64_t n) {
  const char* op = "cuda_conv_choice_key";
  CudnnConvPlan& plan = own_plan(plan_base, op);
  check_batch(plan, n, op);
  return {choice_scope_, choice_key(plan, n, static_cast<int>(d), kMaxWorkspaceBytes)};
}

namespace {
CudaBackend& as_cuda(Backend& backend, const char* op) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) {
    throw Error(std::string(op) + ": the " + backend.name() +
                " backend has no cuDNN algorithms (a CUDA backend's plans do)");
  }
  return *cuda;
}
}  // namespace

std::vector<ConvAlgorithm> conv_algorithms(Backend& backend, ConvPlan& plan, ConvDirection d,
                                           int64_t batch) {
  return as_cuda(backend, "cuda_conv_algorithms").conv_algorithms(plan, d, batch);
}
ConvAlgorithm conv_choice(Backend& backend, ConvPlan& plan, ConvDirection d, int64_t batch) {
  return as_cuda(backend, "cuda_conv_choice").conv_choice(plan, d, batch);
}
void use_conv_algorithm(Backend& backend, ConvPlan& plan, const ConvAlgorithm& a) {
  as_cuda(backend, "cuda_use_conv_algorithm").use_conv_algorithm(plan, a);
}
ConvChoiceKey conv_choice_key(Backend& backend, ConvPlan& plan, ConvDirection d, int64_t batch) {
  return as_cuda(backend, "cuda_conv_choice_key").conv_choice_key(plan, d, batch);
}

CudaBackend::PackedOperands CudaBackend::packed_operands(const CudnnConvPlan& plan, float* scratch,
                                                         const Tensor& data, const Tensor& w,
                                                         const Tensor* w_bf16, int64_t out_numel) {
  Bf16Operands copies(scratch, stream_);
  // A bf16 tensor (a batch norm's dx, ConvPlan::output_dtype) is cuDNN's operand as it is.
  const uint16_t* data16 = data.dtype == DType::bf16 ? static_cast<const uint16_t*>(data.data)
                                                     : copies.take_packed(data.f32(), data.numel());
  const uint16_t* w16 = nullptr;
  if (transposes_filter(plan, w)) {  // transposed to cuDNN's KRSC and packed in one pass
    uint16_t* room = copies.room_packed(w.numel());
    const ConvGeometry& g = plan.geometry();
    kernels::kcrs_to_krsc_bf16(w.f32(), room, g.out_channels, g.in_channels,
                               g.kernel_h * g.kernel_w, stream_);
    w16 = room;
  } else if (w_bf16 != nullptr) {  // the caller's packed copy (the optimizer keeps it)
    w16 = static_cast<const uint16_t*>(w_bf16->data);
  } else {
    w16 = copies.take_packed(w.f32(), w.numel());
  }
  return {data16, w16, copies.room_packed(out_numel)};
}

DType CudaBackend::conv_output_dtype_impl(const ConvPlan& plan) const {
  return static_cast<const CudnnConvPlan&>(plan).bf16_output ? DType::bf16 : DType::f32;
}

bool CudaBackend::transposes_filter(const CudnnConvPlan& plan, const Tensor& w) {
  return plan.nhwc() && w.layout == Layout::nchw;
}

const float* CudaBackend::filter_for(const CudnnConvPlan& plan, const float* w) {
  const ConvGeometry& g = plan.geometry();
  kernels::kcrs_to_krsc(w, filter_scratch_, g.out_channels, g.in_channels, g.kernel_h * g.kernel_w,
                        stream_);
  return filter_scratch_;
}

// ---- ops ----------------------------------------------------------------------------------------

// w_bf16 (the caller's packed copy of w) is the filter operand of cuDNN's bf16 passes
// (packed_operands); the others round w themselves, as without it.
void CudaBackend::conv_forward_impl(ConvPlan& plan_base, const Tensor& x, const Tensor& w,
                                    const Tensor* b, const Tensor& y, const Tensor* workspace,
                                    const Tensor* w_bf16) {
  CudnnConvPlan& plan = as_cudnn(plan_base);
  const ConvGeometry& g = plan.geometry();
  const int64_t n = x.shape[0];
  activate();
  const PassScratch scratch =
      pass_scratch(plan, kForward, workspace,
                   plan.copy_floats(kForward, x.numel(), w.numel(), y.numel()), "conv_forward");
  ConvBatch& cb = conv_batch(plan, n, kForward, false, scratch.cudnn_bytes);
  poison_pass(scratch, cb.choice[kForward].workspace);
  if (const int own = cb.choice[kForward].algo;
      own == kConvAlgoDprunGemm1x1 || own == kConvAlgoDprunSmallC) {
    // After the algorithm's scratch: the fp32 sums of a bf16 y, then a bf16 x widened (both
    // counted in own_workspace). Our algorithms round x as they read it: a widened bf16 x stays.
    char* room = static_cast<char*>(scratch.cudnn) + own_scratch(plan, own, kForward, n);
    float* sums = nullptr;
    if (plan.bf16_output) {
      sums = reinterpret_cast<float*>(room);
      room += aligned_floats(y.numel()) * static_cast<int64_t>(sizeof(float));
    }
    const float* xs = nullptr;
    if (x.dtype == DType::bf16) {
      auto* wide = reinterpret_cast<float*>(room);
      kernels::from_bf16(static_cast<const uint16_t*>(x.data), wide, x.numel(), stream_);
      xs = wide;
    } else {
      xs = x.f32();
    }
    if (sums != nullptr) {  // the fp32 sums, then y's rounding
      run_own(plan, own, kForward, n, xs, w.f32(), sums, scratch.cudnn, w.layout);
      kernels::to_bf16(sums, static_cast<uint16_t*>(y.data), y.numel(), stream_);
      return;
    }
    // The bias joins the fp32 sum, then (bf16) the output's one rounding, as after cuDNN.
    run_own(plan, own, kForward, n, xs, w.f32(), y.f32(), scratch.cudnn, w.layout);
    finish_forward(y, b, n, g.out_channels, g.out_h() * g.out_w(), true, plan.output_relu());
    return;
  }
  const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(cb.choice[kForward].algo);
  const float one = 1.0f, zero = 0.0f;
  if (plan.io_bf16[kForward]) {
    // No bias (Backend::conv_forward refuses one): cuDNN's bf16 output is the rounded fp32 sum,
    // y itself when y is bf16, else widened into y.
    const PackedOperands p =
        packed_operands(plan, scratch.bf16, x, w, w_bf16, plan.bf16_output ? 0 : y.numel());
    void* out = plan.bf16_output ? y.data : static_cast<void*>(p.out);
    CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, cb.x16, p.data, plan.w_desc16, p.filter,
                                        cb.conv[kForward], algo, scratch.cudnn, scratch.cudnn_bytes,
                                        &zero, cb.y16, out));
    if (!plan.bf16_output) kernels::from_bf16(p.out, y.f32(), y.numel(), stream_);
    if (plan.output_relu()) kernels::relu_forward(y.f32(), y.f32(), y.numel(), stream_);
    return;
  }
  const auto [xs, ws] = data_and_filter(plan, x, w, scratch.bf16);
  CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, cb.x, xs, plan.w_desc, ws, cb.conv[kForward],
                                      algo, scratch.cudnn, scratch.cudnn_bytes, &zero, cb.y,
                                      y.data));
  finish_forward(y, b, n, g.out_channels, g.out_h() * g.out_w(), plan.nhwc(), plan.output_relu());
}

void CudaBackend::conv_backward_data_impl(ConvPlan& plan_base, const Tensor& dy, const Tensor& w,
                                          const Tensor& dx, const Tensor* workspace,
                                          const Tensor* w_bf16) {
  CudnnConvPlan& plan = as_cudnn(plan_base);
  activate();
  const PassScratch scratch = pass_scratch(
      plan, kBackwardData, workspace,
      plan.copy_floats(kBackwardData, dx.numel(), w.numel(), dy.numel()), "conv_backward_data");
  ConvBatch& cb = conv_batch(plan, dy.shape[0], kBackwardData, false, scratch.cudnn_bytes);
  poison_pass(scratch, cb.choice[kBackwardData].workspace);
  const auto algo = static_cast<cudnnConvolutionBwdDataAlgo_t>(cb.choice[kBackwardData].algo);
  const float one = 1.0f, zero = 0.0f;
  const bool packed_dx = dx.dtype == DType::bf16;  // the plan's input_dtype: kept packed
  if (plan.io_bf16[kBackwardData]) {
    // cuDNN's bf16 output is the rounded fp32 sum: dx's one rounding, written into a bf16 dx
    // as it is, else widened.
    const PackedOperands p =
        packed_operands(plan, scratch.bf16, dy, w, w_bf16, packed_dx ? 0 : dx.numel());
    CUDNN_CHECK(cudnnConvolutionBackwardData(
        cudnn_, &one, plan.w_desc16, p.filter, cb.y16, p.data, cb.conv[kBackwardData], algo,
        scratch.cudnn, scratch.cudnn_bytes, &zero, cb.x16, packed_dx ? dx.data : p.out));
    if (!packed_dx) kernels::from_bf16(p.out, dx.f32(), dx.numel(), stream_);
    return;
  }
  // fp32, or bf16 where cuDNN could not take bf16 data (plan_conv_impl): rounded copies, and dx
  // rounded once. (A bf16 dy comes with bf16 data: plan_conv_impl.)
  if (dy.dtype != DType::f32) {
    throw InternalError(
        "cuda backend: conv_backward_data: a bf16 dy for a plan whose "
        "backward-data takes fp32 data");
  }
  const auto [dys, ws] = data_and_filter(plan, dy, w, scratch.bf16);
  // A bf16 dx: the fp32 sums after the copies (copy_floats), then packed, rounded.
  float* sums =
      packed_dx ? scratch.bf16 + aligned_floats(dy.numel()) + aligned_floats(w.numel()) : dx.f32();
  CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, plan.w_desc, ws, cb.y, dys,
                                           cb.conv[kBackwardData], algo, scratch.cudnn,
                                           scratch.cudnn_bytes, &zero, cb.x, sums));
  if (packed_dx) {
    kernels::to_bf16(sums, static_cast<uint16_t*>(dx.data), dx.numel(), stream_);
  } else if (bf16()) {
    kernels::round_to_bf16(dx.f32(), dx.f32(), dx.numel(), stream_);
  }
}

void CudaBackend::conv_backward_filter_impl(ConvPlan& plan_base, const Tensor& x, const Tensor& dy,
                                            const Tensor& dw, const Tensor* db,
                                            const Tensor* workspace) {
  CudnnConvPlan& plan = as_cudnn(plan_base);
  const ConvGeometry& g = plan.geometry();
  const int64_t n = x.shape[0];
  activate();
  const PassScratch scratch = pass_scratch(
      plan, kBackwardFilter, workspace,
      plan.copy_floats(kBackwardFilter, x.numel(), dw.numel(), dy.numel()), "conv_backward_filter");
  ConvBatch& cb = conv_batch(plan, n, kBackwardFilter, false, scratch.cudnn_bytes);
  poison_pass(scratch, cb.choice[kBackwardFilter].workspace);
  const auto algo = static_cast<cudnnConvolutionBwdFilterAlgo_t>(cb.choice[kBackwardFilter].algo);
  const float one = 1.0f, zero = 0.0f;
  const int64_t rs = g.kernel_h * g.kernel_w;
  // In bf16 dw is rounded to bf16 once (cuDNN's bf16 kernels write it so; the others' fp32 dw is
  // rounded after); db stays fp32 and sums the rounded dy, the tensor a bf16 network holds.
  if (cb.choice[kBackwardFilter].algo == kConvAlgoDprunSmallC) {
    // dw in its own order directly, no transposed copy; in bf16 x and dy are rounded as they are
    // read, not copied first, and dw is rounded as it is written (db sums the rounded dy too). A
    // bf16 dy (rounded already) is widened as it is read; a bf16 x is widened first, after the
    // algorithm's scratch (own_workspace).
    const float* xs = nullptr;
    if (x.dtype == DType::bf16) {
      auto* wide =
          reinterpret_cast<float*>(static_cast<char*>(scratch.cudnn) +
                                   own_scratch(plan, kConvAlgoDprunSmallC, kBackwardFilter, n));
      kernels::from_bf16(static_cast<const uint16_t*>(x.data), wide, x.numel(), stream_);
      xs = wide;
    } else {
      xs = x.f32();
    }
    if (dy.dtype == DType::bf16) {  // no db: the public op refuses one with a bf16 dy
      kernels::small_conv_filter(xs, static_cast<const uint16_t*>(dy.data), dw.f32(),
                                 small_conv_shape(g, n, dw.layout),
                                 static_cast<float*>(scratch.cudnn), bf16(), stream_);
      return;
    }
    run_own(plan, kConvAlgoDprunSmallC, kBackwardFilter, n, xs, dy.f32(), dw.f32(), scratch.cudnn,
            dw.layout);
    if (db != nullptr) {
      kernels::channel_sum(dy.f32(), db->f32(), n, g.out_channels, g.out_h() * g.out_w(), true,
                           reduce_scratch_, stream_, bf16());
    }
    return;
  }
  if (plan.io_bf16[kBackwardFilter]) {
    // cuDNN's bf16 output is the rounded fp32 sum: dw's one rounding, widened (and for a
    // (K, C, R, S) dw in NHWC transposed back from KRSC) into the fp32 dw. A bf16 x or dy is its
    // operand as it is.
    Bf16Operands copies(scratch.bf16, stream_);
    const auto packed = [&](const Tensor& t) {
      return t.dtype == DType::bf16 ? static_cast<const uint16_t*>(t.data)
                                    : copies.take_packed(t.f32(), t.numel());
    };
    const uint16_t* x16 = packed(x);
    const uint16_t* dy16 = packed(dy);
    uint16_t* dw16 = copies.room_packed(dw.numel());
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, cb.x16, x16, cb.y16, dy16,
                                               cb.conv[kBackwardFilter], algo, scratch.cudnn,
                                               scratch.cudnn_bytes, &zero, plan.w_desc16, dw16));
    if (transposes_filter(plan, dw)) {
      kernels::krsc_bf16_to_kcrs(dw16, dw.f32(), g.out_channels, g.in_channels, rs, stream_);
    } else {
      kernels::from_bf16(dw16, dw.f32(), dw.numel(), stream_);
    }
    if (db != nullptr) {  // dy is fp32 here (the public op refuses a db with a bf16 dy)
      kernels::channel_sum(dy.f32(), db->f32(), n, g.out_channels, g.out_h() * g.out_w(),
                           plan.nhwc(), reduce_scratch_, stream_, true);
    }
    return;
  }
  // fp32, or bf16 where cuDNN could not take bf16 data (plan_conv_impl): rounded copies, and dw
  // rounded once.
  const auto [xs, dys] = pass_operands(x, dy, scratch.bf16);
  const bool transposed = transposes_filter(plan, dw);
  float* target = transposed ? filter_scratch_ + plan.filter_numel() : dw.f32();
  CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, cb.x, xs, cb.y, dys,
                                             cb.conv[kBackwardFilter], algo, scratch.cudnn,
                                             scratch.cudnn_bytes, &zero, plan.w_desc, target));
  if (transposed) {
    kernels::krsc_to_kcrs(target, dw.f32(), g.out_channels, g.in_channels, rs, stream_);
  }
  if (bf16()) kernels::round_to_bf16(dw.f32(), dw.f32(), dw.numel(), stream_);
  if (db != nullptr) {
    kernels::channel_sum(dys, db->f32(), n, g.out_channels, g.out_h() * g.out_w(), plan.nhwc(),
                         reduce_scratch_, stream_);
  }
}

}  // namespace dp::cuda
