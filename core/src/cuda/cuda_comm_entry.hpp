#pragma once
// The entry point of the CUDA communicators (NCCL between devices, a same-device path for
// replicas sharing a GPU), implemented in core/src/cuda/ and called by make_communicators().
#include <memory>
#include <vector>

#include "dp/comm.hpp"
#include "dp/process_group.hpp"

namespace dp::cuda {

/// One communicator per backend, in rank order. Every backend is a CUDA backend.
std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks);
/// One NCCL communicator over every GPU of every process of `processes` (one rank per GPU);
/// process 0 makes the unique id and the group broadcasts it.
std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              ProcessGroup& processes);

}  // namespace dp::cuda
