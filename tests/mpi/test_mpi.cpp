// A trial's ranks as processes (ctest runs this under `mpirun -np 2` and `-np 3`): the MPI
// process group's fixed-order sums, and the data-parallel identity across processes: P
// processes x k local replicas compute the step of one replica on the whole batch, and an epoch
// of P processes equals an epoch of P replicas in one process.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../core/engine_test_util.hpp"
#include "dp/layers.hpp"
#include "dp/trainer.hpp"
#include "mpi_test_util.hpp"
#include "support/check.hpp"

namespace {

using enginetest::norm_relative_error;

using enginetest::small_bn_net;

// A value whose sum depends on the order it is added in (large and small magnitudes mixed).
float term(int process, size_t i) {
  const float big = (i % 3 == 0) ? 1e7f : 1.0f;
  return (process % 2 == 0 ? big : -big * 0.999f) +
         0.1f * static_cast<float>((i * 7 + process) % 13);
}

/// Every process's copy of `v` is bit-identical to process 0's.
bool same_everywhere(const std::vector<float>& v) {
  auto& g = mpitest::group();
  std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  g.broadcast(bytes, 0);
  double differs = std::memcmp(bytes.data(), v.data(), bytes.size()) != 0 ? 1 : 0;
  g.allreduce_sum(&differs, 1);
  return differs == 0;
}

dp::TrainerOptions cpu_options(int replicas, int64_t batch, dp::ProcessGroup* processes) {
  dp::TrainerOptions o;
  o.replicas = replicas;
  o.processes = processes;
  o.batch_size = batch;
  o.lr.base = 0.2f;
  o.optimizer.momentum = 0.9f;
  o.optimizer.weight_decay = 5e-3f;
  o.seed = 23;
  o.cpu_threads = replicas;  // one thread per replica: up to 3 processes share 2 cores in CI
  o.epochs = 1;
  return o;
}

std::vector<float> train_steps(const dp::TrainerOptions& o, const dp::ModelBuilder& builder,
                               const dp::Dataset& data, int steps, std::vector<double>& losses) {
  dp::Trainer t(o, builder, data, data.head(0));
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> idx(static_cast<size_t>(o.batch_size));
    for (size_t i = 0; i < idx.size(); ++i) {
      idx[i] = static_cast<int32_t>(
          (static_cast<int64_t>(s) * o.batch_size + static_cast<int64_t>(i) * 3) % data.count);
    }
    losses.push_back(t.step(idx));
  }
  const auto p = t.parameters(0);
  for (int r = 1; r < t.replicas(); ++r) CHECK(t.parameters(r) == p);
  return p;
}

}  // namespace

TEST_CASE("MPI process group: sums in process order, the same bits everywhere", "[mpi]") {
  auto& g = mpitest::group();
  REQUIRE(g.size() >= 2);
  CHECK(g.kind() == "mpi");
  CHECK(!g.host().empty());
  CHECK(g.local_size() >= 1);
  for (const size_t count : {size_t{1}, size_t{15}, size_t{1001}, size_t{40000}}) {
    INFO(count << " floats over " << g.size() << " processes");
    std::vector<float> v(count), expected(count);
    for (size_t i = 0; i < count; ++i) {
      v[i] = term(g.rank(), i);
      float s = term(0, i);
      for (int p = 1; p < g.size(); ++p) s += term(p, i);
      expected[i] = s;
    }
    g.allreduce_sum(v.data(), v.size());
    CHECK(std::memcmp(v.data(), expected.data(), count * sizeof(float)) == 0);
    CHECK(same_everywhere(v));
  }
  std::vector<double> d{1.0 * g.rank(), 0.5, -2.0};
  g.allreduce_sum(d.data(), d.size());
  CHECK(d[0] == g.size() * (g.size() - 1) / 2.0);
  CHECK(d[1] == 0.5 * g.size());
  std::string message = g.rank() == 1 ? "from process 1" : "";
  g.broadcast(message, 1);
  CHECK(message == "from process 1");
  g.barrier();
}

TEST_CASE("Data-parallel identity across processes: P x k replicas equal one replica",
          "[mpi][trainer]") {
  auto& g = mpitest::group();
  bool real = false;
  const auto data = enginetest::training_data(400, 3, &real);
  INFO((real ? "Fashion-MNIST" : "synthetic data"));
  const auto builder = [] {
    return enginetest::build_model("libdprun_lenet.so", "lenet", {{"init_std", 0.1}});
  };
  // 61 examples: divisible by no replica count here, so shards differ by one example.
  const int64_t batch = 61;
  std::vector<double> l1;
  const auto p1 = train_steps(cpu_options(1, batch, nullptr), builder, data, 3, l1);
  for (const int local : {1, 2}) {
    INFO(g.size() << " processes x " << local << " local replicas");
    std::vector<double> lk;
    const auto pk = train_steps(cpu_options(local, batch, &g), builder, data, 3, lk);
    // As the in-process identity test: only the gradients' summation order differs.
    CHECK(norm_relative_error(pk, p1) <= 1e-5);
    const auto c = dptest::compare(pk, p1, 1e-4, 0.0, 1e-2);
    INFO("parameters: " << c.message);
    CHECK(c.ok);
    for (size_t s = 0; s < l1.size(); ++s) CHECK(lk[s] == Approx(l1[s]).epsilon(1e-5));
    CHECK(same_everywhere(pk));
  }
}

TEST_CASE("An epoch across processes equals the same replicas in one process", "[mpi][trainer]") {
  auto& g = mpitest::group();
  bool real = false;
  const auto all = enginetest::training_data(300, 9, &real);
  const auto train = all.head(256), test = all.head(100);
  // Batch 50: the epoch ends with a partial batch of 6, and evaluation chunks are uneven.
  auto o = cpu_options(1, 50, &g);
  o.optimizer.momentum = 0.0f;
  o.optimizer.weight_decay = 0.0f;
  o.eval_batch_size = 32;
  dp::Trainer across(o, small_bn_net, train, test);
  CHECK(across.world_replicas() == g.size());
  const dp::EpochReport a = across.run_epoch(1);
  auto inprocess = o;
  inprocess.processes = nullptr;
  inprocess.replicas = g.size();
  inprocess.cpu_threads = g.size();
  dp::Trainer here(inprocess, small_bn_net, train, test);
  const dp::EpochReport b = here.run_epoch(1);
  CHECK(a.train_examples == b.train_examples);
  CHECK(a.train_loss == Approx(b.train_loss).epsilon(1e-5));
  CHECK(a.train_acc == Approx(b.train_acc).margin(1.0 / 256));
  CHECK(a.test_acc == Approx(b.test_acc).margin(1.0 / 100));
  // Per-replica BN statistics, averaged over every replica of the trial before evaluation.
  CHECK(norm_relative_error(across.buffers(0), here.buffers(0)) <= 1e-5);
  CHECK(norm_relative_error(across.parameters(0), here.parameters(0)) <= 1e-5);
  CHECK(same_everywhere(across.parameters(0)));
}

TEST_CASE("Synchronised batch norm across processes: P x k replicas equal one replica",
          "[mpi][trainer]") {
  auto& g = mpitest::group();
  bool real = false;
  const auto data = enginetest::training_data(131, 4, &real);
  // Batch 64: the epoch's last step has 3 examples, so with 2 x 2 replicas one shard is empty.
  auto one = cpu_options(1, 64, nullptr);
  one.average_bn_buffers = false;
  dp::Trainer reference(one, small_bn_net, data, data.head(0));
  reference.run_epoch(1);
  const auto p1 = reference.parameters(0), b1 = reference.buffers(0);
  for (const int local : {1, 2}) {
    INFO(g.size() << " processes x " << local << " local replicas");
    auto o = cpu_options(local, 64, &g);
    o.sync_bn = true;
    o.average_bn_buffers = false;
    dp::Trainer t(o, small_bn_net, data, data.head(0));
    t.run_epoch(1);
    CHECK(norm_relative_error(t.parameters(0), p1) <= 1e-5);
    CHECK(norm_relative_error(t.buffers(0), b1) <= 1e-5);
    CHECK(same_everywhere(t.parameters(0)));
    CHECK(same_everywhere(t.buffers(0)));
  }
}

TEST_CASE("Bucketed sums across processes give exactly the unbucketed parameters",
          "[mpi][trainer]") {
  // Buckets summed by communication threads (each process's first replica talks MPI on its own
  // duplicated communicator) while the replica threads run synchronised BN's collectives.
  auto& g = mpitest::group();
  if (!g.concurrent_collectives()) {
    WARN(
        "this MPI library does not allow concurrent collectives (MPI_THREAD_MULTIPLE): with "
        "synchronised BN the buckets are summed inline, not by communication threads");
  }
  bool real = false;
  const auto data = enginetest::training_data(131, 8, &real);
  for (const bool sync : {false, true}) {
    INFO((sync ? "synchronised BN" : "per-replica BN"));
    auto run = [&](size_t bucket_bytes) {
      auto o = cpu_options(2, 64, &g);
      o.sync_bn = sync;
      o.bucket_bytes = bucket_bytes;
      o.first_bucket_bytes = bucket_bytes / 4;
      dp::Trainer t(o, small_bn_net, data, data.head(0));
      t.run_epoch(1);
      return t.parameters(0);
    };
    const auto whole = run(0);
    CHECK(run(1024) == whole);
    CHECK(same_everywhere(whole));
  }
}
