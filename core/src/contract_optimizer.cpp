// The contracts of dp::Backend's optimizer updates and its step cursor.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend_checker.hpp"

namespace dp {

using namespace checks;

// ---- optimizer ----------------------------------------------------------------------------------

namespace {
// The optimizers' optional packed copy of the parameters: bf16, of their shape.
void check_params_bf16(const Checker& check, const Tensor& params, const Tensor* params_bf16) {
  if (params_bf16 == nullptr) return;
  check.tensor(*params_bf16, DType::bf16, "params_bf16");
  check.shape(*params_bf16, params.shape, "params_bf16");
}
}  // namespace

void Backend::sgd_update(const Tensor& params, const Tensor& grads, const Tensor* momentum_buf,
                         const SgdParams& p, const StepRow* lr_row, const Tensor* params_bf16) {
  const Checker check(*this, "sgd_update");
  check.tensor(params, DType::f32, "params");
  check.f32(grads, params.shape, "grads");
  check_params_bf16(check, params, params_bf16);
  for (const auto& [v, what] :
       {std::pair{p.lr, "lr"}, {p.momentum, "momentum"}, {p.weight_decay, "weight_decay"}}) {
    if (!(v >= 0.0f) || !std::isfinite(v)) {
      check.fail(std::string(what) + " must be finite and >= 0, got " + std::to_string(v));
    }
  }
  if (p.nesterov && p.momentum == 0.0f) {
    check.fail("Nesterov momentum needs a momentum above 0 (as PyTorch's SGD)");
  }
  if (p.momentum != 0.0f) {
    if (momentum_buf == nullptr) {
      check.fail("momentum is " + std::to_string(p.momentum) +
                 " but no momentum buffer was given; allocate one (zeroed) per parameter buffer");
    }
    check.f32(*momentum_buf, params.shape, "momentum_buf");
  }
  if (lr_row != nullptr) step_row(check, *lr_row, DType::f32, 1, "lr_row");
  if (params.numel() > 0) {
    run([=, this, hm = Held(momentum_buf), hr = Held(lr_row), hp = Held(params_bf16)] {
      sgd_update_impl(params, grads, hm.get(), p, hr.get(), hp.get());
    });
  }
}

void Backend::adamw_update(const Tensor& params, const Tensor& grads, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const AdamWParams& p, const StepRow* step_row_,
                           const Tensor* params_bf16) {
  const Checker check(*this, "adamw_update");
  check.tensor(params, DType::f32, "params");
  check.f32(grads, params.shape, "grads");
  check_params_bf16(check, params, params_bf16);
  check.f32(exp_avg, params.shape, "exp_avg");
  check.f32(exp_avg_sq, params.shape, "exp_avg_sq");
  for (const auto& [v, what] : {std::pair{p.lr, "lr"}, {p.weight_decay, "weight_decay"}}) {
    if (!(v >= 0.0f) || !std::isfinite(v)) {
      check.fail(std::string(what) + " must be finite and >= 0, got " + std::to_string(v));
    }
  }
  for (const auto& [v, what] : {std::pair{p.beta1, "beta1"}, {p.beta2, "beta2"}}) {
    if (!(v >= 0.0f && v < 1.0f)) {
      check.fail(std::string(what) + " must be in [0, 1), got " + std::to_string(v));
    }
  }
  if (!(p.eps > 0.0f) || !std::isfinite(p.eps)) {
    check.fail("eps must be positive, got " + std::to_string(p.eps));
  }
  if (p.step < 1) check.fail("step counts from 1, got " + std::to_string(p.step));
  if (step_row_ != nullptr) step_row(check, *step_row_, DType::f32, 3, "step_row");
  if (params.numel() > 0) {
    run([=, this, hr = Held(step_row_), hp = Held(params_bf16)] {
      adamw_update_impl(params, grads, exp_avg, exp_avg_sq, p, hr.get(), hp.get());
    });
  }
}

void Backend::pack_bf16(const Tensor& x, const Tensor& y) {
  const Checker check(*this, "pack_bf16");
  check.tensor(x, DType::f32, "x");
  check.tensor(y, DType::bf16, "y");
  check.shape(y, x.shape, "y");
  if (x.numel() > 0) run([=, this] { pack_bf16_impl(x, y); });
}

void Backend::advance(const Tensor& cursor) {
  const Checker check(*this, "advance");
  check.tensor(cursor, DType::i32, "cursor");
  check.shape(cursor, {1}, "cursor");
  run([=, this] { advance_impl(cursor); });
}

}  // namespace dp
