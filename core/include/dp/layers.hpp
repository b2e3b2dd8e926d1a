#pragma once
// The layers. Parameter names and shapes follow PyTorch (Conv2d.weight (K,C,R,S), .bias (K);
// Linear.weight (OUT,IN), .bias (OUT); BatchNorm2d.weight/.bias/.running_mean/.running_var),
// so checkpoints map one to one onto the PyTorch reference models. In an NHWC model a Conv2d
// keeps its weight in (K, R, S, C) order (ParamRegistry::layout), which checkpoints write in
// PyTorch's (ParamRegistry::Entry::layout).
#include <memory>
#include <string>

#include "dp/module.hpp"

namespace dp {

class BatchNorm2d;

/// x (N,C,H,W) -> (N,K,P,Q). Weights default to N(0, 0.01^2) and biases to 0, as d2l does.
/// The weight is stored in the registry's layout (ParamRegistry::layout): (K, C, R, S) in
/// NCHW, (K, R, S, C) in NHWC, the order the NHWC passes read (ConvUse::filter_layout).
class Conv2d : public Module {
 public:
  struct Options {
    int64_t kernel = 3;
    int64_t stride = 1;
    int64_t padding = 0;
    bool bias = true;
    Init weight_init = Init::normal(0.01f);
    Init bias_init = Init::zeros();
  };
  Conv2d(int64_t in_channels, int64_t out_channels, Options options);
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1,
         int64_t padding = 0, bool bias = true);
  const char* type() const override { return "Conv2d"; }
  void declare(ParamRegistry& registry, const std::string& prefix) override;
  void describe(std::ostream& os, int indent = 0) const override;

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;

  int64_t out_channels() const { return out_; }
  /// The weight's memory order (after declare): ParamRegistry::layout at declaration.
  Layout weight_layout() const { return w_layout_; }
  /// The bias parameter (after declare(); invalid without a bias).
  ParamHandle bias() const { return b_; }
  /// Whether the batch norm after it adds the bias instead (BatchNorm2d::fold_bias_of): then
  /// forward leaves it out, and its gradient is the 0 every gradient starts at, which no
  /// backward pass writes (ParamRegistry::allocate).
  bool bias_folded() const { return bias_folded_; }
  /// The dtype of its output (after setup): f32, or where only a batch norm reads it, what the
  /// backend stores it as (ConvPlan::output_dtype). Its output gradient has it too.
  DType output_dtype() const override;
  /// The dtype of the x it takes (after setup): f32, or that of the batch norm's output that
  /// only this layer reads (BatchNorm2d::feeds, ConvPlan::input_dtype), whose backward takes
  /// its input gradient so (BatchNorm2d::output_grad_dtype), or the dtype its container gave
  /// (set_input_dtype; its input gradient is then f32, unless set_input_grad_takes names that
  /// dtype).
  DType input_dtype() const;
  /// f32, and what the backend's convolutions take (Backend::conv_takes: precision bf16 on the
  /// GPU, whose passes round x to bf16 anyway).
  bool takes_input(DType dtype, const SetupContext& ctx) const override;
  /// The dtype the reader of its input gradient takes, called by a container before setup (a
  /// residual block's add, Backend::add): where that is the dtype of the x it is given
  /// (set_input_dtype, not f32), dx is stored so, holding the values backward-data rounds to
  /// anyway. f32 unless set; the batch norm that feeds it (BatchNorm2d::feeds) decides instead.
  void set_input_grad_takes(DType dtype) { input_grad_takes_ = dtype; }
  /// The dtype of its input gradient (after setup).
  DType input_grad_dtype() const { return dx_.dtype; }
  /// Takes over the ReLU that alone reads its output (ReLU::fold_previous): forward writes
  /// relu(conv + bias) (ConvUse::output_relu: on the cuda backend in the pass that adds the
  /// bias), and backward masks its output gradient and sums the bias gradient together
  /// (Backend::relu_backward_bias: on the cuda backend one pass). The output lives until
  /// backward, which reads its sign; the ReLU's own output buffer is gone, and its gradient
  /// buffer is this layer's masked gradient. Before setup; false (nothing done) where a batch
  /// norm reads the output or a ReLU is fused already.
  bool fuse_relu();
  /// Whether forward writes its output's ReLU (fuse_relu).
  bool relu_fused() const { return relu_; }

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  // fold_bias_of sets bias_folded_ and to_batchnorm_, feeds sets input_from_
  friend class BatchNorm2d;
  int64_t in_, out_;
  Options opt_;
  bool bias_folded_ = false;
  /// Only a batch norm reads the output (ConvUse::output_to_batchnorm): set by the
  /// BatchNorm2d that folds the bias or that Sequential adds right after this layer.
  bool to_batchnorm_ = false;
  /// The batch norm whose output only this layer reads (BatchNorm2d::feeds): x takes its
  /// output dtype (ConvUse::input_dtype).
  const BatchNorm2d* input_from_ = nullptr;
  DType input_grad_takes_ = DType::f32;  // set_input_grad_takes
  bool relu_ = false;                    // fuse_relu
  std::string name_;  // the dotted path, for the backend's messages ("resnet_block2.0.conv1")
  ParamHandle w_, b_;
  Layout w_layout_ = Layout::nchw;  // the weight's memory order (declare)
  std::unique_ptr<ConvPlan> plan_;
  Tensor x_, y_, dx_;  // x_: the last input (a view of the producer's output)
  Tensor dz_;          // with a fused ReLU: the masked output gradient
  StepSchedule::Handle x_planned_, y_planned_;  // the memory plan's walk: where x_ and y_ live
  /// With the memory plan: the workspaces of the plan's forward and backward passes, planned
  /// buffers that live only in their step (ConvUse::planned_workspace); empty when none.
  Tensor workspace_[2];
  const Tensor* workspace(ConvStage stage) const;
};

/// Per-channel batch norm on (N,C,H,W). Training: batch statistics (per replica unless
/// synchronised), running statistics with momentum; evaluation: running statistics.
///
/// What follows it can be fused into the same pass (Backend's BnEpilogue): a ReLU, and a
/// residual added before that ReLU (a residual block's bn2 -> + shortcut -> ReLU). Fused or not,
/// the values are those of the separate layers; fused, the CPU backend and the CUDA backend in
/// NHWC write the output in the same pass that normalises (the CUDA backend in NCHW runs cuDNN's
/// batch norm, then the add and the ReLU as passes of their own).
///
/// What comes before it can be folded in too: the bias of the convolution that feeds it
/// (fold_bias_of; Sequential does it for a Conv2d followed by a BatchNorm2d, and Residual for
/// its conv1/bn1 and conv2/bn2). In training, normalisation removes a per-channel constant, so
/// the output, the input gradient and the convolution's weight gradient do not depend on that
/// bias, and its exact gradient is 0: the convolution skips the bias add and the bias gradient's
/// reduction (two passes over its output on the GPU), and the batch norm adds momentum * bias to
/// the running mean, whose update saw the mean without it. In evaluation it normalises with
/// running_mean - bias. Checkpoints keep the bias where PyTorch has it, with PyTorch's meaning.
struct BatchNormFused {
  bool residual = false;  // out = bn(x) + residual: forward with forward(ctx, x, residual)
  bool relu = false;      // then max(., 0)
};

class BatchNorm2d : public Module {
 public:
  using Fused = BatchNormFused;
  explicit BatchNorm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f,
                       Fused fused = {});
  const char* type() const override { return "BatchNorm2d"; }
  void declare(ParamRegistry& registry, const std::string& prefix) override;
  void describe(std::ostream& os, int indent = 0) const override;

  using Module::forward;
  /// forward() of a batch norm built with Fused::residual; residual has the output's shape.
  Tensor forward(RunContext& ctx, const Tensor& x, const Tensor& residual);
  /// schedule_forward() of a batch norm built with Fused::residual: its step reads the residual
  /// too. A container holding such a batch norm must walk it with this form: the one-argument
  /// form would let the residual's memory be reused before this layer's forward reads it.
  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x,
                                        const StepSchedule::Handle& residual);
  /// After backward(): the gradient of bn(x) (+ residual), which is the residual's gradient:
  /// with a fused ReLU the masked gradient (this layer's buffer), else the gradient backward was
  /// given (a view of the caller's tensor). Valid until the next backward, and, with the memory
  /// plan (Arena::allocate_planned), as long as the memory plan's walk says it is read (see
  /// scheduled_epilogue()).
  Tensor epilogue_gradient() const { return epilogue_grad_; }
  /// In the memory plan's walk, after this layer's schedule_backward: the planned buffers
  /// epilogue_gradient() may live in (a residual block reads them in its shortcut's step).
  const StepSchedule::Handle& scheduled_epilogue() const { return epilogue_handle_; }

  /// Takes over the bias of `conv`, whose output only this layer reads (see BatchNormFused's
  /// comment). Before setup; conv must have a bias not folded elsewhere and this layer's channel
  /// count, and this layer no other folded bias. Throws dp::Error otherwise.
  void fold_bias_of(Conv2d& conv);
  /// A Conv2d of this layer's channel count, whose output only this layer reads: marked so
  /// (ConvUse::output_to_batchnorm, with or without a bias), and with a bias not folded yet,
  /// fold_bias_of. Returns whether the bias was folded.
  bool fold_previous(Module& previous) override;
  /// Takes over the ReLU that alone reads its output (ReLU::fold_previous), as Fused::relu:
  /// the same values, in the pass that normalises. Before setup; false (nothing done) where a
  /// ReLU is fused already.
  bool fuse_relu();
  /// Declares that only `conv` reads this layer's output (Residual's bn1 -> conv2), and that
  /// `conv` is set up after this layer. The backend may then store the output narrower, as the
  /// convolution reads it (precision bf16 on the GPU in NHWC: packed bf16, the values conv
  /// rounds its input to anyway; Backend::batchnorm_takes and Backend::conv_takes). Before
  /// setup; conv must take this layer's channel count and read no other batch norm's output.
  /// Throws dp::Error otherwise.
  void feeds(Conv2d& conv);
  /// The dtype of its output (after setup): f32, or packed bf16 where the backend's batch norm
  /// and convolutions store activations so (Backend::batchnorm_takes, Backend::conv_takes) and
  /// every reader takes it: the convolution it feeds(), or readers that said so
  /// (set_readers_take: the next residual block, whose convolutions and shortcut add read it).
  /// In precision bf16 the output is rounded to bf16 either way (Backend::batchnorm_forward_train).
  DType output_dtype() const override { return y_dtype_; }
  /// The dtype of the output gradient its backward takes from the convolution it feeds(): the
  /// output's with a fused ReLU (whose y its backward reads, Backend::batchnorm_backward), else
  /// f32. Every other reader gives it an f32 gradient.
  DType output_grad_dtype() const {
    return fused_.relu && output_to_ != nullptr ? y_dtype_ : DType::f32;
  }

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  /// Training with statistics over every replica of ctx.comm (see Backend::batchnorm_sums).
  Tensor forward_synchronised(RunContext& ctx, const Tensor& x, const Tensor& y,
                              const BnEpilogue& epilogue);
  void backward_synchronised(RunContext& ctx, const Tensor& dy, const Tensor& dx,
                             const BnEpilogueGrad& epilogue);
  int64_t values_per_channel(int64_t batch) const;

  int64_t c_;
  float eps_, momentum_;
  Fused fused_;
  ParamHandle gamma_, beta_, mean_, var_;
  Tensor x_, y_, dx_, save_mean_, save_invstd_;
  StepSchedule::Handle x_planned_, y_planned_;  // the memory plan's walk: where x_ and y_ live
  Tensor dz_;                         // with a fused ReLU: the masked gradient
  const Tensor* residual_ = nullptr;  // during forward(ctx, x, residual) only
  Tensor epilogue_grad_;              // see epilogue_gradient()
  StepSchedule::Handle epilogue_handle_;  // where epilogue_grad_ lives, for the memory plan
  Tensor stats_;            // (4C): mean, var, then the backward sums (2C), for the allreduces
  int64_t sync_count_ = 0;  // values per channel over every replica in the last sync forward
  Conv2d* bias_of_ = nullptr;  // the convolution whose bias this layer adds (fold_bias_of)
  /// The convolution whose output only this layer reads (fold_bias_of, fold_previous): x and
  /// dx take its output dtype.
  Conv2d* input_of_ = nullptr;
  const Conv2d* output_to_ = nullptr;  // the convolution that alone reads the output (feeds)
  DType y_dtype_ = DType::f32;         // output_dtype()
  Tensor shifted_mean_;        // (C) with bias_of_: running_mean - bias, for evaluation
};

/// max(x, 0). Added to a Sequential right after a Conv2d, a Linear or a BatchNorm2d (exactly
/// those classes, and this one not a subclass), it is fused into that layer (fold_previous): the
/// layer writes its output's ReLU, and its backward masks the gradient where it sums its bias
/// gradient (on the cuda backend in the passes that add the bias and sum its gradient, where the
/// layer has a bias; a batch norm in its normalising and summing passes); this module then
/// passes its input and its gradient through. The values are those of the separate layer.
class ReLU : public Module {
 public:
  const char* type() const override { return "ReLU"; }
  void describe(std::ostream& os, int indent = 0) const override;
  /// Fuses this ReLU into `previous` when it is a Conv2d, a Linear or a BatchNorm2d that takes it
  /// (Conv2d::fuse_relu, Linear::fuse_relu, BatchNorm2d::fuse_relu).
  bool fold_previous(Module& previous) override;
  /// Whether the layer before computes this ReLU (fold_previous).
  bool folded() const { return folded_; }

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  bool folded_ = false;
  Tensor y_, dx_;
  StepSchedule::Handle y_planned_;  // the memory plan's walk: where y_ lives
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0);
  const char* type() const override { return "AvgPool2d"; }
  void describe(std::ostream& os, int indent = 0) const override;

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  PoolGeometry g_;
  Tensor y_, dx_;
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0);
  const char* type() const override { return "MaxPool2d"; }
  void describe(std::ostream& os, int indent = 0) const override;

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  PoolGeometry g_;
  Tensor x_, y_, dx_;
  StepSchedule::Handle x_planned_, y_planned_;  // the memory plan's walk: where x_ and y_ live
};

/// (N,C,H,W) -> (N,C,1,1), as PyTorch's AdaptiveAvgPool2d((1,1)).
class GlobalAvgPool : public Module {
 public:
  const char* type() const override { return "AdaptiveAvgPool2d"; }

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  Tensor y_, dx_;
};

/// (N,C,H,W) -> (N,C*H*W): a view, no copy (NCHW order, as PyTorch's flatten).
class Flatten : public Module {
 public:
  const char* type() const override { return "Flatten"; }
  /// Its output is a view of its input: the walk's step reads x and returns it.
  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  Shape in_;
  Layout in_layout_ = Layout::nchw;  // layout of the last forward's input, given back to dx
};

/// x (N,IN) -> (N,OUT). Weights default to N(0, 0.01^2), biases to 0.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Init weight_init = Init::normal(0.01f), Init bias_init = Init::zeros());
  const char* type() const override { return "Linear"; }
  void declare(ParamRegistry& registry, const std::string& prefix) override;
  void describe(std::ostream& os, int indent = 0) const override;
  /// Linear's weight columns follow its input features: after an NHWC Flatten they are in
  /// (H, W, C) order and are reported for permutation to PyTorch's (C, H, W).
  void parameter_orders(std::vector<ParamOrder>& out) override;
  /// Takes over the ReLU that alone reads its output, as Conv2d::fuse_relu (linear_forward's
  /// relu, Backend::relu_backward_bias). Before setup; false where a ReLU is fused already.
  bool fuse_relu();
  bool relu_fused() const { return relu_; }

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  FlatFeatures input_order_;
  int64_t in_, out_;
  bool has_bias_;
  bool relu_ = false;  // fuse_relu
  Init w_init_, b_init_;
  ParamHandle w_, b_;
  Tensor x_, y_, dx_;
  Tensor dz_;                                   // with a fused ReLU: the masked output gradient
  StepSchedule::Handle x_planned_, y_planned_;  // the memory plan's walk: where x_ and y_ live
};

/// The d2l residual block: y = ReLU(bn2(conv2(ReLU(bn1(conv1(x))))) + shortcut(x)) where
/// shortcut is x, or conv3(x) (1x1, stride) when use_1x1conv. Children are named conv1, conv2,
/// conv3, bn1, bn2 as in d2l's Residual. Both ReLUs and the add are fused into the batch norms
/// (bn1 + ReLU; bn2 + shortcut + ReLU), and conv1's and conv2's biases into bn1 and bn2.
class Residual : public Module {
 public:
  Residual(int64_t in_channels, int64_t out_channels, bool use_1x1conv = false, int64_t stride = 1);
  const char* type() const override { return "Residual"; }
  void declare(ParamRegistry& registry, const std::string& prefix) override;
  void describe(std::ostream& os, int indent = 0) const override;
  std::vector<Module*> children() override;

  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;
  /// f32, and a dtype that conv1, and conv3 or (an identity shortcut) bn2's residual add, take.
  bool takes_input(DType dtype, const SetupContext& ctx) const override;
  /// bn2's: the block's output, stored as bf16 where its readers take it (the next block).
  DType output_dtype() const override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  std::unique_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::unique_ptr<BatchNorm2d> bn1_, bn2_;
  Tensor dx_;
};

}  // namespace dp
