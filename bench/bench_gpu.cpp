// GPU benchmark: LeNet and ResNet-18 training steps on one GPU through dp::Trainer (the same
// path dprun uses) at batches 64, 256 and 1024: TF32 (as PyTorch's default for convolutions) in
// NCHW and NHWC, strict fp32 in NCHW and NHWC, precision bf16 in NHWC and NCHW; at batch 256 also
// NHWC with cuDNN's batch norm instead of ours (DPRUN_CUDA_NHWC_BN=cudnn, the comparison issue 21
// asks for) and, each step a CUDA graph (TrainerOptions::graphs), TF32 and bf16 in NHWC and
// strict fp32 in NCHW: the paths graphs = "auto" and layout = "auto" give. Per configuration:
// warm-up steps, then the median of timed steps (each step ends with a host synchronisation:
// Trainer::step downloads the loss), projected seconds per epoch (ceil(60000 / batch) steps), peak
// GPU memory the backend allocated, and at batch 256 one real epoch of Fashion-MNIST through
// Trainer::run_epoch (no per-step host sync). Builds without CUDA too and then only says so.
// bench/pytorch_gpu.py measures PyTorch the same way in the same call (scripts/gpu-check).
//
//   bench_gpu [--steps N] [--warmup N] [--batches 64,256,1024] [--no-epoch]
//             [--model lenet|resnet18] [--config NAME,...] [--list] [--profile] [--plugins DIR]
//             [--data DIR] [--json FILE]
// --config runs the named configurations only (comma-separated, exact names such as
// "resnet18-nhwc-tf32-b256"; --list prints them all). --profile runs each configuration's warm-up,
// then one step between cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`
// (no timing, no epoch). --json also writes the results, the device and the CUDA library versions
// as loaded, for the machine-readable record scripts/gpu-check keeps (bench/results/): one row per
// configuration with model, precision, layout, batch, graphs, bn, seconds_per_epoch (the real
// epoch where one ran, else the projection) and peak_mb, and where the peak goes ("memory":
// the plan's block and its lower bound, the rest of the arena, parameters with their gradients
// and optimizer state, and the backend's own, the rest).
// Plugins: --plugins, else $DPRUN_PLUGIN_DIR, else the usual search path. Data: --data, else
// $DPRUN_DATA / the standard folder; without data a synthetic set of the same shape is used
// (and no real epoch is run).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "bench_data.hpp"
#include "dp/backend.hpp"
#include "dp/data.hpp"
#include "dp/error.hpp"
#include "dp/plugin.hpp"
#include "dp/trainer.hpp"
#include "models/plugin_loader.hpp"

namespace {

struct Args {
  int steps = 30;
  int warmup = 10;
  std::vector<int64_t> batches{64, 256, 1024};
  bool epoch = true;
  bool profile = false;
  std::string model;   // empty: both
  std::string config;  // comma-separated names; empty: every configuration
  bool list = false;
  std::string plugins;
  std::string data;
  std::string json;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_gpu [--steps N] [--warmup N] [--batches 64,256,1024] [--no-epoch] "
               "[--model lenet|resnet18] [--config NAME,...] [--list] [--profile] [--plugins DIR] "
               "[--data DIR] [--json FILE]\n");
  std::exit(2);
}

std::vector<int64_t> parse_batches(const std::string& list) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1) {
      std::fprintf(stderr, "bench_gpu: --batches: '%s' is not a positive integer\n", item.c_str());
      std::exit(2);
    }
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_gpu: %s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--steps") {
      a.steps = std::max(1, std::atoi(value().c_str()));
    } else if (s == "--warmup") {
      a.warmup = std::max(0, std::atoi(value().c_str()));
    } else if (s == "--batches" || s == "--batch") {
      a.batches = parse_batches(value());
    } else if (s == "--no-epoch") {
      a.epoch = false;
    } else if (s == "--profile") {
      a.profile = true;
    } else if (s == "--model") {
      a.model = value();
    } else if (s == "--config") {
      a.config = value();
    } else if (s == "--list") {
      a.list = true;
    } else if (s == "--plugins") {
      a.plugins = value();
    } else if (s == "--data") {
      a.data = value();
    } else if (s == "--json") {
      a.json = value();
    } else {
      usage();
    }
  }
  return a;
}

dp::ModelFactory find_model(const std::string& name, const std::string& plugin_dir) {
  std::string dir = plugin_dir;
  if (dir.empty()) {
    if (const char* env = std::getenv("DPRUN_PLUGIN_DIR"); env && *env) dir = env;
  }
  if (!dir.empty()) {
    for (const auto& m : dprun::load_plugin(dir + "/libdprun_" + name + ".so")) {
      if (m.factory.name == name) return m.factory;
    }
  }
  const auto scan = dprun::scan_plugins({});
  const auto it = scan.models.find(name);
  if (it == scan.models.end()) {
    throw dp::Error("bench_gpu: no plugin provides the model " + name +
                    " (use --plugins DIR or DPRUN_PLUGIN_DIR)");
  }
  return it->second.factory;
}

/// The arithmetic of a configuration: TF32 (the fp32 default on GPUs), exact fp32, bf16.
enum class Arith { tf32, fp32, bf16 };

struct Config {
  std::string model;
  dp::Layout layout;
  Arith arith;
  float lr;
  int64_t batch = 256;
  bool graphs = false;
  bool cudnn_bn = false;  // NHWC batch norm by cuDNN (DPRUN_CUDA_NHWC_BN=cudnn) instead of ours
  /// bf16: every activation stays an f32 tensor (DPRUN_CUDA_BF16_CONV_OUTPUT=f32: a
  /// convolution's output for its batch norm, bn1's output for conv2, the blocks' outputs), as
  /// before they were stored packed; each batch norm's output then takes a rounding pass of its
  /// own, which the packed storage does as it writes.
  bool wide_outputs = false;

  const char* precision() const {
    return arith == Arith::tf32 ? "tf32" : arith == Arith::fp32 ? "fp32" : "bf16";
  }
  /// How NHWC or NCHW batch norm is computed: ours (bn_nhwc.cu) or cuDNN's.
  const char* bn() const { return layout == dp::Layout::nhwc && !cudnn_bn ? "ours" : "cudnn"; }
  /// "resnet18-nhwc-tf32-b256", "-graphs", "-cudnn-bn".
  std::string name() const {
    return model + "-" + dp::layout_name(layout) + "-" + precision() + "-b" +
           std::to_string(batch) + (graphs ? "-graphs" : "") + (cudnn_bn ? "-cudnn-bn" : "") +
           (wide_outputs ? "-f32-storage" : "");
  }
};

struct Result {
  Config config;
  double median_ms = 0, min_ms = 0;
  double projected_s = 0;
  double epoch_s = -1, eval_s = -1, test_acc = -1;
  double peak_mb = 0;
  // Where the peak goes (replica 0): the memory plan's block (every layer's output and
  // gradients, and each convolution's workspace: cuDNN's and bf16's copies) and the least any
  // placement could use; the rest of the arena (batch-norm statistics, step tables, the data);
  // parameters, gradients and optimizer state; and what is left of the peak, the backend's own
  // (its scratch, cuBLAS's workspace, any cuDNN workspace outside the plan, the graphs'
  // memory) and the unused tails of the arena's blocks. One replica: the peak is replica 0's.
  double planned_mb = 0, planned_bound_mb = 0, arena_rest_mb = 0, parameters_mb = 0;
  std::string error;
  /// The real epoch where one ran, else the projection from the median step.
  double seconds_per_epoch() const { return epoch_s >= 0 ? epoch_s : projected_s; }
  double backend_mb() const { return peak_mb - planned_mb - arena_rest_mb - parameters_mb; }
};

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

/// The peak and where it goes (Result's memory fields).
void account(Result& r, const dp::Trainer& trainer) {
  r.peak_mb = mib(trainer.peak_memory_bytes());
  const dp::Arena::PlanStats plan = trainer.memory_plan_stats();
  r.planned_mb = mib(plan.placed);
  r.planned_bound_mb = mib(plan.bound);
  r.arena_rest_mb = mib(trainer.arena_bytes() - plan.placed);
  const dp::ParamRegistry& registry = trainer.registry();
  // Parameters and gradients, the optimizer's state buffers (as long as the parameters) and the
  // batch-norm buffers, all f32.
  const size_t states = registry.state_flat().size();
  r.parameters_mb =
      mib(((2 + states) * registry.parameter_floats() + registry.buffer_floats()) * sizeof(float));
}

/// Sets an environment variable for one scope (the CUDA backend reads DPRUN_CUDA_NHWC_BN when
/// it is created).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value == nullptr) return;
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    setenv(name, value, 1);
    set_ = true;
  }
  ~ScopedEnv() {
    if (!set_) return;
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false, set_ = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Result run(const Config& c, const Args& args, const dp::DatasetPair& data, bool real_data) {
  Result r;
  r.config = c;
  try {
    const ScopedEnv bn("DPRUN_CUDA_NHWC_BN", c.cudnn_bn ? "cudnn" : nullptr);
    const ScopedEnv outputs("DPRUN_CUDA_BF16_CONV_OUTPUT", c.wide_outputs ? "f32" : nullptr);
    const dp::ModelFactory factory = find_model(c.model, args.plugins);
    const dp::ModelOptions options = dp::resolve_model_options(factory, {});
    dp::TrainerOptions o;
    o.backend = dp::BackendKind::cuda;
    o.batch_size = c.batch;
    o.epochs = 1;
    o.lr.base = c.lr;
    o.seed = 1;
    o.allow_tf32 = c.arith != Arith::fp32;
    o.precision = c.arith == Arith::bf16 ? dp::Precision::bf16 : dp::Precision::fp32;
    o.layout = c.layout;
    o.graphs = c.graphs;
    dp::Trainer trainer(
        o, [&] { return factory.build(options, factory.input); }, data.train, data.test);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(data.train.count - 1));
    std::vector<int32_t> indices(static_cast<size_t>(c.batch));
    auto step = [&] {
      for (auto& i : indices) i = pick(rng);
      return trainer.step(indices);
    };
    for (int i = 0; i < std::max(1, args.warmup); ++i) step();
    if (args.profile) {
      dp::cuda_profiler_start();
      step();
      dp::cuda_profiler_stop();
      account(r, trainer);
      return r;
    }
    std::vector<double> ms;
    for (int i = 0; i < args.steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step();  // returns after downloading the loss: the GPU work of the step is done
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    r.median_ms = median(ms);
    r.min_ms = *std::min_element(ms.begin(), ms.end());
    const int64_t steps_per_epoch = (60000 + c.batch - 1) / c.batch;
    r.projected_s = r.median_ms * static_cast<double>(steps_per_epoch) / 1000.0;
    if (args.epoch && real_data && c.batch == 256) {
      const dp::EpochReport e = trainer.run_epoch(1);
      r.epoch_s = e.seconds;
      r.eval_s = e.eval_seconds;
      r.test_acc = e.test_acc;
    }
    account(r, trainer);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

/// The results as one JSON object (see --json).
std::string to_json(const Args& args, bool real_data, const std::vector<Result>& results) {
  using dprun::Json;
  const dp::CudaVersions v = dp::cuda_versions();
  Json versions = Json::object();
  versions.set("cuda_driver", Json::integer(v.driver));
  versions.set("cuda_runtime", Json::integer(v.runtime));
  versions.set("cudnn", Json::integer(static_cast<int64_t>(v.cudnn)));
  versions.set("cublas", Json::integer(v.cublas));
  versions.set("nccl", Json::integer(v.nccl));
  Json out = Json::object();
  out.set("device", Json::string(dp::cuda_device_name(0)));
  out.set("versions", versions);
  out.set("warmup_steps", Json::integer(args.warmup));
  out.set("timed_steps", Json::integer(args.steps));
  out.set("data", Json::string(real_data ? "fashion-mnist" : "synthetic"));
  Json rows = Json::array();
  for (const auto& r : results) {
    const Config& c = r.config;
    Json row = Json::object();
    row.set("config", Json::string(c.name()));
    row.set("model", Json::string(c.model));
    row.set("precision", Json::string(c.precision()));
    row.set("layout", Json::string(dp::layout_name(c.layout)));
    row.set("batch", Json::integer(c.batch));
    row.set("graphs", Json::boolean(c.graphs));
    row.set("bn", Json::string(c.bn()));
    if (!r.error.empty()) {
      row.set("error", Json::string(r.error));
    } else {
      row.set("median_step_ms", Json::number(r.median_ms));
      row.set("min_step_ms", Json::number(r.min_ms));
      row.set("projected_s_per_epoch", Json::number(r.projected_s));
      row.set("seconds_per_epoch", Json::number(r.seconds_per_epoch()));
      if (r.epoch_s >= 0) {
        row.set("epoch_s", Json::number(r.epoch_s));
        row.set("eval_s", Json::number(r.eval_s));
        row.set("test_acc_after_1_epoch", Json::number(r.test_acc));
      }
      row.set("peak_mb", Json::number(r.peak_mb));
      Json memory = Json::object();
      memory.set("planned_mb", Json::number(r.planned_mb));
      memory.set("planned_bound_mb", Json::number(r.planned_bound_mb));
      memory.set("arena_rest_mb", Json::number(r.arena_rest_mb));
      memory.set("parameters_mb", Json::number(r.parameters_mb));
      memory.set("backend_mb", Json::number(r.backend_mb()));
      row.set("memory", memory);
    }
    rows.push(row);
  }
  out.set("results", rows);
  return out.dump() + "\n";
}

}  // namespace

/// Every configuration of the models and batches asked for, in the order they run.
std::vector<Config> all_configs(const Args& args) {
  std::vector<Config> configs;
  for (const char* model : {"lenet", "resnet18"}) {
    if (!args.model.empty() && args.model != model) continue;
    const float lr = std::strcmp(model, "lenet") == 0 ? 0.2f : 0.1f;
    for (int64_t batch : args.batches) {
      configs.push_back({model, dp::Layout::nchw, Arith::tf32, lr, batch});
      configs.push_back({model, dp::Layout::nhwc, Arith::tf32, lr, batch});
      configs.push_back({model, dp::Layout::nchw, Arith::fp32, lr, batch});
      configs.push_back({model, dp::Layout::nhwc, Arith::bf16, lr, batch});
      configs.push_back({model, dp::Layout::nchw, Arith::bf16, lr, batch});
      if (batch == 256) {
        // layout = "auto" keeps strict fp32 in nchw until this says nhwc is faster there too.
        configs.push_back({model, dp::Layout::nhwc, Arith::fp32, lr, batch});
        // LeNet has no batch norm: ours and cuDNN's would be the same run.
        if (std::strcmp(model, "resnet18") == 0) {
          configs.push_back({model, dp::Layout::nhwc, Arith::tf32, lr, batch, false, true});
        }
        configs.push_back({model, dp::Layout::nhwc, Arith::tf32, lr, batch, true});
        // The other paths "auto" gives a trial with a GPU to itself: bf16 in nhwc, strict fp32
        // in nchw, both captured (graphs = "auto").
        configs.push_back({model, dp::Layout::nhwc, Arith::bf16, lr, batch, true});
        configs.push_back({model, dp::Layout::nchw, Arith::fp32, lr, batch, true});
        // bf16 with every activation f32, as before they were stored packed: the time and
        // memory that storage saves, side by side (LeNet has no batch norm).
        if (std::strcmp(model, "resnet18") == 0) {
          configs.push_back({model, dp::Layout::nhwc, Arith::bf16, lr, batch, true, false, true});
        }
      }
    }
  }
  return configs;
}

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (args.list) {
    for (const Config& c : all_configs(args)) std::printf("%s\n", c.name().c_str());
    return 0;
  }
  if (!dp::cuda_compiled() || dp::cuda_device_count() == 0) {
    std::printf("bench_gpu: no CUDA device (built with CUDA: %s): nothing to measure\n",
                dp::cuda_compiled() ? "yes" : "no");
    return 0;
  }
  std::printf("bench_gpu: %s, %d warm-up + %d timed steps per configuration%s\n",
              dp::cuda_device_name(0).c_str(), args.warmup, args.steps,
              args.profile ? " (profile: one step between cudaProfilerStart and Stop)" : "");

  dp::DatasetPair data;
  bool real_data = false;
  try {
    data = dp::load_dataset("fashion-mnist", args.data);
    real_data = true;
    std::printf("data: Fashion-MNIST from %s (%lld train, %lld test)\n", data.directory.c_str(),
                static_cast<long long>(data.train.count), static_cast<long long>(data.test.count));
  } catch (const std::exception& e) {
    data.train = dprun_bench::synthetic(60000, "synthetic/train");
    data.test = dprun_bench::synthetic(10000, "synthetic/test");
    std::printf("data: synthetic (Fashion-MNIST not found: %s); no real epoch\n", e.what());
  }

  std::vector<Config> configs = all_configs(args);
  if (!args.config.empty()) {
    std::vector<std::string> wanted;
    for (size_t at = 0; at <= args.config.size();) {
      const size_t comma = std::min(args.config.find(',', at), args.config.size());
      wanted.push_back(args.config.substr(at, comma - at));
      at = comma + 1;
    }
    std::vector<Config> chosen;
    for (const Config& c : configs) {
      if (std::find(wanted.begin(), wanted.end(), c.name()) != wanted.end()) chosen.push_back(c);
    }
    if (chosen.empty()) {
      std::fprintf(stderr, "bench_gpu: --config %s names no configuration (bench_gpu --list)\n",
                   args.config.c_str());
      return 2;
    }
    configs = chosen;
  }

  std::vector<Result> results;
  for (const auto& c : configs) {
    std::printf("running %s ...\n", c.name().c_str());
    std::fflush(stdout);
    results.push_back(run(c, args, data, real_data));
  }

  std::printf("\n%-9s %-6s %-5s %5s %-6s %-5s %10s %10s %13s %10s %9s %9s %9s %9s %9s\n", "model",
              "layout", "math", "batch", "graphs", "bn", "median ms", "min ms", "proj. s/ep",
              "epoch s", "eval s", "test acc", "peak MB", "plan MB", "own MB");
  int failures = 0;
  for (const auto& r : results) {
    const Config& c = r.config;
    if (!r.error.empty()) {
      ++failures;
      std::printf("%-9s %-6s %-5s %5lld %-6s %-5s FAILED: %s\n", c.model.c_str(),
                  dp::layout_name(c.layout), c.precision(), static_cast<long long>(c.batch),
                  c.graphs ? "yes" : "no", c.bn(), r.error.c_str());
      continue;
    }
    char epoch[32] = "-", eval[32] = "-", acc[32] = "-";
    if (r.epoch_s >= 0) {
      std::snprintf(epoch, sizeof epoch, "%.3f", r.epoch_s);
      std::snprintf(eval, sizeof eval, "%.3f", r.eval_s);
      std::snprintf(acc, sizeof acc, "%.4f", r.test_acc);
    }
    std::printf(
        "%-9s %-6s %-5s %5lld %-6s %-5s %10.3f %10.3f %13.3f %10s %9s %9s %9.1f %9.1f %9.1f\n",
        c.model.c_str(), dp::layout_name(c.layout), c.precision(), static_cast<long long>(c.batch),
        c.graphs ? "yes" : "no", c.bn(), r.median_ms, r.min_ms, r.projected_s, epoch, eval, acc,
        r.peak_mb, r.planned_mb, r.backend_mb());
  }
  std::printf(
      "plan MB: the memory plan's block (outputs, gradients, each convolution's workspace); own "
      "MB: the peak less that block, the rest of the arena's buffers, the parameters, gradients "
      "and optimizer state (the backend's scratch, cuBLAS's workspace, graphs, the tails of the "
      "arena's blocks)\n");
  std::printf("PyTorch on this GPU, measured in the same call: bench/pytorch_gpu.py "
              "(scripts/gpu-check's pytorch phase)\n");
  if (!args.json.empty()) {
    std::FILE* f = std::fopen(args.json.c_str(), "w");
    const std::string text = to_json(args, real_data, results);
    if (f == nullptr || std::fputs(text.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "bench_gpu: cannot write %s\n", args.json.c_str());
      return 1;
    }
  }
  return failures == 0 ? 0 : 1;
}
