// core/src/cuda/cuda_entry.hpp  (internal; implemented by the CUDA engineer in core/src/cuda/)
#pragma once
#include <memory>
#include <string>

#include "dp/backend.hpp"
namespace dp::cuda {
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
int device_count() noexcept;  // 0 on any error
std::string device_name(int index);
CudaVersions versions() noexcept;
}  // namespace dp::cuda
