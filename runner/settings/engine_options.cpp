// Settings to the engine's options (see engine_options.hpp).
#include "settings/engine_options.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dp/error.hpp"

namespace dprun {

namespace {

bool sync_bn(const std::string& mode) {
  if (mode == "sync") return true;
  if (mode == "per-replica") return false;
  DP_THROW("bn_mode \"" + mode + "\": expected per-replica or sync");
}

dp::ConvChoice conv_choice(const std::string& how) {
  if (how == "measured") return dp::ConvChoice::measured;
  if (how == "heuristic") return dp::ConvChoice::heuristic;
  DP_THROW("conv_choice \"" + how + "\": expected measured or heuristic");
}

}  // namespace

dp::TrainerOptions trainer_options(const TrialSettings& s) {
  dp::TrainerOptions t;
  t.batch_size = s[key::batch_size];
  t.eval_batch_size = s[key::eval_batch_size];
  t.epochs = static_cast<int>(s[key::epochs]);
  t.seed = static_cast<uint64_t>(s[key::seed]);
  t.lr.kind = dp::parse_schedule_kind(s[key::lr_schedule]);
  t.lr.base = s[key::lr];
  t.lr.warmup_epochs = s[key::warmup_epochs];
  t.lr.step_epochs = s[key::lr_step_epochs];
  t.lr.gamma = s[key::lr_gamma];
  t.optimizer.name = s[key::optimizer];
  t.optimizer.weight_decay = static_cast<float>(s[key::weight_decay]);
  t.optimizer.momentum = static_cast<float>(s[key::momentum]);
  t.optimizer.nesterov = s[key::nesterov];
  t.optimizer.beta1 = static_cast<float>(s[key::betas].at(0));
  t.optimizer.beta2 = static_cast<float>(s[key::betas].at(1));
  t.optimizer.eps = static_cast<float>(s[key::eps]);
  (void)dp::make_optimizer(t.optimizer);  // an unknown name or bad options: an error now
  t.precision = dp::parse_precision(s[key::precision]);
  t.layout = dp::parse_layout(s[key::layout]);
  t.allow_tf32 = s[key::allow_tf32];
  t.conv_choice = conv_choice(s[key::conv_choice]);
  if (const char* env = std::getenv("DPRUN_CUDNN_CHOICE");
      env != nullptr && *env != '\0' && s[key::conv_choice] != env) {
    std::fprintf(stderr,
                 "dprun: warning: DPRUN_CUDNN_CHOICE=%s does not apply to trials: the trial's "
                 "conv_choice = \"%s\" decides (it is part of the trial's identity)\n",
                 env, s[key::conv_choice].c_str());
  }
  t.graphs = s[key::graphs];
  t.augment.crop_padding = s[key::augment_crop_padding];
  t.augment.flip = s[key::augment_flip];
  for (double m : s[key::augment_mean]) t.augment.mean.push_back(static_cast<float>(m));
  for (double d : s[key::augment_std]) t.augment.std.push_back(static_cast<float>(d));
  // Any positive budget is a budget: one below a byte is one byte (0 alone means no limit).
  if (const double mib = s[key::data_budget_mib]; mib > 0)
    t.data_budget = std::max<size_t>(1, static_cast<size_t>(mib * 1048576.0));
  t.sync_bn = sync_bn(s[key::bn_mode]);
  return t;
}

}  // namespace dprun
