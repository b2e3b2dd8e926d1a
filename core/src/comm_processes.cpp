// Communicators across processes (a trial's ranks as processes under mpirun/srun).
//
// CPU: each process's replicas sum in-process (the in-process communicator), then the first
// local replica sums across processes through the process group (fixed order, host memory), then
// it broadcasts the result to the other local replicas. The sum of rank g's value is therefore
// (local sum of process 0) + (local sum of process 1) + ..., the same bits on every rank.
// CUDA: NCCL spans every GPU of every process (cuda_comm.cpp); process 0 makes the unique id.
#include "dp/backend.hpp"
#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "dp/process_group.hpp"
#if defined(DPRUN_WITH_CUDA)
#include "cuda/cuda_comm_entry.hpp"
#endif

namespace dp {

namespace {

class CrossProcessCommunicator final : public Communicator {
 public:
  CrossProcessCommunicator(std::unique_ptr<Communicator> local, ProcessGroup& processes)
      : local_(std::move(local)), processes_(processes) {}

  int rank() const override { return processes_.rank() * local_->size() + local_->rank(); }
  int size() const override { return processes_.size() * local_->size(); }
  std::string kind() const override { return local_->kind() + "+" + processes_.kind(); }

  void allreduce_sum(float* data, size_t count) override {
    local_->allreduce_sum(data, count);
    // Only the first local replica talks to the other processes; the others wait in the
    // broadcast (and are released by abort() if the cross-process sum fails).
    if (local_->rank() == 0) processes_.allreduce_sum(data, count);
    local_->broadcast(data, count, 0);
  }

  void broadcast(float* data, size_t count, int root) override {
    DP_CHECK(root >= 0 && root < size(), "broadcast: root " + std::to_string(root) +
                                             " is not a rank of a group of " +
                                             std::to_string(size()));
    const int root_process = root / local_->size(), root_local = root % local_->size();
    if (processes_.rank() == root_process) local_->broadcast(data, count, root_local);
    if (local_->rank() == 0) {
      std::string bytes;
      if (processes_.rank() == root_process) {
        bytes.assign(reinterpret_cast<const char*>(data), count * sizeof(float));
      }
      processes_.broadcast(bytes, root_process);
      DP_CHECK(bytes.size() == count * sizeof(float),
               "broadcast: the root process sent " + std::to_string(bytes.size() / sizeof(float)) +
                   " floats but this rank expects " + std::to_string(count));
      std::copy(bytes.data(), bytes.data() + bytes.size(), reinterpret_cast<char*>(data));
    }
    local_->broadcast(data, count, 0);
  }

  void barrier() override {
    local_->barrier();
    if (local_->rank() == 0) processes_.barrier();
    local_->barrier();
  }

  void abort() noexcept override { local_->abort(); }

 private:
  std::unique_ptr<Communicator> local_;
  ProcessGroup& processes_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              ProcessGroup* processes) {
  if (processes == nullptr || processes->size() == 1) return make_communicators(ranks);
  DP_CHECK(!ranks.empty(), "make_communicators: no backends given");
  if (ranks[0]->device().kind == DeviceKind::cuda) {
#if defined(DPRUN_WITH_CUDA)
    return cuda::make_communicators(ranks, *processes);
#else
    DP_THROW("make_communicators: CUDA backends given, but dprun was built without CUDA");
#endif
  }
  auto local = make_communicators(ranks);
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& c : local) {
    out.push_back(std::make_unique<CrossProcessCommunicator>(std::move(c), *processes));
  }
  return out;
}

}  // namespace dp
