// The leaf layers. Each allocates its output and input-gradient buffers once in do_setup (for
// the largest batch) and hands out batch-sized views of them; forward keeps a view of its input
// when backward needs it. Activations carry the layout of the model input; gradients take the
// layout of the tensor they are the gradient of.
#include "dp/layers.hpp"

#include <cstdio>
#include <initializer_list>
#include <ostream>
#include <typeinfo>

#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "module_util.hpp"

namespace dp {

namespace detail {
std::string py_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace detail

namespace {

// Rank-4 activations use the model's layout; flat (N, F) tensors have only one.
Layout layout_for(const Shape& s, Layout l) { return s.rank == 4 ? l : Layout::nchw; }

// A batch-sized view of a setup-time buffer, tagged with the layout of the tensor it derives
// from (rank-4 only: flat tensors have one order).
Tensor view(const Tensor& buffer, int64_t batch, Layout layout) {
  Tensor t = buffer.with_batch(batch);
  t.layout = layout_for(t.shape, layout);
  return t;
}

void check_rank4(const Module& m, const std::string& what, const Shape& input) {
  DP_CHECK(input.rank == 4, what + " expects (N, C, H, W) input, got " + input.str() + " (" +
                                std::string(m.type()) + ")");
}

std::string pair(int64_t v) {
  const std::string n = std::to_string(v);
  std::string s = "(";  // appended step by step: GCC 12 warns falsely on "(" + std::string
  s += n;
  s += ", ";
  s += n;
  s += ")";
  return s;
}

// A layer's forward step in the memory plan's walk: it reads its input and writes its output, a
// planned buffer.
StepSchedule::Handle forward_leaf(StepSchedule& s, const StepSchedule::Handle& x, Tensor& y) {
  s.step();
  s.read(x);
  return s.write(y);
}

// A layer's backward step in the memory plan's walk: it reads its output gradient and what it
// kept of forward (`kept`), and writes its input gradient, a planned buffer.
StepSchedule::Handle backward_leaf(StepSchedule& s, const StepSchedule::Handle& dy, Tensor& dx,
                                   std::initializer_list<const StepSchedule::Handle*> kept = {}) {
  s.step();
  s.read(dy);
  for (const StepSchedule::Handle* h : kept) s.read(*h);
  return s.write(dx);
}

// A fused ReLU's backward step in the memory plan's walk (Conv2d, Linear with fuse_relu): it
// reads dy and the layer's output (the mask) and writes the masked gradient, which the layer's
// own backward step then reads instead of dy; so dy and the output end where a separate ReLU's
// backward ended them.
StepSchedule::Handle relu_mask_step(StepSchedule& s, const StepSchedule::Handle& dy,
                                    const StepSchedule::Handle& y, Tensor& dz) {
  s.step();
  s.read(dy);
  s.read(y);
  return s.write(dz);
}

// A fused ReLU's backward (Conv2d, Linear with fuse_relu): dz = dy masked by the output y, and
// with a bias its gradient summed in the same op (Backend::relu_backward_bias). Returns dz, the
// gradient the layer's own passes take.
Tensor relu_mask(const RunContext& ctx, const Tensor& y, const Tensor& dy, const Tensor& dz,
                 ParamHandle bias) {
  if (bias.valid()) {
    ctx.backend.relu_backward_bias(y, dy, dz, ctx.params.grad(bias));
  } else {
    ctx.backend.relu_backward(y, dy, dz);
  }
  return dz;
}

}  // namespace

// ---- Conv2d -----------------------------------------------------------------------------------

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Options options)
    : in_(in_channels), out_(out_channels), opt_(options) {
  DP_CHECK(in_ >= 1 && out_ >= 1, "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
                                      "): channel counts must be positive");
  DP_CHECK(opt_.kernel >= 1 && opt_.stride >= 1 && opt_.padding >= 0,
           "Conv2d: kernel and stride must be >= 1 and padding >= 0, got kernel " +
               std::to_string(opt_.kernel) + ", stride " + std::to_string(opt_.stride) +
               ", padding " + std::to_string(opt_.padding));
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
               int64_t padding, bool bias)
    : Conv2d(in_channels, out_channels,
             Options{.kernel = kernel, .stride = stride, .padding = padding, .bias = bias}) {}

void Conv2d::declare(ParamRegistry& registry, const std::string& prefix) {
  name_ = prefix.empty() ? "conv" : prefix.substr(0, prefix.size() - 1);
  // In an NHWC model the weight is stored (K, R, S, C): what the NHWC passes read, so none
  // transposes it (cuDNN's NHWC kernels take KRSC filters).
  w_layout_ = registry.layout();
  w_ = registry.add_parameter(prefix + "weight", {out_, in_, opt_.kernel, opt_.kernel},
                              opt_.weight_init, w_layout_);
  if (opt_.bias) b_ = registry.add_parameter(prefix + "bias", {out_}, opt_.bias_init);
}

void Conv2d::describe(std::ostream& os, int indent) const {
  os << "Conv2d(" << in_ << ", " << out_ << ", kernel_size=" << pair(opt_.kernel)
     << ", stride=" << pair(opt_.stride);
  if (opt_.padding) os << ", padding=" << pair(opt_.padding);
  if (!opt_.bias) os << ", bias=False";
  os << ")";
  if (relu_) os << " + ReLU";
  detail::end_description(os, *this, indent);
}

bool Conv2d::fuse_relu() {
  DP_CHECK(input_shape().rank == 0, "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
                                        "): fuse_relu after setup; fuse before");
  if (relu_ || to_batchnorm_ || bias_folded_) return false;
  relu_ = true;
  return true;
}

Shape Conv2d::do_setup(SetupContext& ctx, const Shape& input) {
  check_rank4(*this, "Conv2d", input);
  DP_CHECK(input[1] == in_, "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
                                ") expects " + std::to_string(in_) + " input channels, got " +
                                input.str());
  DP_CHECK(w_.valid(), "Conv2d: setup() before declare()");
  ConvGeometry g;
  g.max_batch = input[0];
  g.in_channels = in_;
  g.in_h = input[2];
  g.in_w = input[3];
  g.out_channels = out_;
  g.kernel_h = g.kernel_w = opt_.kernel;
  g.stride_h = g.stride_w = opt_.stride;
  g.pad_h = g.pad_w = opt_.padding;
  g.layout = ctx.layout;
  DP_CHECK(w_layout_ == Layout::nchw || w_layout_ == ctx.layout,
           "Conv2d " + name_ + ": its weight is stored " + layout_name(w_layout_) +
               " (the parameter registry's layout when it was declared) but the model is set up " +
               layout_name(ctx.layout) +
               ": give the registry the model's layout (ParamRegistry::set_layout) before "
               "declare()");
  DP_CHECK(input[2] + 2 * opt_.padding >= opt_.kernel && input[3] + 2 * opt_.padding >= opt_.kernel,
           "Conv2d: kernel " + std::to_string(opt_.kernel) + " is larger than the padded input " +
               input.str());
  const Shape out{input[0], out_, g.out_h(), g.out_w()};
  ConvUse use;
  use.layer = name_;
  use.train_batches = ctx.train_batches;
  use.infer_batches = ctx.infer_batches;
  use.input_grad = ctx.input_grad;
  // Under the memory plan each pass's workspace is a buffer of its own step.
  use.planned_workspace = ctx.arena.memory_plan();
  use.forward_bias = b_.valid() && !bias_folded_;  // a folded bias is the batch norm's
  use.output_to_batchnorm = to_batchnorm_;
  use.output_relu = relu_;
  use.filter_layout = w_layout_;
  // A bf16 x where the batch norm before it stores its output so for this layer (feeds), which
  // it decides in its own setup: it must come first.
  DP_CHECK(input_from_ == nullptr || input_from_->input_shape().rank != 0,
           "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
               "): the batch norm that feeds it (BatchNorm2d::feeds) must be set up before it");
  use.input_dtype = input_from_ != nullptr ? input_from_->output_dtype() : given_input_dtype();
  plan_ = ctx.backend.plan_conv(g, use);
  for (const ConvStage stage : {ConvStage::forward, ConvStage::backward}) {
    Tensor& ws = workspace_[static_cast<int>(stage)];
    ws = Tensor();
    const size_t bytes = plan_->workspace_bytes(stage);
    if (bytes > 0)
      ctx.arena.allocate_planned(ws, Shape{static_cast<int64_t>((bytes + 3) / sizeof(float))});
  }
  x_planned_ = y_planned_ = {};
  // bf16 where the backend stores a bf16 convolution's output so for the batch norm after it.
  ctx.arena.allocate_planned(y_, out, plan_->output_dtype(), ctx.layout);
  dz_ = Tensor();
  if (relu_) ctx.arena.allocate_planned(dz_, out, DType::f32, ctx.layout);
  // bf16 where the one reader of dx takes it so (rounded by backward-data anyway): the batch
  // norm that feeds it, or the container's add given an x of that dtype.
  DType dx_dtype = DType::f32;
  if (input_from_ != nullptr) {
    dx_dtype = input_from_->output_grad_dtype();
  } else if (input_grad_takes_ != DType::f32 && input_grad_takes_ == plan_->input_dtype()) {
    dx_dtype = input_grad_takes_;
  }
  ctx.arena.allocate_planned(dx_, input, dx_dtype, ctx.layout);
  return out;
}

DType Conv2d::output_dtype() const { return plan_ ? plan_->output_dtype() : DType::f32; }

bool Conv2d::takes_input(DType dtype, const SetupContext& ctx) const {
  return dtype == DType::f32 || ctx.backend.conv_takes(dtype);
}
DType Conv2d::input_dtype() const { return plan_ ? plan_->input_dtype() : DType::f32; }

const Tensor* Conv2d::workspace(ConvStage stage) const {
  return plan_->workspace_bytes(stage) > 0 ? &workspace_[static_cast<int>(stage)] : nullptr;
}

Tensor Conv2d::do_forward(RunContext& ctx, const Tensor& x) {
  x_ = x;
  const Tensor y = view(y_, x.shape[0], x.layout);
  const Tensor w = ctx.params.param(w_);
  const Tensor* ws = workspace(ConvStage::forward);
  if (b_.valid() && !bias_folded_) {
    const Tensor b = ctx.params.param(b_);
    ctx.backend.conv_forward(*plan_, x, w, &b, y, ws, ctx.params.param_bf16(w_));
  } else {
    ctx.backend.conv_forward(*plan_, x, w, nullptr, y, ws, ctx.params.param_bf16(w_));
  }
  return y;
}

// The forward workspace lives in this step only.
StepSchedule::Handle Conv2d::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  x_planned_ = x;
  s.step();
  s.read(x);
  s.write(workspace_[0]);
  y_planned_ = s.write(y_);
  return y_planned_;
}

// The filter gradient reads the input; the backward workspace lives in this step only. A fused
// ReLU's backward is a step before (relu_mask_step): dy and the output end before the workspace
// and dx begin.
StepSchedule::Handle Conv2d::schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) {
  const StepSchedule::Handle grad = relu_ ? relu_mask_step(s, dy, y_planned_, dz_) : dy;
  s.step();
  s.read(grad);
  s.read(x_planned_);
  s.write(workspace_[1]);
  return s.write(dx_);
}

Tensor Conv2d::do_backward(RunContext& ctx, const Tensor& dy_in, bool need_dx) {
  const Tensor dw = ctx.params.grad(w_);
  const Tensor* ws = workspace(ConvStage::backward);
  Tensor dy = dy_in;
  if (relu_) {
    // The fused ReLU's backward, which takes the bias gradient too.
    const int64_t n = dy_in.shape[0];
    dy = relu_mask(ctx, view(y_, n, x_.layout), dy_in, view(dz_, n, x_.layout), b_);
    ctx.backend.conv_backward_filter(*plan_, x_, dy, dw, nullptr, ws);
  } else if (b_.valid() && !bias_folded_) {
    const Tensor db = ctx.params.grad(b_);
    ctx.backend.conv_backward_filter(*plan_, x_, dy, dw, &db, ws);
  } else {
    // A bias folded into the batch norm after it, which removes any per-channel constant: its
    // exact gradient is 0 (the unfolded reduction gives 0 up to rounding), which the registry
    // starts every gradient at (ParamRegistry::allocate) and nothing else writes: no pass here.
    ctx.backend.conv_backward_filter(*plan_, x_, dy, dw, nullptr, ws);
  }
  ctx.gradient_ready(w_);
  ctx.gradient_ready(b_);
  if (!need_dx) return Tensor();
  const Tensor dx = view(dx_, dy.shape[0], x_.layout);
  ctx.backend.conv_backward_data(*plan_, dy, ctx.params.param(w_), dx, ws,
                                 ctx.params.param_bf16(w_));
  return dx;
}

// ---- BatchNorm2d ------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(int64_t channels, float eps, float momentum, Fused fused)
    : c_(channels), eps_(eps), momentum_(momentum), fused_(fused) {
  DP_CHECK(c_ >= 1, "BatchNorm2d(" + std::to_string(c_) + "): channels must be positive");
  DP_CHECK(eps_ > 0 && momentum_ >= 0 && momentum_ <= 1,
           "BatchNorm2d: eps must be > 0 and momentum in [0, 1]");
}

void BatchNorm2d::declare(ParamRegistry& registry, const std::string& prefix) {
  gamma_ = registry.add_parameter(prefix + "weight", {c_}, Init::ones());
  beta_ = registry.add_parameter(prefix + "bias", {c_}, Init::zeros());
  mean_ = registry.add_buffer(prefix + "running_mean", {c_}, Init::zeros());
  var_ = registry.add_buffer(prefix + "running_var", {c_}, Init::ones());
}

void BatchNorm2d::fold_bias_of(Conv2d& conv) {
  const std::string me = "BatchNorm2d(" + std::to_string(c_) + ")";
  DP_CHECK(input_shape().rank == 0, me + ": fold_bias_of after setup; fold before");
  DP_CHECK(bias_of_ == nullptr, me + " already adds a convolution's bias");
  DP_CHECK(conv.opt_.bias, me + ": the convolution has no bias to fold");
  DP_CHECK(!conv.bias_folded_, me + ": the convolution's bias is already folded elsewhere");
  DP_CHECK(!conv.relu_, me + ": the convolution's output goes through a fused ReLU first");
  DP_CHECK(conv.out_ == c_, me + ": the convolution gives " + std::to_string(conv.out_) +
                                " channels");
  DP_CHECK(input_of_ == nullptr || input_of_ == &conv,
           me + " already reads another convolution's output alone; it can fold the bias of that "
                "one only");
  conv.bias_folded_ = true;
  conv.to_batchnorm_ = true;
  bias_of_ = &conv;
  input_of_ = &conv;
}

void BatchNorm2d::feeds(Conv2d& conv) {
  const std::string me = "BatchNorm2d(" + std::to_string(c_) + ")";
  DP_CHECK(input_shape().rank == 0 && conv.input_shape().rank == 0,
           me + ": feeds after setup; call it before either layer is set up");
  DP_CHECK(output_to_ == nullptr, me + " already feeds a convolution alone");
  DP_CHECK(conv.input_from_ == nullptr, me + ": the convolution already reads another batch norm");
  DP_CHECK(conv.in_ == c_,
           me + ": the convolution takes " + std::to_string(conv.in_) + " channels");
  conv.input_from_ = this;
  output_to_ = &conv;
}

bool BatchNorm2d::fuse_relu() {
  DP_CHECK(input_shape().rank == 0,
           "BatchNorm2d(" + std::to_string(c_) + "): fuse_relu after setup; fuse before");
  if (fused_.relu) return false;
  fused_.relu = true;
  return true;
}

bool BatchNorm2d::fold_previous(Module& previous) {
  auto* conv = dynamic_cast<Conv2d*>(&previous);
  if (conv == nullptr || conv->out_ != c_ || input_shape().rank != 0 || conv->relu_) return false;
  // Only this layer reads the convolution's output: the backend may store it narrower.
  if (conv->input_shape().rank == 0 && input_of_ == nullptr) {
    conv->to_batchnorm_ = true;
    input_of_ = conv;
  }
  if (!conv->opt_.bias || conv->bias_folded_ || bias_of_ != nullptr) return false;
  fold_bias_of(*conv);
  return true;
}

void BatchNorm2d::describe(std::ostream& os, int indent) const {
  os << "BatchNorm2d(" << c_ << ", eps=" << detail::py_float(eps_)
     << ", momentum=" << detail::py_float(momentum_) << ", affine=True, track_running_stats=True)";
  if (bias_of_ != nullptr) os << " + conv bias";
  if (fused_.residual) os << " + residual";
  if (fused_.relu) os << " + ReLU";
  detail::end_description(os, *this, indent);
}

Shape BatchNorm2d::do_setup(SetupContext& ctx, const Shape& input) {
  DP_CHECK((input.rank == 4 || input.rank == 2) && input[1] == c_,
           "BatchNorm2d(" + std::to_string(c_) + ") expects (N, " + std::to_string(c_) +
               ", H, W) or (N, " + std::to_string(c_) + ") input, got " + input.str());
  DP_CHECK(gamma_.valid(), "BatchNorm2d: setup() before declare()");
  const Layout l = layout_for(input, ctx.layout);
  x_planned_ = y_planned_ = {};
  // Narrower where the backend stores activations so (both this batch norm and convolutions
  // take bf16) and every reader takes it: the convolution this layer feeds alone, or readers
  // that said so (the next residual block).
  y_dtype_ = (output_to_ != nullptr || readers_take() == DType::bf16) && input.rank == 4 &&
                     ctx.backend.batchnorm_takes(DType::bf16, l) &&
                     ctx.backend.conv_takes(DType::bf16)
                 ? DType::bf16
                 : DType::f32;
  ctx.arena.allocate_planned(y_, input, y_dtype_, l);
  // dx goes to the convolution that wrote x alone (input_of_): of its output dtype, as x.
  ctx.arena.allocate_planned(dx_, input,
                             input_of_ != nullptr ? input_of_->output_dtype() : DType::f32, l);
  if (fused_.relu) ctx.arena.allocate_planned(dz_, input, DType::f32, l);
  save_mean_ = ctx.arena.allocate({c_});
  save_invstd_ = ctx.arena.allocate({c_});
  stats_ = ctx.arena.allocate({4 * c_});
  if (bias_of_ != nullptr) {
    DP_CHECK(input.rank == 4 && bias_of_->bias().valid(),
             "BatchNorm2d(" + std::to_string(c_) +
                 "): the folded convolution's bias is not declared, or the input is not (N, C, "
                 "H, W)");
    // Where the backend's kernels take the bias (batchnorm_folds_bias) they shift the mean.
    shifted_mean_ = Tensor();
    if (!ctx.backend.batchnorm_folds_bias(l)) shifted_mean_ = ctx.arena.allocate({c_});
  }
  ctx.backend.prepare_batchnorm(input, l);
  return input;
}

int64_t BatchNorm2d::values_per_channel(int64_t batch) const {
  const Shape& in = input_shape();
  return in.rank == 4 ? batch * in[2] * in[3] : batch;
}

namespace {
/// The bias of the convolution a batch norm folds (an empty tensor without one), and whether the
/// backend's kernels take it (Backend::batchnorm_folds_bias): then `e` carries it, else the
/// caller adds its share with Backend::add.
bool fold_in_kernel(const RunContext& ctx, const Conv2d* bias_of, Layout layout, Tensor& bias,
                    BnEpilogue& e) {
  bias = bias_of != nullptr ? ctx.params.param(bias_of->bias()) : Tensor();
  const bool in_kernel = bias_of != nullptr && ctx.backend.batchnorm_folds_bias(layout);
  if (in_kernel) e.conv_bias = &bias;
  return in_kernel;
}
}  // namespace

// Synchronised statistics: two allreduces of C floats (sums, then squared deviations from the
// global mean: no cancellation), then normalisation with the global mean and variance.
Tensor BatchNorm2d::forward_synchronised(RunContext& ctx, const Tensor& x, const Tensor& y,
                                         const BnEpilogue& epilogue) {
  DP_CHECK(ctx.global_batch >= 1, "BatchNorm2d: synchronised statistics need the global batch");
  const int64_t count = values_per_channel(ctx.global_batch);
  DP_CHECK(count > 1, "BatchNorm2d(" + std::to_string(c_) +
                          "): synchronised batch norm needs more than one value per channel over "
                          "every replica, got " +
                          std::to_string(count));
  Backend& b = ctx.backend;
  const Tensor mean = stats_.slice_batch(0, c_), var = stats_.slice_batch(c_, c_);
  b.batchnorm_sums(x, nullptr, mean);
  ctx.comm->allreduce_sum(mean.f32(), static_cast<size_t>(c_));
  b.scale(mean, 1.0f / static_cast<float>(count));
  b.batchnorm_sums(x, &mean, var);
  ctx.comm->allreduce_sum(var.f32(), static_cast<size_t>(c_));
  b.scale(var, 1.0f / static_cast<float>(count));
  Tensor folded;
  BnEpilogue e = epilogue;
  const bool in_kernel = fold_in_kernel(ctx, bias_of_, x.layout, folded, e);
  b.batchnorm_apply_stats(x, ctx.params.param(gamma_), ctx.params.param(beta_), mean, var,
                          ctx.params.buffer(mean_), ctx.params.buffer(var_), momentum_, eps_, count,
                          save_mean_, save_invstd_, y, e);
  if (bias_of_ != nullptr && !in_kernel) {
    b.add(ctx.params.buffer(mean_), folded, ctx.params.buffer(mean_), momentum_);
  }
  sync_count_ = count;
  return y;
}

// This replica's dgamma and dbeta are its own sums (the gradient allreduce adds the replicas');
// dx needs every replica's sums.
void BatchNorm2d::backward_synchronised(RunContext& ctx, const Tensor& dy, const Tensor& dx,
                                        const BnEpilogueGrad& epilogue) {
  Backend& b = ctx.backend;
  const Tensor sums = stats_.slice_batch(2 * c_, 2 * c_);
  b.batchnorm_backward_sums(x_, dy, save_mean_, save_invstd_, sums, epilogue);
  b.copy(ctx.params.grad(beta_).data, sums.data, static_cast<size_t>(c_) * sizeof(float));
  b.copy(ctx.params.grad(gamma_).data, sums.f32() + c_, static_cast<size_t>(c_) * sizeof(float));
  ctx.comm->allreduce_sum(sums.f32(), static_cast<size_t>(2 * c_));
  b.batchnorm_backward_apply(x_, epilogue.dz != nullptr ? *epilogue.dz : dy,
                             ctx.params.param(gamma_), save_mean_, save_invstd_, sums, sync_count_,
                             dx);
}

Tensor BatchNorm2d::forward(RunContext& ctx, const Tensor& x, const Tensor& residual) {
  DP_CHECK(fused_.residual, "BatchNorm2d(" + std::to_string(c_) +
                                "): forward with a residual needs a batch norm built with "
                                "Fused::residual");
  residual_ = &residual;
  try {
    Tensor y = Module::forward(ctx, x);
    residual_ = nullptr;
    return y;
  } catch (...) {
    residual_ = nullptr;
    throw;
  }
}

Tensor BatchNorm2d::do_forward(RunContext& ctx, const Tensor& x) {
  DP_CHECK(!fused_.residual || residual_ != nullptr,
           "BatchNorm2d(" + std::to_string(c_) +
               "): built with Fused::residual, so forward needs the residual: call "
               "forward(ctx, x, residual)");
  x_ = x;
  const Tensor y = view(y_, x.shape[0], x.layout);
  BnEpilogue epilogue{residual_, fused_.relu};
  const Tensor gamma = ctx.params.param(gamma_), beta = ctx.params.param(beta_);
  const Tensor mean = ctx.params.buffer(mean_), var = ctx.params.buffer(var_);
  if (ctx.training && ctx.comm != nullptr && ctx.comm->size() > 1) {
    forward_synchronised(ctx, x, y, epilogue);
    return y;
  }
  // The statistics are of the input without the folded bias: the running mean gets the bias's
  // share, and evaluation normalises with (x + bias) - running_mean = x - (running_mean - bias).
  // The backend's kernels do it in their own passes where it folds the bias, else an add does.
  Tensor folded;
  const bool in_kernel = fold_in_kernel(ctx, bias_of_, x.layout, folded, epilogue);
  if (ctx.training) {
    sync_count_ = 0;
    ctx.backend.batchnorm_forward_train(x, gamma, beta, mean, var, momentum_, eps_, save_mean_,
                                        save_invstd_, y, epilogue);
    if (bias_of_ != nullptr && !in_kernel) ctx.backend.add(mean, folded, mean, momentum_);
  } else if (bias_of_ != nullptr && !in_kernel) {
    ctx.backend.add(mean, folded, shifted_mean_, -1.0f);
    ctx.backend.batchnorm_forward_infer(x, gamma, beta, shifted_mean_, var, eps_, y, epilogue);
  } else {
    ctx.backend.batchnorm_forward_infer(x, gamma, beta, mean, var, eps_, y, epilogue);
  }
  return y;
}

StepSchedule::Handle BatchNorm2d::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  // Built with a residual and walked on its own (the outermost module), its residual comes from
  // outside the plan; a container calls the form with the residual (Residual does).
  return schedule_forward(s, x, {});
}

// Forward reads the residual too (nothing of it is kept: its gradient is the epilogue's).
StepSchedule::Handle BatchNorm2d::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x,
                                                   const StepSchedule::Handle& residual) {
  x_planned_ = x;
  s.step();
  s.read(x);
  s.read(residual);
  y_planned_ = s.write(y_);
  return y_planned_;
}

// One step: reads dy, the input and, with a fused ReLU, the output (its mask); writes dx and,
// with a fused ReLU, the masked gradient (read later by the residual block's shortcut); without
// one the epilogue gradient is dy itself.
StepSchedule::Handle BatchNorm2d::schedule_backward(StepSchedule& s,
                                                    const StepSchedule::Handle& dy) {
  s.step();
  s.read(dy);
  s.read(x_planned_);
  if (fused_.relu) s.read(y_planned_);
  epilogue_handle_ = fused_.relu ? s.write(dz_) : dy;
  return s.write(dx_);
}

Tensor BatchNorm2d::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  // The backend computes dx together with dgamma/dbeta, so dx is always written.
  epilogue_grad_ = Tensor();  // stays empty if this backward fails
  const int64_t n = dy.shape[0];
  const Tensor dx = view(dx_, n, x_.layout);
  const Tensor y = view(y_, n, x_.layout), dz = fused_.relu ? view(dz_, n, x_.layout) : Tensor();
  const BnEpilogueGrad epilogue = fused_.relu ? BnEpilogueGrad{&y, &dz} : BnEpilogueGrad{};
  if (sync_count_ > 0) {
    backward_synchronised(ctx, dy, dx, epilogue);
  } else {
    ctx.backend.batchnorm_backward(x_, dy, ctx.params.param(gamma_), save_mean_, save_invstd_, eps_,
                                   dx, ctx.params.grad(gamma_), ctx.params.grad(beta_), epilogue);
  }
  epilogue_grad_ = fused_.relu ? dz : dy;
  ctx.gradient_ready(gamma_);
  ctx.gradient_ready(beta_);
  return need_dx ? dx : Tensor();
}

// ---- ReLU -------------------------------------------------------------------------------------

bool ReLU::fold_previous(Module& previous) {
  // Exactly these classes, this one included: a subclass may compute its output its own way.
  // Nothing set up already.
  if (typeid(*this) != typeid(ReLU) || input_shape().rank != 0 ||
      previous.input_shape().rank != 0 || folded_) {
    return false;
  }
  const std::type_info& type = typeid(previous);
  if (type == typeid(Conv2d)) {
    folded_ = static_cast<Conv2d&>(previous).fuse_relu();
  } else if (type == typeid(Linear)) {
    folded_ = static_cast<Linear&>(previous).fuse_relu();
  } else if (type == typeid(BatchNorm2d)) {
    folded_ = static_cast<BatchNorm2d&>(previous).fuse_relu();
  }
  return folded_;
}

void ReLU::describe(std::ostream& os, int indent) const {
  os << "ReLU()";
  if (folded_) os << " (fused into the layer before)";
  detail::end_description(os, *this, indent);
}

Shape ReLU::do_setup(SetupContext& ctx, const Shape& input) {
  y_ = dx_ = Tensor();
  y_planned_ = {};
  if (folded_) return input;  // the layer before writes the output and masks the gradient
  const Layout l = layout_for(input, ctx.layout);
  ctx.arena.allocate_planned(y_, input, DType::f32, l);
  ctx.arena.allocate_planned(dx_, input, DType::f32, l);
  return input;
}

Tensor ReLU::do_forward(RunContext& ctx, const Tensor& x) {
  if (folded_) return x;
  // y_ keeps the layout of this forward's input so backward can give dx the same one.
  y_.layout = x.layout;
  const Tensor y = y_.with_batch(x.shape[0]);
  ctx.backend.relu_forward(x, y);
  return y;
}

// Folded: a step that reads x and passes it on, as Flatten's.
StepSchedule::Handle ReLU::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  if (folded_) {
    s.step();
    s.read(x);
    return x;
  }
  y_planned_ = forward_leaf(s, x, y_);
  return y_planned_;
}

// The gradient reads the output (its mask). Folded: the layer before masks it; dy passes on.
StepSchedule::Handle ReLU::schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) {
  if (folded_) return Module::schedule_backward(s, dy);
  return backward_leaf(s, dy, dx_, {&y_planned_});
}

Tensor ReLU::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  if (!need_dx) return Tensor();
  if (folded_) return dy;
  const Tensor dx = view(dx_, dy.shape[0], y_.layout);
  ctx.backend.relu_backward(y_.with_batch(dy.shape[0]), dy, dx);
  return dx;
}

// ---- pooling ----------------------------------------------------------------------------------

namespace {

PoolGeometry make_pool(const char* type, int64_t kernel, int64_t stride, int64_t padding) {
  DP_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel,
           std::string(type) + "(kernel_size=" + std::to_string(kernel) +
               ", stride=" + std::to_string(stride) + ", padding=" + std::to_string(padding) +
               "): kernel and stride must be >= 1 and padding at most half the kernel");
  PoolGeometry g;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = padding;
  return g;
}

Shape pool_output(const Module& m, const PoolGeometry& g, const Shape& input) {
  check_rank4(m, m.type(), input);
  DP_CHECK(input[2] + 2 * g.pad_h >= g.kernel_h && input[3] + 2 * g.pad_w >= g.kernel_w,
           std::string(m.type()) + ": window " + std::to_string(g.kernel_h) +
               " is larger than the padded input " + input.str());
  return {input[0], input[1], g.out_h(input[2]), g.out_w(input[3])};
}

void describe_pool(std::ostream& os, const Module& m, const PoolGeometry& g, int indent,
                   const char* extra) {
  os << m.type() << "(kernel_size=" << g.kernel_h << ", stride=" << g.stride_h
     << ", padding=" << g.pad_h << extra << ")";
  detail::end_description(os, m, indent);
}

}  // namespace

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : g_(make_pool("AvgPool2d", kernel, stride, padding)) {}

void AvgPool2d::describe(std::ostream& os, int indent) const {
  describe_pool(os, *this, g_, indent, "");
}

Shape AvgPool2d::do_setup(SetupContext& ctx, const Shape& input) {
  const Shape out = pool_output(*this, g_, input);
  ctx.arena.allocate_planned(y_, out, DType::f32, ctx.layout);
  ctx.arena.allocate_planned(dx_, input, DType::f32, ctx.layout);
  return out;
}

Tensor AvgPool2d::do_forward(RunContext& ctx, const Tensor& x) {
  const Tensor y = view(y_, x.shape[0], x.layout);
  dx_.layout = x.layout;
  ctx.backend.avgpool_forward(g_, x, y);
  return y;
}

StepSchedule::Handle AvgPool2d::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  return forward_leaf(s, x, y_);
}

// The gradient needs only dy.
StepSchedule::Handle AvgPool2d::schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) {
  return backward_leaf(s, dy, dx_);
}

Tensor AvgPool2d::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor dx = dx_.with_batch(dy.shape[0]);
  ctx.backend.avgpool_backward(g_, dy, dx);
  return dx;
}

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : g_(make_pool("MaxPool2d", kernel, stride, padding)) {}

void MaxPool2d::describe(std::ostream& os, int indent) const {
  describe_pool(os, *this, g_, indent, ", dilation=1, ceil_mode=False");
}

Shape MaxPool2d::do_setup(SetupContext& ctx, const Shape& input) {
  const Shape out = pool_output(*this, g_, input);
  x_planned_ = y_planned_ = {};
  ctx.arena.allocate_planned(y_, out, DType::f32, ctx.layout);
  ctx.arena.allocate_planned(dx_, input, DType::f32, ctx.layout);
  return out;
}

Tensor MaxPool2d::do_forward(RunContext& ctx, const Tensor& x) {
  x_ = x;
  const Tensor y = view(y_, x.shape[0], x.layout);
  ctx.backend.maxpool_forward(g_, x, y);
  return y;
}

StepSchedule::Handle MaxPool2d::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  x_planned_ = x;
  y_planned_ = forward_leaf(s, x, y_);
  return y_planned_;
}

// The gradient finds each window's maximum again: it reads the input and the output.
StepSchedule::Handle MaxPool2d::schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) {
  return backward_leaf(s, dy, dx_, {&x_planned_, &y_planned_});
}

Tensor MaxPool2d::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor dx = view(dx_, dy.shape[0], x_.layout);
  ctx.backend.maxpool_backward(g_, x_, view(y_, dy.shape[0], x_.layout), dy, dx);
  return dx;
}

// ---- GlobalAvgPool ----------------------------------------------------------------------------

Shape GlobalAvgPool::do_setup(SetupContext& ctx, const Shape& input) {
  check_rank4(*this, "GlobalAvgPool", input);
  const Shape out{input[0], input[1], 1, 1};
  ctx.arena.allocate_planned(y_, out, DType::f32, ctx.layout);
  ctx.arena.allocate_planned(dx_, input, DType::f32, ctx.layout);
  return out;
}

Tensor GlobalAvgPool::do_forward(RunContext& ctx, const Tensor& x) {
  const Tensor y = view(y_, x.shape[0], x.layout);
  dx_.layout = x.layout;
  ctx.backend.global_avgpool_forward(x, y);
  return y;
}

StepSchedule::Handle GlobalAvgPool::schedule_forward(StepSchedule& s,
                                                     const StepSchedule::Handle& x) {
  return forward_leaf(s, x, y_);
}

// The gradient needs only dy.
StepSchedule::Handle GlobalAvgPool::schedule_backward(StepSchedule& s,
                                                      const StepSchedule::Handle& dy) {
  return backward_leaf(s, dy, dx_);
}

Tensor GlobalAvgPool::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  if (!need_dx) return Tensor();
  const Tensor dx = dx_.with_batch(dy.shape[0]);
  ctx.backend.global_avgpool_backward(dy, dx);
  return dx;
}

// ---- Flatten ----------------------------------------------------------------------------------

Shape Flatten::do_setup(SetupContext& ctx, const Shape& input) {
  in_ = input;
  if (input.rank == 4) {
    ctx.flat = {input[1], input[2], input[3],
                ctx.layout == Layout::nhwc && input[2] * input[3] > 1};
  }
  return {input[0], input.per_example()};
}

StepSchedule::Handle Flatten::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  s.step();
  s.read(x);
  return x;
}

// A view in memory order; in NCHW this is PyTorch's flatten order (in NHWC the features come
// in (H, W, C) order, which the following Linear learns just the same).
Tensor Flatten::do_forward(RunContext& ctx, const Tensor& x) {
  in_layout_ = x.layout;
  Tensor y = x.reshaped({x.shape[0], in_.per_example()});
  y.layout = Layout::nchw;
  return y;
}

Tensor Flatten::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  if (!need_dx) return Tensor();
  Tensor dx = dy.reshaped(in_.with_batch(dy.shape[0]));
  dx.layout = layout_for(dx.shape, in_layout_);
  return dx;
}

// ---- Linear -----------------------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Init weight_init,
               Init bias_init)
    : in_(in_features),
      out_(out_features),
      has_bias_(bias),
      w_init_(weight_init),
      b_init_(bias_init) {
  DP_CHECK(in_ >= 1 && out_ >= 1, "Linear(in_features=" + std::to_string(in_) + ", out_features=" +
                                      std::to_string(out_) + "): feature counts must be positive");
}

void Linear::declare(ParamRegistry& registry, const std::string& prefix) {
  w_ = registry.add_parameter(prefix + "weight", {out_, in_}, w_init_);
  if (has_bias_) b_ = registry.add_parameter(prefix + "bias", {out_}, b_init_);
}

void Linear::describe(std::ostream& os, int indent) const {
  os << "Linear(in_features=" << in_ << ", out_features=" << out_
     << ", bias=" << (has_bias_ ? "True" : "False") << ")";
  if (relu_) os << " + ReLU";
  detail::end_description(os, *this, indent);
}

bool Linear::fuse_relu() {
  DP_CHECK(input_shape().rank == 0,
           "Linear(in_features=" + std::to_string(in_) + "): fuse_relu after setup; fuse before");
  if (relu_) return false;
  relu_ = true;
  return true;
}

Shape Linear::do_setup(SetupContext& ctx, const Shape& input) {
  DP_CHECK(input.rank == 2 && input[1] == in_,
           "Linear(in_features=" + std::to_string(in_) + ") expects (N, " + std::to_string(in_) +
               ") input, got " + input.str() + (input.rank == 4 ? " (add a Flatten first)" : ""));
  DP_CHECK(w_.valid(), "Linear: setup() before declare()");
  // Features straight from a Flatten keep its order; this layer's outputs have their own.
  input_order_ = ctx.flat.c * ctx.flat.h * ctx.flat.w == in_ ? ctx.flat : FlatFeatures{};
  ctx.flat = {};
  const Shape out{input[0], out_};
  ctx.backend.prepare_linear(input[0], in_, out_);
  x_planned_ = y_planned_ = {};
  ctx.arena.allocate_planned(y_, out);
  ctx.arena.allocate_planned(dx_, input);
  dz_ = Tensor();
  if (relu_) ctx.arena.allocate_planned(dz_, out);
  return out;
}

void Linear::parameter_orders(std::vector<ParamOrder>& out) {
  if (!input_order_.hwc) return;
  const int64_t C = input_order_.c, H = input_order_.h, W = input_order_.w;
  ParamOrder order{w_, std::vector<int64_t>(static_cast<size_t>(out_ * in_))};
  // Column (h * W + w) * C + c of ours is column c * H * W + h * W + w of PyTorch's.
  for (int64_t o = 0; o < out_; ++o)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w)
        for (int64_t c = 0; c < C; ++c)
          order.pytorch_index[static_cast<size_t>(o * in_ + (h * W + w) * C + c)] =
              o * in_ + c * H * W + h * W + w;
  out.push_back(std::move(order));
}

Tensor Linear::do_forward(RunContext& ctx, const Tensor& x) {
  x_ = x;
  const Tensor y = view(y_, x.shape[0], x.layout);
  const Tensor w = ctx.params.param(w_);
  if (b_.valid()) {
    const Tensor b = ctx.params.param(b_);
    ctx.backend.linear_forward(x, w, &b, y, relu_, ctx.params.param_bf16(w_));
  } else {
    ctx.backend.linear_forward(x, w, nullptr, y, relu_, ctx.params.param_bf16(w_));
  }
  return y;
}

StepSchedule::Handle Linear::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  x_planned_ = x;
  y_planned_ = forward_leaf(s, x, y_);
  return y_planned_;
}

// The weight gradient reads the input. A fused ReLU's backward is a step before, as Conv2d's.
StepSchedule::Handle Linear::schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) {
  const StepSchedule::Handle grad = relu_ ? relu_mask_step(s, dy, y_planned_, dz_) : dy;
  return backward_leaf(s, grad, dx_, {&x_planned_});
}

Tensor Linear::do_backward(RunContext& ctx, const Tensor& dy_in, bool need_dx) {
  const Tensor dx = view(dx_, dy_in.shape[0], x_.layout);
  const Tensor dw = ctx.params.grad(w_);
  Tensor db;
  if (b_.valid()) db = ctx.params.grad(b_);
  // A fused ReLU's backward takes the bias gradient too.
  const int64_t n = dy_in.shape[0];
  const Tensor dy = relu_ ? relu_mask(ctx, y_.with_batch(n), dy_in, dz_.with_batch(n), b_) : dy_in;
  ctx.backend.linear_backward(x_, ctx.params.param(w_), dy, need_dx ? &dx : nullptr, dw,
                              b_.valid() && !relu_ ? &db : nullptr, ctx.params.param_bf16(w_));
  ctx.gradient_ready(w_);
  ctx.gradient_ready(b_);
  return need_dx ? dx : Tensor();
}

}  // namespace dp
