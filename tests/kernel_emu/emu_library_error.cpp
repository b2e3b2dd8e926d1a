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

// The kernel emulator has no stream capture: never a capture verdict.
void throw_cuda_error(const char* statement, const char* file, int line, int /*status*/,
                      const char* text) {
  throw_library_error("CUDA", statement, file, line, text);
}

void warn_library_error(const char* library, const char* statement, const char* file, int line,
                        const std::string& what) noexcept {
  std::fprintf(stderr, "dprun: warning: %s error in `%s`: %s (%s:%d)\n", library, statement,
               what.c_str(), file, line);
}

}  // namespace dp::cuda_emu
