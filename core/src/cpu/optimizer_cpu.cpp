// The optimizers' updates on the CPU, over flat buffers: PyTorch's SGD (momentum, Nesterov,
// weight decay) and AdamW, written as the documented formulas (torch.optim.SGD and AdamW, in
// float as PyTorch computes them).
#include <bit>
#include <cmath>
#include <cstdint>

#include "cpu/cpu_backend.hpp"
#include "dp/bf16.hpp"
#include "dp/optimizer.hpp"

namespace dp::cpu {

namespace {
// params_bf16 (or nothing) = the parameters' rounding, packed.
void pack_into(const float* w, const Tensor* params_bf16, int64_t n, int threads) {
  if (params_bf16 == nullptr) return;
  auto* out = static_cast<uint16_t*>(params_bf16->data);
#pragma omp parallel for num_threads(threads_for(n, threads)) schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = dp::packed_bf16_bits(std::bit_cast<uint32_t>(w[i]));
}
}  // namespace

// x f32 -> y bf16 (packed): each value rounded to nearest even.
void CpuBackend::pack_bf16_impl(const Tensor& x, const Tensor& y) {
  pack_into(x.f32(), &y, x.numel(), threads_);
}

// params, grads, momentum_buf (flat, equal length) -> params and momentum_buf updated:
// d = g + weight_decay * p; buf = momentum * buf + d; p -= lr * (nesterov ? d + momentum * buf
// : buf); without momentum p -= lr * d. grads are not modified. params_bf16 (or null): the
// updated params rounded to bf16, packed (a second loop here; one pass on the GPU).
void CpuBackend::sgd_update_impl(const Tensor& params, const Tensor& grads,
                                 const Tensor* momentum_buf, const SgdParams& p,
                                 const StepRow* lr_row, const Tensor* params_bf16) {
  const int64_t n = params.numel();
  float* w = params.f32();
  const float* g = grads.f32();
  const float lr = lr_row != nullptr ? *step_row_at<float>(*lr_row, "sgd_update", "lr_row") : p.lr;
  const float wd = p.weight_decay, mu = p.momentum;
  if (mu != 0.0f) {
    float* buf = momentum_buf->f32();
    const bool nesterov = p.nesterov;
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * w[i];
      buf[i] = mu * buf[i] + d;
      w[i] -= lr * (nesterov ? d + mu * buf[i] : buf[i]);
    }
  } else {
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
  }
  pack_into(w, params_bf16, n, threads_);
}

// params, grads, exp_avg (m), exp_avg_sq (v) -> params, m, v updated by one AdamW step.
void CpuBackend::adamw_update_impl(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
                                   const Tensor& exp_avg_sq, const AdamWParams& p,
                                   const StepRow* step_row, const Tensor* params_bf16) {
  const int64_t n = params.numel();
  float* w = params.f32();
  const float* g = grads.f32();
  float* m = exp_avg.f32();
  float* v = exp_avg_sq.f32();
  AdamWStep s = adamw_step(p);
  if (step_row != nullptr) {
    const float* row = step_row_at<float>(*step_row, "adamw_update", "step_row");
    s = {row[0], row[1], row[2]};
  }
  const float step_size = s.step_size, decay = s.decay, bias2_sqrt = s.bias2_sqrt;
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps;
#pragma omp parallel for num_threads(threads_for(n, threads_)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    w[i] *= decay;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    w[i] -= step_size * m[i] / denom;
  }
  pack_into(w, params_bf16, n, threads_);
}

}  // namespace dp::cpu
