#pragma once
// The data-parallel trainer: k replicas of one model, one thread each. Every step the global
// batch is split into k shards whose sizes differ by at most one; each replica runs forward and
// backward on its shard with the loss scaled by 1/global_batch; gradients are summed across
// replicas; every replica applies the same SGD update. So k replicas compute the same step as
// one replica on the whole batch (up to float summation order, and per-replica BN statistics).
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dp/augment.hpp"
#include "dp/backend.hpp"
#include "dp/data.hpp"
#include "dp/module.hpp"
#include "dp/optimizer.hpp"
#include "dp/process_group.hpp"
#include "dp/safetensors.hpp"

namespace dp {

using ModelBuilder = std::function<std::unique_ptr<Module>()>;

struct TrainerOptions {
  /// Replicas in this process (threads). With `processes`, the trial has processes->size() times
  /// as many: every process runs the same trainer with the same options and data, each its
  /// share of every global batch.
  int replicas = 1;
  /// The trial's processes (not owned; must outlive the trainer); null: this process alone.
  ProcessGroup* processes = nullptr;
  BackendKind backend = BackendKind::cpu;
  /// CUDA: replicas may share GPUs (replica r on device r % device_count). Without it, more
  /// replicas than devices is an error.
  bool oversubscribe = false;
  int64_t batch_size = 256;     // global batch
  int64_t eval_batch_size = 0;  // global; 0: same as batch_size
  int epochs = 10;
  /// The learning rate of every step, and the optimizer that applies it (one fused update of
  /// the flat parameter buffer per step, the same on every replica).
  LrSchedule lr;
  OptimizerOptions optimizer;
  uint64_t seed = 0;
  int cpu_threads = 0;  // CPU backend: total threads shared by replicas (0: hardware)
  bool allow_tf32 = true;
  /// CUDA: how each convolution's algorithm is picked (dp::ConvChoice).
  ConvChoice conv_choice = ConvChoice::automatic;
  /// Arithmetic of convolutions and linear layers (dp::Precision); bf16 on the cpu backend only.
  Precision precision = Precision::fp32;
  Layout layout = Layout::nchw;
  /// Average BN running statistics across replicas before each evaluation (d2l keeps one model).
  bool average_bn_buffers = true;
  /// Gradients are summed in buckets of at most this many bytes, each started as soon as
  /// backward has produced it (on the CPU by a communication thread per replica, so the sum
  /// overlaps the rest of backward), the first bucket at most first_bucket_bytes so
  /// communication starts early. 0: one sum of all gradients after backward, no overlap.
  /// Results are the same either way (the same sums, element by element).
  size_t bucket_bytes = size_t{25} << 20;
  size_t first_bucket_bytes = size_t{1} << 20;
  /// Batch norm statistics over every replica of the trial in training (bn = "sync"), so k
  /// replicas compute the step of one replica on the whole batch; false: per-replica
  /// statistics, as in the d2l text.
  bool sync_bn = false;
  /// Capture each training step, and each evaluation chunk, once per batch size and replay it
  /// (Backend::begin_capture): CUDA graphs on GPUs (one launch per step, no host work inside
  /// it); on the CPU a recording of the ops, which computes the same bits as running them and
  /// proves that a step reads everything that changes between steps from device memory.
  /// Replicas sharing one GPU cannot be captured (their collectives meet on the host).
  bool graphs = false;
  /// graphs = "auto" (the runner's default): the trainer sets graphs itself, on where the steps
  /// can be captured and were measured faster: the CUDA backend with no two replicas of this
  /// process sharing a GPU (a ResNet-18 step took 13 % less time on an H200, LeNet's 38 % less).
  /// There it captures every step and evaluation chunk size in the constructor; a model whose
  /// step the backend refuses to capture (it needs the host: CaptureRefused) runs without graphs,
  /// with a warning on stderr, and so do the other processes of its trial. options() then says
  /// what it chose.
  bool graphs_auto = false;
  /// The layers' outputs and gradients share memory when their lifetimes in a training step do
  /// not overlap (memory_plan.hpp); false: each its own, for comparisons. The same results
  /// either way.
  bool memory_plan = true;
  /// Random crop, horizontal flip and per-channel normalisation of the examples, applied on the
  /// device by the batch gather, inside the step (and its graph). Each training example's draw
  /// comes from (seed, epoch, its position in the epoch's global order) (dp/augment.hpp), so k
  /// replicas compute one replica's step and a resumed run the uninterrupted one. The defaults
  /// change nothing.
  Augmentation augment;
  /// Device memory, in bytes per replica, that the datasets may take (0: no limit). When the
  /// training and evaluation sets together need more, they stay in host memory and every pass
  /// streams the examples its steps read, in chunks, into a two-slot ring on the device (a
  /// slot: what half this budget holds, at most 16 and at least one of the replica's largest
  /// batches; the page-locked staging on the host is a slot's size); the next chunk is copied
  /// while the device computes the current one. The same examples in the same order
  /// give the same bits as the data on the device. Trainer::data_residence() says which ran.
  size_t data_budget = 0;
};

/// Where a trainer keeps its datasets (Trainer::data_residence), for the record of a trial.
struct DataResidence {
  /// "device": every set uploaded once to each replica's device; "streamed": the sets stay in
  /// host memory (page-locked staging on GPUs) and pass through a ring on the device.
  std::string path = "device";
  /// Per replica: the bytes the datasets take on the device (the sets, or the ring), and what
  /// the sets would take there whole (images, labels, index and draw tables).
  size_t device_bytes = 0, resident_bytes = 0;
  /// Streamed: the examples one ring slot holds (each chunk: consecutive steps that fit); 0
  /// on the device path.
  int64_t chunk_examples = 0;
};

struct EpochReport {
  int epoch = 0;          // 1-based
  double train_loss = 0;  // mean over the epoch's training examples
  double train_acc = 0;
  double test_acc = 0;
  double test_loss = 0;  // mean over the test set
  /// On the validation set (held out of the training data), when the trainer has one; NaN
  /// otherwise.
  double val_acc = std::numeric_limits<double>::quiet_NaN();
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  double seconds = 0;  // training time of the epoch (evaluation excluded)
  double eval_seconds = 0;
  double examples_per_second = 0;
  double lr = 0;  // the learning rate of the epoch's last step
  int64_t train_examples = 0, test_examples = 0, val_examples = 0;
  bool finite = true;  // false when the loss was NaN or infinite
};

class Trainer {
 public:
  /// Builds `replicas` copies of the model (builder called once per replica), allocates every
  /// buffer, initialises parameters from options.seed identically on each replica and uploads
  /// the datasets to every replica's device (or, beyond options.data_budget, keeps them on the
  /// host to stream them: data_residence()). With a validation set, every epoch evaluates it
  /// too (EpochReport::val_acc, val_loss), after the test set.
  Trainer(const TrainerOptions& options, const ModelBuilder& builder, const Dataset& train,
          const Dataset& test, const Dataset* validation = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains epochs first_epoch .. options.epochs; after each calls on_epoch, which returns false
  /// to stop. Training stops after an epoch whose loss was not finite. first_epoch > 1 continues
  /// a run whose state load_state() restored.
  void fit(const std::function<bool(const EpochReport&)>& on_epoch, int first_epoch = 1);

  /// One epoch: train then evaluate. `epoch` is 1-based (it selects the shuffle).
  EpochReport run_epoch(int epoch);

  /// One optimizer step on the given training examples (a global batch, in this order), for
  /// tests; it continues the step count (the schedule and AdamW's bias correction). Returns the
  /// mean loss.
  double step(const std::vector<int32_t>& indices);
  /// Test accuracy over the whole test set.
  double evaluate();

  /// Replicas in this process, and in the whole trial (all processes).
  // ---- checkpoints ---------------------------------------------------------------------------
  /// The model as PyTorch's state_dict holds it: every parameter and buffer under its dotted
  /// name, PyTorch's shape and element order (an NHWC model's convolution weights, stored
  /// (K, R, S, C), ParamRegistry::Entry::layout, and its Linear after Flatten, stored with
  /// (H, W, C) columns, Module::parameter_orders, are permuted), plus num_batches_tracked (I64) beside every batch norm's running statistics, so
  /// torch's load_state_dict(strict=True) takes it as it is. From replica 0 (all agree).
  SafeTensorsFile model_state() const;
  /// The optimizer's state per parameter ("exp_avg.<parameter name>", ...), in PyTorch's element
  /// order as model_state's (format "dprun-optimizer-state v2"; v1 files, in the element order
  /// of the trainer that wrote them, are still read), and the steps done (metadata "steps").
  SafeTensorsFile optimizer_state() const;
  /// Restores parameters and buffers (and, when given, the optimizer's state) into every
  /// replica, from files written by model_state() / optimizer_state() of a trainer of the same
  /// model, in either layout. Every name and shape must match; the error names what differs.
  void load_state(const SafeTensorsFile& model, const SafeTensorsFile* optimizer);

  int replicas() const;
  int world_replicas() const;
  const TrainerOptions& options() const;
  /// Replica r's parameters / buffers, downloaded, in flat order; each parameter in the order
  /// its shape reads (ParamRegistry::params_in_reading_order: an NHWC model's convolution weights,
  /// stored (K, R, S, C), given as (K, C, R, S)). So both layouts give one vector for the same
  /// model, unless it has a Linear after a Flatten of more than one position, whose columns an
  /// NHWC model keeps in (H, W, C) order.
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
  /// Replica 0's memory plan: the bytes its planned buffers (the layers' outputs and gradients)
  /// would take each on its own, the bytes the plan placed them in, and the least possible.
  Arena::PlanStats memory_plan_stats() const;
  /// Replica 0's arena: every buffer of its model, data and step state, in bytes.
  size_t arena_bytes() const;
  /// With options.graphs: the training steps and evaluation chunks captured so far on replica
  /// 0, one per batch size met (full batches, the epoch's last one, evaluation chunks); 0
  /// without graphs.
  size_t captured_steps() const;
  /// Which data path runs (options.data_budget) and the bytes it takes.
  const DataResidence& data_residence() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Sizes of k shards of a batch of n: the first n % k shards get one more.
std::vector<int64_t> shard_sizes(int64_t n, int k);

}  // namespace dp
