// The emulated GPU's NCCL: communicators between the ranks of this process (the emulated GPUs
// live in one process), against the real nccl.h. A collective is a rendezvous: each rank posts
// its buffers; when every rank of the communicator has posted the same collective, the sum (in
// rank order) or the root's values are written to every rank's buffer. Between ncclGroupStart
// and ncclGroupEnd posts wait for nothing (one thread may post for several ranks, as dprun's
// initialisation does); outside a group, and at ncclGroupEnd, the caller waits until its
// collectives are complete. ncclCommAbort releases every waiter with an error, as a real abort
// ends the kernels that wait for a dead peer.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/fake_device.hpp"

namespace {

struct Op {
  bool broadcast = false;
  int root = 0;
  size_t count = 0;
  std::vector<const float*> send;
  std::vector<float*> recv;
  int posted = 0, observed = 0;
  bool done = false;
};

struct Group {
  int nranks = 0;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<uint64_t, Op> ops;     // by sequence number
  std::vector<uint64_t> next_op;  // per rank
  bool aborted = false;
};

std::mutex registry_mutex;
std::map<std::string, std::shared_ptr<Group>>& registry() {
  static std::map<std::string, std::shared_ptr<Group>> r;
  return r;
}
std::atomic<uint64_t> next_id{1};

struct Pending {
  std::shared_ptr<Group> group;
  uint64_t seq;
  int rank;
};
thread_local int group_depth = 0;
thread_local std::vector<Pending> pending;

}  // namespace

struct ncclComm {
  std::shared_ptr<Group> group;
  int rank = 0;
  std::atomic<ncclResult_t> state{ncclSuccess};  // set by the rank's thread, read by a watchdog
};

namespace {

/// Posts rank's part of its next collective; performs it when it is the last to post.
uint64_t post(ncclComm* comm, bool broadcast, int root, const void* send, void* recv,
              size_t count) {
  Group& g = *comm->group;
  std::lock_guard<std::mutex> lock(g.mutex);
  const uint64_t seq = g.next_op[static_cast<size_t>(comm->rank)]++;
  Op& op = g.ops[seq];
  if (op.posted == 0) {
    op.broadcast = broadcast;
    op.root = root;
    op.count = count;
    op.send.assign(static_cast<size_t>(g.nranks), nullptr);
    op.recv.assign(static_cast<size_t>(g.nranks), nullptr);
  }
  op.send[static_cast<size_t>(comm->rank)] = static_cast<const float*>(send);
  op.recv[static_cast<size_t>(comm->rank)] = static_cast<float*>(recv);
  if (++op.posted == g.nranks) {
    std::vector<float> result(op.count);
    if (op.broadcast) {
      std::memcpy(result.data(), op.send[static_cast<size_t>(op.root)], op.count * sizeof(float));
    } else {
      for (size_t i = 0; i < op.count; ++i) {
        float s = op.send[0][i];
        for (size_t r = 1; r < op.send.size(); ++r) s += op.send[r][i];
        result[i] = s;
      }
    }
    for (float* r : op.recv) std::memcpy(r, result.data(), op.count * sizeof(float));
    op.done = true;
    g.cv.notify_all();
  }
  return seq;
}

/// Waits until collective `seq` is complete (or the communicator was aborted).
ncclResult_t finish(const Pending& p) {
  Group& g = *p.group;
  std::unique_lock<std::mutex> lock(g.mutex);
  const bool ok =
      g.cv.wait_for(lock, std::chrono::minutes(10), [&] { return g.ops[p.seq].done || g.aborted; });
  if (!ok || !g.ops[p.seq].done) return ncclRemoteError;
  Op& op = g.ops[p.seq];
  if (++op.observed == g.nranks) g.ops.erase(p.seq);
  return ncclSuccess;
}

ncclResult_t collective(ncclComm_t comm, bool broadcast, int root, const void* send, void* recv,
                        size_t count, ncclDataType_t type, cudaStream_t stream) {
  if (type != ncclFloat || comm == nullptr) return ncclInvalidArgument;
  dp_emu::device::submit_library_work(stream, broadcast ? "ncclBroadcast" : "ncclAllReduce", [=] {
    if (comm->group->aborted) {
      comm->state = ncclRemoteError;
      return;
    }
    const Pending p{comm->group, post(comm, broadcast, root, send, recv, count), comm->rank};
    if (group_depth > 0) {
      pending.push_back(p);
    } else if (finish(p) != ncclSuccess) {
      comm->state = ncclRemoteError;
    }
  });
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (emulated GPU)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (emulated GPU: aborted)";
    default:
      return "error (emulated GPU)";
  }
}

const char* ncclGetLastError(ncclComm_t) { return ""; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  const uint64_t v = next_id++;
  std::memcpy(id->internal, &v, sizeof(v));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t*) {
  if (nranks <= 0 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto& g = registry()[std::string(id.internal, sizeof(id.internal))];
    if (!g) {
      g = std::make_shared<Group>();
      g->nranks = nranks;
      g->next_op.assign(static_cast<size_t>(nranks), 0);
    }
    if (g->nranks != nranks) return ncclInvalidArgument;
    group = g;
  }
  *comm = new ncclComm;
  (*comm)->group = group;
  (*comm)->rank = rank;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  *state = comm->state;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(comm->group->mutex);
    comm->group->aborted = true;
  }
  comm->group->cv.notify_all();
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  ncclResult_t result = ncclSuccess;
  std::vector<Pending> mine;
  mine.swap(pending);
  for (const Pending& p : mine)
    if (finish(p) != ncclSuccess) result = ncclRemoteError;
  return result;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum) return ncclInvalidArgument;
  return collective(comm, false, 0, send, recv, count, type, stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(comm, true, root, send, recv, count, type, stream);
}

}  // extern "C"
