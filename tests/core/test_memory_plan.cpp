// The memory plan: the placement function against its contract (no two buffers alive at once
// share a byte, aligned, within [peak live, sum]), on hand-made and random lifetimes; the walk of
// real models; and training with the plan computes the same bits as without it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>

#include "dp/layers.hpp"
#include "dp/memory_plan.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"

namespace {

size_t aligned(size_t bytes, size_t a) { return (std::max<size_t>(bytes, 1) + a - 1) / a * a; }

// Every property of a plan that plan_memory promises.
void check_plan(const std::vector<dp::BufferLifetime>& buffers, const dp::MemoryPlan& plan,
                size_t alignment) {
  REQUIRE(plan.offsets.size() == buffers.size());
  size_t sum = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    INFO("buffer " << i);
    CHECK(plan.offsets[i] % alignment == 0);
    CHECK(plan.offsets[i] + aligned(buffers[i].bytes, alignment) <= plan.bytes);
    sum += aligned(buffers[i].bytes, alignment);
    for (size_t j = i + 1; j < buffers.size(); ++j) {
      const bool together =
          buffers[i].first <= buffers[j].last && buffers[j].first <= buffers[i].last;
      if (!together) continue;
      const size_t ai = plan.offsets[i], bi = ai + aligned(buffers[i].bytes, alignment);
      const size_t aj = plan.offsets[j], bj = aj + aligned(buffers[j].bytes, alignment);
      INFO("and buffer " << j << " live at the same time");
      CHECK((bi <= aj || bj <= ai));
    }
  }
  CHECK(plan.bytes >= dp::peak_live_bytes(buffers, alignment));
  CHECK(plan.bytes <= sum);
}

}  // namespace

TEST_CASE("plan_memory: a chain of gradients needs two buffers, not one per layer",
          "[memory_plan]") {
  // Layer i writes its input gradient at step i, layer i + 1 reads it at step i + 1.
  std::vector<dp::BufferLifetime> chain;
  for (int64_t i = 0; i < 10; ++i) chain.push_back({1000, i, i + 1});
  const dp::MemoryPlan plan = dp::plan_memory(chain, 256);
  check_plan(chain, plan, 256);
  CHECK(plan.bytes == 2 * 1024);
  CHECK(dp::peak_live_bytes(chain, 256) == 2 * 1024);
  // Alternating places: each buffer reuses the one two before it.
  for (size_t i = 2; i < chain.size(); ++i) CHECK(plan.offsets[i] == plan.offsets[i - 2]);
}

TEST_CASE("plan_memory: small buffers fill the gaps the large ones leave", "[memory_plan]") {
  // A large buffer early, a large one late; two small ones that live across both (so neither
  // can share with a large one) and one small that lives only between them (it may share).
  const std::vector<dp::BufferLifetime> b{
      {4096, 0, 1}, {4096, 3, 4}, {256, 0, 4}, {256, 0, 4}, {1024, 2, 2}};
  const dp::MemoryPlan plan = dp::plan_memory(b, 256);
  check_plan(b, plan, 256);
  CHECK(plan.bytes == 4096 + 512);        // the two large ones share; the middle one too
  CHECK(plan.offsets[0] == plan.offsets[1]);
  CHECK(dp::peak_live_bytes(b, 256) == 4096 + 512);
}

TEST_CASE("plan_memory: random lifetimes, every promise kept, the same plan every time",
          "[memory_plan]") {
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 200; ++round) {
    INFO("round " << round);
    const size_t n = 1 + rng() % 40;
    const size_t alignment = size_t{1} << (rng() % 9);  // 1 .. 256
    std::vector<dp::BufferLifetime> b(n);
    for (auto& x : b) {
      x.bytes = rng() % 5 == 0 ? 0 : 1 + rng() % 100000;
      x.first = static_cast<int64_t>(rng() % 30);
      x.last = x.first + static_cast<int64_t>(rng() % 10);
    }
    const dp::MemoryPlan plan = dp::plan_memory(b, alignment);
    check_plan(b, plan, alignment);
    const dp::MemoryPlan again = dp::plan_memory(b, alignment);
    CHECK(again.offsets == plan.offsets);
    CHECK(again.bytes == plan.bytes);
  }
  CHECK(dp::plan_memory({}, 256).bytes == 0);
}

TEST_CASE("plan_memory: lifetimes that end before they start, and bad alignments, are refused",
          "[memory_plan]") {
  CHECK_THROWS_WITH(dp::plan_memory({{16, 0, 1}, {16, 5, 4}}, 256),
                    Catch::Contains("buffer 1 ends (step 4) before it starts (step 5)"));
  CHECK_THROWS_WITH(dp::plan_memory({{16, 0, 1}}, 48),
                    Catch::Contains("alignment must be a power of two, got 48"));
}

TEST_CASE("The memory plan's walk of a residual block keeps what its shortcut reads alive",
          "[memory_plan]") {
  // The block's backward runs bn2 (writes dx and the masked gradient), conv2, bn1, conv1, then
  // the shortcut conv3, which reads bn2's masked gradient: that buffer must outlive the three
  // steps between, so it may share with none of their input gradients.
  auto backend = dp::create_backend({});
  dp::Arena arena(*backend);
  dp::ParamRegistry registry;
  dp::Residual block(4, 8, true, 2);
  block.declare(registry, "");
  registry.allocate(*backend);
  dp::SetupContext ctx{*backend, arena, registry, dp::Layout::nchw, {}, {}, true};
  block.setup(ctx, {2, 4, 6, 6});
  CHECK(arena.pending_planned().empty());  // placed at the end of the outermost setup
  const dp::Arena::PlanStats stats = arena.plan_stats();
  CHECK(stats.placed > 0);
  CHECK(stats.placed < stats.requested);

  // The same walk by hand, with the slots as the block made them.
  dp::Arena again(*backend);
  dp::ParamRegistry registry2;
  dp::Residual block2(4, 8, true, 2);
  block2.declare(registry2, "");
  registry2.allocate(*backend);
  again.set_memory_plan(true);
  dp::SetupContext ctx2{*backend, again, registry2, dp::Layout::nchw, {}, {}, true};
  ctx2.depth = 1;  // as if nested: nothing is placed, the slots stay pending
  block2.setup(ctx2, {2, 4, 6, 6});
  const std::vector<dp::Tensor*> slots = again.pending_planned();
  // conv1 dx, bn1 dx, bn1 dz, conv2 dx, bn2 dx, bn2 dz, conv3 dx, the block's dx.
  REQUIRE(slots.size() == 8);
  dp::BackwardSchedule s(slots);
  const auto dx = block2.schedule_backward(s, {});
  const std::vector<dp::BufferLifetime> life = s.lifetimes(dx);
  // Steps: 1 bn2, 2 conv2, 3 bn1, 4 conv1, 5 conv3, 6 the add.
  CHECK(life[5].first == 1);  // bn2's masked gradient, written by bn2 ...
  CHECK(life[5].last == 5);   // ... read by conv3
  CHECK(life[4].first == 1);  // bn2's dx, read by conv2
  CHECK(life[4].last == 2);
  CHECK(life[0].first == 4);  // conv1's dx, read by the add
  CHECK(life[0].last == 6);
  CHECK(life[6].first == 5);  // conv3's dx, read by the add
  CHECK(life[6].last == 6);
  CHECK(life[7].first == 6);  // the block's dx, read by whoever called backward
  CHECK(life[7].last == 6);
  again.place_planned(dp::plan_memory(life, 256));
  for (const dp::Tensor* t : slots) CHECK(t->data != nullptr);
}

namespace {

struct Run {
  std::vector<dp::EpochReport> reports;
  std::vector<float> params, buffers;
  dp::Arena::PlanStats plan;
  size_t arena = 0;
};

Run train(const dp::TrainerOptions& o, const dp::ModelBuilder& builder, const dp::Dataset& train,
          const dp::Dataset& test) {
  dp::Trainer t(o, builder, train, test);
  Run r;
  t.fit([&](const dp::EpochReport& e) {
    r.reports.push_back(e);
    return true;
  });
  r.params = t.parameters(0);
  r.buffers = t.buffers(0);
  r.plan = t.memory_plan_stats();
  r.arena = t.arena_bytes();
  return r;
}

}  // namespace

TEST_CASE("Training with the memory plan computes the same bits as without it, in less memory",
          "[memory_plan][trainer]") {
  const auto train_set = enginetest::synthetic_dataset(160, 31);
  const auto test_set = enginetest::synthetic_dataset(50, 32);
  dp::TrainerOptions o;
  o.replicas = 2;
  o.batch_size = 32;
  o.epochs = 2;
  o.seed = 9;
  o.cpu_threads = 2;
  o.lr.base = 0.05;
  o.optimizer.momentum = 0.9f;
  dp::ModelBuilder builder = [] {
    return enginetest::build_model("libdprun_resnet18.so", "resnet18", {{"width", int64_t{4}}});
  };
  SECTION("ResNet-18 (width 4), NCHW") {}
  SECTION("ResNet-18 (width 4), NHWC, synchronised batch norm, graphs") {
    o.layout = dp::Layout::nhwc;
    o.sync_bn = true;
    o.graphs = true;
  }
  SECTION("LeNet, a last batch that leaves a replica nothing") {
    o.replicas = 3;
    o.batch_size = 79;  // 160 = 2 x 79 + 2
    builder = [] { return enginetest::build_model("libdprun_lenet.so", "lenet"); };
  }
  o.memory_plan = false;
  const Run apart = train(o, builder, train_set, test_set);
  o.memory_plan = true;
  const Run planned = train(o, builder, train_set, test_set);
  REQUIRE(planned.reports.size() == apart.reports.size());
  for (size_t e = 0; e < apart.reports.size(); ++e) {
    INFO("epoch " << e + 1);
    CHECK(planned.reports[e].train_loss == apart.reports[e].train_loss);
    CHECK(planned.reports[e].test_acc == apart.reports[e].test_acc);
  }
  CHECK(planned.params == apart.params);
  CHECK(planned.buffers == apart.buffers);
  CHECK(apart.plan.requested == 0);
  CHECK(planned.plan.placed < planned.plan.requested);
  CHECK(planned.arena < apart.arena);
}
