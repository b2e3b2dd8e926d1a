// How rounding-sensitive is each [cuda][train] test's configuration, and do the tolerances the
// tests derive from it separate correct implementations from bugs? On the CPU alone:
//
//   bench_rounding_sensitivity [--case NAME]... [--threads T] [--worst K] [--factor F]
//                              [--no-scan] [--no-variants]
//
// For each configuration of tests/cuda/test_cuda_train.cpp (dptest::train_case: same model,
// batch, lr, steps, batches, seed; CPU backend, T threads):
//  1. runs the steps from the seed's parameters (the reference);
//  2. scan: reruns every step from the reference's parameters before it, each nudged by +-n ulps
//     (std::nextafter, signs from a seed), n = 1 (three sign patterns), 4, 16, 64, 256, 1024,
//     and prints per step the worst and the median over tensors of the norm-relative update
//     difference ||u'-u||/||u|| and the loss difference; for several steps also free running
//     (the first start nudged, the steps feeding each other), which is why the tests force
//     every step's start;
//  3. the tests' sensitivity per named tensor: the worst over dptest::train_noise_nudges() and
//     train_widening_nudges() (1, 16, 256, 1024 ulps; 20 sign patterns);
//  4. held to the tests' tolerance (dptest::train_tolerance_rule(): factor x sensitivity, with
//     floors), runs that must pass (other correct implementations the CPU offers: another
//     thread count, which sums conv and linear filter gradients over other per-thread
//     partials; 2 or 3 replicas for LeNet; nudges of 8 to 1024 ulps with unseen signs) and
//     deliberate bugs that must fail (learning rate 5 % or 1 % high, one wrong example per
//     batch, one tensor's gradient dropped or doubled, weight decay or momentum ignored), and
//     for how many tensors a dropped gradient would be caught.
// Exit code 1 when a correct run fails or a bug passes. --factor overrides the tests' factor.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "support/train_steps.hpp"

namespace {

using dptest::Sensitivity;
using dptest::StepRun;
using dptest::TrainCase;

struct Options {
  std::vector<std::string> cases;
  int threads = 2;
  double factor = 0;  // 0: the tests' own
  size_t worst = 10;
  bool scan = true;
  bool variants = true;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr,
               "bench_rounding_sensitivity: %s (see the header of "
               "bench/bench_rounding_sensitivity.cpp)\n",
               what.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--case") {
      o.cases.push_back(value());
    } else if (a == "--threads") {
      o.threads = std::atoi(value().c_str());
    } else if (a == "--factor") {
      o.factor = std::atof(value().c_str());
    } else if (a == "--worst") {
      o.worst = static_cast<size_t>(std::atoi(value().c_str()));
    } else if (a == "--no-scan") {
      o.scan = false;
    } else if (a == "--no-variants") {
      o.variants = false;
    } else {
      usage_error("unknown argument " + a);
    }
  }
  if (o.cases.empty()) o.cases = dptest::train_case_names();
  if (o.threads < 1) usage_error("--threads must be >= 1");
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Worst and median over tensors of one step's update differences.
std::pair<double, double> worst_and_median(const std::vector<dptest::TensorError>& e) {
  std::vector<double> v;
  for (const auto& t : e) v.push_back(std::isnan(t.rel_error) ? 1e300 : t.rel_error);
  std::sort(v.begin(), v.end());
  return {v.back(), v[v.size() / 2]};
}

void print_scan(const TrainCase& base, const StepRun& ref) {
  std::printf(
      "  update difference per step after +-n ulp nudges of its starting parameters "
      "(worst / median over %zu tensors; loss):\n",
      ref.spans.size());
  // Sign seeds 101..: none of the tests' own (1..20) nor the judged variants' (1000..).
  const std::vector<dptest::Nudge> ladder = {{1, 101},  {1, 102},  {1, 103},   {4, 104},
                                             {16, 105}, {64, 106}, {256, 107}, {1024, 108}};
  for (const auto& n : ladder) {
    std::vector<std::vector<float>> starts;
    for (size_t s = 0; s < ref.steps(); ++s)
      starts.push_back(dptest::nudge_ulps(ref.before[s], ref.spans, n.seed * 7919 + s, n.ulps));
    const Sensitivity d = dptest::difference_of(dptest::run_case(base, starts), ref);
    std::printf("    %5d ulp (signs %2llu):", n.ulps, static_cast<unsigned long long>(n.seed));
    for (size_t s = 0; s < d.steps.size(); ++s) {
      const auto [w, m] = worst_and_median(d.steps[s].updates);
      std::printf("  step %zu %9.2e / %9.2e; %8.1e", s + 1, w, m, d.steps[s].loss);
    }
    std::printf("\n");
  }
  if (ref.steps() > 1) {
    // Free running: only the first start nudged, the steps feed each other.
    for (uint64_t seed : {11, 12}) {
      const auto start = dptest::nudge_ulps(ref.before[0], ref.spans, seed * 7919, 1);
      const Sensitivity d = dptest::difference_of(dptest::run_case(base, {start}), ref);
      const auto [w, m] = worst_and_median(d.steps.back().updates);
      std::printf(
          "    free running, 1 ulp at the start only (signs %llu): last step %9.2e / "
          "%9.2e; %8.1e\n",
          static_cast<unsigned long long>(seed), w, m, d.steps.back().loss);
    }
  }
}

// The tests' sensitivity per tensor, most sensitive updates first. Tensors whose update is
// below 1e-6 of the largest are listed apart: their update is rounding noise (a conv bias right
// before batch norm gets an exactly-zero gradient in exact arithmetic), so their sensitivity is
// O(1) and says nothing about the configuration.
void print_sensitivity(const StepRun& ref, const Sensitivity& s, size_t worst) {
  for (size_t step = 0; step < s.steps.size(); ++step) {
    const auto& u = s.steps[step].updates;
    const auto& p = s.steps[step].params;
    double largest = 0;
    for (const auto& t : u) largest = std::max(largest, t.norm_expected);
    std::vector<size_t> order;
    std::string noise_only;
    for (size_t i = 0; i < u.size(); ++i) {
      if (u[i].norm_expected < 1e-6 * largest) {
        noise_only += " " + u[i].name;
      } else {
        order.push_back(i);
      }
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return u[a].rel_error > u[b].rel_error; });
    std::vector<double> v;
    for (size_t i : order) v.push_back(u[i].rel_error);
    std::printf(
        "  step %zu: the tests' sensitivity (worst of %d nudges) of the %zu tensors with "
        "a real update: worst %.2e, median %.2e; loss %.2e; the most sensitive:\n",
        step + 1, s.samples, order.size(), v.empty() ? 0.0 : v.front(),
        v.empty() ? 0.0 : v[v.size() / 2], s.steps[step].loss);
    std::printf("    %-36s %9s %11s %11s %11s %11s\n", "tensor", "numel", "||update||", "||param||",
                "d(update)", "d(param)");
    for (size_t k = 0; k < std::min(worst, order.size()); ++k) {
      const size_t i = order[k];
      std::printf("    %-36s %9zu %11.3e %11.3e %11.3e %11.3e\n", u[i].name.c_str(),
                  ref.spans[i].count, u[i].norm_expected, p[i].norm_expected, u[i].rel_error,
                  p[i].rel_error);
    }
    if (!noise_only.empty())
      std::printf("    update below 1e-6 of the largest (noise, sensitivity ~1):%s\n",
                  noise_only.c_str());
  }
}

// A run of the case with edits, forced to the reference's starts.
struct Variant {
  std::string label;
  bool correct = true;  // a correct implementation (must pass) or a bug (must fail)
  std::function<void(TrainCase&)> edit;
  dptest::StepHook hook;
  std::vector<std::vector<float>> starts;  // empty: the reference's
};

Variant variant(std::string label, bool correct, std::function<void(TrainCase&)> edit,
                dptest::StepHook hook = {}) {
  return Variant{std::move(label), correct, std::move(edit), std::move(hook), {}};
}

int run_variants(const TrainCase& base, const StepRun& ref, const Sensitivity& noise,
                 const dptest::ToleranceRule& rule) {
  std::vector<Variant> vs;
  const int other_threads = base.options.cpu_threads == 1 ? 2 : 1;
  vs.push_back(variant(std::to_string(other_threads) + " CPU thread(s) (other summation order)",
                       true, [=](TrainCase& c) { c.options.cpu_threads = other_threads; }));
  if (base.model == "lenet") {
    for (int k : {2, 3})
      vs.push_back(variant(std::to_string(k) + " replicas (gradient summed per shard)", true,
                           [=](TrainCase& c) { c.options.replicas = k; }));
  }
  // Nudges with sign patterns the tests' sensitivity never saw: stand-ins for a correct
  // implementation whose every op differs from the CPU's by ~5e-7 to 6e-5 relative.
  uint64_t seed = 1000;
  for (int ulps : {8, 32, 128, 256, 256, 512, 1024}) {
    Variant v = variant("+-" + std::to_string(ulps) + " ulp nudge, unseen signs", true, {});
    for (size_t s = 0; s < ref.steps(); ++s)
      v.starts.push_back(dptest::nudge_ulps(ref.before[s], ref.spans, seed * 7919 + s, ulps));
    vs.push_back(std::move(v));
    ++seed;
  }
  vs.push_back(
      variant("BUG learning rate 5% high", false, [](TrainCase& c) { c.options.lr.base *= 1.05; }));
  vs.push_back(
      variant("BUG learning rate 1% high", false, [](TrainCase& c) { c.options.lr.base *= 1.01; }));
  vs.push_back(variant("BUG one wrong example per batch", false, [](TrainCase& c) {
    for (auto& b : c.batches) b[0] = (b[0] + 1) % 512;
  }));
  const std::string first_bn = base.model == "resnet18" ? "1.weight" : "0.bias";
  const std::string last = base.model == "resnet18" ? "resnet_block4.1.bn2.bias" : "9.weight";
  for (const auto& [name, scale] :
       std::vector<std::pair<std::string, float>>{{first_bn, 0.0f}, {last, 0.0f}, {last, 2.0f}}) {
    vs.push_back(variant(
        "BUG gradient of " + name + (scale == 0 ? " dropped" : " doubled"), false, {},
        dptest::scale_tensor_update(dptest::span_named(ref.spans, name), scale, &ref.before)));
  }
  if (base.options.optimizer.weight_decay > 0)
    vs.push_back(variant("BUG weight decay ignored", false,
                         [](TrainCase& c) { c.options.optimizer.weight_decay = 0; }));
  if (base.options.optimizer.momentum > 0)
    vs.push_back(
        variant("BUG momentum ignored", false, [](TrainCase& c) { c.options.optimizer.momentum = 0; }));

  std::printf(
      "  held to max(%g x sensitivity, floor) [floors: update %.0e, parameters %.0e, "
      "loss %.0e], every step from the reference's start:\n",
      rule.factor, rule.update_floor, rule.param_floor, rule.loss_floor);
  std::printf("    %-50s %9s %10s %-30s %9s  %s\n", "run", "failed", "worst e/t", "worst tensor",
              "loss e/t", "verdict");
  int wrong = 0;
  for (const auto& v : vs) {
    const auto t0 = std::chrono::steady_clock::now();
    TrainCase c = base;
    if (v.edit) v.edit(c);
    // A run from nudged starts is judged by its updates moved onto the reference's starts.
    const StepRun r = v.starts.empty()
                          ? dptest::run_case(c, ref.before, v.hook)
                          : dptest::rebased(dptest::run_case(c, v.starts, v.hook), ref.before);
    const auto cmp = dptest::compare_steps(r, ref, noise, rule);
    size_t failed = 0, total = 0;
    double worst = 0, loss = 0;
    std::string worst_name;
    for (const auto& st : cmp.steps) {
      for (const auto* rep : {&st.updates, &st.params}) {
        failed += rep->failures;
        total += rep->tensors.size();
        if (rep->tensors.front().excess() > worst) {
          worst = rep->tensors.front().excess();
          worst_name = rep->tensors.front().name;
        }
      }
      loss = std::max(loss, st.loss_tolerance > 0 ? st.loss_error / st.loss_tolerance : 0.0);
    }
    const bool pass = cmp.ok();
    if (pass != v.correct) ++wrong;
    std::printf("    %-50s %4zu/%-4zu %10.3g %-30s %9.3g  %s (%.1f s)\n", v.label.c_str(), failed,
                total, worst, worst_name.c_str(), loss,
                pass ? (v.correct ? "passes" : "PASSES: bug not caught")
                     : (v.correct ? "FAILS: correct run rejected" : "caught"),
                seconds_since(t0));
  }
  // A dropped gradient leaves its tensor's update at zero: relative error 1 in that step. For
  // a tensor whose update is rounding noise (below 1e-6 of the largest) that is no bug at all.
  for (size_t s = 0; s < noise.steps.size(); ++s) {
    const auto& u = noise.steps[s].updates;
    const auto tol = dptest::scaled_tolerances(u, rule.factor, rule.update_floor, 1e300);
    double largest = 0;
    for (const auto& t : u) largest = std::max(largest, t.norm_expected);
    std::string blind;
    size_t real = 0, caught = 0;
    for (size_t i = 0; i < tol.size(); ++i) {
      if (u[i].norm_expected < 1e-6 * largest) continue;
      ++real;
      if (tol[i] < 1.0) {
        ++caught;
      } else {
        blind += " " + u[i].name;
      }
    }
    std::vector<double> sorted;
    for (size_t i = 0; i < tol.size(); ++i)
      if (u[i].norm_expected >= 1e-6 * largest) sorted.push_back(tol[i]);
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "  step %zu: update tolerances of the %zu tensors with a real update: min %.2e, "
        "median %.2e, max %.2e; a dropped gradient is caught for %zu of them%s%s\n",
        s + 1, real, sorted.front(), sorted[sorted.size() / 2], sorted.back(), caught,
        blind.empty() ? "" : "; not for:", blind.c_str());
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // line by line into a log: ResNet-18 takes minutes
  const Options opt = parse(argc, argv);
  if (!dptest::fashion_mnist_subset().ok) usage_error("Fashion-MNIST not found (set DPRUN_DATA)");
  dptest::ToleranceRule rule = dptest::train_tolerance_rule();
  if (opt.factor > 0) rule.factor = opt.factor;
  int wrong = 0;
  for (const auto& name : opt.cases) {
    TrainCase base = dptest::train_case(name);
    base.options.cpu_threads = opt.threads;
    std::printf("\n== %s: %s, batch %lld, lr %g, %zu step(s), CPU backend, %d thread(s)\n",
                name.c_str(), base.model.c_str(), static_cast<long long>(base.options.batch_size),
                static_cast<double>(base.options.lr.base), base.batches.size(), opt.threads);
    auto t0 = std::chrono::steady_clock::now();
    const StepRun ref = dptest::run_case(base);
    std::printf("  reference run: %.1f s, last loss %.6f\n", seconds_since(t0), ref.losses.back());
    if (opt.scan) print_scan(base, ref);
    dptest::RoundingNoise rounding(
        ref, [&](const std::vector<std::vector<float>>& s) { return dptest::run_case(base, s); });
    // The tests widen only when a comparison fails; a verdict under the widened noise is the
    // same (each tolerance is a maximum over the nudges), so the bench widens at once.
    rounding.widen();
    const Sensitivity& noise = rounding.sensitivity();
    print_sensitivity(ref, noise, opt.worst);
    if (opt.variants) wrong += run_variants(base, ref, noise, rule);
  }
  std::printf("\n%s\n", wrong == 0 ? "every correct run passed and every bug was caught"
                                   : "SOME RUNS WERE JUDGED WRONGLY (see above)");
  return wrong == 0 ? 0 : 1;
}
