// The memory plan (memory_plan.hpp): placing buffers by lifetime, and collecting the lifetimes
// of the buffers a model's training step writes and reads.
#include "dp/memory_plan.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "dp/error.hpp"

namespace dp {

namespace {

size_t aligned(size_t bytes, size_t alignment) {
  return (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
}

bool overlap(const BufferLifetime& a, const BufferLifetime& b) {
  return a.first <= b.last && b.first <= a.last;
}

void check_buffers(const std::vector<BufferLifetime>& buffers, size_t alignment) {
  DP_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
           "plan_memory: the alignment must be a power of two, got " + std::to_string(alignment));
  for (size_t i = 0; i < buffers.size(); ++i)
    DP_CHECK(buffers[i].first <= buffers[i].last,
             "plan_memory: buffer " + std::to_string(i) + " ends (step " +
                 std::to_string(buffers[i].last) + ") before it starts (step " +
                 std::to_string(buffers[i].first) + ")");
}

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferLifetime>& buffers, size_t alignment) {
  check_buffers(buffers, alignment);
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  // Largest first; ties by the earlier start, then the index: the same input, the same plan.
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t sa = aligned(buffers[a].bytes, alignment);
    const size_t sb = aligned(buffers[b].bytes, alignment);
    if (sa != sb) return sa > sb;
    return buffers[a].first < buffers[b].first;
  });
  std::vector<size_t> placed;  // indices, in placement order
  for (const size_t i : order) {
    const size_t size = aligned(buffers[i].bytes, alignment);
    // The placed buffers alive at the same time, by offset.
    std::vector<std::pair<size_t, size_t>> busy;  // [begin, end)
    for (const size_t j : placed)
      if (overlap(buffers[i], buffers[j]))
        busy.emplace_back(plan.offsets[j], plan.offsets[j] + aligned(buffers[j].bytes, alignment));
    std::sort(busy.begin(), busy.end());
    // The smallest gap that fits, else after the last busy range.
    size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
    for (const auto& [begin, end] : busy) {
      if (begin > cursor && begin - cursor >= size && begin - cursor < best_gap) {
        best = cursor;
        best_gap = begin - cursor;
      }
      cursor = std::max(cursor, end);
    }
    plan.offsets[i] = best != SIZE_MAX ? best : cursor;
    plan.bytes = std::max(plan.bytes, plan.offsets[i] + size);
    placed.push_back(i);
  }
  return plan;
}

size_t peak_live_bytes(const std::vector<BufferLifetime>& buffers, size_t alignment) {
  check_buffers(buffers, alignment);
  // A sweep over the steps where something starts or ends.
  std::map<int64_t, int64_t> delta;
  for (const auto& b : buffers) {
    const auto size = static_cast<int64_t>(aligned(b.bytes, alignment));
    delta[b.first] += size;
    delta[b.last + 1] -= size;
  }
  int64_t live = 0, peak = 0;
  for (const auto& [step, d] : delta) {
    live += d;
    peak = std::max(peak, live);
  }
  return static_cast<size_t>(peak);
}

// ---- StepSchedule --------------------------------------------------------------------------

StepSchedule::StepSchedule(std::vector<Tensor*> planned)
    : planned_(std::move(planned)),
      first_(planned_.size(), -1),
      last_(planned_.size(), -1),
      kept_(planned_.size(), false) {}

void StepSchedule::read(const Handle& h) {
  for (const int i : h) last_[static_cast<size_t>(i)] = std::max(last_[static_cast<size_t>(i)], now_);
}

void StepSchedule::keep(const Handle& h) {
  for (const int i : h) kept_[static_cast<size_t>(i)] = true;
}

StepSchedule::Handle StepSchedule::write(Tensor& slot) {
  const auto it = std::find(planned_.begin(), planned_.end(), &slot);
  if (it == planned_.end()) return {};
  const auto i = static_cast<size_t>(it - planned_.begin());
  // Written twice in one step (a module used twice): it lives from the first write on.
  if (first_[i] < 0) first_[i] = now_;
  last_[i] = std::max(last_[i], now_);
  return {static_cast<int>(i)};
}

std::vector<BufferLifetime> StepSchedule::lifetimes() const {
  std::vector<BufferLifetime> out(planned_.size());
  for (size_t i = 0; i < planned_.size(); ++i) {
    out[i].bytes = planned_[i]->bytes();
    const bool written = first_[i] >= 0;
    out[i].first = written ? first_[i] : 0;
    out[i].last = written && !kept_[i] ? last_[i] : now_;
  }
  return out;
}

}  // namespace dp
