// The contracts of the convolution and linear ops of dp::Backend: every argument checked once
// for every backend, then the backend's *_impl runs (the tiny-cuda-nn pattern).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend_checker.hpp"

namespace dp {

using namespace checks;

// ---- convolution --------------------------------------------------------------------------------

std::unique_ptr<ConvPlan> Backend::plan_conv(const ConvGeometry& g, const ConvUse& use) {
  refuse_while_capturing("plan_conv");
  const Checker check(*this, "plan_conv");
  if (g.max_batch < 1 || g.in_channels < 1 || g.in_h < 1 || g.in_w < 1 || g.out_channels < 1 ||
      g.kernel_h < 1 || g.kernel_w < 1 || g.stride_h < 1 || g.stride_w < 1 || g.pad_h < 0 ||
      g.pad_w < 0) {
    check.fail("every size must be positive and padding non-negative, got " + g.str());
  }
  // out_h() >= 1 is not enough: the division truncates toward zero.
  if (g.in_h + 2 * g.pad_h < g.kernel_h || g.in_w + 2 * g.pad_w < g.kernel_w) {
    check.fail("the kernel is larger than the padded input in " + g.str());
  }
  for (const auto* list : {&use.train_batches, &use.infer_batches}) {
    for (int64_t n : *list) {
      if (n < 1 || n > g.max_batch) {
        check.fail("batch size " + std::to_string(n) + " declared for " +
                   (use.layer.empty() ? std::string("the plan") : use.layer) +
                   " is outside [1, max_batch = " + std::to_string(g.max_batch) + "] of " +
                   g.str());
      }
    }
  }
  if (!conv_takes(use.input_dtype)) {
    check.fail(std::string("ConvUse::input_dtype ") + dtype_name(use.input_dtype) + " for " +
               (use.layer.empty() ? std::string("the plan") : use.layer) +
               ": this backend's convolutions take no such x (f32 always; another dtype where "
               "Backend::conv_takes says so)");
  }
  if (use.output_relu && use.output_to_batchnorm) {
    check.fail("ConvUse::output_relu with output_to_batchnorm for " +
               (use.layer.empty() ? std::string("the plan") : use.layer) +
               ": a batch norm reads the convolution's own output, not its ReLU");
  }
  if (use.filter_layout != Layout::nchw && use.filter_layout != g.layout) {
    check.fail(std::string("ConvUse::filter_layout ") + layout_name(use.filter_layout) + " for " +
               (use.layer.empty() ? std::string("the plan") : use.layer) + " of " +
               layout_name(g.layout) +
               " activations: a filter is (K, C, R, S) (nchw) in memory, or (K, R, S, C) (nhwc) "
               "for NHWC activations only");
  }
  std::unique_ptr<ConvPlan> plan = plan_conv_impl(g, use);
  DP_ASSERT(plan != nullptr);
  plan->owner_ = this;
  plan_workspace(*plan, use);
  plan->output_dtype_ = conv_output_dtype_impl(*plan);
  plan->input_dtype_ = use.input_dtype;
  plan->output_relu_ = use.output_relu;
  plan->filter_layout_ = use.filter_layout;
  if (plan->output_dtype_ != DType::f32 &&
      !(use.output_to_batchnorm && batchnorm_takes(plan->output_dtype_, g.layout))) {
    throw InternalError(prefix("plan_conv") + "the plan's output is " +
                        dtype_name(plan->output_dtype_) +
                        ", which only a batch norm that takes it may read (ConvUse::"
                        "output_to_batchnorm, Backend::batchnorm_takes)");
  }
  DP_ASSERT(use.planned_workspace ||
            (plan->workspace_bytes_[0] == 0 && plan->workspace_bytes_[1] == 0));
  return plan;
}

bool Backend::conv_takes(DType dtype) const {
  return dtype == DType::f32 || conv_takes_impl(dtype);
}

void Backend::need_workspace(ConvPlan& plan, ConvStage stage, size_t bytes) {
  size_t& need = plan.workspace_bytes_[static_cast<int>(stage)];
  need = std::max(need, bytes);
}

namespace {
// y, or dy, has the plan's output dtype (named in the message, ConvPlan::output_dtype).
void check_output_dtype(const Checker& check, const ConvPlan& plan, const Tensor& t,
                        const char* what) {
  if (t.dtype != plan.output_dtype()) {
    check.fail(std::string(what) + " must be " + dtype_name(plan.output_dtype()) +
               " (the plan's output_dtype), got " + dtype_name(t.dtype));
  }
}

// w or dw: (K, C, R, S), f32, in the plan's filter layout (ConvUse::filter_layout).
void check_filter(const Checker& check, const ConvPlan& plan, const Tensor& w, const char* what) {
  check.f32(w, filter_shape(plan.geometry()), what);
  if (w.layout != plan.filter_layout()) {
    check.fail(std::string(what) + " is " + layout_name(w.layout) + " but the plan's filters are " +
               layout_name(plan.filter_layout()) +
               " (ConvUse::filter_layout: nchw is (K, C, R, S) in memory, nhwc (K, R, S, C))");
  }
}

// A weight's packed bf16 copy (conv_forward's and linear_forward's w_bf16), when given: bf16, w's
// shape and layout.
void check_filter_bf16(const Checker& check, const Tensor& w, const Tensor* w_bf16) {
  if (w_bf16 == nullptr) return;
  check.tensor(*w_bf16, DType::bf16, "w_bf16");
  check.shape(*w_bf16, w.shape, "w_bf16");
  if (w_bf16->layout != w.layout) {
    check.fail(std::string("w_bf16 is ") + layout_name(w_bf16->layout) + " but w is " +
               layout_name(w.layout) + ": the packed copy is w's, in its memory order");
  }
}

// A pass's x: (N <= max_batch, C, H, W) in the plan's layout, of the plan's input dtype. Returns N.
int64_t plan_input(const Checker& check, const ConvPlan& plan, const Tensor& x) {
  const ConvGeometry& g = plan.geometry();
  if (x.dtype != plan.input_dtype()) {
    check.fail(std::string("x must be ") + dtype_name(plan.input_dtype()) +
               " (the plan's input_dtype), got " + dtype_name(x.dtype));
  }
  return plan_activation(check, g, x, g.in_channels, g.in_h, g.in_w, "x", plan.input_dtype());
}

// A backward pass's dy: (N <= max_batch, K, P, Q) in the plan's layout, of the plan's output
// dtype. Returns N.
int64_t plan_output_grad(const Checker& check, const ConvPlan& plan, const Tensor& dy) {
  const ConvGeometry& g = plan.geometry();
  check_output_dtype(check, plan, dy, "dy");
  return plan_activation(check, g, dy, g.out_channels, g.out_h(), g.out_w(), "dy",
                         plan.output_dtype());
}

// The workspace argument of a pass of `plan` in `stage`: a plan with a planned workspace needs
// one at least as large as it said (none when it said 0); any other plan takes none.
void check_workspace(const Checker& check, const ConvPlan& plan, ConvStage stage,
                     const Tensor* workspace) {
  const size_t need = plan.workspace_bytes(stage);
  const char* name = stage == ConvStage::forward ? "forward" : "backward";
  if (!plan.planned_workspace()) {
    if (workspace != nullptr) {
      check.fail(
          "a workspace was given for a plan that keeps the backend's own (make the plan "
          "with ConvUse::planned_workspace to give it one)");
    }
    return;
  }
  if (need == 0) {
    if (workspace != nullptr) {
      check.fail(std::string("the plan's ") + name +
                 " passes need no workspace (ConvPlan::workspace_bytes is 0): pass none");
    }
    return;
  }
  if (workspace == nullptr || workspace->data == nullptr || workspace->bytes() < need) {
    check.fail(std::string("the plan was made with ConvUse::planned_workspace and its ") + name +
               " passes need a workspace of " + std::to_string(need) + " bytes, got " +
               (workspace == nullptr || workspace->data == nullptr
                    ? std::string("none")
                    : std::to_string(workspace->bytes()) + " bytes") +
               " (ConvPlan::workspace_bytes)");
  }
  check.tensor(*workspace, workspace->dtype, "workspace");
  if (reinterpret_cast<uintptr_t>(workspace->data) % 256 != 0) {
    check.fail("the workspace must start at a multiple of 256 bytes (an Arena's buffers do)");
  }
}
}  // namespace

const ConvGeometry& Backend::check_plan(const ConvPlan& plan, const char* op) const {
  if (plan.owner_ != this) {
    throw Error(prefix(op) +
                "the plan was made by another backend; make it with this backend's plan_conv");
  }
  return plan.geometry();
}

void Backend::conv_forward(ConvPlan& plan, const Tensor& x, const Tensor& w, const Tensor* b,
                           const Tensor& y, const Tensor* workspace, const Tensor* w_bf16) {
  const char* op = "conv_forward";
  const ConvGeometry& g = check_plan(plan, op);
  const Checker check(*this, op);
  const int64_t n = plan_input(check, plan, x);
  check_filter(check, plan, w, "w");
  check_filter_bf16(check, w, w_bf16);
  check.optional_f32(b, {g.out_channels}, "b");
  if (b != nullptr && !plan.forward_bias()) {
    check.fail(
        "a bias was given to a plan made with ConvUse::forward_bias = false (declare the "
        "bias when the plan is made)");
  }
  check_output_dtype(check, plan, y, "y");
  check.tensor(y, plan.output_dtype(), "y");
  check.shape(y, {n, g.out_channels, g.out_h(), g.out_w()}, "y");
  plan_layout(check, g, y, "y");
  check_workspace(check, plan, ConvStage::forward, workspace);
  if (n > 0) {
    run([=, this, &plan, hb = Held(b), hws = Held(workspace), hw = Held(w_bf16)] {
      conv_forward_impl(plan, x, w, hb.get(), y, hws.get(), hw.get());
    });
  }
}

void Backend::conv_backward_data(ConvPlan& plan, const Tensor& dy, const Tensor& w,
                                 const Tensor& dx, const Tensor* workspace, const Tensor* w_bf16) {
  const char* op = "conv_backward_data";
  const ConvGeometry& g = check_plan(plan, op);
  const Checker check(*this, op);
  const int64_t n = plan_output_grad(check, plan, dy);
  check_filter(check, plan, w, "w");
  check_filter_bf16(check, w, w_bf16);
  // f32, or x's dtype where that is not f32: the rounded gradient of a batch norm's output that
  // only this convolution reads (ConvPlan::input_dtype), which that batch norm takes as it is.
  if (dx.dtype != DType::f32 && dx.dtype != plan.input_dtype()) {
    check.fail(std::string("dx must be f32 or of the plan's input_dtype (") +
               dtype_name(plan.input_dtype()) + "), got " + dtype_name(dx.dtype));
  }
  check.tensor(dx, dx.dtype, "dx");
  check.shape(dx, {n, g.in_channels, g.in_h, g.in_w}, "dx");
  plan_layout(check, g, dx, "dx");
  check_workspace(check, plan, ConvStage::backward, workspace);
  if (n > 0) {
    run([=, this, &plan, hws = Held(workspace), hw = Held(w_bf16)] {
      conv_backward_data_impl(plan, dy, w, dx, hws.get(), hw.get());
    });
  }
}

void Backend::conv_backward_filter(ConvPlan& plan, const Tensor& x, const Tensor& dy,
                                   const Tensor& dw, const Tensor* db, const Tensor* workspace) {
  const char* op = "conv_backward_filter";
  const ConvGeometry& g = check_plan(plan, op);
  const Checker check(*this, op);
  const int64_t n = plan_input(check, plan, x);
  if (plan_output_grad(check, plan, dy) != n) {
    check.fail("dy has shape " + dy.shape.str() + " but x has " + x.shape.str() +
               ": they must hold the same examples");
  }
  check_filter(check, plan, dw, "dw");
  check.optional_f32(db, {g.out_channels}, "db");
  if (db != nullptr && dy.dtype != DType::f32) {
    check.fail("a bias gradient was asked of a plan whose output is " +
               std::string(dtype_name(dy.dtype)) +
               ", which has no bias (ConvUse::output_to_batchnorm)");
  }
  check_workspace(check, plan, ConvStage::backward, workspace);
  run([=, this, &plan, hdb = Held(db), hws = Held(workspace)] {
    if (n > 0) {
      conv_backward_filter_impl(plan, x, dy, dw, hdb.get(), hws.get());
    } else {  // the sum over no examples
      fill_impl(dw, 0.0f);
      if (hdb.get() != nullptr) fill_impl(*hdb.get(), 0.0f);
    }
  });
}

// ---- linear -------------------------------------------------------------------------------------

namespace {
struct LinearDims {
  int64_t n, in, out;
};

LinearDims check_linear(const Checker& check, const Tensor& x, const Tensor& w) {
  check.tensor(x, DType::f32, "x");
  check.tensor(w, DType::f32, "w");
  if (x.shape.rank != 2 || w.shape.rank != 2 || x.shape[1] != w.shape[1]) {
    check.fail("x has shape " + x.shape.str() + " and w has shape " + w.shape.str() +
               ", expected x (N, IN) and w (OUT, IN) with the same IN (flatten x first)");
  }
  return {x.shape[0], x.shape[1], w.shape[0]};
}
}  // namespace

void Backend::prepare_linear(int64_t max_batch, int64_t in, int64_t out) {
  refuse_while_capturing("prepare_linear");
  const Checker check(*this, "prepare_linear");
  if (max_batch < 1 || in < 1 || out < 1) {
    check.fail("max_batch, in and out must be >= 1, got " + std::to_string(max_batch) + ", " +
               std::to_string(in) + ", " + std::to_string(out));
  }
  prepare_linear_impl(max_batch, in, out);
}

void Backend::linear_forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
                             bool relu, const Tensor* w_bf16) {
  const Checker check(*this, "linear_forward");
  const LinearDims d = check_linear(check, x, w);
  check_filter_bf16(check, w, w_bf16);
  check.optional_f32(b, {d.out}, "b");
  check.f32(y, {d.n, d.out}, "y");
  if (d.n > 0) {
    run([=, this, hb = Held(b), hw = Held(w_bf16)] {
      linear_forward_impl(x, w, hb.get(), y, relu, hw.get());
    });
  }
}

void Backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor* dx,
                              const Tensor& dw, const Tensor* db, const Tensor* w_bf16) {
  const Checker check(*this, "linear_backward");
  const LinearDims d = check_linear(check, x, w);
  check_filter_bf16(check, w, w_bf16);
  check.f32(dy, {d.n, d.out}, "dy");
  check.optional_f32(dx, {d.n, d.in}, "dx");
  check.f32(dw, {d.out, d.in}, "dw");
  check.optional_f32(db, {d.out}, "db");
  run([=, this, hdx = Held(dx), hdb = Held(db), hw = Held(w_bf16), n = d.n] {
    if (n > 0) {
      linear_backward_impl(x, w, dy, hdx.get(), dw, hdb.get(), hw.get());
    } else {  // sums over no examples
      fill_impl(dw, 0.0f);
      if (hdb.get() != nullptr) fill_impl(*hdb.get(), 0.0f);
    }
  });
}

}  // namespace dp
