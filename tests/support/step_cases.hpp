#pragma once
// The per-step ops of a replayable training step, run on any backend, so the cpu tests
// (tests/core) and the cuda tests (tests/cuda) hold both backends to the same contract:
//  - an op that reads a per-step value at a cursor (dp::StepRow, a loss slot) computes exactly
//    what the same op computes with that value given from the host;
//  - a captured sequence of such ops, replayed k times, computes exactly what running it k times
//    computes (the cursor advancing each time).
// Results come back as named pairs of downloaded buffers that must be equal bit for bit.
#include <string>
#include <vector>

#include "dp/backend.hpp"

namespace dptest {

struct SamePair {
  std::string what;
  std::vector<float> got, expected;  // i32 results are converted (exactly: they are small)
};

/// Each StepRow/slot op against its host-valued twin on backend `b`: gather_batch with a start,
/// softmax_cross_entropy and count_correct with a slot (the other rows untouched), sgd_update
/// with a learning-rate row, adamw_update with a step row, advance.
std::vector<SamePair> step_row_pairs(dp::Backend& b);

/// A small step (gather at the cursor, an SGD update from the batch with the cursor's learning
/// rate, the loss into the cursor's slot, advance) run `steps` times, against one capture of it
/// replayed `steps` times from the same start. `ops` receives the recording's op count (0 for
/// a CUDA graph).
std::vector<SamePair> capture_pairs(dp::Backend& b, int steps, size_t* ops = nullptr);

}  // namespace dptest
