// Batch gathering on the CPU: u8 images of a resident dataset -> f32 in [0, 1], in NCHW or NHWC,
// cropped, flipped and normalised when a transform asks for it (dp/augment.hpp).
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/augment.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

// images (M,C,H,W) u8, labels (M) u8, indices (n) i32 -> x (n,C,H,W) f32 = image / 255 in
// x.layout, y (n) i32 = label.
void CpuBackend::gather_batch_impl(const Tensor& images, const Tensor& labels,
                                   const Tensor& indices, const Tensor& x, const Tensor& y,
                                   const StepRow* start, const GatherTransform* transform) {
  const int64_t m = images.shape[0], c = images.shape[1], h = images.shape[2], w = images.shape[3];
  const int64_t n = x.shape[0];
  int64_t first = 0;
  if (start != nullptr) {
    first = *step_row_at<int32_t>(*start, "gather_batch", "start");
    if (first < 0 || first + n > indices.shape[0]) {
      DP_THROW("cpu backend: gather_batch: rows [" + std::to_string(first) + ", " +
               std::to_string(first + n) + ") of the index buffer were asked for, but it holds " +
               std::to_string(indices.shape[0]) + " entries");
    }
  }
  const int32_t* index = indices.i32() + first;
  for (int64_t i = 0; i < n; ++i) {
    if (index[i] < 0 || index[i] >= m) {
      DP_THROW("cpu backend: gather_batch: indices[" + std::to_string(first + i) +
               "] = " + std::to_string(index[i]) + " is outside the dataset of " +
               std::to_string(m) + " examples");
    }
  }
  if (transform != nullptr) {
    gather_transformed(images, labels, index, first, x, y, *transform);
    return;
  }
  const uint8_t* ip = images.u8();
  const uint8_t* lp = labels.u8();
  float* xp = x.f32();
  int32_t* yp = y.i32();
  const int64_t hw = h * w, chw = c * h * w;
  const bool nhwc = x.layout == Layout::nhwc;
#pragma omp parallel for num_threads(threads_for(n* chw, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = ip + static_cast<int64_t>(index[i]) * chw;
    float* dst = xp + i * chw;
    if (nhwc) {
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t j = 0; j < hw; ++j) dst[j * c + ch] = src[ch * hw + j] / 255.0f;
    } else {
      for (int64_t j = 0; j < chw; ++j) dst[j] = src[j] / 255.0f;
    }
    yp[i] = lp[index[i]];
  }
}

// The transformed gather (dp/augment.hpp): example i is cropped at its draw's offsets from the
// image zero-padded by P, flipped when its draw says so, then (v / 255 - mean[c]) / std[c].
// index points at the window's first row; draws are read at the same rows.
void CpuBackend::gather_transformed(const Tensor& images, const Tensor& labels,
                                    const int32_t* index, int64_t first, const Tensor& x,
                                    const Tensor& y, const GatherTransform& t) {
  const int64_t c = images.shape[1], h = images.shape[2], w = images.shape[3];
  const int64_t n = x.shape[0], pad = t.crop_padding;
  const int32_t* draws = t.draws != nullptr ? t.draws->i32() + first : nullptr;
  for (int64_t i = 0; draws != nullptr && i < n; ++i) {
    if (draw_oy(draws[i]) > 2 * pad || draw_ox(draws[i]) > 2 * pad || draws[i] < 0) {
      DP_THROW("cpu backend: gather_batch: transform.draws[" + std::to_string(first + i) +
               "] = " + std::to_string(draws[i]) + " has a crop offset outside [0, " +
               std::to_string(2 * pad) + "] (crop padding " + std::to_string(pad) + ")");
    }
  }
  const bool normalise = !t.mean.empty();
  const uint8_t* ip = images.u8();
  const uint8_t* lp = labels.u8();
  float* xp = x.f32();
  int32_t* yp = y.i32();
  const bool nhwc = x.layout == Layout::nhwc;
#pragma omp parallel for num_threads(threads_for(n* c* h* w, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = ip + static_cast<int64_t>(index[i]) * c * h * w;
    const int32_t d = draws != nullptr ? draws[i] : pack_draw(pad, pad, false);
    const int64_t oy = draw_oy(d) - pad, ox = draw_ox(d) - pad;
    const bool flip = draw_flip(d);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t r = 0; r < h; ++r)
        for (int64_t col = 0; col < w; ++col) {
          const int64_t sr = r + oy, sc = (flip ? w - 1 - col : col) + ox;
          const bool inside = sr >= 0 && sr < h && sc >= 0 && sc < w;
          float v = (inside ? src[(ch * h + sr) * w + sc] : uint8_t{0}) / 255.0f;
          if (normalise) v = (v - t.mean[static_cast<size_t>(ch)]) / t.std[static_cast<size_t>(ch)];
          const int64_t at =
              nhwc ? ((i * h + r) * w + col) * c + ch : ((i * c + ch) * h + r) * w + col;
          xp[at] = v;
        }
    yp[i] = lp[index[i]];
  }
}

}  // namespace dp::cpu
