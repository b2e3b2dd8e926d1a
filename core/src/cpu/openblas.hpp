#pragma once
// OpenBLAS, loaded with dlopen on first use instead of linked into libdpcore.
//
// Why: OpenBLAS picks its kernels ("core") once, in its load-time constructor, from a table of
// CPU models, and falls to its generic, several times slower, SSE3 kernels on a model the table
// does not know (0.3.21, Debian 12's, misses e.g. Intel Emerald Rapids: upstream PR #4268,
// fixed in 0.3.25). The only way to choose the core is the OPENBLAS_CORETYPE environment
// variable, read by that constructor, so it must be set before the library loads, which a
// library linked into libdpcore would already have done. Loading OpenBLAS ourselves lets us
// set it from cpuid features first (unless the user set it). Where OpenBLAS was in the process
// before us (a host that linked it) or the user's OPENBLAS_CORETYPE asks for a slow core, we can
// only say so, once, with what to do. Processes that use the oneDNN kernels never load it.
#include <cblas.h>

#include <string>

namespace dp::cpu {

struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  std::string version;  // "0.3.21"
  std::string core;     // the kernels it runs: "SkylakeX", "Haswell", "Prescott", ...
};

/// Loads OpenBLAS on the first call (thread-safe), single-threaded (the backend threads its own
/// loops around it). Throws dp::Error when the library cannot be loaded.
const OpenBlas& openblas();

}  // namespace dp::cpu
