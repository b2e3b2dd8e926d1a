// Scaling across processes, and what overlapping the gradient sums with backward hides.
//
// Measured (CPU, MPI): one trial of P processes x 1 replica (P = 1, 2, 4 by default), each
// under `mpirun -np P`, in three modes on the same global batch:
//   compute     every process trains its shard (batch / P) alone: no communication at all
//   overlap     the trial as dprun runs it: gradients summed in buckets as backward produces
//               them (the trainer's default, 25 MiB buckets, the first 1 MiB)
//   no-overlap  one sum of all gradients after backward (bucket_bytes = 0)
// The processes of the compute mode run at the same time, so they share the cores exactly as
// the trial's processes do: overlap - compute is the communication left exposed. Also timed:
// one sum of the whole gradient alone (what no overlap costs at best).
//
// Projected (GPUs): the step time of k GPUs from a GPU compute time per step and an all-reduce
// bus bandwidth, both stated assumptions, with the trainer's buckets, for several bandwidths.
//
//   bench_scaling [--processes 1,2,4] [--model lenet|resnet18] [--batch N] [--steps N]
//                 [--rounds N] [--warmup N] [--threads N] [--launch-arg ARG]... [--data DIR]
//                 [--backend cpu|cuda] [--gpu-step-ms MS]
// The three modes take turns, --steps steps each per round (default 10 for lenet, 2 for
// resnet18), --rounds rounds (default 5); the median round counts, and seconds per epoch are
// its step time times the steps of an epoch (235 at batch 256). --threads: the CPU threads of
// all processes together (default: this process's cores), shared equally. Under root, Open MPI
// wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1. --backend cuda measures the
// same on GPUs (one per process, NCCL between them) where a machine has several; --gpu-step-ms
// replaces the projection's assumed GPU compute time per step by a measured one.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dp/data.hpp"
#include "dp/error.hpp"
#include "dp/module.hpp"
#include "dp/params.hpp"
#include "dp/process_group.hpp"
#include "dp/trainer.hpp"
#include "base/os.hpp"
#include "process/launch.hpp"
#include "models/plugin_loader.hpp"
#include "sweep/sweep_runner.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<int> processes{1, 2, 4};
  std::string model = "lenet";
  int64_t batch = 256;
  int steps = -1;  // per round; -1: 10 for lenet, 2 for resnet18
  int rounds = 5;
  int warmup = 3;
  int threads = 0;
  std::vector<std::string> launch_args;
  std::string data;
  std::string backend = "cpu";
  double gpu_step_ms = 2810.0 / 235.0;  // the projection's GPU compute per step
  bool worker = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_scaling: %s\nusage: bench_scaling [--processes 1,2,4] [--model "
               "lenet|resnet18] [--batch N] [--steps N] [--rounds N] [--warmup N] [--threads N] "
               "[--launch-arg ARG]... [--data DIR] [--backend cpu|cuda] [--gpu-step-ms MS]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(s + " needs a value");
      return argv[++i];
    };
    if (s == "--processes") {
      a.processes.clear();
      std::stringstream list(value());
      for (std::string p; std::getline(list, p, ',');) a.processes.push_back(std::atoi(p.c_str()));
      if (a.processes.empty() || *std::min_element(a.processes.begin(), a.processes.end()) < 1)
        usage("--processes: expected positive counts such as 1,2,4");
    } else if (s == "--model") {
      a.model = value();
    } else if (s == "--batch") {
      a.batch = std::atoll(value().c_str());
    } else if (s == "--steps") {
      a.steps = std::atoi(value().c_str());
    } else if (s == "--rounds") {
      a.rounds = std::max(1, std::atoi(value().c_str()));
    } else if (s == "--warmup") {
      a.warmup = std::atoi(value().c_str());
    } else if (s == "--threads") {
      a.threads = std::atoi(value().c_str());
    } else if (s == "--launch-arg") {
      a.launch_args.push_back(value());
    } else if (s == "--data") {
      a.data = value();
    } else if (s == "--backend") {
      a.backend = value();
      if (a.backend != "cpu" && a.backend != "cuda") usage("--backend: expected cpu or cuda");
    } else if (s == "--gpu-step-ms") {
      a.gpu_step_ms = std::atof(value().c_str());
      if (!(a.gpu_step_ms > 0)) usage("--gpu-step-ms: expected a positive number");
    } else if (s == "--worker") {
      a.worker = true;
    } else {
      usage("unknown argument " + s);
    }
  }
  if (a.steps < 0) a.steps = a.model == "lenet" ? 10 : 2;
  if (a.steps < 1) usage("--steps: expected a positive integer");
  if (a.batch < 1) usage("--batch: expected a positive integer");
  return a;
}

int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return 1;
}

dp::ModelFactory find_model(const std::string& name) {
  const auto scan = dprun::scan_plugins({});
  const auto it = scan.models.find(name);
  if (it == scan.models.end())
    throw dp::Error("bench_scaling: no plugin provides the model " + name +
                    " (build the plugins, or set DPRUN_PLUGIN_PATH)");
  return it->second.factory;
}

// ---- one process of a measurement (under mpirun) -----------------------------------------------

int worker(const Args& a) {
  auto group = dp::make_mpi_process_group();
  const int P = group->size();
  const bool first = group->rank() == 0;
  const dp::DatasetPair data = dp::load_dataset("fashion-mnist", a.data);
  const dp::ModelFactory factory = find_model(a.model);
  const dp::ModelOptions options = dp::resolve_model_options(factory, {});
  const dp::ModelInput input{data.train.channels, data.train.height, data.train.width,
                             data.train.classes};
  const int budget = a.threads > 0 ? a.threads : cores();
  const int threads = std::max(1, budget / std::max(1, group->local_size()));

  // The three modes side by side, timed in turns (rounds), so that whatever else the machine
  // does moves all three alike; the median round counts.
  const std::vector<std::string> modes{"compute", "overlap", "no-overlap"};
  std::vector<std::unique_ptr<dp::Trainer>> trainers;
  for (const auto& mode : modes) {
    dp::TrainerOptions o;
    o.replicas = 1;
    o.processes = mode == "compute" ? nullptr : group.get();
    o.batch_size = mode == "compute" ? std::max<int64_t>(1, a.batch / P) : a.batch;
    o.cpu_threads = threads;
    o.backend = a.backend == "cuda" ? dp::BackendKind::cuda : dp::BackendKind::cpu;
    o.epochs = 1;
    o.lr.base = 0.05;
    o.seed = 1;
    if (mode == "no-overlap") o.bucket_bytes = 0;
    trainers.push_back(std::make_unique<dp::Trainer>(
        o, [&] { return factory.build(options, input); }, data.train, data.test.head(0)));
  }
  auto batch_at = [&](const dp::Trainer& t, int64_t step) {
    const int64_t b = t.options().batch_size;
    // Process p of the compute mode takes the examples its shard of the trial would hold.
    const int64_t offset = t.options().processes ? 0 : b * group->rank();
    std::vector<int32_t> idx(static_cast<size_t>(b));
    for (size_t i = 0; i < idx.size(); ++i)
      idx[i] = static_cast<int32_t>((step * a.batch + offset + static_cast<int64_t>(i)) %
                                    data.train.count);
    return idx;
  };
  for (auto& t : trainers)
    for (int s = 0; s < a.warmup; ++s) t->step(batch_at(*t, s));

  std::vector<std::vector<double>> per_step(modes.size());  // ms, one per round
  int64_t step = a.warmup;
  for (int round = 0; round < a.rounds; ++round) {
    for (size_t m = 0; m < modes.size(); ++m) {
      group->barrier();
      const auto t0 = Clock::now();
      for (int s = 0; s < a.steps; ++s) trainers[m]->step(batch_at(*trainers[m], step + s));
      double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      // The slowest process decides when a step of the trial ends.
      std::vector<double> all(static_cast<size_t>(P), 0.0);
      all[static_cast<size_t>(group->rank())] = seconds;
      group->allreduce_sum(all.data(), all.size());
      seconds = *std::max_element(all.begin(), all.end());
      per_step[m].push_back(seconds / a.steps * 1000.0);
    }
    step += a.steps;
  }
  const int64_t epoch_steps = (data.train.count + a.batch - 1) / a.batch;
  for (size_t m = 0; m < modes.size(); ++m) {
    auto& v = per_step[m];
    std::sort(v.begin(), v.end());
    const double ms = v[v.size() / 2];
    if (first)
      std::printf("result %s %.6f %.6f\n", modes[m].c_str(), ms, ms / 1000.0 * double(epoch_steps));
  }
  const size_t gradient_floats = trainers[0]->registry().parameter_count();
  trainers.clear();

  // One sum of the whole gradient, alone: the median of 10.
  std::vector<float> gradient(gradient_floats, 1.0f);
  std::vector<double> times;
  for (int i = 0; i < 12; ++i) {
    group->barrier();
    const auto t0 = Clock::now();
    group->allreduce_sum(gradient.data(), gradient.size());
    if (i >= 2) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  if (first) {
    std::printf("allreduce %.6f %zu\n", times[times.size() / 2] * 1000.0, gradient_floats * 4);
    std::printf("threads %d\n", threads);
  }
  std::fflush(stdout);
  return 0;
}

// ---- the driver ------------------------------------------------------------------------------

struct Row {
  int processes = 0;
  std::map<std::string, std::pair<double, double>> modes;  // ms per step, s per epoch
  double allreduce_ms = -1;
  size_t gradient_bytes = 0;
  int threads = 0;
  std::string error;
};

Row measure(const Args& a, int P, const std::string& self) {
  Row row;
  row.processes = P;
  const std::string mpirun = dprun::find_executable("mpirun");
  if (mpirun.empty()) {
    row.error = "no mpirun on PATH (Debian: openmpi-bin)";
    return row;
  }
  std::vector<std::string> cmd{mpirun,      "-np", std::to_string(P), "--oversubscribe",
                               "--bind-to", "none"};
  cmd.insert(cmd.end(), a.launch_args.begin(), a.launch_args.end());
  cmd.insert(cmd.end(), {self, "--worker", "--model", a.model, "--batch", std::to_string(a.batch),
                         "--steps", std::to_string(a.steps), "--rounds", std::to_string(a.rounds),
                         "--warmup", std::to_string(a.warmup), "--threads",
                         std::to_string(a.threads > 0 ? a.threads : cores())});
  if (!a.data.empty()) cmd.insert(cmd.end(), {"--data", a.data});
  cmd.insert(cmd.end(), {"--backend", a.backend});
  const std::string line = dprun::command_text(cmd) + " 2>&1";
  std::fprintf(stderr, "bench_scaling: %s\n", line.c_str());
  FILE* out = popen(line.c_str(), "r");
  if (!out) {
    row.error = "cannot start mpirun";
    return row;
  }
  char buf[4096];
  std::string tail;
  while (std::fgets(buf, sizeof buf, out)) {
    std::istringstream in(buf);
    std::string kind;
    in >> kind;
    if (kind == "result") {
      std::string mode;
      double ms = 0, epoch = 0;
      in >> mode >> ms >> epoch;
      row.modes[mode] = {ms, epoch};
    } else if (kind == "allreduce") {
      in >> row.allreduce_ms >> row.gradient_bytes;
    } else if (kind == "threads") {
      in >> row.threads;
    } else {
      tail = buf;
    }
  }
  if (pclose(out) != 0 || row.modes.size() != 3)
    row.error = "mpirun failed" + (tail.empty() ? std::string() : ": " + tail);
  return row;
}

// ---- the projection
// ------------------------------------------------------------------------------

// A ring all-reduce of `bytes` over k GPUs at bus bandwidth `busbw` (bytes/s, as nccl-tests
// reports it) plus a fixed latency per call.
double ring_seconds(double bytes, int k, double busbw, double latency) {
  return bytes * 2.0 * (k - 1) / k / busbw + latency;
}

// Communication left exposed after backward when the trainer's buckets (the first 1 MiB, then
// 25 MiB each) are summed one after another as soon as backward has produced them, gradient
// bytes assumed to appear at a steady rate over backward.
double exposed_with_overlap(double bytes, int k, double busbw, double latency, double backward) {
  const double first = 1 << 20, cap = 25 << 20;
  double done = 0, end = 0;
  while (done < bytes) {
    const double size = std::min(done == 0 ? first : cap, bytes - done);
    done += size;
    const double ready = backward * done / bytes;
    end = std::max(end, ready) + ring_seconds(size, k, busbw, latency);
  }
  return std::max(0.0, end - backward);
}

void print_projection(size_t resnet_bytes, double step_ms) {
  // Assumptions, stated: ResNet-18 (d2l, 28x28 Fashion-MNIST) fp32 on an H100 takes 2.81 s per
  // epoch of 235 steps of 256 in PyTorch (../shared/gpu.md), about 12 ms per step per GPU
  // (--gpu-step-ms gives another); a third of it forward, two thirds backward; 30 us per
  // all-reduce call. Each GPU keeps batch 256 (d2l's scaling: the global batch grows with the
  // GPU count).
  const double compute = step_ms / 1000.0, backward = compute * 2.0 / 3.0, latency = 30e-6;
  const double bytes = static_cast<double>(resnet_bytes);
  std::printf(
      "\nProjected scaling efficiency, ResNet-18 (%.1f MB of fp32 gradients), per-GPU batch "
      "256.\nAssumed: %.1f ms of GPU compute per step (default: PyTorch's measured H100 fp32 "
      "epoch, 2.81 s / 235 steps),\n1/3 forward, 2/3 backward, 30 us per all-reduce call; bus "
      "bandwidth as nccl-tests reports it; gradient bytes\nproduced at a steady rate over "
      "backward.\nefficiency = compute / (compute + communication left exposed).\n\n",
      bytes / 1e6, compute * 1e3);
  std::printf(
      "| all-reduce bus bandwidth | 8 GPUs, no overlap | 8 GPUs, overlap | 16 GPUs, no overlap | "
      "16 GPUs, overlap |\n| --- | --- | --- | --- | --- |\n");
  // 16 GPUs are 2 hosts: their bus bandwidth is what the links between the hosts give a GPU.
  const std::pair<double, const char*> bandwidths[] = {
      {5e9, "5 GB/s"},
      {12e9, "12 GB/s (100 Gb/s InfiniBand per GPU)"},
      {25e9, "25 GB/s (PCIe 4 x16)"},
      {100e9, "100 GB/s"},
      {350e9, "350 GB/s (H100 NVLink, one host)"}};
  for (const auto& [bw, label] : bandwidths) {
    std::printf("| %s |", label);
    for (int k : {8, 16}) {
      const double plain = ring_seconds(bytes, k, bw, latency);
      const double hidden = exposed_with_overlap(bytes, k, bw, latency, backward);
      std::printf(" %.1f ms exposed, %.0f %% | %.1f ms, %.0f %% |", plain * 1e3,
                  100.0 * compute / (compute + plain), hidden * 1e3,
                  100.0 * compute / (compute + hidden));
    }
    std::printf("\n");
  }
}

size_t gradient_bytes_of(const std::string& model) {
  const dp::ModelFactory factory = find_model(model);
  const dp::ModelOptions options = dp::resolve_model_options(factory, {});
  auto module = factory.build(options, factory.input);
  dp::ParamRegistry registry;
  module->declare(registry, "");
  return registry.parameter_count() * sizeof(float);
}

std::string self_path() {
  char buf[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "bench_scaling";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.worker) return worker(a);
    if (!dp::mpi_compiled()) {
      std::fprintf(stderr, "bench_scaling: built without MPI: nothing to measure\n");
      print_projection(gradient_bytes_of("resnet18"), a.gpu_step_ms);
      return 0;
    }
    std::vector<Row> rows;
    for (int P : a.processes) rows.push_back(measure(a, P, self_path()));

    std::printf(
        "\n%s, global batch %lld, Fashion-MNIST, %s backend, %d cores; P processes x 1 replica "
        "under mpirun.\nSeconds per epoch: the median of %d rounds of %d steps, times %lld steps; "
        "the modes take turns in each round.\n",
        a.model.c_str(), static_cast<long long>(a.batch), a.backend.c_str(), cores(), a.rounds,
        a.steps, static_cast<long long>((60000 + a.batch - 1) / a.batch));
    std::printf(
        "\n| processes | threads each | s/epoch, compute only | s/epoch, overlap | "
        "s/epoch, no overlap | exposed comm per step, overlap | exposed, no overlap | "
        "one sum of all gradients |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (const Row& r : rows) {
      if (!r.error.empty()) {
        std::printf("| %d | %s |\n", r.processes, r.error.c_str());
        continue;
      }
      const auto& c = r.modes.at("compute");
      const auto& o = r.modes.at("overlap");
      const auto& n = r.modes.at("no-overlap");
      std::printf("| %d | %d | %.2f | %.2f | %.2f | %.1f ms | %.1f ms | %.1f ms (%.2f MB) |\n",
                  r.processes, r.threads, c.second, o.second, n.second, o.first - c.first,
                  n.first - c.first, r.allreduce_ms, double(r.gradient_bytes) / 1e6);
    }
    std::printf(
        "\nexposed = step time of the trial - step time of its processes computing alone (at "
        "the same time,\non the same cores). A negative value is noise: these are shared cores, "
        "and other work on the machine\nmoves the numbers by several per cent between runs.\n");
    print_projection(gradient_bytes_of("resnet18"), a.gpu_step_ms);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_scaling: %s\n", e.what());
    return 1;
  }
}
