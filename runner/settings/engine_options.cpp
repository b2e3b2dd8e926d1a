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
  // "auto" is the trial process's to resolve, on the backend it runs (trial_layout).
  if (s[key::layout] != "auto") t.layout = dp::parse_layout(s[key::layout]);
  t.allow_tf32 = s[key::allow_tf32];
  t.conv_choice = conv_choice(s[key::conv_choice]);
  if (const char* env = std::getenv("DPRUN_CUDNN_CHOICE");
      env != nullptr && *env != '\0' && s[key::conv_choice] != env) {
    std::fprintf(stderr,
                 "dprun: warning: DPRUN_CUDNN_CHOICE=%s does not apply to trials: the trial's "
                 "conv_choice = \"%s\" decides (it is part of the trial's identity)\n",
                 env, s[key::conv_choice].c_str());
  }
  // "auto": the trainer decides, knowing where its replicas run.
  if (const auto* graphs = std::get_if<bool>(&s.get("graphs")))
    t.graphs = *graphs;
  else
    t.graphs_auto = true;
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

dp::Layout trial_layout(const TrialSettings& s, dp::BackendKind kind) {
  const std::string& layout = s[key::layout];
  if (layout != "auto") return dp::parse_layout(layout);
  // Measured side by side (bench/results/2026-11-28-nvidia-h200-bf28c6d.json, batch 256): a
  // ResNet-18 epoch on an H200 took 2.14 s in nhwc against 2.98 s in nchw (TF32), 2.67 against
  // 3.50 s (bf16); LeNet's 0.312 against 0.287 s (TF32), 0.328 against 0.348 s (bf16). Strict
  // fp32 (allow_tf32 = false) has been measured in nchw only: it keeps nchw, as does the CPU
  // backend, what they always ran.
  const bool measured_faster = s[key::allow_tf32] || s[key::precision] == "bf16";
  return kind == dp::BackendKind::cuda && measured_faster ? dp::Layout::nhwc : dp::Layout::nchw;
}

}  // namespace dprun
