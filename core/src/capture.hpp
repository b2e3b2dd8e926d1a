#pragma once
// The host work of a captured step on a backend that records its ops (the CPU): a communicator
// and a bucket launcher whose work is Backend::host_work, run at once, or while the backend
// records a step, at that point of every replay (capture.cpp). Internal to libdpcore.
#include <memory>

#include "buckets.hpp"
#include "dp/backend.hpp"
#include "dp/comm.hpp"

namespace dp {

/// `inner`'s collectives as host work of `backend` (inner and backend outlive it).
std::unique_ptr<Communicator> recorded(Communicator& inner, Backend& backend);
/// `inner`'s launches and waits as host work of `backend`.
std::unique_ptr<BucketLauncher> recorded(BucketLauncher& inner, Backend& backend);

}  // namespace dp
