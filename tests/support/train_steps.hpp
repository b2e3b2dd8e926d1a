#pragma once
// Whole training steps for comparisons: running SGD steps through dp::Trainer from given
// parameters, measuring how far rounding-level nudges of those parameters move each step (the
// configuration's rounding sensitivity), and comparing two runs tensor by tensor with
// tolerances derived from that sensitivity.
//
// Why: batch norm and ReLU make a network's step a rough function of its inputs. One rounding
// in any op flips ReLU masks near zero, batch norm rescales what flows through (1/sigma ~ 70 at
// ResNet-18's first BN with N(0, 0.01^2) weights), and two correct implementations end a step
// further apart than "float tolerance"; after a second step that difference is fed back and
// grows (see bench/bench_rounding_sensitivity). So a comparison
//   - starts every step of the run under test from the reference's parameters before that step
//     (Trainer::set_parameters), so that differences do not compound over steps; and
//   - holds each named tensor's update and end point to factor x the sensitivity measured for
//     the same configuration at the same parameters (see train_tolerance_rule()).
// The configurations live here too, so the bench and the CPU tests measure exactly what the
// [cuda][train] tests run.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dp/data.hpp"
#include "dp/plugin.hpp"
#include "dp/trainer.hpp"
#include "support/param_compare.hpp"

namespace dptest {

/// One run: per step, the parameters before and after it and its mean loss.
struct StepRun {
  std::vector<NamedSpan> spans;                   // the model's parameter tensors
  std::vector<float> initial;                     // the trainer's own, from the options' seed
  std::vector<std::vector<float>> before, after;  // [step] flat parameters
  std::vector<double> losses;                     // [step]
  bool replicas_agree = true;  // every replica ended each step with replica 0's parameters
  size_t steps() const { return losses.size(); }
  std::vector<float> update(size_t step) const { return difference(after[step], before[step]); }
};

/// Called after every step (0-based) before its result is recorded, e.g. to emulate a bug.
using StepHook = std::function<void(dp::Trainer& trainer, size_t step)>;

/// Runs the global batches (example indices into `train`; `test` is only uploaded) through a
/// fresh Trainer. `starts` empty: from the options' seed, each step from where the last ended
/// (free running). `starts` of one vector: from it, then free running. One per step: step s
/// starts from starts[s] (forced), whatever the previous step produced; momentum and BN
/// buffers carry over as in free running.
StepRun run_steps(const dp::TrainerOptions& options, const dp::ModelBuilder& builder,
                  const dp::Dataset& train, const dp::Dataset& test,
                  const std::vector<std::vector<int32_t>>& batches,
                  const std::vector<std::vector<float>>& starts = {},
                  const StepHook& after_step = {});

/// `run`'s updates moved onto other starting parameters: step s becomes starts[s] -> starts[s] +
/// run.update(s). Compares a run from nudged starts like a run from the reference's own.
StepRun rebased(const StepRun& run, const std::vector<std::vector<float>>& starts);

/// A deliberate bug for tests of the tests: after every step, the update of `span` is scaled by
/// `scale` (0: its gradient dropped, 2: counted twice). Step s must have started from starts[s].
StepHook scale_tensor_update(const NamedSpan& span, float scale,
                             const std::vector<std::vector<float>>* starts);
/// The span of the tensor called `name` (throws std::invalid_argument listing none).
const NamedSpan& span_named(const std::vector<NamedSpan>& spans, const std::string& name);

/// A rounding-level perturbation: every nonzero parameter moved `ulps` ulps, signs from `seed`.
struct Nudge {
  int ulps = 1;
  uint64_t seed = 1;
};

/// How far one run of a configuration is from another, per step: per tensor the norm-relative
/// difference of the update and of the parameters after the step, and of the loss. The
/// parameters are compared as if both had started the step from the reference's parameters
/// (reference.before + other's update vs reference.after), so that a nudged start measures how
/// far the step's arithmetic moves the end point, not the nudge itself. As a sensitivity: the
/// worst over several nudged runs.
struct StepDifference {
  std::vector<TensorError> params, updates;
  double loss = 0;  // |loss' - loss| / |loss|
};
struct Sensitivity {
  std::vector<StepDifference> steps;
  int samples = 0;
};
/// The difference of `other` from `reference` (same configuration and steps).
Sensitivity difference_of(const StepRun& other, const StepRun& reference);
/// Worst of two, tensor by tensor and step by step (NaN is the worst).
Sensitivity worst_of(const Sensitivity& a, const Sensitivity& b);

/// `rerun(starts)` runs the configuration again, forced to start each step from starts[s].
using Rerun = std::function<StepRun(const std::vector<std::vector<float>>& starts)>;
/// The sensitivity of a configuration at the parameters a run visited: for each nudge, reruns
/// every step of `base` from its starting parameters nudged, and takes the worst difference
/// from `base` over the nudges. `base` must be a run by `rerun`'s implementation forced to (or
/// free running through) the same starts, so that only the nudges differ.
Sensitivity measure_sensitivity(const StepRun& base, const Rerun& rerun,
                                const std::vector<Nudge>& nudges);

/// Tolerance of a comparison: per tensor and for the loss, max(factor x sensitivity, floor).
struct ToleranceRule {
  double factor = 0;
  double param_floor = 0, update_floor = 0, loss_floor = 0;
};

/// The rule and the nudges of the [cuda][train] tests; train_steps.cpp says how they were chosen
/// and bench/bench_rounding_sensitivity reproduces the numbers behind them. The widening nudges
/// are measured only when a comparison fails under the first ones (see RoundingNoise).
ToleranceRule train_tolerance_rule();
std::vector<Nudge> train_noise_nudges();
std::vector<Nudge> train_widening_nudges();

/// Two runs of one configuration compared step by step under derived tolerances.
struct StepComparison {
  struct Step {
    TensorReport params, updates;
    double loss_error = 0, loss_tolerance = 0;
    bool same_start = true;  // both started the step from bit-identical parameters
    bool ok() const;
  };
  std::vector<Step> steps;
  bool ok() const;
  /// Every step's verdict; failed steps list their `worst` tensors by name.
  std::string message(size_t worst = 8) const;
};
StepComparison compare_steps(const StepRun& actual, const StepRun& expected,
                             const Sensitivity& noise, const ToleranceRule& rule);

/// The rounding noise of one configuration at the starts of one run, and the tests' verdict.
/// Measures train_noise_nudges() at construction; judge() compares under train_tolerance_rule()
/// and, when that fails, first widens the measurement with train_widening_nudges() and compares
/// again. The verdict is the rule's over all the nudges (a pass under fewer nudges is a pass
/// under more: each tolerance is a maximum over them); widening lazily only saves the reruns
/// when nothing fails. It matters because ReLU and max-pool flips are discrete: a flip that a
/// correct implementation triggers may be missed by a few sign patterns.
class RoundingNoise {
 public:
  /// `base`: a run by `rerun`'s implementation, whose starts the nudged reruns begin from.
  RoundingNoise(StepRun base, Rerun rerun);
  const StepRun& base() const { return base_; }
  const Sensitivity& sensitivity() const { return noise_; }
  bool widened() const { return widened_; }
  void widen();
  StepComparison judge(const StepRun& actual, const StepRun& expected);

 private:
  StepRun base_;
  Rerun rerun_;
  Sensitivity noise_;
  bool widened_ = false;
};

/// A [cuda][train] test's configuration: model, trainer settings (backend: cpu; the caller
/// changes it) and the global batches of its steps over the first 512 Fashion-MNIST images.
struct TrainCase {
  std::string name;  // "resnet18-b16-1step"
  std::string model;
  dp::ModelOptions model_options;
  dp::TrainerOptions options;
  std::vector<std::vector<int32_t>> batches;
};
/// The configurations of tests/cuda/test_cuda_train.cpp, by name (train_case_names()).
TrainCase train_case(const std::string& name);
std::vector<std::string> train_case_names();
/// A fixed, scrambled selection of n of the 512 examples (not 0..n-1, so shards see mixed
/// classes).
std::vector<int32_t> batch_indices(int64_t n, int64_t offset = 0);

/// A builder of a plugin model: libdprun_<model>.so from $DPRUN_PLUGIN_DIR (the GPU machine),
/// else the build tree's plugin folder. The library stays loaded until the process ends.
dp::ModelBuilder plugin_builder(const std::string& model, const dp::ModelOptions& options = {});

/// What a whole fit() of a trainer left: every epoch's report, replica 0's parameters and
/// buffers, the memory plan's figures and the backend's peak of allocated bytes.
struct FitRun {
  std::vector<dp::EpochReport> reports;
  std::vector<float> params, buffers;
  dp::Arena::PlanStats plan;
  size_t peak = 0;
};
FitRun fit_run(const dp::TrainerOptions& o, const dp::ModelBuilder& builder,
               const dp::Dataset& train, const dp::Dataset& test);

/// The first 512 training and 256 test images of Fashion-MNIST ($DPRUN_DATA honoured), loaded
/// once; `ok` false when the data is not installed.
struct TrainSubset {
  dp::Dataset train, test;
  bool ok = false;
};
const TrainSubset& fashion_mnist_subset();

/// precision = "bf16"'s training configuration: LeNet (init_std 0.1), batch 64, lr 0.2, two
/// steps, bf16 (cpu backend; the caller changes it). Compared free running, not through
/// RoundingNoise: parameter nudges of up to 1024 fp32 ulps rarely move a bf16 rounding, so they
/// would not measure the one-bf16-ulp flips that another summation order causes.
TrainCase bf16_train_case();
/// How far a free-running run ends from a reference run of the same configuration: the final
/// parameters and the total update (norm-relative over all parameters) and the worst relative
/// difference of a step's loss.
struct RunDistance {
  double params = 0, update = 0, loss = 0;
  std::string str() const;
};
RunDistance run_distance(const StepRun& run, const StepRun& reference);
/// The bounds of a bf16 run against another correct implementation of bf16_train_case() (another
/// summation order); train_steps.cpp says where they come from.
RunDistance bf16_run_bounds();

/// A run of a case's configuration on the subset (options.backend as set in `c`).
StepRun run_case(const TrainCase& c, const std::vector<std::vector<float>>& starts = {},
                 const StepHook& after_step = {});

}  // namespace dptest
