#pragma once
// Modules: layers composed into models. Life cycle of one replica's model:
//   1. construct (plugins do this through a ModelFactory),
//   2. declare(registry, prefix)  -- parameters and buffers get their dotted names,
//   3. registry.allocate(...) and registry.initialize(seed),
//   4. setup(ctx, input shape with the largest batch) -- shape inference; every activation,
//      gradient and scratch buffer is allocated here from the replica's Arena,
//   5. forward/backward every step, with any batch size up to the one given to setup.
// No memory is allocated after setup.
#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/memory_plan.hpp"
#include "dp/params.hpp"
#include "dp/tensor.hpp"

namespace dp {

class Communicator;

/// Sub-allocates tensors for one replica from blocks of backend memory: the first of 1 MiB, each
/// next one twice the last, up to block_bytes; a request of half of block_bytes or more gets a
/// block of its own. Everything is released when the Arena is destroyed.
class Arena {
 public:
  explicit Arena(Backend& backend, size_t block_bytes = size_t{64} << 20);
  static constexpr size_t kFirstBlock = size_t{1} << 20;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Tensor allocate(Shape shape, DType dtype = DType::f32, Layout layout = Layout::nchw);
  void* allocate_bytes(size_t bytes);  // 256-byte aligned
  size_t bytes_used() const { return used_; }
  Backend& backend() { return backend_; }

  /// A buffer whose every use in a training step its module reports in the memory plan's walk
  /// (an output, an input gradient, a fused epilogue's gradient), made in `slot` (a member of
  /// the module that keeps it): its memory comes when the outermost Module::setup has planned
  /// every such buffer of the model (memory_plan.hpp), shared with those whose lifetimes in the
  /// step do not overlap; until then slot.data is null. Its contents last from the step that
  /// writes it to its last reader in the same training step, no longer. With the plan off
  /// (set_memory_plan(false)) it is allocated at once, as allocate() does.
  void allocate_planned(Tensor& slot, Shape shape, DType dtype = DType::f32,
                        Layout layout = Layout::nchw);
  /// Whether allocate_planned defers to the plan (default true).
  void set_memory_plan(bool on) { plan_on_ = on; }
  bool memory_plan() const { return plan_on_; }
  /// The slots allocate_planned made that are not placed yet, in the order they were made.
  const std::vector<Tensor*>& pending_planned() const { return pending_; }
  /// Gives the pending slots their memory: one block of plan.bytes, slot i at plan.offsets[i].
  /// bound: the least bytes any plan of them could use (peak_live_bytes), for plan_stats().
  void place_planned(const MemoryPlan& plan, size_t bound = 0);
  /// Forgets the pending slots (their model failed to set up).
  void discard_planned();

  /// What the plan saved: the bytes the planned buffers would take each on its own, the bytes
  /// of the blocks they were placed in, and the least any placement could use (the most bytes
  /// alive at one step of the walk; all 0 with the plan off).
  struct PlanStats {
    size_t requested = 0, placed = 0, bound = 0;
  };
  PlanStats plan_stats() const { return stats_; }

 private:
  Backend& backend_;
  size_t block_bytes_;
  size_t next_block_;  // the size of the next small-request block
  std::vector<void*> blocks_;
  char* cursor_ = nullptr;
  size_t left_ = 0;
  size_t used_ = 0;
  bool plan_on_ = true;
  std::vector<Tensor*> pending_;
  PlanStats stats_;
};

/// How the features of a flat (N, F) activation made by Flatten are ordered: NHWC memory
/// flattens to (H, W, C), PyTorch's flatten to (C, H, W). Flatten says so at setup; the Linear
/// reading it remembers, so a checkpoint can store that Linear's weight in PyTorch's order.
struct FlatFeatures {
  int64_t c = 0, h = 0, w = 0;
  bool hwc = false;  // the features come in (H, W, C) order (and H * W > 1)
};

/// A parameter stored in another element order than PyTorch's: element i of ours is element
/// pytorch_index[i] of PyTorch's tensor of the same shape.
struct ParamOrder {
  ParamHandle parameter;
  std::vector<int64_t> pytorch_index;
};

struct SetupContext {
  Backend& backend;
  Arena& arena;
  ParamRegistry& params;
  Layout layout = Layout::nchw;  // layout of activations
  /// The batch sizes the step loop will run (each <= the setup batch), so layers prepare for
  /// them at setup rather than on first use mid-epoch: training steps (the last partial batch
  /// included) and evaluation chunks. Both empty: training at the setup batch only.
  std::vector<int64_t> train_batches;
  std::vector<int64_t> infer_batches;
  /// Whether backward will be asked for the gradient of this module's input (false for a
  /// model's input). Containers pass it to their first layer and true to the rest.
  bool input_grad = true;
  /// The order of the features Flatten produced for the next Linear (see FlatFeatures).
  FlatFeatures flat = {};
  /// How deep in nested setup() calls we are: the outermost call (0) plans the memory of the
  /// buffers its modules made with Arena::allocate_planned.
  int depth = 0;
};

/// Told, during backward, that a parameter's gradient is final for this step: the trainer starts
/// the allreduce of a bucket of gradients as soon as all of its parameters are final, while
/// backward goes on with the layers before.
class GradientHook {
 public:
  virtual ~GradientHook() = default;
  virtual void ready(ParamHandle parameter) = 0;
};

struct RunContext {
  Backend& backend;
  ParamRegistry& params;
  bool training = true;
  /// Synchronised batch norm (bn = "sync"): training statistics over every replica of this
  /// communicator. Null: per-replica statistics.
  Communicator* comm = nullptr;
  /// Examples in this step over every replica (the counts of synchronised batch norm).
  int64_t global_batch = 0;
  /// Layers report each parameter whose gradient they have written (null: nobody listens).
  GradientHook* gradients = nullptr;

  void gradient_ready(ParamHandle parameter) const {
    if (gradients != nullptr && parameter.valid()) gradients->ready(parameter);
  }
};

class Module {
 public:
  virtual ~Module() = default;
  /// "Conv2d", "Sequential", ... (as PyTorch names the class).
  virtual const char* type() const = 0;
  /// Declares parameters/buffers under `prefix` (e.g. "resnet_block2.0." or "" at the root).
  virtual void declare(ParamRegistry& registry, const std::string& prefix) {}

  /// Shape inference and allocation. `input` includes the largest batch. Returns output shape.
  Shape setup(SetupContext& ctx, const Shape& input);
  /// x's shape must equal the setup input shape except for a batch <= the setup batch. A batch
  /// of 0 is allowed: a replica with an empty shard still takes part in synchronised batch
  /// norm's collectives. With the memory plan, what a module inside the model returns is valid
  /// until its last reader in the step's walk (the next layers' forward, its own backward), not
  /// longer: read it there, or copy it (the model's own output lasts until the next step).
  Tensor forward(RunContext& ctx, const Tensor& x);
  /// dy has the shape of the last forward's output. Computes parameter gradients (overwriting)
  /// and, when need_dx, returns dx (an empty Tensor otherwise). Once per forward: with the memory
  /// plan, what forward kept for it may be reused by the gradients it writes.
  Tensor backward(RunContext& ctx, const Tensor& dy, bool need_dx);

  const Shape& input_shape() const { return input_; }
  const Shape& output_shape() const { return output_; }
  /// Multi-line description with shapes (after setup), PyTorch-print style.
  virtual void describe(std::ostream& os, int indent = 0) const;
  /// Direct children, for traversal (empty for leaves).
  virtual std::vector<Module*> children() { return {}; }
  /// The parameters of this module and its children stored in another order than PyTorch's
  /// (after setup). Checkpoints write those in PyTorch's order.
  virtual void parameter_orders(std::vector<ParamOrder>& out) {
    for (Module* c : children()) c->parameter_orders(out);
  }
  /// The memory plan's walk of forward (see StepSchedule): called in forward order, with the
  /// planned buffers this module's input may live in; takes this module's steps, saying which
  /// planned buffers it reads and writes, and remembers what its backward will read; returns
  /// those its output may live in. The default takes one step that reads x, keeps x alive to the
  /// end of the walk, which is the end of the training step (its backward may read it), and may
  /// return a view of it: right for any module whose buffers come from Arena::allocate. A module
  /// that uses allocate_planned overrides both walks, and so does a container whose children
  /// do: one that overrides only schedule_forward would end its children's outputs at their last
  /// forward reader, and their backward would read reused memory.
  virtual StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x);
  /// The memory plan's walk of backward (see StepSchedule): called in backward order, with
  /// the planned buffers this module's output gradient may live in; takes this module's steps,
  /// saying which planned buffers it reads and writes, and returns those its input gradient may
  /// live in. The default takes one step that reads dy and may return a view of it: right for
  /// any module whose buffers come from Arena::allocate (a module that uses allocate_planned
  /// overrides it, and so does a container whose children do).
  virtual StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy);
  /// Asked by Sequential::add when this module is added right after `previous`, whose output
  /// only this module reads: it may take over the last thing `previous` computes, with the same
  /// values (a batch norm takes a convolution's bias: BatchNorm2d::fold_bias_of). Returns
  /// whether it did. The default takes nothing.
  virtual bool fold_previous(Module& previous) { return false; }
  /// Whether forward and backward read an input of `dtype` as well as f32; asked before setup by
  /// this module's container, which may then let the module before it store its output so
  /// (set_readers_take). ctx is that setup's (backend, layout). The default takes f32 only.
  virtual bool takes_input(DType dtype, const SetupContext& ctx) const {
    (void)ctx;
    return dtype == DType::f32;
  }
  /// The dtype of the output (after setup): f32, unless the module stores it narrower for
  /// readers that take it (set_readers_take: a batch norm's output as packed bf16).
  virtual DType output_dtype() const { return DType::f32; }
  /// Before setup, by the container: every reader of this module's output takes `dtype` as well
  /// as f32 (takes_input of the next module), so the module may store its output so. A container
  /// that never calls it leaves f32, which every module takes.
  void set_readers_take(DType dtype) { readers_take_ = dtype; }
  /// Before setup, by the container: the dtype of the input forward will be given (the
  /// output_dtype() of the module before; one this module takes_input). f32 unless set.
  void set_input_dtype(DType dtype) { input_dtype_ = dtype; }

 protected:
  DType readers_take() const { return readers_take_; }
  DType given_input_dtype() const { return input_dtype_; }
  virtual Shape do_setup(SetupContext& ctx, const Shape& input) = 0;
  virtual Tensor do_forward(RunContext& ctx, const Tensor& x) = 0;
  virtual Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) = 0;

 private:
  Shape input_, output_;
  int64_t last_batch_ = -1;
  DType readers_take_ = DType::f32;  // set_readers_take
  DType input_dtype_ = DType::f32;   // set_input_dtype
};

/// Children run in order; named "0", "1", ... unless a name is given (PyTorch add_module).
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential& add(std::unique_ptr<Module> m);
  Sequential& add(const std::string& name, std::unique_ptr<Module> m);
  size_t size() const { return mods_.size(); }
  Module& at(size_t i) { return *mods_.at(i).second; }
  const char* type() const override { return "Sequential"; }
  void declare(ParamRegistry& registry, const std::string& prefix) override;
  void describe(std::ostream& os, int indent = 0) const override;
  std::vector<Module*> children() override;
  StepSchedule::Handle schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) override;
  StepSchedule::Handle schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) override;
  /// What its first module takes; its output is its last module's. Each module's readers are
  /// the next module (the last one's: this container's).
  bool takes_input(DType dtype, const SetupContext& ctx) const override;
  DType output_dtype() const override;

 protected:
  Shape do_setup(SetupContext& ctx, const Shape& input) override;
  Tensor do_forward(RunContext& ctx, const Tensor& x) override;
  Tensor do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) override;

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> mods_;
};

}  // namespace dp
