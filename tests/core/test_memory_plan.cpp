// The memory plan: the placement function against its contract (no two buffers alive at once
// share a byte, aligned, within [peak live, sum]), on hand-made and random lifetimes; the walk of
// real models; and training with the plan computes the same bits as without it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>

#include "dp/layers.hpp"
#include "dp/memory_plan.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"
#include "support/train_steps.hpp"

namespace {

// A layer of a user's own, written without the memory plan in mind: a ReLU that keeps a view of
// its input and reads it in backward (as the mask). Its walk is Module's default, which must keep
// the input alive to the end of the step: were the batch norm's output before it freed after
// this layer's forward, the gradients planned over it would change the mask.
class InputMaskRelu final : public dp::Module {
 public:
  const char* type() const override { return "InputMaskRelu"; }

 protected:
  dp::Shape do_setup(dp::SetupContext& ctx, const dp::Shape& input) override {
    y_ = ctx.arena.allocate(input, dp::DType::f32, ctx.layout);
    dx_ = ctx.arena.allocate(input, dp::DType::f32, ctx.layout);
    return input;
  }
  dp::Tensor do_forward(dp::RunContext& ctx, const dp::Tensor& x) override {
    x_ = x;
    dp::Tensor y = y_.with_batch(x.shape[0]);
    y.layout = x.layout;
    ctx.backend.relu_forward(x, y);
    return y;
  }
  dp::Tensor do_backward(dp::RunContext& ctx, const dp::Tensor& dy, bool need_dx) override {
    if (!need_dx) return {};
    dp::Tensor dx = dx_.with_batch(dy.shape[0]);
    dx.layout = x_.layout;
    ctx.backend.relu_backward(x_, dy, dx);  // x > 0 exactly where relu(x) > 0
    return dx;
  }

 private:
  dp::Tensor x_, y_, dx_;
};

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

TEST_CASE("Arena: small buffers come from blocks that grow from 1 MiB, large ones on their own",
          "[memory_plan]") {
  auto backend = dp::create_backend({});
  const size_t before = backend->memory_in_use();
  const auto held = [&] { return backend->memory_in_use() - before; };
  constexpr size_t MiB = size_t{1} << 20;
  {
    dp::Arena arena(*backend);  // blocks of up to 64 MiB
    const dp::Tensor a = arena.allocate({1000});
    CHECK(held() == MiB);                                  // not a 64 MiB block for 4 KB
    for (int i = 0; i < 200; ++i) arena.allocate({1000});  // 804 KB in all: still the first
    CHECK(held() == MiB);
    const dp::Tensor b = arena.allocate({100000});  // does not fit the rest: a block of 2 MiB
    CHECK(held() == 3 * MiB);
    arena.allocate_bytes(3 * MiB);  // does not fit the 2 MiB block's rest: the next, 4 MiB
    CHECK(held() == 7 * MiB);
    const dp::Tensor c = arena.allocate({1000});  // from what the 4 MiB block has left
    CHECK(held() == 7 * MiB);
    arena.allocate_bytes(10 * MiB);  // larger than the next block (8 MiB): a block of 10 MiB
    CHECK(held() == 17 * MiB);
    arena.allocate_bytes(40 * MiB);  // half a largest block or more: a block of its own
    CHECK(held() == 57 * MiB);
    for (const dp::Tensor* t : {&a, &b, &c}) CHECK(reinterpret_cast<uintptr_t>(t->data) % 256 == 0);
    // Each request rounded to 256 bytes: 202 of 4000 bytes, 400000, 3, 10 and 40 MiB.
    CHECK(arena.bytes_used() == 202 * 4096 + 400128 + 53 * MiB);
  }
  CHECK(held() == 0);
}

TEST_CASE("The memory plan's walk of a residual block keeps what its backward reads alive",
          "[memory_plan]") {
  // The block's step runs forward (conv1, bn1, conv2, conv3, bn2), then backward (bn2 writes dx
  // and the masked gradient, conv2, bn1, conv1, then the shortcut conv3, which reads bn2's masked
  // gradient). What backward reads of forward (each convolution's input, each batch norm's input
  // and output) must outlive the steps between, and the shortcut's output, which only bn2's
  // forward reads, must not.
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
  // conv1 forward and backward workspaces, y, dx (0-3); bn1 y, dx, dz (4-6); conv2 workspaces,
  // y, dx (7-10); bn2 y, dx, dz (11-13); conv3 workspaces, y, dx (14-17); the block's dx (18).
  REQUIRE(slots.size() == 19);
  dp::StepSchedule s(slots);
  s.keep(block2.schedule_forward(s, {}));
  s.keep(block2.schedule_backward(s, {}));
  const std::vector<dp::BufferLifetime> life = s.lifetimes();
  // Steps: forward 1 conv1, 2 bn1, 3 conv2, 4 conv3, 5 bn2; backward 6 bn2, 7 conv2, 8 bn1,
  // 9 conv1, 10 conv3, 11 the add.
  const auto span = [&](size_t i) { return std::pair{life[i].first, life[i].last}; };
  using Span = std::pair<int64_t, int64_t>;
  CHECK(span(2) == Span{1, 8});     // conv1's output: bn1's input
  CHECK(span(4) == Span{2, 8});     // bn1's output: its mask, conv2's input
  CHECK(span(9) == Span{3, 6});     // conv2's output: bn2's input
  CHECK(span(11) == Span{5, 11});   // the block's output: kept
  CHECK(span(16) == Span{4, 5});    // the shortcut's: forward only
  CHECK(span(13) == Span{6, 10});   // bn2's masked gradient, read by conv3
  CHECK(span(12) == Span{6, 7});    // bn2's dx, read by conv2
  CHECK(span(6) == Span{8, 8});     // bn1's masked gradient: its own
  CHECK(span(3) == Span{9, 11});    // conv1's dx, read by the add
  CHECK(span(17) == Span{10, 11});  // conv3's dx, read by the add
  CHECK(span(18) == Span{11, 11});  // the block's dx: kept
  // Each convolution's workspaces (its scratch on this backend) live in their own step only.
  CHECK(span(0) == Span{1, 1});
  CHECK(span(1) == Span{9, 9});
  CHECK(span(7) == Span{3, 3});
  CHECK(span(8) == Span{7, 7});
  CHECK(span(14) == Span{4, 4});
  CHECK(span(15) == Span{10, 10});
  again.place_planned(dp::plan_memory(life, 256));
  for (const dp::Tensor* t : slots) CHECK(t->data != nullptr);
}

TEST_CASE("The memory plan's walk keeps what a layer of the user's own was given to the end",
          "[memory_plan]") {
  // The layer says nothing of its walk, so it may keep a view of its input and read it in
  // backward (this one does): the batch norm's output it reads lives to the end of the step.
  auto backend = dp::create_backend({});
  dp::Arena arena(*backend);
  dp::ParamRegistry registry;
  dp::Sequential net;
  net.add(std::make_unique<dp::Conv2d>(1, 4, 3, 1, 1));
  net.add(std::make_unique<dp::BatchNorm2d>(4));
  net.add(std::make_unique<InputMaskRelu>());
  net.add(std::make_unique<dp::Conv2d>(4, 4, 3, 1, 1));
  net.declare(registry, "");
  registry.allocate(*backend);
  dp::SetupContext ctx{*backend, arena, registry, dp::Layout::nchw, {}, {}, true};
  ctx.depth = 1;  // as if nested: the slots stay pending
  net.setup(ctx, {2, 1, 6, 6});
  const std::vector<dp::Tensor*> slots = arena.pending_planned();
  // conv workspaces, y, dx; bn y, dx; conv workspaces, y, dx (the user's layer allocates its
  // own).
  REQUIRE(slots.size() == 10);
  dp::StepSchedule s(slots);
  s.keep(net.schedule_forward(s, {}));
  s.keep(net.schedule_backward(s, {}));
  const std::vector<dp::BufferLifetime> life = s.lifetimes();
  // Steps: forward 1 conv, 2 bn, 3 the user's layer, 4 conv; backward 5 conv, 6 the user's
  // layer, 7 bn, 8 conv.
  CHECK(life[4].first == 2);
  CHECK(life[4].last == 8);
  CHECK(life[2].last == 7);  // the first convolution's output: the batch norm's backward reads it
  arena.discard_planned();
}

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
  SECTION(
      "ResNet-18 (width 4), bf16: each convolution's rounded copies in its planned "
      "workspace") {
    o.precision = dp::Precision::bf16;
  }
  SECTION("LeNet, a last batch that leaves a replica nothing") {
    o.replicas = 3;
    o.batch_size = 79;  // 160 = 2 x 79 + 2
    builder = [] { return enginetest::build_model("libdprun_lenet.so", "lenet"); };
  }
  SECTION(
      "A layer of the user's own keeping a view of its input for backward, a batch norm "
      "without a fused ReLU, max pooling, a ReLU layer") {
    builder = [] {
      auto net = std::make_unique<dp::Sequential>();
      net->add(std::make_unique<dp::Conv2d>(1, 4, 3, 1, 1));
      net->add(std::make_unique<dp::BatchNorm2d>(4));
      net->add(std::make_unique<InputMaskRelu>());
      net->add(std::make_unique<dp::MaxPool2d>(2, 2));  // its backward reads x and y
      net->add(std::make_unique<dp::Conv2d>(4, 4, 3, 1, 1));
      // A ReLU layer of its own (LeNet's above are fused into their convolutions).
      auto relu = std::make_unique<dp::Sequential>();
      relu->add(std::make_unique<dp::ReLU>());
      net->add(std::move(relu));
      net->add(std::make_unique<dp::Flatten>());
      net->add(std::make_unique<dp::Linear>(4 * 14 * 14, 10));
      return net;
    };
  }
  o.memory_plan = false;
  const dptest::FitRun apart = dptest::fit_run(o, builder, train_set, test_set);
  o.memory_plan = true;
  const dptest::FitRun planned = dptest::fit_run(o, builder, train_set, test_set);
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
  CHECK(planned.plan.bound > 0);
  CHECK(planned.plan.bound <= planned.plan.placed);  // no placement goes below the peak alive
  // The whole replica, the backend's own scratch included (under the plan the convolutions'
  // scratch is in the arena).
  CHECK(planned.peak < apart.peak);
}

TEST_CASE(
    "A convolution plan with a planned workspace keeps its bf16 copies and its scratch in the "
    "caller's memory, with the bits of the backend's own scratch",
    "[memory_plan][bf16]") {
  dp::BackendOptions options;
  options.precision = dp::Precision::bf16;
  auto backend = dp::create_backend(options);
  auto fp32 = dp::create_backend({});
  // Up to 3 images of 2 x 5 x 5, 4 filters of 3 x 3, stride 1, padding 1.
  const dp::ConvGeometry g = dptest::conv_geometry(3, 2, 5, 5, 4, 3, 3, 1, 1, 1, 1);
  dp::ConvUse own_use, planned_use;
  planned_use.planned_workspace = true;
  auto own = backend->plan_conv(g, own_use);
  auto planned = backend->plan_conv(g, planned_use);
  CHECK_FALSE(own->planned_workspace());
  CHECK(own->workspace_bytes(dp::ConvStage::forward) == 0);
  REQUIRE(planned->planned_workspace());
  // The rounded copies, each in whole 256-byte units: x (150 floats) and w (72) forward; the
  // larger of dy (300) + w and x + dy backward. Then the convolution's scratch, which an fp32
  // plan of the same backend also asks for.
  auto fp32_plan = fp32->plan_conv(g, planned_use);
  const size_t scratch[2] = {fp32_plan->workspace_bytes(dp::ConvStage::forward),
                             fp32_plan->workspace_bytes(dp::ConvStage::backward)};
  CHECK(scratch[0] > 0);
  CHECK(scratch[1] > 0);
  const size_t need[2] = {768 + 512 + scratch[0], 768 + 1280 + scratch[1]};
  CHECK(planned->workspace_bytes(dp::ConvStage::forward) == need[0]);
  CHECK(planned->workspace_bytes(dp::ConvStage::backward) == need[1]);

  dp::Arena arena(*backend);
  const auto filled = [&](dp::Shape shape, uint64_t seed) {
    dp::Tensor t = arena.allocate(shape);
    const std::vector<float> v = dptest::random_vector(static_cast<size_t>(t.numel()), seed);
    backend->upload(t.data, v.data(), t.bytes());
    return t;
  };
  const auto host = [&](const dp::Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    backend->download(v.data(), t.data, t.bytes());
    return v;
  };
  const dp::Tensor x = filled({3, 2, 5, 5}, 1), w = filled({4, 2, 3, 3}, 2), b = filled({4}, 3);
  const dp::Tensor dy = filled({3, 4, 5, 5}, 4);
  const auto floats = [](size_t bytes) { return static_cast<int64_t>(bytes / sizeof(float)); };
  const dp::Tensor fwd = arena.allocate({floats(need[0])}), bwd = arena.allocate({floats(need[1])});
  dp::Tensor y[2] = {arena.allocate({3, 4, 5, 5}), arena.allocate({3, 4, 5, 5})};
  dp::Tensor dx[2] = {arena.allocate({3, 2, 5, 5}), arena.allocate({3, 2, 5, 5})};
  dp::Tensor dw[2] = {arena.allocate({4, 2, 3, 3}), arena.allocate({4, 2, 3, 3})};
  dp::Tensor db[2] = {arena.allocate({4}), arena.allocate({4})};
  backend->conv_forward(*own, x, w, &b, y[0]);
  backend->conv_backward_data(*own, dy, w, dx[0]);
  backend->conv_backward_filter(*own, x, dy, dw[0], &db[0]);
  // The workspaces filled with NaNs before each pass: nothing in them is read before written.
  const auto poisoned = [&](const dp::Tensor& t) {
    backend->fill(t, std::numeric_limits<float>::quiet_NaN());
    return &t;
  };
  backend->conv_forward(*planned, x, w, &b, y[1], poisoned(fwd));
  backend->conv_backward_data(*planned, dy, w, dx[1], poisoned(bwd));
  backend->conv_backward_filter(*planned, x, dy, dw[1], &db[1], poisoned(bwd));
  CHECK(host(y[1]) == host(y[0]));
  CHECK(host(dx[1]) == host(dx[0]));
  CHECK(host(dw[1]) == host(dw[0]));
  CHECK(host(db[1]) == host(db[0]));

  // Without its workspace, or with one too small, a pass is refused before it runs.
  CHECK_THROWS_WITH(backend->conv_forward(*planned, x, w, &b, y[1]),
                    Catch::Contains("forward passes need a workspace of " +
                                    std::to_string(need[0]) + " bytes, got none"));
  const dp::Tensor small = arena.allocate({100});
  CHECK_THROWS_WITH(backend->conv_backward_data(*planned, dy, w, dx[1], &small),
                    Catch::Contains("backward passes need a workspace of " +
                                    std::to_string(need[1]) + " bytes, got 400"));
  const dp::Tensor unaligned =
      arena.allocate({floats(need[0]) + 100}).slice_batch(1, floats(need[0]) + 99);
  CHECK_THROWS_WITH(backend->conv_forward(*planned, x, w, &b, y[1], &unaligned),
                    Catch::Contains("must start at a multiple of 256 bytes"));
}
