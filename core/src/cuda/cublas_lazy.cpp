// cuBLAS, loaded the first time dprun calls it, not when libdpcore is loaded.
//
// libcublas pulls in libcublasLt, whose load alone cost 361 ms of CPU and 25,000 page faults on
// the 2-core AMD EPYC build machine (a dlopen of it, perf stat), against 4 ms for libcudart and
// 7 ms for libcudnn (which loads its engines itself, on demand). Linked as a dependency of
// libdpcore, that was paid by every process that loads libdpcore: each `dprun` command
// (`--version`, `query`, `status`), each trial process on the CPU backend, each test. Only a
// CUDA backend's GEMMs and cuda_versions() need cuBLAS.
//
// So libdpcore does not link it: the cuBLAS functions dprun calls are defined here, with the
// headers' own declarations (extern "C": a signature that differs from cublas_api.h's fails to
// compile), each forwarding to the function of that name in DPRUN_CUBLAS_SONAME, which the first
// call loads (dlopen, RTLD_LOCAL; by its soname, else at the path the build found it at). This file
// is compiled with hidden visibility: libdpcore does not export these names, so it interposes on no
// other cuBLAS user in the process, and one that loaded the same library first shares it (dlopen
// returns the loaded object). When the library cannot be loaded, or lacks one of the functions,
// every call returns CUBLAS_STATUS_NOT_INITIALIZED and cublasGetStatusString says what failed,
// naming the file and the loader's reason: a CUDA backend then fails to start with that message
// (CUBLAS_CHECK).
//
// The emulated GPU (tests/kernel_emu) leaves this file out and links its fake cuBLAS instead.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#if !defined(DPRUN_CUBLAS_SONAME) || !defined(DPRUN_CUBLAS_BUILD_PATH)
#error \
    "DPRUN_CUBLAS_SONAME and DPRUN_CUBLAS_BUILD_PATH (the libcublas of the build's headers) are not defined"
#endif

namespace {

struct Cublas {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasGetProperty) get_property = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasSgemm_v2) sgemm = nullptr;
  // cublas_api.h overloads cublasGemmEx in C++ (a cudaDataType compute type): the C function's.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  std::string failure;  // why it could not be loaded; empty when it was
};

template <class F>
bool resolve(void* library, const char* name, F& function, std::string& failure) {
  function = reinterpret_cast<F>(dlsym(library, name));
  if (function == nullptr && failure.empty()) {
    failure = std::string(DPRUN_CUBLAS_SONAME) + " has no " + name + " (a cuBLAS older than the " +
              "headers dprun was built with?)";
  }
  return function != nullptr;
}

const Cublas& cublas() {
  static const Cublas loaded = [] {
    Cublas c;
    void* library = dlopen(DPRUN_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      const std::string by_name = why != nullptr ? why : "?";
      // Where the build found it (a toolkit whose cuBLAS is not beside its runtime).
      library = dlopen(DPRUN_CUBLAS_BUILD_PATH, RTLD_NOW | RTLD_LOCAL);
      if (library == nullptr) {
        why = dlerror();
        c.failure = "cuBLAS could not be loaded: " + by_name + "; " + (why != nullptr ? why : "?") +
                    " (dprun's CUDA backend loads " + DPRUN_CUBLAS_SONAME +
                    " when it starts; put the folder that holds it, the CUDA toolkit's lib or "
                    "the nvidia-cublas Python package's, on LD_LIBRARY_PATH)";
        return c;
      }
    }
    resolve(library, "cublasCreate_v2", c.create, c.failure);
    resolve(library, "cublasDestroy_v2", c.destroy, c.failure);
    resolve(library, "cublasSetStream_v2", c.set_stream, c.failure);
    resolve(library, "cublasSetWorkspace_v2", c.set_workspace, c.failure);
    resolve(library, "cublasSetMathMode", c.set_math_mode, c.failure);
    resolve(library, "cublasGetProperty", c.get_property, c.failure);
    resolve(library, "cublasGetStatusString", c.status_string, c.failure);
    resolve(library, "cublasSgemm_v2", c.sgemm, c.failure);
    resolve(library, "cublasGemmEx", c.gemm_ex, c.failure);
    return c;
  }();
  return loaded;
}

bool usable(const Cublas& c) { return c.failure.empty(); }

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  const Cublas& c = cublas();
  return usable(c) ? c.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  const Cublas& c = cublas();
  return usable(c) ? c.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  const Cublas& c = cublas();
  return usable(c) ? c.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  const Cublas& c = cublas();
  return usable(c) ? c.set_workspace(handle, workspace, bytes) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  const Cublas& c = cublas();
  return usable(c) ? c.set_math_mode(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  const Cublas& c = cublas();
  return usable(c) ? c.get_property(type, value) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  const Cublas& c = cublas();
  return usable(c) ? c.status_string(status) : c.failure.c_str();
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
  const Cublas& c = cublas();
  return usable(c) ? c.sgemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  const Cublas& c = cublas();
  return usable(c) ? c.gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,
                               beta, C, Ctype, ldc, computeType, algo)
                   : CUBLAS_STATUS_NOT_INITIALIZED;
}

}  // extern "C"
