// Which kernels and library calls one training step and one evaluation batch of a model run on
// the CUDA backend, counted on the emulated GPU (tests/kernel_emu: its launches and its fake
// cuDNN, cuBLAS, NCCL and copy calls count themselves as they run). A machine without a GPU sees
// here what a profile would list, without the times: every conversion, transpose and extra
// pass a step launches, so that a change that removes one is seen removed.
//
//   LD_LIBRARY_PATH=build/emulated-gpu/lib DPRUN_EMULATED_GPUS=1 build/bin/bench_launches
//     [--model resnet18|lenet] [--batch 8] [--layout nchw|nhwc] [--precision fp32|tf32|bf16]
//
// Setup and a first step run before the count (cuDNN's choices, the memory plan); then one
// training step and one evaluation batch are counted, each on its own: by name, most first, or
// with --order as they ran (a run of one name on one line). One replica, heuristic
// convolution choices (the fake cuDNN's), no graphs (a graph replays the same launches). Launch
// counts hardly depend on the batch, so a small one keeps the emulation quick. On a real GPU
// there is no census: use scripts/gpu-check's profile phase, which times each kernel.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_data.hpp"
#include "dp/trainer.hpp"
#include "models/plugin_loader.hpp"

namespace {

struct Args {
  std::string model = "resnet18";
  int64_t batch = 8;
  dp::Layout layout = dp::Layout::nhwc;
  std::string precision = "bf16";
  bool in_order = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_launches: %s\nusage: bench_launches [--model NAME] [--batch N] "
               "[--layout nchw|nhwc] [--precision fp32|tf32|bf16] [--order]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--order") {
      a.in_order = true;
      continue;
    }
    if (i + 1 >= argc) usage(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") {
      a.model = v;
    } else if (k == "--batch") {
      a.batch = std::atoll(v.c_str());
      if (a.batch <= 0) usage("--batch: expected a positive integer, got " + v);
    } else if (k == "--layout" && (v == "nchw" || v == "nhwc")) {
      a.layout = v == "nhwc" ? dp::Layout::nhwc : dp::Layout::nchw;
    } else if (k == "--precision" && (v == "fp32" || v == "tf32" || v == "bf16")) {
      a.precision = v;
    } else {
      usage("unknown option or value: " + k + " " + v);
    }
  }
  return a;
}

using Census = const char* (*)(int reset, int in_order);

struct Row {
  long long count;
  std::string name;
};

std::vector<Row> rows(const char* text, bool by_count) {
  std::vector<Row> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto tab = line.find('\t');
    if (tab == std::string::npos) continue;
    out.push_back({std::atoll(line.substr(0, tab).c_str()), line.substr(tab + 1)});
  }
  if (by_count) {
    std::stable_sort(out.begin(), out.end(),
                     [](const Row& x, const Row& y) { return x.count > y.count; });
  }
  return out;
}

bool library_call(const std::string& name) {
  for (const char* prefix : {"cudnn", "cublas", "nccl", "cuda"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

void print(const char* what, const char* text, bool in_order) {
  std::vector<Row> all = rows(text, !in_order);
  if (in_order) {  // runs of one name as one line
    std::vector<Row> runs;
    for (Row& r : all) {
      if (!runs.empty() && runs.back().name == r.name) {
        runs.back().count += r.count;
      } else {
        runs.push_back(std::move(r));
      }
    }
    all = std::move(runs);
  }
  long long kernels = 0, library = 0;
  for (const Row& r : all) (library_call(r.name) ? library : kernels) += r.count;
  std::printf("\n%s: %lld launches (%lld of dprun's kernels, %lld library calls)\n", what,
              kernels + library, kernels, library);
  if (in_order && kernels + library >= 100000) {
    std::printf(
        "(the census keeps the first 100000 runs in order: this list and its total are "
        "cut there; without --order the counts are whole)\n");
  }
  for (const Row& r : all) std::printf("%6lld  %s\n", r.count, r.name.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const auto census = reinterpret_cast<Census>(dlsym(RTLD_DEFAULT, "dp_emu_census"));
  if (census == nullptr) {
    std::fprintf(stderr,
                 "bench_launches: this libdpcore has no launch census: it counts on the emulated "
                 "GPU only (LD_LIBRARY_PATH=<build>/emulated-gpu/lib). On a GPU, scripts/gpu-check "
                 "--phases profile lists the kernels with their times.\n");
    return 2;
  }
  const auto scan = dprun::scan_plugins({});
  const auto found = scan.models.find(a.model);
  if (found == scan.models.end()) usage("no model " + a.model + " among the plugins found");
  const dp::ModelFactory& factory = found->second.factory;
  const dp::ModelOptions options = dp::resolve_model_options(factory, {});

  dp::TrainerOptions o;
  o.backend = dp::BackendKind::cuda;
  o.conv_choice = dp::ConvChoice::heuristic;
  o.graphs = false;
  o.batch_size = a.batch;
  o.epochs = 1;
  o.layout = a.layout;
  o.optimizer.momentum = 0.9f;
  o.precision = a.precision == "bf16" ? dp::Precision::bf16 : dp::Precision::fp32;
  o.allow_tf32 = a.precision != "fp32";
  const dp::Dataset train = dprun_bench::synthetic(a.batch), test = dprun_bench::synthetic(a.batch);
  dp::Trainer t(
      o,
      [&] {
        return factory.build(options, {1, 28, 28, 10});
      },
      train, test);
  std::vector<int32_t> indices(static_cast<size_t>(a.batch));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int32_t>(i);
  t.step(indices);  // the first step: whatever runs once
  t.evaluate();
  census(1, 0);
  t.step(indices);
  const std::string step = census(1, a.in_order ? 1 : 0);
  t.evaluate();
  const std::string evaluation = census(1, a.in_order ? 1 : 0);
  std::printf("model %s, precision %s, layout %s, batch %lld, one replica on the emulated GPU\n",
              a.model.c_str(), a.precision.c_str(), a.layout == dp::Layout::nhwc ? "nhwc" : "nchw",
              static_cast<long long>(a.batch));
  print("one training step", step.c_str(), a.in_order);
  print("one evaluation batch", evaluation.c_str(), a.in_order);
  return 0;
}
