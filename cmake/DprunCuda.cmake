# Decides whether the CUDA backend is built, and says why in the configure output: what was
# looked for, where, what was found, and how to change it. Without nvcc (or cuDNN, cuBLAS, NCCL)
# dprun builds and runs on its CPU backend.
include(CheckLanguage)
set(DPRUN_WITH_CUDA OFF)
set(DPRUN_CUDA_REASON "")
if(DPRUN_CUDA STREQUAL "OFF")
  set(DPRUN_CUDA_REASON "DPRUN_CUDA=OFF was given")
else()
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    string(CONCAT DPRUN_CUDA_REASON
        "no CUDA compiler: looked for nvcc at /usr/local/cuda/bin/nvcc and on PATH; install the "
        "CUDA toolkit there, or pass -DCMAKE_CUDA_COMPILER=/path/to/nvcc")
  else()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Never "native": the build machines have no GPU to detect.
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 flag for nvcc ("CUDA20 dialect not supported"); the kernels
    # (.cu files) need only C++17, the host side of the backend is C++20 as everywhere else.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit)
    find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    set(missing "")
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas)
      list(APPEND missing "the CUDA toolkit's libraries (cudart, cuBLAS)")
    endif()
    if(NOT CUDNN_LIBRARY OR NOT CUDNN_INCLUDE_DIR)
      list(APPEND missing "cuDNN (libcudnn and cudnn.h)")
    endif()
    if(NOT NCCL_LIBRARY)
      list(APPEND missing "NCCL (libnccl)")
    endif()
    if(missing)
      list(JOIN missing ", " missing_text)
      string(CONCAT DPRUN_CUDA_REASON
          "nvcc ${CMAKE_CUDA_COMPILER_VERSION} found at ${CMAKE_CUDA_COMPILER}, but not "
          "${missing_text} (looked in ${CUDAToolkit_LIBRARY_DIR} and the system's paths); install "
          "them beside the toolkit")
    else()
      set(DPRUN_WITH_CUDA ON)
      string(CONCAT DPRUN_CUDA_REASON
          "nvcc ${CMAKE_CUDA_COMPILER_VERSION} (${CMAKE_CUDA_COMPILER}), cuDNN ${CUDNN_LIBRARY}, "
          "NCCL ${NCCL_LIBRARY}, GPU architectures ${CMAKE_CUDA_ARCHITECTURES}")
    endif()
  endif()
  if(DPRUN_CUDA STREQUAL "ON" AND NOT DPRUN_WITH_CUDA)
    message(FATAL_ERROR "DPRUN_CUDA=ON but the CUDA backend cannot be built: ${DPRUN_CUDA_REASON}")
  endif()
endif()
