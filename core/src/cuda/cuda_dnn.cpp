// Batch norm through cuDNN (CUDNN_BATCHNORM_SPATIAL, NCHW or NHWC) and linear layers through
// cuBLAS. cuDNN's batch norm has PyTorch's semantics: exponentialAverageFactor is the momentum,
// the running variance is updated with the unbiased variance, and it saves the batch mean and
// 1/sqrt(var + eps) for the backward pass.
#include <cstdint>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/error.hpp"

namespace dp::cuda {
namespace {

void check_channel_vector(const Tensor& t, int64_t c, const char* op, const char* what) {
  expect_f32(t, op, what);
  expect_numel(t, c, op, what);
}

void check_like(const Tensor& t, const Tensor& like, const char* op, const char* what,
                const char* like_name) {
  expect_f32(t, op, what);
  if (t.shape != like.shape) {
    fail(op, std::string(what) + " has shape " + t.shape.str() + " but " + like_name + " has " +
                 like.shape.str());
  }
  expect_same_layout(t, like, op);
}

Layout layout_of(const Tensor& t) { return t.shape.rank == 4 ? t.layout : Layout::nchw; }

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

void CudaBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          float momentum, float eps, const Tensor& save_mean,
                                          const Tensor& save_invstd, const Tensor& y) {
  const char* op = "batchnorm_forward_train";
  const Dims d = activation_dims(x, op, "x", /*allow_rank2=*/true);
  check_like(y, x, op, "y", "x");
  for (auto [t, what] : {std::pair{&gamma, "gamma"},
                         {&beta, "beta"},
                         {&running_mean, "running_mean"},
                         {&running_var, "running_var"},
                         {&save_mean, "save_mean"},
                         {&save_invstd, "save_invstd"}}) {
    check_channel_vector(*t, d.c, op, what);
  }
  if (d.n * d.hw() < 2) {
    fail(op, "training needs more than one value per channel, got input shape " + x.shape.str() +
                 " (as PyTorch: use a larger batch per replica)");
  }
  if (!(eps > 0.0f)) fail(op, "eps must be positive, got " + std::to_string(eps));
  activate();
  set_bn_descriptors(d, layout_of(x));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, bn_x_desc_, x.data, bn_x_desc_, y.data,
      bn_param_desc_, gamma.data, beta.data, static_cast<double>(momentum), running_mean.data,
      running_var.data, static_cast<double>(eps), save_mean.data, save_invstd.data));
  // cuDNN's backward takes epsilon too; the interface does not pass it, so remember it per layer
  // (keyed by the saved-statistics buffer, which belongs to one layer).
  bn_eps_[save_invstd.data] = eps;
}

void CudaBackend::batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          float eps, const Tensor& y) {
  const char* op = "batchnorm_forward_infer";
  const Dims d = activation_dims(x, op, "x", /*allow_rank2=*/true);
  check_like(y, x, op, "y", "x");
  for (auto [t, what] : {std::pair{&gamma, "gamma"},
                         {&beta, "beta"},
                         {&running_mean, "running_mean"},
                         {&running_var, "running_var"}}) {
    check_channel_vector(*t, d.c, op, what);
  }
  if (!(eps > 0.0f)) fail(op, "eps must be positive, got " + std::to_string(eps));
  if (d.n == 0) return;
  activate();
  set_bn_descriptors(d, layout_of(x));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, bn_x_desc_, x.data, bn_x_desc_, y.data,
      bn_param_desc_, gamma.data, beta.data, running_mean.data, running_var.data,
      static_cast<double>(eps)));
}

void CudaBackend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                     const Tensor& save_mean, const Tensor& save_invstd,
                                     const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const char* op = "batchnorm_backward";
  const Dims d = activation_dims(x, op, "x", /*allow_rank2=*/true);
  check_like(dy, x, op, "dy", "x");
  check_like(dx, x, op, "dx", "x");
  for (auto [t, what] : {std::pair{&gamma, "gamma"},
                         {&save_mean, "save_mean"},
                         {&save_invstd, "save_invstd"},
                         {&dgamma, "dgamma"},
                         {&dbeta, "dbeta"}}) {
    check_channel_vector(*t, d.c, op, what);
  }
  if (d.n * d.hw() < 2) fail(op, "needs more than one value per channel, got " + x.shape.str());
  activate();
  set_bn_descriptors(d, layout_of(x));
  const auto it = bn_eps_.find(save_invstd.data);
  const double eps = it != bn_eps_.end() ? it->second : 1e-5;
  const float one = 1.0f, zero = 0.0f;
  CUDNN_CHECK(cudnnBatchNormalizationBackward(
      cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, bn_x_desc_, x.data, bn_x_desc_,
      dy.data, bn_x_desc_, dx.data, bn_param_desc_, gamma.data, dgamma.data, dbeta.data, eps,
      save_mean.data, save_invstd.data));
}

// ---- linear ------------------------------------------------------------------------------------
// Row-major (N, IN) x (OUT, IN)^T seen by column-major cuBLAS: a row-major (R, C) matrix is a
// column-major (C, R) one, so y^T (OUT, N) = w (OUT, IN as column-major IN x OUT)^T x^T.

namespace {
struct LinearDims {
  int n, in, out;
};

LinearDims check_linear(const Tensor& x, const Tensor& w, const char* op) {
  expect_f32(x, op, "x");
  expect_f32(w, op, "w");
  if (x.shape.rank < 1 || w.shape.rank != 2) {
    fail(op,
         "x " + x.shape.str() + " and w " + w.shape.str() + ": expected x (N, IN), w (OUT, IN)");
  }
  const int64_t n = x.shape[0], in = x.shape.per_example(), out = w.shape[0];
  if (w.shape[1] != in) {
    fail(op, "x has shape " + x.shape.str() + " (" + std::to_string(in) +
                 " features) but w has shape " + w.shape.str() + ", expected (OUT, " +
                 std::to_string(in) + ")");
  }
  if (n > INT32_MAX || in > INT32_MAX || out > INT32_MAX) fail(op, "too large for cuBLAS");
  return {static_cast<int>(n), static_cast<int>(in), static_cast<int>(out)};
}
}  // namespace

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b,
                                 const Tensor& y) {
  const char* op = "linear_forward";
  const LinearDims d = check_linear(x, w, op);
  expect_f32(y, op, "y");
  if (y.shape.rank < 1 || y.shape[0] != d.n || y.numel() != int64_t{d.n} * d.out) {
    fail(op, "y has shape " + y.shape.str() + ", expected (" + std::to_string(d.n) + ", " +
                 std::to_string(d.out) + ")");
  }
  if (b != nullptr) check_channel_vector(*b, d.out, op, "b");
  if (d.n == 0) return;
  activate();
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, d.out, d.n, d.in, &one, w.f32(), d.in,
                           x.f32(), d.in, &zero, y.f32(), d.out));
  if (b != nullptr) kernels::bias_add(y.f32(), b->f32(), d.n, d.out, 1, /*nhwc=*/true, stream_);
}

void CudaBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                  const Tensor* dx, const Tensor& dw, const Tensor* db) {
  const char* op = "linear_backward";
  const LinearDims d = check_linear(x, w, op);
  expect_f32(dy, op, "dy");
  expect_numel(dy, int64_t{d.n} * d.out, op, "dy");
  if (dx != nullptr) {
    expect_f32(*dx, op, "dx");
    expect_numel(*dx, int64_t{d.n} * d.in, op, "dx");
  }
  expect_f32(dw, op, "dw");
  expect_numel(dw, int64_t{d.out} * d.in, op, "dw");
  if (db != nullptr) check_channel_vector(*db, d.out, op, "db");
  activate();
  if (d.n == 0) {  // sums over no examples
    kernels::fill_f32(dw.f32(), dw.numel(), 0.0f, stream_);
    if (db != nullptr) kernels::fill_f32(db->f32(), d.out, 0.0f, stream_);
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  if (dx != nullptr) {
    // dx^T (IN, N) = w^T (IN, OUT) dy^T (OUT, N)
    CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, d.in, d.n, d.out, &one, w.f32(),
                             d.in, dy.f32(), d.out, &zero, dx->f32(), d.in));
  }
  // dw^T (IN, OUT) = x^T (IN, N) dy (N, OUT)
  CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, d.in, d.out, d.n, &one, x.f32(), d.in,
                           dy.f32(), d.out, &zero, dw.f32(), d.in));
  if (db != nullptr) {
    kernels::channel_sum(dy.f32(), db->f32(), d.n, d.out, 1, /*nhwc=*/true, nullptr, stream_);
  }
}

}  // namespace dp::cuda
