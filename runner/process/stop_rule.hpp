#pragma once
// A trial's stopping rule (the stop.* settings): after which epoch it ends before its last, and
// why. The trial process applies it after every epoch; the runner hands a resumed trial the
// values its earlier epochs recorded, so a trial that resumes stops where one that ran straight
// through stops.
#include <cstdint>
#include <string>
#include <vector>

#include "dpstore/store.hpp"
#include "settings/settings.hpp"

namespace dprun {

struct StopRule {
  std::string metric;            // an epoch metric: val_acc, val_loss, test_acc, ...
  bool higher_is_better = true;  // an accuracy; a loss: lower
  int64_t patience = 0;          // 0: no patience rule
  double min_delta = 0;
  double target = 0;  // 0: no target
  bool active() const { return patience > 0 || target > 0; }
};

/// The rule of a trial's settings, stop.metric "auto" resolved (val_acc with a validation split,
/// else test_acc).
StopRule stop_rule(const TrialSettings& settings);
/// The metric a trial's stopping rule watches: its stop.metric when set, else val_acc with a
/// validation split, else test_acc. (The report and the "best" checkpoint still go by test_acc.)
std::string selection_metric(const TrialSettings& settings);
/// Whether a larger value of this epoch metric is better (accuracies) or a smaller (losses).
bool higher_is_better(const std::string& metric);
/// The value of an epoch metric in a row (NaN when the row has none, e.g. val_acc without a
/// validation split). Throws std::invalid_argument for a name that is not an epoch metric.
double metric_value(const dps::EpochRow& row, const std::string& metric);

/// Applies a rule to a trial's epochs, one after another.
class StopWatch {
 public:
  explicit StopWatch(StopRule rule) : rule_(std::move(rule)) {}
  /// The metric's value after `epoch`: the reason to stop now ("" to go on). A value that is not
  /// a number (a metric the trial does not record) never stops it.
  std::string observe(int64_t epoch, double value);
  /// Feeds epochs already run (a resumed trial's), without stopping.
  void replay(const std::vector<double>& values);

 private:
  StopRule rule_;
  double best_ = 0;
  int64_t best_epoch_ = 0, since_best_ = 0, epochs_ = 0;
};

}  // namespace dprun
