#pragma once
// The hyperparameter views of `dprun report --html`: which trial metric ranks the trials, the
// parallel-coordinates chart (with brushing, hparams_script()), the metric against each swept
// setting, and the best trials.
#include <optional>
#include <string>
#include <vector>

#include "dpstore/store.hpp"
#include "report/report.hpp"

namespace dprun::html {

/// A trial metric: best_ or final_ of one epoch metric.
struct TrialMetric {
  std::string name;    // "best_val_acc"
  std::string what;    // "best validation accuracy"
  bool higher_better;  // accuracies; losses are lower-better
  bool best = true;                           // best_ (else final_)
  double dps::EpochRow::*field = nullptr;     // the epoch metric
  /// The trial's value from its epochs (finite ones); nullopt when it has none.
  std::optional<double> of(const std::vector<dps::EpochRow>& epochs) const;
};

/// The metric of that name; throws std::invalid_argument when there is none
/// (report_metric_problem() says why first).
TrialMetric trial_metric(const std::string& name);
/// "" (the default): best_val_acc when any trial recorded a validation accuracy, else
/// best_test_acc; otherwise the named one.
TrialMetric resolve_metric(const std::string& name,
                           const std::vector<std::vector<dps::EpochRow>>& epochs);

/// The settings that vary among the experiment's trials (indices into x.settings[i]): the axes
/// of the hyperparameter views.
std::vector<size_t> swept_settings(const ExperimentTrials& x);

/// Each trial's value of the metric (epochs[i]: trial i's epochs), computed once per experiment
/// for every view that ranks or colours by it.
std::vector<std::optional<double>> metric_values(
    const std::vector<std::vector<dps::EpochRow>>& epochs, const TrialMetric& metric);

/// Each trial's colour by its value of the metric (viridis, dark worst to yellow best, as in the
/// hyperparameter views); "" for a trial without a value.
std::vector<std::string> metric_colors(const std::vector<std::optional<double>>& values,
                                       const TrialMetric& metric);

/// The <span class="tag"> of each of a trial's tags, escaped.
std::string tag_spans(const std::vector<std::string>& tags);

/// The hyperparameters part of an experiment's section: "" when no setting varies, or fewer
/// than two trials have the metric. epochs[i]: trial i's epochs; values: metric_values().
std::string hyperparameter_views(const ExperimentTrials& x,
                                 const std::vector<std::vector<dps::EpochRow>>& epochs,
                                 const TrialMetric& metric,
                                 const std::vector<std::optional<double>>& values);

/// The page's one script: brushing of every parallel-coordinates chart, which filters the
/// experiment's trial rows, scatter points and learning curves.
const char* hparams_script();
/// The views' CSS.
const char* hparams_style();

}  // namespace dprun::html
