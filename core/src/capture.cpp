// Step capture (Backend::begin_capture ... replay): a recording of the checked ops on backends
// without a capture of their own (the CPU), the device's own capture otherwise (a CUDA graph),
// and the wrappers that record a communicator's and a bucket launcher's host work in step order.
#include "capture.hpp"

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "backend_checker.hpp"

namespace dp {

// ---- step capture -------------------------------------------------------------------------------

class Backend::Recording final : public CapturedOps {
 public:
  size_t ops() const override { return ops_.size(); }
  void add(std::function<void()> op) { ops_.push_back(std::move(op)); }
  void run() const {
    for (const auto& op : ops_) op();
  }

 private:
  std::vector<std::function<void()>> ops_;
};

// Here, where Recording is complete (Backend holds a unique_ptr to one).
Backend::Backend() = default;
Backend::~Backend() = default;

void Backend::record(std::function<void()> op) { recording_->add(std::move(op)); }

void Backend::refuse_while_capturing(const char* what) const {
  if (capturing_) {
    throw CaptureRefused(
        prefix(what) +
        "called while a step is being captured: it needs the host, and a captured step "
        "replays without it (do it before begin_capture or after end_capture; a model "
        "whose step needs it trains with graphs = false)");
  }
}

void Backend::begin_capture() {
  refuse_while_capturing("begin_capture");
  if (native_capture()) {
    begin_capture_impl();
  } else {
    recording_ = std::make_unique<Recording>();
  }
  capturing_ = true;
}

std::unique_ptr<CapturedOps> Backend::end_capture() {
  if (!capturing_) throw Error(prefix("end_capture") + "no capture was begun");
  capturing_ = false;
  std::unique_ptr<CapturedOps> ops =
      native_capture() ? end_capture_impl() : std::unique_ptr<CapturedOps>(std::move(recording_));
  ops->owner_ = this;
  return ops;
}

void Backend::discard_capture() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  if (native_capture()) {
    discard_capture_impl();
  } else {
    recording_.reset();
  }
}

void Backend::replay(const CapturedOps& ops) {
  refuse_while_capturing("replay");
  if (ops.owner_ != this) {
    throw Error(prefix("replay") +
                "the step was captured by another backend; replay it on the one that captured it");
  }
  if (native_capture()) {
    replay_impl(ops);
  } else {
    static_cast<const Recording&>(ops).run();
  }
}

void Backend::host_work(std::function<void()> work) {
  if (capturing_ && native_capture()) {
    throw CaptureRefused(
        prefix("host_work") +
        "host work cannot be part of a captured step on this backend (its capture is the "
        "device's own, a CUDA graph)");
  }
  run(std::move(work));
}

// ---- host work recorded in step order
// ------------------------------------------------------------

namespace {

// A communicator whose collectives are host work of the replica's backend (Backend::host_work):
// run at once, or while the backend records a step, at that point of every replay. For backends
// that record their ops (cpu), whose communicators sum on the host.
class RecordedCommunicator final : public Communicator {
 public:
  RecordedCommunicator(Communicator& inner, Backend& backend) : inner_(inner), backend_(backend) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string kind() const override { return inner_.kind(); }
  void allreduce_sum(float* data, size_t count) override {
    backend_.host_work([this, data, count] { inner_.allreduce_sum(data, count); });
  }
  void broadcast(float* data, size_t count, int root) override {
    backend_.host_work([this, data, count, root] { inner_.broadcast(data, count, root); });
  }
  void barrier() override {
    backend_.host_work([this] { inner_.barrier(); });
  }
  void abort() noexcept override { inner_.abort(); }
  void launch_captured(const std::function<void()>& launch) override {
    inner_.launch_captured(launch);
  }

 private:
  Communicator& inner_;
  Backend& backend_;
};

// The same for a bucket launcher: launches and the wait for them are host work, recorded in
// step order (the launcher's own thread then sums while the replay goes on, as in a live step).
class RecordedLauncher final : public BucketLauncher {
 public:
  RecordedLauncher(BucketLauncher& inner, Backend& backend) : inner_(inner), backend_(backend) {}
  void launch(float* data, size_t count) override {
    backend_.host_work([this, data, count] { inner_.launch(data, count); });
  }
  void wait() override {
    backend_.host_work([this] { inner_.wait(); });
  }

 private:
  BucketLauncher& inner_;
  Backend& backend_;
};

}  // namespace

std::unique_ptr<Communicator> recorded(Communicator& inner, Backend& backend) {
  return std::make_unique<RecordedCommunicator>(inner, backend);
}

std::unique_ptr<BucketLauncher> recorded(BucketLauncher& inner, Backend& backend) {
  return std::make_unique<RecordedLauncher>(inner, backend);
}

}  // namespace dp
