#include "buckets.hpp"

#include <algorithm>
#include <string>

#include "dp/error.hpp"

namespace dp {

namespace {

class InlineLauncher final : public BucketLauncher {
 public:
  explicit InlineLauncher(Communicator& comm) : comm_(comm) {}
  void launch(float* data, size_t count) override { comm_.allreduce_sum(data, count); }
  void wait() override {}

 private:
  Communicator& comm_;
};

class ThreadLauncher final : public BucketLauncher {
 public:
  explicit ThreadLauncher(Communicator& comm) : comm_(comm), thread_([this] { run(); }) {}
  ~ThreadLauncher() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void launch(float* data, size_t count) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back({data, count});
    }
    cv_.notify_all();
  }

  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  struct Job {
    float* data;
    size_t count;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      const Job job = jobs_.front();
      jobs_.pop_front();
      busy_ = true;
      const bool skip = error_ != nullptr;  // after a failure the group is dead: drain only
      lock.unlock();
      std::exception_ptr failure;
      if (!skip) {
        try {
          comm_.allreduce_sum(job.data, job.count);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      lock.lock();
      busy_ = false;
      if (failure && !error_) error_ = failure;
      cv_.notify_all();
    }
  }

  Communicator& comm_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace

std::unique_ptr<BucketLauncher> make_inline_launcher(Communicator& comm) {
  return std::make_unique<InlineLauncher>(comm);
}

std::unique_ptr<BucketLauncher> make_thread_launcher(Communicator& comm) {
  return std::make_unique<ThreadLauncher>(comm);
}

GradientBuckets::GradientBuckets(const ParamRegistry& registry, size_t bucket_bytes,
                                 size_t first_bytes) {
  const auto& entries = registry.entries();
  bucket_of_.assign(entries.size(), -1);
  Bucket current;
  bool open = false;
  size_t cap = first_bytes > 0 ? first_bytes : bucket_bytes;
  for (size_t i = entries.size(); i-- > 0;) {
    const auto& e = entries[i];
    if (!e.trainable) continue;
    const size_t begin = e.offset, end = e.offset + static_cast<size_t>(e.shape.numel());
    if (open && bucket_bytes > 0 && (current.end - begin) * sizeof(float) > cap) {
      buckets_.push_back(current);
      cap = bucket_bytes;
      open = false;
    }
    if (!open) {
      current = Bucket{begin, end, 0};
      open = true;
    }
    // Walking down the flat buffer: the bucket grows towards lower offsets, padding included.
    current.begin = begin;
    ++current.parameters;
    bucket_of_[i] = static_cast<int>(buckets_.size());
  }
  if (open) buckets_.push_back(current);
  // Tile the whole buffer (padding between parameters included), as one allreduce of it would.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].end = b == 0 ? registry.parameter_floats() : buckets_[b - 1].begin;
  }
  if (!buckets_.empty()) buckets_.back().begin = 0;
  pending_.assign(buckets_.size(), 0);
}

void GradientBuckets::start(float* grads, BucketLauncher& launcher) {
  grads_ = grads;
  launcher_ = &launcher;
  next_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].parameters;
  reported_.assign(bucket_of_.size(), 0);
}

void GradientBuckets::ready(ParamHandle parameter) {
  DP_ASSERT(launcher_ != nullptr);
  DP_ASSERT(parameter.index >= 0 && static_cast<size_t>(parameter.index) < bucket_of_.size());
  const int b = bucket_of_[static_cast<size_t>(parameter.index)];
  DP_ASSERT(b >= 0);  // a buffer has no gradient
  char& reported = reported_[static_cast<size_t>(parameter.index)];
  DP_CHECK(!reported, "the gradient of parameter " + std::to_string(parameter.index) +
                          " was reported twice in one backward pass; a layer's parameters must "
                          "be used once per step");
  reported = 1;
  --pending_[static_cast<size_t>(b)];
  launch_ready_in_order();
}

void GradientBuckets::launch_ready_in_order() {
  while (next_ < buckets_.size() && pending_[next_] == 0) {
    const Bucket& bucket = buckets_[next_];
    launcher_->launch(grads_ + bucket.begin, bucket.end - bucket.begin);
    ++next_;
  }
}

void GradientBuckets::finish() {
  DP_ASSERT(launcher_ != nullptr);
  for (size_t b = next_; b < buckets_.size(); ++b) pending_[b] = 0;
  launch_ready_in_order();
  launcher_->wait();
  launcher_ = nullptr;
}

}  // namespace dp
