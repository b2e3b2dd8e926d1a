// The trainer's data paths. On the device path every set is uploaded once to each replica and a
// step reads its shard at a row of the epoch's permutation. When the sets do not fit
// options.data_budget they stay on the host and each pass (an epoch, a step(), an evaluation)
// streams the examples its steps read, in the order they read them, into a ring of two slots on
// the device: chunk c (consecutive steps that fit a slot) goes to slot c % 2, uploaded from
// staging memory while the device computes chunk c - 1, after the steps of chunk c - 2 that
// last read that slot. A step's row in the step table then points into the ring, so the step is
// the same ops either way (captured steps replay on both paths), and reads the same bytes and
// draws in the same order: the same bits.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "dp/augment.hpp"
#include "dp/error.hpp"
#include "trainer_impl.hpp"

namespace dp {

namespace {

// The most steps one streamed chunk holds (a ring slot: at most this many of the replica's
// largest batches).
constexpr int64_t kChunkSteps = 16;

int64_t shard_offset(int64_t n, int64_t k, int64_t g) {
  return g * (n / k) + std::min<int64_t>(g, n % k);
}

Tensor upload_bytes(Backend& b, Arena& arena, const std::vector<uint8_t>& bytes, Shape shape) {
  Tensor t = arena.allocate(shape, DType::u8);
  DP_ASSERT(t.bytes() == bytes.size());
  if (!bytes.empty()) b.upload(t.data, bytes.data(), bytes.size());
  return t;
}

void upload_i32(Backend& b, const Tensor& t, const std::vector<int32_t>& values) {
  DP_ASSERT(static_cast<int64_t>(values.size()) <= t.numel());
  if (!values.empty()) b.upload(t.data, values.data(), values.size() * sizeof(int32_t));
}

}  // namespace

void Trainer::Impl::plan_residence(const Dataset& train, const std::vector<const Dataset*>& evals) {
  const auto example = static_cast<size_t>(train.example_bytes());
  const bool draws = options.augment.draws();
  // Per example on the device: image, label, index entry (and the training set's draw).
  size_t bytes = static_cast<size_t>(train.count) * (example + 1 + 4 + (draws ? 4 : 0));
  for (const Dataset* d : evals) bytes += static_cast<size_t>(d->count) * (example + 1 + 4);
  residence.resident_bytes = bytes;
  residence.path = "device";
  residence.device_bytes = bytes;
  if (options.data_budget == 0 || bytes <= options.data_budget) return;
  // A ring row: image, label, index entry, draw. Two slots, each at least the largest shard.
  const size_t row = example + 1 + 4 + 4;
  const auto fit = static_cast<int64_t>(options.data_budget / (2 * row));
  residence.path = "streamed";
  // A chunk of at most kChunkSteps steps, whatever the budget: the page-locked staging is a
  // slot's size per replica, and each pass waits for its first two chunks before it starts.
  residence.chunk_examples = std::max(max_shard, std::min(fit, kChunkSteps * max_shard));
  residence.device_bytes = 2 * static_cast<size_t>(residence.chunk_examples) * row;
  host_sets.push_back(train);
  for (const Dataset* d : evals) host_sets.push_back(*d);
}

void Trainer::Impl::setup_data(Replica& r, const Dataset& train,
                               const std::vector<const Dataset*>& evals) {
  Backend& b = *r.backend;
  Arena& a = *r.arena;
  const Shape img{train.channels, train.height, train.width};
  const Augmentation& aug = options.augment;
  if (!streamed()) {
    r.train_images = upload_bytes(b, a, train.images, {train.count, img[0], img[1], img[2]});
    r.train_labels = upload_bytes(b, a, train.labels, {train.count});
    r.train_index = a.allocate({train.count}, DType::i32);
    if (aug.draws()) r.train_draws = a.allocate({train.count}, DType::i32);
  } else {
    const int64_t rows = 2 * residence.chunk_examples;
    r.stream.slot_rows = residence.chunk_examples;
    r.train_images = a.allocate({rows, img[0], img[1], img[2]}, DType::u8);
    r.train_labels = a.allocate({rows}, DType::u8);
    r.train_index = a.allocate({rows}, DType::i32);
    r.train_draws = a.allocate({rows}, DType::i32);
    std::vector<int32_t> identity(static_cast<size_t>(rows));
    std::iota(identity.begin(), identity.end(), 0);
    upload_i32(b, r.train_index, identity);
    const size_t bytes =
        static_cast<size_t>(r.stream.slot_rows) * (static_cast<size_t>(train.example_bytes()) + 5);
    Backend* owner = &b;
    for (int s = 0; s < 2; ++s)
      r.stream.staging.emplace_back(b.allocate_host(bytes),
                                    [owner](void* p) { owner->release_host(p); });
  }
  if (aug.draws() || !aug.mean.empty()) {
    r.train_transform = std::make_unique<GatherTransform>(GatherTransform{
        aug.crop_padding, aug.draws() ? &r.train_draws : nullptr, aug.mean, aug.std});
  }
  if (!aug.mean.empty())
    r.eval_transform =
        std::make_unique<GatherTransform>(GatherTransform{0, nullptr, aug.mean, aug.std});
  r.evals.resize(evals.size());
  for (size_t e = 0; e < evals.size(); ++e) {
    const Dataset& set = *evals[e];
    Replica::Eval& ev = r.evals[e];
    const int64_t steps = std::max<int64_t>(eval_steps[e], 1);
    ev.start = a.allocate({steps, 1}, DType::i32);
    ev.loss_slots = a.allocate({steps}, DType::f32);
    ev.correct_slots = a.allocate({steps}, DType::i32);
    if (set.count == 0) continue;
    const std::vector<Unit> units = eval_units(r, e);
    std::vector<int32_t> starts;
    if (streamed()) {
      // Every evaluation streams the set in the same chunks: the ring rows never change.
      ev.images = r.train_images;
      ev.labels = r.train_labels;
      ev.index = r.train_index;
      for (int64_t row : plan_stream(units, r.stream.slot_rows).rows)
        starts.push_back(static_cast<int32_t>(row));
    } else {
      ev.images = upload_bytes(b, a, set.images, {set.count, img[0], img[1], img[2]});
      ev.labels = upload_bytes(b, a, set.labels, {set.count});
      ev.index = a.allocate({set.count}, DType::i32);
      std::vector<int32_t> identity(static_cast<size_t>(set.count));
      std::iota(identity.begin(), identity.end(), 0);
      upload_i32(b, ev.index, identity);
      for (const Unit& u : units) starts.push_back(static_cast<int32_t>(u.begin));
    }
    upload_i32(b, ev.start, starts);
  }
}

std::vector<Trainer::Impl::Unit> Trainer::Impl::train_units(const Replica& r, int64_t steps,
                                                            int64_t batch, int64_t count) const {
  std::vector<Unit> units(static_cast<size_t>(steps));
  const int64_t k = world(), g = r.global_rank;
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t begin = t * batch, n = std::min(batch, count - begin);
    units[static_cast<size_t>(t)] = {begin + shard_offset(n, k, g), n / k + (g < n % k ? 1 : 0)};
  }
  return units;
}

std::vector<Trainer::Impl::Unit> Trainer::Impl::eval_units(const Replica& r, size_t set) const {
  // Evaluation reads this replica's part of the set in chunks: the same every time.
  const std::vector<int64_t> parts = split(eval_meta[set].count, world());
  int64_t begin = 0;
  for (int q = 0; q < r.global_rank; ++q) begin += parts[static_cast<size_t>(q)];
  const int64_t part = parts[static_cast<size_t>(r.global_rank)];
  const int64_t chunk = ceil_div(eval_batch, world());
  std::vector<Unit> units;
  for (int64_t i = 0; i < part; i += chunk) units.push_back({begin + i, std::min(chunk, part - i)});
  return units;
}

void Trainer::Impl::upload_steps(Replica& r, const std::vector<int64_t>& starts, int64_t first) {
  // The whole block in one upload (one wait for the device, which step() pays every step):
  // the cursor at 0, then the rows of the steps (the rest of the tables is not read).
  const int64_t width = r.step_scalars.shape[1];
  const auto steps = static_cast<int64_t>(starts.size());
  DP_ASSERT(steps <= steps_per_epoch);
  std::vector<int32_t> start(static_cast<size_t>(1 + steps_per_epoch), 0);
  std::vector<float> scalars(static_cast<size_t>(steps_per_epoch * width), 0.0f);
  for (int64_t t = 0; t < steps; ++t) {
    start[static_cast<size_t>(1 + t)] = static_cast<int32_t>(starts[static_cast<size_t>(t)]);
    r.optimizer->fill_step_scalars(lr_at(first + t), first + t + 1,
                                   &scalars[static_cast<size_t>(t * width)]);
  }
  std::vector<uint8_t> bytes(r.step_block.bytes());
  std::memcpy(bytes.data(), start.data(), start.size() * sizeof(int32_t));
  std::memcpy(bytes.data() + start.size() * sizeof(int32_t), scalars.data(),
              scalars.size() * sizeof(float));
  r.backend->upload(r.step_block.data, bytes.data(), bytes.size());
}

void Trainer::Impl::train_pass(Replica& r, const std::vector<int32_t>& order,
                               const std::vector<int32_t>& draws, const std::vector<Unit>& units,
                               int64_t batch, int64_t count, int64_t first) {
  Backend& b = *r.backend;
  auto global_batch = [&](size_t t) {
    return std::min(batch, count - static_cast<int64_t>(t) * batch);
  };
  if (!streamed()) {
    upload_i32(b, r.train_index, order);
    if (r.train_draws.data != nullptr) upload_i32(b, r.train_draws, draws);
    std::vector<int64_t> starts;
    for (const Unit& u : units) starts.push_back(u.begin);
    upload_steps(r, starts, first);
    for (size_t t = 0; t < units.size(); ++t) train_step(r, global_batch(t));
    return;
  }
  const StreamPlan plan = plan_stream(units, r.stream.slot_rows);
  upload_steps(r, plan.rows, first);
  stream_pass(r, plan, units, 0, order.data(), draws.empty() ? nullptr : draws.data(),
              [&](size_t t) { train_step(r, global_batch(t)); });
}

int64_t Trainer::Impl::eval_pass(Replica& r, size_t set) {
  const std::vector<Unit> units = eval_units(r, set);
  auto run = [&](size_t u) { eval_chunk(r, set, units[u].size); };
  if (streamed()) {
    stream_pass(r, plan_stream(units, r.stream.slot_rows), units, 1 + set, nullptr, nullptr, run);
  } else {
    for (size_t u = 0; u < units.size(); ++u) run(u);
  }
  return static_cast<int64_t>(units.size());
}

Trainer::Impl::StreamPlan Trainer::Impl::plan_stream(const std::vector<Unit>& units,
                                                     int64_t slot_rows) const {
  StreamPlan plan;
  int64_t used = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    DP_ASSERT(units[u].size <= slot_rows);
    if (used + units[u].size > slot_rows) {
      plan.chunk_end.push_back(u);
      used = 0;
    }
    const auto slot = static_cast<int64_t>(plan.chunk_end.size() % 2);
    plan.rows.push_back(slot * slot_rows + used);
    used += units[u].size;
  }
  if (!units.empty()) plan.chunk_end.push_back(units.size());
  return plan;
}

void Trainer::Impl::stream_pass(Replica& r, const StreamPlan& plan, const std::vector<Unit>& units,
                                size_t set, const int32_t* order, const int32_t* draws,
                                const std::function<void(size_t)>& run_unit) {
  const size_t chunks = plan.chunk_end.size();
  for (size_t c = 0; c < std::min<size_t>(2, chunks); ++c)
    stage_chunk(r, plan, units, c, set, order, draws);
  size_t u = 0;
  for (size_t c = 0; c < chunks; ++c) {
    // The steps of chunk c wait for its copy; until here it overlapped chunk c - 1's steps.
    r.backend->await_upload(r.stream.tickets[c % 2]);
    for (; u < plan.chunk_end[c]; ++u) run_unit(u);
    // Queued after the steps that read slot c % 2: its copy waits for them, and runs while
    // the device computes chunk c + 1.
    if (c + 2 < chunks) stage_chunk(r, plan, units, c + 2, set, order, draws);
  }
}

void Trainer::Impl::stage_chunk(Replica& r, const StreamPlan& plan, const std::vector<Unit>& units,
                                size_t c, size_t set, const int32_t* order, const int32_t* draws) {
  Backend& b = *r.backend;
  const Dataset& host = host_sets[set];
  const size_t slot = c % 2;
  const auto example = static_cast<size_t>(host.example_bytes());
  const auto slot_rows = static_cast<size_t>(r.stream.slot_rows);
  // The staging buffer is free once the upload that last read it (chunk c - 2's) is done.
  b.wait_upload(r.stream.tickets[slot]);
  // The staging buffer: draws, images, labels (the i32 first, where it is aligned).
  auto* chunk_draws = static_cast<int32_t*>(r.stream.staging[slot].get());
  auto* images = reinterpret_cast<uint8_t*>(chunk_draws + slot_rows);
  uint8_t* labels = images + slot_rows * example;
  size_t rows = 0;
  for (size_t u = c == 0 ? 0 : plan.chunk_end[c - 1]; u < plan.chunk_end[c]; ++u) {
    for (int64_t j = 0; j < units[u].size; ++j, ++rows) {
      const int64_t position = units[u].begin + j;
      const auto e = static_cast<size_t>(order != nullptr ? order[position] : position);
      std::memcpy(images + rows * example, host.images.data() + e * example, example);
      labels[rows] = host.labels[e];
      chunk_draws[rows] = draws != nullptr ? draws[position] : 0;
    }
  }
  const size_t first_row = slot * slot_rows;
  b.upload_async(static_cast<uint8_t*>(r.train_images.data) + first_row * example, images,
                 rows * example);
  b.upload_async(static_cast<uint8_t*>(r.train_labels.data) + first_row, labels, rows);
  r.stream.tickets[slot] =
      b.upload_async(r.train_draws.i32() + first_row, chunk_draws, rows * sizeof(int32_t));
}

}  // namespace dp
