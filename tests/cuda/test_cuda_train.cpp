// Whole training steps through dp::Trainer: CUDA vs CPU for LeNet and ResNet-18, NHWC vs NCHW,
// and the data-parallel identity on CUDA (k replicas sharing one GPU = one replica).
//
// Tolerances (tests/support/train_steps.{hpp,cpp}; numbers from bench/bench_rounding_sensitivity,
// run on the CPU alone). Two correct implementations of a step do not agree to "float
// tolerance": ReLU and max-pool decisions within rounding of a tie flip, batch norm carries the
// change to the whole channel, and +-1 ulp nudges of ResNet-18's parameters move the median
// tensor's update by ~2e-3 to 1e-2 in one step and by ~30 % after two free-running steps (the
// conv biases that batch norm cancels, whose exact gradient is zero, by O(1)). So each test
//   - starts every step of the run under test from the reference's parameters before that step,
//     so that the differences of step 1 are not amplified by step 2 (free running, the two
//     ResNet-18 steps of the NHWC test could not be compared at all);
//   - measures on the CPU (the oracle, never the code under test) the configuration's rounding
//     sensitivity at those parameters: each step rerun from its start nudged by +-1, 16, 256 and
//     1024 ulps with several sign patterns, the worst norm-relative difference per named tensor
//     of the update, the end point and the loss, widened with more sign patterns before a
//     failure is final;
//   - holds each of them to max(4 x that sensitivity, floor).
// A correct backend differs from the CPU by per-op rounding (~1e-6 relative, ~1e-5 for a
// Winograd or FFT convolution, 16 to 170 ulps), within the nudges' range; the factor 4 leaves
// room for errors made in every op rather than in the parameters alone. On the CPU, other
// correct implementations (another summation order, k replicas, unseen nudges) stay below ~1/3
// of their tolerance while a 1 % learning-rate error, one wrong example per batch, a dropped
// gradient (any tensor whose update is not pure rounding) or ignored weight decay fail.
#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.hpp"
#include "dp/layers.hpp"
#include "dp/trainer.hpp"
#include "support/check.hpp"
#include "support/error_message.hpp"
#include "support/host_needing_net.hpp"
#include "support/train_steps.hpp"

namespace {

using dptest::StepRun;
using dptest::TrainCase;

/// The configuration of a test on the given backend; CPU runs use every core (the GPU machine
/// has 16) so the reference and its nudged reruns stay quick.
TrainCase train_case(const std::string& name, dp::BackendKind backend) {
  TrainCase c = dptest::train_case(name);
  c.options.backend = backend;
  c.options.cpu_threads = 0;
  return c;
}

/// The CPU's rounding noise of configuration `name` (one replica, NCHW) at the parameters
/// `base` started its steps from; `base` is the CPU run of `name` from those starts, which the
/// nudged reruns are compared with.
dptest::RoundingNoise cpu_noise(const std::string& name, StepRun base) {
  const TrainCase cpu = train_case(name, dp::BackendKind::cpu);
  return dptest::RoundingNoise(std::move(base), [cpu](const std::vector<std::vector<float>>& s) {
    return dptest::run_case(cpu, s);
  });
}

/// Every step of `actual` (forced to `expected`'s starts) against `expected`, each tensor held
/// to the tolerance derived from `noise`; a failure prints the worst tensors by name. One line
/// per step goes to stdout either way, so a GPU log shows how close each test came.
void check_same_steps(const std::string& what, const StepRun& actual, const StepRun& expected,
                      dptest::RoundingNoise& noise) {
  CHECK(actual.replicas_agree);  // every replica holds the same parameters after an update
  const auto cmp = noise.judge(actual, expected);
  for (size_t s = 0; s < cmp.steps.size(); ++s) {
    const auto& st = cmp.steps[s];
    const auto& u = st.updates.tensors.front();
    const auto& p = st.params.tensors.front();
    std::printf(
        "  %s, step %zu: worst update %s at %.3g of its tolerance, worst parameters %s "
        "at %.3g, loss at %.3g (%d nudges)\n",
        what.c_str(), s + 1, u.name.c_str(), u.excess(), p.name.c_str(), p.excess(),
        st.loss_tolerance > 0 ? st.loss_error / st.loss_tolerance : 0.0,
        noise.sensitivity().samples);
  }
  INFO(what << "\n" << cmp.message());
  CHECK(cmp.ok());
}

/// CUDA vs CPU for one configuration: the CPU run is the reference and the base of its noise.
void check_cuda_equals_cpu(const std::string& name) {
  const StepRun cpu = dptest::run_case(train_case(name, dp::BackendKind::cpu));
  dptest::RoundingNoise noise = cpu_noise(name, cpu);
  const StepRun gpu = dptest::run_case(train_case(name, dp::BackendKind::cuda), cpu.before);
  CHECK(gpu.initial == cpu.initial);  // same initialisation from the same seed
  check_same_steps(name + " cuda vs cpu", gpu, cpu, noise);
}

/// The graphs = "auto" fallback tests' trials: one epoch of 96 examples in steps of 32 (3 steps),
/// evaluation in chunks of 50, strict fp32.
dp::TrainerOptions capture_fallback_options(uint64_t seed) {
  dp::TrainerOptions o;
  o.backend = dp::BackendKind::cuda;
  o.allow_tf32 = false;
  o.batch_size = 32;
  o.eval_batch_size = 50;
  o.epochs = 1;
  o.seed = seed;
  o.lr.base = 0.05;
  return o;
}

bool have_data() {
  if (dptest::fashion_mnist_subset().ok) return true;
  DPTEST_SKIPPED("Fashion-MNIST not found (set DPRUN_DATA): skipping a training-step test");
  return false;
}

}  // namespace

TEST_CASE("cuda LeNet training step equals the cpu backend's", "[cuda][train]") {
  if (!have_data()) return;
  // lr 0.9 (the d2l LeNet uses large rates): visible updates after two steps.
  check_cuda_equals_cpu("lenet-b64-lr0.9-2steps");
}

TEST_CASE("cuda LeNet with max pooling and momentum equals the cpu backend", "[cuda][train]") {
  if (!have_data()) return;
  // Momentum 0.9 and weight decay: step 2 also checks the momentum buffer carried over.
  check_cuda_equals_cpu("lenet-maxpool-momentum-b48-2steps");
}

TEST_CASE("cuda LeNet with AdamW equals the cpu backend", "[cuda][train]") {
  if (!have_data()) return;
  check_cuda_equals_cpu("lenet-adamw-b64-2steps");
}

TEST_CASE("cuda ResNet-18 training step equals the cpu backend's", "[cuda][train]") {
  if (!have_data()) return;
  // Full width, batch 16, one step: small enough for the CPU reference and its nudged reruns.
  check_cuda_equals_cpu("resnet18-b16-1step");
}

TEST_CASE("cuda ResNet-18 step in NHWC equals NCHW", "[cuda][train]") {
  if (!have_data()) return;
  // ResNet-18 flattens (N, C, 1, 1), so both layouts compute the same function of the same
  // parameters. (LeNet flattens (N, 50, 4, 4): its NHWC variant orders the features differently,
  // so it is a different function of the same parameters and is not compared here.)
  TrainCase c = train_case("resnet18-b32-2steps", dp::BackendKind::cuda);
  const StepRun nchw = dptest::run_case(c);
  c.options.layout = dp::Layout::nhwc;
  const StepRun nhwc = dptest::run_case(c, nchw.before);
  CHECK(nhwc.initial == nchw.initial);
  // Both runs are CUDA's, but the tolerance comes from the CPU: the rounding sensitivity is a
  // property of the function at these parameters (model, batch, lr), which every correct
  // implementation shares, and measuring it on the oracle keeps a broken CUDA path from
  // loosening its own tolerance. The CPU reruns every step from NCHW's starts (nudged), so it
  // is evaluated where the compared steps ran; NHWC vs NCHW differ by cuDNN's per-layout
  // algorithms, the same kind and size of difference as CUDA vs CPU.
  dptest::RoundingNoise noise =
      cpu_noise(c.name, dptest::run_case(train_case(c.name, dp::BackendKind::cpu), nchw.before));
  check_same_steps(c.name + " nhwc vs nchw", nhwc, nchw, noise);
}

/// The data-parallel identity on CUDA: configuration `name` on k replicas (sharing one GPU, or
/// one per GPU) against one replica on the whole batch, each tensor under the CPU's sensitivity
/// of the one-replica step at its starts.
void check_k_replicas_equal_one(const std::string& name) {
  TrainCase c = train_case(name, dp::BackendKind::cuda);
  const StepRun one = dptest::run_case(c);
  dptest::RoundingNoise noise =
      cpu_noise(name, dptest::run_case(train_case(name, dp::BackendKind::cpu), one.before));
  // One GPU: 2 and 3 replicas share it (the same-device path). Several GPUs: one replica per
  // GPU (NCCL); a mix of shared and distinct GPUs is refused by design.
  const int gpus = dp::cuda_device_count();
  const std::vector<int> ks = gpus == 1 ? std::vector<int>{2, 3} : std::vector<int>{gpus};
  for (int k : ks) {
    INFO(k << " replicas on " << gpus << " GPU(s)");
    c.options.replicas = k;
    c.options.oversubscribe = true;
    std::string comm;
    const StepRun many = dptest::run_case(
        c, one.before, [&](dp::Trainer& t, size_t) { comm = t.communicator_kind(); });
    CHECK(comm == (gpus == 1 ? "cuda-same-device" : "nccl"));
    CHECK(many.initial == one.initial);
    check_same_steps(name + " " + std::to_string(k) + " replicas vs 1", many, one, noise);
  }
}

TEST_CASE("cuda data-parallel identity: k replicas sharing one GPU equal one replica",
          "[cuda][train]") {
  if (!have_data()) return;
  // LeNet has no batch norm, so k replicas compute exactly the step of one replica on the whole
  // batch, up to the summation order of the gradient (per shard, then across ranks). Batch 61
  // is divisible by neither 2 nor 3: the shards differ by one example.
  check_k_replicas_equal_one("lenet-b61-lr0.9-2steps");
}

TEST_CASE("cuda synchronised batch norm: k replicas on the GPU equal one replica",
          "[cuda][train]") {
  if (!have_data()) return;
  // With synchronised statistics, ResNet-18's step on k replicas is one replica's step on the
  // whole batch (its batch-norm sums over every replica): CPU vs CUDA first, then k vs 1.
  check_cuda_equals_cpu("resnet18w16-syncbn-b30-2steps");
  check_k_replicas_equal_one("resnet18w16-syncbn-b30-2steps");
}

TEST_CASE(
    "cuda trainer with the memory plan computes the same bits as without it, each "
    "convolution's workspace planned",
    "[cuda][train]") {
  // With the plan, the layers' outputs and gradients and each convolution's workspace (cuDNN's,
  // after bf16's rounded copies) share memory by lifetime; without it each has its own and
  // cuDNN's workspace is the backend's. A workspace placed over a live tensor would change the
  // bits (the emulated GPU's cuDNN writes NaNs over every workspace it is given).
  if (!have_data()) return;
  const auto& data = dptest::fashion_mnist_subset();
  dp::TrainerOptions o;
  o.backend = dp::BackendKind::cuda;
  o.batch_size = 64;
  o.epochs = 1;
  o.seed = 5;
  o.lr.base = 0.1;
  o.optimizer.momentum = 0.9f;
  const dp::ModelBuilder lenet = dptest::plugin_builder("lenet");
  for (const dp::Precision precision : {dp::Precision::fp32, dp::Precision::bf16}) {
    INFO(dp::precision_name(precision));
    o.precision = precision;
    o.layout = precision == dp::Precision::bf16 ? dp::Layout::nhwc : dp::Layout::nchw;
    auto run = [&](bool plan, std::vector<dp::EpochReport>& reports) {
      o.memory_plan = plan;
      // Two steps and one evaluation: what the plan changes shows in the first step.
      dp::Trainer t(o, lenet, data.train.head(128), data.test.head(64));
      t.fit([&](const dp::EpochReport& r) {
        reports.push_back(r);
        return true;
      });
      return std::make_pair(t.parameters(0), t.memory_plan_stats());
    };
    std::vector<dp::EpochReport> apart_reports, planned_reports;
    const auto apart = run(false, apart_reports);
    const auto planned = run(true, planned_reports);
    REQUIRE(planned_reports.size() == apart_reports.size());
    for (size_t e = 0; e < apart_reports.size(); ++e) {
      CHECK(planned_reports[e].train_loss == apart_reports[e].train_loss);
      CHECK(planned_reports[e].test_acc == apart_reports[e].test_acc);
    }
    CHECK(planned.first == apart.first);
    CHECK(planned.second.placed > 0);
    CHECK(planned.second.placed < planned.second.requested);
  }
}

TEST_CASE("cuda trainer with graphs computes the same bits as without, in fp32 and bf16",
          "[cuda][train][capture]") {
  if (!have_data()) return;
  const auto& data = dptest::fashion_mnist_subset();
  dp::TrainerOptions o;
  o.backend = dp::BackendKind::cuda;
  o.allow_tf32 = false;
  o.layout = dp::Layout::nhwc;
  o.batch_size = 96;  // 512 = 5 x 96 + 32: two captured step shapes
  o.eval_batch_size = 100;
  o.epochs = 2;
  o.seed = 3;
  o.lr.kind = dp::LrSchedule::Kind::cosine;
  o.lr.base = 0.05;
  o.lr.warmup_epochs = 0.5;
  o.optimizer.momentum = 0.9f;
  o.optimizer.weight_decay = 5e-4f;
  const dp::ModelBuilder resnet = dptest::plugin_builder("resnet18");
  // bf16: the rounding kernels and their operand scratch are part of each captured step.
  for (const dp::Precision precision : {dp::Precision::fp32, dp::Precision::bf16}) {
    INFO(dp::precision_name(precision));
    o.precision = precision;
    auto run = [&](bool graphs, std::vector<dp::EpochReport>& reports) {
      o.graphs = graphs;
      dp::Trainer t(o, resnet, data.train, data.test);
      t.fit([&](const dp::EpochReport& r) {
        reports.push_back(r);
        return true;
      });
      return std::make_pair(t.parameters(0), t.buffers(0));
    };
    std::vector<dp::EpochReport> eager_reports, graph_reports;
    const auto eager = run(false, eager_reports);
    const auto graphs = run(true, graph_reports);
    REQUIRE(graph_reports.size() == eager_reports.size());
    for (size_t e = 0; e < eager_reports.size(); ++e) {
      INFO("epoch " << e + 1);
      CHECK(graph_reports[e].train_loss == eager_reports[e].train_loss);
      CHECK(graph_reports[e].test_acc == eager_reports[e].test_acc);
      std::printf("  %s graphs vs eager, epoch %zu: %.3f s vs %.3f s\n",
                  dp::precision_name(precision), e + 1, graph_reports[e].seconds,
                  eager_reports[e].seconds);
    }
    CHECK(graphs.first == eager.first);
    CHECK(graphs.second == eager.second);
  }
}

TEST_CASE("cuda streamed data with augmentation computes the device path's bits",
          "[cuda][train][stream]") {
  // A data budget far below the sets forces streaming through the ring (page-locked staging,
  // copies on the backend's copy stream, overlapped with the steps); with graphs the captured
  // steps read the ring. Same examples, same order, same draws: the same bits as the data on
  // the device.
  if (!have_data()) return;
  const auto& data = dptest::fashion_mnist_subset();
  dp::TrainerOptions o;
  o.backend = dp::BackendKind::cuda;
  o.allow_tf32 = false;
  o.conv_choice = dp::ConvChoice::heuristic;
  o.batch_size = 96;
  o.eval_batch_size = 100;
  o.epochs = 2;
  o.seed = 3;
  o.lr.base = 0.05;
  o.optimizer.momentum = 0.9f;
  o.augment.crop_padding = 2;
  o.augment.flip = true;
  o.augment.mean = {0.2860f};
  o.augment.std = {0.3530f};
  const dp::ModelBuilder lenet = dptest::plugin_builder("lenet");
  for (const bool graphs : {false, true}) {
    INFO("graphs " << graphs);
    o.graphs = graphs;
    auto run = [&](size_t budget, std::vector<dp::EpochReport>& reports, std::string& path) {
      o.data_budget = budget;
      dp::Trainer t(o, lenet, data.train, data.test);
      path = t.data_residence().path;
      t.fit([&](const dp::EpochReport& r) {
        reports.push_back(r);
        return true;
      });
      return std::make_pair(t.parameters(0), t.buffers(0));
    };
    std::vector<dp::EpochReport> resident_reports, streamed_reports;
    std::string resident_path, streamed_path;
    const auto resident = run(0, resident_reports, resident_path);
    // The sets take ~610 kB on the device; 400 kB gives slots of 252 examples: chunks of two steps.
    const auto streamed = run(400000, streamed_reports, streamed_path);
    CHECK(resident_path == "device");
    CHECK(streamed_path == "streamed");
    REQUIRE(streamed_reports.size() == resident_reports.size());
    for (size_t e = 0; e < resident_reports.size(); ++e) {
      INFO("epoch " << e + 1);
      CHECK(streamed_reports[e].train_loss == resident_reports[e].train_loss);
      CHECK(streamed_reports[e].test_acc == resident_reports[e].test_acc);
      std::printf("  streamed vs device (graphs %d), epoch %zu: %.3f s vs %.3f s\n",
                  static_cast<int>(graphs), e + 1, streamed_reports[e].seconds,
                  resident_reports[e].seconds);
    }
    CHECK(streamed.first == resident.first);
    CHECK(streamed.second == resident.second);
  }
}

TEST_CASE("cuda: two fresh runs of one trial compute the same bits (TF32, measured and heuristic)",
          "[cuda][train]") {
  // The default GPU path (TF32, the measured choice): the first run times the algorithms and
  // keeps them in the choice cache, the second reads them back; both must compute the same bits,
  // as the H100 run measured for LeNet. The heuristic choice never times.
  if (!have_data()) return;
  const auto& data = dptest::fashion_mnist_subset();
  const dp::ModelBuilder resnet = dptest::plugin_builder("resnet18");
  for (const dp::ConvChoice choice : {dp::ConvChoice::measured, dp::ConvChoice::heuristic}) {
    INFO("conv_choice " << dp::conv_choice_name(choice));
    dp::TrainerOptions o;
    o.backend = dp::BackendKind::cuda;
    o.allow_tf32 = true;
    o.conv_choice = choice;
    o.batch_size = 128;
    o.epochs = 2;
    o.seed = 5;
    o.lr.base = 0.1;
    o.optimizer.momentum = 0.9f;
    auto run = [&](std::vector<dp::EpochReport>& reports) {
      dp::Trainer t(o, resnet, data.train, data.test);
      t.fit([&](const dp::EpochReport& r) {
        reports.push_back(r);
        return true;
      });
      return std::make_pair(t.parameters(0), t.buffers(0));
    };
    std::vector<dp::EpochReport> first_reports, second_reports;
    const auto first = run(first_reports);
    const auto second = run(second_reports);
    REQUIRE(first_reports.size() == second_reports.size());
    for (size_t e = 0; e < first_reports.size(); ++e) {
      INFO("epoch " << e + 1);
      CHECK(second_reports[e].train_loss == first_reports[e].train_loss);
      CHECK(second_reports[e].test_acc == first_reports[e].test_acc);
    }
    CHECK(second.first == first.first);
    CHECK(second.second == first.second);
  }
}

TEST_CASE("cuda graphs auto trains a model whose step needs the host without graphs",
          "[cuda][train]") {
  // graphs = "auto" captures every step size at setup: a capture the backend refuses (a download
  // in the forward or the backward pass) leaves the trial to run without graphs, with the bits of
  // graphs = false, and options() says so before anything is recorded. A model that can be
  // captured is captured at once and computes the same bits as without graphs.
  if (!have_data()) return;
  const auto& data = dptest::fashion_mnist_subset();
  const dp::Dataset train = data.train.head(96), test = data.test.head(64);
  dp::TrainerOptions o = capture_fallback_options(4);
  o.optimizer.momentum = 0.9f;
  struct Run {
    dp::EpochReport report;
    std::vector<float> parameters;
    size_t captured_at_setup = 0, captured = 0;
    bool graphs = false;
  };
  const auto run = [&](const dp::ModelBuilder& builder, bool graphs, bool automatic) {
    o.graphs = graphs;
    o.graphs_auto = automatic;
    dp::Trainer t(o, builder, train, test);
    Run r;
    r.graphs = t.options().graphs;
    r.captured_at_setup = t.captured_steps();
    r.report = t.run_epoch(1);
    r.parameters = t.parameters(0);
    r.captured = t.captured_steps();
    return r;
  };
  const auto same_bits = [](const Run& a, const Run& b) {
    CHECK(a.report.train_loss == b.report.train_loss);
    CHECK(a.report.test_loss == b.report.test_loss);
    CHECK(a.report.test_acc == b.report.test_acc);
    CHECK(a.parameters == b.parameters);
  };
  std::vector<int> replica_counts{1};
  if (dp::cuda_device_count() >= 2) replica_counts.push_back(2);  // a GPU each: "auto" is on
  for (const int replicas : replica_counts) {
    o.replicas = replicas;
    for (const dptest::PeekIn where : {dptest::PeekIn::forward, dptest::PeekIn::backward}) {
      INFO(replicas << " replicas, a download in the "
                    << (where == dptest::PeekIn::forward ? "forward" : "backward") << " pass");
      const dp::ModelBuilder peeking = [where] { return dptest::host_needing_net(where); };
      const Run eager = run(peeking, false, false);
      const Run automatic = run(peeking, false, true);
      CHECK_FALSE(automatic.graphs);
      CHECK(automatic.captured_at_setup == 0);
      CHECK(automatic.captured == 0);
      same_bits(automatic, eager);
      // Asked for, graphs stay refused, naming what needs the host.
      o.graphs = true;
      o.graphs_auto = false;
      dp::Trainer forced(o, peeking, train, test);
      CHECK_THAT(dptest::error_message_of([&] { (void)forced.run_epoch(1); }),
                 Catch::Contains("download: called while a step is being captured"));
    }
    INFO(replicas << " replicas, a model that can be captured");
    const dp::ModelBuilder plain = [] {
      auto net = std::make_unique<dp::Sequential>();
      net->add(std::make_unique<dp::Flatten>());
      net->add(std::make_unique<dp::Linear>(784, 32));
      net->add(std::make_unique<dp::ReLU>());
      net->add(std::make_unique<dp::Linear>(32, 10));
      return std::unique_ptr<dp::Module>(std::move(net));
    };
    const Run eager = run(plain, false, false);
    const Run forced = run(plain, true, false);
    const Run automatic = run(plain, false, true);
    CHECK(automatic.graphs);
    CHECK(forced.captured_at_setup == 0);
    // Every size at setup: the step of 32, the test set's chunks (50 and 14 on one replica, 25
    // and 7 on each of two).
    CHECK(automatic.captured_at_setup == 3);
    CHECK(automatic.captured == forced.captured);
    same_bits(automatic, eager);
    same_bits(forced, eager);
  }
}

TEST_CASE("cuda graphs auto runs a batch size whose capture is refused without graphs",
          "[cuda][train]") {
  // Setup captures the trial's step and chunk sizes; Trainer::step may meet another size later.
  // Under "auto" a size whose capture is refused (here only steps of 7 examples download) runs
  // eagerly, the captured sizes stay captured, and the bits are those of graphs = false.
  if (!have_data()) return;
  const auto& data = dptest::fashion_mnist_subset();
  const dp::Dataset train = data.train.head(96), test = data.test.head(64);
  dp::TrainerOptions o = capture_fallback_options(6);
  const dp::ModelBuilder peeking_at_7 = [] {
    return dptest::host_needing_net(dptest::PeekIn::forward, 7);
  };
  const std::vector<int32_t> seven{3, 1, 4, 15, 9, 26, 5};
  struct Run {
    double loss = 0;
    std::vector<float> parameters;
    bool graphs = false;
    size_t captured = 0;
  };
  const auto run = [&](bool graphs, bool automatic) {
    o.graphs = graphs;
    o.graphs_auto = automatic;
    dp::Trainer t(o, peeking_at_7, train, test);
    Run r;
    r.graphs = t.options().graphs;
    (void)t.run_epoch(1);
    r.loss = t.step(seven);
    r.parameters = t.parameters(0);
    r.captured = t.captured_steps();
    return r;
  };
  const Run eager = run(false, false);
  const Run automatic = run(false, true);
  CHECK(automatic.graphs);         // every size of the trial captured at setup
  CHECK(automatic.captured == 3);  // 32, and the chunks 50 and 14; not 7
  CHECK(automatic.loss == eager.loss);
  CHECK(automatic.parameters == eager.parameters);
  // Asked for, graphs fail that step, naming what needs the host.
  o.graphs = true;
  o.graphs_auto = false;
  dp::Trainer forced(o, peeking_at_7, train, test);
  (void)forced.run_epoch(1);
  CHECK_THAT(dptest::error_message_of([&] { (void)forced.step(seven); }),
             Catch::Contains("download: called while a step is being captured"));
}
