// Softmax cross-entropy and accuracy counting on the CPU.
#include <algorithm>
#include <cmath>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

struct Classes {
  int64_t n, k;
};

// Index of the first maximum of row[0..k).
int64_t first_argmax(const float* row, int64_t k) {
  int64_t best = 0;
  for (int64_t j = 1; j < k; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

[[noreturn]] void bad_label(const char* op, const Tensor& labels, int64_t n, int64_t k) {
  const int32_t* lp = labels.i32();
  for (int64_t i = 0; i < n; ++i) {
    if (lp[i] < 0 || lp[i] >= k) {
      DP_THROW(std::string("cpu backend: ") + op + ": labels[" + std::to_string(i) +
               "] = " + std::to_string(lp[i]) + " is outside [0, " + std::to_string(k) +
               "); the model's class count must match the dataset's");
    }
  }
  DP_THROW(std::string("cpu backend: ") + op + ": a label is outside [0, K)");
}

}  // namespace

// logits (N,K) f32, labels (N) i32 -> dlogits (N,K) = (softmax - onehot) * grad_scale,
// loss_sum (1) f32 = sum_n -log softmax[n, label], correct (1) i32.
void CpuBackend::softmax_cross_entropy_impl(const Tensor& logits, const Tensor& labels,
                                            float grad_scale, const Tensor& dlogits,
                                            const Tensor& loss_sum, const Tensor& correct,
                                            const Tensor* slot) {
  const char* op = "softmax_cross_entropy";
  const Classes c{logits.shape[0], logits.shape[1]};
  const float* lp = logits.f32();
  const int32_t* yp = labels.i32();
  float* dlp = dlogits.f32();
  double loss = 0;
  int64_t right = 0;
  int64_t bad = 0;
#pragma omp parallel for num_threads(threads_for(c.n * c.k * 8, threads_)) schedule(static) \
    reduction(+ : loss, right, bad)
  for (int64_t i = 0; i < c.n; ++i) {
    const float* row = lp + i * c.k;
    float* grad = dlp + i * c.k;
    const int32_t label = yp[i];
    if (label < 0 || label >= c.k) {
      ++bad;
      continue;
    }
    // log-sum-exp shifted by the maximum, so large logits cannot overflow.
    const int64_t best = first_argmax(row, c.k);
    const double shift = row[best];
    double sum = 0;
    for (int64_t j = 0; j < c.k; ++j) sum += std::exp(static_cast<double>(row[j]) - shift);
    const double log_sum = std::log(sum);
    loss += log_sum - (static_cast<double>(row[label]) - shift);
    for (int64_t j = 0; j < c.k; ++j) {
      const double p = std::exp(static_cast<double>(row[j]) - shift - log_sum);
      grad[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * grad_scale);
    }
    if (best == label) ++right;
  }
  if (bad > 0) bad_label(op, labels, c.n, c.k);
  const int64_t at = slot != nullptr ? step_row_index(*slot, loss_sum.numel(), op, "slot") : 0;
  loss_sum.f32()[at] = static_cast<float>(loss);
  correct.i32()[at] = static_cast<int32_t>(right);
}

// logits (N,K) f32, labels (N) i32 -> correct (1) i32 = #n with first argmax == label.
void CpuBackend::count_correct_impl(const Tensor& logits, const Tensor& labels,
                                    const Tensor& correct, const Tensor* slot) {
  const Classes c{logits.shape[0], logits.shape[1]};
  const float* lp = logits.f32();
  const int32_t* yp = labels.i32();
  int64_t right = 0;
#pragma omp parallel for num_threads(threads_for(c.n * c.k * 8, threads_)) schedule(static) \
    reduction(+ : right)
  for (int64_t i = 0; i < c.n; ++i)
    if (first_argmax(lp + i * c.k, c.k) == yp[i]) ++right;
  const int64_t at =
      slot != nullptr ? step_row_index(*slot, correct.numel(), "count_correct", "slot") : 0;
  correct.i32()[at] = static_cast<int32_t>(right);
}

}  // namespace dp::cpu
