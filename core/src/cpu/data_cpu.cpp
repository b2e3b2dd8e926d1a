// Batch gathering on the CPU: u8 images of a resident dataset -> f32 in [0, 1], in NCHW or NHWC.
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

// images (M,C,H,W) u8, labels (M) u8, indices (n) i32 -> x (n,C,H,W) f32 = image / 255 in
// x.layout, y (n) i32 = label.
void CpuBackend::gather_batch_impl(const Tensor& images, const Tensor& labels,
                                   const Tensor& indices, const Tensor& x, const Tensor& y,
                                   const StepRow* start) {
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

}  // namespace dp::cpu
