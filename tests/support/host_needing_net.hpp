#pragma once
// A model whose training step needs the host: a layer that reads a device value back (a
// download) in its forward or its backward pass. A capture of its step is refused
// (dp::CaptureRefused): graphs = true fails on it, graphs = "auto" trains it without graphs.
#include <cstdint>
#include <memory>

#include "dp/module.hpp"

namespace dptest {

enum class PeekIn { forward, backward };

/// Flatten, Linear(784 -> 32), Peeking (forward or backward: where the download is), Linear(32 ->
/// 10): for 1x28x28 inputs. A backward peek comes after the last layer's gradients are reported.
/// only_batch > 0: it peeks only in passes of that many examples (a step that can be captured at
/// every other size).
std::unique_ptr<dp::Module> host_needing_net(PeekIn where, int64_t only_batch = 0);

}  // namespace dptest
