// Convolutions through oneDNN primitives.
//
// A plan holds, for each batch size dp::ConvUse declares, the primitives of the passes that size
// runs: forward for training and inference sizes, backward-weights for training sizes, and
// backward-data for training sizes when the layer's input needs a gradient. All are created here
// at plan time, on the setup thread. A pass first met later (a batch size or direction that was
// not declared) is created then and counted; DPRUN_ONEDNN_LOG=1 prints every pass created, with
// the kernel oneDNN chose.
//
// Formulations. Activations stay in the tensors' layout (NCHW or NHWC) and filters (K, C, R, S)
// (PyTorch's parameter layout). Each pass (direction) runs one of six formulations:
//   blocked  oneDNN with every format its choice ("any": channels in blocks of the vector
//            width, nChw16c and OIhw16i16o on AVX-512), its inputs reordered into the backend's
//            pass's scratch before the pass and its outputs reordered back after.
//   native   oneDNN on the tensors' own layout, only the filters reordered (brgconv on NHWC).
//   nhwc     for NCHW tensors: oneDNN's NHWC kernels, the activations reordered to NHWC and back.
//   winograd the blocked formats with oneDNN's Winograd F(4x4, 3x3) algorithm (AVX-512).
//   own-winograd  our Winograd F(4x4, 3x3) with oneDNN's SGEMM (conv_winograd.cpp), where
//            oneDNN has none.
//   im2col   our im2col + oneDNN's SGEMM (conv_cpu.cpp).
// Which is fastest depends on the layout, the channels (blocked formats pad them to whole
// blocks: LeNet's 20 and 50 channels to 32 and 64 on AVX-512, up to twice the work), the kernel
// and the direction; choose_formulations() holds the rules and the measurements behind them.
// DPRUN_ONEDNN_CONV=im2col|native|nhwc|blocked|winograd|own-winograd forces one formulation on
// every pass (to measure them against each other).
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cpu/conv_plans.hpp"
#include "cpu/cpu_kernels.hpp"
#include "cpu/onednn.hpp"
#include "dp/error.hpp"

namespace dp::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Formulation { im2col, native, nhwc, blocked, winograd, own_winograd };

const char* formulation_name(Formulation f) {
  switch (f) {
    case Formulation::im2col:
      return "im2col";
    case Formulation::native:
      return "native";
    case Formulation::nhwc:
      return "nhwc";
    case Formulation::blocked:
      return "blocked";
    case Formulation::winograd:
      return "winograd";
    case Formulation::own_winograd:
      return "own-winograd";
  }
  return "?";
}

enum Direction { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };
constexpr std::array<const char*, 3> kDirectionNames = {"forward", "backward-data",
                                                        "backward-weights"};
using Formulations = std::array<Formulation, 3>;  // by Direction

// The formulation of each pass. Measured per pass with bench_cpu_ops --threads 1 --cpu-time
// (ResNet-18 layers at batch 64, LeNet at 256) on AMD Zen 5, with oneDNN at avx512_core_bf16
// (block 16) and capped to AVX2 (block 8); milliseconds as im2col / native / blocked:
//  - NCHW, channels not in whole blocks (LeNet, the stem): im2col (LeNet conv2 forward 9.1 /
//    10.1 / 13.2; AVX2 13.0 / 14.6 / 13.6), except that with enough input per output (C*R*S of
//    LeNet's conv2, not of a first layer) the forward and backward-weights run faster on
//    oneDNN's NHWC kernels with the activations reordered there and back ("nhwc"). Measured
//    side by side in one process, im2col / nhwc, forward, backward-data, backward-weights:
//    12.8 / 8.5, 11.5 / 12.2, 13.7 / 9.9 ms; AVX2 17.4 / 13.4, 16.4 / 22.5, 18.6 / 18.7.
//  - NCHW, whole blocks: blocked (64->64 3x3 backward-data 22.7 / 33.5 / 19.1), except 1x1
//    kernels (the shortcut's forward 1.9 / 2.0 / 2.7; AVX2 3.1 / 2.9 / 4.0), im2col, and on
//    AVX-512, where oneDNN has its brgemm NHWC kernels, forwards of outputs from 7x7 up, nhwc
//    (side by side, im2col / nhwc / blocked: 64->64 26.3 / 21.4 / 23.9, 64->128 stride 2
//    16.4 / 14.5 / 22.0, 256->256 on 7x7 24.6 / 16.2 / 17.3, but 512->512 on 4x4 35.4 / 43.9 /
//    22.9; with AVX2 blocked wins them: 37.9 / 35.3 / 34.0, 20.4 / 20.6 / 19.3).
//  - NHWC, channels not in whole blocks or 1x1 kernels: native (LeNet conv2 forward 11.1 /
//    6.2 / 11.8, backward-weights 12.2 / 7.4 / 12.1).
//  - NHWC, whole blocks: forward native (64->64: 36.3 / 15.8 / 19.1) unless the output is
//    smaller than 7x7 (512->512 on 4x4: 36.5 / 42.3 / 21.8), blocked; backward-data blocked
//    (128->128: 32.9 / 23.1 / 18.9) unless strided (64->128 stride 2: 16.9 / 9.1 / 11.4),
//    native; backward-weights blocked (512->512: 41.0 / 46.3 / 30.5; AVX2 61 / 100 / 73).
//  - 3x3 stride 1 with whole blocks (ResNet's): Winograd, one pass in two to three times
//    faster than any direct formulation, and as exact (oneDNN's F(4x4, 3x3): largest error
//    2e-6 of the largest value against double loops, direct 3e-7 to 1.5e-6). Blocked-format
//    direct / Winograd, forward, backward-data, backward-weights: 64->64 on 28x28 17.2 / 10.2,
//    16.9 / 9.8, 18.2 / 21.6; 128->128 on 14x14 18.7 / 12.1, 20.4 / 11.6, 17.4 / 13.3;
//    256->256 on 7x7 16.4 / 8.2, 17.1 / 8.1, 18.5 / 10.5; 512->512 on 4x4 21.4 / 14.5,
//    38.1 / 15.4, 32.9 / 11.5: backward-weights only from 14x14 down.
//  - The same layers below AVX-512, where oneDNN has no Winograd: ours (conv_winograd.cpp) for
//    every pass, two to three and a half times faster than oneDNN's direct jit:avx2 kernels.
//    Capped to AVX2, one thread, batch 64, direct / ours, forward, backward-data,
//    backward-weights: 64->64 on 28x28 36.7 / 16.0, 35.8 / 15.1, 44.4 / 14.0; 128->128 on 14x14
//    35.4 / 18.3, 33.3 / 17.7, 42.3 / 20.7; 256->256 on 7x7 37.7 / 16.1, 33.4 / 16.1,
//    43.7 / 18.6; 512->512 on 4x4 53.5 / 21.8, 54.6 / 21.6, 88.2 / 24.9.
Formulations choose_formulations(const ConvGeometry& g) {
  if (const char* forced = std::getenv("DPRUN_ONEDNN_CONV"); forced && *forced) {
    const std::string f = forced;
    if (f == "im2col") return {Formulation::im2col, Formulation::im2col, Formulation::im2col};
    if (f == "native") return {Formulation::native, Formulation::native, Formulation::native};
    if (f == "nhwc") return {Formulation::nhwc, Formulation::nhwc, Formulation::nhwc};
    if (f == "blocked") return {Formulation::blocked, Formulation::blocked, Formulation::blocked};
    if (f == "winograd") {
      return {Formulation::winograd, Formulation::winograd, Formulation::winograd};
    }
    // Ours wherever it applies, whatever the instruction set and image size; elsewhere the
    // automatic choice.
    if (f == "own-winograd" && winograd_applies(g)) {
      return {Formulation::own_winograd, Formulation::own_winograd, Formulation::own_winograd};
    }
    if (f != "auto" && f != "own-winograd") {
      DP_THROW("DPRUN_ONEDNN_CONV=" + f +
               " is not a convolution formulation; use auto (the default), im2col, native, nhwc, "
               "blocked, winograd or own-winograd");
    }
  }
  const int block = onednn_simd_floats();
  const bool whole = g.in_channels % block == 0 && g.out_channels % block == 0;
  const bool pointwise = g.kernel_h == 1 && g.kernel_w == 1;
  const bool strided = g.stride_h > 1 || g.stride_w > 1;
  using F = Formulation;
  // 3x3 stride 1, whole blocks: oneDNN's Winograd F(4x4, 3x3) with AVX-512 (a pass falls back
  // to blocked where oneDNN has no Winograd kernel for its shape).
  const bool winograd =
      whole && g.kernel_h == 3 && g.kernel_w == 3 && !strided && g.pad_h == 1 && g.pad_w == 1;
  const bool winograd_weights = g.out_h() * g.out_w() <= 14 * 14;
  // With AVX2 (not AVX-512) oneDNN has no Winograd kernel: our own F(4x4, 3x3)
  // (conv_winograd.cpp), measured from 4x4 images (ResNet's smallest) up. Below 4x4 a tile is
  // mostly overhang (a 1x1 image: 36 products where the direct convolution has 9); without
  // AVX2 (x86-64 baseline, AVX1) our transforms run their SSE2 clone: neither was measured.
  if (onednn_simd_floats() == 8 && cpu_features().avx2_fma && winograd_applies(g) &&
      g.out_h() * g.out_w() >= 16) {
    return {F::own_winograd, F::own_winograd, F::own_winograd};
  }
  if (g.layout == Layout::nchw) {
    if (pointwise) return {F::im2col, F::im2col, F::im2col};
    // Enough input per output to pay for two activation reorders: LeNet's conv2 (C*R*S = 500),
    // not a first layer (9).
    if (!whole) {
      const F reordered = g.in_channels * g.kernel_h * g.kernel_w >= 64 ? F::nhwc : F::im2col;
      return {reordered, F::im2col, reordered};
    }
    const bool small = g.out_h() * g.out_w() < 49;
    if (winograd) return {F::winograd, F::winograd, winograd_weights ? F::winograd : F::blocked};
    return {onednn_has_brgconv() && !small ? F::nhwc : F::blocked, F::blocked, F::blocked};
  }
  if (!whole || pointwise) {
    // A first layer's filter gradient (C*R*S < 64) runs faster through im2col, whose NHWC
    // input with one channel reads as NCHW (LeNet conv1, native / im2col / blocked: 3.8 / 2.8
    // / 2.2 ms; AVX2 3.3 / 3.9 / 9.2: im2col is never far from the best).
    const bool first_layer = g.in_channels * g.kernel_h * g.kernel_w < 64;
    // Below AVX-512 (no brgconv), oneDNN's plain NHWC kernels lose the backward data to im2col
    // (LeNet conv2 with AVX2, native / im2col: 18.8 / 15.4 ms on one thread, 9.6 / 8.2 on two;
    // with AVX-512 8.4 / 11.3).
    const F data = onednn_has_brgconv() || pointwise ? F::native : F::im2col;
    return {F::native, data, first_layer ? F::im2col : F::native};
  }
  if (winograd) return {F::winograd, F::winograd, winograd_weights ? F::winograd : F::blocked};
  return {g.out_h() * g.out_w() < 49 ? F::blocked : F::native, strided ? F::native : F::blocked,
          F::blocked};
}

bool log_passes() {
  const char* v = std::getenv("DPRUN_ONEDNN_LOG");
  return v != nullptr && std::string(v) == "1";
}

constexpr size_t kScratchAlignment = 256;
size_t aligned(size_t bytes) {
  return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

// One argument of a pass: the tensor's memory in its own format and, when the primitive wants
// another, its copy in the pass's scratch with the reorder between the two.
struct Arg {
  int id = 0;           // DNNL_ARG_SRC, ...
  bool output = false;  // written by the pass (reordered back after it)
  memory user;          // the tensor; its data pointer is set at every call
  memory internal;      // in the primitive's format at `offset` in the scratch, if needed
  dnnl::primitive reorder;
  memory reorder_scratchpad;  // at the pass's scratchpad offset, if the reorder wants one
  size_t offset = 0;
  std::vector<dnnl_exec_arg_t> reorder_args;
};

// One direction at one batch size. The execute arguments are built once, here: a call only sets
// data pointers, so the step loop allocates nothing (not even the argument map of oneDNN's C++
// API: passes run through the C API).
struct Pass {
  dnnl::primitive primitive;
  std::vector<Arg> args;
  memory scratchpad;  // at scratchpad_offset in the scratch, if the primitive wants one
  size_t scratchpad_offset = 0;
  size_t scratch_bytes = 0;  // of scratch this pass uses
  std::vector<dnnl_exec_arg_t> exec_args;
  std::string kernel;                              // oneDNN's implementation, for the log
  Formulation formulation = Formulation::blocked;  // the one it runs (Winograd may fall back)
};

struct ArgSpec {
  int id;
  memory::desc user;
  bool output;
};

Pass build_pass(const dnnl::engine& engine, const dnnl::primitive_desc& pd,
                const std::vector<ArgSpec>& specs) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  Pass pass;
  pass.primitive = dnnl::primitive(pd);
  pass.kernel = pd.impl_info_str();
  size_t offset = 0, scratchpad_bytes = pd.scratchpad_desc().get_size();
  for (const ArgSpec& spec : specs) {
    Arg a;
    a.id = spec.id;
    a.output = spec.output;
    a.user = memory(spec.user, engine, DNNL_MEMORY_NONE);
    const memory::desc wanted = pd.query_md(dnnl::query::exec_arg_md, spec.id);
    if (wanted != spec.user) {
      a.internal = memory(wanted, engine, DNNL_MEMORY_NONE);
      a.offset = offset;
      offset += aligned(wanted.get_size());
      const memory& from = spec.output ? a.internal : a.user;
      const memory& to = spec.output ? a.user : a.internal;
      const dnnl::reorder::primitive_desc rpd(engine, from.get_desc(), engine, to.get_desc(), attr);
      a.reorder = dnnl::reorder(rpd);
      a.reorder_args = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
      if (rpd.scratchpad_desc().get_size() > 0) {
        a.reorder_scratchpad = memory(rpd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
        a.reorder_args.push_back({DNNL_ARG_SCRATCHPAD, a.reorder_scratchpad.get()});
        scratchpad_bytes = std::max(scratchpad_bytes, rpd.scratchpad_desc().get_size());
      }
    }
    pass.exec_args.push_back({a.id, (a.internal ? a.internal : a.user).get()});
    pass.args.push_back(std::move(a));
  }
  pass.scratchpad_offset = offset;
  if (pd.scratchpad_desc().get_size() > 0) {
    pass.scratchpad = memory(pd.scratchpad_desc(), engine, DNNL_MEMORY_NONE);
    pass.exec_args.push_back({DNNL_ARG_SCRATCHPAD, pass.scratchpad.get()});
  }
  pass.scratch_bytes = offset + aligned(scratchpad_bytes);
  return pass;
}

void set_handle(const memory& m, void* data) {
  DNNL_CHECK(dnnl_memory_set_data_handle_v2(m.get(), data, nullptr));
}

// Runs `pass` on tensors `data` (in the order of its arguments) with its scratch at `scratch`, on
// the calling thread.
void run(Pass& pass, std::initializer_list<void*> data, char* scratch, const dnnl::stream& stream) {
  DP_ASSERT(data.size() == pass.args.size());
  for (size_t i = 0; i < pass.args.size(); ++i) {
    Arg& a = pass.args[i];
    set_handle(a.user, data.begin()[i]);
    if (!a.internal) continue;
    set_handle(a.internal, scratch + a.offset);
    if (a.reorder_scratchpad) set_handle(a.reorder_scratchpad, scratch + pass.scratchpad_offset);
  }
  if (pass.scratchpad) set_handle(pass.scratchpad, scratch + pass.scratchpad_offset);
  auto reorder = [&](const Arg& a) {
    DNNL_CHECK(dnnl_primitive_execute(a.reorder.get(), stream.get(),
                                      static_cast<int>(a.reorder_args.size()),
                                      a.reorder_args.data()));
  };
  for (const Arg& a : pass.args)
    if (a.internal && !a.output) reorder(a);
  DNNL_CHECK(dnnl_primitive_execute(pass.primitive.get(), stream.get(),
                                    static_cast<int>(pass.exec_args.size()),
                                    pass.exec_args.data()));
  for (const Arg& a : pass.args)
    if (a.internal && a.output) reorder(a);
  DNNL_CHECK(dnnl_stream_wait(stream.get()));
}

class OnednnConvPlan final : public CpuConvPlan {
 public:
  /// `im2col` and `own_winograd` run the passes of those formulations (null when none has it).
  OnednnConvPlan(const ConvGeometry& g, const ConvUse& use, const Formulations& formulations,
                 std::unique_ptr<CpuConvPlan> im2col, std::unique_ptr<CpuConvPlan> own_winograd,
                 std::shared_ptr<OnednnContext> context, int threads,
                 std::shared_ptr<SharedScratch> shared, std::shared_ptr<MemoryTracker> memory);
  ~OnednnConvPlan() override;
  OnednnConvPlan(const OnednnConvPlan&) = delete;
  OnednnConvPlan& operator=(const OnednnConvPlan&) = delete;

  /// The largest of the stage's passes made at plan time, oneDNN's (its reorders' copies and
  /// scratchpad) and im2col's or Winograd's.
  size_t scratch_bytes(ConvStage stage) const override {
    return planned_bytes_[static_cast<int>(stage)];
  }
  void forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
               ConvScratch scratch) override;
  void backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx,
                     ConvScratch scratch) override;
  void backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor* db,
                       ConvScratch scratch) override;

  /// Per direction: the formulation, and what runs it (oneDNN's kernel of each batch size
  /// created so far, or the im2col / Winograd plan).
  std::string implementation() const override;
  /// oneDNN's passes take the filter in its own order (w_md); im2col's and Winograd's
  /// (K, C, R, S).
  bool reads_stored_filter(ConvDirection d) const override {
    const Formulation f = formulation_[static_cast<int>(d)];
    return f != Formulation::im2col && f != Formulation::own_winograd;
  }

 private:
  struct BatchPasses {
    int64_t n = 0;
    std::array<std::unique_ptr<Pass>, 3> passes;  // by Direction; null until created
  };

  /// The pass of `direction` at batch `n`, created now if it was not (then counted as late
  /// unless at plan time; at plan time its scratch counts in scratch_bytes()).
  Pass& pass(int64_t n, Direction direction, bool at_plan_time);
  Pass make_pass(int64_t n, Direction direction, Formulation formulation) const;
  /// The forward primitive descriptor in formulation `f` (also the hint of the backward ones).
  dnnl::convolution_forward::primitive_desc forward_pd(int64_t n, Formulation f) const;
  /// Activations x (N,C,H,W) and y (N,K,P,Q) and filters w (K,C,R,S): the tensors' own (`f`
  /// empty) or what formulation `f` gives the primitive.
  memory::desc x_md(int64_t n, const Formulation* f) const;
  memory::desc y_md(int64_t n, const Formulation* f) const;
  memory::desc w_md(const Formulation* f) const;
  memory::desc b_md() const;

  Formulations formulation_;
  Layout filters_;  // the memory order of w and dw (ConvUse::filter_layout)
  std::unique_ptr<CpuConvPlan> im2col_;
  std::unique_ptr<CpuConvPlan> own_winograd_;
  std::shared_ptr<OnednnContext> context_;
  int threads_;
  std::shared_ptr<MemoryTracker> memory_;
  std::vector<BatchPasses> batches_;
  size_t planned_bytes_[2] = {0, 0};   // scratch_bytes() by stage
  float* zero_bias_ = nullptr;         // (K) zeros: the bias of a forward without one
  float* unused_bias_grad_ = nullptr;  // (K): where a bias gradient nobody asked for goes
  bool warned_late_ = false;           // a pass created in the step loop was reported
};

OnednnConvPlan::OnednnConvPlan(const ConvGeometry& g, const ConvUse& use,
                               const Formulations& formulations,
                               std::unique_ptr<CpuConvPlan> im2col,
                               std::unique_ptr<CpuConvPlan> own_winograd,
                               std::shared_ptr<OnednnContext> context, int threads,
                               std::shared_ptr<SharedScratch> shared,
                               std::shared_ptr<MemoryTracker> memory)
    : CpuConvPlan(g, std::move(shared)),
      formulation_(formulations),
      filters_(use.filter_layout),
      im2col_(std::move(im2col)),
      own_winograd_(std::move(own_winograd)),
      context_(std::move(context)),
      threads_(threads),
      memory_(std::move(memory)) {
  const size_t bias_bytes = static_cast<size_t>(g.out_channels) * sizeof(float);
  zero_bias_ = static_cast<float*>(memory_->allocate(bias_bytes));  // zeroed by the tracker
  unused_bias_grad_ = static_cast<float*>(memory_->allocate(bias_bytes));
  std::vector<int64_t> train = use.train_batches, infer = use.infer_batches;
  if (train.empty() && infer.empty()) train.push_back(g.max_batch);
  auto prepare = [&](int64_t n, Direction d) {
    const int stage = static_cast<int>(d == kForward ? ConvStage::forward : ConvStage::backward);
    size_t& need = planned_bytes_[stage];
    if (formulation_[d] == Formulation::im2col) {
      need = std::max(need, im2col_->scratch_bytes(static_cast<ConvStage>(stage)));
    } else if (formulation_[d] == Formulation::own_winograd) {
      need = std::max(need, own_winograd_->scratch_bytes(static_cast<ConvStage>(stage)));
    } else {
      need = std::max(need, pass(n, d, true).scratch_bytes);
    }
  };
  try {
    for (int64_t n : train) {
      prepare(n, kForward);
      prepare(n, kBackwardWeights);
      if (use.input_grad) prepare(n, kBackwardData);
    }
    for (int64_t n : infer) prepare(n, kForward);
  } catch (...) {  // the destructor does not run for a half-made plan
    memory_->release(zero_bias_);
    memory_->release(unused_bias_grad_);
    throw;
  }
}

OnednnConvPlan::~OnednnConvPlan() {
  memory_->release(zero_bias_);
  memory_->release(unused_bias_grad_);
}

dnnl::algorithm algorithm_of(Formulation f) {
  return f == Formulation::winograd ? dnnl::algorithm::convolution_winograd
                                    : dnnl::algorithm::convolution_direct;
}

// The activation format a formulation gives the primitive: the tensors' own, or oneDNN's choice.
Tag activation_tag(Layout layout, const Formulation* f) {
  if (f && (*f == Formulation::blocked || *f == Formulation::winograd)) return Tag::any;
  if (f && *f == Formulation::nhwc) return Tag::nhwc;
  return layout == Layout::nhwc ? Tag::nhwc : Tag::nchw;
}

memory::desc OnednnConvPlan::x_md(int64_t n, const Formulation* f) const {
  const ConvGeometry& g = geometry();
  return memory::desc({n, g.in_channels, g.in_h, g.in_w}, memory::data_type::f32,
                      activation_tag(g.layout, f));
}

memory::desc OnednnConvPlan::y_md(int64_t n, const Formulation* f) const {
  const ConvGeometry& g = geometry();
  return memory::desc({n, g.out_channels, g.out_h(), g.out_w()}, memory::data_type::f32,
                      activation_tag(g.layout, f));
}

// The filters as given: (K, C, R, S) or (K, R, S, C) in memory (oihw, ohwi), which the reorder
// into the primitive's format reads either way, so both give the same bits.
memory::desc OnednnConvPlan::w_md(const Formulation* f) const {
  const ConvGeometry& g = geometry();
  const Tag given = filters_ == Layout::nhwc ? Tag::ohwi : Tag::oihw;
  return memory::desc({g.out_channels, g.in_channels, g.kernel_h, g.kernel_w},
                      memory::data_type::f32, f ? Tag::any : given);
}

memory::desc OnednnConvPlan::b_md() const {
  return memory::desc({geometry().out_channels}, memory::data_type::f32, Tag::x);
}

dnnl::convolution_forward::primitive_desc OnednnConvPlan::forward_pd(int64_t n,
                                                                     Formulation f) const {
  const ConvGeometry& g = geometry();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Right padding = left padding gives PyTorch's output size: oneDNN's is
  // (H + pad_l + pad_r - R) / stride + 1, rounded down.
  const dnnl::convolution_forward::desc d(
      dnnl::prop_kind::forward_training, algorithm_of(f), x_md(n, &f), w_md(&f), b_md(),
      y_md(n, &f), {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w}, {g.pad_h, g.pad_w});
  return dnnl::convolution_forward::primitive_desc(d, attr, context_->engine);
}

Pass OnednnConvPlan::make_pass(int64_t n, Direction direction, Formulation formulation) const {
  const ConvGeometry& g = geometry();
  const dnnl::engine& engine = context_->engine;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const Formulation* f = &formulation;
  const auto fwd = forward_pd(n, *f);
  if (direction == kForward) {
    return build_pass(engine, fwd,
                      {{DNNL_ARG_SRC, x_md(n, nullptr), false},
                       {DNNL_ARG_WEIGHTS, w_md(nullptr), false},
                       {DNNL_ARG_BIAS, b_md(), false},
                       {DNNL_ARG_DST, y_md(n, nullptr), true}});
  }
  if (direction == kBackwardData) {
    const dnnl::convolution_backward_data::desc d(algorithm_of(*f), x_md(n, f), w_md(f), y_md(n, f),
                                                  {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w},
                                                  {g.pad_h, g.pad_w});
    const dnnl::convolution_backward_data::primitive_desc pd(d, attr, engine, fwd);
    return build_pass(engine, pd,
                      {{DNNL_ARG_DIFF_DST, y_md(n, nullptr), false},
                       {DNNL_ARG_WEIGHTS, w_md(nullptr), false},
                       {DNNL_ARG_DIFF_SRC, x_md(n, nullptr), true}});
  }
  const dnnl::convolution_backward_weights::desc d(algorithm_of(*f), x_md(n, f), w_md(f), b_md(),
                                                   y_md(n, f), {g.stride_h, g.stride_w},
                                                   {g.pad_h, g.pad_w}, {g.pad_h, g.pad_w});
  const dnnl::convolution_backward_weights::primitive_desc pd(d, attr, engine, fwd);
  return build_pass(engine, pd,
                    {{DNNL_ARG_SRC, x_md(n, nullptr), false},
                     {DNNL_ARG_DIFF_DST, y_md(n, nullptr), false},
                     {DNNL_ARG_DIFF_WEIGHTS, w_md(nullptr), true},
                     {DNNL_ARG_DIFF_BIAS, b_md(), true}});
}

Pass& OnednnConvPlan::pass(int64_t n, Direction direction, bool at_plan_time) {
  auto it = std::find_if(batches_.begin(), batches_.end(),
                         [n](const BatchPasses& b) { return b.n == n; });
  if (it == batches_.end()) {
    batches_.push_back(BatchPasses{n, {}});
    it = batches_.end() - 1;
  }
  std::unique_ptr<Pass>& slot = it->passes[direction];
  if (slot) return *slot;
  // oneDNN sizes the primitive's work split for the threads it will run with (onednn.hpp).
  const OmpThreads scope(threads_);
  Formulation used = formulation_[direction];
  std::unique_ptr<Pass> fresh;
  try {
    try {
      fresh = std::make_unique<Pass>(make_pass(n, direction, used));
    } catch (const dnnl::error& e) {
      // oneDNN has Winograd kernels for some instruction sets and shapes only (AVX-512, 3x3,
      // stride 1); elsewhere the direct algorithm in the same formats.
      if (used != Formulation::winograd || e.status != dnnl_unimplemented) throw;
      used = Formulation::blocked;
      fresh = std::make_unique<Pass>(make_pass(n, direction, used));
    }
  } catch (const dnnl::error& e) {
    DP_THROW(std::string("cpu backend: ") + (at_plan_time ? "plan_conv" : "conv") +
             ": oneDNN cannot create the " + kDirectionNames[direction] + " pass of " +
             geometry().str() + " at batch " + std::to_string(n) + ": " + e.what() +
             "; DPRUN_CPU_KERNELS=blas runs the OpenBLAS kernels instead");
  }
  fresh->formulation = used;
  slot = std::move(fresh);
  if (!at_plan_time) {
    ++context_->late_passes;
    // A batch size nobody declared at plan time: this step compiles a kernel, and may run in the
    // shared scratch grown for it. Said once per plan, so a caller that forgot a size learns
    // which.
    if (!warned_late_) {
      warned_late_ = true;
      std::fprintf(stderr,
                   "dprun: warning: cpu backend: the %s pass of convolution %s at batch %lld "
                   "was not declared when the convolution was planned; it is created in the "
                   "step loop (a one-off cost)\n",
                   kDirectionNames[direction], geometry().str().c_str(), static_cast<long long>(n));
    }
  }
  if (log_passes()) {
    std::fprintf(stderr, "dprun: oneDNN %s at batch %lld, %s: %s (%s, %zu KiB scratch)%s\n",
                 geometry().str().c_str(), static_cast<long long>(n), kDirectionNames[direction],
                 slot->kernel.c_str(), formulation_name(used), slot->scratch_bytes >> 10,
                 at_plan_time ? "" : ", created in the step loop: batch size not declared");
  }
  return *slot;
}

std::string OnednnConvPlan::implementation() const {
  std::string out;
  for (int d = 0; d < 3; ++d) {
    if (!out.empty()) out += "; ";
    out += std::string(kDirectionNames[d]) + ": ";
    if (formulation_[d] == Formulation::im2col) {
      out += "im2col (" + im2col_->implementation() + ")";
      continue;
    }
    if (formulation_[d] == Formulation::own_winograd) {
      out += "own-winograd (" + own_winograd_->implementation() + ")";
      continue;
    }
    std::string passes;
    for (const BatchPasses& b : batches_) {
      if (!b.passes[d]) continue;
      passes += std::string(passes.empty() ? "" : ", ") + "batch " + std::to_string(b.n) + " " +
                formulation_name(b.passes[d]->formulation) + " " + b.passes[d]->kernel;
    }
    out +=
        passes.empty() ? std::string(formulation_name(formulation_[d])) + " (no pass yet)" : passes;
  }
  return out;
}

void OnednnConvPlan::forward(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& y,
                             ConvScratch scratch) {
  if (formulation_[kForward] == Formulation::im2col) return im2col_->forward(x, w, b, y, scratch);
  if (formulation_[kForward] == Formulation::own_winograd) {
    return own_winograd_->forward(x, w, b, y, scratch);
  }
  const OmpThreads scope(threads_);
  Pass& p = pass(x.shape[0], kForward, false);
  run(p, {x.data, w.data, b ? b->data : zero_bias_, y.data}, scratch_for(scratch, p.scratch_bytes),
      context_->stream);
}

void OnednnConvPlan::backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx,
                                   ConvScratch scratch) {
  if (formulation_[kBackwardData] == Formulation::im2col) {
    return im2col_->backward_data(dy, w, dx, scratch);
  }
  if (formulation_[kBackwardData] == Formulation::own_winograd) {
    return own_winograd_->backward_data(dy, w, dx, scratch);
  }
  const OmpThreads scope(threads_);
  Pass& p = pass(dy.shape[0], kBackwardData, false);
  run(p, {dy.data, w.data, dx.data}, scratch_for(scratch, p.scratch_bytes), context_->stream);
}

void OnednnConvPlan::backward_filter(const Tensor& x, const Tensor& dy, const Tensor& dw,
                                     const Tensor* db, ConvScratch scratch) {
  if (formulation_[kBackwardWeights] == Formulation::im2col) {
    return im2col_->backward_filter(x, dy, dw, db, scratch);
  }
  if (formulation_[kBackwardWeights] == Formulation::own_winograd) {
    return own_winograd_->backward_filter(x, dy, dw, db, scratch);
  }
  const OmpThreads scope(threads_);
  Pass& p = pass(x.shape[0], kBackwardWeights, false);
  run(p, {x.data, dy.data, dw.data, db ? db->data : unused_bias_grad_},
      scratch_for(scratch, p.scratch_bytes), context_->stream);
}

}  // namespace

std::unique_ptr<CpuConvPlan> make_onednn_plan(const ConvGeometry& g, const ConvUse& use,
                                              std::shared_ptr<OnednnContext> context, int threads,
                                              std::shared_ptr<SharedScratch> shared,
                                              std::shared_ptr<MemoryTracker> memory) {
  DP_CHECK(g.dtype == DType::f32, "cpu backend: plan_conv: dtype " +
                                      std::string(dtype_name(g.dtype)) +
                                      " is not supported; use f32 (" + g.str() + ")");
  const Formulations f = choose_formulations(g);
  const auto im2col = [&](Formulation x) { return x == Formulation::im2col; };
  if (std::all_of(f.begin(), f.end(), im2col)) return nullptr;
  std::unique_ptr<CpuConvPlan> im2col_plan, own_winograd_plan;
  if (std::any_of(f.begin(), f.end(), im2col))
    im2col_plan = make_im2col_plan(g, CpuKernels::onednn, threads, shared);
  if (std::any_of(f.begin(), f.end(),
                  [](Formulation x) { return x == Formulation::own_winograd; })) {
    own_winograd_plan = make_winograd_plan(g, CpuKernels::onednn, threads, shared);
    if (log_passes()) {
      for (int d = 0; d < 3; ++d) {
        if (f[d] != Formulation::own_winograd) continue;
        std::fprintf(stderr, "dprun: %s, %s: dprun's Winograd F(4x4, 3x3) with oneDNN's SGEMM\n",
                     g.str().c_str(), kDirectionNames[d]);
      }
    }
  }
  return std::make_unique<OnednnConvPlan>(g, use, f, std::move(im2col_plan),
                                          std::move(own_winograd_plan), std::move(context), threads,
                                          std::move(shared), std::move(memory));
}

}  // namespace dp::cpu
