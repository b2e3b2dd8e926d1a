// The contracts of dp::Backend's batch-norm ops, the synchronised pieces included.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend_checker.hpp"

namespace dp {

using namespace checks;

// ---- batch norm ---------------------------------------------------------------------------------

bool Backend::batchnorm_takes(DType dtype, Layout layout) const {
  return dtype == DType::f32 || batchnorm_takes_impl(dtype, layout);
}

bool Backend::batchnorm_folds_bias(Layout layout) const {
  return batchnorm_folds_bias_impl(layout);
}

void Backend::prepare_batchnorm(const Shape& max_input, Layout layout) {
  refuse_while_capturing("prepare_batchnorm");
  const Checker check(*this, "prepare_batchnorm");
  if (max_input.rank != 4 && max_input.rank != 2) {
    check.fail("expected an (N, C, H, W) or (N, C) input, got " + max_input.str());
  }
  for (int i = 0; i < max_input.rank; ++i) {
    if (max_input[i] < 1) check.fail("every dimension must be >= 1, got " + max_input.str());
  }
  prepare_batchnorm_impl(max_input, layout);
}

namespace {
/// A batch norm's x: an f32 activation ((N, C, H, W) or (N, C)), or (N, C, H, W) of another
/// dtype in a layout the backend's batch norm takes it in (Backend::batchnorm_takes).
Shape check_input(const Checker& check, const Backend& backend, const Tensor& x) {
  if (x.dtype == DType::f32) return check.activation(x, "x", /*allow_rank2=*/true);
  if (x.shape.rank != 4 || !backend.batchnorm_takes(x.dtype, x.layout)) {
    check.fail(
        std::string("x is ") + dtype_name(x.dtype) + " " +
        (x.shape.rank == 4 ? std::string(layout_name(x.layout)) : "of shape " + x.shape.str()) +
        ", which this backend's batch norm does not take (f32 always; another dtype only "
        "(N, C, H, W) where Backend::batchnorm_takes says so)");
  }
  return check.activation(x, "x", false, x.dtype);
}

/// t (of the dtype its caller checked) is a tensor of this backend with x's shape and layout.
void shaped_like_x(const Checker& check, const Tensor& t, const Tensor& x, const char* what) {
  check.tensor(t, t.dtype, what);
  if (t.shape != x.shape) {
    check.fail(std::string(what) + " has shape " + t.shape.str() + " but x has " + x.shape.str() +
               "; they must match");
  }
  check.same_layout(t, x, what, "x");
}

/// y (or the ReLU epilogue's y in backward, or the epilogue's residual) has x's shape and layout;
/// f32, or (N, C, H, W) of another dtype where the backend's batch norm takes it
/// (Backend::batchnorm_takes: rounded values, stored packed for readers that take them).
void check_output(const Checker& check, const Backend& backend, const Tensor& y, const Tensor& x,
                  const char* what) {
  if (y.dtype == DType::f32) return check.like(y, x, what, "x");
  if (y.shape.rank != 4 || !backend.batchnorm_takes(y.dtype, y.layout)) {
    check.fail(
        std::string(what) + " is " + dtype_name(y.dtype) + " " +
        (y.shape.rank == 4 ? std::string(layout_name(y.layout)) : "of shape " + y.shape.str()) +
        ", which this backend's batch norm does not take (f32 always; another dtype only "
        "(N, C, H, W) where Backend::batchnorm_takes says so)");
  }
  shaped_like_x(check, y, x, what);
}

/// dx has x's shape, layout and dtype: a bf16 x's gradient goes, rounded to bf16, to the
/// convolution that wrote x, which rounds its output gradient so anyway (ConvPlan::output_dtype).
void check_input_grad(const Checker& check, const Tensor& dx, const Tensor& x) {
  if (dx.dtype != x.dtype) {
    check.fail(std::string("dx is ") + dtype_name(dx.dtype) + " but x is " + dtype_name(x.dtype) +
               "; dx takes x's dtype");
  }
  shaped_like_x(check, dx, x, "dx");
}

/// dy has x's shape and layout; f32, or the dtype of the ReLU epilogue's y where that is not f32
/// (a bf16 y that feeds a convolution alone, which writes this gradient rounded:
/// BatchNorm2d::feeds).
void check_output_grad(const Checker& check, const Tensor& dy, const Tensor& x,
                       const BnEpilogueGrad& e) {
  if (dy.dtype == DType::f32) return check.like(dy, x, "dy", "x");
  if (e.y == nullptr || e.y->dtype != dy.dtype) {
    check.fail(std::string("dy is ") + dtype_name(dy.dtype) +
               ", which batch norm takes only with a ReLU epilogue whose y is " +
               dtype_name(dy.dtype) + " too (got " +
               (e.y == nullptr ? std::string("no epilogue y")
                               : std::string("an epilogue y of ") + dtype_name(e.y->dtype)) +
               "); f32 otherwise");
  }
  shaped_like_x(check, dy, x, "dy");
}

void check_count(const Checker& check, int64_t count) {
  if (count < 2) {
    check.fail("count is " + std::to_string(count) +
               ": batch norm in training needs more than one value per channel over every "
               "replica; use a larger batch");
  }
}
void check_eps(const Checker& check, float eps) {
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    check.fail("eps must be positive, got " + std::to_string(eps));
  }
}
void check_momentum_eps(const Checker& check, float momentum, float eps) {
  if (!(momentum >= 0.0f && momentum <= 1.0f)) {
    check.fail("momentum must be in [0, 1], got " + std::to_string(momentum));
  }
  check_eps(check, eps);
}
bool same_data(const Tensor& a, const Tensor& b) {
  return a.data != nullptr && a.data == b.data && a.numel() > 0;
}
void check_epilogue(const Checker& check, const Backend& backend, const BnEpilogue& e,
                    const Tensor& x, const Tensor& y) {
  if (e.conv_bias != nullptr) {
    if (x.shape.rank != 4 || !backend.batchnorm_folds_bias(x.layout)) {
      check.fail(std::string("conv_bias given for x of shape ") + x.shape.str() + " " +
                 layout_name(x.layout) +
                 ", where this backend's batch norm does not fold a convolution's bias "
                 "(Backend::batchnorm_folds_bias); add its share with Backend::add instead");
    }
    check.f32(*e.conv_bias, Shape{x.shape[1]}, "conv_bias");
  }
  if (e.residual == nullptr) return;
  check_output(check, backend, *e.residual, x, "residual");
  if (same_data(*e.residual, y)) {
    check.fail("the epilogue's residual and y share their data; y must be another tensor");
  }
}
void check_epilogue_grad(const Checker& check, const Backend& backend, const BnEpilogueGrad& e,
                         const Tensor& x, const Tensor& dy) {
  if ((e.y == nullptr) != (e.dz == nullptr)) {
    check.fail(std::string("the ReLU epilogue's gradient needs both y (the forward's output) and "
                           "dz (where the masked gradient goes); got only ") +
               (e.y != nullptr ? "y" : "dz"));
  }
  if (e.y == nullptr) return;
  check_output(check, backend, *e.y, x, "epilogue y");
  check.like(*e.dz, x, "dz", "x");
  for (const auto& [t, name] :
       {std::pair{&dy, "dy"}, std::pair{e.y, "epilogue y"}, std::pair{&x, "x"}}) {
    if (same_data(*e.dz, *t)) {
      check.fail(std::string("dz and ") + name + " share their data; dz must be another tensor");
    }
  }
}
}  // namespace

void Backend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      float momentum, float eps, const Tensor& save_mean,
                                      const Tensor& save_invstd, const Tensor& y,
                                      const BnEpilogue& epilogue) {
  const Checker check(*this, "batchnorm_forward_train");
  const Shape s = check_input(check, *this, x);
  check_output(check, *this, y, x, "y");
  check_epilogue(check, *this, epilogue, x, y);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&beta, "beta"},
                   {&running_mean, "running_mean"},
                   {&running_var, "running_var"},
                   {&save_mean, "save_mean"},
                   {&save_invstd, "save_invstd"}});
  check_momentum_eps(check, momentum, eps);
  if (per_channel(s) < 2) {
    check.fail("x has shape " + s.str() +
               ": batch norm in training needs more than one value per channel (N*H*W > 1), as "
               "PyTorch; use a larger batch per replica");
  }
  run([=, this, e = HeldEpilogue(epilogue)] {
    batchnorm_forward_train_impl(x, gamma, beta, running_mean, running_var, momentum, eps,
                                 save_mean, save_invstd, y, e.get());
  });
}

void Backend::batchnorm_forward_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      float eps, const Tensor& y, const BnEpilogue& epilogue) {
  const Checker check(*this, "batchnorm_forward_infer");
  const Shape s = check_input(check, *this, x);
  check_output(check, *this, y, x, "y");
  check_epilogue(check, *this, epilogue, x, y);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&beta, "beta"},
                   {&running_mean, "running_mean"},
                   {&running_var, "running_var"}});
  check_eps(check, eps);
  if (s[0] > 0) {
    run([=, this, e = HeldEpilogue(epilogue)] {
      batchnorm_forward_infer_impl(x, gamma, beta, running_mean, running_var, eps, y, e.get());
    });
  }
}

void Backend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                 const Tensor& save_mean, const Tensor& save_invstd, float eps,
                                 const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                 const BnEpilogueGrad& epilogue) {
  const Checker check(*this, "batchnorm_backward");
  const Shape s = check_input(check, *this, x);
  check_output_grad(check, dy, x, epilogue);
  check_input_grad(check, dx, x);
  check_epilogue_grad(check, *this, epilogue, x, dy);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&save_mean, "save_mean"},
                   {&save_invstd, "save_invstd"},
                   {&dgamma, "dgamma"},
                   {&dbeta, "dbeta"}});
  check_eps(check, eps);
  if (per_channel(s) < 2) {
    check.fail("x has shape " + s.str() +
               ": batch norm in training needs more than one value per channel (N*H*W > 1)");
  }
  run([=, this, e = HeldEpilogueGrad(epilogue)] {
    batchnorm_backward_impl(x, dy, gamma, save_mean, save_invstd, eps, dx, dgamma, dbeta, e.get());
  });
}

// ---- batch norm with statistics over every replica ----------------------------------------------

void Backend::batchnorm_sums(const Tensor& x, const Tensor* mean, const Tensor& sums) {
  const Checker check(*this, "batchnorm_sums");
  const Shape s = check_input(check, *this, x);
  check.optional_f32(mean, {s[1]}, "mean");
  check.f32(sums, {s[1]}, "sums");
  // Also for N = 0: the sums are then zero.
  run([=, this, hm = Held(mean)] { batchnorm_sums_impl(x, hm.get(), sums); });
}

void Backend::batchnorm_apply_stats(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& mean, const Tensor& var,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    float momentum, float eps, int64_t count,
                                    const Tensor& save_mean, const Tensor& save_invstd,
                                    const Tensor& y, const BnEpilogue& epilogue) {
  const Checker check(*this, "batchnorm_apply_stats");
  const Shape s = check_input(check, *this, x);
  check_output(check, *this, y, x, "y");
  check_epilogue(check, *this, epilogue, x, y);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"},
                   {&beta, "beta"},
                   {&mean, "mean"},
                   {&var, "var"},
                   {&running_mean, "running_mean"},
                   {&running_var, "running_var"},
                   {&save_mean, "save_mean"},
                   {&save_invstd, "save_invstd"}});
  check_momentum_eps(check, momentum, eps);
  check_count(check, count);
  if (per_channel(s) > count) {
    check.fail("x holds " + std::to_string(per_channel(s)) +
               " values per channel, more than "
               "the count of every replica's, " +
               std::to_string(count));
  }
  // Runs for N = 0 too: the running statistics and saved statistics are still written.
  run([=, this, e = HeldEpilogue(epilogue)] {
    batchnorm_apply_stats_impl(x, gamma, beta, mean, var, running_mean, running_var, momentum, eps,
                               count, save_mean, save_invstd, y, e.get());
  });
}

void Backend::batchnorm_backward_sums(const Tensor& x, const Tensor& dy, const Tensor& save_mean,
                                      const Tensor& save_invstd, const Tensor& sums,
                                      const BnEpilogueGrad& epilogue) {
  const Checker check(*this, "batchnorm_backward_sums");
  const Shape s = check_input(check, *this, x);
  check_output_grad(check, dy, x, epilogue);
  check_epilogue_grad(check, *this, epilogue, x, dy);
  channel_vectors(check, s[1], {{&save_mean, "save_mean"}, {&save_invstd, "save_invstd"}});
  check.f32(sums, {2 * s[1]}, "sums");
  run([=, this, e = HeldEpilogueGrad(epilogue)] {
    batchnorm_backward_sums_impl(x, dy, save_mean, save_invstd, sums, e.get());
  });
}

void Backend::batchnorm_backward_apply(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                       const Tensor& save_mean, const Tensor& save_invstd,
                                       const Tensor& sums, int64_t count, const Tensor& dx) {
  const Checker check(*this, "batchnorm_backward_apply");
  const Shape s = check_input(check, *this, x);
  check.like(dy, x, "dy", "x");
  check_input_grad(check, dx, x);
  channel_vectors(check, s[1],
                  {{&gamma, "gamma"}, {&save_mean, "save_mean"}, {&save_invstd, "save_invstd"}});
  check.f32(sums, {2 * s[1]}, "sums");
  check_count(check, count);
  if (s[0] > 0) {
    run([=, this] {
      batchnorm_backward_apply_impl(x, dy, gamma, save_mean, save_invstd, sums, count, dx);
    });
  }
}

}  // namespace dp
