// Micro-benchmark of the CPU backend's ops at the shapes of the two models.
//
//   bench_cpu_ops [--threads T] [--reps R] [--batch B] [--resnet-batch B] [--no-resnet]
//                 [--cpu-time]
//
// Part 1 runs one full LeNet training step (batch 256 by default: gather, forward, loss,
// backward, SGD) op by op, R times, and prints the median milliseconds of every op, their sum
// and the projected epoch time (60000 / batch steps, rounded up). Part 2 times the convolution
// and batch-norm ops of the small-image ResNet-18 (28x28 Fashion-MNIST input) at a smaller batch.
// Medians, not means: the machine is shared and outliers are noise, not the op. On a busy
// machine, --threads 1 --cpu-time measures each op's single-core cost (process CPU time), which
// other processes cannot inflate; with more threads CPU time also counts OpenMP's spin-waiting.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dp/backend.hpp"
#include "dp/random.hpp"

namespace {

using Clock = std::chrono::steady_clock;

bool g_cpu_time = false;

// Milliseconds on the chosen clock.
double now_ms() {
  if (g_cpu_time) {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

struct Options {
  int threads = 0;
  int reps = 11;
  int64_t batch = 256;
  int64_t resnet_batch = 32;
  bool resnet = true;
  bool cpu_time = false;  // process CPU time instead of wall-clock time
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cpu_ops: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (a == "--threads") {
      o.threads = static_cast<int>(next());
    } else if (a == "--reps") {
      o.reps = std::max(1, static_cast<int>(next()));
    } else if (a == "--batch") {
      o.batch = next();
    } else if (a == "--resnet-batch") {
      o.resnet_batch = next();
    } else if (a == "--no-resnet") {
      o.resnet = false;
    } else if (a == "--cpu-time") {
      o.cpu_time = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_cpu_ops [--threads T] [--reps R] [--batch B] "
                   "[--resnet-batch B] [--no-resnet] [--cpu-time]\n");
      std::exit(2);
    }
  }
  return o;
}

// Backend memory holding a tensor; released at exit of the benchmark.
class Arena {
 public:
  explicit Arena(dp::Backend& b) : b_(b) {}
  ~Arena() {
    for (void* p : owned_) b_.release(p);
  }
  dp::Tensor tensor(dp::Shape s, dp::DType t = dp::DType::f32, float lo = -0.1f, float hi = 0.1f) {
    dp::Tensor x(nullptr, s, t, b_.device());
    x.data = b_.allocate(x.bytes());
    owned_.push_back(x.data);
    if (t == dp::DType::f32) {
      std::vector<float> v(static_cast<size_t>(s.numel()));
      for (auto& e : v) e = lo + (hi - lo) * rng_.uniform();
      b_.upload(x.data, v.data(), x.bytes());
    }
    return x;
  }

 private:
  dp::Backend& b_;
  dp::Rng rng_{1};
  std::vector<void*> owned_;
};

struct Timed {
  Timed(std::string n, std::function<void()> r, double g = 0)
      : name(std::move(n)), run(std::move(r)), gflop(g) {}
  std::string name;
  std::function<void()> run;
  double gflop = 0;  // per call, 0 when not GEMM-shaped
  std::vector<double> ms;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs every op in order `reps` times (after one warm-up pass) and records each op's time.
void run_ops(dp::Backend& backend, std::vector<Timed>& ops, int reps) {
  for (auto& op : ops) op.run();
  backend.synchronize();
  for (int r = 0; r < reps; ++r) {
    for (auto& op : ops) {
      const double t0 = now_ms();
      op.run();
      backend.synchronize();
      op.ms.push_back(now_ms() - t0);
    }
  }
}

double print_table(const std::vector<Timed>& ops) {
  std::printf("  %-34s %10s %9s %8s\n", "op", "median ms", "GFLOP/s", "share");
  double total = 0;
  for (const auto& op : ops) total += median(op.ms);
  for (const auto& op : ops) {
    const double m = median(op.ms);
    if (op.gflop > 0) {
      std::printf("  %-34s %10.3f %9.1f %7.1f%%\n", op.name.c_str(), m, op.gflop / (m * 1e-3),
                  100 * m / total);
    } else {
      std::printf("  %-34s %10.3f %9s %7.1f%%\n", op.name.c_str(), m, "", 100 * m / total);
    }
  }
  std::printf("  %-34s %10.3f\n", "sum", total);
  return total;
}

dp::ConvGeometry conv_geometry(int64_t n, int64_t c, int64_t h, int64_t k, int64_t kernel,
                               int64_t stride, int64_t pad) {
  dp::ConvGeometry g;
  g.max_batch = n;
  g.in_channels = c;
  g.in_h = g.in_w = h;
  g.out_channels = k;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  return g;
}

double conv_gflop(const dp::ConvGeometry& g, int64_t n) {
  return 2.0 *
         static_cast<double>(n * g.out_channels * g.out_h() * g.out_w() * g.in_channels *
                             g.kernel_h * g.kernel_w) *
         1e-9;
}

void bench_lenet(dp::Backend& backend, const Options& o) {
  const int64_t n = o.batch;
  Arena a(backend);
  // A resident "dataset" of 60000 u8 images, as the trainer keeps it.
  const int64_t m = 60000;
  dp::Tensor images = a.tensor({m, 1, 28, 28}, dp::DType::u8);
  dp::Tensor labels = a.tensor({m}, dp::DType::u8);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  dp::Rng rng(7);
  for (auto& i : idx) i = static_cast<int32_t>(rng.below(static_cast<uint64_t>(m)));
  dp::Tensor indices = a.tensor({n}, dp::DType::i32);
  backend.upload(indices.data, idx.data(), indices.bytes());
  std::vector<uint8_t> label_values(static_cast<size_t>(m));
  for (auto& l : label_values) l = static_cast<uint8_t>(rng.below(10));
  backend.upload(labels.data, label_values.data(), labels.bytes());
  dp::Tensor x = a.tensor({n, 1, 28, 28}), y = a.tensor({n}, dp::DType::i32);

  // Parameters in one flat buffer (as the trainer keeps them) and views into it.
  const int64_t sizes[] = {20 * 9, 20, 50 * 20 * 25, 50, 128 * 800, 128, 10 * 128, 10};
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  dp::Tensor params = a.tensor({total}), grads = a.tensor({total}), momentum = a.tensor({total});
  std::vector<dp::Tensor> p, g;
  int64_t off = 0;
  const dp::Shape shapes[] = {{20, 1, 3, 3}, {20},  {50, 20, 5, 5}, {50},
                              {128, 800},    {128}, {10, 128},      {10}};
  for (int i = 0; i < 8; ++i) {
    p.push_back(dp::Tensor(params.f32() + off, shapes[i]));
    g.push_back(dp::Tensor(grads.f32() + off, shapes[i]));
    off += sizes[i];
  }
  const auto g1 = conv_geometry(n, 1, 28, 20, 3, 1, 0);
  const auto g2 = conv_geometry(n, 20, 13, 50, 5, 1, 0);
  auto plan1 = backend.plan_conv(g1);
  auto plan2 = backend.plan_conv(g2);
  dp::PoolGeometry pool;  // 2x2 stride 2
  dp::Tensor c1 = a.tensor({n, 20, 26, 26}), p1 = a.tensor({n, 20, 13, 13});
  dp::Tensor c2 = a.tensor({n, 50, 9, 9}), p2 = a.tensor({n, 50, 4, 4});
  dp::Tensor f1 = a.tensor({n, 128}), logits = a.tensor({n, 10});
  dp::Tensor dlogits = a.tensor({n, 10}), df1 = a.tensor({n, 128}), dp2 = a.tensor({n, 800});
  dp::Tensor dc2 = a.tensor({n, 50, 9, 9}), dp1 = a.tensor({n, 20, 13, 13});
  dp::Tensor dc1 = a.tensor({n, 20, 26, 26});
  dp::Tensor loss = a.tensor({1}), correct = a.tensor({1}, dp::DType::i32);
  const dp::Tensor flat = p2.reshaped({n, 800});
  const dp::SgdParams sgd{0.9f, 0.0f, 0.0f};

  std::vector<Timed> ops = {
      {"gather_batch", [&] { backend.gather_batch(images, labels, indices, x, y); }},
      {"conv1 forward 1->20 3x3", [&] { backend.conv_forward(*plan1, x, p[0], &p[1], c1); },
       conv_gflop(g1, n)},
      {"relu1 forward", [&] { backend.relu_forward(c1, c1); }},
      {"avgpool1 forward", [&] { backend.avgpool_forward(pool, c1, p1); }},
      {"conv2 forward 20->50 5x5", [&] { backend.conv_forward(*plan2, p1, p[2], &p[3], c2); },
       conv_gflop(g2, n)},
      {"relu2 forward", [&] { backend.relu_forward(c2, c2); }},
      {"avgpool2 forward", [&] { backend.avgpool_forward(pool, c2, p2); }},
      {"fc1 forward 800->128", [&] { backend.linear_forward(flat, p[4], &p[5], f1); },
       2e-9 * static_cast<double>(n * 800 * 128)},
      {"relu3 forward", [&] { backend.relu_forward(f1, f1); }},
      {"fc2 forward 128->10", [&] { backend.linear_forward(f1, p[6], &p[7], logits); }},
      {"softmax_cross_entropy",
       [&] {
         backend.softmax_cross_entropy(logits, y, 1.0f / static_cast<float>(n), dlogits, loss,
                                       correct);
       }},
      {"fc2 backward", [&] { backend.linear_backward(f1, p[6], dlogits, &df1, g[6], &g[7]); }},
      {"relu3 backward", [&] { backend.relu_backward(f1, df1, df1); }},
      {"fc1 backward", [&] { backend.linear_backward(flat, p[4], df1, &dp2, g[4], &g[5]); },
       4e-9 * static_cast<double>(n * 800 * 128)},
      {"avgpool2 backward",
       [&] {
         backend.avgpool_backward(pool, dp2.reshaped({n, 50, 4, 4}), dc2);
       }},
      {"relu2 backward", [&] { backend.relu_backward(c2, dc2, dc2); }},
      {"conv2 backward data", [&] { backend.conv_backward_data(*plan2, dc2, p[2], dp1); },
       conv_gflop(g2, n)},
      {"conv2 backward filter", [&] { backend.conv_backward_filter(*plan2, p1, dc2, g[2], &g[3]); },
       conv_gflop(g2, n)},
      {"avgpool1 backward", [&] { backend.avgpool_backward(pool, dp1, dc1); }},
      {"relu1 backward", [&] { backend.relu_backward(c1, dc1, dc1); }},
      {"conv1 backward filter", [&] { backend.conv_backward_filter(*plan1, x, dc1, g[0], &g[1]); },
       conv_gflop(g1, n)},
      {"sgd_update (129k params, momentum)",
       [&] { backend.sgd_update(params, grads, &momentum, sgd); }},
  };
  run_ops(backend, ops, o.reps);
  std::printf("LeNet training step, batch %lld, op by op (median of %d):\n",
              static_cast<long long>(n), o.reps);
  const double step_ms = print_table(ops);
  const int64_t steps = (60000 + n - 1) / n;
  std::printf("  projected epoch (%lld steps): %.2f s\n", static_cast<long long>(steps),
              step_ms * static_cast<double>(steps) * 1e-3);

  // The same step end to end, without per-op synchronisation, as a cross-check of the sum.
  std::vector<double> whole;
  for (int r = 0; r < o.reps; ++r) {
    const double t0 = now_ms();
    for (auto& op : ops) op.run();
    backend.synchronize();
    whole.push_back(now_ms() - t0);
  }
  std::printf("  whole step (median of %d): %.3f ms -> epoch %.2f s\n\n", o.reps, median(whole),
              median(whole) * static_cast<double>(steps) * 1e-3);
}

void bench_resnet(dp::Backend& backend, const Options& o) {
  const int64_t n = o.resnet_batch;
  Arena a(backend);
  struct Layer {
    const char* name;
    int64_t c, h, k, kernel, stride, pad;
  };
  // The distinct convolutions of the small-image ResNet-18 (d2l, 28x28, 1 input channel).
  const Layer layers[] = {
      {"stem 1->64 3x3 28x28", 1, 28, 64, 3, 1, 1},
      {"b1 64->64 3x3 28x28", 64, 28, 64, 3, 1, 1},
      {"b2 64->128 3x3 s2 28->14", 64, 28, 128, 3, 2, 1},
      {"b2 128->128 3x3 14x14", 128, 14, 128, 3, 1, 1},
      {"b2 shortcut 64->128 1x1 s2", 64, 28, 128, 1, 2, 0},
      {"b3 256->256 3x3 7x7", 256, 7, 256, 3, 1, 1},
      {"b4 512->512 3x3 4x4", 512, 4, 512, 3, 1, 1},
  };
  std::vector<Timed> ops;
  std::vector<std::unique_ptr<dp::ConvPlan>> plans;
  for (const Layer& l : layers) {
    const auto geo = conv_geometry(n, l.c, l.h, l.k, l.kernel, l.stride, l.pad);
    plans.push_back(backend.plan_conv(geo));
    dp::ConvPlan* plan = plans.back().get();
    const dp::Tensor x = a.tensor({n, l.c, l.h, l.h});
    const dp::Tensor w = a.tensor({l.k, l.c, l.kernel, l.kernel});
    const dp::Tensor y = a.tensor({n, l.k, geo.out_h(), geo.out_w()});
    const dp::Tensor dx = a.tensor({n, l.c, l.h, l.h});
    const dp::Tensor dw = a.tensor({l.k, l.c, l.kernel, l.kernel});
    const double gf = conv_gflop(geo, n);
    const std::string name = l.name;
    ops.push_back({name + " fwd",
                   [&backend, plan, x, w, y] { backend.conv_forward(*plan, x, w, nullptr, y); },
                   gf});
    ops.push_back({name + " bwd data",
                   [&backend, plan, y, w, dx] { backend.conv_backward_data(*plan, y, w, dx); },
                   gf});
    ops.push_back(
        {name + " bwd filter",
         [&backend, plan, x, y, dw] { backend.conv_backward_filter(*plan, x, y, dw, nullptr); },
         gf});
  }
  const dp::Tensor bx = a.tensor({n, 64, 28, 28}), by = a.tensor({n, 64, 28, 28});
  const dp::Tensor gamma = a.tensor({64}), beta = a.tensor({64}), rm = a.tensor({64});
  const dp::Tensor rv = a.tensor({64}, dp::DType::f32, 0.5f, 1.5f), sm = a.tensor({64}),
                   si = a.tensor({64}), dgamma = a.tensor({64}), dbeta = a.tensor({64});
  ops.push_back(
      {"bn 64x28x28 train fwd",
       [&] { backend.batchnorm_forward_train(bx, gamma, beta, rm, rv, 0.1f, 1e-5f, sm, si, by); }});
  ops.push_back({"bn 64x28x28 bwd",
                 [&] { backend.batchnorm_backward(bx, by, gamma, sm, si, 1e-5f, bx, dgamma, dbeta); }});
  run_ops(backend, ops, o.reps);
  std::printf("ResNet-18 (28x28) layers, batch %lld (median of %d):\n", static_cast<long long>(n),
              o.reps);
  print_table(ops);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  g_cpu_time = o.cpu_time;
  dp::BackendOptions bo;
  bo.kind = dp::BackendKind::cpu;
  bo.cpu_threads = o.threads;
  auto backend = dp::create_backend(bo);
  std::printf("backend: %s, timing %s\n\n", backend->device_description().c_str(),
              o.cpu_time ? "process CPU time" : "wall-clock time");
  bench_lenet(*backend, o);
  if (o.resnet) bench_resnet(*backend, o);
  return 0;
}
