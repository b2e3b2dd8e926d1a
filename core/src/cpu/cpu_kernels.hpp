#pragma once
// What the CPU can do (cpuid), which kernels the CPU backend computes with, and the SGEMM both
// kernel selections share an interface for. See dp::CpuKernels for the choice itself.
#include <cstdint>
#include <string>

#include "dp/backend.hpp"

namespace dp::cpu {

/// Instruction sets this CPU and its operating system support (cpuid and XGETBV, through the
/// compiler's __builtin_cpu_supports), as far as they decide which kernels are fast.
struct CpuFeatures {
  bool avx2_fma = false;     // Haswell-class vector units
  bool avx512 = false;       // AVX-512 F, CD, BW, DQ and VL (Skylake-X and later, AMD Zen 4+)
  bool avx512_bf16 = false;  // and AVX512_BF16 (Cooper Lake, Sapphire Rapids and later, Zen 4+)
};
CpuFeatures cpu_features();

/// Row-major C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, where op(X) = X^T when
/// the trans flag is set. Runs on the calling thread only: the backend splits its own work over
/// its threads and calls this from inside those loops. onednn: oneDNN's SGEMM (its JIT kernels
/// for the instruction set oneDNN picked); blas: OpenBLAS's cblas_sgemm.
void sgemm(CpuKernels kernels, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c, int64_t ldc);

}  // namespace dp::cpu
