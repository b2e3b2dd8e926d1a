// Convolution on the CPU: im2col over a chunk of images, then one SGEMM per chunk, in NCHW or
// NHWC (im2col reads, and the outputs are written, through the layout's strides).
//
// For a chunk of B images the unfolded input is a (C*R*S, B*P*Q) matrix, so
//   forward          y_chunk (K, B*P*Q)  = w (K, C*R*S) * columns
//   backward data    columns             = w^T * dy_chunk (K, B*P*Q), then col2im into dx
//   backward filter  dw (K, C*R*S)      += dy_chunk * columns^T
// The chunk makes the GEMM's N dimension large (LeNet's conv2 has only P*Q = 81 per image),
// which is what lets the SGEMM run near peak. Chunks are spread over the backend's threads, each
// with its own part of the pass's scratch; the SGEMM (oneDNN's or OpenBLAS's, see sgemm in
// cpu_kernels.hpp) runs single-threaded on the calling thread.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "cpu/conv_plans.hpp"
#include "cpu/cpu_kernels.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

// Columns per chunk: the SGEMM reaches its best speed on LeNet's conv2 shapes from about
// 600 columns (8 images) and slows past a few thousand, when a chunk's columns no longer stay in
// the L2/L3 caches between im2col and the GEMM (measured with bench_cpu_ops).
constexpr int64_t kTargetColumns = 640;
constexpr int64_t kMaxColumnBytes = int64_t{4} << 20;

// The geometry, and where an element of one image sits in memory: input (c, h, w) at
// c * in_c + h * in_h + w * in_w, output (k, p*Q+q) at k * out_k + (p*Q+q) * out_pq.
struct ConvShape {
  int64_t c, h, w, k, r, s, p, q, sh, sw, ph, pw;
  int64_t in_c = 0, in_h = 0, in_w = 0, out_k = 0, out_pq = 0;
  int64_t pq() const { return p * q; }
  int64_t crs() const { return c * r * s; }
  int64_t chw() const { return c * h * w; }
  int64_t kpq() const { return k * p * q; }
};

ConvShape shape_of(const ConvGeometry& g) {
  ConvShape cs{g.in_channels, g.in_h,    g.in_w,     g.out_channels, g.kernel_h, g.kernel_w,
               g.out_h(),     g.out_w(), g.stride_h, g.stride_w,     g.pad_h,    g.pad_w};
  if (g.layout == Layout::nhwc) {
    cs.in_c = 1, cs.in_h = cs.w * cs.c, cs.in_w = cs.c;
    cs.out_k = 1, cs.out_pq = cs.k;
  } else {
    cs.in_c = cs.h * cs.w, cs.in_h = cs.w, cs.in_w = 1;
    cs.out_k = cs.pq(), cs.out_pq = 1;
  }
  return cs;
}

// Output columns q in [lo, hi) read an input column inside the image for kernel column s;
// the rest read padding.
void valid_range(int64_t q_count, int64_t stride, int64_t pad, int64_t s, int64_t width,
                 int64_t& lo, int64_t& hi) {
  // iw = q*stride - pad + s must satisfy 0 <= iw < width.
  lo = pad > s ? (pad - s + stride - 1) / stride : 0;
  hi = width + pad - s > 0 ? (width + pad - s + stride - 1) / stride : 0;
  lo = std::min(lo, q_count);
  hi = std::clamp(hi, lo, q_count);
}

// One image x (C, H, W) in either layout -> columns (C*R*S rows, leading dimension ld), its P*Q
// columns starting at column `offset`. Padding reads as zero.
DP_CPU_LOOPS void im2col(const ConvShape& cs, const float* __restrict x, float* __restrict columns,
                         int64_t ld, int64_t offset) {
  for (int64_t c = 0; c < cs.c; ++c) {
    for (int64_t r = 0; r < cs.r; ++r) {
      for (int64_t s = 0; s < cs.s; ++s) {
        float* dst = columns + ((c * cs.r + r) * cs.s + s) * ld + offset;
        int64_t lo, hi;
        valid_range(cs.q, cs.sw, cs.pw, s, cs.w, lo, hi);
        for (int64_t p = 0; p < cs.p; ++p) {
          float* d = dst + p * cs.q;
          const int64_t ih = p * cs.sh - cs.ph + r;
          if (ih < 0 || ih >= cs.h) {
            std::fill(d, d + cs.q, 0.0f);
            continue;
          }
          const float* src = x + c * cs.in_c + ih * cs.in_h + (s - cs.pw) * cs.in_w;
          const int64_t step = cs.sw * cs.in_w;  // between the inputs of neighbouring outputs
          // Plain loops, not std::copy/std::fill: rows are short (9 floats in LeNet's conv2),
          // where a memmove call costs several times the copy itself.
          for (int64_t q = 0; q < lo; ++q) d[q] = 0.0f;
          if (step == 1) {
#pragma omp simd
            for (int64_t q = lo; q < hi; ++q) d[q] = src[q];
          } else {
            for (int64_t q = lo; q < hi; ++q) d[q] = src[q * step];
          }
          for (int64_t q = hi; q < cs.q; ++q) d[q] = 0.0f;
        }
      }
    }
  }
}

// The adjoint of im2col: dx (C, H, W) += the columns of one image, summed where windows overlap.
DP_CPU_LOOPS void col2im(const ConvShape& cs, const float* __restrict columns, int64_t ld,
                         int64_t offset, float* __restrict dx) {
  for (int64_t c = 0; c < cs.c; ++c) {
    for (int64_t r = 0; r < cs.r; ++r) {
      for (int64_t s = 0; s < cs.s; ++s) {
        const float* src_row = columns + ((c * cs.r + r) * cs.s + s) * ld + offset;
        int64_t lo, hi;
        valid_range(cs.q, cs.sw, cs.pw, s, cs.w, lo, hi);
        for (int64_t p = 0; p < cs.p; ++p) {
          const int64_t ih = p * cs.sh - cs.ph + r;
          if (ih < 0 || ih >= cs.h) continue;
          const float* src = src_row + p * cs.q;
          float* dst = dx + c * cs.in_c + ih * cs.in_h + (s - cs.pw) * cs.in_w;
          const int64_t step = cs.sw * cs.in_w;
          if (step == 1) {
#pragma omp simd
            for (int64_t q = lo; q < hi; ++q) dst[q] += src[q];
          } else {
            for (int64_t q = lo; q < hi; ++q) dst[q * step] += src[q];
          }
        }
      }
    }
  }
}

// Columns [i*P*Q, (i+1)*P*Q) of out (K rows, leading dimension ld) plus the bias (or none) ->
// one image's output y (K, P, Q) in either layout.
DP_CPU_LOOPS void scatter_output(const ConvShape& cs, const float* __restrict out, int64_t ld,
                                 int64_t i, const float* __restrict bias, float* __restrict y) {
  for (int64_t k = 0; k < cs.k; ++k) {
    const float* src = out + k * ld + i * cs.pq();
    float* dst = y + k * cs.out_k;
    const float b = bias ? bias[k] : 0.0f;
    for (int64_t j = 0; j < cs.pq(); ++j) dst[j * cs.out_pq] = src[j] + b;
  }
}

// One image's output gradient dy (K, P, Q) in either layout -> columns [i*P*Q, (i+1)*P*Q) of
// grad_out (K rows, leading dimension ld).
DP_CPU_LOOPS void gather_output(const ConvShape& cs, const float* __restrict dy,
                                float* __restrict grad_out, int64_t ld, int64_t i) {
  for (int64_t k = 0; k < cs.k; ++k) {
    const float* src = dy + k * cs.out_k;
    float* dst = grad_out + k * ld + i * cs.pq();
    if (cs.out_pq == 1) {
      std::copy_n(src, cs.pq(), dst);
    } else {
      for (int64_t j = 0; j < cs.pq(); ++j) dst[j] = src[j * cs.out_pq];
    }
  }
}

int64_t chunk_count(int64_t n, int64_t chunk) { return (n + chunk - 1) / chunk; }

/// Images are processed in chunks of `chunk` so the GEMM's N dimension (chunk * P * Q) is large
/// enough to run near peak; each thread has one set of buffers in the pass's scratch, whose size
/// depends on the geometry and the thread count, not on the batch.
class Im2colConvPlan final : public CpuConvPlan {
 public:
  Im2colConvPlan(const ConvGeometry& g, CpuKernels kernels, int threads,
                 std::shared_ptr<SharedScratch> shared);

  /// Every pass: the columns and outputs of each thread's chunk; the filter gradient also each
  /// thread's partial sums.
  size_t scratch_bytes(ConvStage stage) const override {
    const int64_t per_thread =
        columns_stride_ + outputs_stride_ + (stage == ConvStage::backward ? partials_stride_ : 0);
    return static_cast<size_t>(per_thread * threads_) * sizeof(float);
  }
  void forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
               ConvScratch scratch) override;
  void backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx,
                     ConvScratch scratch) override;
  void backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor* db,
                       ConvScratch scratch) override;

  std::string implementation() const override {
    return std::string("im2col + ") + (kernels_ == CpuKernels::blas ? "OpenBLAS" : "oneDNN") +
           " SGEMM, " + std::to_string(chunk_) + " images per chunk";
  }

 private:
  /// The threads' buffers in a pass's scratch: all columns, then all outputs, then all partials.
  struct Buffers {
    float* base;
    const Im2colConvPlan& plan;
    /// (C*R*S, chunk*P*Q): the unfolded input of one chunk.
    float* columns(int thread) const { return base + thread * plan.columns_stride_; }
    /// (K, chunk*P*Q): the output (forward) or output gradient (backward) of one chunk.
    float* outputs(int thread) const {
      return base + plan.threads_ * plan.columns_stride_ + thread * plan.outputs_stride_;
    }
    /// (K*C*R*S + K): this thread's partial filter and bias gradient.
    float* partial(int thread) const {
      return base + plan.threads_ * (plan.columns_stride_ + plan.outputs_stride_) +
             thread * plan.partials_stride_;
    }
  };
  Buffers buffers(const ConvScratch& scratch, ConvStage stage) const {
    return {reinterpret_cast<float*>(scratch_for(scratch, scratch_bytes(stage))), *this};
  }

  CpuKernels kernels_;
  // The filter gradient as (C*R*S, K) = columns * dy^T rather than (K, C*R*S) = dy * columns^T
  // when C*R*S < K (a first layer): oneDNN's SGEMM handles a short M far better than a short N
  // (LeNet's conv1, 20 x 9 outputs over 676 columns: 0.04 against 0.15 ms per image; OpenBLAS
  // 0.04 either way).
  bool transposed_filter_ = false;
  int threads_ = 1;
  int64_t chunk_ = 1;
  int64_t columns_stride_ = 0, outputs_stride_ = 0, partials_stride_ = 0;
};

}  // namespace

Im2colConvPlan::Im2colConvPlan(const ConvGeometry& g, CpuKernels kernels, int threads,
                               std::shared_ptr<SharedScratch> shared)
    : CpuConvPlan(g, std::move(shared)), kernels_(kernels) {
  transposed_filter_ =
      kernels == CpuKernels::onednn && g.in_channels * g.kernel_h * g.kernel_w < g.out_channels;
  DP_CHECK(g.dtype == DType::f32, "cpu backend: plan_conv: dtype " +
                                      std::string(dtype_name(g.dtype)) +
                                      " is not supported; use f32 (" + g.str() + ")");
  const ConvShape cs = shape_of(g);
  const int64_t column_bytes_per_image = cs.crs() * cs.pq() * int64_t{sizeof(float)};
  chunk_ = std::max<int64_t>(1, (kTargetColumns + cs.pq() - 1) / cs.pq());
  chunk_ = std::min(chunk_, std::max<int64_t>(1, kMaxColumnBytes / column_bytes_per_image));
  // Leave no thread idle when the batch could feed them all.
  chunk_ = std::min(chunk_, std::max<int64_t>(1, (g.max_batch + threads - 1) / threads));
  threads_ =
      static_cast<int>(std::min<int64_t>(std::max(threads, 1), chunk_count(g.max_batch, chunk_)));
  columns_stride_ = cs.crs() * chunk_ * cs.pq();
  outputs_stride_ = cs.k * chunk_ * cs.pq();
  partials_stride_ = cs.k * cs.crs() + cs.k;
  // Strides rounded to 64 floats (256 bytes) so each thread's buffer is aligned and no two
  // threads share a cache line.
  auto round = [](int64_t n) { return (n + 63) / 64 * 64; };
  columns_stride_ = round(columns_stride_);
  outputs_stride_ = round(outputs_stride_);
  partials_stride_ = round(partials_stride_);
}

// One algorithm for every batch size and direction, so a plan needs to know no more than the
// geometry.
std::unique_ptr<CpuConvPlan> make_im2col_plan(const ConvGeometry& g, CpuKernels kernels,
                                              int threads, std::shared_ptr<SharedScratch> shared) {
  return std::make_unique<Im2colConvPlan>(g, kernels, threads, std::move(shared));
}

// x (N,C,H,W), w (K,C,R,S), b (K) or null -> y (N,K,P,Q)
void Im2colConvPlan::forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
                             ConvScratch scratch) {
  const ConvShape cs = shape_of(geometry());
  const Buffers buf = buffers(scratch, ConvStage::forward);
  const int64_t n = x.shape[0];
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* bp = b ? b->f32() : nullptr;
  float* yp = y.f32();
  const int64_t chunks = chunk_count(n, chunk_);
  const int team = static_cast<int>(std::min<int64_t>(threads_, chunks));
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
    float* columns = buf.columns(t);
    float* out = buf.outputs(t);
    for (int64_t chunk = t; chunk < chunks; chunk += omp_get_num_threads()) {
      const int64_t n0 = chunk * chunk_;
      const int64_t images = std::min(chunk_, n - n0);
      const int64_t ld = images * cs.pq();
      for (int64_t i = 0; i < images; ++i)
        im2col(cs, xp + (n0 + i) * cs.chw(), columns, ld, i * cs.pq());
      sgemm(kernels_, false, false, cs.k, ld, cs.crs(), 1.0f, wp, cs.crs(), columns, ld, 0.0f, out,
            ld);
      for (int64_t i = 0; i < images; ++i)
        scatter_output(cs, out, ld, i, bp, yp + (n0 + i) * cs.kpq());
    }
  }
}

// dy (N,K,P,Q), w (K,C,R,S) -> dx (N,C,H,W)
void Im2colConvPlan::backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx,
                                   ConvScratch scratch) {
  const ConvShape cs = shape_of(geometry());
  const Buffers buf = buffers(scratch, ConvStage::backward);
  const int64_t n = dy.shape[0];
  const float* dyp = dy.f32();
  const float* wp = w.f32();
  float* dxp = dx.f32();
  const int64_t chunks = chunk_count(n, chunk_);
  const int team = static_cast<int>(std::min<int64_t>(threads_, chunks));
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
    float* columns = buf.columns(t);
    float* grad_out = buf.outputs(t);
    for (int64_t chunk = t; chunk < chunks; chunk += omp_get_num_threads()) {
      const int64_t n0 = chunk * chunk_;
      const int64_t images = std::min(chunk_, n - n0);
      const int64_t ld = images * cs.pq();
      // dy's images -> (K, B*P*Q).
      for (int64_t i = 0; i < images; ++i)
        gather_output(cs, dyp + (n0 + i) * cs.kpq(), grad_out, ld, i);
      sgemm(kernels_, true, false, cs.crs(), ld, cs.k, 1.0f, wp, cs.crs(), grad_out, ld, 0.0f,
            columns, ld);
      for (int64_t i = 0; i < images; ++i) {
        float* dx_image = dxp + (n0 + i) * cs.chw();
        std::fill(dx_image, dx_image + cs.chw(), 0.0f);
        col2im(cs, columns, ld, i * cs.pq(), dx_image);
      }
    }
  }
}

// x (N,C,H,W), dy (N,K,P,Q) -> dw (K,C,R,S), db (K) or null
void Im2colConvPlan::backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw,
                                     const Tensor* db, ConvScratch scratch) {
  const ConvShape cs = shape_of(geometry());
  const Buffers buf = buffers(scratch, ConvStage::backward);
  const int64_t n = x.shape[0];
  const float* xp = x.f32();
  const float* dyp = dy.f32();
  const int64_t kcrs = cs.k * cs.crs();
  const int64_t chunks = chunk_count(n, chunk_);
  const int team = static_cast<int>(std::min<int64_t>(threads_, chunks));
  int team_size = 1;
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
#pragma omp single
    team_size = omp_get_num_threads();
    float* columns = buf.columns(t);
    float* grad_out = buf.outputs(t);
    float* partial = buf.partial(t);  // dw (K*C*R*S, or C*R*S*K) then db (K)
    std::fill(partial, partial + kcrs + cs.k, 0.0f);
    for (int64_t chunk = t; chunk < chunks; chunk += omp_get_num_threads()) {
      const int64_t n0 = chunk * chunk_;
      const int64_t images = std::min(chunk_, n - n0);
      const int64_t ld = images * cs.pq();
      for (int64_t i = 0; i < images; ++i) {
        im2col(cs, xp + (n0 + i) * cs.chw(), columns, ld, i * cs.pq());
        gather_output(cs, dyp + (n0 + i) * cs.kpq(), grad_out, ld, i);
      }
      if (transposed_filter_) {
        sgemm(kernels_, false, true, cs.crs(), cs.k, ld, 1.0f, columns, ld, grad_out, ld, 1.0f,
              partial, cs.k);
      } else {
        sgemm(kernels_, false, true, cs.k, cs.crs(), ld, 1.0f, grad_out, ld, columns, ld, 1.0f,
              partial, cs.crs());
      }
      for (int64_t k = 0; k < cs.k; ++k) {
        const float* row = grad_out + k * ld;
        float sum = 0.0f;
        // simd: lets the compiler keep several partial sums instead of one serial chain.
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < ld; ++j) sum += row[j];
        partial[kcrs + k] += sum;
      }
    }
  }
  // Summing the per-thread partials in thread order keeps the result deterministic for a
  // given thread count.
  float* dwp = dw.f32();
  float* dbp = db ? db->f32() : nullptr;
  const float* first = buf.partial(0);
  if (transposed_filter_) {
    for (int64_t k = 0; k < cs.k; ++k)
      for (int64_t j = 0; j < cs.crs(); ++j) dwp[k * cs.crs() + j] = first[j * cs.k + k];
  } else {
    std::copy_n(first, kcrs, dwp);
  }
  if (dbp) std::copy_n(first + kcrs, cs.k, dbp);
  for (int t = 1; t < team_size; ++t) {
    const float* partial = buf.partial(t);
    if (transposed_filter_) {
      for (int64_t k = 0; k < cs.k; ++k)
        for (int64_t j = 0; j < cs.crs(); ++j) dwp[k * cs.crs() + j] += partial[j * cs.k + k];
    } else {
      for (int64_t i = 0; i < kcrs; ++i) dwp[i] += partial[i];
    }
    if (dbp)
      for (int64_t k = 0; k < cs.k; ++k) dbp[k] += partial[kcrs + k];
  }
}

}  // namespace dp::cpu
