#pragma once
// Checking macros for cuDNN, cuBLAS and NCCL (see cuda_check.hpp for the runtime's).
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "cuda/cuda_check.hpp"

#define CUDNN_CHECK(statement)                                                 \
  do {                                                                         \
    const cudnnStatus_t dp_cudnn_status_ = (statement);                        \
    if (dp_cudnn_status_ != CUDNN_STATUS_SUCCESS)                              \
      ::dp::cuda::throw_library_error("cuDNN", #statement, __FILE__, __LINE__, \
                                      cudnnGetErrorString(dp_cudnn_status_));  \
  } while (0)

#define CUDNN_WARN(statement)                                                 \
  do {                                                                        \
    const cudnnStatus_t dp_cudnn_status_ = (statement);                       \
    if (dp_cudnn_status_ != CUDNN_STATUS_SUCCESS)                             \
      ::dp::cuda::warn_library_error("cuDNN", #statement, __FILE__, __LINE__, \
                                     cudnnGetErrorString(dp_cudnn_status_));  \
  } while (0)

#define CUBLAS_CHECK(statement)                                                  \
  do {                                                                           \
    const cublasStatus_t dp_cublas_status_ = (statement);                        \
    if (dp_cublas_status_ != CUBLAS_STATUS_SUCCESS)                              \
      ::dp::cuda::throw_library_error("cuBLAS", #statement, __FILE__, __LINE__,  \
                                      cublasGetStatusString(dp_cublas_status_)); \
  } while (0)

#define CUBLAS_WARN(statement)                                                  \
  do {                                                                          \
    const cublasStatus_t dp_cublas_status_ = (statement);                       \
    if (dp_cublas_status_ != CUBLAS_STATUS_SUCCESS)                             \
      ::dp::cuda::warn_library_error("cuBLAS", #statement, __FILE__, __LINE__,  \
                                     cublasGetStatusString(dp_cublas_status_)); \
  } while (0)

// ncclInProgress is not an error for non-blocking communicators: the caller polls
// ncclCommGetAsyncError until the operation is enqueued.
#define NCCL_CHECK(statement)                                                                   \
  do {                                                                                          \
    const ncclResult_t dp_nccl_status_ = (statement);                                           \
    if (dp_nccl_status_ != ncclSuccess && dp_nccl_status_ != ncclInProgress)                    \
      ::dp::cuda::throw_library_error("NCCL", #statement, __FILE__, __LINE__,                   \
                                      std::string(ncclGetErrorString(dp_nccl_status_)) + " (" + \
                                          ncclGetLastError(nullptr) + ")");                     \
  } while (0)

#define NCCL_WARN(statement)                                                 \
  do {                                                                       \
    const ncclResult_t dp_nccl_status_ = (statement);                        \
    if (dp_nccl_status_ != ncclSuccess && dp_nccl_status_ != ncclInProgress) \
      ::dp::cuda::warn_library_error("NCCL", #statement, __FILE__, __LINE__, \
                                     ncclGetErrorString(dp_nccl_status_));   \
  } while (0)
