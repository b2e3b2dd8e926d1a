// The emulated GPU's cuDNN: the legacy calls dprun's CUDA backend makes, against the real cudnn.h.
// Convolutions (im2col + SGEMM: plain fp32 dot products) and batch norm are computed by dprun's
// own cpu backend (tested against naive references), so what this checks is the CUDA backend's use
// of cuDNN: descriptors, layouts (an NHWC filter is K,R,S,C), the algorithm choice under the
// precision contract, workspaces, alpha/beta. Every algorithm "runs" the same fp32 computation: the
// emulated GPU says nothing about which algorithm is exact (test_cuda's [algorithms] tests need a
// real GPU for that). Convolutions take fp32 or bf16 data (x, w and y of one type, fp32 compute):
// bf16 inputs are widened, the fp32 sums rounded to bf16 (to nearest even) on output. With
// DPRUN_EMULATED_CUDNN_NO_BF16=1 bf16 data has no algorithm (=backward-filter: in that direction):
// the descriptors are taken, as real cuDNN takes them, but the heuristics, timings and workspace
// queries answer NOT_SUPPORTED, as a cuDNN without bf16 kernels for a shape would, so the backend's
// fallback is tested.
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "device/fake_device.hpp"
#include "dp/backend.hpp"
#include "dp/bf16.hpp"
#include "dp/error.hpp"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int n = 0, c = 0, h = 0, w = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
};
struct cudnnFilterStruct {
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int k = 0, c = 0, r = 0, s = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
};
struct cudnnConvolutionStruct {
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

using dp_emu::device::submit_library_work;

/// The computing backend of this thread (replicas run in threads of their own).
dp::Backend& cpu() {
  thread_local const std::unique_ptr<dp::Backend> backend = [] {
    dp::BackendOptions options;
    options.kind = dp::BackendKind::cpu;
    options.cpu_threads = 1;
    // im2col + SGEMM: every output an fp32 dot product, as the GEMM algorithms compute, which
    // the fp32-exact and bf16 contracts allow alone (oneDNN may pick Winograd).
    options.cpu_kernels = dp::CpuKernels::blas;
    return dp::create_backend(options);
  }();
  return *backend;
}

dp::Layout layout_of(cudnnTensorFormat_t f) {
  return f == CUDNN_TENSOR_NHWC ? dp::Layout::nhwc : dp::Layout::nchw;
}

dp::Tensor act(const void* p, const cudnnTensorStruct& d) {
  return dp::Tensor(const_cast<void*>(p), {d.n, d.c, d.h, d.w}, dp::DType::f32, {},
                    layout_of(d.format));
}

bool supported(const cudnnTensorStruct* x, const cudnnFilterStruct* w,
               const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y) {
  return x->format == w->format && x->format == y->format && x->type == w->type &&
         x->type == y->type && x->c == w->c && y->c == w->k && x->n == y->n &&
         conv->dilation_h == 1 && conv->dilation_w == 1;
}

/// n values of a convolution's data as fp32: copied, or widened from packed bf16.
std::vector<float> load(const void* p, size_t n, cudnnDataType_t type) {
  std::vector<float> out(n);
  if (type == CUDNN_DATA_FLOAT) {
    std::memcpy(out.data(), p, n * sizeof(float));
    return out;
  }
  const auto* bits = static_cast<const uint16_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &wide, sizeof(float));
  }
  return out;
}

/// dst = alpha * result + beta * dst (beta 0: dst is not read, as cuDNN), in dst's type: packed
/// bf16 is the fp32 value rounded to nearest even.
void store(void* dst, const std::vector<float>& result, float alpha, float beta,
           cudnnDataType_t type) {
  const std::vector<float> old =
      beta == 0.0f ? std::vector<float>() : load(dst, result.size(), type);
  for (size_t i = 0; i < result.size(); ++i) {
    const float v = beta == 0.0f ? alpha * result[i] : alpha * result[i] + beta * old[i];
    if (type == CUDNN_DATA_FLOAT) {
      static_cast<float*>(dst)[i] = v;
    } else {
      uint32_t bits = 0;
      std::memcpy(&bits, &v, sizeof(float));
      static_cast<uint16_t*>(dst)[i] = dp::packed_bf16_bits(bits);
    }
  }
}

/// The cpu backend's plan for a call's geometry, kept per thread.
dp::ConvPlan& plan_for(const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                       const cudnnConvolutionStruct* conv) {
  dp::ConvGeometry g;
  g.max_batch = x->n;
  g.in_channels = x->c;
  g.in_h = x->h;
  g.in_w = x->w;
  g.out_channels = w->k;
  g.kernel_h = w->r;
  g.kernel_w = w->s;
  g.stride_h = conv->stride_h;
  g.stride_w = conv->stride_w;
  g.pad_h = conv->pad_h;
  g.pad_w = conv->pad_w;
  g.layout = layout_of(x->format);
  thread_local std::map<std::string, std::unique_ptr<dp::ConvPlan>> plans;
  auto& plan = plans[g.str()];
  if (!plan) plan = cpu().plan_conv(g);
  return *plan;
}

size_t filter_numel(const cudnnFilterStruct* w) {
  return static_cast<size_t>(w->k) * static_cast<size_t>(w->c) * static_cast<size_t>(w->r * w->s);
}

/// The filter as the cpu backend takes it, (K, C, R, S); an NHWC filter is (K, R, S, C).
std::vector<float> filter_kcrs(const cudnnFilterStruct* w, const void* data) {
  const std::vector<float> f = load(data, filter_numel(w), w->type);
  if (w->format != CUDNN_TENSOR_NHWC) return f;
  const size_t rs = static_cast<size_t>(w->r * w->s), c = static_cast<size_t>(w->c);
  std::vector<float> out(f.size());
  for (size_t k = 0; k < static_cast<size_t>(w->k); ++k)
    for (size_t p = 0; p < rs; ++p)
      for (size_t ch = 0; ch < c; ++ch) out[(k * c + ch) * rs + p] = f[(k * rs + p) * c + ch];
  return out;
}

/// A (K, C, R, S) filter gradient into dst in the descriptor's layout and type.
void filter_store(const cudnnFilterStruct* w, const std::vector<float>& kcrs, void* dst,
                  float alpha, float beta) {
  const size_t rs = static_cast<size_t>(w->r * w->s), c = static_cast<size_t>(w->c);
  std::vector<float> laid(kcrs.size());
  for (size_t k = 0; k < static_cast<size_t>(w->k); ++k)
    for (size_t ch = 0; ch < c; ++ch)
      for (size_t p = 0; p < rs; ++p) {
        const size_t at =
            w->format == CUDNN_TENSOR_NHWC ? (k * rs + p) * c + ch : (k * c + ch) * rs + p;
        laid[at] = kcrs[(k * c + ch) * rs + p];
      }
  store(dst, laid, alpha, beta, w->type);
}

/// Whether the fake has no algorithm for data of this type in this direction ("forward",
/// "backward-data", "backward-filter"): bf16 under DPRUN_EMULATED_CUDNN_NO_BF16=1 in every
/// direction, or =backward-filter in that one alone.
bool no_algorithm_for(cudnnDataType_t type, const char* direction) {
  const char* no_bf16 = std::getenv("DPRUN_EMULATED_CUDNN_NO_BF16");
  if (type != CUDNN_DATA_BFLOAT16 || no_bf16 == nullptr) return false;
  return std::string(no_bf16) == "1" || std::string(no_bf16) == direction;
}

/// Heuristics or timings for data of `type`: none succeeds when the fake has no algorithm for it.
template <typename Perf>
void refuse_for(cudnnDataType_t type, const char* direction, Perf* perf, int returned) {
  if (!no_algorithm_for(type, direction)) return;
  for (int i = 0; i < returned; ++i) perf[i].status = CUDNN_STATUS_NOT_SUPPORTED;
}

size_t numel(const cudnnTensorStruct* d) {
  return static_cast<size_t>(d->n) * static_cast<size_t>(d->c) * static_cast<size_t>(d->h) *
         static_cast<size_t>(d->w);
}

/// What the fake offers per direction: a GEMM-family algorithm that needs a workspace, timed
/// fastest (every contract allows it, so every run uses a workspace in every pass: see
/// scribble), one without, and one that needs workspace and that the exact contracts refuse (FFT
/// or its kin), so the choice and the contract have something to refuse.
template <typename Perf, typename Algo>
void offer(Perf* perf, int requested, int* returned, cudnnMathType_t math,
           std::initializer_list<std::pair<Algo, size_t>> algos) {
  int i = 0;
  for (const auto& [algo, ws] : algos) {
    if (i == requested) break;
    perf[i] = Perf{};
    perf[i].algo = algo;
    perf[i].status = CUDNN_STATUS_SUCCESS;
    perf[i].time = 0.1f * static_cast<float>(i + 1);
    perf[i].memory = ws;
    perf[i].determinism = CUDNN_DETERMINISTIC;
    perf[i].mathType = math;
    ++i;
  }
  *returned = i;
}

constexpr size_t kTransformWorkspace = size_t{1} << 20;
constexpr size_t kGemmWorkspace = size_t{96} << 10;  // not a multiple of the transform's

/// The workspace a pass was given, as a real algorithm treats it: one smaller than the algorithm
/// needs is cuDNN's BAD_PARAM; the first `need` bytes are written over (NaN bytes) when the pass
/// runs, before it reads its inputs, so a workspace that shares memory with a live tensor
/// corrupts that tensor where a test sees it.
bool workspace_fits(size_t need, size_t given) {
  if (given >= need) return true;
  std::fprintf(stderr, "emulated cuDNN: the algorithm needs %zu bytes of workspace, given %zu\n",
               need, given);
  return false;
}
void scribble(void* workspace, size_t need) {
  if (need > 0) std::memset(workspace, 0xFF, need);
}
/// The first of the n bytes at p that is not 0xFF, or n.
size_t first_unfilled(const void* p, size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  size_t i = 0;
  while (i < n && bytes[i] == 0xFF) ++i;
  return i;
}
/// After the pass: a real algorithm reads its workspace back while it writes the output, so a
/// workspace that shares memory with the output (or with anything the pass wrote) computes
/// garbage on a GPU. Here the pattern must be intact, else the run stops, naming the call.
void check_scribble(const void* workspace, size_t need, const char* call) {
  if (const size_t i = first_unfilled(workspace, need); i < need) {
    std::fprintf(stderr,
                 "emulated cuDNN: %s: its workspace changed while the pass ran (byte %zu of "
                 "%zu): it shares memory with the pass's output\n",
                 call, i, need);
    std::abort();
  }
}

/// DPRUN_CUDA_POISON_SCRATCH=1 makes the backend fill the workspace a pass's algorithm needs with
/// 0xFF bytes right before the pass. Here each of those bytes must hold that fill when the pass
/// starts (in stream order, after the fill), and the pass leaves zeros behind, so the next pass
/// passes only if the backend filled its workspace again.
bool poison_expected() {
  static const bool on = [] {
    const char* v = std::getenv("DPRUN_CUDA_POISON_SCRATCH");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}
void check_poisoned(const void* workspace, size_t bytes, const char* call) {
  if (!poison_expected()) return;
  if (const size_t i = first_unfilled(workspace, bytes); i < bytes) {
    std::fprintf(stderr,
                 "emulated cuDNN: %s: DPRUN_CUDA_POISON_SCRATCH=1, but byte %zu of its %zu-byte "
                 "workspace is 0x%02x, not the 0xFF fill\n",
                 call, i, bytes,
                 static_cast<unsigned>(static_cast<const unsigned char*>(workspace)[i]));
    std::abort();
  }
}
void leave_unpoisoned(void* workspace, size_t bytes) {
  if (poison_expected() && bytes > 0) std::memset(workspace, 0, bytes);
}

/// What a Find*Ex call does with the workspace it is given: it times the algorithms in it (so the
/// whole of it is written), and an algorithm that needs more than it holds is not run: its
/// result's status is not a success.
template <typename Perf>
cudnnStatus_t timed_in(void* workspace, size_t bytes, Perf* perf, int returned) {
  if (bytes > 0 && workspace == nullptr) return CUDNN_STATUS_BAD_PARAM;
  scribble(workspace, bytes);
  for (int i = 0; i < returned; ++i) {
    if (perf[i].memory > bytes) perf[i].status = CUDNN_STATUS_NOT_SUPPORTED;
  }
  return CUDNN_STATUS_SUCCESS;
}

/// A call's name in the launch census: the function, its data's layout and type.
std::string census_name(const char* function, const cudnnTensorStruct& x) {
  return std::string(function) + (x.format == CUDNN_TENSOR_NHWC ? " nhwc" : " nchw") +
         (x.type == CUDNN_DATA_BFLOAT16 ? " bf16" : " f32");
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM (emulated GPU)";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED (emulated GPU)";
    default:
      return "CUDNN_STATUS_INTERNAL_ERROR (emulated GPU)";
  }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  *d = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if ((type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_BFLOAT16) || n <= 0 || c <= 0 || h <= 0 ||
      w <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  *d = cudnnTensorStruct{format, n, c, h, w, type};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  *d = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if ((type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_BFLOAT16) || k <= 0 || c <= 0 || h <= 0 ||
      w <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  *d = cudnnFilterStruct{format, k, c, h, w, type};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  *d = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dilation_h, int dilation_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (mode != CUDNN_CROSS_CORRELATION || compute != CUDNN_DATA_FLOAT || u <= 0 || v <= 0 ||
      pad_h < 0 || pad_w < 0)
    return CUDNN_STATUS_NOT_SUPPORTED;
  const cudnnMathType_t math = d->math;
  *d = cudnnConvolutionStruct{pad_h, pad_w, u, v, dilation_h, dilation_w, math};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math) {
  d->math = math;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t* math) {
  *math = d->math;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t conv,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int* n, int* c,
                                                    int* h, int* wo) {
  *n = x->n;
  *c = w->k;
  *h = (x->h + 2 * conv->pad_h - w->r) / conv->stride_h + 1;
  *wo = (x->w + 2 * conv->pad_w - w->s) / conv->stride_w + 1;
  return *h > 0 && *wo > 0 ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

// ---- algorithms -----------------------------------------------------------------------------

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t,
                                                     const cudnnConvolutionDescriptor_t conv,
                                                     const cudnnTensorDescriptor_t,
                                                     const int requested, int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf) {
  offer(perf, requested, returned, conv->math,
        {std::pair{CUDNN_CONVOLUTION_FWD_ALGO_GEMM, kGemmWorkspace},
         std::pair{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, size_t{0}},
         std::pair{CUDNN_CONVOLUTION_FWD_ALGO_FFT, kTransformWorkspace}});
  refuse_for(x->type, "forward", perf, *returned);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const void*, const cudnnFilterDescriptor_t w,
    const void*, const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y, void*,
    const int requested, int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, void* workspace,
    size_t bytes) {
  cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, requested, returned, perf);
  return timed_in(workspace, bytes, perf, *returned);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  offer(perf, requested, returned, conv->math,
        {std::pair{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, kGemmWorkspace},
         std::pair{CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, size_t{0}},
         std::pair{CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, kTransformWorkspace}});
  refuse_for(dy->type, "backward-data", perf, *returned);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const void*, const cudnnTensorDescriptor_t dy,
    const void*, const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, void*,
    const int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, void* workspace,
    size_t bytes) {
  cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, dy, conv, dx, requested, returned, perf);
  return timed_in(workspace, bytes, perf, *returned);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  offer(perf, requested, returned, conv->math,
        {std::pair{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, kGemmWorkspace},
         std::pair{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, size_t{0}},
         std::pair{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, kTransformWorkspace}});
  refuse_for(x->type, "backward-filter", perf, *returned);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const void*, const cudnnTensorDescriptor_t dy,
    const void*, const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, void*,
    const int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void* workspace,
    size_t bytes) {
  cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, dy, conv, dw, requested, returned, perf);
  return timed_in(workspace, bytes, perf, *returned);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t,
    const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t,
    cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
  if (no_algorithm_for(x->type, "forward")) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT ||
                   algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
                   algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
               ? kTransformWorkspace
           : algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM ? kGemmWorkspace
                                                     : 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, const cudnnFilterDescriptor_t, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  if (no_algorithm_for(dy->type, "backward-data")) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0   ? 0
           : algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 ? kGemmWorkspace
                                                       : kTransformWorkspace;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t,
    const cudnnConvolutionDescriptor_t, const cudnnFilterDescriptor_t,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  if (no_algorithm_for(x->type, "backward-filter")) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0   ? 0
           : algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ? kGemmWorkspace
                                                         : kTransformWorkspace;
  return CUDNN_STATUS_SUCCESS;
}

// ---- convolutions ---------------------------------------------------------------------------

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      const cudnnTensorDescriptor_t xd, const void* x,
                                      const cudnnFilterDescriptor_t wd, const void* w,
                                      const cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* workspace,
                                      size_t workspace_bytes, const void* beta,
                                      const cudnnTensorDescriptor_t yd, void* y) {
  if (!supported(xd, wd, conv, yd)) return CUDNN_STATUS_NOT_SUPPORTED;
  size_t need = 0;
  if (cudnnGetConvolutionForwardWorkspaceSize(handle, xd, wd, conv, yd, algo, &need) !=
      CUDNN_STATUS_SUCCESS)
    return CUDNN_STATUS_NOT_SUPPORTED;
  if (!workspace_fits(need, workspace_bytes)) return CUDNN_STATUS_BAD_PARAM;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const cudnnTensorStruct xs = *xd, ys = *yd;
  const cudnnFilterStruct ws = *wd;
  const cudnnConvolutionStruct cs = *conv;
  submit_library_work(handle->stream, census_name("cudnnConvolutionForward", xs), [=] {
    check_poisoned(workspace, need, "cudnnConvolutionForward");
    scribble(workspace, need);
    std::vector<float> in = load(x, numel(&xs), xs.type), kcrs = filter_kcrs(&ws, w),
                       out(numel(&ys));
    cpu().conv_forward(plan_for(&xs, &ws, &cs), act(in.data(), xs),
                       dp::Tensor(kcrs.data(), {ws.k, ws.c, ws.r, ws.s}), nullptr,
                       act(out.data(), ys));
    store(y, out, a, b, ys.type);
    check_scribble(workspace, need, "cudnnConvolutionForward");
    leave_unpoisoned(workspace, need);
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           const cudnnFilterDescriptor_t wd, const void* w,
                                           const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace,
                                           size_t workspace_bytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxd, void* dx) {
  if (!supported(dxd, wd, conv, dyd)) return CUDNN_STATUS_NOT_SUPPORTED;
  size_t need = 0;
  if (cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wd, dyd, conv, dxd, algo, &need) !=
      CUDNN_STATUS_SUCCESS)
    return CUDNN_STATUS_NOT_SUPPORTED;
  if (!workspace_fits(need, workspace_bytes)) return CUDNN_STATUS_BAD_PARAM;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const cudnnTensorStruct xs = *dxd, ys = *dyd;
  const cudnnFilterStruct ws = *wd;
  const cudnnConvolutionStruct cs = *conv;
  submit_library_work(handle->stream, census_name("cudnnConvolutionBackwardData", xs), [=] {
    check_poisoned(workspace, need, "cudnnConvolutionBackwardData");
    scribble(workspace, need);
    std::vector<float> grad = load(dy, numel(&ys), ys.type), kcrs = filter_kcrs(&ws, w),
                       out(numel(&xs));
    cpu().conv_backward_data(plan_for(&xs, &ws, &cs), act(grad.data(), ys),
                             dp::Tensor(kcrs.data(), {ws.k, ws.c, ws.r, ws.s}),
                             act(out.data(), xs));
    store(dx, out, a, b, xs.type);
    check_scribble(workspace, need, "cudnnConvolutionBackwardData");
    leave_unpoisoned(workspace, need);
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xd, const void* x,
                                             const cudnnTensorDescriptor_t dyd, const void* dy,
                                             const cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workspace,
                                             size_t workspace_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwd, void* dw) {
  if (!supported(xd, dwd, conv, dyd)) return CUDNN_STATUS_NOT_SUPPORTED;
  size_t need = 0;
  if (cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xd, dyd, conv, dwd, algo, &need) !=
      CUDNN_STATUS_SUCCESS)
    return CUDNN_STATUS_NOT_SUPPORTED;
  if (!workspace_fits(need, workspace_bytes)) return CUDNN_STATUS_BAD_PARAM;
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const cudnnTensorStruct xs = *xd, ys = *dyd;
  const cudnnFilterStruct ws = *dwd;
  const cudnnConvolutionStruct cs = *conv;
  submit_library_work(handle->stream, census_name("cudnnConvolutionBackwardFilter", xs), [=] {
    check_poisoned(workspace, need, "cudnnConvolutionBackwardFilter");
    scribble(workspace, need);
    std::vector<float> in = load(x, numel(&xs), xs.type), grad = load(dy, numel(&ys), ys.type),
                       kcrs(filter_numel(&ws));
    cpu().conv_backward_filter(plan_for(&xs, &ws, &cs), act(in.data(), xs), act(grad.data(), ys),
                               dp::Tensor(kcrs.data(), {ws.k, ws.c, ws.r, ws.s}), nullptr);
    filter_store(&ws, kcrs, dw, a, b);
    check_scribble(workspace, need, "cudnnConvolutionBackwardFilter");
    leave_unpoisoned(workspace, need);
  });
  return CUDNN_STATUS_SUCCESS;
}

// ---- batch norm (the legacy API, spatial mode) ------------------------------------------------

cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived,
                                            const cudnnTensorDescriptor_t x,
                                            cudnnBatchNormMode_t mode) {
  if (mode != CUDNN_BATCHNORM_SPATIAL) return CUDNN_STATUS_NOT_SUPPORTED;
  *derived = cudnnTensorStruct{CUDNN_TENSOR_NCHW, 1, x->c, 1, 1};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t xd, const void* x, const cudnnTensorDescriptor_t yd, void* y,
    const cudnnTensorDescriptor_t, const void* scale, const void* bias, double factor,
    void* running_mean, void* running_var, double eps, void* save_mean, void* save_invstd) {
  if (mode != CUDNN_BATCHNORM_SPATIAL || *static_cast<const float*>(alpha) != 1.0f ||
      *static_cast<const float*>(beta) != 0.0f || xd->format != yd->format ||
      xd->type != CUDNN_DATA_FLOAT)
    return CUDNN_STATUS_NOT_SUPPORTED;
  const cudnnTensorStruct xs = *xd;
  submit_library_work(
      handle->stream, census_name("cudnnBatchNormalizationForwardTraining", xs), [=] {
        const dp::Shape c{xs.c};
        const auto vec = [&](const void* p) { return dp::Tensor(const_cast<void*>(p), c); };
        cpu().batchnorm_forward_train(act(x, xs), vec(scale), vec(bias), vec(running_mean),
                                      vec(running_var), static_cast<float>(factor),
                                      static_cast<float>(eps), vec(save_mean), vec(save_invstd),
                                      act(y, xs));
      });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha, const void* beta,
    const cudnnTensorDescriptor_t xd, const void* x, const cudnnTensorDescriptor_t yd, void* y,
    const cudnnTensorDescriptor_t, const void* scale, const void* bias, const void* mean,
    const void* var, double eps) {
  if (mode != CUDNN_BATCHNORM_SPATIAL || *static_cast<const float*>(alpha) != 1.0f ||
      *static_cast<const float*>(beta) != 0.0f || xd->format != yd->format ||
      xd->type != CUDNN_DATA_FLOAT)
    return CUDNN_STATUS_NOT_SUPPORTED;
  const cudnnTensorStruct xs = *xd;
  submit_library_work(
      handle->stream, census_name("cudnnBatchNormalizationForwardInference", xs), [=] {
        const dp::Shape c{xs.c};
        const auto vec = [&](const void* p) { return dp::Tensor(const_cast<void*>(p), c); };
        cpu().batchnorm_forward_infer(act(x, xs), vec(scale), vec(bias), vec(mean), vec(var),
                                      static_cast<float>(eps), act(y, xs));
      });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void* alpha_data, const void* beta_data,
    const void* alpha_param, const void* beta_param, const cudnnTensorDescriptor_t xd,
    const void* x, const cudnnTensorDescriptor_t, const void* dy, const cudnnTensorDescriptor_t,
    void* dx, const cudnnTensorDescriptor_t, const void* scale, void* dscale, void* dbias,
    double eps, const void* save_mean, const void* save_invstd) {
  const auto f = [](const void* p) { return *static_cast<const float*>(p); };
  if (mode != CUDNN_BATCHNORM_SPATIAL || f(alpha_data) != 1.0f || f(beta_data) != 0.0f ||
      f(alpha_param) != 1.0f || f(beta_param) != 0.0f || xd->type != CUDNN_DATA_FLOAT)
    return CUDNN_STATUS_NOT_SUPPORTED;
  const cudnnTensorStruct xs = *xd;
  submit_library_work(handle->stream, census_name("cudnnBatchNormalizationBackward", xs), [=] {
    const dp::Shape c{xs.c};
    const auto vec = [&](const void* p) { return dp::Tensor(const_cast<void*>(p), c); };
    cpu().batchnorm_backward(act(x, xs), act(dy, xs), vec(scale), vec(save_mean), vec(save_invstd),
                             static_cast<float>(eps), act(dx, xs), vec(dscale), vec(dbias));
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
