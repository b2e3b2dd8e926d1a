#pragma once
// The trainer's state, shared by trainer.cpp (setup and the step loop) and trainer_state.cpp
// (checkpoints). Internal to libdpcore.
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "buckets.hpp"
#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "dp/optimizer.hpp"
#include "dp/trainer.hpp"

namespace dp {

/// Sizes of k shards of a batch of n, empty shards allowed (an epoch's last batch may hold fewer
/// examples than there are replicas): the first n % k get one more (trainer.cpp).
std::vector<int64_t> split(int64_t n, int k);
/// a / b rounded up (a >= 0, b > 0).
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Trainer::Impl {
  struct Replica {
    int rank = 0;         // in this process
    int global_rank = 0;  // in the trial: process rank * local replicas + rank
    // Declaration order is destruction order reversed: the model (which holds backend plans)
    // and the memory go before the backend that owns them.
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Arena> arena;
    std::unique_ptr<ParamRegistry> params;
    std::unique_ptr<Module> model;
    Communicator* comm = nullptr;       // batch norm statistics, BN buffer averages
    Communicator* grad_comm = nullptr;  // gradient buckets (possibly from a second thread)
    std::unique_ptr<GradientBuckets> buckets;
    std::unique_ptr<Optimizer> optimizer;
    BucketLauncher* launcher = nullptr;

    // On the device path the training set and a table of M_train rows; streamed, views of the
    // ring (2 slots of Stream::slot_rows examples each), which every set passes through.
    Tensor train_images, train_labels;  // (M,C,H,W) u8, (M) u8
    Tensor train_index;    // (M_train) i32: this epoch's permutation, or step()'s indices;
                           // streamed: 0, 1, ... (the ring holds the examples in step order)
    Tensor train_draws;    // (like train_index) i32, with augmentation draws: each example's
                           // packed draw (dp/augment.hpp), read at its index's row
    // What the training and evaluation gathers apply (options.augment); null when nothing.
    // train_transform's draws point at train_draws.
    std::unique_ptr<GatherTransform> train_transform, eval_transform;
    /// Streamed data (options.data_budget): this replica's host staging, one buffer per ring
    /// slot (images, labels, draws of a chunk), and the upload that last read each.
    struct Stream {
      int64_t slot_rows = 0;
      std::vector<std::shared_ptr<void>> staging;  // released through the backend
      uint64_t tickets[2] = {0, 0};
    };
    Stream stream;
    Tensor x, y, dlogits;  // (per-replica max batch, ...)
    Tensor loss_slots;     // (steps per epoch) f32: loss sum of each step
    Tensor correct_slots;  // (steps per epoch) i32
    // What changes from step to step lives in device memory and is read when the step's ops
    // run, so every step is the same ops with the same arguments (a captured step replays as
    // any step): tables uploaded once per epoch, and a cursor each step advances itself.
    // The three live in one block (step_block), so one upload sets them all.
    Tensor step_block;    // (bytes) u8: cursor, step_start, step_scalars, in that order
    Tensor cursor;        // (1) i32: the step of the epoch, which is also its loss slot
    Tensor step_start;    // (steps per epoch, 1) i32: where this replica's shard starts in
                          // train_index
    Tensor step_scalars;  // (steps per epoch, optimizer's step scalars) f32
    Tensor eval_cursor;   // (1) i32: the evaluation chunk, also its slot
    // With options.graphs: the captured training steps, by batch size. After the backend
    // (destroyed first): they hold its graphs.
    std::vector<std::pair<int64_t, std::unique_ptr<CapturedOps>>> train_graphs;
    /// One per evaluated set (Impl::evals): its examples on the device, read in order in
    /// chunks, and each chunk's loss sum and correct count.
    struct Eval {
      Tensor images, labels;  // (M,C,H,W) u8, (M) u8
      Tensor index;           // (M) i32: 0, 1, ...
      Tensor start;           // (eval steps, 1) i32: where each chunk of this replica starts
      Tensor loss_slots;      // (eval steps) f32
      Tensor correct_slots;   // (eval steps) i32
      // With options.graphs: its captured chunks, by size (each reads this set's tensors).
      std::vector<std::pair<int64_t, std::unique_ptr<CapturedOps>>> graphs;
    };
    std::vector<Eval> evals;
  };

  /// What an evaluation of one set found over every replica.
  struct EvalResult {
    double acc = 0, loss = 0;  // an empty set: accuracy 0, loss NaN
  };

  TrainerOptions options;
  std::unique_ptr<ProcessGroup> own_group;  // when options.processes is null
  ProcessGroup* group = nullptr;            // never null after construction
  Dataset train_meta;  // shapes and counts only (the bytes live on the devices)
  /// The sets evaluated after every epoch, shapes and counts only: the test set, then the
  /// validation set when there is one.
  std::vector<Dataset> eval_meta;
  int64_t eval_batch = 0;         // global
  int64_t max_shard = 0;          // largest per-replica batch (training or evaluation)
  int64_t steps_per_epoch = 0;
  int64_t steps_done = 0;  // optimizer steps so far (run_epoch(e) starts at (e - 1) * per epoch)
  std::vector<int64_t> eval_steps;  // per replica, per evaluated set
  std::vector<Replica> replicas;
  /// Which data path runs, and with the streamed one the sets' bytes (train, then evals),
  /// kept on the host; empty on the device path.
  DataResidence residence;
  std::vector<Dataset> host_sets;
  bool streamed() const { return residence.path == "streamed"; }
  // Two communicator groups: gradient buckets may be summed on a communication thread while the
  // replica's thread runs synchronised batch norm's collectives, and one group's collectives
  // must never interleave. Destroyed before the replicas; the launchers (which may hold a
  // thread using grad_comms) before the communicators.
  std::unique_ptr<ProcessGroup> grad_group;  // a second process group for the gradient sums
  std::vector<std::unique_ptr<Communicator>> comms, grad_comms;
  std::vector<std::unique_ptr<BucketLauncher>> launchers;
  // With graphs on a backend that records its ops (cpu): the communicators and launchers the
  // replicas use, whose host work is recorded with the step. Destroyed before what they wrap.
  std::vector<std::unique_ptr<Communicator>> recorded_comms;
  std::vector<std::unique_ptr<BucketLauncher>> recorded_launchers;
  std::string failure;             // set once a replica failed
  std::vector<ParamOrder> orders;  // parameters stored in another order than PyTorch's
  // True when training ran since the BN buffers were last averaged. Averaging replicas that
  // already agree is not a no-op in floats ((a + a + a) * (1/3) != a), so evaluating twice
  // would drift the running statistics; it is skipped then.
  bool buffers_differ = false;

  int k() const { return static_cast<int>(replicas.size()); }
  /// Replicas in the whole trial; shards, the loss scale and averages are over these.
  int world() const { return group->size() * k(); }

  // Runs fn(replica) on one thread per replica. When one throws, every communicator is aborted
  // so ranks blocked in a collective wake up; after joining, the first real error (not the
  // AbortedError it caused elsewhere) is rethrown here.
  void run_all(const std::function<void(Replica&)>& fn) {
    if (!failure.empty())
      throw Error("this trainer can no longer be used: an earlier step failed (" + failure + ")");
    std::mutex m;
    std::exception_ptr first_real, first_any;
    auto fail = [&](std::exception_ptr e, bool aborted) {
      {
        std::lock_guard<std::mutex> lock(m);
        if (!first_any) first_any = e;
        if (!aborted && !first_real) first_real = e;
      }
      for (auto& c : comms) c->abort();
      for (auto& c : grad_comms) c->abort();
    };
    std::vector<std::thread> threads;
    threads.reserve(replicas.size());
    for (auto& r : replicas) {
      threads.emplace_back([&fn, &fail, &r] {
        try {
          fn(r);
        } catch (const AbortedError&) {
          fail(std::current_exception(), true);
        } catch (...) {
          fail(std::current_exception(), false);
        }
      });
    }
    for (auto& t : threads) t.join();
    std::exception_ptr e = first_real ? first_real : first_any;
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      failure = ex.what();
    } catch (...) {
      failure = "unknown error";
    }
    std::rethrow_exception(e);
  }

  void setup_replica(Replica& r, const Dataset& train, const std::vector<const Dataset*>& evals);
  // The per-replica batch sizes an epoch runs: training steps (full batches and the last partial
  // one; an empty shard runs no layer) and evaluation chunks. Layers prepare for exactly these
  // at setup (convolution algorithms), so nothing is planned mid-epoch.
  std::vector<int64_t> train_batches(int global_rank) const;
  std::vector<int64_t> eval_batches(int global_rank) const;
  // ---- data (trainer_data.cpp) -------------------------------------------------------------
  /// One step's shard, or one evaluation chunk, of a replica: positions [begin, begin + size) of
  /// its pass's order.
  struct Unit {
    int64_t begin = 0, size = 0;
  };
  /// Decides the data path from options.data_budget (residence), before the replicas exist.
  void plan_residence(const Dataset& train, const std::vector<const Dataset*>& evals);
  /// Allocates and uploads a replica's data: the sets, or the ring and staging.
  void setup_data(Replica& r, const Dataset& train, const std::vector<const Dataset*>& evals);
  /// This replica's shards of steps [0, steps) with global batches of `batch` (the last what is
  /// left of `count`).
  std::vector<Unit> train_units(const Replica& r, int64_t steps, int64_t batch,
                                int64_t count) const;
  std::vector<Unit> eval_units(const Replica& r, size_t set) const;
  /// Trains the steps of `units` on the examples order[...] (draws parallel to it, or empty),
  /// the first of them optimizer step `first` (0-based): uploads what the path needs, the
  /// step tables, and runs train_step per unit.
  void train_pass(Replica& r, const std::vector<int32_t>& order, const std::vector<int32_t>& draws,
                  const std::vector<Unit>& units, int64_t batch, int64_t count, int64_t first);
  /// Runs eval_chunk over set `set`'s chunks of this replica; returns how many ran.
  int64_t eval_pass(Replica& r, size_t set);
  /// Streamed: the ring row of each unit (chunk c in slot c % 2), and where each chunk's units
  /// end.
  struct StreamPlan {
    std::vector<int64_t> rows;
    std::vector<size_t> chunk_end;
  };
  StreamPlan plan_stream(const std::vector<Unit>& units, int64_t slot_rows) const;
  /// Streamed: runs run_unit(u) for every unit, each chunk's examples (host set `set` at
  /// order[position], or the position itself when order is null; draws likewise) staged and
  /// uploaded into its slot two chunks ahead of use, after the steps that last read the slot.
  void stream_pass(Replica& r, const StreamPlan& plan, const std::vector<Unit>& units, size_t set,
                   const int32_t* order, const int32_t* draws,
                   const std::function<void(size_t)>& run_unit);
  void stage_chunk(Replica& r, const StreamPlan& plan, const std::vector<Unit>& units, size_t c,
                   size_t set, const int32_t* order, const int32_t* draws);
  // Uploads the step tables of units' steps (this replica's shard of each starting at starts[t]
  // of the index buffer), the first of them optimizer step `first` (0-based), and sets the
  // cursor to 0.
  void upload_steps(Replica& r, const std::vector<int64_t>& starts, int64_t first);
  // One step of a global batch of n at the cursor (captured once per n with options.graphs).
  void train_step(Replica& r, int64_t n);
  // The ops of that step: everything that changes between steps is read at the cursor.
  void train_step_ops(Replica& r, int64_t n);
  // One evaluation chunk of m examples of set `set` at the evaluation cursor (captured once per
  // m with options.graphs), and its ops.
  void eval_chunk(Replica& r, size_t set, int64_t m);
  void eval_chunk_ops(Replica& r, size_t set, int64_t m);
  // graphs = "auto" (trainer_capture.cpp), after options.graphs holds its choice for this
  // process: captures every training step size and evaluation chunk size on every replica now,
  // before anything runs, and keeps them; where the backend refuses a capture (the step needs
  // the host: CaptureRefused), or another process of the trial runs eagerly, clears
  // options.graphs instead, so the steps run eagerly and options() says so. Every process calls
  // it (one collective over the process group).
  void capture_or_run_eagerly();
  // Runs ops(), or with options.graphs replays its capture for `size` (capturing it first);
  // `collectives`: the ops hold the replica's collectives (a training step), whose
  // communicators then launch the replay (Communicator::launch_captured).
  void run_captured(Replica& r,
                    std::vector<std::pair<int64_t, std::unique_ptr<CapturedOps>>>& graphs,
                    int64_t size, bool collectives, const std::function<void()>& ops);
  /// The learning rate of 0-based step t.
  float lr_at(int64_t t) const {
    return static_cast<float>(options.lr.at(t, steps_per_epoch, std::max(options.epochs, 1)));
  }
  // Evaluates every set on this replica: correct counts and loss sums, per set.
  void evaluate_replica(Replica& r, std::vector<int64_t>& correct, std::vector<double>& loss);
  // Every set over every replica and process.
  std::vector<EvalResult> evaluate_all();
};

}  // namespace dp
