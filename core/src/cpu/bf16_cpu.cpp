// Emulated bf16 on the cpu backend: the rounding loops and the scratch copies (bf16_cpu.hpp).
#include "cpu/bf16_cpu.hpp"

#include <omp.h>

#include "dp/bf16.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

constexpr size_t kAlignment = 256;
size_t aligned_floats(int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

DP_CPU_LOOPS void round_range(const float* __restrict src, float* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = dp::round_to_bf16(src[i]);
}

DP_CPU_LOOPS void round_range_in_place(float* p, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] = dp::round_to_bf16(p[i]);
}

}  // namespace

void round_to_bf16(int threads, const float* src, float* dst, int64_t n) {
  const int team = threads_for(n, threads);
#pragma omp parallel num_threads(team)
  {
    int64_t begin, end;
    split_range(n, omp_get_num_threads(), omp_get_thread_num(), begin, end);
    round_range(src + begin, dst + begin, end - begin);
  }
}

void round_to_bf16_in_place(int threads, float* p, int64_t n) {
  const int team = threads_for(n, threads);
#pragma omp parallel num_threads(team)
  {
    int64_t begin, end;
    split_range(n, omp_get_num_threads(), omp_get_thread_num(), begin, end);
    round_range_in_place(p + begin, end - begin);
  }
}

size_t OperandCopies::bytes_for(int64_t a, int64_t b, int64_t c) {
  return aligned_floats(a) + aligned_floats(b) + aligned_floats(c);
}

float* OperandCopies::carve(int64_t n) {
  auto* copy = reinterpret_cast<float*>(data_ + used_);
  used_ += aligned_floats(n);
  // The scratch was reserved for this pass (CpuBackend grows it before carving copies, or the
  // caller's workspace was checked against the plan's need).
  DP_ASSERT(used_ <= bytes_);
  return copy;
}

Tensor OperandCopies::rounded(const Tensor& t) {
  Tensor copy = t;
  copy.data = carve(t.numel());
  round_to_bf16(threads_, t.f32(), copy.f32(), t.numel());
  return copy;
}

Tensor OperandCopies::filter(const Tensor& w, bool round) {
  if (w.layout == Layout::nchw) return round ? rounded(w) : w;
  Tensor copy = room_nchw(w);
  transpose_filter(w.f32(), copy.f32(), w.shape, true, round);
  return copy;
}

Tensor OperandCopies::room_nchw(const Tensor& t) {
  Tensor room = t;
  room.data = carve(t.numel());
  room.layout = Layout::nchw;
  return room;
}

void transpose_filter(const float* src, float* dst, const Shape& shape, bool nhwc_to_nchw,
                      bool round) {
  // Filters are small beside activations (ResNet-18's largest: 2.4 M values): one thread.
  const int64_t k = shape[0], c = shape[1], rs = shape[2] * shape[3];
  for (int64_t o = 0; o < k; ++o) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t t = 0; t < rs; ++t) {
        const int64_t nchw = (o * c + ch) * rs + t, nhwc = (o * rs + t) * c + ch;
        const float v = src[nhwc_to_nchw ? nhwc : nchw];
        dst[nhwc_to_nchw ? nchw : nhwc] = round ? dp::round_to_bf16(v) : v;
      }
    }
  }
}

}  // namespace dp::cpu
