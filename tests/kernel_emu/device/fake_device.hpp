#pragma once
// Shared by the emulated GPU's fake libraries (fake_cudart.cpp, fake_cudnn.cpp, fake_cublas.cpp,
// fake_nccl.cpp), compiled against the real CUDA headers.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "emu_stream.hpp"

namespace dp_emu::device {

/// Every emulated GPU's memory: what cudaMemGetInfo reports and cudaMalloc allows in all.
constexpr size_t kMemoryBytes = size_t{16} << 30;

/// DPRUN_EMULATED_GPUS, else 2: enough for the tests of k replicas on k GPUs.
int device_count();

/// A library call's work on `stream`: run now, or recorded while the stream is captured; counted
/// by `name` in the launch census when it runs (dp_emu::count_work).
void submit_library_work(cudaStream_t stream, const std::string& name, Work work);

}  // namespace dp_emu::device
