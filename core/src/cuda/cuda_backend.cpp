// CudaBackend: construction, memory, elementwise ops, pooling, loss, optimizer, data, and the
// entry points the backend factory calls (cuda_entry.hpp).
#include "cuda/cuda_backend.hpp"

#include <cstdio>
#include <cstdlib>

#include "cuda/cuda_entry.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/error.hpp"

namespace dp::cuda {

// ---- errors and checks --------------------------------------------------------------------------

void throw_library_error(const char* library, const char* statement, const char* file, int line,
                         const std::string& what) {
  throw_error(file, line, std::string(library) + " error in `" + statement + "`: " + what);
}

void warn_library_error(const char* library, const char* statement, const char* file, int line,
                        const std::string& what) noexcept {
  std::fprintf(stderr, "dprun: warning: %s error in `%s`: %s (%s:%d)\n", library, statement,
               what.c_str(), file, line);
}

void fail(const char* op, const std::string& message) {
  throw Error(std::string("cuda backend: ") + op + ": " + message);
}

void expect_f32(const Tensor& t, const char* op, const char* what) {
  if (t.dtype != DType::f32) {
    fail(op, std::string(what) + " has dtype " + dtype_name(t.dtype) + ", expected f32");
  }
  if (t.data == nullptr) fail(op, std::string(what) + " has no data (null pointer)");
}

void expect_numel(const Tensor& t, int64_t numel, const char* op, const char* what) {
  if (t.numel() != numel) {
    fail(op, std::string(what) + " has shape " + t.shape.str() + " (" + std::to_string(t.numel()) +
                 " elements), expected " + std::to_string(numel) + " elements");
  }
}

void expect_same_layout(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape.rank == 4 && b.shape.rank == 4 && a.layout != b.layout) {
    fail(op, std::string("input layout ") + layout_name(a.layout) + " and output layout " +
                 layout_name(b.layout) + " differ; convert explicitly");
  }
}

Dims activation_dims(const Tensor& t, const char* op, const char* what, bool allow_rank2) {
  expect_f32(t, op, what);
  if (t.shape.rank == 4) return {t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
  if (allow_rank2 && t.shape.rank == 2) return {t.shape[0], t.shape[1], 1, 1};
  fail(op, std::string(what) + " has shape " + t.shape.str() + ", expected (N, C, H, W)" +
               (allow_rank2 ? " or (N, C)" : ""));
}

namespace {

bool is_nhwc(const Tensor& t) { return t.shape.rank == 4 && t.layout == Layout::nhwc; }

void expect_dtype(const Tensor& t, DType dtype, const char* op, const char* what) {
  if (t.dtype != dtype) {
    fail(op, std::string(what) + " has dtype " + dtype_name(t.dtype) + ", expected " +
                 dtype_name(dtype));
  }
  if (t.data == nullptr) fail(op, std::string(what) + " has no data (null pointer)");
}

void expect_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                       const char* what_b) {
  if (a.shape != b.shape) {
    fail(op, std::string(what_a) + " has shape " + a.shape.str() + " but " + what_b + " has " +
                 b.shape.str());
  }
  expect_same_layout(a, b, op);
}

kernels::PoolShape pool_shape(const PoolGeometry& g, const Dims& x, const char* op) {
  if (g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 ||
      g.pad_w < 0 || 2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w) {
    fail(op, "bad pooling window (kernel >= 1, stride >= 1, 0 <= pad <= kernel / 2)");
  }
  const int64_t p = g.out_h(x.h), q = g.out_w(x.w);
  // Not just p, q >= 1: C++ division truncates, so H + 2*pad - kernel in (-stride, 0) gives
  // P = 1 with a window that overhangs the padded input (the CPU backend and PyTorch refuse it).
  if (x.h + 2 * g.pad_h < g.kernel_h || x.w + 2 * g.pad_w < g.kernel_w || p < 1 || q < 1) {
    fail(op, "input " + std::to_string(x.h) + "x" + std::to_string(x.w) +
                 " is smaller than the pooling window");
  }
  return {x.n,        x.c,        x.h,        x.w,     p,       q,    g.kernel_h,
          g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w, false};
}

/// Checks a pooling pair: `in` (N,C,H,W) and `out` (N,C,P,Q) of the same layout.
kernels::PoolShape check_pool(const PoolGeometry& g, const Tensor& in, const Tensor& out,
                              const char* op, const char* in_name, const char* out_name) {
  const Dims x = activation_dims(in, op, in_name);
  const Dims y = activation_dims(out, op, out_name);
  kernels::PoolShape s = pool_shape(g, x, op);
  if (y.n != x.n || y.c != x.c || y.h != s.p || y.w != s.q) {
    fail(op, std::string(out_name) + " has shape " + out.shape.str() + ", expected (" +
                 std::to_string(x.n) + ", " + std::to_string(x.c) + ", " + std::to_string(s.p) +
                 ", " + std::to_string(s.q) + ")");
  }
  expect_same_layout(in, out, op);
  s.nhwc = is_nhwc(in);
  return s;
}

/// cuBLAS's workspace, handed over explicitly so cuBLAS never allocates behind our back.
constexpr size_t kCublasWorkspaceBytes = size_t{8} << 20;

}  // namespace

// ---- construction ------------------------------------------------------------------------------

CudaBackend::CudaBackend(const BackendOptions& options)
    : device_(options.device_index), allow_tf32_(options.allow_tf32) {
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
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDNN_CHECK(cudnnCreate(&cudnn_));
    CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    CUBLAS_CHECK(
        cublasSetWorkspace(cublas_, allocate(kCublasWorkspaceBytes), kCublasWorkspaceBytes));
    // Exact fp32 unless TF32 is allowed (CUBLAS_DEFAULT_MATH never uses tensor cores for fp32).
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

void* CudaBackend::allocate(size_t bytes) {
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

void CudaBackend::upload(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  activate();
  // On our stream, so the copy is ordered after queued work that may still use dst.
  CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  activate();
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  activate();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(const Tensor& t, float value) {
  if (t.numel() == 0) return;  // as the CPU backend: an empty tensor may have no memory
  activate();
  if (t.data == nullptr) fail("fill", "tensor has no data (null pointer)");
  if (t.dtype == DType::f32) {
    kernels::fill_f32(t.f32(), t.numel(), value, stream_);
  } else if (t.dtype == DType::i32) {
    kernels::fill_i32(t.i32(), t.numel(), static_cast<int32_t>(value), stream_);
  } else {
    fail("fill", std::string("dtype ") + dtype_name(t.dtype) + " is not supported (f32 or i32)");
  }
}

void CudaBackend::synchronize() {
  activate();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- activation and elementwise -----------------------------------------------------------------

void CudaBackend::relu_forward(const Tensor& x, const Tensor& y) {
  expect_f32(x, "relu_forward", "x");
  expect_f32(y, "relu_forward", "y");
  expect_same_shape(x, y, "relu_forward", "x", "y");
  activate();
  kernels::relu_forward(x.f32(), y.f32(), x.numel(), stream_);
}

void CudaBackend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  expect_f32(y, "relu_backward", "y");
  expect_f32(dy, "relu_backward", "dy");
  expect_f32(dx, "relu_backward", "dx");
  expect_same_shape(y, dy, "relu_backward", "y", "dy");
  expect_same_shape(dy, dx, "relu_backward", "dy", "dx");
  activate();
  kernels::relu_backward(y.f32(), dy.f32(), dx.f32(), y.numel(), stream_);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  expect_f32(a, "add", "a");
  expect_f32(b, "add", "b");
  expect_f32(y, "add", "y");
  expect_same_shape(a, b, "add", "a", "b");
  expect_same_shape(a, y, "add", "a", "y");
  activate();
  kernels::add(a.f32(), b.f32(), y.f32(), a.numel(), stream_);
}

void CudaBackend::scale(const Tensor& t, float alpha) {
  expect_f32(t, "scale", "t");
  activate();
  kernels::scale(t.f32(), t.numel(), alpha, stream_);
}

// ---- pooling ------------------------------------------------------------------------------------

void CudaBackend::avgpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  const kernels::PoolShape s = check_pool(g, x, y, "avgpool_forward", "x", "y");
  activate();
  kernels::avgpool_forward(s, x.f32(), y.f32(), stream_);
}

void CudaBackend::avgpool_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) {
  const kernels::PoolShape s = check_pool(g, dx, dy, "avgpool_backward", "dx", "dy");
  activate();
  kernels::avgpool_backward(s, dy.f32(), dx.f32(), stream_);
}

void CudaBackend::maxpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  const kernels::PoolShape s = check_pool(g, x, y, "maxpool_forward", "x", "y");
  activate();
  kernels::maxpool_forward(s, x.f32(), y.f32(), stream_);
}

void CudaBackend::maxpool_backward(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                                   const Tensor& dy, const Tensor& dx) {
  const kernels::PoolShape s = check_pool(g, x, dy, "maxpool_backward", "x", "dy");
  expect_same_shape(x, dx, "maxpool_backward", "x", "dx");
  // y is not needed: each window's winner is recomputed from x with the forward's tie rule.
  activate();
  kernels::maxpool_backward(s, x.f32(), dy.f32(), dx.f32(), stream_);
}

void CudaBackend::global_avgpool_forward(const Tensor& x, const Tensor& y) {
  const Dims d = activation_dims(x, "global_avgpool_forward", "x");
  expect_f32(y, "global_avgpool_forward", "y");
  expect_numel(y, d.n * d.c, "global_avgpool_forward", "y");
  if (y.shape.rank != 2 && y.shape.rank != 4) {
    fail("global_avgpool_forward", "y has shape " + y.shape.str() + ", expected (N, C, 1, 1)");
  }
  activate();
  kernels::global_avgpool_forward(x.f32(), y.f32(), d.n, d.c, d.hw(), is_nhwc(x), stream_);
}

void CudaBackend::global_avgpool_backward(const Tensor& dy, const Tensor& dx) {
  const Dims d = activation_dims(dx, "global_avgpool_backward", "dx");
  expect_f32(dy, "global_avgpool_backward", "dy");
  expect_numel(dy, d.n * d.c, "global_avgpool_backward", "dy");
  activate();
  kernels::global_avgpool_backward(dy.f32(), dx.f32(), d.n, d.c, d.hw(), is_nhwc(dx), stream_);
}

// ---- loss and metrics ---------------------------------------------------------------------------

namespace {
void check_logits(const Tensor& logits, const Tensor& labels, const Tensor& correct,
                  const char* op) {
  expect_f32(logits, op, "logits");
  if (logits.shape.rank != 2 || logits.shape[1] < 1)
    fail(op, "logits has shape " + logits.shape.str() + ", expected (N, K) with K >= 1");
  expect_dtype(labels, DType::i32, op, "labels");
  expect_numel(labels, logits.shape[0], op, "labels");
  expect_dtype(correct, DType::i32, op, "correct");
  expect_numel(correct, 1, op, "correct");
}
}  // namespace

void CudaBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                                        float grad_scale, const Tensor& dlogits,
                                        const Tensor& loss_sum, const Tensor& correct) {
  const char* op = "softmax_cross_entropy";
  check_logits(logits, labels, correct, op);
  expect_f32(dlogits, op, "dlogits");
  expect_same_shape(logits, dlogits, op, "logits", "dlogits");
  expect_f32(loss_sum, op, "loss_sum");
  expect_numel(loss_sum, 1, op, "loss_sum");
  activate();
  kernels::softmax_cross_entropy(logits.f32(), labels.i32(), logits.shape[0], logits.shape[1],
                                 grad_scale, dlogits.f32(), loss_sum.f32(), correct.i32(), stream_);
}

void CudaBackend::count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct) {
  check_logits(logits, labels, correct, "count_correct");
  activate();
  kernels::softmax_cross_entropy(logits.f32(), labels.i32(), logits.shape[0], logits.shape[1], 0.0f,
                                 nullptr, nullptr, correct.i32(), stream_);
}

// ---- optimizer ----------------------------------------------------------------------------------

void CudaBackend::sgd_update(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                             const SgdParams& p) {
  expect_f32(params, "sgd_update", "params");
  expect_f32(grads, "sgd_update", "grads");
  expect_numel(grads, params.numel(), "sgd_update", "grads");
  float* buf = nullptr;
  if (p.momentum != 0.0f) {
    if (momentum_buf == nullptr) fail("sgd_update", "momentum is set but no momentum buffer given");
    expect_f32(*momentum_buf, "sgd_update", "momentum_buf");
    expect_numel(*momentum_buf, params.numel(), "sgd_update", "momentum_buf");
    buf = momentum_buf->f32();
  }
  activate();
  kernels::sgd_update(params.f32(), grads.f32(), buf, params.numel(), p.lr, p.momentum,
                      p.weight_decay, stream_);
}

// ---- data ---------------------------------------------------------------------------------------

void CudaBackend::gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices,
                               const Tensor& x, const Tensor& y) {
  const char* op = "gather_batch";
  expect_dtype(images, DType::u8, op, "images");
  if (images.shape.rank != 4)
    fail(op, "images has shape " + images.shape.str() + ", expected (M, C, H, W)");
  expect_dtype(labels, DType::u8, op, "labels");
  expect_numel(labels, images.shape[0], op, "labels");
  expect_dtype(indices, DType::i32, op, "indices");
  const Dims d = activation_dims(x, op, "x");
  if (d.n != indices.numel() || d.c != images.shape[1] || d.h != images.shape[2] ||
      d.w != images.shape[3]) {
    fail(op, "x has shape " + x.shape.str() + ", expected (" + std::to_string(indices.numel()) +
                 ", " + std::to_string(images.shape[1]) + ", " + std::to_string(images.shape[2]) +
                 ", " + std::to_string(images.shape[3]) + ")");
  }
  expect_dtype(y, DType::i32, op, "y");
  expect_numel(y, d.n, op, "y");
  activate();
  kernels::gather_batch(images.u8(), labels.u8(), images.shape[0], indices.i32(), d.n, d.c, d.h,
                        d.w, is_nhwc(x), x.f32(), y.i32(), stream_);
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
