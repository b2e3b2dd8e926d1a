#pragma once
// The memory plan: buffers that live only part of a step share memory when their lifetimes do
// not overlap.
//   plan_memory      a pure function: buffers of known sizes and lifetimes -> offsets in a block.
//   BackwardSchedule the lifetimes of the buffers a model's backward alone uses (input
//                    gradients, the fused epilogue's gradient), found by walking the model in
//                    backward order (Module::schedule_backward). Arena::allocate_planned makes
//                    such buffers; the outermost Module::setup plans and places them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dp/tensor.hpp"

namespace dp {

/// One buffer to place: its size and the steps it lives in, first and last inclusive (a step is
/// any unit of a known order: here one module's backward).
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

/// The lifetimes of a model's planned buffers, collected while the model is walked in backward
/// order. A Handle names the planned buffers a tensor passed between modules may live in:
/// several when it may be a view of one of them (Flatten's input gradient is its output
/// gradient reshaped; a module that says nothing may return a view of its dy).
class BackwardSchedule {
 public:
  using Handle = std::vector<int>;  // indices of planned slots; empty: nothing planned

  /// planned: the slots Arena::allocate_planned made (their tensors' data is not set yet).
  explicit BackwardSchedule(std::vector<Tensor*> planned);

  /// The next step: one module's backward (or one part of it).
  void step() { ++now_; }
  int64_t now() const { return now_; }
  /// The buffers of `h` are read at this step: each lives at least until now.
  void read(const Handle& h);
  /// `slot` is written at this step and lives until its last read. A slot that was not made by
  /// Arena::allocate_planned gives an empty handle (its memory is its own).
  Handle write(Tensor& slot);

  /// The lifetimes of the planned slots, in the order they were given. A slot never written
  /// lives through the whole backward (nothing is known of it), as does what the walk's last
  /// handle names (read after backward, by whoever called it).
  std::vector<BufferLifetime> lifetimes(const Handle& result) const;

 private:
  std::vector<Tensor*> planned_;
  std::vector<int64_t> first_, last_;
  int64_t now_ = 0;
};

}  // namespace dp
