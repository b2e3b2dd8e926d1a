#pragma once
// The data-parallel trainer: k replicas of one model, one thread each. Every step the global
// batch is split into k shards whose sizes differ by at most one; each replica runs forward and
// backward on its shard with the loss scaled by 1/global_batch; gradients are summed across
// replicas; every replica applies the same SGD update. So k replicas compute the same step as
// one replica on the whole batch (up to float summation order, and per-replica BN statistics).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/data.hpp"
#include "dp/module.hpp"

namespace dp {

using ModelBuilder = std::function<std::unique_ptr<Module>()>;

struct TrainerOptions {
  int replicas = 1;
  BackendKind backend = BackendKind::cpu;
  /// CUDA: replicas may share GPUs (replica r on device r % device_count). Without it, more
  /// replicas than devices is an error.
  bool oversubscribe = false;
  int64_t batch_size = 256;       // global batch
  int64_t eval_batch_size = 0;    // global; 0: same as batch_size
  int epochs = 10;
  SgdParams sgd;
  uint64_t seed = 0;
  int cpu_threads = 0;            // CPU backend: total threads shared by replicas (0: hardware)
  bool allow_tf32 = true;
  Layout layout = Layout::nchw;
  /// Average BN running statistics across replicas before each evaluation (d2l keeps one model).
  bool average_bn_buffers = true;
};

struct EpochReport {
  int epoch = 0;             // 1-based
  double train_loss = 0;     // mean over the epoch's training examples
  double train_acc = 0;
  double test_acc = 0;
  double seconds = 0;        // training time of the epoch (evaluation excluded)
  double eval_seconds = 0;
  double examples_per_second = 0;
  int64_t train_examples = 0, test_examples = 0;
  bool finite = true;        // false when the loss was NaN or infinite
};

class Trainer {
 public:
  /// Builds `replicas` copies of the model (builder called once per replica), allocates every
  /// buffer, initialises parameters from options.seed identically on each replica and uploads
  /// the datasets to every replica's device.
  Trainer(const TrainerOptions& options, const ModelBuilder& builder, const Dataset& train,
          const Dataset& test);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains options.epochs epochs; after each calls on_epoch, which returns false to stop.
  /// Training stops after an epoch whose loss was not finite.
  void fit(const std::function<bool(const EpochReport&)>& on_epoch);

  /// One epoch: train then evaluate. `epoch` is 1-based (it selects the shuffle).
  EpochReport run_epoch(int epoch);

  /// One SGD step on the given training examples (a global batch, in this order), for tests.
  /// Returns the mean loss.
  double step(const std::vector<int32_t>& indices);
  /// Test accuracy over the whole test set.
  double evaluate();

  int replicas() const;
  const TrainerOptions& options() const;
  /// Replica r's parameters / buffers, downloaded, in flat order.
  std::vector<float> parameters(int replica = 0) const;
  std::vector<float> buffers(int replica = 0) const;
  /// Replaces every replica's parameters with `flat` (flat order, padding included, as
  /// parameters() returns them); momentum and buffers are left as they are. For tests that run
  /// the same steps from nudged copies of the same initial parameters.
  void set_parameters(const std::vector<float>& flat);
  const ParamRegistry& registry(int replica = 0) const;
  Module& model(int replica = 0);
  /// "cpu" or "cuda"; devices as "NVIDIA H100 80GB HBM3 x2" or "CPU (2 threads) x2".
  std::string backend_name() const;
  std::string devices() const;
  std::string communicator_kind() const;
  /// Largest peak_memory() among the replicas' backends.
  size_t peak_memory_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Sizes of k shards of a batch of n: the first n % k shards get one more.
std::vector<int64_t> shard_sizes(int64_t n, int k);

}  // namespace dp
