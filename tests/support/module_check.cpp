// The module checkers declared in module_check.hpp.
#include "support/module_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

#include "dp/error.hpp"
#include "dp/random.hpp"

namespace dptest {

std::vector<dp::BackendKind> available_backends() {
  std::vector<dp::BackendKind> kinds{dp::BackendKind::cpu};
  if (dp::cuda_compiled() && dp::cuda_device_count() > 0) {
    kinds.push_back(dp::BackendKind::cuda);
  } else if (const char* req = std::getenv("DPRUN_REQUIRE_CUDA");
             req != nullptr && *req != '\0' && std::string(req) != "0") {
    // On the GPU machine (scripts/gpu-check sets it) a CUDA pass that does not run is a failure,
    // never a silent CPU-only pass.
    FAIL("DPRUN_REQUIRE_CUDA is set but the CUDA pass cannot run: "
         << (dp::cuda_compiled() ? "no CUDA device is visible" : "this build has no CUDA backend"));
  }
  return kinds;
}

ModuleRunner::ModuleRunner(std::unique_ptr<dp::Module> module, dp::Shape input, uint64_t seed,
                           dp::BackendKind kind, dp::Layout layout)
    : kind_(kind), layout_(layout), module_(std::move(module)), input_(input) {
  dp::BackendOptions bo;
  bo.kind = kind;
  bo.cpu_threads = 1;
  bo.allow_tf32 = false;  // finite differences and the CPU oracle need exact fp32
  backend_ = dp::create_backend(bo);
  arena_ = std::make_unique<dp::Arena>(*backend_);
  registry_.set_layout(layout);  // as the trainer does: NHWC convolutions' weights (K, R, S, C)
  module_->declare(registry_, "");
  registry_.allocate(*backend_);
  registry_.initialize(seed);
  dp::SetupContext ctx{*backend_, *arena_, registry_, layout, {}, {}, true};
  const dp::Shape out = module_->setup(ctx, input);
  // Twice the setup batch, so tests can hand the module a too-large batch and see its error.
  x_ = arena_->allocate(input.with_batch(2 * input[0]), dp::DType::f32,
                        input.rank == 4 ? layout : dp::Layout::nchw);
  dy_ = arena_->allocate(out.with_batch(2 * out[0]), dp::DType::f32,
                         out.rank == 4 ? layout : dp::Layout::nchw);
}

ModuleRunner::~ModuleRunner() {
  // The module holds plans and views into the arena: it goes first, the backend last.
  module_.reset();
  arena_.reset();
}

std::vector<float> ModuleRunner::grads() const {
  std::vector<float> g(registry_.parameter_floats());
  if (!g.empty()) backend_->download(g.data(), registry_.grads_flat().data, g.size() * 4);
  return registry_.params_in_reading_order(std::move(g));
}

std::vector<float> ModuleRunner::forward(const std::vector<float>& x, bool training) {
  const int64_t per = input_.per_example();
  DP_CHECK(static_cast<int64_t>(x.size()) % per == 0, "ModuleRunner: bad input size");
  const dp::Tensor xt = x_.with_batch(static_cast<int64_t>(x.size()) / per);
  backend_->upload(xt.data, x.data(), x.size() * sizeof(float));
  dp::RunContext ctx{*backend_, registry_, training, nullptr, 0, nullptr};
  const dp::Tensor y = module_->forward(ctx, xt);
  std::vector<float> out(static_cast<size_t>(y.numel()));
  backend_->download(out.data(), y.data, y.bytes());
  return out;
}

std::vector<float> ModuleRunner::backward(const std::vector<float>& dy) {
  const int64_t per = dy_.shape.per_example();
  DP_CHECK(static_cast<int64_t>(dy.size()) % per == 0, "ModuleRunner: bad gradient size");
  const dp::Tensor dyt = dy_.with_batch(static_cast<int64_t>(dy.size()) / per);
  backend_->upload(dyt.data, dy.data(), dy.size() * sizeof(float));
  dp::RunContext ctx{*backend_, registry_, true, nullptr, 0, nullptr};
  const dp::Tensor dx = module_->backward(ctx, dyt, true);
  std::vector<float> out(static_cast<size_t>(dx.numel()));
  backend_->download(out.data(), dx.data, dx.bytes());
  return out;
}

void randomize_trainable(ModuleRunner& run, uint64_t seed, float scale) {
  std::vector<float> p = run.params();
  dp::Rng rng(seed);
  for (const auto& e : run.registry().entries()) {
    if (!e.trainable) continue;
    for (int64_t i = 0; i < e.shape.numel(); ++i)
      p[e.offset + static_cast<size_t>(i)] = scale * (2 * rng.uniform() - 1);
  }
  run.set_params(p);
}

std::vector<float> entry_values(const dp::ParamRegistry& registry, const std::vector<float>& flat,
                                const std::string& name) {
  for (const auto& e : registry.entries())
    if (e.name == name) {
      const auto begin = flat.begin() + static_cast<std::ptrdiff_t>(e.offset);
      return {begin, begin + e.shape.numel()};
    }
  throw dp::Error("entry_values: the registry has no entry " + name);
}

namespace {

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<float> to_float(const std::vector<double>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
  return out;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

using Loss = std::function<double(const std::vector<double>&)>;

// Counts a coordinate as a kink (and skips it) when central differences with step h and h/2
// disagree: the function itself is not smooth there.
std::function<bool(const std::vector<double>&, int64_t)> kink_detector(const Loss& f,
                                                                       const Tolerance& tol,
                                                                       int64_t& skipped) {
  return [&f, tol, &skipped](const std::vector<double>& x, int64_t i) {
    std::vector<double> xp = x;
    const auto k = static_cast<size_t>(i);
    auto central = [&](double h) {
      xp[k] = x[k] + h;
      const double a = f(xp);
      xp[k] = x[k] - h;
      const double b = f(xp);
      xp[k] = x[k];
      return (a - b) / (2 * h);
    };
    const double d1 = central(tol.step), d2 = central(tol.step / 2);
    const bool kink = std::fabs(d1 - d2) > tol.abs * std::max(1.0, std::fabs(d1));
    if (kink) ++skipped;
    return kink;
  };
}

// 3% of the coordinates checked, and at least 4: a small network's parameters are a few dozen
// (the budget used to count the padding of the flat buffer too, which allowed as much).
int64_t kink_budget(size_t n) { return std::max<int64_t>(4, static_cast<int64_t>(n) * 3 / 100); }

}  // namespace

void check_module_gradients(ModuleRunner& run, const std::vector<float>& x, const Tolerance& tol,
                            bool training) {
  const char* backend = dp::backend_kind_name(run.kind());
  const std::vector<float> params = run.params();
  const std::vector<float> y = run.forward(x, training);
  const std::vector<float> r = random_vector(static_cast<int64_t>(y.size()), 4242);
  const std::vector<float> dx = run.backward(r);
  const std::vector<float> grads = run.grads();
  GradCheckOptions opt;
  opt.step = tol.step;
  opt.rel_tol = tol.rel;
  opt.abs_tol = tol.abs;

  const Loss f_x = [&](const std::vector<double>& xd) {
    return dot(run.forward(to_float(xd), training), r);
  };
  int64_t skipped = 0;
  if (tol.detect_kinks) opt.kink = kink_detector(f_x, tol, skipped);
  const auto cx = check_gradient(f_x, to_double(x), to_double(dx), opt);
  INFO(backend << " dx: " << cx.message);
  CHECK(cx.ok);
  CHECK(skipped <= kink_budget(x.size()));

  // Each named tensor on its own: a failure names the tensor, and the padding between tensors
  // costs no function evaluations.
  std::vector<bool> in_tensor(params.size(), false);
  size_t trainable = 0;
  skipped = 0;
  for (const auto& e : run.registry().entries()) {
    if (!e.trainable) continue;
    const size_t n = static_cast<size_t>(e.shape.numel());
    trainable += n;
    std::fill(in_tensor.begin() + static_cast<std::ptrdiff_t>(e.offset),
              in_tensor.begin() + static_cast<std::ptrdiff_t>(e.offset + n), true);
    const Loss f_p = [&](const std::vector<double>& values) {
      std::vector<float> p = params;
      for (size_t i = 0; i < n; ++i) p[e.offset + i] = static_cast<float>(values[i]);
      run.set_params(p);
      return dot(run.forward(x, training), r);
    };
    if (tol.detect_kinks) opt.kink = kink_detector(f_p, tol, skipped);
    const auto cp = check_gradient(f_p, to_double(entry_values(run.registry(), params, e.name)),
                                   to_double(entry_values(run.registry(), grads, e.name)), opt);
    run.set_params(params);
    INFO(backend << " gradient of " << e.name << " " << e.shape.str() << ": " << cp.message);
    CHECK(cp.ok);
  }
  CHECK(skipped <= kink_budget(trainable));
  int64_t nonzero_padding = 0;
  for (size_t i = 0; i < grads.size(); ++i)
    if (!in_tensor[i] && grads[i] != 0.0f) ++nonzero_padding;
  INFO(backend << ": gradient padding between tensors must stay zero");
  CHECK(nonzero_padding == 0);
}

void check_against_cpu(ModuleRunner& run, const std::function<std::unique_ptr<dp::Module>()>& make,
                       const std::vector<float>& x, double rel_tol, bool training) {
  const bool nhwc = run.layout() == dp::Layout::nhwc;
  if (run.kind() == dp::BackendKind::cpu && !nhwc) return;
  const std::string backend = std::string(dp::backend_kind_name(run.kind())) + " " +
                              dp::layout_name(run.layout());
  // Host vectors of rank-4 activations are in each runner's own layout: the oracle's are NCHW.
  const auto to_oracle = [nhwc](const std::vector<float>& v, const dp::Shape& s) {
    return nhwc && s.rank == 4 ? to_nchw(v, s[0], s[1], s[2], s[3]) : v;
  };
  const auto from_oracle = [nhwc](const std::vector<float>& v, const dp::Shape& s) {
    return nhwc && s.rank == 4 ? to_nhwc(v, s[0], s[1], s[2], s[3]) : v;
  };
  ModuleRunner cpu(make(), run.input(), 1, dp::BackendKind::cpu, dp::Layout::nchw);
  cpu.set_params(run.params());
  cpu.registry().upload_buffers(run.registry().download_buffers());
  auto check = [&](const std::string& what, const std::vector<float>& actual,
                   const std::vector<float>& expected) {
    const Comparison c = compare(actual, expected, rel_tol);
    INFO(backend << " against cpu nchw, " << what << ": " << c.message);
    CHECK(c.ok);
  };
  const int64_t batch = static_cast<int64_t>(x.size()) / run.input().per_example();
  const dp::Shape in = run.input().with_batch(batch), out = run.output().with_batch(batch);
  const std::vector<float> y = run.forward(x, training);
  check("output", y, from_oracle(cpu.forward(to_oracle(x, in), training), out));
  const std::vector<float> dy = random_vector(static_cast<int64_t>(y.size()), 77);
  check("dx", run.backward(dy), from_oracle(cpu.backward(to_oracle(dy, out)), in));
  const std::vector<float> grads = run.grads(), oracle = cpu.grads();
  for (const auto& e : run.registry().entries()) {
    if (!e.trainable) continue;
    check("gradient of " + e.name, entry_values(run.registry(), grads, e.name),
          entry_values(cpu.registry(), oracle, e.name));
  }
  // Training-mode forward updates buffers (BN running statistics): they must agree too.
  const std::vector<float> buffers = run.registry().download_buffers();
  const std::vector<float> oracle_buffers = cpu.registry().download_buffers();
  for (const auto& e : run.registry().entries()) {
    if (e.trainable) continue;
    check("buffer " + e.name, entry_values(run.registry(), buffers, e.name),
          entry_values(cpu.registry(), oracle_buffers, e.name));
  }
}

}  // namespace dptest
