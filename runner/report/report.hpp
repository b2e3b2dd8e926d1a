#pragma once
// Formatting query results (`dprun query`) and the per-experiment summary (`dprun report`).
#include <optional>
#include <string>
#include <vector>

#include "dpstore/store.hpp"
#include "settings/settings.hpp"

namespace dprun {

enum class QueryFormat { table, csv, json };

/// table: aligned columns, NULL shown as NULL. csv: RFC 4180 (CRLF, fields with a comma, quote
/// or line break quoted, quotes doubled; NULL as an empty field). json: an array of objects;
/// values that are JSON numbers in their text form are emitted as numbers, NULL as null.
std::string format_query(const dps::QueryResult& result, QueryFormat format);

/// The database to use when --db is not given: the only results/*.db in the current folder.
/// Throws UsageError telling to pass --db otherwise.
std::string default_database(const std::string& command);

/// One experiment's trials as the reports show them: each trial's settings as text, and which
/// settings to show (the model and gpus always, every other one when it varies among the
/// trials; never where the data lives).
struct ExperimentTrials {
  dps::ExperimentRow experiment;
  std::vector<dps::TrialSummary> trials;
  std::vector<std::vector<std::pair<std::string, std::string>>> settings;  // per trial, by column
  std::vector<size_t> shown;                                               // indices into settings
  /// Per setting column: whether the scaling view lets a trial's 1-GPU baseline differ in it.
  std::vector<bool> baseline_may_differ;
  /// "lenet gpus=2 lr=0.4": the shown settings of trial i, model first.
  std::string label(size_t i) const;
  /// A setting's text for trial i ("" when the table has no such column).
  std::string setting(size_t i, const std::string& column) const;
  /// Why done trial i has no speedup, as the scaling view matches it with a 1-GPU baseline: no
  /// done 1-GPU trial on its backend, or the closest one differs in a setting the baseline must
  /// share ("its per_gpu_batch is 128, the 1-GPU trial's 256"). "" when it has a speedup or is
  /// not done.
  std::string no_speedup_reason(size_t i) const;
};
std::vector<ExperimentTrials> experiment_trials(dps::Store& store, const SettingTable& table);

/// A trial's throughput, as the trial_summary view computes it: the mean examples per second of
/// its epochs (epoch 1, the warm-up, excluded when there are more) and the most memory one
/// replica held in any epoch (GPU memory on CUDA); nullopt when not measured.
struct TrialThroughput {
  std::optional<double> examples_per_second;
  std::optional<double> peak_memory_mib;
};
TrialThroughput trial_throughput(const std::vector<dps::EpochRow>& epochs);

/// `dprun report`: per experiment, its trials (settings that vary, status, final and best test
/// accuracy, s/epoch, speedup over 1 GPU). Returns the text.
std::string format_report(dps::Store& store, const SettingTable& table = builtin_settings());

/// The trial metrics the HTML report ranks trials by (--metric): best_ or final_ (the trial's
/// best epoch, or its last) of train_loss, train_acc, test_loss, test_acc, val_loss, val_acc.
/// An accuracy ranks higher first, a loss lower first.
const std::vector<std::string>& report_metric_names();
/// Why `name` is not a report metric ("" when it is), with the names it could be.
std::string report_metric_problem(const std::string& name);

struct HtmlReportOptions {
  /// What the hyperparameter views rank and colour trials by; "": per experiment, the best
  /// available accuracy (best_val_acc when its trials have a validation split, else best_test_acc).
  std::string metric;
  /// > 0: the page reloads itself every so many seconds (`--refresh`, while a sweep runs) and
  /// says when it was written.
  int refresh_seconds = 0;
};

/// `dprun report --html FILE`: one self-contained HTML page (no network requests, works from a
/// file:// URL, prints): per experiment, learning curves (train loss and test accuracy per epoch,
/// one line per trial), the scaling charts (seconds per epoch, speedup and efficiency against
/// the GPU count, with the ideal lines), the hyperparameter views (parallel coordinates with
/// brushing, the metric against each swept setting, the best trials) and the trial table with
/// each trial's throughput. Charts are inline SVG; the page's one script (brushing) is inline.
std::string format_html_report(dps::Store& store, const SettingTable& table = builtin_settings(),
                               const HtmlReportOptions& options = {});

}  // namespace dprun
