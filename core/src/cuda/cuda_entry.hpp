// core/src/cuda/cuda_entry.hpp  (internal; implemented by the CUDA engineer in core/src/cuda/)
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/conv_contract.hpp"
namespace dp::cuda {
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
int device_count() noexcept;  // 0 on any error
std::string device_name(int index);
CudaVersions versions() noexcept;
void profiler(bool start);  // cudaProfilerStart / cudaProfilerStop
// dp/conv_contract.hpp's introspection (cuda_conv.cpp): refused for a backend that is not CUDA.
std::vector<ConvAlgorithm> conv_algorithms(Backend& backend, ConvPlan& plan, ConvDirection d,
                                           int64_t batch);
ConvAlgorithm conv_choice(Backend& backend, ConvPlan& plan, ConvDirection d, int64_t batch);
void use_conv_algorithm(Backend& backend, ConvPlan& plan, const ConvAlgorithm& a);
ConvChoiceKey conv_choice_key(Backend& backend, ConvPlan& plan, ConvDirection d, int64_t batch);
}  // namespace dp::cuda
