// Batch gathering on the CPU: u8 images of a resident dataset -> f32 in [0, 1], in NCHW or NHWC.
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

// images (M,C,H,W) u8, labels (M) u8, indices (n) i32 -> x (n,C,H,W) f32 = image / 255 in
// x.layout, y (n) i32 = label.
void CpuBackend::gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices,
                              const Tensor& x, const Tensor& y) {
  const char* op = "gather_batch";
  expect_dtype(images, DType::u8, op, "images");
  expect_dtype(labels, DType::u8, op, "labels");
  expect_dtype(indices, DType::i32, op, "indices");
  expect_dtype(x, DType::f32, op, "x");
  expect_dtype(y, DType::i32, op, "y");
  expect_nchw(images, op, "images");
  if (images.shape.rank != 4) {
    DP_THROW("cpu backend: gather_batch: images has shape " + images.shape.str() +
             ", expected (M, C, H, W)");
  }
  const int64_t m = images.shape[0], c = images.shape[1], h = images.shape[2], w = images.shape[3];
  expect_shape(labels, Shape{m}, op, "labels");
  if (indices.shape.rank != 1) {
    DP_THROW("cpu backend: gather_batch: indices has shape " + indices.shape.str() +
             ", expected (n)");
  }
  const int64_t n = indices.shape[0];
  expect_shape(x, Shape{n, c, h, w}, op, "x");
  expect_shape(y, Shape{n}, op, "y");
  if (n == 0) return;
  for (const Tensor* t : {&images, &labels, &indices, &x, &y})
    expect_not_null(t->data, op, "a tensor");
  const int32_t* index = indices.i32();
  for (int64_t i = 0; i < n; ++i) {
    if (index[i] < 0 || index[i] >= m) {
      DP_THROW("cpu backend: gather_batch: indices[" + std::to_string(i) +
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
