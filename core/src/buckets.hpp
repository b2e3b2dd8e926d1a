#pragma once
// Gradient buckets: the flat gradient buffer cut into contiguous ranges of whole parameters, in
// the order backward produces them (the last parameters first), so each bucket's allreduce can
// start as soon as backward has written its last gradient, while backward goes on with the
// layers before it (PyTorch DDP's design: 25 MB buckets, the first one small so communication
// starts early).
//
// Buckets are launched strictly in order 0, 1, ... on every replica (a bucket that completes
// before an earlier one waits for it), so every rank issues the same collectives in the same
// order whatever the order its layers report gradients in. Parameters nobody reports (a
// plugin's own module that does not call RunContext::gradient_ready, or a replica that skipped
// backward) are launched by finish(), after backward.
//
// The launcher runs each allreduce: on the CPU a communication thread per replica (the
// allreduce runs while the replica's thread computes), on GPUs the call itself (NCCL and the
// same-device path enqueue on the replica's stream and return at once).
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dp/comm.hpp"
#include "dp/module.hpp"
#include "dp/params.hpp"

namespace dp {

/// Runs allreduces of gradient ranges, possibly in the background.
class BucketLauncher {
 public:
  virtual ~BucketLauncher() = default;
  /// Starts the allreduce of data[0, count).
  virtual void launch(float* data, size_t count) = 0;
  /// Returns when every launched allreduce is done; rethrows the first failure.
  virtual void wait() = 0;
};

/// Calls the communicator at launch (GPU communicators return once the work is enqueued).
std::unique_ptr<BucketLauncher> make_inline_launcher(Communicator& comm);
/// A thread that runs the allreduces in launch order (CPU communicators, which sum on the
/// calling thread). The communicator must be used by no other thread meanwhile.
std::unique_ptr<BucketLauncher> make_thread_launcher(Communicator& comm);

class GradientBuckets final : public GradientHook {
 public:
  struct Bucket {
    size_t begin = 0, end = 0;  // floats of the flat gradient buffer
    int parameters = 0;
  };
  /// Cuts the registry's trainable parameters, last first, into buckets of at most
  /// `bucket_bytes` (`first_bytes` for the first; a parameter larger than the cap is a bucket of
  /// its own). bucket_bytes == 0: one bucket (no overlap).
  GradientBuckets(const ParamRegistry& registry, size_t bucket_bytes, size_t first_bytes);

  const std::vector<Bucket>& buckets() const { return buckets_; }

  /// Before backward: every bucket pending; allreduces go to `launcher` over `grads`.
  void start(float* grads, BucketLauncher& launcher);
  void ready(ParamHandle parameter) override;
  /// After backward: launches what is left, in order, and waits for every allreduce.
  void finish();

 private:
  void launch_ready_in_order();

  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // per registry entry: its bucket, or -1 (buffers)
  std::vector<int> pending_;    // per bucket: parameters not yet reported this step
  std::vector<char> reported_;  // per registry entry: reported this step
  size_t next_ = 0;             // the next bucket to launch
  float* grads_ = nullptr;
  BucketLauncher* launcher_ = nullptr;
};

}  // namespace dp
