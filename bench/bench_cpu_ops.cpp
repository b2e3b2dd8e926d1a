// Micro-benchmark of the CPU backend's ops at the shapes of the two models, for each kernel
// selection side by side (oneDNN, im2col + OpenBLAS: see dp::CpuKernels).
//
//   bench_cpu_ops [--threads T] [--reps R] [--batch B] [--resnet-batch B] [--no-resnet]
//                 [--cpu-time] [--kernels both|onednn|blas] [--layout nchw|nhwc]
//
// Part 1 runs one full LeNet training step (batch 256 by default: gather, forward, loss,
// backward, SGD) op by op, R times, and prints the median milliseconds of every op for each
// kernel selection, their sums and the projected epoch time (60000 / batch steps, rounded up).
// Part 2 times the convolution, batch-norm and elementwise ops of the small-image ResNet-18
// (28x28 Fashion-MNIST input) at a smaller batch. The kernel selections take turns op by op
// within every repetition, so a busy machine slows both alike; medians, not means: outliers
// are noise, not the op. On a busy machine, --threads 1 --cpu-time measures each op's
// single-core cost (process CPU time), which other processes cannot inflate; with more threads
// CPU time also counts OpenMP's spin-waiting.
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
  std::vector<dp::CpuKernels> kernels = {dp::CpuKernels::onednn, dp::CpuKernels::blas};
  dp::Layout layout = dp::Layout::nchw;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_cpu_ops [--threads T] [--reps R] [--batch B] [--resnet-batch B] "
               "[--no-resnet] [--cpu-time] [--kernels both|onednn|blas] [--layout nchw|nhwc]\n");
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cpu_ops: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&] { return std::strtol(value().c_str(), nullptr, 10); };
    if (a == "--threads") {
      o.threads = static_cast<int>(number());
    } else if (a == "--reps") {
      o.reps = std::max(1, static_cast<int>(number()));
    } else if (a == "--batch") {
      o.batch = number();
    } else if (a == "--resnet-batch") {
      o.resnet_batch = number();
    } else if (a == "--no-resnet") {
      o.resnet = false;
    } else if (a == "--cpu-time") {
      o.cpu_time = true;
    } else if (a == "--kernels") {
      const std::string k = value();
      if (k == "onednn") {
        o.kernels = {dp::CpuKernels::onednn};
      } else if (k == "blas") {
        o.kernels = {dp::CpuKernels::blas};
      } else if (k != "both") {
        usage();
      }
    } else if (a == "--layout") {
      const std::string l = value();
      if (l != "nchw" && l != "nhwc") usage();
      o.layout = l == "nhwc" ? dp::Layout::nhwc : dp::Layout::nchw;
    } else {
      usage();
    }
  }
  return o;
}

// Backend memory holding tensors; released with the arena.
class Arena {
 public:
  explicit Arena(dp::Backend& b) : b_(b) {}
  ~Arena() {
    for (void* p : owned_) b_.release(p);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  dp::Tensor tensor(dp::Shape s, dp::DType t = dp::DType::f32, float lo = -0.1f, float hi = 0.1f,
                    dp::Layout layout = dp::Layout::nchw) {
    dp::Tensor x(nullptr, s, t, b_.device(), s.rank == 4 ? layout : dp::Layout::nchw);
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

// The ops of one benchmark on one backend, with the memory and plans they use.
struct Suite {
  explicit Suite(dp::Backend& b) : backend(b), arena(b) {}
  dp::Backend& backend;
  Arena arena;
  std::vector<std::unique_ptr<dp::ConvPlan>> plans;
  std::vector<Timed> ops;
  std::vector<double> whole_ms;  // the whole list end to end, without per-op synchronisation
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One warm-up pass per suite, then `reps` repetitions in which the suites take turns op by op
// (the same op on every backend back to back, so a busy moment slows them alike), then the
// whole list end to end per suite.
void run_suites(std::vector<std::unique_ptr<Suite>>& suites, int reps) {
  for (auto& s : suites) {
    for (auto& op : s->ops) op.run();
    s->backend.synchronize();
  }
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < suites.front()->ops.size(); ++i) {
      for (size_t k = 0; k < suites.size(); ++k) {
        Suite& s = *suites[(k + static_cast<size_t>(r)) % suites.size()];
        const double t0 = now_ms();
        s.ops[i].run();
        s.backend.synchronize();
        s.ops[i].ms.push_back(now_ms() - t0);
      }
    }
    for (size_t k = 0; k < suites.size(); ++k) {
      Suite& s = *suites[(k + static_cast<size_t>(r)) % suites.size()];
      const double t0 = now_ms();
      for (auto& op : s.ops) op.run();
      s.backend.synchronize();
      s.whole_ms.push_back(now_ms() - t0);
    }
  }
}

// One row per op: median ms (and GFLOP/s) per kernel selection, and the ratio of the first
// to the last when there are two. Returns the sums of the medians.
std::vector<double> print_table(const std::vector<std::unique_ptr<Suite>>& suites,
                                const std::vector<std::string>& names) {
  std::printf("  %-36s", "op");
  for (const auto& n : names) std::printf(" %10s %7s", (n + " ms").c_str(), "GFLOP/s");
  if (suites.size() == 2) std::printf(" %8s", "ratio");
  std::printf("\n");
  std::vector<double> sums(suites.size(), 0.0);
  for (size_t i = 0; i < suites.front()->ops.size(); ++i) {
    std::printf("  %-36s", suites.front()->ops[i].name.c_str());
    std::vector<double> m;
    for (size_t k = 0; k < suites.size(); ++k) {
      const Timed& op = suites[k]->ops[i];
      m.push_back(median(op.ms));
      sums[k] += m.back();
      if (op.gflop > 0) {
        std::printf(" %10.3f %7.1f", m.back(), op.gflop / (m.back() * 1e-3));
      } else {
        std::printf(" %10.3f %7s", m.back(), "");
      }
    }
    if (suites.size() == 2) std::printf(" %8.2f", m[0] / m[1]);
    std::printf("\n");
  }
  std::printf("  %-36s", "sum");
  for (double s : sums) std::printf(" %10.3f %7s", s, "");
  if (suites.size() == 2) std::printf(" %8.2f", sums[0] / sums[1]);
  std::printf("\n");
  return sums;
}

dp::ConvGeometry conv_geometry(int64_t n, int64_t c, int64_t h, int64_t k, int64_t kernel,
                               int64_t stride, int64_t pad, dp::Layout layout) {
  dp::ConvGeometry g;
  g.max_batch = n;
  g.in_channels = c;
  g.in_h = g.in_w = h;
  g.out_channels = k;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  g.layout = layout;
  return g;
}

double conv_gflop(const dp::ConvGeometry& g, int64_t n) {
  return 2.0 *
         static_cast<double>(n * g.out_channels * g.out_h() * g.out_w() * g.in_channels *
                             g.kernel_h * g.kernel_w) *
         1e-9;
}

// One LeNet training step, op by op, as the trainer runs it.
std::unique_ptr<Suite> lenet_suite(dp::Backend& backend, const Options& o) {
  auto suite = std::make_unique<Suite>(backend);
  Arena& a = suite->arena;
  const int64_t n = o.batch;
  const dp::Layout l = o.layout;
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
  for (auto& v : label_values) v = static_cast<uint8_t>(rng.below(10));
  backend.upload(labels.data, label_values.data(), labels.bytes());
  auto act = [&](dp::Shape s) { return a.tensor(s, dp::DType::f32, -0.1f, 0.1f, l); };
  dp::Tensor x = act({n, 1, 28, 28}), y = a.tensor({n}, dp::DType::i32);

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
  const auto g1 = conv_geometry(n, 1, 28, 20, 3, 1, 0, l);
  const auto g2 = conv_geometry(n, 20, 13, 50, 5, 1, 0, l);
  // As the trainer declares them: the first layer needs no input gradient.
  dp::ConvUse first;
  first.input_grad = false;
  suite->plans.push_back(backend.plan_conv(g1, first));
  suite->plans.push_back(backend.plan_conv(g2));
  dp::ConvPlan* plan1 = suite->plans[0].get();
  dp::ConvPlan* plan2 = suite->plans[1].get();
  dp::PoolGeometry pool;  // 2x2 stride 2
  dp::Tensor c1 = act({n, 20, 26, 26}), p1 = act({n, 20, 13, 13});
  dp::Tensor c2 = act({n, 50, 9, 9}), p2 = act({n, 50, 4, 4});
  dp::Tensor f1 = a.tensor({n, 128}), logits = a.tensor({n, 10});
  dp::Tensor dlogits = a.tensor({n, 10}), df1 = a.tensor({n, 128}), dp2 = a.tensor({n, 800});
  dp::Tensor dc2 = act({n, 50, 9, 9}), dp1 = act({n, 20, 13, 13});
  dp::Tensor dc1 = act({n, 20, 26, 26});
  dp::Tensor loss = a.tensor({1}), correct = a.tensor({1}, dp::DType::i32);
  dp::Tensor flat = p2.reshaped({n, 800});
  flat.layout = dp::Layout::nchw;
  dp::Tensor dp2_image = dp2.reshaped({n, 50, 4, 4});
  dp2_image.layout = l;
  const dp::SgdParams sgd{0.9f, 0.0f, 0.0f};
  const float scale = 1.0f / static_cast<float>(n);
  dp::Backend& b = backend;

  suite->ops = {
      {"gather_batch", [=, &b] { b.gather_batch(images, labels, indices, x, y); }},
      {"conv1 forward 1->20 3x3", [=, &b] { b.conv_forward(*plan1, x, p[0], &p[1], c1); },
       conv_gflop(g1, n)},
      {"relu1 forward", [=, &b] { b.relu_forward(c1, c1); }},
      {"avgpool1 forward", [=, &b] { b.avgpool_forward(pool, c1, p1); }},
      {"conv2 forward 20->50 5x5", [=, &b] { b.conv_forward(*plan2, p1, p[2], &p[3], c2); },
       conv_gflop(g2, n)},
      {"relu2 forward", [=, &b] { b.relu_forward(c2, c2); }},
      {"avgpool2 forward", [=, &b] { b.avgpool_forward(pool, c2, p2); }},
      {"fc1 forward 800->128", [=, &b] { b.linear_forward(flat, p[4], &p[5], f1); },
       2e-9 * static_cast<double>(n * 800 * 128)},
      {"relu3 forward", [=, &b] { b.relu_forward(f1, f1); }},
      {"fc2 forward 128->10", [=, &b] { b.linear_forward(f1, p[6], &p[7], logits); }},
      {"softmax_cross_entropy",
       [=, &b] { b.softmax_cross_entropy(logits, y, scale, dlogits, loss, correct); }},
      {"fc2 backward", [=, &b] { b.linear_backward(f1, p[6], dlogits, &df1, g[6], &g[7]); }},
      {"relu3 backward", [=, &b] { b.relu_backward(f1, df1, df1); }},
      {"fc1 backward", [=, &b] { b.linear_backward(flat, p[4], df1, &dp2, g[4], &g[5]); },
       4e-9 * static_cast<double>(n * 800 * 128)},
      {"avgpool2 backward", [=, &b] { b.avgpool_backward(pool, dp2_image, dc2); }},
      {"relu2 backward", [=, &b] { b.relu_backward(c2, dc2, dc2); }},
      {"conv2 backward data", [=, &b] { b.conv_backward_data(*plan2, dc2, p[2], dp1); },
       conv_gflop(g2, n)},
      {"conv2 backward filter", [=, &b] { b.conv_backward_filter(*plan2, p1, dc2, g[2], &g[3]); },
       conv_gflop(g2, n)},
      {"avgpool1 backward", [=, &b] { b.avgpool_backward(pool, dp1, dc1); }},
      {"relu1 backward", [=, &b] { b.relu_backward(c1, dc1, dc1); }},
      {"conv1 backward filter", [=, &b] { b.conv_backward_filter(*plan1, x, dc1, g[0], &g[1]); },
       conv_gflop(g1, n)},
      {"sgd_update (129k params, momentum)",
       [=, &b] { b.sgd_update(params, grads, &momentum, sgd); }},
  };
  return suite;
}

// The distinct convolutions of the small-image ResNet-18 (d2l, 28x28, 1 input channel), each
// pass, and its batch norm, ReLU and residual add at the first stage's size.
std::unique_ptr<Suite> resnet_suite(dp::Backend& backend, const Options& o) {
  auto suite = std::make_unique<Suite>(backend);
  Arena& a = suite->arena;
  const int64_t n = o.resnet_batch;
  const dp::Layout l = o.layout;
  auto act = [&](dp::Shape s) { return a.tensor(s, dp::DType::f32, -0.1f, 0.1f, l); };
  struct Layer {
    const char* name;
    int64_t c, h, k, kernel, stride, pad;
  };
  const Layer layers[] = {
      {"stem 1->64 3x3 28x28", 1, 28, 64, 3, 1, 1},
      {"b1 64->64 3x3 28x28", 64, 28, 64, 3, 1, 1},
      {"b2 64->128 3x3 s2 28->14", 64, 28, 128, 3, 2, 1},
      {"b2 128->128 3x3 14x14", 128, 14, 128, 3, 1, 1},
      {"b2 shortcut 64->128 1x1 s2", 64, 28, 128, 1, 2, 0},
      {"b3 256->256 3x3 7x7", 256, 7, 256, 3, 1, 1},
      {"b4 512->512 3x3 4x4", 512, 4, 512, 3, 1, 1},
  };
  dp::Backend& b = backend;
  for (const Layer& layer : layers) {
    const auto geo =
        conv_geometry(n, layer.c, layer.h, layer.k, layer.kernel, layer.stride, layer.pad, l);
    suite->plans.push_back(backend.plan_conv(geo));
    dp::ConvPlan* plan = suite->plans.back().get();
    const dp::Tensor x = act({n, layer.c, layer.h, layer.h});
    const dp::Tensor w = a.tensor({layer.k, layer.c, layer.kernel, layer.kernel});
    const dp::Tensor y = act({n, layer.k, geo.out_h(), geo.out_w()});
    const dp::Tensor dx = act({n, layer.c, layer.h, layer.h});
    const dp::Tensor dw = a.tensor({layer.k, layer.c, layer.kernel, layer.kernel});
    const double gf = conv_gflop(geo, n);
    const std::string name = layer.name;
    suite->ops.push_back({name + " fwd", [=, &b] { b.conv_forward(*plan, x, w, nullptr, y); }, gf});
    suite->ops.push_back(
        {name + " bwd data", [=, &b] { b.conv_backward_data(*plan, y, w, dx); }, gf});
    suite->ops.push_back(
        {name + " bwd filter", [=, &b] { b.conv_backward_filter(*plan, x, y, dw, nullptr); }, gf});
  }
  const dp::Tensor bx = act({n, 64, 28, 28}), by = act({n, 64, 28, 28});
  const dp::Tensor gamma = a.tensor({64}), beta = a.tensor({64}), rm = a.tensor({64});
  const dp::Tensor rv = a.tensor({64}, dp::DType::f32, 0.5f, 1.5f), sm = a.tensor({64}),
                   si = a.tensor({64}), dgamma = a.tensor({64}), dbeta = a.tensor({64});
  suite->ops.push_back(
      {"bn 64x28x28 train fwd",
       [=, &b] { b.batchnorm_forward_train(bx, gamma, beta, rm, rv, 0.1f, 1e-5f, sm, si, by); }});
  suite->ops.push_back({"bn 64x28x28 bwd", [=, &b] {
                          b.batchnorm_backward(bx, by, gamma, sm, si, 1e-5f, bx, dgamma, dbeta);
                        }});
  suite->ops.push_back({"relu 64x28x28 fwd", [=, &b] { b.relu_forward(by, by); }});
  suite->ops.push_back({"relu 64x28x28 bwd", [=, &b] { b.relu_backward(by, bx, bx); }});
  suite->ops.push_back({"add 64x28x28", [=, &b] { b.add(bx, by, by); }});
  // A residual block's bn2 -> + shortcut -> ReLU, fused into one pass (BnEpilogue) and as the
  // three separate ops, side by side; and its backward (ReLU mask + batch norm backward).
  const dp::Tensor br = act({n, 64, 28, 28}), bz = act({n, 64, 28, 28}), bdz = act({n, 64, 28, 28}),
                   bdx = act({n, 64, 28, 28});
  suite->ops.push_back(
      {"bn+add+relu 64x28x28 train fwd fused", [=, &b] {
         b.batchnorm_forward_train(bx, gamma, beta, rm, rv, 0.1f, 1e-5f, sm, si, bz, {&br, true});
       }});
  suite->ops.push_back({"bn+add+relu 64x28x28 train fwd separate", [=, &b] {
                          b.batchnorm_forward_train(bx, gamma, beta, rm, rv, 0.1f, 1e-5f, sm, si,
                                                    bz);
                          b.add(bz, br, bz);
                          b.relu_forward(bz, bz);
                        }});
  suite->ops.push_back({"bn+relu 64x28x28 bwd separate", [=, &b] {
                          b.relu_backward(bz, by, bdz);
                          b.batchnorm_backward(bx, bdz, gamma, sm, si, 1e-5f, bdx, dgamma, dbeta);
                        }});
  suite->ops.push_back(
      {"bn+relu 64x28x28 bwd fused", [=, &b] {
         b.batchnorm_backward(bx, by, gamma, sm, si, 1e-5f, bdx, dgamma, dbeta, {&bz, &bdz});
       }});
  return suite;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  g_cpu_time = o.cpu_time;
  std::vector<std::unique_ptr<dp::Backend>> backends;
  std::vector<std::string> names;
  for (const dp::CpuKernels k : o.kernels) {
    dp::BackendOptions bo;
    bo.kind = dp::BackendKind::cpu;
    bo.cpu_threads = o.threads;
    bo.cpu_kernels = k;
    backends.push_back(dp::create_backend(bo));
    names.push_back(dp::cpu_kernels_name(k));
    std::printf("%-7s %s: %s\n", names.back().c_str(), dp::cpu_kernels(k).c_str(),
                backends.back()->device_description().c_str());
  }
  std::printf("layout %s, timing %s\n\n", dp::layout_name(o.layout),
              o.cpu_time ? "process CPU time" : "wall-clock time");

  std::vector<std::unique_ptr<Suite>> lenet;
  for (auto& b : backends) lenet.push_back(lenet_suite(*b, o));
  run_suites(lenet, o.reps);
  std::printf("LeNet training step, batch %lld, op by op (median of %d):\n",
              static_cast<long long>(o.batch), o.reps);
  const std::vector<double> sums = print_table(lenet, names);
  const int64_t steps = (60000 + o.batch - 1) / o.batch;
  for (size_t k = 0; k < lenet.size(); ++k) {
    const double whole = median(lenet[k]->whole_ms);
    std::printf(
        "  %-7s projected epoch (%lld steps): %.2f s from the op sum, %.2f s from the "
        "whole step (%.3f ms)\n",
        names[k].c_str(), static_cast<long long>(steps),
        sums[k] * static_cast<double>(steps) * 1e-3, whole * static_cast<double>(steps) * 1e-3,
        whole);
  }
  std::printf("\n");
  lenet.clear();

  if (o.resnet) {
    std::vector<std::unique_ptr<Suite>> resnet;
    for (auto& b : backends) resnet.push_back(resnet_suite(*b, o));
    run_suites(resnet, o.reps);
    std::printf("ResNet-18 (28x28) layers, batch %lld (median of %d):\n",
                static_cast<long long>(o.resnet_batch), o.reps);
    print_table(resnet, names);
  }
  return 0;
}
