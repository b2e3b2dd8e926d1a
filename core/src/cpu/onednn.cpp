// oneDNN: errors, and what the library runs on this CPU.
#include "cpu/onednn.hpp"

#include <oneapi/dnnl/dnnl_debug.h>

#include <string>

#include "dp/error.hpp"

namespace dp::cpu {

void throw_onednn_error(const char* statement, const char* file, int line, dnnl_status_t status) {
  throw Error(std::string("cpu backend: oneDNN: ") + statement +
              " failed: " + dnnl_status2str(status) + " (" + file + ":" + std::to_string(line) +
              "); DPRUN_CPU_KERNELS=blas runs the OpenBLAS kernels instead");
}

std::string onednn_isa() {
  using dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case cpu_isa::sse41:
      return "sse41";
    case cpu_isa::avx:
      return "avx";
    case cpu_isa::avx2:
      return "avx2";
    case cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case cpu_isa::avx512_mic:
      return "avx512_mic";
    case cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case cpu_isa::avx512_core:
      return "avx512_core";
    case cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case cpu_isa::all:
      break;
  }
  return "no vector extensions";
}

int onednn_simd_floats() {
  using dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case cpu_isa::sse41:
      return 4;
    case cpu_isa::avx:
    case cpu_isa::avx2:
    case cpu_isa::avx2_vnni:
      return 8;
    case cpu_isa::all:
      return 1;
    default:
      return 16;  // the AVX-512 family
  }
}

bool onednn_has_brgconv() {
  using dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case cpu_isa::avx512_core:
    case cpu_isa::avx512_core_vnni:
    case cpu_isa::avx512_core_bf16:
    case cpu_isa::avx512_core_amx:
      return true;
    default:
      return false;
  }
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " " + onednn_isa();
}

}  // namespace dp::cpu
