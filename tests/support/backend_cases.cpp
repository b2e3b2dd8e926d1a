#include "support/backend_cases.hpp"

#include <deque>
#include <limits>
#include <utility>

#include "dp/error.hpp"

namespace dptest {

using dp::DType;
using dp::Layout;
using dp::Shape;
using dp::Tensor;

struct BackendCases::Storage {
  std::deque<DeviceBuffer> buffers;  // a deque: references stay valid as it grows
  std::vector<std::unique_ptr<dp::ConvPlan>> plans;
};

namespace {
/// A view of `t` with another shape (same memory), or another dtype or layout: the bad variants.
Tensor reshaped(Tensor t, Shape s) {
  t.shape = s;
  return t;
}
Tensor retyped(Tensor t, DType d) {
  t.dtype = d;
  return t;
}
Tensor relaid(Tensor t, Layout l) {
  t.layout = l;
  return t;
}
Tensor null_data(Tensor t) {
  t.data = nullptr;
  return t;
}
Tensor elsewhere(Tensor t, dp::Device d) {
  t.device = d;
  return t;
}
}  // namespace

BackendCases::BackendCases(dp::Backend& backend)
    : backend_(backend), storage_(std::make_unique<Storage>()) {
  auto& B = backend_;
  auto buf = [&](Shape s, DType t = DType::f32) -> Tensor {
    storage_->buffers.emplace_back(B, s, t);
    return storage_->buffers.back().tensor();
  };
  // A 3x3 convolution 2 -> 4 channels on (3, 2, 5, 5) -> (3, 4, 3, 3).
  dp::ConvGeometry g;
  g.max_batch = 3;
  g.in_channels = 2;
  g.in_h = g.in_w = 5;
  g.out_channels = 4;
  g.kernel_h = g.kernel_w = 3;
  storage_->plans.push_back(B.plan_conv(g));
  // The calls capture everything by value (they outlive this constructor).
  dp::ConvPlan* const plan = storage_->plans.back().get();
  dp::ConvUse without_bias;
  without_bias.forward_bias = false;
  storage_->plans.push_back(B.plan_conv(g, without_bias));
  dp::ConvPlan* const plan_without_bias = storage_->plans.back().get();
  dp::Backend* const bk = &backend_;
  const Tensor x = buf({3, 2, 5, 5}), w = buf({4, 2, 3, 3}), y = buf({3, 4, 3, 3});
  const Tensor dy = buf({3, 4, 3, 3}), dx = buf({3, 2, 5, 5}), dw = buf({4, 2, 3, 3});
  const Tensor lx = buf({6, 8}), lw = buf({5, 8}), lb = buf({5}), ly = buf({6, 5});
  const Tensor c2 = buf({2}), bx = buf({3, 2, 5, 5}), by = buf({3, 2, 5, 5}), buf4 = buf({4});
  const Tensor px = buf({3, 2, 4, 4}), py = buf({3, 2, 2, 2}), gy = buf({3, 2, 1, 1});
  const Tensor logits = buf({6, 10}), labels = buf({6}, DType::i32), one = buf({1});
  const Tensor correct = buf({1}, DType::i32), flat = buf({40}), flat2 = buf({40});
  const Tensor w16 = buf({4, 2, 3, 3}, DType::bf16), flat16 = buf({40}, DType::bf16);
  const Tensor images = buf({10, 1, 4, 4}, DType::u8), ilabels = buf({10}, DType::u8);
  const Tensor index = buf({6}, DType::i32), gx = buf({6, 1, 4, 4}), gyi = buf({6}, DType::i32);
  const dp::PoolGeometry pool;  // 2x2 stride 2
  dp::PoolGeometry bad_pool;
  bad_pool.pad_h = 2;
  dp::Device other = B.device();
  other.kind = other.kind == dp::DeviceKind::cpu ? dp::DeviceKind::cuda : dp::DeviceKind::cpu;

  auto add = [&](std::string op, std::string what, std::vector<std::string> mentions,
                 std::function<void()> call) {
    bad_.push_back({std::move(op), std::move(what), std::move(mentions), std::move(call)});
  };
  // ---- convolution
  dp::ConvGeometry too_big = g;
  too_big.kernel_h = 8;
  add("plan_conv", "kernel larger than the padded input", {"kernel is larger"},
      [=] { bk->plan_conv(too_big); });
  dp::ConvUse use;
  use.train_batches = {4};
  add("plan_conv", "a declared batch above max_batch", {"batch size 4", "max_batch = 3"},
      [=] { bk->plan_conv(g, use); });
  add("conv_forward", "w of the wrong shape", {"w has shape (4, 2, 3, 2)"}, [=] {
    bk->conv_forward(*plan, x, reshaped(w, {4, 2, 3, 2}), nullptr, y);
  });
  add("conv_forward", "x with too many examples", {"x has shape (4, 2, 5, 5)", "N <= 3"}, [=] {
    bk->conv_forward(*plan, reshaped(x, {4, 2, 5, 5}), w, nullptr, y);
  });
  add("conv_forward", "y of another batch", {"y has shape (2, 4, 3, 3)"}, [=] {
    bk->conv_forward(*plan, x, w, nullptr, reshaped(y, {2, 4, 3, 3}));
  });
  add("conv_forward", "a bias of the wrong length", {"b has shape (5)"},
      [=] { bk->conv_forward(*plan, x, w, &lb, y); });
  add("conv_forward", "a bias for a plan declared without one",
      {"a bias was given", "ConvUse::forward_bias = false"},
      [=] { bk->conv_forward(*plan_without_bias, x, w, &buf4, y); });
  add("conv_forward", "x in another layout than the plan", {"x is nhwc but the plan is nchw"},
      [=] { bk->conv_forward(*plan, relaid(x, Layout::nhwc), w, nullptr, y); });
  add("conv_forward", "x without memory", {"x has no data"},
      [=] { bk->conv_forward(*plan, null_data(x), w, nullptr, y); });
  add("conv_forward", "x on another device", {"x lives on", "this backend computes on"},
      [=] { bk->conv_forward(*plan, elsewhere(x, other), w, nullptr, y); });
  add("conv_forward", "a bf16 y for a plan whose output is f32",
      {"y must be f32 (the plan's output_dtype), got bf16"},
      [=] { bk->conv_forward(*plan, x, w, nullptr, retyped(y, DType::bf16)); });
  add("conv_backward_data", "a bf16 dy for a plan whose output is f32",
      {"dy must be f32 (the plan's output_dtype), got bf16"},
      [=] { bk->conv_backward_data(*plan, retyped(dy, DType::bf16), w, dx); });
  add("conv_backward_data", "dx of another shape", {"dx has shape (3, 2, 4, 4)"}, [=] {
    bk->conv_backward_data(*plan, dy, w, reshaped(dx, {3, 2, 4, 4}));
  });
  add("plan_conv", "(K, R, S, C) filters for NCHW activations",
      {"ConvUse::filter_layout nhwc", "of nchw activations", "NHWC activations only"}, [=] {
        dp::ConvUse krsc;
        krsc.filter_layout = Layout::nhwc;
        bk->plan_conv(g, krsc);
      });
  add("conv_forward", "a (K, R, S, C) w for a plan of (K, C, R, S) filters",
      {"w is nhwc but the plan's filters are nchw", "ConvUse::filter_layout"},
      [=] { bk->conv_forward(*plan, x, relaid(w, Layout::nhwc), nullptr, y); });
  add("conv_backward_data", "a (K, R, S, C) w for a plan of (K, C, R, S) filters",
      {"w is nhwc but the plan's filters are nchw"},
      [=] { bk->conv_backward_data(*plan, dy, relaid(w, Layout::nhwc), dx); });
  add("conv_backward_filter", "a (K, R, S, C) dw for a plan of (K, C, R, S) filters",
      {"dw is nhwc but the plan's filters are nchw"},
      [=] { bk->conv_backward_filter(*plan, x, dy, relaid(dw, Layout::nhwc), nullptr); });
  add("conv_forward", "a packed filter copy as f32", {"w_bf16 must be bf16, got f32"},
      [=] { bk->conv_forward(*plan, x, w, nullptr, y, nullptr, &dw); });
  add("conv_forward", "a packed filter copy of another shape", {"w_bf16 has shape (4, 2, 3, 2)"},
      [=] {
        const Tensor narrow = reshaped(w16, {4, 2, 3, 2});
        bk->conv_forward(*plan, x, w, nullptr, y, nullptr, &narrow);
      });
  add("conv_backward_data", "a packed filter copy in another layout than w",
      {"w_bf16 is nhwc but w is nchw", "w's, in its memory order"}, [=] {
        const Tensor krsc = relaid(w16, Layout::nhwc);
        bk->conv_backward_data(*plan, dy, w, dx, nullptr, &krsc);
      });
  add("conv_backward_filter", "dw as i32", {"dw must be f32, got i32"},
      [=] { bk->conv_backward_filter(*plan, x, dy, retyped(dw, DType::i32), nullptr); });
  add("conv_forward", "a workspace for a plan that keeps the backend's own",
      {"a workspace was given for a plan that keeps the backend's own",
       "ConvUse::planned_workspace"},
      [=] { bk->conv_forward(*plan, x, w, nullptr, y, &flat); });
  // A plan of another backend object (of the same kind) is refused too.
  add("conv_forward", "a plan made by another backend", {"plan was made by another backend"}, [=] {
    dp::BackendOptions o;
    o.kind =
        bk->device().kind == dp::DeviceKind::cpu ? dp::BackendKind::cpu : dp::BackendKind::cuda;
    o.device_index = bk->device().index;
    auto other_backend = dp::create_backend(o);
    dp::ConvGeometry gg;
    gg.max_batch = 3;
    gg.in_channels = 2;
    gg.in_h = gg.in_w = 5;
    gg.out_channels = 4;
    gg.kernel_h = gg.kernel_w = 3;
    auto foreign = other_backend->plan_conv(gg);
    bk->conv_forward(*foreign, x, w, nullptr, y);
  });
  // ---- linear
  add("linear_forward", "x of rank 4", {"x has shape (6, 2, 2, 2)", "flatten x first"}, [=] {
    bk->linear_forward(reshaped(lx, {6, 2, 2, 2}), lw, nullptr, ly);
  });
  add("linear_forward", "y of the wrong width", {"y has shape (6, 4)", "expected (6, 5)"}, [=] {
    bk->linear_forward(lx, lw, nullptr, reshaped(ly, {6, 4}));
  });
  add("linear_backward", "dx of the wrong shape", {"dx has shape (6, 5)", "expected (6, 8)"}, [=] {
    const Tensor bad_dx = reshaped(ly, {6, 5});
    bk->linear_backward(lx, lw, ly, &bad_dx, lw, nullptr);
  });
  add("linear_forward", "a packed weight copy as f32", {"w_bf16 must be bf16, got f32"},
      [=] { bk->linear_forward(lx, lw, nullptr, ly, false, &lw); });
  add("linear_backward", "a packed weight copy of another shape", {"w_bf16 has shape (8, 5)"}, [=] {
    const Tensor turned = reshaped(flat16, {8, 5});
    bk->linear_backward(lx, lw, ly, nullptr, lw, nullptr, &turned);
  });
  // ---- batch norm
  add("batchnorm_forward_train", "one value per channel", {"more than one value per channel"}, [=] {
    bk->batchnorm_forward_train(reshaped(bx, {1, 2, 1, 1}), c2, c2, c2, c2, 0.1f, 1e-5f, c2, c2,
                                reshaped(by, {1, 2, 1, 1}));
  });
  add("batchnorm_forward_train", "a bf16 x in nchw", {"x is bf16 nchw", "Backend::batchnorm_takes"},
      [=] {
        bk->batchnorm_forward_train(retyped(bx, DType::bf16), c2, c2, c2, c2, 0.1f, 1e-5f, c2, c2,
                                    by);
      });
  add("batchnorm_sums", "an i32 x", {"x is i32 nchw", "Backend::batchnorm_takes"},
      [=] { bk->batchnorm_sums(retyped(bx, DType::i32), nullptr, c2); });
  add("batchnorm_forward_train", "a zero eps", {"eps must be positive"},
      [=] { bk->batchnorm_forward_train(bx, c2, c2, c2, c2, 0.1f, 0.0f, c2, c2, by); });
  add("batchnorm_forward_train", "momentum above 1", {"momentum must be in [0, 1]"},
      [=] { bk->batchnorm_forward_train(bx, c2, c2, c2, c2, 1.5f, 1e-5f, c2, c2, by); });
  add("prepare_batchnorm", "an input of rank 3", {"(N, C, H, W) or (N, C)", "(3, 2, 5)"},
      [=] { bk->prepare_batchnorm({3, 2, 5}, Layout::nchw); });
  add("prepare_batchnorm", "an empty dimension", {"must be >= 1", "(3, 0, 5, 5)"},
      [=] { bk->prepare_batchnorm({3, 0, 5, 5}, Layout::nhwc); });
  add("batchnorm_forward_infer", "gamma of the wrong length", {"gamma has shape (5)"},
      [=] { bk->batchnorm_forward_infer(bx, lb, c2, c2, c2, 1e-5f, by); });
  add("batchnorm_backward", "a bf16 dx for an f32 x", {"dx is bf16 but x is f32", "x's dtype"},
      [=] { bk->batchnorm_backward(bx, by, c2, c2, c2, 1e-5f, retyped(by, DType::bf16), c2, c2); });
  add("batchnorm_backward", "dy in another layout", {"dy is nhwc but x is nchw"},
      [=] { bk->batchnorm_backward(bx, relaid(by, Layout::nhwc), c2, c2, c2, 1e-5f, dx, c2, c2); });
  // the fused epilogue (residual add, ReLU) and its gradient
  add("batchnorm_forward_train", "a residual of another shape",
      {"residual has shape (3, 2, 4, 4) but x has (3, 2, 5, 5)"}, [=] {
        const Tensor r = reshaped(dx, {3, 2, 4, 4});
        bk->batchnorm_forward_train(bx, c2, c2, c2, c2, 0.1f, 1e-5f, c2, c2, by, {&r, true});
      });
  // A folded convolution bias only where the backend's kernels take it: not nchw, on any backend.
  add("batchnorm_forward_train", "a folded conv bias in nchw",
      {"conv_bias given", "(3, 2, 5, 5) nchw", "Backend::batchnorm_folds_bias"}, [=] {
        bk->batchnorm_forward_train(bx, c2, c2, c2, c2, 0.1f, 1e-5f, c2, c2, by,
                                    {nullptr, false, &c2});
      });
  add("batchnorm_forward_infer", "a folded conv bias in nchw",
      {"conv_bias given", "Backend::batchnorm_folds_bias"}, [=] {
        bk->batchnorm_forward_infer(bx, c2, c2, c2, c2, 1e-5f, by, {nullptr, true, &c2});
      });
  add("batchnorm_forward_infer", "the residual is y", {"residual and y share their data"}, [=] {
    bk->batchnorm_forward_infer(bx, c2, c2, c2, c2, 1e-5f, by, {&by, false});
  });
  add("batchnorm_apply_stats", "a residual in another layout", {"residual is nhwc but x is nchw"},
      [=] {
        const Tensor r = relaid(dx, Layout::nhwc);
        bk->batchnorm_apply_stats(bx, c2, c2, c2, c2, c2, c2, 0.1f, 1e-5f, 75, c2, c2, by,
                                  {&r, false});
      });
  add("batchnorm_backward", "a ReLU gradient without dz", {"needs both y", "got only y"}, [=] {
    bk->batchnorm_backward(bx, by, c2, c2, c2, 1e-5f, dx, c2, c2, {&x, nullptr});
  });
  add("batchnorm_backward", "dz written over dy", {"dz and dy share their data"}, [=] {
    bk->batchnorm_backward(bx, by, c2, c2, c2, 1e-5f, dx, c2, c2, {&x, &by});
  });
  add("batchnorm_backward_sums", "dz of another shape",
      {"dz has shape (3, 4, 3, 3) but x has (3, 2, 5, 5)"}, [=] {
        bk->batchnorm_backward_sums(bx, by, c2, c2, buf4, {&x, &y});
      });
  // ---- activation, elementwise
  add("relu_forward", "y of another shape", {"y has shape (3, 4, 3, 3) but x has (3, 2, 5, 5)"},
      [=] { bk->relu_forward(x, y); });
  add("relu_backward", "dy as i32", {"dy must be f32"},
      [=] { bk->relu_backward(y, retyped(dy, DType::i32), dy); });
  add("relu_backward_bias", "db of another length than y's channels",
      {"db has shape (5)", "expected (4)"}, [=] { bk->relu_backward_bias(y, dy, dy, lb); });
  add("relu_backward_bias", "y of rank 3", {"y has shape (3, 4, 9)", "(N, C) or (N, C, H, W)"},
      [=] {
        bk->relu_backward_bias(reshaped(y, {3, 4, 9}), reshaped(dy, {3, 4, 9}),
                               reshaped(dy, {3, 4, 9}), buf4);
      });
  add("relu_backward_bias", "dx in another layout", {"dx is nhwc but y is nchw"},
      [=] { bk->relu_backward_bias(y, dy, relaid(dy, Layout::nhwc), buf4); });
  dp::ConvUse relu_to_bn;
  relu_to_bn.output_relu = true;
  relu_to_bn.output_to_batchnorm = true;
  relu_to_bn.layer = "block.conv";
  add("plan_conv", "a fused ReLU on an output that a batch norm reads",
      {"ConvUse::output_relu with output_to_batchnorm for block.conv"},
      [=] { bk->plan_conv(g, relu_to_bn); });
  add("add", "operands in two layouts", {"b is nhwc but a is nchw"},
      [=] { bk->add(x, relaid(dx, Layout::nhwc), x); });
  // bf16 operands only where the convolutions take bf16 (a residual block's input gradients):
  // not in fp32.
  add("add", "a bf16 operand in fp32", {"a is bf16", "conv_takes"},
      [=] { bk->add(retyped(x, DType::bf16), dx, dx); });
  add("add", "a u8 operand", {"b is u8: add takes f32"},
      [=] { bk->add(x, retyped(dx, DType::u8), x); });
  add("scale", "a u8 tensor", {"t must be f32, got u8"}, [=] { bk->scale(images, 2.0f); });
  add("fill", "a u8 tensor", {"t must be f32 or i32, got u8"}, [=] { bk->fill(images, 0); });
  // ---- pooling
  add("avgpool_forward", "y of the wrong size", {"y has shape (3, 2, 3, 3)", "(3, 2, 2, 2)"}, [=] {
    bk->avgpool_forward(pool, px, reshaped(y, {3, 2, 3, 3}));
  });
  add("maxpool_forward", "padding above half the kernel", {"padding at most half the kernel"},
      [=] { bk->maxpool_forward(bad_pool, px, py); });
  add("maxpool_backward", "dx of another shape", {"dx has shape (3, 2, 2, 2) but x has"},
      [=] { bk->maxpool_backward(pool, px, py, py, py); });
  add("avgpool_forward", "an input smaller than the window", {"smaller than the pooling window"},
      [=] {
        dp::PoolGeometry big;
        big.kernel_h = big.kernel_w = 5;
        bk->avgpool_forward(big, px, reshaped(py, {3, 2, 1, 1}));
      });
  add("global_avgpool_forward", "y of rank 2", {"y has shape (3, 2)", "expected (3, 2, 1, 1)"},
      [=] {
        bk->global_avgpool_forward(px, reshaped(gy, {3, 2}));
      });
  // ---- loss
  add("softmax_cross_entropy", "labels as f32", {"labels must be i32, got f32"}, [=] {
    bk->softmax_cross_entropy(logits, retyped(labels, DType::f32), 1.0f, logits, one, correct);
  });
  add("softmax_cross_entropy", "logits with no classes", {"expected (N, K) with K >= 1"}, [=] {
    bk->softmax_cross_entropy(reshaped(logits, {6, 0}), labels, 1.0f, logits, one, correct);
  });
  add("softmax_cross_entropy", "a NaN grad_scale", {"grad_scale must be finite"}, [=] {
    bk->softmax_cross_entropy(logits, labels, std::numeric_limits<float>::quiet_NaN(), logits, one,
                              correct);
  });
  add("count_correct", "correct of two elements", {"correct has shape (2)", "expected (1)"},
      [=] { bk->count_correct(logits, labels, reshaped(correct, {2})); });
  // ---- optimizer
  add("sgd_update", "momentum without a buffer", {"no momentum buffer"}, [=] {
    bk->sgd_update(flat, flat2, nullptr, dp::SgdParams{0.1f, 0.9f, 0.0f});
  });
  add("sgd_update", "a negative learning rate", {"lr must be finite and >= 0"}, [=] {
    bk->sgd_update(flat, flat2, nullptr, dp::SgdParams{-0.1f, 0.0f, 0.0f});
  });
  add("sgd_update", "grads of another length", {"grads has shape (39)", "expected (40)"},
      [=] { bk->sgd_update(flat, reshaped(flat2, {39}), nullptr, dp::SgdParams{}); });
  add("sgd_update", "a packed copy as f32", {"params_bf16 must be bf16, got f32"},
      [=] { bk->sgd_update(flat, flat2, nullptr, dp::SgdParams{}, nullptr, &flat2); });
  add("adamw_update", "a packed copy of another length",
      {"params_bf16 has shape (39)", "expected (40)"}, [=] {
        const Tensor short16 = reshaped(flat16, {39});
        bk->adamw_update(flat, flat2, flat2, flat2, dp::AdamWParams{}, nullptr, &short16);
      });
  add("pack_bf16", "an f32 destination", {"y must be bf16, got f32"},
      [=] { bk->pack_bf16(flat, flat2); });
  add("pack_bf16", "a destination of another length", {"y has shape (39)", "expected (40)"},
      [=] { bk->pack_bf16(flat, reshaped(flat16, {39})); });
  add("pack_bf16", "a bf16 source", {"x must be f32, got bf16"},
      [=] { bk->pack_bf16(flat16, flat16); });
  // ---- data
  add("gather_batch", "images as f32", {"images must be u8, got f32"},
      [=] { bk->gather_batch(retyped(images, DType::f32), ilabels, index, gx, gyi); });
  add("gather_batch", "x of the wrong image size", {"x has shape (6, 1, 2, 8)", "(6, 1, 4, 4)"},
      [=] {
        bk->gather_batch(images, ilabels, index, reshaped(gx, {6, 1, 2, 8}), gyi);
      });
  // ---- memory
  add("upload", "a null destination", {"two non-null pointers"}, [=] {
    const float v = 1.0f;
    bk->upload(nullptr, &v, sizeof v);
  });
}

BackendCases::~BackendCases() = default;

std::vector<std::pair<std::string, std::vector<float>>> BackendCases::run_empty_calls() {
  auto& B = backend_;
  std::vector<std::pair<std::string, std::vector<float>>> zeros;
  auto& bufs = storage_->buffers;
  auto filled = [&](Shape s, float value) -> DeviceBuffer& {
    bufs.emplace_back(B, s);
    bufs.back().upload(std::vector<float>(static_cast<size_t>(s.numel()), value));
    return bufs.back();
  };
  // Empty tensors without memory are accepted by the ops that see them as flat arrays.
  const Tensor none(nullptr, {0}, DType::f32, B.device());
  B.relu_forward(none, none);
  B.add(none, none, none);
  B.scale(none, 3.0f);
  B.fill(none, 1.0f);
  B.sgd_update(none, none, nullptr, dp::SgdParams{});
  B.copy(nullptr, nullptr, 0);
  B.upload(nullptr, nullptr, 0);

  // A batch of 0 examples: forward ops do nothing, sums over no examples are zero.
  dp::ConvGeometry g;
  g.max_batch = 2;
  g.in_channels = 2;
  g.in_h = g.in_w = 4;
  g.out_channels = 3;
  g.kernel_h = g.kernel_w = 3;
  auto plan = B.plan_conv(g);
  const Tensor x0(nullptr, {0, 2, 4, 4}, DType::f32, B.device());
  const Tensor y0(nullptr, {0, 3, 2, 2}, DType::f32, B.device());
  DeviceBuffer& w = filled({3, 2, 3, 3}, 1.0f);
  DeviceBuffer& dw = filled({3, 2, 3, 3}, 7.0f);
  DeviceBuffer& db = filled({3}, 7.0f);
  B.conv_forward(*plan, x0, w.tensor(), nullptr, y0);
  B.conv_backward_data(*plan, y0, w.tensor(), x0);
  B.conv_backward_filter(*plan, x0, y0, dw.tensor(), db.ptr());
  zeros.emplace_back("conv dw", dw.download_f32());
  zeros.emplace_back("conv db", db.download_f32());

  const Tensor lx0(nullptr, {0, 4}, DType::f32, B.device());
  const Tensor ly0(nullptr, {0, 3}, DType::f32, B.device());
  DeviceBuffer& lw = filled({3, 4}, 1.0f);
  DeviceBuffer& ldw = filled({3, 4}, 7.0f);
  DeviceBuffer& ldb = filled({3}, 7.0f);
  B.linear_forward(lx0, lw.tensor(), nullptr, ly0);
  B.linear_backward(lx0, lw.tensor(), ly0, &lx0, ldw.tensor(), ldb.ptr());
  zeros.emplace_back("linear dw", ldw.download_f32());
  zeros.emplace_back("linear db", ldb.download_f32());
  // A fused ReLU's backward over no examples: its bias gradient sums nothing.
  DeviceBuffer& rdb = filled({3}, 7.0f);
  B.relu_backward_bias(ly0, ly0, ly0, rdb.tensor());
  zeros.emplace_back("relu_backward_bias db (N, C)", rdb.download_f32());
  DeviceBuffer& rdb4 = filled({3}, 7.0f);
  B.relu_backward_bias(y0, y0, y0, rdb4.tensor());
  zeros.emplace_back("relu_backward_bias db (N, C, H, W)", rdb4.download_f32());

  const Tensor p0(nullptr, {0, 2, 4, 4}, DType::f32, B.device());
  const Tensor q0(nullptr, {0, 2, 2, 2}, DType::f32, B.device());
  B.avgpool_forward(dp::PoolGeometry{}, p0, q0);
  B.maxpool_backward(dp::PoolGeometry{}, p0, q0, q0, p0);
  DeviceBuffer& c = filled({2}, 1.0f);
  B.batchnorm_forward_infer(p0, c.tensor(), c.tensor(), c.tensor(), c.tensor(), 1e-5f, p0);

  const Tensor logits0(nullptr, {0, 10}, DType::f32, B.device());
  const Tensor labels0(nullptr, {0}, DType::i32, B.device());
  DeviceBuffer& loss = filled({1}, 7.0f);
  bufs.emplace_back(B, Shape{1}, DType::i32);
  DeviceBuffer& correct = bufs.back();
  correct.upload(std::vector<int32_t>{7});
  B.softmax_cross_entropy(logits0, labels0, 1.0f, logits0, loss.tensor(), correct.tensor());
  zeros.emplace_back("loss_sum", loss.download_f32());
  const auto right = correct.download_i32();
  zeros.emplace_back("correct", std::vector<float>(right.begin(), right.end()));
  correct.upload(std::vector<int32_t>{7});
  B.count_correct(logits0, labels0, correct.tensor());
  const auto counted = correct.download_i32();
  zeros.emplace_back("count_correct", std::vector<float>(counted.begin(), counted.end()));
  B.synchronize();
  return zeros;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const dp::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dptest
