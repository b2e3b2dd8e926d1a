// The optimizer table and the learning-rate schedules.
#include "dp/optimizer.hpp"

#include <cmath>
#include <numbers>

#include "dp/error.hpp"

namespace dp {

namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerOptions& o) : o_(o) {
    DP_CHECK(o.momentum >= 0.0f && o.momentum < 1.0f,
             "sgd: momentum must be in [0, 1), got " + std::to_string(o.momentum));
    DP_CHECK(o.weight_decay >= 0.0f,
             "sgd: weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
    DP_CHECK(!o.nesterov || o.momentum > 0.0f,
             "sgd: Nesterov momentum needs momentum > 0 (as PyTorch's SGD); set momentum or "
             "nesterov = false");
  }
  std::string name() const override { return "sgd"; }
  int state_buffers() const override { return o_.momentum != 0.0f ? 1 : 0; }
  std::vector<std::string> state_names() const override {
    if (o_.momentum == 0.0f) return {};
    return {"momentum_buffer"};
  }
  int step_scalars() const override { return 1; }
  void fill_step_scalars(float lr, int64_t, float* row) const override { row[0] = lr; }
  void update_at(Backend& backend, const Tensor& params, const Tensor& grads,
                 const std::vector<Tensor>& state, const StepRow& scalars,
                 const Tensor* params_bf16) override {
    const SgdParams p{0.0f, o_.momentum, o_.weight_decay, o_.nesterov};
    backend.sgd_update(params, grads, state.empty() ? nullptr : &state[0], p, &scalars,
                       params_bf16);
  }

 private:
  OptimizerOptions o_;
};

class AdamW final : public Optimizer {
 public:
  explicit AdamW(const OptimizerOptions& o) : o_(o) {
    DP_CHECK(o.beta1 >= 0.0f && o.beta1 < 1.0f && o.beta2 >= 0.0f && o.beta2 < 1.0f,
             "adamw: betas must be in [0, 1), got (" + std::to_string(o.beta1) + ", " +
                 std::to_string(o.beta2) + ")");
    DP_CHECK(o.eps > 0.0f, "adamw: eps must be positive, got " + std::to_string(o.eps));
    DP_CHECK(o.weight_decay >= 0.0f,
             "adamw: weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
  }
  std::string name() const override { return "adamw"; }
  int state_buffers() const override { return 2; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  int step_scalars() const override { return 3; }
  void fill_step_scalars(float lr, int64_t step, float* row) const override {
    const AdamWStep s = adamw_step({lr, o_.beta1, o_.beta2, o_.eps, o_.weight_decay, step});
    row[0] = s.step_size;
    row[1] = s.decay;
    row[2] = s.bias2_sqrt;
  }
  void update_at(Backend& backend, const Tensor& params, const Tensor& grads,
                 const std::vector<Tensor>& state, const StepRow& scalars,
                 const Tensor* params_bf16) override {
    // lr and step are the row's; the rest of p is checked and used.
    const AdamWParams p{0.0f, o_.beta1, o_.beta2, o_.eps, o_.weight_decay, 1};
    backend.adamw_update(params, grads, state[0], state[1], p, &scalars, params_bf16);
  }

 private:
  OptimizerOptions o_;
};

template <class T>
std::unique_ptr<Optimizer> make(const OptimizerOptions& o) {
  return std::make_unique<T>(o);
}

}  // namespace

const std::vector<OptimizerEntry>& optimizer_table() {
  static const std::vector<OptimizerEntry> table = {
      {"sgd", "PyTorch's SGD: momentum, Nesterov, weight decay added to the gradient", make<Sgd>},
      {"adamw", "PyTorch's AdamW: betas, eps, decoupled weight decay", make<AdamW>},
  };
  return table;
}

AdamWStep adamw_step(const AdamWParams& p) {
  const auto t = static_cast<double>(p.step);
  const auto bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), t));
  AdamWStep s;
  s.step_size = p.lr / bias1;
  s.decay = 1.0f - p.lr * p.weight_decay;
  s.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(p.beta2), t)));
  return s;
}

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const OptimizerEntry& e : optimizer_table()) out.emplace_back(e.name);
    return out;
  }();
  return names;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options) {
  std::string known;
  for (const OptimizerEntry& e : optimizer_table()) {
    if (options.name == e.name) return e.make(options);
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  DP_THROW("unknown optimizer \"" + options.name + "\"; the known optimizers are " + known);
}

// ---- learning-rate schedules --------------------------------------------------------------------

const char* schedule_kind_name(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::constant:
      return "constant";
    case LrSchedule::Kind::step:
      return "step";
    case LrSchedule::Kind::cosine:
      return "cosine";
  }
  return "?";
}

const std::vector<std::string>& schedule_kind_names() {
  static const std::vector<std::string> names = {"constant", "step", "cosine"};
  return names;
}

LrSchedule::Kind parse_schedule_kind(const std::string& name) {
  for (auto k : {LrSchedule::Kind::constant, LrSchedule::Kind::step, LrSchedule::Kind::cosine}) {
    if (name == schedule_kind_name(k)) return k;
  }
  DP_THROW("unknown learning-rate schedule \"" + name +
           "\"; the known schedules are constant, step, cosine");
}

double LrSchedule::at(int64_t t, int64_t steps_per_epoch, int64_t epochs) const {
  DP_CHECK(steps_per_epoch >= 1 && epochs >= 1 && t >= 0,
           "LrSchedule::at: need steps_per_epoch >= 1, epochs >= 1 and t >= 0");
  const int64_t total = steps_per_epoch * epochs;
  const auto warmup = static_cast<int64_t>(std::ceil(warmup_epochs * steps_per_epoch));
  if (t < warmup) return base * static_cast<double>(t + 1) / static_cast<double>(warmup);
  switch (kind) {
    case Kind::constant:
      return base;
    case Kind::step: {
      const int64_t epoch = t / steps_per_epoch;
      return base * std::pow(gamma, static_cast<double>(epoch / std::max<int64_t>(step_epochs, 1)));
    }
    case Kind::cosine: {
      const int64_t span = total - warmup;
      const double p = span > 0 ? static_cast<double>(t - warmup) / static_cast<double>(span) : 1.0;
      return base * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(p, 1.0)));
    }
  }
  return base;
}

}  // namespace dp
