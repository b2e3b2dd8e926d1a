// Which kernels the CPU backend uses, what the CPU can do, and the SGEMM of both selections.
#include "cpu/cpu_kernels.hpp"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <string>

#include "cpu/onednn.hpp"
#include "cpu/openblas.hpp"
#include "dp/backend.hpp"
#include "dp/error.hpp"

namespace dp {

const char* cpu_kernels_name(CpuKernels k) {
  switch (k) {
    case CpuKernels::automatic:
      return "automatic";
    case CpuKernels::onednn:
      return "onednn";
    case CpuKernels::blas:
      return "blas";
  }
  return "?";
}

CpuKernels resolve_cpu_kernels(CpuKernels choice) {
  if (choice != CpuKernels::automatic) return choice;
  const char* env = std::getenv("DPRUN_CPU_KERNELS");
  if (env == nullptr || *env == '\0') return CpuKernels::onednn;
  const std::string value = env;
  if (value == "onednn") return CpuKernels::onednn;
  if (value == "blas") return CpuKernels::blas;
  DP_THROW("DPRUN_CPU_KERNELS=" + value +
           " is not a kernel selection of the cpu backend; use onednn (the default: oneDNN, "
           "kernels chosen from the CPU's features) or blas (im2col + OpenBLAS)");
}

std::string cpu_kernels(CpuKernels choice) {
  if (resolve_cpu_kernels(choice) == CpuKernels::blas) {
    const cpu::OpenBlas& blas = cpu::openblas();
    return "OpenBLAS " + blas.version + " " + blas.core;
  }
  return cpu::onednn_description();
}

}  // namespace dp

namespace dp::cpu {

CpuFeatures cpu_features() {
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  return f;
}

void sgemm(CpuKernels kernels, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc) {
  if (kernels == CpuKernels::blas) {
    openblas().sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                     trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                     static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                     beta, c, static_cast<int>(ldc));
    return;
  }
  // oneDNN's SGEMM threads itself with omp_get_max_threads() unless it is called from inside an
  // active parallel region; a one-thread team is not active, so it is told explicitly.
  const OmpThreads one(1);
  DNNL_CHECK(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                        beta, c, ldc));
}

}  // namespace dp::cpu
