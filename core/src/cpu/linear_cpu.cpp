// Linear layers on the CPU in fp32 (bf16 rounds around these, cpu_backend.cpp): SGEMMs with
// PyTorch's (OUT, IN) weight layout. Each GEMM is split
// into row blocks, one per thread, with the SGEMM single-threaded inside each block (the
// backend threads its own loops; see sgemm in cpu_kernels.hpp).
#include <omp.h>

#include <algorithm>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "cpu/cpu_kernels.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

struct LinearDims {
  int64_t n, in, out;
};

int gemm_threads(const LinearDims& d, int threads) {
  return threads_for(d.n * d.in * d.out / 16, threads);
}

}  // namespace

// x (N,IN), w (OUT,IN), b (OUT) or null -> y (N,OUT)
void CpuBackend::linear_forward_fp32(const Tensor& x, const Tensor& w, const Tensor* b,
                                     const Tensor& y) {
  const LinearDims d{x.shape[0], x.shape[1], w.shape[0]};
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* bp = b ? b->f32() : nullptr;
  float* yp = y.f32();
  const int team = static_cast<int>(std::min<int64_t>(gemm_threads(d, threads_), d.n));
#pragma omp parallel num_threads(team)
  {
    int64_t begin, end;
    split_range(d.n, omp_get_num_threads(), omp_get_thread_num(), begin, end);
    if (end > begin) {
      sgemm(kernels_, false, true, end - begin, d.out, d.in, 1.0f, xp + begin * d.in, d.in, wp,
            d.in, 0.0f, yp + begin * d.out, d.out);
      if (bp) {
        for (int64_t i = begin; i < end; ++i)
          for (int64_t o = 0; o < d.out; ++o) yp[i * d.out + o] += bp[o];
      }
    }
  }
}

// x (N,IN), w (OUT,IN), dy (N,OUT) -> dx (N,IN) or null, dw (OUT,IN), db (OUT) or null
void CpuBackend::linear_backward_fp32(const Tensor& x, const Tensor& w, const Tensor& dy,
                                      const Tensor* dx, const Tensor& dw, const Tensor* db) {
  const LinearDims d{x.shape[0], x.shape[1], w.shape[0]};
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* dyp = dy.f32();
  float* dwp = dw.f32();
  float* dxp = dx ? dx->f32() : nullptr;
  float* dbp = db ? db->f32() : nullptr;
  const int team = gemm_threads(d, threads_);
#pragma omp parallel num_threads(team)
  {
    const int parts = omp_get_num_threads();
    const int t = omp_get_thread_num();
    int64_t begin, end;
    // dw rows [begin, end) = dy[:, begin:end]^T x.
    split_range(d.out, parts, t, begin, end);
    if (end > begin) {
      sgemm(kernels_, true, false, end - begin, d.in, d.n, 1.0f, dyp + begin, d.out, xp, d.in, 0.0f,
            dwp + begin * d.in, d.in);
      if (dbp) {
        for (int64_t o = begin; o < end; ++o) dbp[o] = 0.0f;
        for (int64_t i = 0; i < d.n; ++i)
          for (int64_t o = begin; o < end; ++o) dbp[o] += dyp[i * d.out + o];
      }
    }
    // dx rows [begin, end) = dy[begin:end] w.
    split_range(d.n, parts, t, begin, end);
    if (dxp && end > begin) {
      sgemm(kernels_, false, false, end - begin, d.in, d.out, 1.0f, dyp + begin * d.out, d.out, wp,
            d.in, 0.0f, dxp + begin * d.in, d.in);
    }
  }
}

}  // namespace dp::cpu
