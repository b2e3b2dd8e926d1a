// Where a replica's memory goes, and what the memory plan saves (core/include/dp/memory_plan.hpp).
// On the CPU backend (its arena holds what a GPU's would, with its convolution scratch where a GPU
// has cuDNN's workspaces):
//
//   bench_memory [--model resnet18|lenet] [--batches 64,256,1024] [--layout nchw|nhwc]
//                [--backend cpu|cuda]
//
// --backend cuda sets the replica up on the CUDA backend (on a machine without a GPU: the
// emulated one, tests/kernel_emu), with cuDNN's heuristics and no graphs: nothing runs but the
// setup. Its planned bytes are the GPU's (layer outputs and gradients in the dtypes it stores
// them in: precision bf16 keeps the outputs of convolutions that feed a batch norm, and the
// batch norms' input gradients, as bf16 in nhwc); its workspaces are the cuDNN it runs on.
//
// For each per-replica batch: one replica set up on a training set of one batch (so the data is
// small and known), with the plan off and on. Prints the arena's bytes by kind: parameters,
// gradients and optimizer state (the registry), the data and step tables, the planned buffers
// (every layer's output and gradients, and each convolution's workspace: on the CPU backend its
// scratch) each on its own, as the plan places them and the least any placement could use, and
// the rest (the layers' own small buffers), and what
// precision = "bf16" adds (plan on): the rounded operand copies, in each convolution's planned
// workspace (the GPU's bf16 path keeps them there too, before cuDNN's workspace) and, for the
// linear layer, in the backend's shared scratch. Nothing is timed; the figures are exact byte
// counts.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench_data.hpp"
#include "dp/trainer.hpp"
#include "models/plugin_loader.hpp"

namespace {

struct Args {
  std::string model = "resnet18";
  std::vector<int64_t> batches = {64, 256, 1024};
  dp::Layout layout = dp::Layout::nchw;
  dp::BackendKind backend = dp::BackendKind::cpu;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_memory: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    const std::string v = argv[++i];
    if (k == "--model") {
      a.model = v;
    } else if (k == "--batches") {
      a.batches.clear();
      std::stringstream in(v);
      for (std::string item; std::getline(in, item, ',');) a.batches.push_back(std::stoll(item));
    } else if (k == "--layout") {
      a.layout = v == "nhwc" ? dp::Layout::nhwc : dp::Layout::nchw;
    } else if (k == "--backend" && (v == "cpu" || v == "cuda")) {
      a.backend = v == "cuda" ? dp::BackendKind::cuda : dp::BackendKind::cpu;
    } else {
      std::fprintf(stderr, "bench_memory: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const auto scan = dprun::scan_plugins({});
  const auto found = scan.models.find(a.model);
  if (found == scan.models.end()) {
    std::fprintf(stderr, "bench_memory: no model %s among the plugins found\n", a.model.c_str());
    return 2;
  }
  const dp::ModelFactory& factory = found->second.factory;
  const dp::ModelOptions options = dp::resolve_model_options(factory, {});
  std::printf("model %s, layout %s, one replica, %s backend, SGD with momentum; MiB\n",
              a.model.c_str(), a.layout == dp::Layout::nhwc ? "nhwc" : "nchw",
              a.backend == dp::BackendKind::cuda ? "CUDA" : "CPU");
  std::printf("%6s  %10s  %10s  %7s  %12s  %10s  %30s  %10s  %10s  %30s\n", "batch", "total off",
              "total on", "saved", "params+grads", "data", "planned: apart/placed/bound",
              "unplanned", "bf16 adds", "bf16 planned: apart/placed/bound");
  for (const int64_t batch : a.batches) {
    size_t total[2] = {0, 0};
    dp::Arena::PlanStats plan, plan16;
    size_t registry = 0, data = 0, arena = 0;
    size_t bf16_total = 0;
    // Runs 0 and 1: fp32 with the plan off and on; run 2: bf16 with the plan on.
    for (int run = 0; run < 3; ++run) {
      const int on = run == 0 ? 0 : 1;
      dp::TrainerOptions o;
      o.backend = a.backend;
      o.conv_choice = dp::ConvChoice::heuristic;  // nothing timed (on the CPU: the same)
      o.graphs = false;
      o.batch_size = batch;
      o.epochs = 1;
      o.cpu_threads = 1;
      o.layout = a.layout;
      o.optimizer.momentum = 0.9f;
      o.memory_plan = on == 1;
      o.precision = run == 2 ? dp::Precision::bf16 : dp::Precision::fp32;
      const dp::Dataset train = dprun_bench::synthetic(batch), test = dprun_bench::synthetic(batch);
      dp::Trainer t(o, [&] { return factory.build(options, {1, 28, 28, 10}); }, train, test);
      if (run == 2) {
        bf16_total = t.peak_memory_bytes();
        plan16 = t.memory_plan_stats();
        continue;
      }
      total[on] = t.peak_memory_bytes();
      if (on == 0) continue;
      plan = t.memory_plan_stats();
      arena = t.arena_bytes();
      const dp::ParamRegistry& r = t.registry();
      // Parameters, gradients and one momentum buffer, and the BN buffers, all f32.
      registry = (3 * r.parameter_floats() + r.buffer_floats()) * sizeof(float);
      // Images and labels of both sets (u8) and their index tables (i32).
      data = static_cast<size_t>(2 * batch * (train.example_bytes() + 1 + 4));
    }
    const size_t unplanned = arena - plan.placed - data;
    char planned[96], planned16[96];
    std::snprintf(planned, sizeof planned, "%.1f / %.1f / %.1f", mib(plan.requested),
                  mib(plan.placed), mib(plan.bound));
    std::snprintf(planned16, sizeof planned16, "%.1f / %.1f / %.1f", mib(plan16.requested),
                  mib(plan16.placed), mib(plan16.bound));
    std::printf("%6lld  %10.1f  %10.1f  %6.1f%%  %12.1f  %10.1f  %30s  %10.1f  %10.1f  %30s\n",
                static_cast<long long>(batch), mib(total[0]), mib(total[1]),
                100.0 * (1.0 - static_cast<double>(total[1]) / static_cast<double>(total[0])),
                mib(registry), mib(data), planned, mib(unplanned), mib(bf16_total) - mib(total[1]),
                planned16);
  }
  std::printf(
      "total: the backend's peak of allocated bytes (arena blocks, parameters, scratch);\n"
      "planned: the layers' outputs and gradients and the convolutions' workspaces (their\n"
      "scratch), each on its own, as the plan placed them, and the most alive at one step of\n"
      "a training step (no placement can use less);\n"
      "unplanned: the rest of the arena (the layers' own small buffers, the step tables);\n"
      "bf16 adds: precision = \"bf16\"'s peak (plan on) less fp32's, the rounded operand\n"
      "copies (the convolutions' in their planned workspaces)\n");
  return 0;
}
