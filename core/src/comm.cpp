#include "dp/comm.hpp"

#include "dp/backend.hpp"
#include "dp/error.hpp"
#if defined(DPRUN_WITH_CUDA)
#include "cuda/cuda_comm_entry.hpp"
#endif

namespace dp {

std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks) {
  DP_CHECK(!ranks.empty(), "make_communicators: no backends given");
  for (const Backend* b : ranks) DP_ASSERT(b != nullptr);
  const DeviceKind kind = ranks[0]->device().kind;
  for (size_t r = 1; r < ranks.size(); ++r)
    DP_CHECK(ranks[r]->device().kind == kind,
             "make_communicators: rank 0 is on " + ranks[0]->device().str() + " but rank " +
                 std::to_string(r) + " is on " + ranks[r]->device().str() +
                 "; every replica of a trial must use the same kind of backend");
  if (kind == DeviceKind::cpu) return make_inprocess_communicators(static_cast<int>(ranks.size()));
#if defined(DPRUN_WITH_CUDA)
  return cuda::make_communicators(ranks);
#else
  DP_THROW("make_communicators: CUDA backends given, but dprun was built without CUDA");
#endif
}

}  // namespace dp
