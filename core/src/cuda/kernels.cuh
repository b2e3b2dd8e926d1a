#pragma once
// Host launchers of the backend's own kernels (elementwise.cu, pool.cu, loss.cu). Plain C++
// declarations so the cuDNN/cuBLAS side (compiled by the host compiler) can call them. Every
// launcher enqueues on `stream`, checks the launch and never synchronises. Activations are
// logical (N, C, H, W); `nhwc` says the memory order.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dp::cuda::kernels {

/// A per-step value in device memory (dp::StepRow), read by the kernel when it runs:
/// table[(*cursor) * width + column]. A null table: none (the launcher's host value is used).
struct DeviceRow {
  const void* table = nullptr;
  const int32_t* cursor = nullptr;
  int64_t rows = 0, width = 1;
};

/// Tests only: the kernels that index in 32 bits where a tensor allows it (launch.cuh's
/// fits_int32: pooling, the filter transposes, the bias add, the batch norm applies) take their
/// 64-bit path, which otherwise only tensors of over 2^31 values reach.
inline bool force_wide_indices = false;

/// cursor (1) i32 += 1 (one thread).
void advance(int32_t* cursor, cudaStream_t stream);

// ---- elementwise (elementwise.cu) -----------------------------------------------------------
/// p[0..n) = value.
void fill_f32(float* p, int64_t n, float value, cudaStream_t stream);
void fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t stream);
/// y = max(x, 0); y may alias x.
void relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
/// dx = y > 0 ? dy : 0; dx may alias dy.
void relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);
/// y = a + alpha * b (alpha = 1: exactly a + b); y may alias a or b.
void add(const float* a, const float* b, float* y, int64_t n, float alpha, cudaStream_t stream);
/// The same with a and b each fp32 or packed bf16 (a_bf16, b_bf16: widened exactly as read, so
/// the sum is that of the widened tensors); y fp32, aliasing an fp32 operand or neither.
void add(const void* a, bool a_bf16, const void* b, bool b_bf16, float* y, int64_t n, float alpha,
         cudaStream_t stream);
/// t *= alpha.
void scale(float* t, int64_t n, float alpha, cudaStream_t stream);
/// y (N,C,HW) += b (C) broadcast over n and hw. A row-major (N, C) matrix is nhwc with hw = 1.
/// relu: then max(., 0) in the same pass (relu_forward's values: a fused ReLU).
void bias_add(float* y, const float* b, int64_t n, int64_t c, int64_t hw, bool nhwc,
              cudaStream_t stream, bool relu = false);
/// y = round_to_bf16(y + b) in one pass (precision bf16: the bias joins the fp32 sum before the
/// output's one rounding, as on the cpu backend); relu: that value's ReLU.
void bias_add_round_bf16(float* y, const float* b, int64_t n, int64_t c, int64_t hw, bool nhwc,
                         cudaStream_t stream, bool relu = false);
/// y = round_to_bf16(x) elementwise, dp::round_bits_to_bf16's bits; y may alias x.
void round_to_bf16(const float* x, float* y, int64_t n, cudaStream_t stream);
/// y = the bf16 nearest to x, packed (2 bytes: dp::round_bits_to_bf16's high half), as cuDNN's
/// and cuBLAS's bf16 operands take it.
void to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
/// y = x (packed bf16) widened to fp32, exactly.
void from_bf16(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);

/// Row-groups of the two-level channel reduction (at most; one per 256 values of a channel);
/// `partial` must hold kChannelSumGroups * c floats.
constexpr int kChannelSumGroups = 256;
/// out (C) = sum over n and hw of x (N,C,HW), in a fixed order (deterministic). With
/// partial == nullptr one pass without scratch (fine for small inputs, e.g. linear bias grads);
/// else a two-level reduction through partial (kChannelSumGroups * C floats). round_bf16: each
/// value rounded to bf16 before it joins the sum (the sum of x's bf16 copy, without the copy).
/// relu_y: a fused ReLU's backward in the same pass: each value is x where relu_y > 0, else 0
/// (relu_backward's), written to `masked` (which may alias x) and summed: the bits of
/// relu_backward then channel_sum of its output.
void channel_sum(const float* x, float* out, int64_t n, int64_t c, int64_t hw, bool nhwc,
                 float* partial, cudaStream_t stream, bool round_bf16 = false,
                 const float* relu_y = nullptr, float* masked = nullptr);

/// Filter layouts: (K, C, R*S) <-> (K, R*S, C), for cuDNN's all-NHWC configuration. round_bf16:
/// each value written as its nearest bf16 (round_to_bf16's values), in the same pass.
void kcrs_to_krsc(const float* in, float* out, int64_t k, int64_t c, int64_t rs,
                  cudaStream_t stream, bool round_bf16 = false);
void krsc_to_kcrs(const float* in, float* out, int64_t k, int64_t c, int64_t rs,
                  cudaStream_t stream);
/// kcrs_to_krsc with each value packed as bf16 (to_bf16's bits), in one pass.
void kcrs_to_krsc_bf16(const float* in, uint16_t* out, int64_t k, int64_t c, int64_t rs,
                       cudaStream_t stream);
/// krsc_to_kcrs from packed bf16 values, widened (from_bf16's values), in one pass.
void krsc_bf16_to_kcrs(const uint16_t* in, float* out, int64_t k, int64_t c, int64_t rs,
                       cudaStream_t stream);

/// The rows a 1x1 convolution of stride (sh, sw) reads from an NHWC (n, h, w, c): out is
/// (n, ho, wo, c) with out(b, i, j) = x(b, i * sh, j * sw), each value rounded to bf16 when
/// round_bf16 (round_to_bf16's values).
void subsample_nhwc(const float* x, float* out, int64_t n, int64_t h, int64_t w, int64_t c,
                    int64_t sh, int64_t sw, int64_t ho, int64_t wo, bool round_bf16,
                    cudaStream_t stream);

// ---- convolutions of few input channels, channels-last (conv_small.cu) ---------------------
/// x (n, h, w, c) NHWC, filter (k, c, r, s) in (k, c, r, s) or (k, r, s, c) order (filter_krsc),
/// y (n, out_h, out_w, k) NHWC.
struct SmallConv {
  int64_t n = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  int c = 0, k = 0, r = 0, s = 0;
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool filter_krsc = false;  // w and dw stored (K, R, S, C) (ConvUse::filter_layout nhwc)
};
constexpr int kSmallConvMaxChannels = 4;              // c
constexpr int kSmallConvMaxTaps = 36;                 // c * r * s: registers of the filter gradient
constexpr int kSmallConvMaxFilter = 8192;             // k * c * r * s: the forward's shared memory
/// The filter gradient's first level: a block per 128 positions, at most 1024 blocks. Each
/// thread runs a serial loop over its positions, bound by memory latency: 512 positions a block
/// gave ResNet-18's first layer at batch 256 (200704 positions) 392 blocks, each thread 128
/// iterations (261 us on an H200 at 815ecd3, for 26 MB of dy); 128 give 1024 blocks and 49
/// iterations, LeNet's first layer (173056 positions) 1024 blocks instead of 338. How many run
/// at once is bound by registers (ptxas, sm_90, 256-thread blocks): 64 a thread for 9 taps, 4
/// blocks an SM, 528 on an H200's 132 SMs, so 1024 blocks are about two waves; 156 and 249 for
/// 27 and 36 taps (3-channel input), one block an SM. Not yet timed on a GPU.
constexpr int64_t kSmallConvPositionsPerBlock = 128;
constexpr int64_t kSmallConvMaxBlocks = 1024;
/// Whether the passes below take this shape (c <= 4, k <= 256, c * r * s <= 36, the filter
/// <= 8192 values, x and y of n examples under 2^31 values each: they index in 32 bits).
bool small_conv_fits(const SmallConv& g);
/// y = the convolution of x with w, each product's operands rounded to bf16 when round_bf16
/// (the fp32 sum of bf16 products, as cuDNN's bf16 kernels take them); no bias. Each output an
/// fp32 sum in the filter's (c, r, s) order.
void small_conv_forward(const float* x, const float* w, float* y, const SmallConv& g,
                        bool round_bf16, cudaStream_t stream);
/// The blocks of small_conv_filter's first level: a function of the shape alone, so its sums
/// are added in the same order on every device.
int64_t small_conv_filter_blocks(const SmallConv& g);
/// Scratch floats small_conv_filter needs (one partial filter per block).
size_t small_conv_filter_scratch_floats(const SmallConv& g);
/// dw (k, c, r, s) (stored so, or (k, r, s, c) with filter_krsc; the same sums either way) = sum
/// over the n * out_h * out_w positions of dy * x (overwritten, not
/// accumulated): per block a fixed range of positions, then the blocks in order
/// (deterministic). round_bf16: x and dy rounded to bf16 as they are read, and each dw value
/// rounded to bf16 once (precision bf16's filter gradient). A packed bf16 dy (a batch norm's
/// dx, rounded already) is widened as it is read, with the same result.
void small_conv_filter(const float* x, const float* dy, float* dw, const SmallConv& g,
                       float* scratch, bool round_bf16, cudaStream_t stream);
void small_conv_filter(const float* x, const uint16_t* dy, float* dw, const SmallConv& g,
                       float* scratch, bool round_bf16, cudaStream_t stream);

/// PyTorch SGD over flat buffers (optimizer.cu): d = g + wd * p; buf = momentum * buf + d (when
/// buf); p -= lr * (buf, or d + momentum * buf with Nesterov, or d). grads are not modified.
/// With lr_row.table (width 1) the learning rate is read from it (NaN for a cursor outside it).
/// packed (or null): the updated params rounded to bf16, packed (to_bf16's bits), in the same
/// pass.
void sgd_update(float* params, const float* grads, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, bool nesterov, DeviceRow lr_row,
                uint16_t* packed, cudaStream_t stream);
/// PyTorch AdamW over flat buffers, with the step's scalars computed on the host: step_size =
/// lr / (1 - beta1^t), decay = 1 - lr * wd, bias2_sqrt = sqrt(1 - beta2^t); or read from
/// step_row (width 3, in that order) when it has a table. packed: as sgd_update's.
void adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                  float step_size, float decay, float beta1, float beta2, float eps,
                  float bias2_sqrt, DeviceRow step_row, uint16_t* packed, cudaStream_t stream);

/// A gather's transform (dp::GatherTransform) as a kernel takes it, by value.
constexpr int kMaxNormChannels = 16;  // dp::kMaxNormaliseChannels (dp/augment.hpp)
struct GatherAugment {
  bool active = false;            // false: x = image / 255, nothing else
  int64_t pad = 0;                // crop padding P
  const int32_t* draws = nullptr;  // parallel to indices; null: centre crop, no flip
  int channels = 0;               // normalised channels: 0 (none) or C
  float mean[kMaxNormChannels] = {};
  float std[kMaxNormChannels] = {};
};

/// images (M,C,H,W) u8, labels (M) u8, indices (n) i32 -> x (n,C,H,W) f32 = image / 255 in the
/// given layout, y (n) i32. An index outside [0, M) writes NaN images and label -1 (visible, as
/// a kernel cannot throw). With start.table (i32, width 1) the rows are indices[start ..
/// start + n) of a buffer of index_count entries; a window outside it is marked the same way.
/// With aug.active each example is cropped, flipped and normalised (dp/augment.hpp), its draw
/// read at its index's row; a draw with an offset outside [0, 2P] gives a NaN image.
void gather_batch(const uint8_t* images, const uint8_t* labels, int64_t m, const int32_t* indices,
                  int64_t index_count, DeviceRow start, int64_t n, int64_t c, int64_t h, int64_t w,
                  bool nhwc, const GatherAugment& aug, float* x, int32_t* y, cudaStream_t stream);

/// The most replicas the same-device allreduce sums in one kernel.
constexpr int kMaxSameDeviceRanks = 16;
struct RankPointers {
  float* p[kMaxSameDeviceRanks];
  int count;
};
/// For i in [begin, end): s = p[0][i] + p[1][i] + ... (rank order); every p[r][i] = s.
void sum_across_ranks(const RankPointers& ranks, int64_t begin, int64_t end, cudaStream_t stream);

// ---- synchronised batch norm (bn_sync.cu); x (N,C,HW) in `nhwc` or NCHW order -----------------
// x, and dx, of x's type, are fp32 (T = float) or packed bf16 (T = uint16_t: load_f32, store_f32),
// and so is y, of its own type Y (a bf16 y holds the epilogue's output rounded); everything else
// is fp32.
/// out (C) = sum x, or sum (x - mean)^2 when mean is given (deterministic).
template <typename T>
void bn_sums(const T* x, const float* mean, float* out, int64_t n, int64_t c, int64_t hw, bool nhwc,
             cudaStream_t stream);
/// save_mean, save_invstd, running statistics from the global mean and biased var over `count`
/// values (the running mean plus momentum * conv_bias where that is given: the folded bias x
/// lacks); y = relu?(gamma * (x - mean) * invstd + beta (+ residual)), the epilogue in the same
/// pass (residual may be null, fp32 or, R = uint16_t, packed bf16; y must not alias x or
/// residual).
template <typename T, typename Y, typename R>
void bn_apply_stats(const T* x, const float* gamma, const float* beta, const float* mean,
                    const float* var, float* running_mean, float* running_var,
                    const float* conv_bias, float momentum, float eps, int64_t count,
                    float* save_mean, float* save_invstd, const R* residual, bool relu, Y* y,
                    int64_t n, int64_t c, int64_t hw, bool nhwc, cudaStream_t stream);
/// sums (2C) = [sum g, sum g * xhat]: g = dy, or with y (the ReLU epilogue's output) g = y > 0 ?
/// dy : 0, written to dz in the same pass (y and dz null without it). dy is fp32 (D = float),
/// or, with a bf16 y, packed bf16 (D = uint16_t), widened as it is read.
template <typename T, typename Y, typename D>
void bn_backward_sums(const T* x, const D* dy, const Y* y, float* dz, const float* save_mean,
                      const float* save_invstd, float* sums, int64_t n, int64_t c, int64_t hw,
                      bool nhwc, cudaStream_t stream);
/// dx = gamma * invstd / count * (count * dy - sums[0:C] - xhat * sums[C:2C]).
template <typename T>
void bn_backward_apply(const T* x, const float* dy, const float* gamma, const float* save_mean,
                       const float* save_invstd, const float* sums, int64_t count, T* dx, int64_t n,
                       int64_t c, int64_t hw, bool nhwc, cudaStream_t stream);

// ---- batch norm over channels-last activations (bn_nhwc.cu); x is rows = N*H*W rows of c ----
// x, and dx, of x's type, are fp32 (T = float) or packed bf16 (T = uint16_t: load_f32, store_f32),
// and so is y, of its own type Y (a bf16 y holds the epilogue's output rounded; the ReLU's mask
// is its sign), and the residual, of its own type R (a packed earlier output, widened as it is
// read); everything else is fp32.
/// Row groups of the two-level reductions: a function of the rows alone, so the sums are made in
/// the same order on every device.
int64_t bn_nhwc_groups(int64_t rows);
/// Scratch floats every bn_nhwc_* call of `rows` rows of `c` channels needs.
size_t bn_nhwc_scratch_floats(int64_t rows, int64_t c);
/// The counters the training calls of `c` channels need (one per tile of 32 channels: the last
/// block of a tile's reduction finalises it, see bn_nhwc.cu). They must be 0 before a call, and
/// are 0 after it; calls that share them must be in stream order (one stream: the counters of
/// concurrent calls would mix).
size_t bn_nhwc_counters(int64_t c);
/// Training: the batch's mean and biased variance, save_mean, save_invstd = 1/sqrt(var + eps),
/// the running statistics (PyTorch's update; the running mean plus momentum * conv_bias where
/// that is given: the folded convolution bias x lacks), and y = relu?((x - mean) * gamma * invstd
/// + beta (+ residual)). rows > 1. residual may be null; y must not alias x or residual.
template <typename T, typename Y, typename R>
void bn_nhwc_forward_train(const T* x, const float* gamma, const float* beta, float* running_mean,
                           float* running_var, const float* conv_bias, float momentum, float eps,
                           float* save_mean, float* save_invstd, const R* residual, bool relu, Y* y,
                           int64_t rows, int64_t c, float* scratch, unsigned* counters,
                           cudaStream_t stream);
/// Inference: y = relu?((x - mean) * gamma / sqrt(running_var + eps) + beta (+ residual)), mean
/// = running_mean, or running_mean - conv_bias where that is given (x lacks the folded bias).
/// rows may be 0.
template <typename T, typename Y, typename R>
void bn_nhwc_forward_infer(const T* x, const float* gamma, const float* beta,
                           const float* running_mean, const float* running_var,
                           const float* conv_bias, float eps, const R* residual, bool relu, Y* y,
                           int64_t rows, int64_t c, float* scratch, cudaStream_t stream);
/// Gradients of the training forward: with y (the epilogue's output, ReLU) the gradient taken is
/// g = y > 0 ? dy : 0, written to dz; else g = dy (y and dz null). dbeta = sum g, dgamma =
/// sum g xhat, dx = gamma invstd / M (M g - dbeta - xhat dgamma). dy is fp32 (D = float), or,
/// with a bf16 y, packed bf16 (D = uint16_t: the rounded gradient of a bf16 convolution that y
/// alone feeds), widened as it is read.
template <typename T, typename Y, typename D>
void bn_nhwc_backward(const T* x, const D* dy, const Y* y, float* dz, const float* gamma,
                      const float* save_mean, const float* save_invstd, T* dx, float* dgamma,
                      float* dbeta, int64_t rows, int64_t c, float* scratch, unsigned* counters,
                      cudaStream_t stream);

// ---- pooling (pool.cu) ----------------------------------------------------------------------
struct PoolShape {
  int64_t n, c, h, w;  // input
  int64_t p, q;        // output height, width
  int64_t kh, kw, sh, sw, ph, pw;
  bool nhwc;
};
/// Average pooling, divisor kh * kw (padding counted, PyTorch's count_include_pad).
void avgpool_forward(const PoolShape& s, const float* x, float* y, cudaStream_t stream);
void avgpool_backward(const PoolShape& s, const float* dy, float* dx, cudaStream_t stream);
/// Max pooling: padded positions never win; ties go to the first maximum in row-major window
/// order. Backward recomputes each window's winner from x (no index buffer, no atomics).
void maxpool_forward(const PoolShape& s, const float* x, float* y, cudaStream_t stream);
void maxpool_backward(const PoolShape& s, const float* x, const float* dy, float* dx,
                      cudaStream_t stream);
/// x (N,C,HW) -> y (N,C) mean over hw; backward dx = dy / hw.
void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t c, int64_t hw, bool nhwc,
                            cudaStream_t stream);
void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t c, int64_t hw,
                             bool nhwc, cudaStream_t stream);

// ---- loss (loss.cu) -------------------------------------------------------------------------
/// logits (N,K), labels (N) -> dlogits (N,K) = (softmax - onehot) * grad_scale,
/// loss_sum (1) = sum of -log softmax[label], correct (1) = #argmax == label (first max).
/// One block, rows spread over its warps in a fixed pattern: deterministic, no scratch.
/// dlogits and loss_sum may be null (count_correct). With a slot ((1) i32, read when the kernel
/// runs), loss_sum and correct are tables of `slots` rows and row slot[0] is written; a slot
/// outside them writes nothing. n may be 0 (zeros are written).
void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                           float grad_scale, float* dlogits, float* loss_sum, int32_t* correct,
                           const int32_t* slot, int64_t slots, cudaStream_t stream);

}  // namespace dp::cuda::kernels
