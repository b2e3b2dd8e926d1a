// How close k replicas stay to one replica, per step and over many steps (README, "What dprun
// is"). On the CPU backend:
//
//   bench_replica_drift [--model lenet] [--batch 256] [--lr 0.1] [--steps 30] [--replicas 2]
//                       [--threads T] [--init-std S]
//
// LeNet on the first 512 Fashion-MNIST training images (batches of `batch` scrambled indices,
// a different selection each step), SGD, seed 7. Three runs: one replica free running (the
// reference), k replicas forced to start every step from the reference's parameters (the
// per-step agreement: what "k replicas compute the same step" means in floating point, where
// the gradient sum's order differs), and k replicas free running (each step from its own last
// one: the per-step rounding differences fed back and grown by the training dynamics). Prints
// per step the worst tensor's norm-relative difference of the update (forced) and of the
// parameters (free), and both runs' losses.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/train_steps.hpp"

namespace {

struct Args {
  std::string model = "lenet";
  int64_t batch = 256;
  float lr = 0.1f;
  int steps = 30;
  int replicas = 2;
  int threads = 0;
  double init_std = 0;  // 0: the plugin's default
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_replica_drift: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--model")
      a.model = value();
    else if (k == "--batch")
      a.batch = std::stoll(value());
    else if (k == "--lr")
      a.lr = std::stof(value());
    else if (k == "--steps")
      a.steps = std::stoi(value());
    else if (k == "--replicas")
      a.replicas = std::stoi(value());
    else if (k == "--threads")
      a.threads = std::stoi(value());
    else if (k == "--init-std")
      a.init_std = std::stod(value());
    else {
      std::fprintf(stderr, "bench_replica_drift: unknown option %s (see the file's comment)\n",
                   k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// The worst tensor's norm-relative difference of a - b against b, per tensor.
double worst_relative(const std::vector<dptest::NamedSpan>& spans, const std::vector<float>& a,
                      const std::vector<float>& b) {
  double worst = 0;
  for (const auto& s : spans) {
    double diff = 0, norm = 0;
    for (size_t i = s.offset; i < s.offset + s.count; ++i) {
      const double d = static_cast<double>(a[i]) - b[i];
      diff += d * d;
      norm += static_cast<double>(b[i]) * b[i];
    }
    if (norm > 0) worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const auto& data = dptest::fashion_mnist_subset();
  if (!data.ok) {
    std::fprintf(stderr, "bench_replica_drift: Fashion-MNIST not found (set DPRUN_DATA)\n");
    return 2;
  }
  dp::ModelOptions model_options;
  if (a.init_std > 0) model_options["init_std"] = a.init_std;
  const dp::ModelBuilder builder = dptest::plugin_builder(a.model, model_options);
  dp::TrainerOptions o;
  o.backend = dp::BackendKind::cpu;
  o.batch_size = a.batch;
  o.eval_batch_size = a.batch;
  o.epochs = 1;
  o.lr.base = a.lr;
  o.seed = 7;
  o.cpu_threads = a.threads;
  std::vector<std::vector<int32_t>> batches;
  for (int s = 0; s < a.steps; ++s) batches.push_back(dptest::batch_indices(a.batch, 101 * s));

  const dptest::StepRun one = dptest::run_steps(o, builder, data.train, data.test, batches);
  o.replicas = a.replicas;
  const dptest::StepRun forced =
      dptest::run_steps(o, builder, data.train, data.test, batches, one.before);
  const dptest::StepRun free = dptest::run_steps(o, builder, data.train, data.test, batches);

  std::printf("# %s, batch %lld, lr %g, SGD, seed 7, CPU backend; 1 replica vs %d\n",
              a.model.c_str(), static_cast<long long>(a.batch), static_cast<double>(a.lr),
              a.replicas);
  std::printf("# update: worst tensor's ||u_k - u_1|| / ||u_1||, both from 1 replica's start\n");
  std::printf("# params: worst tensor's ||p_k - p_1|| / ||p_1||, each free running\n");
  std::printf("%4s  %12s  %12s  %12s  %12s\n", "step", "update", "params", "loss 1", "loss k");
  for (size_t s = 0; s < one.steps(); ++s) {
    std::printf("%4zu  %12.3e  %12.3e  %12.6f  %12.6f\n", s + 1,
                worst_relative(one.spans, forced.update(s), one.update(s)),
                worst_relative(one.spans, free.after[s], one.after[s]), one.losses[s],
                free.losses[s]);
  }
  return 0;
}
