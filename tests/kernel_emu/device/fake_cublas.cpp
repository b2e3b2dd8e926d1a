// The emulated GPU's cuBLAS: the handle calls and the single-precision GEMM dprun's linear layers
// make (column-major, either operand transposed, alpha and beta), against the real cublas_v2.h.
// A plain loop with double accumulation: the linear layers' shapes are small.
#include <cublas_v2.h>

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

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, const float* alpha, const float* a, int lda,
                              const float* b, int ldb, const float* beta, float* c, int ldc) {
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
      m < 0 || n < 0 || k < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *alpha, be = *beta;
  dp_emu::device::submit_library_work(handle->stream, [=] {
    // C (m x n) = alpha op(A) (m x k) op(B) (k x n) + beta C, all column-major.
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        double s = 0;
        for (int p = 0; p < k; ++p) {
          const float av = ta == CUBLAS_OP_N ? a[i + static_cast<long>(p) * lda]
                                             : a[p + static_cast<long>(i) * lda];
          const float bv = tb == CUBLAS_OP_N ? b[p + static_cast<long>(j) * ldb]
                                             : b[j + static_cast<long>(p) * ldb];
          s += static_cast<double>(av) * bv;
        }
        float& out = c[i + static_cast<long>(j) * ldc];
        const auto v = static_cast<float>(al * s);
        out = be == 0.0f ? v : v + be * out;
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
