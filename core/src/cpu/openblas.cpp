// Loading OpenBLAS with its kernel core chosen from cpuid features (see openblas.hpp for why).
#include "cpu/openblas.hpp"

#include <dlfcn.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpu/cpu_kernels.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

// The core whose kernels fit this CPU's instruction sets, among those OpenBLAS 0.3.21 has; empty
// for CPUs without AVX2, which its model table has known for a decade: there we let it choose.
std::string core_for(const CpuFeatures& f) {
  if (f.avx512 && f.avx512_bf16) return "Cooperlake";
  if (f.avx512) return "SkylakeX";
  if (f.avx2_fma) return "Haswell";
  return "";
}

// OpenBLAS's x86-64 cores whose SGEMM uses neither AVX2 nor AVX-512: on a CPU with AVX2 these
// are its fall-backs, not a choice (a list of the old ones, so a core added later is not
// flagged).
bool pre_avx2_core(const std::string& core) {
  static constexpr std::array<const char*, 19> kOld = {
      "Katmai",     "Coppermine",   "Northwood",   "Prescott",   "Banias",
      "Atom",       "Core2",        "Penryn",      "Dunnington", "Nehalem",
      "Opteron",    "Opteron_SSE3", "Barcelona",   "Bobcat",     "Bulldozer",
      "Piledriver", "Steamroller",  "Sandybridge", "Nano"};
  for (const char* old : kOld)
    if (core == old) return true;
  return false;
}

template <typename F>
F symbol(void* handle, const char* name) {
  void* p = dlsym(handle, name);
  if (p == nullptr) {
    DP_THROW(std::string("cpu backend: the OpenBLAS library loaded from ") + DPRUN_OPENBLAS_SONAME +
             " has no symbol " + name + "; install Debian's libopenblas0 (scripts/install-deps)");
  }
  return reinterpret_cast<F>(p);
}

OpenBlas load() {
  const CpuFeatures features = cpu_features();
  // RTLD_NOLOAD: is it in the process already (then its core is chosen and cannot change)?
  void* handle = dlopen(DPRUN_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  const bool loaded_before = handle != nullptr;
  const char* user_core = std::getenv("OPENBLAS_CORETYPE");
  const bool user_chose = user_core != nullptr && *user_core != '\0';
  std::string chosen;
  if (!loaded_before) {
    if (!user_chose) chosen = core_for(features);
    // setenv/unsetenv are not safe against other threads reading the environment at the same
    // moment; this runs once, when the first backend with the BLAS kernels is created.
    if (!chosen.empty()) setenv("OPENBLAS_CORETYPE", chosen.c_str(), 1);
    handle = dlopen(DPRUN_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    // The library CMake found, for installs outside the loader's search path.
    if (handle == nullptr) handle = dlopen(DPRUN_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    // The process environment stays as the user gave it (child processes choose for
    // themselves).
    if (!chosen.empty()) unsetenv("OPENBLAS_CORETYPE");
  }
  if (handle == nullptr) {
    const char* why = dlerror();
    DP_THROW(std::string("cpu backend: cannot load OpenBLAS (") + (why ? why : "not found") +
             "); install Debian's libopenblas0 (scripts/install-deps), or use the oneDNN "
             "kernels (DPRUN_CPU_KERNELS=onednn)");
  }
  OpenBlas o;
  o.sgemm = symbol<decltype(&cblas_sgemm)>(handle, "cblas_sgemm");
  const auto corename = symbol<char* (*)()>(handle, "openblas_get_corename");
  const auto config = symbol<char* (*)()>(handle, "openblas_get_config");
  const auto set_threads = symbol<void (*)(int)>(handle, "openblas_set_num_threads");
  o.core = corename();
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the second word.
  const std::string cfg = config();
  const size_t begin = cfg.find(' ');
  o.version = begin == std::string::npos
                  ? "?"
                  : cfg.substr(begin + 1, cfg.find(' ', begin + 1) - begin - 1);
  // The backend parallelises over images and rows itself (OpenMP, its threads per replica), so
  // every SGEMM must run on its calling thread: a multi-threaded BLAS inside those loops, or
  // beside other replicas' threads, would oversubscribe the cores (and on 2 cores a LeNet step
  // took 82 ms with a 2-thread OpenBLAS under one OpenMP thread, 37 ms this way).
  set_threads(1);
  if (features.avx2_fma && pre_avx2_core(o.core)) {
    const std::string fit = core_for(features);
    std::string cause = "this OpenBLAS build has no kernels for it";
    if (loaded_before) cause = "it was loaded into this process before dprun could choose its core";
    if (!loaded_before && user_chose)
      cause = "OPENBLAS_CORETYPE=" + std::string(user_core) + " asks for them";
    std::fprintf(stderr,
                 "dprun: warning: OpenBLAS %s runs its generic '%s' kernels on this CPU, which "
                 "has %s (%s), so the BLAS kernels will be several times slower than they "
                 "could: set OPENBLAS_CORETYPE=%s before starting the process, or use the "
                 "oneDNN kernels (DPRUN_CPU_KERNELS=onednn)\n",
                 o.version.c_str(), o.core.c_str(), features.avx512 ? "AVX-512" : "AVX2",
                 cause.c_str(), fit.c_str());
  }
  return o;
}

}  // namespace

const OpenBlas& openblas() {
  static const OpenBlas instance = load();  // once per process; later callers wait for it
  return instance;
}

}  // namespace dp::cpu
