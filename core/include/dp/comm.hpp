#pragma once
// Communicators: collectives over the replicas of one trial. One Communicator object per rank;
// each rank's thread calls the same collectives in the same order.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dp {

class Backend;
class ProcessGroup;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string kind() const = 0;  // "inprocess", "nccl", "cuda-same-device", ...

  /// In place: data[i] = sum over ranks of data[i]. `data` is memory of this rank's backend.
  /// The summation order is fixed (rank 0, 1, ...) wherever the transport allows, so results are
  /// deterministic. On GPU backends the call is ordered on the rank's stream and may return
  /// before the sum is complete; later work on that stream sees the result.
  virtual void allreduce_sum(float* data, size_t count) = 0;
  /// In place: every rank's data = root's data.
  virtual void broadcast(float* data, size_t count, int root) = 0;
  /// Returns when every rank has called barrier() (and, on GPUs, their queued work is done).
  virtual void barrier() = 0;
  /// Called when this rank failed: every rank blocked in (or later entering) a collective of
  /// this group throws dp::AbortedError instead of waiting forever. Safe from any thread.
  virtual void abort() noexcept = 0;
  /// Runs `launch`, which launches a captured step holding this rank's collectives (a CUDA
  /// graph) on the rank's stream, where no collective call of the host runs: throws
  /// dp::AbortedError instead when the group was aborted (the graph's collectives must not run
  /// on), keeps an abort from interleaving with the launch, and watches the launched work as the
  /// group watches its calls (NCCL: completion within the timeout, counted from when the GPU
  /// reaches the step, not from the launch). Communicators whose collectives are calls on the
  /// host just run it.
  virtual void launch_captured(const std::function<void()>& launch) { launch(); }
};

/// Communicators for replicas living in this process, one per backend, in rank order.
/// CPU backends: a host-memory path through shared buffers (fixed summation order).
/// CUDA backends on distinct devices: NCCL. CUDA backends sharing a device: a same-device path
/// (NCCL refuses two ranks on one GPU).
std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks);

/// Communicators for a trial whose replicas span the processes of `processes` (every process
/// calls this with its own local backends, in the same order). Ranks are global: process p's
/// local replica r is rank p * local count + r. CPU backends: the local replicas sum in-process,
/// the first of them sums across processes, and the result is shared locally (a fixed order:
/// the same bits on every rank and every run). CUDA backends: one NCCL communicator over every
/// GPU of every process, its unique id broadcast from process 0. A group of one process is
/// make_communicators(ranks).
std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              ProcessGroup* processes);

/// The host-memory in-process communicator (used directly by tests).
std::vector<std::unique_ptr<Communicator>> make_inprocess_communicators(int ranks);

}  // namespace dp
