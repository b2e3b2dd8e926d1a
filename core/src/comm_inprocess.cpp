// The in-process communicator: ranks are threads of one process sharing host memory.
//
// allreduce_sum (three barriers, no scratch memory):
//   1. every rank publishes its pointer and count;                              -- barrier
//   2. rank r owns elements [lo_r, hi_r): it sums them over ranks 0, 1, ... in that order and
//      writes the result into its OWN buffer's slice (nobody else reads or writes that slice of
//      that buffer in this phase);                                              -- barrier
//   3. every rank copies the other slices from their owners' buffers;         -- barrier
// The last barrier keeps a rank from reusing its buffer while others still read its slice.
// The sum for each element is ((x0 + x1) + x2) + ... whatever the thread timing, so results are
// bitwise deterministic and equal to a sequential sum in rank order.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "dp/comm.hpp"
#include "dp/error.hpp"

namespace dp {

namespace {

struct Group {
  explicit Group(int n) : size(n), ptrs(static_cast<size_t>(n)), counts(static_cast<size_t>(n)) {}

  const int size;
  std::mutex mutex;
  std::condition_variable cv;
  bool aborted = false;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<float*> ptrs;
  std::vector<size_t> counts;

  [[noreturn]] static void throw_aborted() {
    throw AbortedError("collective aborted: another replica failed (see its error)");
  }

  // Blocks until all ranks arrived; throws AbortedError when the group is (or becomes) aborted
  // before this barrier completes.
  void arrive() {
    std::unique_lock<std::mutex> lock(mutex);
    if (aborted) throw_aborted();
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const uint64_t gen = generation;
    cv.wait(lock, [&] { return aborted || generation != gen; });
    if (generation == gen) throw_aborted();
  }

  void check_aborted() {
    std::lock_guard<std::mutex> lock(mutex);
    if (aborted) throw_aborted();
  }

  void publish(int rank, float* data, size_t count) {
    std::lock_guard<std::mutex> lock(mutex);
    if (aborted) throw_aborted();
    ptrs[static_cast<size_t>(rank)] = data;
    counts[static_cast<size_t>(rank)] = count;
  }

  // Every rank sees the same counts after the first barrier, so all throw together. They pass
  // one more barrier first: a rank that threw at once could publish its next collective's
  // count while a slower rank is still reading these, and that rank would then go on.
  void check_counts(const char* op) {
    for (int r = 1; r < size; ++r) {
      if (counts[static_cast<size_t>(r)] != counts[0]) {
        const std::string message =
            std::string(op) + ": ranks passed different element counts (rank 0: " +
            std::to_string(counts[0]) + ", rank " + std::to_string(r) + ": " +
            std::to_string(counts[static_cast<size_t>(r)]) +
            "); every rank must call the same collectives with the same sizes";
        arrive();
        throw Error(message);
      }
    }
  }

  void abort() noexcept {
    std::lock_guard<std::mutex> lock(mutex);
    aborted = true;
    cv.notify_all();
  }
};

// Element range owned by `rank`, cut on 16-float (64-byte) boundaries to keep cache lines apart.
std::pair<size_t, size_t> slice(size_t count, int rank, int size) {
  const size_t lines = (count + 15) / 16;
  const size_t per = lines / static_cast<size_t>(size), extra = lines % static_cast<size_t>(size);
  const auto r = static_cast<size_t>(rank);
  const size_t first = r * per + std::min(r, extra);
  const size_t n = per + (r < extra ? 1 : 0);
  return {std::min(count, first * 16), std::min(count, (first + n) * 16)};
}

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string kind() const override { return "inprocess"; }

  void allreduce_sum(float* data, size_t count) override {
    Group& g = *group_;
    if (g.size == 1) {
      g.check_aborted();
      return;
    }
    g.publish(rank_, data, count);
    g.arrive();
    g.check_counts("allreduce_sum");
    const auto [lo, hi] = slice(count, rank_, g.size);
    const float* first = g.ptrs[0];
    for (size_t i = lo; i < hi; ++i) {
      float s = first[i];
      for (int r = 1; r < g.size; ++r) s += g.ptrs[static_cast<size_t>(r)][i];
      data[i] = s;
    }
    g.arrive();
    for (int r = 0; r < g.size; ++r) {
      if (r == rank_) continue;
      const auto [rlo, rhi] = slice(count, r, g.size);
      if (rhi > rlo)
        std::memcpy(data + rlo, g.ptrs[static_cast<size_t>(r)] + rlo, (rhi - rlo) * sizeof(float));
    }
    g.arrive();
  }

  void broadcast(float* data, size_t count, int root) override {
    Group& g = *group_;
    if (root < 0 || root >= g.size)
      throw Error("broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                  std::to_string(g.size));
    if (g.size == 1) {
      g.check_aborted();
      return;
    }
    g.publish(rank_, data, count);
    g.arrive();
    g.check_counts("broadcast");
    if (rank_ != root && count > 0)
      std::memcpy(data, g.ptrs[static_cast<size_t>(root)], count * sizeof(float));
    g.arrive();
  }

  void barrier() override { group_->arrive(); }

  void abort() noexcept override { group_->abort(); }

 private:
  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_inprocess_communicators(int ranks) {
  DP_CHECK(ranks >= 1,
           "a communicator group needs at least one rank, got " + std::to_string(ranks));
  auto group = std::make_shared<Group>(ranks);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_unique<InProcessCommunicator>(group, r));
  return out;
}

}  // namespace dp
