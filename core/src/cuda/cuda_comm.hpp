#pragma once
// The two CUDA communicator transports, callable directly (tests pick one explicitly);
// make_communicators (cuda_comm_entry.hpp) chooses between them from the ranks' devices.
//
// NCCL (ranks on distinct GPUs of this process): non-blocking communicators created together
// (ncclCommInitRankConfig in one group). Collectives are enqueued on each rank's compute
// stream, so they run after the rank's backward and before its update, and the call returns
// without waiting for the GPU. Failure handling: after each collective the rank records an event
// on its stream; a watchdog thread per group polls those events and ncclCommGetAsyncError.
// When a rank calls abort(), NCCL reports an asynchronous error, or a collective has not
// completed on the GPU within the timeout (DPRUN_COMM_TIMEOUT_S, default 300 s: a peer died or
// hangs), the watchdog aborts every communicator of the group (ncclCommAbort), which ends the
// NCCL kernels the surviving ranks' streams are stuck in; every later collective throws
// dp::AbortedError. Enqueueing and the watchdog's abort are serialised per rank by a mutex, and
// the enqueue poll loop (non-blocking NCCL) gives up when the group is aborted, so no NCCL call
// ever runs on an aborted communicator.
//
// Same device (replicas sharing one GPU; NCCL refuses two ranks on one device): ranks exchange
// device pointers through shared host state. Each rank records an event after its backward,
// host barrier, makes its stream wait for every other rank's event, sums a disjoint slice of the
// buffer over all ranks in rank order and writes the sum back into every rank's buffer, records
// a second event, host barrier, and waits for the others' second events. No host waits for the
// GPU and the result is bit-identical on every rank and deterministic.
#include <memory>
#include <vector>

#include "dp/backend.hpp"
#include "dp/comm.hpp"

namespace dp::cuda {

/// One NCCL communicator per rank; the ranks' backends must be CUDA backends on distinct devices.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    const std::vector<Backend*>& ranks);
/// For tests: the next NCCL initialisation throws right after creating rank `rank`'s
/// communicator inside its group, so the cleanup path (group ended, communicators aborted) runs.
void inject_nccl_init_failure(int rank);
/// Same-device communicators; all ranks' backends on one device (at most 16 ranks).
std::vector<std::unique_ptr<Communicator>> make_same_device_communicators(
    const std::vector<Backend*>& ranks);

}  // namespace dp::cuda
