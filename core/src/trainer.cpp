// The data-parallel trainer. Each replica owns a backend, an arena, a parameter registry, a
// model and a communicator, and runs on its own thread. The whole step loop of an epoch runs on
// the replica's thread: the host only uploads one permutation and the step tables per epoch and
// downloads the per-step loss/correct slots once at the end, so nothing in a step waits for the
// device. A step reads what changes between steps (its shard's place in the permutation, its
// learning rate, its loss slot) from those tables at a cursor it advances itself, so every step
// is the same ops with the same arguments, and with options.graphs it is captured once per batch
// size and replayed (CUDA graphs).
#include "dp/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "capture.hpp"
#include "dp/augment.hpp"
#include "dp/backend.hpp"
#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "dp/random.hpp"
#include "trainer_impl.hpp"

namespace dp {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Every step advances its cursor once: a cursor elsewhere after the loop means a step was lost
// or doubled (a captured step that did not replay as a whole), and the figures would be wrong.
void check_cursor(int32_t cursor, int64_t steps, const char* what) {
  DP_CHECK(cursor == steps, std::string("internal error: after ") + std::to_string(steps) + " " +
                                what + " steps the step cursor is at " + std::to_string(cursor));
}

// The settings' errors, for users: what is wrong and what is expected.
void check_augmentation(const Augmentation& a, int64_t channels) {
  DP_CHECK(a.crop_padding >= 0 && a.crop_padding <= kMaxCropPadding,
           "augment.crop_padding is " + std::to_string(a.crop_padding) + ": expected 0 .. " +
               std::to_string(kMaxCropPadding));
  DP_CHECK(a.mean.size() == a.std.size(),
           "augment.mean has " + std::to_string(a.mean.size()) + " values but augment.std has " +
               std::to_string(a.std.size()) + ": give both, one value per channel, or neither");
  DP_CHECK(a.mean.empty() || static_cast<int64_t>(a.mean.size()) == channels,
           "augment.mean and augment.std have " + std::to_string(a.mean.size()) +
               " values but the data has " + std::to_string(channels) +
               " channels: give one value per channel");
  DP_CHECK(static_cast<int64_t>(a.mean.size()) <= kMaxNormaliseChannels,
           "augment.mean and augment.std have " + std::to_string(a.mean.size()) +
               " values: normalisation takes at most " + std::to_string(kMaxNormaliseChannels) +
               " channels (on every backend)");
  for (size_t c = 0; c < a.mean.size(); ++c) {
    DP_CHECK(std::isfinite(a.mean[c]) && std::isfinite(a.std[c]) && a.std[c] > 0.0f,
             "augment: channel " + std::to_string(c) + " has mean " + std::to_string(a.mean[c]) +
                 " and std " + std::to_string(a.std[c]) + ": expected finite values and std > 0");
  }
}

}  // namespace

// Shard sizes allowing empty shards (the last, partial batch of an epoch may hold fewer
// examples than there are replicas).
std::vector<int64_t> split(int64_t n, int k) {
  std::vector<int64_t> s(static_cast<size_t>(k), n / k);
  for (int64_t r = 0; r < n % k; ++r) ++s[static_cast<size_t>(r)];
  return s;
}

std::vector<int64_t> shard_sizes(int64_t n, int k) {
  DP_CHECK(k >= 1, "shard_sizes: the replica count must be positive, got " + std::to_string(k));
  DP_CHECK(n >= k, "a batch of " + std::to_string(n) + " examples cannot be split across " +
                       std::to_string(k) +
                       " replicas: every replica needs at least one example (batch size >= "
                       "gpus); use a larger batch or fewer replicas");
  return split(n, k);
}

namespace {}  // namespace

namespace {
void add_unique(std::vector<int64_t>& sizes, int64_t n) {
  if (n > 0 && std::find(sizes.begin(), sizes.end(), n) == sizes.end()) sizes.push_back(n);
}
}  // namespace

std::vector<int64_t> Trainer::Impl::train_batches(int global_rank) const {
  const int64_t count = train_meta.count, batch = options.batch_size;
  const auto r = static_cast<size_t>(global_rank);
  std::vector<int64_t> sizes;
  if (count >= batch) add_unique(sizes, split(batch, world())[r]);
  if (count % batch != 0) add_unique(sizes, split(count % batch, world())[r]);
  return sizes;
}

std::vector<int64_t> Trainer::Impl::eval_batches(int global_rank) const {
  const int64_t chunk = ceil_div(eval_batch, world());
  std::vector<int64_t> sizes;
  for (const Dataset& set : eval_meta) {
    const int64_t part = split(set.count, world())[static_cast<size_t>(global_rank)];
    add_unique(sizes, std::min(chunk, part));
    add_unique(sizes, part % chunk);
  }
  return sizes;
}

void Trainer::Impl::setup_replica(Replica& r, const Dataset& train,
                                  const std::vector<const Dataset*>& evals) {
  const int k = this->k();
  BackendOptions bo;
  bo.kind = options.backend;
  bo.allow_tf32 = options.allow_tf32;
  bo.conv_choice = options.conv_choice;
  bo.precision = options.precision;
  if (options.backend == BackendKind::cpu) {
    const int total = options.cpu_threads > 0
                          ? options.cpu_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    bo.cpu_threads = std::max(1, total / k);
  } else {
    // Processes sharing a host take consecutive GPUs: local process i owns [i*k, i*k + k).
    const int devices = cuda_device_count();
    bo.device_index = (group->local_rank() * k + r.rank) % std::max(devices, 1);
  }
  r.backend = create_backend(bo);
  Backend& b = *r.backend;
  r.arena = std::make_unique<Arena>(b);
  r.arena->set_memory_plan(options.memory_plan);
  r.params = std::make_unique<ParamRegistry>();
  // An NHWC model's convolutions keep their weights (K, R, S, C), as their passes read them.
  r.params->set_layout(options.layout);
  r.model->declare(*r.params, "");
  r.optimizer = make_optimizer(options.optimizer);
  // Where the backend's passes read packed bf16 weights (precision bf16 on the GPU), a packed
  // bf16 copy of the parameters, which the optimizer's update writes: the weights cuDNN's and
  // cuBLAS's bf16 kernels read, rounded once a step instead of once a pass.
  r.params->allocate(b, r.optimizer->state_buffers(), b.reads_packed_weights());
  r.params->initialize(options.seed);

  const Shape example{train.channels, train.height, train.width};
  // train_step never asks for the gradient of the images: input_grad false.
  SetupContext sctx{b,
                    *r.arena,
                    *r.params,
                    options.layout,
                    train_batches(r.global_rank),
                    eval_batches(r.global_rank),
                    false};
  const Shape out = r.model->setup(sctx, {max_shard, example[0], example[1], example[2]});
  DP_CHECK(out.rank == 2 && out[1] == train.classes,
           "the model's output is " + out.str() + " but the dataset has " +
               std::to_string(train.classes) + " classes: expected (N, " +
               std::to_string(train.classes) + ")");

  Arena& a = *r.arena;
  r.x = a.allocate({max_shard, example[0], example[1], example[2]}, DType::f32, options.layout);
  r.y = a.allocate({max_shard}, DType::i32);
  r.dlogits = a.allocate(out);
  r.loss_slots = a.allocate({steps_per_epoch}, DType::f32);
  r.correct_slots = a.allocate({steps_per_epoch}, DType::i32);
  {
    const int64_t width = r.optimizer->step_scalars();
    r.step_block = a.allocate({4 * (1 + steps_per_epoch * (1 + width))}, DType::u8);
    auto* p = static_cast<int32_t*>(r.step_block.data);  // 4-byte entries: i32, then f32
    const Device d = r.step_block.device;
    r.cursor = Tensor(p, {1}, DType::i32, d);
    r.step_start = Tensor(p + 1, {steps_per_epoch, 1}, DType::i32, d);
    r.step_scalars = Tensor(p + 1 + steps_per_epoch, {steps_per_epoch, width}, DType::f32, d);
  }
  r.eval_cursor = a.allocate({1}, DType::i32);

  setup_data(r, train, evals);
  b.synchronize();
}

void Trainer::Impl::train_step_ops(Replica& r, int64_t n) {
  Backend& b = *r.backend;
  // This replica's shard size as split() cuts it, computed without a vector: nothing is
  // allocated in the step loop. Where the shard starts is read at the cursor.
  const int64_t k = world(), g = r.global_rank;
  const int64_t m = n / k + (g < n % k ? 1 : 0);
  const StepRow start{r.step_start, r.cursor};
  // With synchronised batch norm an empty shard still runs the model: every replica must take
  // part in the statistics' collectives, in the same order.
  if (m > 0 || options.sync_bn) {
    const Tensor x = r.x.with_batch(m), y = r.y.with_batch(m);
    b.gather_batch(r.train_images, r.train_labels, r.train_index, x, y, &start,
                   r.train_transform.get());
    RunContext ctx{b, *r.params, true, options.sync_bn ? r.comm : nullptr, n, r.buckets.get()};
    const Tensor logits = r.model->forward(ctx, x);
    const Tensor dlogits = r.dlogits.with_batch(m);
    // Scaled by the GLOBAL batch, so the summed gradients are those of the global mean loss.
    b.softmax_cross_entropy(logits, y, 1.0f / static_cast<float>(n), dlogits, r.loss_slots,
                            r.correct_slots, &r.cursor);
    r.buckets->start(r.params->grads_flat().f32(), *r.launcher);
    r.model->backward(ctx, dlogits, false);  // buckets are summed as their gradients are done
  } else {
    // An empty shard (last batch smaller than the replica count) contributes nothing but must
    // still take part in the allreduces. Its loss slot gets zeros (the loss of no examples).
    b.fill(r.params->grads_flat(), 0.0f);
    const Tensor none = r.dlogits.with_batch(0);
    b.softmax_cross_entropy(none, r.y.with_batch(0), 1.0f, none, r.loss_slots, r.correct_slots,
                            &r.cursor);
    r.buckets->start(r.params->grads_flat().f32(), *r.launcher);
  }
  r.buckets->finish();  // what backward did not report, then wait for every sum
  const Tensor grads = r.params->grads_flat();
  r.optimizer->update_at(b, r.params->params_flat(), grads, r.params->state_flat(),
                         StepRow{r.step_scalars, r.cursor}, r.params->params_bf16_flat());
  b.advance(r.cursor);
}

void Trainer::Impl::evaluate_replica(Replica& r, std::vector<int64_t>& correct,
                                     std::vector<double>& loss) {
  Backend& b = *r.backend;
  const int k = world();
  if (options.average_bn_buffers && buffers_differ && k > 1 && r.params->buffer_floats() > 0) {
    const Tensor bufs = r.params->buffers_flat();
    r.comm->allreduce_sum(bufs.f32(), static_cast<size_t>(bufs.numel()));
    b.scale(bufs, 1.0f / static_cast<float>(k));
  }
  correct.assign(eval_meta.size(), 0);
  loss.assign(eval_meta.size(), 0.0);
  for (size_t set = 0; set < eval_meta.size(); ++set) {
    if (eval_meta[set].count == 0) continue;
    const int32_t zero = 0;
    b.upload(r.eval_cursor.data, &zero, sizeof zero);
    const int64_t steps = eval_pass(r, set);
    std::vector<int32_t> counts(static_cast<size_t>(steps));
    std::vector<float> sums(static_cast<size_t>(steps));
    if (steps > 0) {
      b.download(counts.data(), r.evals[set].correct_slots.data, counts.size() * sizeof(int32_t));
      b.download(sums.data(), r.evals[set].loss_slots.data, sums.size() * sizeof(float));
    }
    int32_t cursor = 0;
    b.download(&cursor, r.eval_cursor.data, sizeof cursor);
    check_cursor(cursor, steps, "evaluation");
    for (int32_t c : counts) correct[set] += c;
    for (float l : sums) loss[set] += l;
  }
}

std::vector<Trainer::Impl::EvalResult> Trainer::Impl::evaluate_all() {
  const size_t sets = eval_meta.size();
  std::vector<std::vector<int64_t>> correct(static_cast<size_t>(k()));
  std::vector<std::vector<double>> loss(static_cast<size_t>(k()));
  run_all([&](Replica& r) {
    evaluate_replica(r, correct[static_cast<size_t>(r.rank)], loss[static_cast<size_t>(r.rank)]);
  });
  buffers_differ = false;
  // This process's replicas, then every process's (in process order: the same bits everywhere).
  std::vector<double> totals(2 * sets, 0.0);
  for (size_t q = 0; q < correct.size(); ++q)
    for (size_t set = 0; set < sets; ++set) {
      totals[2 * set] += static_cast<double>(correct[q][set]);
      totals[2 * set + 1] += loss[q][set];
    }
  if (!totals.empty()) group->allreduce_sum(totals.data(), totals.size());
  std::vector<EvalResult> out(sets);
  for (size_t set = 0; set < sets; ++set) {
    const auto n = static_cast<double>(eval_meta[set].count);
    // An empty set has no loss (NaN: no stopping rule may read it as perfect).
    out[set] = n > 0 ? EvalResult{totals[2 * set] / n, totals[2 * set + 1] / n}
                     : EvalResult{0.0, std::numeric_limits<double>::quiet_NaN()};
  }
  return out;
}

// ---- Trainer ----------------------------------------------------------------------------------

Trainer::Trainer(const TrainerOptions& options, const ModelBuilder& builder, const Dataset& train,
                 const Dataset& test, const Dataset* validation)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = options;
  if (options.processes == nullptr) s.own_group = make_single_process_group();
  s.group = options.processes != nullptr ? options.processes : s.own_group.get();
  const int k = options.replicas;
  DP_CHECK(k >= 1, "the number of replicas must be at least 1, got " + std::to_string(k));
  const int world = s.group->size() * k;
  DP_CHECK(options.batch_size >= 1,
           "batch size must be positive, got " + std::to_string(options.batch_size));
  DP_CHECK(options.batch_size >= world,
           "batch size " + std::to_string(options.batch_size) + " is smaller than the " +
               std::to_string(world) +
               " replicas: every replica needs at least one example per step (batch size >= "
               "gpus); use a larger batch or fewer replicas");
  DP_CHECK(options.eval_batch_size >= 0, "eval batch size must be >= 0 (0: the batch size)");
  DP_CHECK(builder != nullptr, "Trainer: no model builder given");
  DP_CHECK(train.count >= 1, "the training set '" + train.name + "' is empty");
  std::vector<const Dataset*> evals{&test};
  if (validation != nullptr) evals.push_back(validation);
  std::vector<const Dataset*> all{&train};
  all.insert(all.end(), evals.begin(), evals.end());
  for (const Dataset* d : all) {
    DP_CHECK(d->images.size() == static_cast<size_t>(d->count * d->example_bytes()) &&
                 d->labels.size() == static_cast<size_t>(d->count),
             "dataset '" + d->name + "': " + std::to_string(d->count) + " examples but " +
                 std::to_string(d->images.size()) + " image bytes and " +
                 std::to_string(d->labels.size()) + " labels");
  }
  for (const Dataset* d : evals)
    DP_CHECK(d->count == 0 || (d->channels == train.channels && d->height == train.height &&
                               d->width == train.width && d->classes == train.classes),
             "the " + std::string(d == &test ? "test" : "validation") + " set '" + d->name +
                 "' has another example shape or class count than the training set '" + train.name +
                 "'");
  if (options.backend == BackendKind::cuda) {
    DP_CHECK(cuda_compiled(), "the CUDA backend was requested but dprun was built without CUDA");
    const int devices = cuda_device_count();
    DP_CHECK(devices > 0, "the CUDA backend was requested but no CUDA device is visible");
    const int here = s.group->local_size() * k;  // replicas of this trial on this host
    DP_CHECK(here <= devices || options.oversubscribe,
             std::to_string(here) + " replicas on this host but only " + std::to_string(devices) +
                 " GPU" + (devices == 1 ? "" : "s") + " exist" + (devices == 1 ? "s" : "") +
                 "; use fewer replicas, or --oversubscribe to share GPUs (replica r runs on GPU "
                 "r % " +
                 std::to_string(devices) + ")");
  }

  s.train_meta = train;
  s.train_meta.images.clear();
  s.train_meta.labels.clear();
  s.eval_batch = options.eval_batch_size > 0 ? options.eval_batch_size : options.batch_size;
  s.max_shard = std::max(ceil_div(options.batch_size, world), ceil_div(s.eval_batch, world));
  s.steps_per_epoch = ceil_div(train.count, options.batch_size);
  for (const Dataset* d : evals) {
    Dataset meta = *d;
    meta.images.clear();
    meta.labels.clear();
    s.eval_meta.push_back(std::move(meta));
    s.eval_steps.push_back(ceil_div(ceil_div(d->count, world), ceil_div(s.eval_batch, world)));
  }

  check_augmentation(options.augment, train.channels);
  s.plan_residence(train, evals);

  s.replicas.resize(static_cast<size_t>(k));
  // The builder runs here, on the caller's thread, one replica after another: model code
  // (plugins, tests) need not be thread-safe.
  for (int r = 0; r < k; ++r) {
    Impl::Replica& rep = s.replicas[static_cast<size_t>(r)];
    rep.rank = r;
    rep.global_rank = s.group->rank() * k + r;
    rep.model = builder();
    DP_CHECK(rep.model != nullptr, "the model builder returned no model");
  }
  // The CPU kernels are resolved (and OpenBLAS loaded, which sets and unsets OPENBLAS_CORETYPE)
  // here, before any replica thread exists: setenv while another thread reads the environment
  // is a use-after-free in glibc.
  if (options.backend == BackendKind::cpu) (void)cpu_kernels();
  // Replicas are set up on their own threads (device contexts, parallel uploads); there are no
  // communicators yet, so a failure cannot leave anyone blocked.
  s.run_all([&](Impl::Replica& r) { s.setup_replica(r, train, evals); });
  std::vector<Backend*> backends;
  for (auto& r : s.replicas) backends.push_back(r.backend.get());
  s.replicas[0].model->parameter_orders(s.orders);
  s.comms = make_communicators(backends, s.group);
  s.grad_group = s.group->duplicate();
  s.grad_comms = make_communicators(backends, s.grad_group.get());
  if (options.graphs_auto) {
    // Where capture is possible and was measured faster: CUDA with no two replicas of this
    // process on one GPU (bench/results/2026-11-28-nvidia-h200-bf28c6d.json: a ResNet-18 step
    // 7.92 ms captured against 9.09 ms eager, LeNet's 0.823 against 1.329 ms). On the CPU the
    // recording replays the same ops, not measured faster: off, as it always ran. Each process
    // decides for itself; the collectives are the same calls captured or not.
    s.options.graphs = options.backend == BackendKind::cuda &&
                       (s.world() == 1 || s.comms[0]->kind() != "cuda-same-device");
  }
  // CPU communicators sum on the calling thread: a thread per replica lets that overlap
  // backward. GPU communicators enqueue on the replica's stream and return at once. Across
  // processes with synchronised BN both groups talk MPI at once, which needs an MPI library
  // that allows concurrent calls.
  const bool thread = options.backend == BackendKind::cpu && options.bucket_bytes > 0 &&
                      (!options.sync_bn || s.group->concurrent_collectives());
  for (int r = 0; r < k; ++r) {
    Impl::Replica& rep = s.replicas[static_cast<size_t>(r)];
    rep.comm = s.comms[static_cast<size_t>(r)].get();
    rep.grad_comm = s.grad_comms[static_cast<size_t>(r)].get();
    s.launchers.push_back(thread ? make_thread_launcher(*rep.grad_comm)
                                 : make_inline_launcher(*rep.grad_comm));
    rep.launcher = s.launchers.back().get();
    if (s.options.graphs && !rep.backend->native_capture()) {
      // The backend records its ops; the collectives, which its communicators run on the host,
      // are recorded with them.
      s.recorded_comms.push_back(recorded(*rep.comm, *rep.backend));
      rep.comm = s.recorded_comms.back().get();
      s.recorded_launchers.push_back(recorded(*rep.launcher, *rep.backend));
      rep.launcher = s.recorded_launchers.back().get();
    }
    rep.buckets = std::make_unique<GradientBuckets>(*rep.params, options.bucket_bytes,
                                                    options.first_bucket_bytes);
  }
  DP_CHECK(!s.options.graphs || s.world() == 1 || s.comms[0]->kind() != "cuda-same-device",
           std::to_string(k) + " replicas share " +
               (cuda_device_count() == 1 ? "one GPU" : "GPUs") +
               ": they cannot be captured in CUDA graphs (their collectives meet on the host); "
               "set graphs = false, or use one GPU per replica");
  if (options.graphs_auto) s.capture_or_run_eagerly();
}

Trainer::~Trainer() {
  // Captured steps go first: a CUDA graph holds the collectives of communicators that are
  // destroyed before the replicas, and its work must be done before anything it uses goes.
  for (auto& r : impl_->replicas) {
    if (r.backend == nullptr) continue;
    const bool captured =
        !r.train_graphs.empty() || std::any_of(r.evals.begin(), r.evals.end(),
                                               [](const auto& e) { return !e.graphs.empty(); });
    if (captured) {
      try {
        r.backend->synchronize();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "dprun: warning: while the trainer closes: %s\n", e.what());
      }
    }
    r.train_graphs.clear();
    for (auto& e : r.evals) e.graphs.clear();
  }
}

void Trainer::fit(const std::function<bool(const EpochReport&)>& on_epoch, int first_epoch) {
  DP_CHECK(first_epoch >= 1, "fit: epochs are numbered from 1, got " + std::to_string(first_epoch));
  for (int e = first_epoch; e <= impl_->options.epochs; ++e) {
    const EpochReport report = run_epoch(e);
    const bool go_on = on_epoch ? on_epoch(report) : true;
    if (!report.finite || !go_on) break;
  }
}

EpochReport Trainer::run_epoch(int epoch) {
  Impl& s = *impl_;
  DP_CHECK(epoch >= 1, "epochs are numbered from 1, got " + std::to_string(epoch));
  const int64_t count = s.train_meta.count, batch = s.options.batch_size;
  const std::vector<int32_t> perm = [&] {
    Rng rng = Rng(s.options.seed).fork(static_cast<uint64_t>(epoch));
    return permutation(count, rng);
  }();
  // Each example's draw by its position in the epoch's order: the same on every replica.
  const Augmentation& aug = s.options.augment;
  const std::vector<int32_t> draws =
      aug.draws() ? augment_draws(s.options.seed, static_cast<uint64_t>(epoch), 0, count,
                                  aug.crop_padding, aug.flip)
                  : std::vector<int32_t>{};

  std::vector<double> loss(static_cast<size_t>(s.k())), correct(static_cast<size_t>(s.k()));
  // The epoch's steps are numbered from its position, so an epoch computes the same whatever
  // ran before it in this process (a resumed run included).
  const int64_t first = static_cast<int64_t>(epoch - 1) * s.steps_per_epoch;
  const auto t0 = Clock::now();
  s.run_all([&](Impl::Replica& r) {
    Backend& b = *r.backend;
    s.train_pass(r, perm, draws, s.train_units(r, s.steps_per_epoch, batch, count), batch, count,
                 first);
    std::vector<float> l(static_cast<size_t>(s.steps_per_epoch));
    std::vector<int32_t> c(l.size());
    b.download(l.data(), r.loss_slots.data, l.size() * sizeof(float));
    b.download(c.data(), r.correct_slots.data, c.size() * sizeof(int32_t));
    int32_t cursor = 0;
    b.download(&cursor, r.cursor.data, sizeof cursor);
    check_cursor(cursor, s.steps_per_epoch, "training");
    double ls = 0, cs = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      ls += l[i];
      cs += c[i];
    }
    loss[static_cast<size_t>(r.rank)] = ls;
    correct[static_cast<size_t>(r.rank)] = cs;
  });
  s.buffers_differ = true;
  s.steps_done = first + s.steps_per_epoch;
  EpochReport report;
  report.epoch = epoch;
  report.lr = s.lr_at(s.steps_done - 1);
  report.seconds = seconds_since(t0);
  report.train_examples = count;
  report.test_examples = s.eval_meta[0].count;
  // This process's replicas, then every process's (in process order: the same bits everywhere).
  double totals[2] = {std::accumulate(loss.begin(), loss.end(), 0.0),
                      std::accumulate(correct.begin(), correct.end(), 0.0)};
  s.group->allreduce_sum(totals, 2);
  const double total_loss = totals[0], total_correct = totals[1];
  report.train_loss = total_loss / static_cast<double>(count);
  report.train_acc = total_correct / static_cast<double>(count);
  report.finite = std::isfinite(report.train_loss);
  report.examples_per_second =
      report.seconds > 0 ? static_cast<double>(count) / report.seconds : 0.0;
  const auto t1 = Clock::now();
  const std::vector<Impl::EvalResult> evals = s.evaluate_all();
  report.test_acc = evals[0].acc;
  report.test_loss = evals[0].loss;
  if (evals.size() > 1) {
    report.val_acc = evals[1].acc;
    report.val_loss = evals[1].loss;
    report.val_examples = s.eval_meta[1].count;
  }
  report.eval_seconds = seconds_since(t1);
  return report;
}

double Trainer::step(const std::vector<int32_t>& indices) {
  Impl& s = *impl_;
  const auto n = static_cast<int64_t>(indices.size());
  const int k = s.world();
  shard_sizes(n, k);  // checks n >= k
  DP_CHECK(n <= s.train_meta.count && ceil_div(n, k) <= s.max_shard,
           "step(): a batch of " + std::to_string(n) +
               " examples does not fit the trainer, set "
               "up for global batches of at most " +
               std::to_string(s.max_shard * k));
  for (int32_t i : indices)
    DP_CHECK(i >= 0 && i < s.train_meta.count, "step(): example index " + std::to_string(i) +
                                                   " is outside the training set of " +
                                                   std::to_string(s.train_meta.count));
  // step()'s draws have streams of their own, by step: never an epoch's.
  const Augmentation& aug = s.options.augment;
  const std::vector<int32_t> draws =
      aug.draws()
          ? augment_draws(s.options.seed, (uint64_t{1} << 63) | static_cast<uint64_t>(s.steps_done),
                          0, n, aug.crop_padding, aug.flip)
          : std::vector<int32_t>{};
  std::vector<float> loss(static_cast<size_t>(s.k()));
  s.run_all([&](Impl::Replica& r) {
    s.train_pass(r, indices, draws, s.train_units(r, 1, n, n), n, n, s.steps_done);
    r.backend->download(&loss[static_cast<size_t>(r.rank)], r.loss_slots.data, sizeof(float));
  });
  s.buffers_differ = true;
  ++s.steps_done;
  double total = 0;
  for (float l : loss) total += l;
  s.group->allreduce_sum(&total, 1);
  return total / static_cast<double>(n);
}

double Trainer::evaluate() { return impl_->evaluate_all()[0].acc; }

int Trainer::replicas() const { return impl_->k(); }

int Trainer::world_replicas() const { return impl_->world(); }

const TrainerOptions& Trainer::options() const { return impl_->options; }

namespace {
template <class Replicas>
auto& replica_at(Replicas& replicas, int r) {
  DP_CHECK(r >= 0 && static_cast<size_t>(r) < replicas.size(),
           "replica " + std::to_string(r) + " does not exist (the trainer has " +
               std::to_string(replicas.size()) + ")");
  return replicas[static_cast<size_t>(r)];
}
}  // namespace

std::vector<float> Trainer::parameters(int replica) const {
  const ParamRegistry& r = *replica_at(impl_->replicas, replica).params;
  return r.params_in_reading_order(r.download_params());
}

std::vector<float> Trainer::buffers(int replica) const {
  return replica_at(impl_->replicas, replica).params->download_buffers();
}

void Trainer::set_parameters(const std::vector<float>& flat) {
  // One model, built k times: the same size and orders on every replica.
  const ParamRegistry& reg = *impl_->replicas[0].params;
  DP_CHECK(flat.size() == reg.parameter_floats(),
           "set_parameters: got " + std::to_string(flat.size()) + " floats, the model has " +
               std::to_string(reg.parameter_floats()) + " (padding included)");
  const std::vector<float> stored = reg.params_in_memory_order(flat);
  for (auto& r : impl_->replicas) r.params->upload_params(stored);
}

const ParamRegistry& Trainer::registry(int replica) const {
  return *replica_at(impl_->replicas, replica).params;
}

Module& Trainer::model(int replica) { return *replica_at(impl_->replicas, replica).model; }

std::string Trainer::backend_name() const { return impl_->replicas[0].backend->name(); }

std::string Trainer::devices() const {
  // Identical devices are grouped: "NVIDIA H100 80GB HBM3 x2", in rank order of first use.
  std::vector<std::pair<std::string, int>> groups;
  for (const auto& r : impl_->replicas) {
    const std::string d = r.backend->device_description();
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == d; });
    if (it == groups.end()) {
      groups.emplace_back(d, 1);
    } else {
      ++it->second;
    }
  }
  std::string out;
  for (const auto& [d, n] : groups) {
    if (!out.empty()) out += ", ";
    out += d + " x" + std::to_string(n);
  }
  return out;
}

std::string Trainer::communicator_kind() const { return impl_->comms[0]->kind(); }

size_t Trainer::captured_steps() const {
  const auto& r = impl_->replicas[0];
  // Sizes whose capture "auto" found refused hold no graph.
  const auto live = [](const auto& graphs) {
    return static_cast<size_t>(std::count_if(graphs.begin(), graphs.end(),
                                             [](const auto& g) { return g.second != nullptr; }));
  };
  size_t n = live(r.train_graphs);
  for (const auto& e : r.evals) n += live(e.graphs);
  return n;
}

const DataResidence& Trainer::data_residence() const { return impl_->residence; }

Arena::PlanStats Trainer::memory_plan_stats() const {
  return impl_->replicas[0].arena->plan_stats();
}

size_t Trainer::arena_bytes() const { return impl_->replicas[0].arena->bytes_used(); }

size_t Trainer::peak_memory_bytes() const {
  size_t peak = 0;
  for (const auto& r : impl_->replicas) peak = std::max(peak, r.backend->peak_memory());
  return peak;
}

}  // namespace dp
