// The d2l residual block. Main branch: conv1 (3x3, stride) -> bn1 -> ReLU -> conv2 (3x3) -> bn2;
// shortcut: x or conv3 (1x1, stride); out = ReLU(main + shortcut). The ReLUs and the add are
// fused into the batch norms: bn1 + ReLU, and bn2 + shortcut + ReLU, which also gives back the
// gradient of the sum (masked by the ReLU) that goes into the shortcut. Backward sends that
// gradient into both branches and adds their input gradients. conv1's and conv2's biases are
// folded into bn1 and bn2 (see BatchNormFused). bn1's output may be stored as conv2 reads it
// (BatchNorm2d::feeds), and bn2's, the block's output, as the next block reads it (packed bf16
// where the container says its readers take it: takes_input, set_readers_take).
#include <ostream>

#include "dp/error.hpp"
#include "dp/layers.hpp"
#include "module_util.hpp"

namespace dp {

Residual::Residual(int64_t in_channels, int64_t out_channels, bool use_1x1conv, int64_t stride) {
  DP_CHECK(use_1x1conv || (in_channels == out_channels && stride == 1),
           "Residual(" + std::to_string(in_channels) + ", " + std::to_string(out_channels) +
               ", stride " + std::to_string(stride) +
               "): without use_1x1conv the shortcut is the identity, so the channel counts must "
               "be equal and the stride 1; pass use_1x1conv = true");
  conv1_ = std::make_unique<Conv2d>(in_channels, out_channels, 3, stride, 1);
  conv2_ = std::make_unique<Conv2d>(out_channels, out_channels, 3, 1, 1);
  if (use_1x1conv) conv3_ = std::make_unique<Conv2d>(in_channels, out_channels, 1, stride, 0);
  bn1_ = std::make_unique<BatchNorm2d>(out_channels, 1e-5f, 0.1f, BatchNorm2d::Fused{false, true});
  bn2_ = std::make_unique<BatchNorm2d>(out_channels, 1e-5f, 0.1f, BatchNorm2d::Fused{true, true});
  // The batch norms add their convolution's bias (the same values, two passes fewer each).
  bn1_->fold_bias_of(*conv1_);
  bn2_->fold_bias_of(*conv2_);
  // Only conv2 reads bn1's output: the backend may store it as conv2 reads it (bf16).
  bn1_->feeds(*conv2_);
}

// Declaration order follows d2l's attribute order, so the flat layout matches its state_dict.
void Residual::declare(ParamRegistry& registry, const std::string& prefix) {
  conv1_->declare(registry, prefix + "conv1.");
  conv2_->declare(registry, prefix + "conv2.");
  if (conv3_) conv3_->declare(registry, prefix + "conv3.");
  bn1_->declare(registry, prefix + "bn1.");
  bn2_->declare(registry, prefix + "bn2.");
}

void Residual::describe(std::ostream& os, int indent) const {
  std::vector<std::pair<std::string, const Module*>> children{{"conv1", conv1_.get()},
                                                              {"conv2", conv2_.get()}};
  if (conv3_) children.emplace_back("conv3", conv3_.get());
  children.emplace_back("bn1", bn1_.get());
  children.emplace_back("bn2", bn2_.get());
  detail::describe_children(os, *this, indent, children);
}

std::vector<Module*> Residual::children() {
  std::vector<Module*> out{conv1_.get(), conv2_.get()};
  if (conv3_) out.push_back(conv3_.get());
  out.push_back(bn1_.get());
  out.push_back(bn2_.get());
  return out;
}

bool Residual::takes_input(DType dtype, const SetupContext& ctx) const {
  if (dtype == DType::f32) return true;
  const bool shortcut = conv3_ != nullptr ? conv3_->takes_input(dtype, ctx)
                                          : ctx.backend.batchnorm_takes(dtype, ctx.layout);
  return shortcut && conv1_->takes_input(dtype, ctx);
}

DType Residual::output_dtype() const { return bn2_->output_dtype(); }

Shape Residual::do_setup(SetupContext& ctx, const Shape& input) {
  // conv1 and conv3 read the block's input (of the dtype the container gave: the previous
  // block's packed output where this block takes it), and bn2's output is the block's, stored as
  // its readers take it.
  conv1_->set_input_dtype(given_input_dtype());
  if (conv3_) conv3_->set_input_dtype(given_input_dtype());
  // Their input gradients go to the add of do_backward alone, which takes them of the dtype the
  // convolutions take x in (Backend::add): packed where the block's input is.
  const DType add_takes = ctx.backend.conv_takes(DType::bf16) ? DType::bf16 : DType::f32;
  conv1_->set_input_grad_takes(add_takes);
  if (conv3_) conv3_->set_input_grad_takes(add_takes);
  bn2_->set_readers_take(readers_take());
  // conv1 and conv3 read the block's input: their input gradient is asked for only when the
  // block's is (see do_backward); every later layer's always is.
  const bool input_grad = ctx.input_grad;
  Shape s = conv1_->setup(ctx, input);
  ctx.input_grad = true;
  s = bn1_->setup(ctx, s);
  s = conv2_->setup(ctx, s);
  s = bn2_->setup(ctx, s);
  ctx.input_grad = input_grad;
  const Shape shortcut = conv3_ ? conv3_->setup(ctx, input) : input;
  DP_CHECK(shortcut == s, "Residual: the main branch gives " + s.str() +
                              " but the shortcut gives " + shortcut.str() + " for input " +
                              input.str());
  ctx.arena.allocate_planned(dx_, input, DType::f32, ctx.layout);
  return s;
}

// As do_forward runs: conv1, bn1, conv2, then the shortcut (conv3 reads the block's input), then
// bn2 with the shortcut as its residual.
StepSchedule::Handle Residual::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  StepSchedule::Handle main = conv1_->schedule_forward(s, x);
  main = bn1_->schedule_forward(s, main);
  main = conv2_->schedule_forward(s, main);
  const StepSchedule::Handle shortcut = conv3_ ? conv3_->schedule_forward(s, x) : x;
  return bn2_->schedule_forward(s, main, shortcut);
}

// As do_backward runs: bn2, conv2, bn1, conv1, then the shortcut (conv3, reading bn2's epilogue
// gradient), then the add of both input gradients into dx.
StepSchedule::Handle Residual::schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) {
  StepSchedule::Handle g = bn2_->schedule_backward(s, dy);
  const StepSchedule::Handle dsum = bn2_->scheduled_epilogue();
  g = conv2_->schedule_backward(s, g);
  g = bn1_->schedule_backward(s, g);
  const StepSchedule::Handle dx_main = conv1_->schedule_backward(s, g);
  const StepSchedule::Handle dx_shortcut = conv3_ ? conv3_->schedule_backward(s, dsum) : dsum;
  s.step();
  s.read(dx_main);
  s.read(dx_shortcut);
  return s.write(dx_);
}

Tensor Residual::do_forward(RunContext& ctx, const Tensor& x) {
  Tensor main = conv1_->forward(ctx, x);
  main = bn1_->forward(ctx, main);
  main = conv2_->forward(ctx, main);
  const Tensor shortcut = conv3_ ? conv3_->forward(ctx, x) : x;
  dx_.layout = x.layout;
  return bn2_->forward(ctx, main, shortcut);
}

Tensor Residual::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  const int64_t n = dy.shape[0];
  Tensor g = bn2_->backward(ctx, dy, true);
  const Tensor dsum = bn2_->epilogue_gradient();  // the gradient of main + shortcut
  g = conv2_->backward(ctx, g, true);
  g = bn1_->backward(ctx, g, true);
  const Tensor dx_main = conv1_->backward(ctx, g, need_dx);
  // Run conv3's backward even when dx is not needed: it produces conv3's weight gradients.
  const Tensor dx_shortcut = conv3_ ? conv3_->backward(ctx, dsum, need_dx) : dsum;
  if (!need_dx) return Tensor();
  const Tensor dx = dx_.with_batch(n);
  ctx.backend.add(dx_main, dx_shortcut, dx);
  return dx;
}

}  // namespace dp
