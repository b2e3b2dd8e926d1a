#pragma once
// The memory plan: buffers that live only part of a step share memory when their lifetimes do
// not overlap.
//   plan_memory      a pure function: buffers of known sizes and lifetimes -> offsets in a block.
//   StepSchedule the lifetimes of the buffers a model's training step writes and reads
//                (activations, input gradients, the fused epilogue's gradient), found by
//                walking the model as a step runs it: forward, then backward
//                (Module::schedule_forward, Module::schedule_backward).
//                Arena::allocate_planned makes such buffers; the outermost Module::setup plans
//                and places them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dp/tensor.hpp"

namespace dp {

/// One buffer to place: its size and the steps it lives in, first and last inclusive (a step is
/// any unit of a known order: here one module's forward or backward in a training step's walk).
struct BufferLifetime {
  size_t bytes = 0;
  int64_t first = 0, last = 0;  // first <= last
};

/// Where each buffer goes: offsets[i] for buffers[i] (multiples of the alignment), and the bytes
/// of the block that holds them all.
struct MemoryPlan {
  std::vector<size_t> offsets;
  size_t bytes = 0;
};

/// Places the buffers so that two whose lifetimes overlap never share a byte, in a block as
/// small as the greedy-by-size rule finds it (largest buffer first, each in the smallest gap the
/// already placed buffers it overlaps in time leave, else after the last of them: TensorFlow
/// Lite's arena planner does the same). The block is at least peak_live_bytes() and at most the
/// sum of the (aligned) sizes. Deterministic. alignment: a power of two.
MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers, size_t alignment = 256);

/// The largest sum of (aligned) sizes alive at one step: no plan can use less.
size_t peak_live_bytes(const std::vector<BufferLifetime>& buffers, size_t alignment = 256);

/// The lifetimes of a model's planned buffers, collected while the model is walked as a training
/// step runs it: every module's forward in order, then every module's backward in reverse order
/// (Module::schedule_forward, Module::schedule_backward). A Handle names the planned buffers a
/// tensor passed between modules may live in: several when it may be a view of one of them
/// (Flatten's output is its input reshaped; a module that says nothing may return a view of
/// what it was given).
class StepSchedule {
 public:
  using Handle = std::vector<int>;  // indices of planned slots; empty: nothing planned

  /// planned: the slots Arena::allocate_planned made (their tensors' data is not set yet).
  explicit StepSchedule(std::vector<Tensor*> planned);

  /// The next step: one module's forward or backward (or one part of it).
  void step() { ++now_; }
  int64_t now() const { return now_; }
  /// The buffers of `h` are read at this step: each lives at least until now.
  void read(const Handle& h);
  /// The buffers of `h` are read after the walk's last step (a module that says nothing of its
  /// backward may keep a view of its input; the caller reads the model's output and input
  /// gradient after the step): each lives to the end.
  void keep(const Handle& h);
  /// `slot` is written at this step and lives until its last read. A slot that was not made by
  /// Arena::allocate_planned gives an empty handle (its memory is its own).
  Handle write(Tensor& slot);

  /// The lifetimes of the planned slots, in the order they were given. A slot never written
  /// lives through the whole walk (nothing is known of it), as do the kept ones.
  std::vector<BufferLifetime> lifetimes() const;

 private:
  std::vector<Tensor*> planned_;
  std::vector<int64_t> first_, last_;
  std::vector<bool> kept_;
  int64_t now_ = 0;
};

}  // namespace dp
