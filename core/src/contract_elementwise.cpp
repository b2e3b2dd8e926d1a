// The contracts of dp::Backend's activation, elementwise and pooling ops.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "backend_checker.hpp"

namespace dp {

using namespace checks;

// ---- activation and elementwise -----------------------------------------------------------------

void Backend::relu_forward(const Tensor& x, const Tensor& y) {
  const Checker check(*this, "relu_forward");
  check.tensor(x, DType::f32, "x");
  check.like(y, x, "y", "x");
  if (x.numel() > 0) run([=, this] { relu_forward_impl(x, y); });
}

void Backend::relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "relu_backward");
  check.tensor(y, DType::f32, "y");
  check.like(dy, y, "dy", "y");
  check.like(dx, y, "dx", "y");
  if (y.numel() > 0) run([=, this] { relu_backward_impl(y, dy, dx); });
}

void Backend::relu_backward_bias(const Tensor& y, const Tensor& dy, const Tensor& dx,
                                 const Tensor& db) {
  const Checker check(*this, "relu_backward_bias");
  check.tensor(y, DType::f32, "y");
  if (y.shape.rank != 2 && y.shape.rank != 4) {
    check.fail("y has shape " + y.shape.str() +
               ": expected (N, C) or (N, C, H, W), whose channel the bias is of");
  }
  check.like(dy, y, "dy", "y");
  check.like(dx, y, "dx", "y");
  check.f32(db, {y.shape[1]}, "db");
  run([=, this] {
    if (y.numel() > 0) {
      relu_backward_bias_impl(y, dy, dx, db);
    } else {  // the sum over no examples
      fill_impl(db, 0.0f);
    }
  });
}

void Backend::add(const Tensor& a, const Tensor& b, const Tensor& y, float alpha) {
  const Checker check(*this, "add");
  // a or b may be of a dtype this backend's convolutions take (their input gradients,
  // Conv2d::set_input_grad_takes), widened exactly as read; y is f32.
  const auto operand = [&](const Tensor& t, const char* what) {
    if (t.dtype != DType::f32 && !conv_takes(t.dtype)) {
      check.fail(std::string(what) + " is " + dtype_name(t.dtype) +
                 ": add takes f32, or a dtype this backend's convolutions take (conv_takes)");
    }
    check.tensor(t, t.dtype, what);
    if (t.shape != a.shape) {
      check.fail(std::string(what) + " has shape " + t.shape.str() + " but a has " + a.shape.str() +
                 "; they must match");
    }
    check.same_layout(t, a, what, "a");
    if (t.dtype != DType::f32 && t.data == y.data && t.numel() > 0) {
      check.fail(std::string(what) + " is " + dtype_name(t.dtype) +
                 " and y aliases it: y may alias an f32 operand only");
    }
  };
  operand(a, "a");
  operand(b, "b");
  check.like(y, a, "y", "a");
  if (!std::isfinite(alpha)) check.fail("alpha must be finite, got " + std::to_string(alpha));
  if (a.numel() > 0) run([=, this] { add_impl(a, b, y, alpha); });
}

void Backend::scale(const Tensor& t, float alpha) {
  const Checker check(*this, "scale");
  check.tensor(t, DType::f32, "t");
  if (t.numel() > 0) run([=, this] { scale_impl(t, alpha); });
}

// ---- pooling ------------------------------------------------------------------------------------

void Backend::avgpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  const Checker check(*this, "avgpool_forward");
  check_pool(check, g, x, y, "x", "y");
  if (x.numel() > 0) run([=, this] { avgpool_forward_impl(g, x, y); });
}

void Backend::avgpool_backward(const PoolGeometry& g, const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "avgpool_backward");
  check_pool(check, g, dx, dy, "dx", "dy");
  if (dx.numel() > 0) run([=, this] { avgpool_backward_impl(g, dy, dx); });
}

void Backend::maxpool_forward(const PoolGeometry& g, const Tensor& x, const Tensor& y) {
  const Checker check(*this, "maxpool_forward");
  check_pool(check, g, x, y, "x", "y");
  if (x.numel() > 0) run([=, this] { maxpool_forward_impl(g, x, y); });
}

void Backend::maxpool_backward(const PoolGeometry& g, const Tensor& x, const Tensor& y,
                               const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "maxpool_backward");
  check_pool(check, g, x, y, "x", "y");
  check.like(dy, y, "dy", "y");
  check.like(dx, x, "dx", "x");
  if (x.numel() > 0) run([=, this] { maxpool_backward_impl(g, x, y, dy, dx); });
}

void Backend::global_avgpool_forward(const Tensor& x, const Tensor& y) {
  const Checker check(*this, "global_avgpool_forward");
  const Shape s = check.activation(x, "x");
  check.f32(y, {s[0], s[1], 1, 1}, "y");
  check.same_layout(y, x, "y", "x");
  if (x.numel() > 0) run([=, this] { global_avgpool_forward_impl(x, y); });
}

void Backend::global_avgpool_backward(const Tensor& dy, const Tensor& dx) {
  const Checker check(*this, "global_avgpool_backward");
  const Shape s = check.activation(dx, "dx");
  check.f32(dy, {s[0], s[1], 1, 1}, "dy");
  check.same_layout(dy, dx, "dy", "dx");
  if (dx.numel() > 0) run([=, this] { global_avgpool_backward_impl(dy, dx); });
}

}  // namespace dp
