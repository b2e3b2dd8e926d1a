#pragma once
// The optimizer unit: what an update does to the flat parameter buffer, which state it keeps,
// and the learning rate of every step. Optimizers are created by name from one explicit table
// (optimizer_table(): no static-initialiser registry that a static library could drop); each
// update is one fused backend op over the whole flat buffer (Backend::sgd_update,
// Backend::adamw_update, with CPU and CUDA twins).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "dp/tensor.hpp"

namespace dp {

/// Everything that defines an optimizer's update except the learning rate (which the schedule
/// gives per step). Each optimizer reads its own fields.
struct OptimizerOptions {
  std::string name = "sgd";   // a row of optimizer_table(): "sgd", "adamw"
  float weight_decay = 0.0f;  // sgd: L2 added to the gradient; adamw: decoupled decay
  float momentum = 0.0f;      // sgd
  bool nesterov = false;      // sgd (needs momentum > 0)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  /// How many flat state buffers (each as long as the parameter buffer) the optimizer keeps:
  /// sgd 1 with momentum, else 0; adamw 2 (exp_avg, exp_avg_sq). Zeroed at the start.
  virtual int state_buffers() const = 0;
  /// The state buffers' names, as PyTorch's optimizer state calls them ("momentum_buffer";
  /// "exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;

  // One update of params (flat) from grads, with what changes from step to step (the learning
  // rate, the update count from 1 for AdamW's bias correction) read from device memory when it
  // runs (a StepRow), so a captured training step replays as every step
  // (Backend::begin_capture). `state` holds state_buffers() tensors.
  /// How many f32 scalars one update reads: sgd 1 (the learning rate), adamw 3 (AdamWStep).
  virtual int step_scalars() const = 0;
  /// Writes step_scalars() floats: those of the update with learning rate lr at count `step`.
  virtual void fill_step_scalars(float lr, int64_t step, float* row) const = 0;
  /// The update with the scalars of row `scalars` (table (steps, step_scalars()) f32 filled by
  /// fill_step_scalars): the backend's sgd_update / adamw_update with that row's lr and step.
  /// params_bf16 (or null): the parameters' packed bf16 copy, written in the same pass
  /// (ParamRegistry::params_bf16_flat).
  virtual void update_at(Backend& backend, const Tensor& params, const Tensor& grads,
                         const std::vector<Tensor>& state, const StepRow& scalars,
                         const Tensor* params_bf16 = nullptr) = 0;
};

/// The per-step scalars of one AdamW update (dp::AdamWStep, backend.hpp), as every backend and
/// the optimizer compute them: double powers, then float.
AdamWStep adamw_step(const AdamWParams& p);

/// A row of the optimizer table.
struct OptimizerEntry {
  const char* name;
  const char* description;
  std::unique_ptr<Optimizer> (*make)(const OptimizerOptions& options);
};
const std::vector<OptimizerEntry>& optimizer_table();
/// The names of optimizer_table()'s rows, in its order.
const std::vector<std::string>& optimizer_names();
/// The optimizer of options.name; throws dp::Error listing the known names otherwise, or when
/// the options do not fit it (nesterov without momentum).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options);

/// The learning rate of every step (per step, not per epoch): an optional linear warm-up over
/// the first warmup_epochs, from base / (warm-up steps) up to base, then one of
///   constant  base;
///   step      base * gamma^floor(epoch / step_epochs), epoch counted from the start of training
///             (0-based, from the step's position);
///   cosine    base * (1 + cos(pi * p)) / 2 with p = (t - warm-up steps) / (steps after the
///             warm-up): PyTorch's CosineAnnealingLR with T_max = those steps, stepped per step.
struct LrSchedule {
  enum class Kind { constant, step, cosine };
  Kind kind = Kind::constant;
  double base = 0.1;
  double warmup_epochs = 0;  // may be fractional
  int64_t step_epochs = 30;
  double gamma = 0.1;

  /// The learning rate of step t (0-based) of a run of `epochs` epochs of steps_per_epoch.
  double at(int64_t t, int64_t steps_per_epoch, int64_t epochs) const;
};
/// "constant", "step", "cosine"; parse_schedule_kind throws dp::Error naming the known kinds.
const char* schedule_kind_name(LrSchedule::Kind kind);
const std::vector<std::string>& schedule_kind_names();
LrSchedule::Kind parse_schedule_kind(const std::string& name);

}  // namespace dp
