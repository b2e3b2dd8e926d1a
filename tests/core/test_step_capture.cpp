// Replayable steps on the CPU: the ops that read their per-step values at a cursor (StepRow,
// slots), the backend's capture and replay, and the trainer with graphs on, which must compute
// the same bits as the trainer running every op (CUDA graphs' bookkeeping, proven without a GPU:
// a step that took anything that changes between steps from the host would replay it stale).
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "dp/error.hpp"
#include "dp/layers.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/backend_cases.hpp"
#include "support/check.hpp"
#include "support/host_needing_net.hpp"
#include "support/step_cases.hpp"

namespace {

using dptest::DeviceBuffer;
using dptest::error_of;

std::unique_ptr<dp::Backend> cpu_backend() {
  dp::BackendOptions o;
  o.cpu_threads = 2;
  return dp::create_backend(o);
}

void check_same(const std::vector<dptest::SamePair>& pairs) {
  for (const auto& p : pairs) {
    INFO(p.what);
    CHECK(p.got == p.expected);
  }
}

}  // namespace

TEST_CASE("Ops reading a step's values at a cursor equal their host-valued twins",
          "[capture][ops]") {
  auto b = cpu_backend();
  check_same(dptest::step_row_pairs(*b));
}

TEST_CASE("A captured step replayed k times computes the k steps it stands for", "[capture][ops]") {
  auto b = cpu_backend();
  size_t ops = 0;
  check_same(dptest::capture_pairs(*b, 5, &ops));
  CHECK(ops == 4);  // gather, loss, update, advance: recorded once, not run at capture
}

TEST_CASE("A cursor outside its table is refused when the op runs", "[capture][ops]") {
  auto b = cpu_backend();
  DeviceBuffer cursor(*b, {1}, dp::DType::i32), table(*b, {2, 1});
  cursor.upload(std::vector<int32_t>{2});
  table.upload(std::vector<float>{0.1f, 0.2f});
  DeviceBuffer p(*b, {4}), g(*b, {4});
  p.upload(std::vector<float>(4, 1.0f));
  g.upload(std::vector<float>(4, 1.0f));
  const dp::StepRow row{table.tensor(), cursor.tensor()};
  const std::string e =
      error_of([&] { b->sgd_update(p.tensor(), g.tensor(), nullptr, {0.0f}, &row); });
  CHECK_THAT(e, Catch::Contains("cpu backend: sgd_update: the lr_row cursor is 2, outside its "
                                "table of 2 rows"));
  CHECK(p.download_f32() == std::vector<float>(4, 1.0f));  // nothing was written
}

TEST_CASE("StepRow and slot arguments are checked like every other argument", "[capture][ops]") {
  auto b = cpu_backend();
  DeviceBuffer cursor(*b, {1}, dp::DType::i32), wide(*b, {3, 2}), p(*b, {4}), g(*b, {4});
  DeviceBuffer long_cursor(*b, {2}, dp::DType::i32);
  const dp::StepRow wide_row{wide.tensor(), cursor.tensor()};
  CHECK_THAT(
      error_of([&] { b->sgd_update(p.tensor(), g.tensor(), nullptr, {0.0f}, &wide_row); }),
      Catch::Contains("sgd_update: lr_row table has shape (3, 2), expected (steps >= 1, 1)"));
  const dp::StepRow adam_row{wide.tensor(), cursor.tensor()};
  CHECK_THAT(error_of([&] {
               b->adamw_update(p.tensor(), g.tensor(), p.tensor(), p.tensor(), {}, &adam_row);
             }),
             Catch::Contains("step_row table has shape (3, 2), expected (steps >= 1, 3)"));
  CHECK_THAT(error_of([&] { b->advance(long_cursor.tensor()); }),
             Catch::Contains("advance: cursor has shape (2), expected (1)"));
  DeviceBuffer logits(*b, {2, 3}), labels(*b, {2}, dp::DType::i32), d(*b, {2, 3});
  DeviceBuffer loss(*b, {3}), correct(*b, {4}, dp::DType::i32);
  CHECK_THAT(error_of([&] {
               b->softmax_cross_entropy(logits.tensor(), labels.tensor(), 1.0f, d.tensor(),
                                        loss.tensor(), correct.tensor(), cursor.ptr());
             }),
             Catch::Contains("loss_sum has shape (3), expected (4)"));
  DeviceBuffer images(*b, {5, 1, 2, 2}, dp::DType::u8), lab(*b, {5}, dp::DType::u8);
  DeviceBuffer index(*b, {3}, dp::DType::i32), starts(*b, {2, 1}, dp::DType::i32);
  DeviceBuffer x(*b, {4, 1, 2, 2}), y(*b, {4}, dp::DType::i32);
  const dp::StepRow start{starts.tensor(), cursor.tensor()};
  CHECK_THAT(error_of([&] {
               b->gather_batch(images.tensor(), lab.tensor(), index.tensor(), x.tensor(),
                               y.tensor(), &start);
             }),
             Catch::Contains("the index buffer holds 3 entries"));
}

TEST_CASE("While a step is captured what needs the host is refused and discard recovers",
          "[capture]") {
  auto b = cpu_backend();
  DeviceBuffer t(*b, {4});
  std::vector<float> host(4, 1.0f);
  b->begin_capture();
  CHECK(b->capturing());
  const auto refused = [](const std::string& e, const char* op) {
    INFO(e);
    CHECK_THAT(e, Catch::Contains(std::string("cpu backend: ") + op +
                                  ": called while a step is being captured"));
  };
  refused(error_of([&] { b->upload(t.tensor().data, host.data(), 16); }), "upload");
  refused(error_of([&] { b->download(host.data(), t.tensor().data, 16); }), "download");
  refused(error_of([&] { b->synchronize(); }), "synchronize");
  refused(error_of([&] { (void)b->allocate(64); }), "allocate");
  refused(error_of([&] { b->prepare_linear(2, 3, 4); }), "prepare_linear");
  refused(error_of([&] { b->prepare_batchnorm({2, 3, 4, 4}, dp::Layout::nhwc); }),
          "prepare_batchnorm");
  refused(error_of([&] {
            dp::ConvGeometry g;
            (void)b->plan_conv(g);
          }),
          "plan_conv");
  refused(error_of([&] { b->begin_capture(); }), "begin_capture");
  // Ops are recorded, not run.
  b->fill(t.tensor(), 5.0f);
  b->discard_capture();
  CHECK_FALSE(b->capturing());
  CHECK(t.download_f32() == std::vector<float>(4, 0.0f));  // the fill never ran
  CHECK_THAT(error_of([&] { (void)b->end_capture(); }), Catch::Contains("no capture was begun"));

  // A recording replays on its own backend only.
  b->begin_capture();
  b->fill(t.tensor(), 5.0f);
  const auto recording = b->end_capture();
  auto other = cpu_backend();
  CHECK_THAT(error_of([&] { other->replay(*recording); }),
             Catch::Contains("the step was captured by another backend"));
  b->replay(*recording);
  CHECK(t.download_f32() == std::vector<float>(4, 5.0f));
}

TEST_CASE("Host work is recorded in op order and runs at every replay", "[capture]") {
  auto b = cpu_backend();
  DeviceBuffer t(*b, {1});
  std::vector<float> seen;
  b->begin_capture();
  b->fill(t.tensor(), 2.0f);
  b->host_work([&] { seen.push_back(t.tensor().f32()[0]); });
  b->scale(t.tensor(), 3.0f);
  b->host_work([&] { seen.push_back(t.tensor().f32()[0]); });
  const auto recording = b->end_capture();
  CHECK(seen.empty());
  CHECK(recording->ops() == 4);
  b->replay(*recording);
  b->replay(*recording);
  CHECK(seen == std::vector<float>{2.0f, 6.0f, 2.0f, 6.0f});
  b->host_work([&] { seen.push_back(-1.0f); });  // not capturing: runs at once
  CHECK(seen.back() == -1.0f);
}

namespace {

struct Run {
  std::vector<dp::EpochReport> reports;
  std::vector<float> params, buffers;
  double step_loss = 0;
  size_t captured = 0;  // after fit, and after step() too
};

Run train(dp::TrainerOptions o, const dp::ModelBuilder& builder, const dp::Dataset& train_set,
          const dp::Dataset& test_set) {
  dp::Trainer t(o, builder, train_set, test_set);
  Run r;
  t.fit([&](const dp::EpochReport& e) {
    r.reports.push_back(e);
    return true;
  });
  r.captured = t.captured_steps();
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < o.batch_size; ++i) idx.push_back(static_cast<int32_t>((i * 7) % 50));
  r.step_loss = t.step(idx);
  CHECK(t.captured_steps() == r.captured);  // a full batch: the epochs' capture replays
  r.params = t.parameters(0);
  r.buffers = t.buffers(0);
  for (int k = 1; k < t.replicas(); ++k) CHECK(t.parameters(k) == r.params);
  return r;
}

void check_same_run(const Run& graphs, const Run& eager) {
  REQUIRE(graphs.reports.size() == eager.reports.size());
  for (size_t e = 0; e < eager.reports.size(); ++e) {
    INFO("epoch " << e + 1);
    CHECK(graphs.reports[e].train_loss == eager.reports[e].train_loss);
    CHECK(graphs.reports[e].train_acc == eager.reports[e].train_acc);
    CHECK(graphs.reports[e].test_acc == eager.reports[e].test_acc);
    CHECK(graphs.reports[e].lr == eager.reports[e].lr);
  }
  CHECK(graphs.step_loss == eager.step_loss);
  CHECK(graphs.params == eager.params);
  CHECK(graphs.buffers == eager.buffers);
}

}  // namespace

TEST_CASE("Trainer with graphs computes the same bits as running every op", "[capture][trainer]") {
  const auto train_set = enginetest::synthetic_dataset(300, 21);
  const auto test_set = enginetest::synthetic_dataset(101, 22);
  dp::TrainerOptions o;
  o.replicas = 2;
  o.batch_size = 64;  // 4 full batches and one of 44: two captured step shapes
  o.eval_batch_size = 50;
  o.epochs = 2;
  o.seed = 5;
  o.cpu_threads = 2;
  // Every step's learning rate differs (warm-up, then cosine): a step replayed with the
  // captured step's rate would drift at once.
  o.lr.kind = dp::LrSchedule::Kind::cosine;
  o.lr.base = 0.2;
  o.lr.warmup_epochs = 0.5;
  SECTION("sgd with Nesterov momentum, per-replica batch norm, several gradient buckets") {
    o.optimizer.momentum = 0.9f;
    o.optimizer.nesterov = true;
    o.optimizer.weight_decay = 1e-3f;
    o.bucket_bytes = 4096;
    o.first_bucket_bytes = 1024;
  }
  // Captures per batch size (full, last), plus replica 0's evaluation chunks: 101 examples over
  // 2 replicas in chunks of 25 give 51 = 25 + 25 + 1, over 3 in chunks of 17: 34 = 17 + 17.
  size_t captures = 4;
  SECTION("sgd, per-replica batch norm, a last batch that leaves one replica nothing") {
    o.replicas = 3;
    o.batch_size = 149;  // 300 = 2 x 149 + 2: the last batch's third shard is empty
    o.optimizer.momentum = 0.9f;
    captures = 3;
  }
  SECTION("adamw, synchronised batch norm, NHWC, a last batch with an empty shard") {
    o.replicas = 3;
    o.batch_size = 149;  // 300 = 2 x 149 + 2: the last batch leaves one replica nothing
    o.optimizer.name = "adamw";
    o.optimizer.weight_decay = 0.05f;
    o.lr.base = 2e-3;
    o.sync_bn = true;
    o.layout = dp::Layout::nhwc;
    captures = 3;
  }
  o.graphs = false;
  const Run eager = train(o, enginetest::small_bn_net, train_set, test_set);
  o.graphs = true;
  const Run graphs = train(o, enginetest::small_bn_net, train_set, test_set);
  check_same_run(graphs, eager);
  CHECK(eager.captured == 0);
  CHECK(graphs.captured == captures);  // once per batch size, then replayed
  CHECK(eager.reports.back().train_loss < eager.reports.front().train_loss);
}

TEST_CASE("A model whose step needs the host fails with graphs, naming what it did",
          "[capture][trainer]") {
  const auto data = enginetest::synthetic_dataset(64, 23);
  dp::TrainerOptions o;
  o.batch_size = 32;
  o.epochs = 1;
  o.cpu_threads = 2;
  const auto builder = [] { return dptest::host_needing_net(dptest::PeekIn::forward); };
  o.graphs = false;
  dp::Trainer fine(o, builder, data, data.head(0));
  CHECK(std::isfinite(fine.run_epoch(1).train_loss));
  o.graphs = true;
  dp::Trainer t(o, builder, data, data.head(0));
  CHECK_THAT(error_of([&] { (void)t.run_epoch(1); }),
             Catch::Contains("download: called while a step is being captured"));
}

TEST_CASE("graphs auto stays off on the CPU backend, which then runs every op as it always did",
          "[capture][trainer]") {
  // The CUDA side (on with a GPU per replica, off where replicas share one) is run by ctest
  // emulated_gpu_runner through the runner.
  const auto data = enginetest::synthetic_dataset(64, 23);
  dp::TrainerOptions o;
  o.batch_size = 32;
  o.epochs = 1;
  o.cpu_threads = 2;
  o.graphs_auto = true;
  const auto builder = [] { return dptest::host_needing_net(dptest::PeekIn::forward); };
  for (const int replicas : {1, 2}) {
    o.replicas = replicas;
    dp::Trainer t(o, builder, data, data.head(0));
    CHECK_FALSE(t.options().graphs);
    CHECK(std::isfinite(t.run_epoch(1).train_loss));
  }
}
