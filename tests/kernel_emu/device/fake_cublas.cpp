// The emulated GPU's cuBLAS: the handle calls and the GEMMs dprun's linear layers make (fp32,
// and bf16 inputs with fp32 output; column-major, either operand transposed, alpha and beta),
// against the real cublas_v2.h.
// A plain loop with double accumulation: the linear layers' shapes are small.
#include <cublas_v2.h>

#include <cstdint>
#include <cstring>

#include "device/fake_device.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  *value = type == MAJOR_VERSION ? 13 : type == MINOR_VERSION ? 1 : 0;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
                                         : "CUBLAS_STATUS_NOT_SUPPORTED (emulated GPU)";
}

namespace {

/// Element i of a matrix of fp32 or packed bf16 (widened exactly).
float element(const void* p, long i, bool bf16) {
  if (!bf16) return static_cast<const float*>(p)[i];
  const uint32_t wide = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
  float v = 0;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

/// C (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C, all column-major, C fp32.
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, float alpha, const void* a, bool a16, int lda, const void* b, bool b16,
                    int ldb, float beta, float* c, int ldc) {
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
      m < 0 || n < 0 || k < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  dp_emu::device::submit_library_work(
      handle->stream, a16 || b16 ? "cublasGemmEx (bf16)" : "cublasGemmEx", [=] {
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < m; ++i) {
            double s = 0;
            for (int p = 0; p < k; ++p) {
              const float av = element(a,
                                       ta == CUBLAS_OP_N ? i + static_cast<long>(p) * lda
                                                         : p + static_cast<long>(i) * lda,
                                       a16);
              const float bv = element(b,
                                       tb == CUBLAS_OP_N ? p + static_cast<long>(j) * ldb
                                                         : j + static_cast<long>(p) * ldb,
                                       b16);
              s += static_cast<double>(av) * bv;
            }
            float& out = c[i + static_cast<long>(j) * ldc];
            const auto v = static_cast<float>(alpha * s);
            out = beta == 0.0f ? v : v + beta * out;
          }
      });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, const float* alpha, const float* a, int lda,
                              const float* b, int ldb, const float* beta, float* c, int ldc) {
  return gemm(handle, ta, tb, m, n, k, *alpha, a, false, lda, b, false, ldb, *beta, c, ldc);
}

/// The mixed-precision GEMM of precision bf16's linear layers: A and B fp32 or bf16 alike, C
/// fp32, fp32 compute (the fake sums in double: the products of bf16 values are exact either way).
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void* alpha, const void* a,
                            cudaDataType a_type, int lda, const void* b, cudaDataType b_type,
                            int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  const auto ok = [](cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; };
  if (!ok(a_type) || a_type != b_type || c_type != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(handle, ta, tb, m, n, k, *static_cast<const float*>(alpha), a, a_type == CUDA_R_16BF,
              lda, b, b_type == CUDA_R_16BF, ldb, *static_cast<const float*>(beta),
              static_cast<float*>(c), ldc);
}

}  // extern "C"
