// A trial's stopping rule (see stop_rule.hpp).
#include "process/stop_rule.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace dprun {

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

bool higher_is_better(const std::string& metric) {
  return metric.size() < 5 || metric.compare(metric.size() - 5, 5, "_loss") != 0;
}

std::string selection_metric(const TrialSettings& s) {
  const std::string& metric = s[key::stop_metric];
  if (metric != "auto") return metric;
  return s[key::validation] > 0 ? "val_acc" : "test_acc";
}

StopRule stop_rule(const TrialSettings& s) {
  StopRule r;
  r.metric = selection_metric(s);
  r.higher_is_better = higher_is_better(r.metric);
  r.patience = s[key::stop_patience];
  r.min_delta = s[key::stop_min_delta];
  r.target = s[key::stop_target];
  return r;
}

double metric_value(const dps::EpochRow& row, const std::string& metric) {
  for (const dps::EpochMetric& m : dps::epoch_metrics())
    if (metric == m.name)
      return m.real != nullptr ? row.*m.real : static_cast<double>(row.*m.integer);
  throw std::invalid_argument("\"" + metric + "\" is not an epoch metric");
}

std::string StopWatch::observe(int64_t epoch, double value) {
  if (!std::isfinite(value)) return "";
  ++epochs_;
  const bool first = best_epoch_ == 0;
  const bool better = first || (rule_.higher_is_better ? value > best_ + rule_.min_delta
                                                       : value < best_ - rule_.min_delta);
  if (better) {
    best_ = value;
    best_epoch_ = epoch;
    since_best_ = 0;
  } else {
    ++since_best_;
  }
  const std::string after = "stopped after epoch " + std::to_string(epoch) + ": ";
  if (rule_.target > 0 &&
      (rule_.higher_is_better ? value >= rule_.target : value <= rule_.target))
    return after + rule_.metric + " " + number(value) + " reached the target " +
           number(rule_.target) + " (stop.target)";
  if (rule_.patience > 0 && since_best_ >= rule_.patience)
    return after + rule_.metric + " has not improved by more than " + number(rule_.min_delta) +
           " for " + std::to_string(since_best_) + " epoch" + (since_best_ == 1 ? "" : "s") +
           " (stop.patience " + std::to_string(rule_.patience) + "; best " + number(best_) +
           " after epoch " + std::to_string(best_epoch_) + ")";
  return "";
}

void StopWatch::replay(const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i) observe(static_cast<int64_t>(i) + 1, values[i]);
}

}  // namespace dprun
