// Linear layers on the CPU: SGEMMs with PyTorch's (OUT, IN) weight layout. Each GEMM is split
// into row blocks, one per thread, with BLAS single-threaded inside each block (see
// CpuBackend's constructor for why).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

struct LinearDims {
  int64_t n, in, out;
};

LinearDims check_linear(const Tensor& x, const Tensor& w, const char* op) {
  expect_dtype(x, DType::f32, op, "x");
  expect_dtype(w, DType::f32, op, "w");
  expect_not_null(x.data, op, "x");
  expect_not_null(w.data, op, "w");
  if (x.shape.rank != 2 || w.shape.rank != 2 || x.shape[1] != w.shape[1]) {
    DP_THROW(std::string("cpu backend: ") + op + ": x has shape " + x.shape.str() +
             " and w has shape " + w.shape.str() +
             ", expected x (N, IN) and w (OUT, IN) with the same IN (flatten x first)");
  }
  return LinearDims{x.shape[0], x.shape[1], w.shape[0]};
}

void check_out(const Tensor& t, Shape s, const char* op, const char* what) {
  expect_dtype(t, DType::f32, op, what);
  expect_not_null(t.data, op, what);
  expect_shape(t, s, op, what);
}

int gemm_threads(const LinearDims& d, int threads) {
  return threads_for(d.n * d.in * d.out / 16, threads);
}

}  // namespace

// x (N,IN), w (OUT,IN), b (OUT) or null -> y (N,OUT)
void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b,
                                const Tensor& y) {
  const char* op = "linear_forward";
  const LinearDims d = check_linear(x, w, op);
  check_out(y, Shape{d.n, d.out}, op, "y");
  if (b) check_out(*b, Shape{d.out}, op, "b");
  if (d.n == 0) return;
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
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(end - begin),
                  static_cast<int>(d.out), static_cast<int>(d.in), 1.0f, xp + begin * d.in,
                  static_cast<int>(d.in), wp, static_cast<int>(d.in), 0.0f, yp + begin * d.out,
                  static_cast<int>(d.out));
      if (bp) {
        for (int64_t i = begin; i < end; ++i)
          for (int64_t o = 0; o < d.out; ++o) yp[i * d.out + o] += bp[o];
      }
    }
  }
}

// x (N,IN), w (OUT,IN), dy (N,OUT) -> dx (N,IN) or null, dw (OUT,IN), db (OUT) or null
void CpuBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                 const Tensor* dx, const Tensor& dw, const Tensor* db) {
  const char* op = "linear_backward";
  const LinearDims d = check_linear(x, w, op);
  check_out(dy, Shape{d.n, d.out}, op, "dy");
  check_out(dw, Shape{d.out, d.in}, op, "dw");
  if (dx) check_out(*dx, Shape{d.n, d.in}, op, "dx");
  if (db) check_out(*db, Shape{d.out}, op, "db");
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
    // dw rows [begin, end) = dy[:, begin:end]^T x; with N == 0 the gradient is zero.
    split_range(d.out, parts, t, begin, end);
    if (end > begin) {
      if (d.n > 0) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(end - begin),
                    static_cast<int>(d.in), static_cast<int>(d.n), 1.0f, dyp + begin,
                    static_cast<int>(d.out), xp, static_cast<int>(d.in), 0.0f, dwp + begin * d.in,
                    static_cast<int>(d.in));
      } else {
        std::fill(dwp + begin * d.in, dwp + end * d.in, 0.0f);
      }
      if (dbp) {
        for (int64_t o = begin; o < end; ++o) dbp[o] = 0.0f;
        for (int64_t i = 0; i < d.n; ++i)
          for (int64_t o = begin; o < end; ++o) dbp[o] += dyp[i * d.out + o];
      }
    }
    // dx rows [begin, end) = dy[begin:end] w.
    split_range(d.n, parts, t, begin, end);
    if (dxp && end > begin) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(end - begin),
                  static_cast<int>(d.in), static_cast<int>(d.out), 1.0f, dyp + begin * d.out,
                  static_cast<int>(d.out), wp, static_cast<int>(d.in), 0.0f, dxp + begin * d.in,
                  static_cast<int>(d.in));
    }
  }
}

}  // namespace dp::cpu
