// Softmax cross-entropy (with its gradient and the correct count) and count_correct, in one block:
// for up to 32 classes a thread per row (softmax_xent_rows_kernel), else warp w handles rows w,
// w + 32, ...; each warp accumulates its rows in order and thread 0 adds the 32 warp totals in
// order. The result is deterministic and needs no scratch memory; a batch of a few thousand rows
// of a few classes is a few microseconds of work, so one block is enough.
#include <cmath>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels.cuh"
#include "cuda/launch.cuh"

namespace dp::cuda::kernels {
namespace {

constexpr int kLossWarps = 32;

__global__ void __launch_bounds__(kLossWarps * 32)
    softmax_xent_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                        float grad_scale, float* dlogits, float* loss_sum, int32_t* correct,
                        const int32_t* slot, int64_t slots) {
  __shared__ double warp_loss[kLossWarps];
  __shared__ int warp_correct[kLossWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double loss_acc = 0.0;
  int correct_acc = 0;
  for (int64_t row = warp; row < n; row += kLossWarps) {
    const float* x = logits + row * k;
    // First maximum: the smallest index among the largest values.
    float best = -INFINITY;
    int64_t best_index = k;
    for (int64_t j = lane; j < k; j += 32) {
      if (best_index == k || x[j] > best) {  // lanes visit j ascending: strict > keeps the first
        best = x[j];
        best_index = j;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_down_sync(0xffffffffu, best, offset);
      const int64_t other_index = __shfl_down_sync(0xffffffffu, best_index, offset);
      if (other_index < k &&
          (best_index == k || other > best || (other == best && other_index < best_index))) {
        best = other;
        best_index = other_index;
      }
    }
    best = __shfl_sync(0xffffffffu, best, 0);
    best_index = __shfl_sync(0xffffffffu, best_index, 0);
    float sum = 0.0f;
    for (int64_t j = lane; j < k; j += 32) sum += expf(x[j] - best);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int32_t label = labels[row];
    const bool valid = label >= 0 && label < k;
    if (dlogits != nullptr) {
      float* d = dlogits + row * k;
      for (int64_t j = lane; j < k; j += 32) {
        const float p = expf(x[j] - best) / sum;
        d[j] = (p - (j == label ? 1.0f : 0.0f)) * grad_scale;
      }
    }
    if (lane == 0) {
      // A label outside [0, K) cannot throw here: it makes the loss NaN, which the trainer sees.
      loss_acc += valid ? static_cast<double>(logf(sum) - (x[label] - best)) : NAN;
      correct_acc += (valid && best_index == label) ? 1 : 0;
    }
  }
  if (lane == 0) {
    warp_loss[warp] = loss_acc;
    warp_correct[warp] = correct_acc;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    int count = 0;
    for (int w = 0; w < kLossWarps; ++w) {
      total += warp_loss[w];
      count += warp_correct[w];
    }
    int64_t at = 0;
    if (slot != nullptr) {
      at = *slot;
      if (at < 0 || at >= slots) return;  // documented: a slot outside the tables writes nothing
    }
    if (loss_sum != nullptr) loss_sum[at] = static_cast<float>(total);
    correct[at] = count;
  }
}

// k <= kRowMaxClasses (10 classes, the common case): a thread per row, its classes visited in
// order. A warp per row left 22 of 32 lanes idle for 10 classes and spent its time in shuffles:
// LeNet's and ResNet-18's loss of 256 rows took 22-24 us a step on the H200 (815ecd3). Thread t
// takes rows t, t + 1024, ... in order; the threads' totals meet in a fixed pairwise tree.
constexpr int64_t kRowMaxClasses = 32;
constexpr int kRowThreads = 1024;

__global__ void __launch_bounds__(kRowThreads)
    softmax_xent_rows_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                             float grad_scale, float* dlogits, float* loss_sum, int32_t* correct,
                             const int32_t* slot, int64_t slots) {
  __shared__ double part_loss[kRowThreads];
  __shared__ int part_correct[kRowThreads];
  double loss_acc = 0.0;
  int correct_acc = 0;
  for (int64_t row = threadIdx.x; row < n; row += kRowThreads) {
    const float* x = logits + row * k;
    // First maximum: the smallest index among the largest values.
    float best = x[0];
    int64_t best_index = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (x[j] > best) {
        best = x[j];
        best_index = j;
      }
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += expf(x[j] - best);
    const int32_t label = labels[row];
    const bool valid = label >= 0 && label < k;
    if (dlogits != nullptr) {
      float* d = dlogits + row * k;
      for (int64_t j = 0; j < k; ++j) {
        const float p = expf(x[j] - best) / sum;
        d[j] = (p - (j == label ? 1.0f : 0.0f)) * grad_scale;
      }
    }
    // A label outside [0, K) cannot throw here: it makes the loss NaN, which the trainer sees.
    loss_acc += valid ? static_cast<double>(logf(sum) - (x[label] - best)) : NAN;
    correct_acc += (valid && best_index == label) ? 1 : 0;
  }
  part_loss[threadIdx.x] = loss_acc;
  part_correct[threadIdx.x] = correct_acc;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) {
      part_loss[threadIdx.x] += part_loss[threadIdx.x + stride];
      part_correct[threadIdx.x] += part_correct[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int64_t at = 0;
    if (slot != nullptr) {
      at = *slot;
      if (at < 0 || at >= slots) return;  // documented: a slot outside the tables writes nothing
    }
    if (loss_sum != nullptr) loss_sum[at] = static_cast<float>(part_loss[0]);
    correct[at] = part_correct[0];
  }
}

}  // namespace

void softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                           float grad_scale, float* dlogits, float* loss_sum, int32_t* correct,
                           const int32_t* slot, int64_t slots, cudaStream_t stream) {
  if (k >= 1 && k <= kRowMaxClasses) {
    softmax_xent_rows_kernel<<<1, kRowThreads, 0, stream>>>(
        logits, labels, n, k, grad_scale, dlogits, loss_sum, correct, slot, slots);
    CUDA_CHECK_LAUNCH(softmax_xent_rows_kernel);
    return;
  }
  softmax_xent_kernel<<<1, kLossWarps * 32, 0, stream>>>(logits, labels, n, k, grad_scale, dlogits,
                                                         loss_sum, correct, slot, slots);
  CUDA_CHECK_LAUNCH(softmax_xent_kernel);
}

}  // namespace dp::cuda::kernels
