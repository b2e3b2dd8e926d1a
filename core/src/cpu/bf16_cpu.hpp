#pragma once
// The cpu backend's emulated bf16 arithmetic (dp::Precision::bf16): the multiplicands of a
// convolution or linear pass are copied into scratch rounded to bf16 (the fp32 tensors, master
// weights among them, are never modified), the pass runs in fp32 on the copies (products of
// bf16 values are exact in fp32, the accumulation is fp32, as in cuDNN's and cuBLAS's bf16
// paths), and its activation or input-gradient output is rounded to bf16 in place.
#include <cstddef>
#include <cstdint>

#include "cpu/cpu_backend.hpp"
#include "dp/tensor.hpp"

namespace dp::cpu {

/// dst[i] = round_to_bf16(src[i]) for i in [0, n); over `threads` threads when n is large.
void round_to_bf16(int threads, const float* src, float* dst, int64_t n);
/// p[i] = round_to_bf16(p[i]).
void round_to_bf16_in_place(int threads, float* p, int64_t n);

/// Carves copies of a pass's operands out of one scratch buffer, which is reserved at setup for
/// the largest pass (CpuBackend::plan_conv_impl, prepare_linear_impl) so the step loop allocates
/// nothing: bf16's rounded multiplicands, and a filter stored (K, R, S, C) (ConvUse::filter_layout
/// nhwc) as the (K, C, R, S) the convolution passes read, or room for its gradient in that order.
class OperandCopies {
 public:
  /// Bytes of scratch for copies of tensors with these element counts (each aligned).
  static size_t bytes_for(int64_t a, int64_t b = 0, int64_t c = 0);

  /// Copies start at the beginning of `scratch`, which holds at least bytes_for() of them.
  OperandCopies(SharedScratch& scratch, int threads)
      : OperandCopies(scratch.data(), scratch.size(), threads) {}
  /// Copies start at `data` (256-byte aligned), which holds `bytes`, at least bytes_for() of
  /// them (a convolution's planned workspace).
  OperandCopies(char* data, size_t bytes, int threads)
      : data_(data), bytes_(bytes), threads_(threads) {}
  /// A view of the same shape and layout as t on a copy of t rounded to bf16.
  Tensor rounded(const Tensor& t);
  /// A filter w (K, C, R, S) as the convolution passes read it: in (K, C, R, S) order (a copy
  /// when w is stored (K, R, S, C), Tensor::layout nhwc), rounded to bf16 when `round` (always a
  /// copy then). w itself when neither.
  Tensor filter(const Tensor& w, bool round);
  /// Room for a tensor of t's shape in (d0, d1, d2, d3) order (Layout::nchw), not filled.
  Tensor room_nchw(const Tensor& t);

 private:
  float* carve(int64_t n);
  char* data_;
  size_t bytes_;
  int threads_;
  size_t used_ = 0;
};

/// dst (d0, d1, d2, d3) order = src (d0, d2, d3, d1) order, rounded to bf16 when `round`:
/// a (K, R, S, C) filter as (K, C, R, S), or its inverse with nhwc_to_nchw = false.
void transpose_filter(const float* src, float* dst, const Shape& shape, bool nhwc_to_nchw,
                      bool round);

}  // namespace dp::cpu
