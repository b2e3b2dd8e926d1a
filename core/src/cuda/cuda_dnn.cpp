// Batch norm and linear layers. Batch norm of NCHW (and (N, C)) activations goes through cuDNN
// (CUDNN_BATCHNORM_SPATIAL), which has PyTorch's semantics: exponentialAverageFactor is the
// momentum, the running variance is updated with the unbiased variance, and it saves the batch
// mean and 1/sqrt(var + eps) for the backward pass. NHWC activations go to our channels-last
// kernels (bn_nhwc.cu) with the same semantics and the epilogue fused: cuDNN's legacy batch norm
// on an NHWC descriptor was 35.6 of ResNet-18's 44.7 ms per step on the H100. Linear layers go
// through cuBLAS.
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/error.hpp"

namespace dp::cuda {
namespace {
Layout layout_of(const Tensor& t) { return t.shape.rank == 4 ? t.layout : Layout::nchw; }

/// BnEpilogue::conv_bias's data, or null.
const float* conv_bias_of(const BnEpilogue& e) {
  return e.conv_bias != nullptr ? e.conv_bias->f32() : nullptr;
}

/// Calls f with t's data as the kernels take it: fp32, or packed bf16 (batchnorm_takes_impl: x,
/// y and the epilogue's residual), or a null float pointer when t is absent (a backward without the
/// ReLU epilogue's y).
template <typename F>
void with_data(const Tensor* t, F&& f) {
  if (t != nullptr && t->dtype == DType::bf16) {
    f(static_cast<uint16_t*>(t->data));
  } else {
    f(t != nullptr ? t->f32() : static_cast<float*>(nullptr));
  }
}
/// Calls f with dy's data: fp32, or packed bf16 where the ReLU epilogue's y (ys, from with_data)
/// is bf16 too, the one combination Backend::batchnorm_backward takes (dy.f32() refuses others).
template <typename Y, typename F>
void with_gradient(const Tensor& dy, const Y* /*ys*/, F&& f) {
  if constexpr (std::is_same_v<std::remove_cv_t<Y>, uint16_t>) {
    if (dy.dtype == DType::bf16) return f(static_cast<const uint16_t*>(dy.data));
  }
  f(dy.f32());
}
/// The data of dx, which has the type of the x that with_data passed as xs.
template <typename T>
T* like_input(const Tensor& dx, const T* /*xs*/) {
  return static_cast<T*>(dx.data);
}
}  // namespace

// ---- batch norm --------------------------------------------------------------------------------

void CudaBackend::set_bn_descriptors(const Dims& d, Layout layout) {
  for (int64_t v : {d.n, d.c, d.h, d.w}) {
    if (v > (int64_t{1} << 30)) fail("batchnorm", "tensor too large for cuDNN");
  }
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      bn_x_desc_, layout == Layout::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
      static_cast<int>(d.n), static_cast<int>(d.c), static_cast<int>(d.h), static_cast<int>(d.w)));
  CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn_param_desc_, bn_x_desc_, CUDNN_BATCHNORM_SPATIAL));
}

// A bf16 x (a bf16 convolution's stored output) and a bf16 y (the output of a batch norm that only
// a bf16 convolution reads) go to our channels-last kernels only.
bool CudaBackend::batchnorm_takes_impl(DType dtype, Layout layout) const {
  return dtype == DType::bf16 && layout == Layout::nhwc && own_nhwc_bn_;
}

// Our channels-last kernels add the folded bias's share where they write the statistics
// (bn_nhwc.cu's stats_tile, bn_finalize_stats_kernel) or their scale (infer_scale_kernel). The
// synchronised kernels could in either layout; one rule for all three ops keeps it simple.
bool CudaBackend::batchnorm_folds_bias_impl(Layout layout) const {
  return layout == Layout::nhwc && own_nhwc_bn_;
}

// Precision bf16: every convolution pass rounds x to bf16 first, so a packed bf16 x is its operand
// as it is (cuDNN's bf16 data), or widened where an fp32 kernel runs (cuda_conv.cpp).
bool CudaBackend::conv_takes_impl(DType dtype) const {
  return dtype == DType::bf16 && bf16() && bf16_storage_;
}

void CudaBackend::prepare_batchnorm_impl(const Shape& max_input, Layout layout) {
  if (max_input.rank != 4 || layout != Layout::nhwc || !own_nhwc_bn_) return;  // cuDNN: none
  activate();
  bn_scratch_for(max_input[0] * max_input[2] * max_input[3], max_input[1], "prepare_batchnorm");
  // A reduction that died part-way (a failed launch) left its counters where it stopped: every
  // model's setup starts from 0 again.
  if (bn_counters_held_ > 0) {
    CUDA_CHECK(cudaMemsetAsync(bn_counters_, 0, bn_counters_held_ * sizeof(unsigned), stream_));
  }
}

float* CudaBackend::bn_scratch_for(int64_t rows, int64_t c, const char* op) {
  const auto needs = [&] {
    return "a batch norm of " + std::to_string(c) + " channels over " + std::to_string(rows) +
           " rows needs more scratch than was prepared";
  };
  const char* remedy = "declare it at setup with prepare_batchnorm";
  const size_t counters = kernels::bn_nhwc_counters(c);
  if (counters > bn_counters_held_) {
    regrow_scratch(bn_counters_, bn_counters_held_, counters, op, needs(), remedy);
    // The kernels leave them 0 (kernels.cuh): zeroed once, in stream order before any use.
    CUDA_CHECK(cudaMemsetAsync(bn_counters_, 0, counters * sizeof(unsigned), stream_));
  }
  const size_t floats = kernels::bn_nhwc_scratch_floats(rows, c);
  if (floats <= bn_scratch_floats_) return bn_scratch_;
  return regrow_scratch(bn_scratch_, bn_scratch_floats_, floats, op, needs(), remedy);
}

void CudaBackend::apply_epilogue(const Tensor& y, const BnEpilogue& epilogue) {
  if (epilogue.residual != nullptr) add_impl(y, *epilogue.residual, y, 1.0f);
  if (epilogue.relu) relu_forward_impl(y, y);
}

// Precision bf16: an f32 y gets the rounding a packed one has (Backend::batchnorm_forward_train),
// a pass of its own: the fast path (NHWC, bf16 storage) stores it packed.
void CudaBackend::round_batchnorm_output(const Tensor& y) {
  if (bf16() && y.dtype == DType::f32 && y.numel() > 0) {
    kernels::round_to_bf16(y.f32(), y.f32(), y.numel(), stream_);
  }
}

const Tensor& CudaBackend::epilogue_gradient(const Tensor& dy, const BnEpilogueGrad& epilogue) {
  if (epilogue.y == nullptr) return dy;
  relu_backward_impl(*epilogue.y, dy, *epilogue.dz);
  return *epilogue.dz;
}

void CudaBackend::batchnorm_forward_train_impl(const Tensor& x, const Tensor& gamma,
                                               const Tensor& beta, const Tensor& running_mean,
                                               const Tensor& running_var, float momentum, float eps,
                                               const Tensor& save_mean, const Tensor& save_invstd,
                                               const Tensor& y, const BnEpilogue& epilogue) {
  activate();
  if (own_bn(x)) {
    const Dims d = dims_of(x);
    float* scratch = bn_scratch_for(d.n * d.hw(), d.c, "batchnorm_forward_train");
    with_data(&x, [&](const auto* xs) {
      with_data(&y, [&](auto* ys) {
        with_data(epilogue.residual, [&](const auto* rs) {
          kernels::bn_nhwc_forward_train(xs, gamma.f32(), beta.f32(), running_mean.f32(),
                                         running_var.f32(), conv_bias_of(epilogue), momentum, eps,
                                         save_mean.f32(), save_invstd.f32(), rs, epilogue.relu, ys,
                                         d.n * d.hw(), d.c, scratch, bn_counters_, stream_);
        });
      });
    });
    round_batchnorm_output(y);
    return;
  }
  DP_ASSERT(epilogue.conv_bias == nullptr);  // batchnorm_folds_bias: our kernels only
  set_bn_descriptors(dims_of(x), layout_of(x));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, bn_x_desc_, x.data, bn_x_desc_, y.data,
      bn_param_desc_, gamma.data, beta.data, static_cast<double>(momentum), running_mean.data,
      running_var.data, static_cast<double>(eps), save_mean.data, save_invstd.data));
  apply_epilogue(y, epilogue);
  round_batchnorm_output(y);
}

void CudaBackend::batchnorm_forward_infer_impl(const Tensor& x, const Tensor& gamma,
                                               const Tensor& beta, const Tensor& running_mean,
                                               const Tensor& running_var, float eps,
                                               const Tensor& y, const BnEpilogue& epilogue) {
  activate();
  if (own_bn(x)) {
    const Dims d = dims_of(x);
    float* scratch = bn_scratch_for(d.n * d.hw(), d.c, "batchnorm_forward_infer");
    with_data(&x, [&](const auto* xs) {
      with_data(&y, [&](auto* ys) {
        with_data(epilogue.residual, [&](const auto* rs) {
          kernels::bn_nhwc_forward_infer(xs, gamma.f32(), beta.f32(), running_mean.f32(),
                                         running_var.f32(), conv_bias_of(epilogue), eps, rs,
                                         epilogue.relu, ys, d.n * d.hw(), d.c, scratch, stream_);
        });
      });
    });
    round_batchnorm_output(y);
    return;
  }
  DP_ASSERT(epilogue.conv_bias == nullptr);
  set_bn_descriptors(dims_of(x), layout_of(x));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, bn_x_desc_, x.data, bn_x_desc_, y.data,
      bn_param_desc_, gamma.data, beta.data, running_mean.data, running_var.data,
      static_cast<double>(eps)));
  apply_epilogue(y, epilogue);
  round_batchnorm_output(y);
}

void CudaBackend::batchnorm_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                          const Tensor& save_mean, const Tensor& save_invstd,
                                          float eps, const Tensor& dx, const Tensor& dgamma,
                                          const Tensor& dbeta, const BnEpilogueGrad& epilogue) {
  activate();
  if (own_bn(x)) {
    const Dims d = dims_of(x);
    const bool relu = epilogue.y != nullptr;
    float* scratch = bn_scratch_for(d.n * d.hw(), d.c, "batchnorm_backward");
    with_data(&x, [&](const auto* xs) {
      with_data(epilogue.y, [&](const auto* ys) {
        with_gradient(dy, ys, [&](const auto* dys) {
          kernels::bn_nhwc_backward(xs, dys, ys, relu ? epilogue.dz->f32() : nullptr, gamma.f32(),
                                    save_mean.f32(), save_invstd.f32(), like_input(dx, xs),
                                    dgamma.f32(), dbeta.f32(), d.n * d.hw(), d.c, scratch,
                                    bn_counters_, stream_);
        });
      });
    });
    return;
  }
  const Tensor& g = epilogue_gradient(dy, epilogue);
  set_bn_descriptors(dims_of(x), layout_of(x));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnBatchNormalizationBackward(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, bn_x_desc_, x.data, bn_x_desc_,
      g.data, bn_x_desc_, dx.data, bn_param_desc_, gamma.data, dgamma.data, dbeta.data,
      static_cast<double>(eps), save_mean.data, save_invstd.data));
}

// ---- synchronised batch norm (our kernels, bn_sync.cu) -----------------------------------------

void CudaBackend::batchnorm_sums_impl(const Tensor& x, const Tensor* mean, const Tensor& sums) {
  const Dims d = dims_of(x);
  activate();
  with_data(&x, [&](const auto* xs) {
    kernels::bn_sums(xs, mean != nullptr ? mean->f32() : nullptr, sums.f32(), d.n, d.c, d.hw(),
                     is_nhwc(x), stream_);
  });
}

void CudaBackend::batchnorm_apply_stats_impl(const Tensor& x, const Tensor& gamma,
                                             const Tensor& beta, const Tensor& mean,
                                             const Tensor& var, const Tensor& running_mean,
                                             const Tensor& running_var, float momentum, float eps,
                                             int64_t count, const Tensor& save_mean,
                                             const Tensor& save_invstd, const Tensor& y,
                                             const BnEpilogue& epilogue) {
  const Dims d = dims_of(x);
  activate();
  // The epilogue in the normalising pass (the values of add then relu_forward after it).
  with_data(&x, [&](const auto* xs) {
    with_data(&y, [&](auto* ys) {
      with_data(epilogue.residual, [&](const auto* rs) {
        kernels::bn_apply_stats(xs, gamma.f32(), beta.f32(), mean.f32(), var.f32(),
                                running_mean.f32(), running_var.f32(), conv_bias_of(epilogue),
                                momentum, eps, count, save_mean.f32(), save_invstd.f32(), rs,
                                epilogue.relu, ys, d.n, d.c, d.hw(), is_nhwc(x), stream_);
      });
    });
  });
  round_batchnorm_output(y);
}

void CudaBackend::batchnorm_backward_sums_impl(const Tensor& x, const Tensor& dy,
                                               const Tensor& save_mean, const Tensor& save_invstd,
                                               const Tensor& sums, const BnEpilogueGrad& epilogue) {
  const Dims d = dims_of(x);
  activate();
  // The ReLU's mask in the summing pass, which writes dz (relu_backward's values).
  with_data(&x, [&](const auto* xs) {
    with_data(epilogue.y, [&](const auto* ys) {
      with_gradient(dy, ys, [&](const auto* dys) {
        kernels::bn_backward_sums(
            xs, dys, ys, epilogue.dz != nullptr ? epilogue.dz->f32() : nullptr, save_mean.f32(),
            save_invstd.f32(), sums.f32(), d.n, d.c, d.hw(), is_nhwc(x), stream_);
      });
    });
  });
}

void CudaBackend::batchnorm_backward_apply_impl(const Tensor& x, const Tensor& dy,
                                                const Tensor& gamma, const Tensor& save_mean,
                                                const Tensor& save_invstd, const Tensor& sums,
                                                int64_t count, const Tensor& dx) {
  const Dims d = dims_of(x);
  activate();
  with_data(&x, [&](const auto* xs) {
    kernels::bn_backward_apply(xs, dy.f32(), gamma.f32(), save_mean.f32(), save_invstd.f32(),
                               sums.f32(), count, like_input(dx, xs), d.n, d.c, d.hw(), is_nhwc(x),
                               stream_);
  });
}

// ---- linear ------------------------------------------------------------------------------------
// Row-major (N, IN) x (OUT, IN)^T seen by column-major cuBLAS: a row-major (R, C) matrix is a
// column-major (C, R) one, so y^T (OUT, N) = w (OUT, IN as column-major IN x OUT)^T x^T.

namespace {
struct LinearDims {
  int n, in, out;
};

LinearDims linear_dims(const Tensor& x, const Tensor& w, const char* op) {
  const int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  if (n > INT32_MAX || in > INT32_MAX || out > INT32_MAX) fail(op, "too large for cuBLAS");
  return {static_cast<int>(n), static_cast<int>(in), static_cast<int>(out)};
}

/// C (M x N, fp32, column-major) = op(A) (M x K) op(B) (K x N). fp32 operands: cublasSgemm
/// (TF32 where the handle's math allows it). Packed bf16 operands: cublasGemmEx with fp32 sums
/// of their exact products (CUBLAS_COMPUTE_32F), into fp32.
void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          GemmOperand a, int lda, GemmOperand b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  if (!a.packed) {
    CUBLAS_CHECK(cublasSgemm(h, ta, tb, m, n, k, &one, static_cast<const float*>(a.data), lda,
                             static_cast<const float*>(b.data), ldb, &zero, c, ldc));
    return;
  }
  CUBLAS_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &one, a.data, CUDA_R_16BF, lda, b.data, CUDA_R_16BF,
                            ldb, &zero, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}
}  // namespace

GemmOperands CudaBackend::gemm_operands(const char* op, const Tensor* a, const Tensor* b,
                                        const Tensor* c, const Tensor* b_bf16) {
  const Tensor* tensors[3] = {a, b, c};
  GemmOperands out{};
  if (!bf16()) {
    for (int i = 0; i < 3; ++i) out[i] = {tensors[i] ? tensors[i]->data : nullptr, false};
    return out;
  }
  if (b == nullptr) b_bf16 = nullptr;  // an operand not read (linear_backward without dx)
  const auto count = [](const Tensor* t) { return t ? t->numel() : int64_t{0}; };
  Bf16Operands copies(
      bf16_scratch_for(bf16_packed_floats({count(a), b_bf16 ? 0 : count(b), count(c)}), op),
      stream_);
  for (int i = 0; i < 3; ++i) {
    if (i == 1 && b_bf16 != nullptr) {
      out[i] = {b_bf16->data, true};
    } else {
      out[i] = {tensors[i] ? copies.take_packed(tensors[i]->f32(), tensors[i]->numel()) : nullptr,
                true};
    }
  }
  return out;
}

void CudaBackend::prepare_linear_impl(int64_t max_batch, int64_t in, int64_t out) {
  // Forward copies (x, w); backward (x, w, dy).
  if (!bf16()) return;
  activate();
  bf16_scratch_for(bf16_packed_floats({max_batch * in, out * in, max_batch * out}),
                   "prepare_linear");
}

void CudaBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const Tensor* b,
                                      const Tensor& y, bool relu, const Tensor* w_bf16) {
  const LinearDims d = linear_dims(x, w, "linear_forward");
  activate();
  const auto [xs, ws, none] = gemm_operands("linear_forward", &x, &w, nullptr, w_bf16);
  gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, d.out, d.n, d.in, ws, d.in, xs, d.in, y.f32(), d.out);
  finish_forward(y, b, d.n, d.out, 1, /*nhwc=*/true, relu);  // a row-major (N, OUT) matrix
}

void CudaBackend::linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy,
                                       const Tensor* dx, const Tensor& dw, const Tensor* db,
                                       const Tensor* w_bf16) {
  const LinearDims d = linear_dims(x, w, "linear_backward");
  activate();
  // In bf16 dw and db stay fp32 (db sums the rounded dy); w is read for dx only.
  const auto [xs, ws, dys] = gemm_operands("linear_backward", &x, dx ? &w : nullptr, &dy, w_bf16);
  if (dx != nullptr) {
    // dx^T (IN, N) = w^T (IN, OUT) dy^T (OUT, N)
    gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, d.in, d.n, d.out, ws, d.in, dys, d.out, dx->f32(),
         d.in);
    if (bf16()) kernels::round_to_bf16(dx->f32(), dx->f32(), dx->numel(), stream_);
  }
  // dw^T (IN, OUT) = x^T (IN, N) dy (N, OUT)
  gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, d.in, d.out, d.n, xs, d.in, dys, d.out, dw.f32(), d.in);
  if (db != nullptr) {
    kernels::channel_sum(dy.f32(), db->f32(), d.n, d.out, 1, /*nhwc=*/true, nullptr, stream_,
                         /*round_bf16=*/bf16());
  }
}

}  // namespace dp::cuda
