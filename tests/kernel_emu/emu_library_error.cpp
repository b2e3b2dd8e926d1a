// The error reporting the emulated kernel launchers call (core/src/cuda/cuda_check.hpp, rewritten
// into dp::cuda_emu): the same words as the CUDA backend's (cuda_backend.cpp).
#include <cstdio>
#include <string>

#include "cuda/cuda_check.hpp"
#include "dp/error.hpp"

namespace dp::cuda_emu {

void throw_library_error(const char* library, const char* statement, const char* file, int line,
                         const std::string& what) {
  throw_error(file, line, std::string(library) + " error in `" + statement + "`: " + what);
}

// The kernel emulator has no stream capture (its cudaError_t has no capture verdicts).
bool is_capture_error(cudaError_t) noexcept { return false; }

void throw_cuda_error(const char* statement, const char* file, int line, cudaError_t status) {
  throw_library_error("CUDA", statement, file, line, cudaGetErrorString(status));
}

void warn_library_error(const char* library, const char* statement, const char* file, int line,
                        const std::string& what) noexcept {
  std::fprintf(stderr, "dprun: warning: %s error in `%s`: %s (%s:%d)\n", library, statement,
               what.c_str(), file, line);
}

}  // namespace dp::cuda_emu
