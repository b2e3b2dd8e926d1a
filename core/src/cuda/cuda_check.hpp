#pragma once
// Checking macros for the CUDA runtime and for kernel launches. Every failing call becomes a
// dp::Error carrying the statement, file:line and the library's own error string; the *_WARN
// variants print instead of throwing, for destructors. The cuDNN, cuBLAS and NCCL macros live in
// lib_check.hpp so kernel files need not include those libraries.
#include <cuda_runtime_api.h>

#include <string>

#include "dp/error.hpp"

namespace dp::cuda {

/// An error cuDNN reported: what a convolution plan for bf16 data falls back from (plan_conv_impl).
/// Also thrown when cuDNN offers no algorithm for a convolution within the limits.
class CudnnError : public Error {
 public:
  using Error::Error;
};

/// Throws dp::Error (CudnnError for cuDNN): "<library> error in `<statement>`: <what>
/// (file:line)".
[[noreturn]] void throw_library_error(const char* library, const char* statement, const char* file,
                                      int line, const std::string& what);
/// Whether a CUDA status is the runtime's verdict on what a stream did while it was being
/// captured (cudaErrorStreamCapture*, cudaErrorCapturedEvent): the step cannot be captured.
bool is_capture_error(cudaError_t status) noexcept;
/// CUDA_CHECK's throw: dp::CaptureRefused for a capture verdict (is_capture_error), so that
/// graphs = "auto" runs such a step without graphs; dp::Error otherwise. The status travels as an
/// int, with its text: the emulated GPU's kernels are compiled against another cudaError_t, whose
/// mangled name would not match this definition's.
[[noreturn]] void throw_cuda_error(const char* statement, const char* file, int line, int status,
                                   const char* text);
/// Prints the same message to stderr as a warning (never throws).
void warn_library_error(const char* library, const char* statement, const char* file, int line,
                        const std::string& what) noexcept;

}  // namespace dp::cuda

#define CUDA_CHECK(statement)                                            \
  do {                                                                   \
    const cudaError_t dp_cuda_status_ = (statement);                     \
    if (dp_cuda_status_ != cudaSuccess)                                  \
      ::dp::cuda::throw_cuda_error(#statement, __FILE__, __LINE__,       \
                                   static_cast<int>(dp_cuda_status_),    \
                                   cudaGetErrorString(dp_cuda_status_)); \
  } while (0)

#define CUDA_WARN(statement)                                                 \
  do {                                                                       \
    const cudaError_t dp_cuda_status_ = (statement);                         \
    if (dp_cuda_status_ != cudaSuccess)                                      \
      ::dp::cuda::warn_library_error("CUDA", #statement, __FILE__, __LINE__, \
                                     cudaGetErrorString(dp_cuda_status_));   \
  } while (0)

/// After every kernel launch: a bad launch configuration surfaces here, at the launch site.
#define CUDA_CHECK_LAUNCH(kernel_name) CUDA_CHECK(cudaGetLastError())
