// Creating backends by kind, and what this build knows about CUDA. The CUDA side is reached only
// through cuda/cuda_entry.hpp, compiled in when DPRUN_WITH_CUDA is defined, so a CPU-only build
// needs neither nvcc nor the CUDA libraries.
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/backend.hpp"
#include "dp/error.hpp"
#ifdef DPRUN_WITH_CUDA
#include "cuda/cuda_entry.hpp"
#endif

namespace dp {

namespace {
constexpr const char* kNoCuda =
    "dprun was built without CUDA: rebuild with the CUDA toolkit installed (nvcc found by "
    "CMake), or use the cpu backend";
}  // namespace

std::string ConvGeometry::str() const {
  auto pair = [](int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); };
  return "conv " + std::to_string(in_channels) + "->" + std::to_string(out_channels) + " kernel " +
         pair(kernel_h, kernel_w) + " stride " + pair(stride_h, stride_w) + " pad " +
         pair(pad_h, pad_w) + " on (" + std::to_string(max_batch) + ", " +
         std::to_string(in_channels) + ", " + std::to_string(in_h) + ", " + std::to_string(in_w) +
         ") -> (" + std::to_string(out_channels) + ", " + std::to_string(out_h()) + ", " +
         std::to_string(out_w()) + ") " + layout_name(layout) + " " + dtype_name(dtype);
}

const char* backend_kind_name(BackendKind k) {
  switch (k) {
    case BackendKind::cpu:
      return "cpu";
    case BackendKind::cuda:
      return "cuda";
  }
  return "?";
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
  }
  return "?";
}

const char* conv_choice_name(ConvChoice c) {
  switch (c) {
    case ConvChoice::automatic:
      return "automatic";
    case ConvChoice::measured:
      return "measured";
    case ConvChoice::heuristic:
      return "heuristic";
  }
  return "?";
}

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = {"fp32", "bf16"};
  return names;
}

Precision parse_precision(const std::string& name) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    if (name == precision_name(p)) return p;
  DP_THROW("precision \"" + name + "\": the known precisions are fp32, bf16");
}

std::unique_ptr<Backend> create_backend(const BackendOptions& options) {
  switch (options.kind) {
    case BackendKind::cpu:
      return cpu::make_backend(options);
    case BackendKind::cuda:
#ifdef DPRUN_WITH_CUDA
      return cuda::make_backend(options);
#else
      DP_THROW(kNoCuda);
#endif
  }
  DP_THROW("unknown backend kind " + std::to_string(static_cast<int>(options.kind)) +
           "; the known kinds are cpu and cuda");
}

bool cuda_compiled() {
#ifdef DPRUN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef DPRUN_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

CudaVersions cuda_versions() {
#ifdef DPRUN_WITH_CUDA
  return cuda::versions();
#else
  return {};
#endif
}

void cuda_profiler_start() {
#ifdef DPRUN_WITH_CUDA
  cuda::profiler(true);
#endif
}

void cuda_profiler_stop() {
#ifdef DPRUN_WITH_CUDA
  cuda::profiler(false);
#endif
}

std::string cuda_device_name(int index) {
#ifdef DPRUN_WITH_CUDA
  return cuda::device_name(index);
#else
  DP_THROW(std::string(kNoCuda) + " (asked for the name of CUDA device " + std::to_string(index) +
           ")");
#endif
}

}  // namespace dp
