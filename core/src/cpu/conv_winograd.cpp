// Winograd F(4x4, 3x3) convolutions of our own, for 3x3 stride-1 pad-1 layers whose channels
// come in whole blocks of 8: every 3x3 layer of ResNet-18 but the stem and the downsampling
// ones. oneDNN 2.6 has a Winograd kernel for AVX-512 only; below that (AVX2 machines, or oneDNN
// capped to AVX2) its direct kernels run at up to ~111 GFLOP/s per core on the AVX2 units of the
// machine this was measured on, and a 3x3 layer cannot go faster without fewer multiplications.
// F(4x4, 3x3) makes a 4x4 block of outputs from a 6x6 block of inputs with 36 multiplications
// per channel pair instead of 144 (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2016; the interpolation points 0, +-1, +-2 and infinity, as oneDNN and NNPACK):
//
//   forward           y  = A^T [ (G w G^T) . (B^T x B) ] A          per 4x4 output tile
//   backward data     dx = the forward of dy with the filter turned by 180 degrees and its
//                          channel axes swapped (pad 1, stride 1: dx has dy's size)
//   backward filter   dw = G^T [ sum over tiles (A dy A^T) . (B^T x B) ] G
//
// where . multiplies element by element in the 6x6 transform domain. Summed over channels, each
// of the 36 transform-domain positions ("points") is a matrix product, done by the SGEMM of
// the kernel selection (oneDNN's, single-threaded, like im2col's):
//   forward / backward data   M_p (T x K) = V_p (T x C) * U_p (C x K)
//   backward filter           S_p (K x C) += W_p^T (K x T) * V_p (T x C)
// for T tiles, C input and K output channels. The transforms work on 8 channels at a time (one
// AVX2 vector) with channels innermost, so each image is first copied into a zero-bordered
// channels-last buffer (a transpose for NCHW, a copy for NHWC), and outputs are written to one
// and copied out in the tensor's layout: the same code serves both layouts.
//
// Work split: the batch runs in chunks of images sized so a chunk's transformed tiles stay in
// the last-level cache between the transforms and the SGEMMs (one image at least). Within a
// chunk the backend's threads take rows of tiles for the transforms, then points (and, with more
// than 4 threads, row blocks of each point's product) for the SGEMMs, then rows of tiles again.
//
// Rounding: the transforms multiply by up to 5 (B), 1/4..1/24 (G) and 8 (A) and add up to six
// terms, so the result is less exact than a direct convolution's: tests/core/
// test_cpu_winograd.cpp bounds the error by the componentwise bound of the algorithm (the same
// arithmetic in absolute values) rather than by a measured constant.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "cpu/conv_plans.hpp"
#include "cpu/cpu_kernels.hpp"
#include "dp/error.hpp"

// The transforms' vectors never cross a function boundary (every helper is inlined), so the
// note GCC gives about the ABI of 32-byte vectors without AVX enabled does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dp::cpu {

namespace {

constexpr int64_t kTile = 4;     // outputs per tile side
constexpr int64_t kAlpha = 6;    // inputs per tile side: kTile + 3 - 1
constexpr int64_t kPoints = 36;  // kAlpha^2 transform-domain positions: SGEMMs per chunk
constexpr int64_t kLanes = 8;    // channels per vector
// A chunk's transformed inputs and outputs (both sides of the SGEMMs) together: well inside a
// 32 MiB last-level cache. Measured on ResNet-18's layers at batch 64 with bench_cpu_ops: 4, 8
// and 16 MiB are within a few percent of each other; 64 MiB is 10-20 % slower.
constexpr int64_t kChunkBytes = int64_t{8} << 20;
constexpr int64_t kAlignFloats = 64;  // 256 bytes

typedef float v8 __attribute__((vector_size(32)));
#define DP_INLINE inline __attribute__((always_inline))

DP_INLINE v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
DP_INLINE void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
DP_INLINE v8 splat(float f) { return v8{f, f, f, f, f, f, f, f}; }

// B^T applied to 6 values (a column or row of an input tile): t = B^T d.
DP_INLINE void bt6(const v8 d[6], v8 t[6]) {
  const v8 four = splat(4.0f), five = splat(5.0f), two = splat(2.0f);
  t[0] = four * d[0] - five * d[2] + d[4];
  t[1] = d[3] + d[4] - four * (d[1] + d[2]);
  t[2] = four * (d[1] - d[2]) + d[4] - d[3];
  t[3] = two * (d[3] - d[1]) + d[4] - d[2];
  t[4] = two * (d[1] - d[3]) + d[4] - d[2];
  t[5] = four * d[1] - five * d[3] + d[5];
}

// A^T applied to 6 values of a transformed output: o = A^T m (4 values).
DP_INLINE void at6(const v8 m[6], v8 o[4]) {
  const v8 two = splat(2.0f), four = splat(4.0f), eight = splat(8.0f);
  const v8 s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
  o[0] = m[0] + s12 + s34;
  o[1] = d12 + two * d34;
  o[2] = s12 + four * s34;
  o[3] = d12 + eight * d34 + m[5];
}

// A applied to 4 values of an output gradient: w = A e (6 values).
DP_INLINE void a4(const v8 e[4], v8 w[6]) {
  const v8 two = splat(2.0f), four = splat(4.0f), eight = splat(8.0f);
  const v8 even = e[0] + four * e[2], odd = two * e[1] + eight * e[3];
  w[0] = e[0];
  w[1] = e[0] + e[1] + e[2] + e[3];
  w[2] = e[0] - e[1] + e[2] - e[3];
  w[3] = even + odd;
  w[4] = even - odd;
  w[5] = e[3];
}

// G applied to 3 filter taps: u = G g (6 values).
DP_INLINE void g3(const v8 g[3], v8 u[6]) {
  const v8 sixth = splat(1.0f / 6.0f);
  const v8 s02 = g[0] + g[2];
  u[0] = splat(0.25f) * g[0];
  u[1] = -sixth * (s02 + g[1]);
  u[2] = -sixth * (s02 - g[1]);
  const v8 a = splat(1.0f / 24.0f) * g[0] + splat(1.0f / 6.0f) * g[2];
  const v8 b = splat(1.0f / 12.0f) * g[1];
  u[3] = a + b;
  u[4] = a - b;
  u[5] = g[2];
}

// G^T applied to 6 transform-domain values: r = G^T s (3 filter taps).
DP_INLINE void gt6(const v8 s[6], v8 r[3]) {
  const v8 s12 = s[1] + s[2], s34 = s[3] + s[4];
  r[0] = splat(0.25f) * s[0] - splat(1.0f / 6.0f) * s12 + splat(1.0f / 24.0f) * s34;
  r[1] = splat(1.0f / 6.0f) * (s[2] - s[1]) + splat(1.0f / 12.0f) * (s[3] - s[4]);
  r[2] = splat(1.0f / 6.0f) * (s34 - s12) + s[5];
}

// Where one image's activations sit: channels last (NHWC: element (c, h, w) at h * row + w * C
// + c), or planes (NCHW: at c * plane + h * row + w).
struct ImageLayout {
  bool channels_last;
  int64_t plane, row;
};
ImageLayout layout_of(Layout layout, int64_t c, int64_t h, int64_t w) {
  if (layout == Layout::nhwc) return {true, 0, w * c};
  return {false, h * w, w};
}

// Rows [first, first + rows) of one image x (C, H, W) placed at rows and columns offset by
// `top` in a zero background (WB columns), channels last -> buf (rows, WB, C). top = 1 gives an
// input its one-pixel zero border; top = 0 zero-fills an output gradient up to whole tiles.
DP_CPU_LOOPS void to_channels_last(const float* __restrict x, ImageLayout il, int64_t c, int64_t h,
                                   int64_t w, int64_t top, int64_t first, int64_t rows, int64_t wb,
                                   float* __restrict buf) {
  const int64_t row = wb * c;
  for (int64_t i = 0; i < rows; ++i) {
    float* out = buf + i * row;
    const int64_t ih = first + i - top;
    if (ih < 0 || ih >= h) {
      std::memset(out, 0, static_cast<size_t>(row) * sizeof(float));
      continue;
    }
    std::memset(out, 0, static_cast<size_t>(top * c) * sizeof(float));
    std::memset(out + (top + w) * c, 0, static_cast<size_t>((wb - top - w) * c) * sizeof(float));
    float* interior = out + top * c;
    const float* src = x + ih * il.row;
    if (il.channels_last) {
      std::memcpy(interior, src, static_cast<size_t>(w * c) * sizeof(float));
      continue;
    }
    // NCHW: a (C, W) -> (W, C) transpose of the row, 8 channels at a time.
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      for (int64_t j = 0; j < w; ++j) {
        float* d = interior + j * c + ch;
        for (int64_t l = 0; l < kLanes; ++l) d[l] = src[(ch + l) * il.plane + j];
      }
    }
    for (; ch < c; ++ch)
      for (int64_t j = 0; j < w; ++j) interior[j * c + ch] = src[ch * il.plane + j];
  }
}

// buf (rows, WB, K) channels last -> rows [first, first + rows) of one image y (K, P, Q) in its
// layout, columns [0, Q) of buf (the rest is the last tile's overhang).
DP_CPU_LOOPS void from_channels_last(const float* __restrict buf, int64_t k, int64_t first,
                                     int64_t rows, int64_t q, int64_t wb, ImageLayout il,
                                     float* __restrict y) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = buf + i * wb * k;
    float* dst = y + (first + i) * il.row;
    if (il.channels_last) {
      std::memcpy(dst, row, static_cast<size_t>(q * k) * sizeof(float));
      continue;
    }
    int64_t ch = 0;
    for (; ch + kLanes <= k; ch += kLanes) {
      for (int64_t j = 0; j < q; ++j) {
        const float* s = row + j * k + ch;
        for (int64_t l = 0; l < kLanes; ++l) dst[(ch + l) * il.plane + j] = s[l];
      }
    }
    for (; ch < k; ++ch)
      for (int64_t j = 0; j < q; ++j) dst[ch * il.plane + j] = row[j * k + ch];
  }
}

// The input transform of one row of TW tiles: buf (6, 4*TW + 2, C) channels last ->
// v[point * pstride + tile * C + c] for the row's tiles 0..TW-1. C is a multiple of kLanes.
DP_CPU_LOOPS void input_tiles(const float* __restrict buf, int64_t c, int64_t tw,
                              float* __restrict v, int64_t pstride) {
  const int64_t wb = kTile * tw + 2, row = wb * c;
  for (int64_t tj = 0; tj < tw; ++tj) {
    const float* src = buf + kTile * tj * c;
    float* dst = v + tj * c;
    for (int64_t ch = 0; ch < c; ch += kLanes) {
      v8 t[kAlpha][kAlpha];  // t[i][j]: B^T applied down column j, row i
      for (int j = 0; j < kAlpha; ++j) {
        v8 d[kAlpha], o[kAlpha];
        for (int i = 0; i < kAlpha; ++i) d[i] = load8(src + i * row + j * c + ch);
        bt6(d, o);
        for (int i = 0; i < kAlpha; ++i) t[i][j] = o[i];
      }
      for (int i = 0; i < kAlpha; ++i) {
        v8 o[kAlpha];
        bt6(t[i], o);
        for (int j = 0; j < kAlpha; ++j) store8(dst + (i * kAlpha + j) * pstride + ch, o[j]);
      }
    }
  }
}

// The transform of TH rows of TW 4x4 tiles of an output gradient: buf (4*TH, 4*TW, K) channels
// last -> w[point * pstride + tile * K + k].
DP_CPU_LOOPS void gradient_tiles(const float* __restrict buf, int64_t k, int64_t th, int64_t tw,
                                 float* __restrict w, int64_t pstride) {
  const int64_t row = kTile * tw * k;
  for (int64_t ti = 0; ti < th; ++ti) {
    for (int64_t tj = 0; tj < tw; ++tj) {
      const float* src = buf + kTile * ti * row + kTile * tj * k;
      float* dst = w + (ti * tw + tj) * k;
      for (int64_t ch = 0; ch < k; ch += kLanes) {
        v8 t[kAlpha][kTile];  // t[i][j]: A applied down column j
        for (int j = 0; j < kTile; ++j) {
          v8 e[kTile], o[kAlpha];
          for (int i = 0; i < kTile; ++i) e[i] = load8(src + i * row + j * k + ch);
          a4(e, o);
          for (int i = 0; i < kAlpha; ++i) t[i][j] = o[i];
        }
        for (int i = 0; i < kAlpha; ++i) {
          v8 o[kAlpha];
          a4(t[i], o);
          for (int j = 0; j < kAlpha; ++j) store8(dst + (i * kAlpha + j) * pstride + ch, o[j]);
        }
      }
    }
  }
}

// The output transform of TH rows of TW tiles: m[point * pstride + tile * K + k] plus the bias
// (or none) -> buf (4*TH, 4*TW, K) channels last.
DP_CPU_LOOPS void output_tiles(const float* __restrict m, int64_t pstride, int64_t k, int64_t th,
                               int64_t tw, const float* __restrict bias, float* __restrict buf) {
  const int64_t row = kTile * tw * k;
  for (int64_t ti = 0; ti < th; ++ti) {
    for (int64_t tj = 0; tj < tw; ++tj) {
      const float* src = m + (ti * tw + tj) * k;
      float* dst = buf + kTile * ti * row + kTile * tj * k;
      for (int64_t ch = 0; ch < k; ch += kLanes) {
        v8 t[kTile][kAlpha];  // t[i][j]: A^T applied down column j
        for (int j = 0; j < kAlpha; ++j) {
          v8 s[kAlpha], o[kTile];
          for (int i = 0; i < kAlpha; ++i) s[i] = load8(src + (i * kAlpha + j) * pstride + ch);
          at6(s, o);
          for (int i = 0; i < kTile; ++i) t[i][j] = o[i];
        }
        const v8 b = bias ? load8(bias + ch) : splat(0.0f);
        for (int i = 0; i < kTile; ++i) {
          v8 o[kTile];
          at6(t[i], o);
          for (int j = 0; j < kTile; ++j) store8(dst + i * row + j * k + ch, o[j] + b);
        }
      }
    }
  }
}

// G g G^T of one 3x3 filter for 8 lanes: g[r*3+s] -> u[point].
DP_INLINE void filter_transform(const v8 g[9], v8 u[kPoints]) {
  v8 t[kAlpha][3];  // G applied down each column s
  for (int s = 0; s < 3; ++s) {
    const v8 col[3] = {g[s], g[3 + s], g[6 + s]};
    v8 o[kAlpha];
    g3(col, o);
    for (int i = 0; i < kAlpha; ++i) t[i][s] = o[i];
  }
  for (int i = 0; i < kAlpha; ++i) {
    v8 o[kAlpha];
    g3(t[i], o);
    for (int j = 0; j < kAlpha; ++j) u[i * kAlpha + j] = o[j];
  }
}

// Filters w (K, C, 3, 3), rows [c_begin, c_end) of every point's matrix, 8 columns at a time:
//   forward        u[point][c][k] from w[k][c]                      (C x K matrices)
//   backward data  u[point][k][c] from w[k][c] turned by 180 degrees (K x C matrices)
// `rows` and `cols` are the matrices' sizes, so for backward data rows = K and cols = C.
DP_CPU_LOOPS void transform_filters(const float* __restrict w, int64_t c_total, int64_t k_total,
                                    bool backward_data, int64_t row_begin, int64_t row_end,
                                    float* __restrict u) {
  const int64_t rows = backward_data ? k_total : c_total;
  const int64_t cols = backward_data ? c_total : k_total;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      alignas(32) float taps[9][kLanes];
      for (int64_t l = 0; l < kLanes; ++l) {
        // forward: row c, column k; backward data: row k, column c, taps turned.
        const int64_t k = backward_data ? r : c0 + l, c = backward_data ? c0 + l : r;
        const float* f = w + (k * c_total + c) * 9;
        for (int t = 0; t < 9; ++t) taps[t][l] = f[backward_data ? 8 - t : t];
      }
      v8 g[9], out[kPoints];
      for (int t = 0; t < 9; ++t) g[t] = load8(taps[t]);
      filter_transform(g, out);
      for (int p = 0; p < kPoints; ++p) store8(u + (p * rows + r) * cols + c0, out[p]);
    }
  }
}

// dw[k][c] = G^T s[point][k][c] G for rows k in [k_begin, k_end), 8 channels c at a time.
DP_CPU_LOOPS void filter_gradients(const float* __restrict s, int64_t c_total, int64_t k_total,
                                   int64_t k_begin, int64_t k_end, float* __restrict dw) {
  for (int64_t k = k_begin; k < k_end; ++k) {
    for (int64_t c0 = 0; c0 < c_total; c0 += kLanes) {
      v8 t[kAlpha][3];  // G^T applied along each row i
      for (int i = 0; i < kAlpha; ++i) {
        v8 row[kAlpha], o[3];
        for (int j = 0; j < kAlpha; ++j)
          row[j] = load8(s + ((i * kAlpha + j) * k_total + k) * c_total + c0);
        gt6(row, o);
        for (int x = 0; x < 3; ++x) t[i][x] = o[x];
      }
      alignas(32) float taps[9][kLanes];
      for (int x = 0; x < 3; ++x) {
        v8 col[kAlpha], o[3];
        for (int i = 0; i < kAlpha; ++i) col[i] = t[i][x];
        gt6(col, o);
        for (int r = 0; r < 3; ++r) store8(taps[r * 3 + x], o[r]);
      }
      for (int64_t l = 0; l < kLanes; ++l) {
        float* f = dw + (k * c_total + c0 + l) * 9;
        for (int t = 0; t < 9; ++t) f[t] = taps[t][l];
      }
    }
  }
}

// Adds the sums over rows [0, P) and columns [0, Q) of buf (P, WB, K) channels last to acc (K),
// through image (K): these rows' sums first, so that rounding grows with the rows of the batch
// and the pixels per row rather than with all the pixels of the batch.
DP_CPU_LOOPS void add_channel_sums(const float* __restrict buf, int64_t k, int64_t p, int64_t q,
                                   int64_t wb, float* __restrict image, float* __restrict acc) {
  std::fill(image, image + k, 0.0f);
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = 0; j < q; ++j) {
      const float* v = buf + (i * wb + j) * k;
#pragma omp simd
      for (int64_t ch = 0; ch < k; ++ch) image[ch] += v[ch];
    }
#pragma omp simd
  for (int64_t ch = 0; ch < k; ++ch) acc[ch] += image[ch];
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

class WinogradConvPlan final : public CpuConvPlan {
 public:
  WinogradConvPlan(const ConvGeometry& g, CpuKernels kernels, int threads,
                   std::shared_ptr<SharedScratch> shared)
      : CpuConvPlan(g, std::move(shared)), kernels_(kernels), threads_(threads) {
    const int64_t c = g.in_channels, k = g.out_channels, wide = std::max(c, k);
    th_ = (g.out_h() + kTile - 1) / kTile;
    tw_ = (g.out_w() + kTile - 1) / kTile;
    const int64_t tiles = th_ * tw_;
    // Both sides of the SGEMMs, V (T x Cin) then M (T x Cout): Cin + Cout = C + K channels in
    // every pass.
    const int64_t image_bytes = kPoints * tiles * (c + k) * int64_t{sizeof(float)};
    chunk_ = std::clamp<int64_t>(kChunkBytes / image_bytes, 1, g.max_batch);
    // The shared part: the transformed filters U (forward, backward data; kPoints C x K or K x C
    // matrices) or the filter gradient's sums S (backward filter), then V and M.
    tiles_offset_ = round_up(kPoints * c * k, kAlignFloats);
    shared_floats_ = tiles_offset_ + round_up(kPoints * chunk_ * tiles * (c + k), kAlignFloats);
    // Per thread, for one row of tiles: the channels-last input rows (6, 4*TW + 2), the output
    // or output-gradient rows (4, 4*TW), and the bias gradient's sums (K, then one row's K).
    in_rows_ = round_up(kAlpha * (kTile * tw_ + 2) * wide, kAlignFloats);
    out_rows_ = round_up(kTile * kTile * tw_ * wide, kAlignFloats);
    bias_sums_ = 2 * round_up(k, kAlignFloats);
    // Each point's product in row blocks when there are more threads than 36 points feed
    // evenly (up to 4 items per thread); whole products otherwise, the SGEMM's best shape.
    blocks_ = threads_ <= 4 ? 1 : (4 * threads_ + kPoints - 1) / kPoints;
    scratch_floats_ = shared_floats_ + threads_ * (in_rows_ + out_rows_ + bias_sums_);
  }

  /// One layout for every pass and batch size.
  size_t scratch_bytes(ConvStage) const override {
    return static_cast<size_t>(scratch_floats_) * sizeof(float);
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
               ConvScratch scratch) override {
    const ConvGeometry& g = geometry();
    convolve(x, w, b ? static_cast<const float*>(b->data) : nullptr, y, g.in_channels,
             g.out_channels, false, base(scratch, ConvStage::forward));
  }

  void backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx,
                     ConvScratch scratch) override {
    const ConvGeometry& g = geometry();
    convolve(dy, w, nullptr, dx, g.out_channels, g.in_channels, true,
             base(scratch, ConvStage::backward));
  }

  void backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor* db,
                       ConvScratch scratch) override;

  std::string implementation() const override {
    return std::string("dprun Winograd F(4x4, 3x3), ") +
           (kernels_ == CpuKernels::blas ? "OpenBLAS" : "oneDNN") + " SGEMM, " +
           std::to_string(chunk_) + " images per chunk";
  }

 private:
  /// Where a pass's scratch starts (the transformed filters or the filter gradient's sums).
  float* base(const ConvScratch& scratch, ConvStage stage) const {
    return reinterpret_cast<float*>(scratch_for(scratch, scratch_bytes(stage)));
  }
  float* in_rows(float* base, int t) const { return base + shared_floats_ + t * in_rows_; }
  float* out_rows(float* base, int t) const {
    return base + shared_floats_ + threads_ * in_rows_ + t * out_rows_;
  }
  float* bias_sums(float* base, int t) const {
    return base + shared_floats_ + threads_ * (in_rows_ + out_rows_) + t * bias_sums_;
  }

  /// out = conv(in, w') + bias with `cin` input and `cout` output channels, where w' is w for the
  /// forward and w turned, its channel axes swapped, for backward data; in the scratch at
  /// `base`.
  void convolve(const Tensor& in, const Tensor& w, const float* bias, const Tensor& out,
                int64_t cin, int64_t cout, bool backward_data, float* base);

  CpuKernels kernels_;
  int threads_;  // asked for; a parallel region may get fewer (OMP_DYNAMIC, OMP_THREAD_LIMIT)
  int64_t th_ = 0, tw_ = 0;  // tiles down and across an image
  int64_t chunk_ = 1;        // images per chunk
  int64_t blocks_ = 1;       // row blocks per point's SGEMM
  // In floats, in a pass's scratch: where V starts, the end of the part the threads share, and
  // the end of the threads' own buffers after it.
  int64_t tiles_offset_ = 0, shared_floats_ = 0, scratch_floats_ = 0;
  int64_t in_rows_ = 0, out_rows_ = 0, bias_sums_ = 0;  // each thread's buffers
};

// The transforms' work items are rows of tiles (image i of the chunk, tile row ti), so that any
// chunk, even one image, keeps every thread busy.
void WinogradConvPlan::convolve(const Tensor& in, const Tensor& w, const float* bias,
                                const Tensor& out, int64_t cin, int64_t cout, bool backward_data,
                                float* base) {
  const ConvGeometry& g = geometry();
  const int64_t n = in.shape[0], h = g.in_h, wd = g.in_w, tiles = th_ * tw_;
  const ImageLayout il = layout_of(g.layout, cin, h, wd), ol = layout_of(g.layout, cout, h, wd);
  const int64_t in_size = cin * h * wd, out_size = cout * h * wd;
  const int64_t c_total = g.in_channels, k_total = g.out_channels;
  float* const u = base;
  float* const v = base + tiles_offset_;
  const float* const x = static_cast<const float*>(in.data);
  float* const y = static_cast<float*>(out.data);
  const float* const filters = static_cast<const float*>(w.data);
  const int64_t wb_in = kTile * tw_ + 2, wb_out = kTile * tw_;
#pragma omp parallel num_threads(threads_)
  {
    const int me = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < cin; r += kLanes) {
      transform_filters(filters, c_total, k_total, backward_data, r, std::min(r + kLanes, cin), u);
    }
    for (int64_t n0 = 0; n0 < n; n0 += chunk_) {
      const int64_t images = std::min(chunk_, n - n0), t_count = images * tiles;
      const int64_t v_stride = t_count * cin, m_stride = t_count * cout;
      float* const m = v + kPoints * v_stride;
#pragma omp for schedule(static)
      for (int64_t item = 0; item < images * th_; ++item) {
        const int64_t i = item / th_, ti = item % th_;
        to_channels_last(x + (n0 + i) * in_size, il, cin, h, wd, 1, kTile * ti, kAlpha, wb_in,
                         in_rows(base, me));
        input_tiles(in_rows(base, me), cin, tw_, v + (i * tiles + ti * tw_) * cin, v_stride);
      }
      const int64_t rows = (t_count + blocks_ - 1) / blocks_;  // of M_p per work item
#pragma omp for schedule(static)
      for (int64_t item = 0; item < kPoints * blocks_; ++item) {
        const int64_t p = item / blocks_, r0 = item % blocks_ * rows;
        if (r0 >= t_count) continue;
        sgemm(kernels_, false, false, std::min(rows, t_count - r0), cout, cin, 1.0f,
              v + p * v_stride + r0 * cin, cin, u + p * cin * cout, cout, 0.0f,
              m + p * m_stride + r0 * cout, cout);
      }
#pragma omp for schedule(static)
      for (int64_t item = 0; item < images * th_; ++item) {
        const int64_t i = item / th_, ti = item % th_;
        output_tiles(m + (i * tiles + ti * tw_) * cout, m_stride, cout, 1, tw_, bias,
                     out_rows(base, me));
        from_channels_last(out_rows(base, me), cout, kTile * ti, std::min(kTile, h - kTile * ti),
                           wd, wb_out, ol, y + (n0 + i) * out_size);
      }
    }
  }
}

void WinogradConvPlan::backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw,
                                       const Tensor* db, ConvScratch scratch) {
  float* const scratch_base = base(scratch, ConvStage::backward);
  const ConvGeometry& g = geometry();
  const int64_t n = x.shape[0], h = g.in_h, wd = g.in_w, tiles = th_ * tw_;
  const int64_t c = g.in_channels, k = g.out_channels;
  const ImageLayout xl = layout_of(g.layout, c, h, wd), dyl = layout_of(g.layout, k, h, wd);
  const int64_t x_size = c * h * wd, dy_size = k * h * wd;
  float* const s = scratch_base;
  float* const v = scratch_base + tiles_offset_;
  const float* const xs = static_cast<const float*>(x.data);
  const float* const dys = static_cast<const float*>(dy.data);
  const int64_t wb_in = kTile * tw_ + 2, wb_out = kTile * tw_;
#pragma omp parallel num_threads(threads_)
  {
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
    if (db) std::fill(bias_sums(scratch_base, me), bias_sums(scratch_base, me) + k, 0.0f);
    for (int64_t n0 = 0; n0 < n; n0 += chunk_) {
      const int64_t images = std::min(chunk_, n - n0), t_count = images * tiles;
      const int64_t v_stride = t_count * c, w_stride = t_count * k;
      float* const gw = v + kPoints * v_stride;  // the transformed output gradient, T x K
#pragma omp for schedule(static)
      for (int64_t item = 0; item < images * th_; ++item) {
        const int64_t i = item / th_, ti = item % th_;
        to_channels_last(xs + (n0 + i) * x_size, xl, c, h, wd, 1, kTile * ti, kAlpha, wb_in,
                         in_rows(scratch_base, me));
        input_tiles(in_rows(scratch_base, me), c, tw_, v + (i * tiles + ti * tw_) * c, v_stride);
        to_channels_last(dys + (n0 + i) * dy_size, dyl, k, h, wd, 0, kTile * ti, kTile, wb_out,
                         out_rows(scratch_base, me));
        gradient_tiles(out_rows(scratch_base, me), k, 1, tw_, gw + (i * tiles + ti * tw_) * k,
                       w_stride);
        if (db) {
          add_channel_sums(out_rows(scratch_base, me), k, std::min(kTile, h - kTile * ti), wd,
                           wb_out, bias_sums(scratch_base, me) + bias_sums_ / 2,
                           bias_sums(scratch_base, me));
        }
      }
      const int64_t rows = (k + blocks_ - 1) / blocks_;  // of S_p per work item
#pragma omp for schedule(static)
      for (int64_t item = 0; item < kPoints * blocks_; ++item) {
        const int64_t p = item / blocks_, r0 = item % blocks_ * rows;
        if (r0 >= k) continue;
        sgemm(kernels_, true, false, std::min(rows, k - r0), c, t_count, 1.0f,
              gw + p * w_stride + r0, k, v + p * v_stride, c, n0 == 0 ? 0.0f : 1.0f,
              s + p * k * c + r0 * c, c);
      }
    }
#pragma omp for schedule(static)
    for (int64_t k0 = 0; k0 < k; k0 += kLanes) {
      filter_gradients(s, c, k, k0, std::min(k0 + kLanes, k), static_cast<float*>(dw.data));
    }
    if (db) {  // over the threads the region got, which may be fewer than asked
#pragma omp for schedule(static)
      for (int64_t ch = 0; ch < k; ++ch) {
        float sum = 0.0f;
        for (int t = 0; t < team; ++t) sum += bias_sums(scratch_base, t)[ch];
        static_cast<float*>(db->data)[ch] = sum;
      }
    }
  }
}

}  // namespace

bool winograd_applies(const ConvGeometry& g) {
  return g.dtype == DType::f32 && g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 &&
         g.stride_w == 1 && g.pad_h == 1 && g.pad_w == 1 && g.in_channels % kLanes == 0 &&
         g.out_channels % kLanes == 0;
}

std::unique_ptr<CpuConvPlan> make_winograd_plan(const ConvGeometry& g, CpuKernels kernels,
                                                int threads,
                                                std::shared_ptr<SharedScratch> shared) {
  DP_CHECK(winograd_applies(g),
           "cpu backend: the Winograd F(4x4, 3x3) convolution needs a 3x3 "
           "stride-1 pad-1 f32 layer with channels in multiples of 8, not " +
               g.str());
  return std::make_unique<WinogradConvPlan>(g, kernels, threads, std::move(shared));
}

}  // namespace dp::cpu
