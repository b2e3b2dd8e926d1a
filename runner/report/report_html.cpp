// `dprun report --html`: one self-contained page. The charts are SVG written here rather than
// drawn by a charting library: the libraries that fit one offline file either draw on a canvas
// (Chart.js: blurry in print, invisible to the DOM, so a browser test cannot see the series) or
// are toolkits that need as much code of ours (d3), inlined at ~270 KB into every report. Line
// charts with axes, ticks and a legend are little code, print sharply, need no JavaScript at all,
// and every series is an element a test (or a screen reader) can find: <g class="series">.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dp/version.hpp"
#include "report/hparams.hpp"
#include "report/html_chart.hpp"
#include "report/report.hpp"

namespace dprun {

namespace {

using namespace html;

const char* kStyle = R"(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       max-width: 1120px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px;
  border-bottom: 1px solid #ccc; padding-bottom: 4px; } h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #666; font-size: 12px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure.chart { margin: 0; flex: 1 1 480px; max-width: 560px; }
figure.chart svg { width: 100%; height: auto; display: block; }
svg text { font-size: 11px; fill: #333; } svg text.title { font-size: 13px; font-weight: 600; }
line.grid { stroke: #e6e6e6; } line.axis { stroke: #888; }
.legend { font-size: 12px; display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 4px; }
.legend i { display: inline-block; width: 18px; height: 3px; margin-right: 5px;
  vertical-align: middle; }
table { border-collapse: collapse; font-size: 12px; margin-top: 8px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td, tr.diverged td { color: #b00020; } .error { color: #b00020; font-size: 12px; }
.note { color: #555; font-size: 12px; } .trial-note { white-space: pre-wrap; }
.tag { display: inline-block; background: #eef3f8; border: 1px solid #c9d6e3; border-radius: 3px;
  padding: 0 4px; margin-right: 3px; font-size: 11px; } .live { color: #1a6b2f; font-size: 12px; }
.scroll { overflow-x: auto; }
/* A sweep of thousands of trials: the browser lays out the tables and charts out of view only when
   they come into view, so loading and brushing stay quick (measured in test_report_html.cpp). */
.scroll { content-visibility: auto; contain-intrinsic-size: auto 600px; }
figure.chart { content-visibility: auto; contain-intrinsic-size: auto 300px; }
@media print { body { max-width: none; margin: 0; } section.experiment { break-before: page; }
  figure.chart { break-inside: avoid; } }
)";

std::string cell(const std::optional<double>& v, const char* fmt) { return v ? num(*v, fmt) : ""; }

// Past this many trials, the learning curves have no markers and no legend (each line names its
// trial as a tooltip): a sweep of thousands stays light in the browser.
constexpr size_t kDenseTrials = 40;

using Epochs = std::vector<std::vector<dps::EpochRow>>;

// Learning curves, one line per trial.
std::string learning_curves(const ExperimentTrials& x, const Epochs& epochs,
                            const TrialMetric& metric,
                            const std::vector<std::optional<double>>& values) {
  const bool dense = x.trials.size() > kDenseTrials;
  // Many trials: each line in its metric's colour, as in the hyperparameter views (ten colours
  // and dashes would repeat every twenty trials); the best drawn last, on top.
  const std::vector<std::string> by_metric = dense ? metric_colors(values, metric)
                                                   : std::vector<std::string>{};
  Chart loss{"Training loss", "epoch", "train loss", {}, true, std::nullopt, !dense};
  Chart acc{"Test accuracy", "epoch", "test accuracy", {}, true, 0.0, !dense};
  for (size_t i = 0; i < x.trials.size(); ++i) {
    const auto& t = x.trials[i];
    std::string color = kColors[i % 10];
    bool dashed = (i / 10) % 2 == 1;  // past ten trials the colours repeat, dashed
    if (dense) color = by_metric[i].empty() ? "#bbbbbb" : by_metric[i], dashed = false;
    Series l{x.label(i), std::to_string(t.trial.id), color, {}, dashed};
    Series a = l;
    for (const auto& e : epochs[i]) {
      l.points.emplace_back(static_cast<double>(e.epoch), e.train_loss);
      a.points.emplace_back(static_cast<double>(e.epoch), e.test_acc);
    }
    loss.series.push_back(std::move(l));
    acc.series.push_back(std::move(a));
  }
  if (dense) {
    std::vector<size_t> order(x.trials.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const auto goodness = [&](size_t i) {
      const auto& v = values[i];
      return !v ? -1e300 : metric.higher_better ? *v : -*v;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return goodness(a) < goodness(b); });
    for (Chart* c : {&loss, &acc}) {
      std::vector<Series> sorted;
      for (size_t i : order) sorted.push_back(std::move(c->series[i]));
      c->series = std::move(sorted);
    }
  }
  return "<h3>Learning curves</h3><div class=\"charts\">" + svg_chart(loss) + svg_chart(acc) +
         "</div>" +
         (dense ? "<p class=\"note\">" + std::to_string(x.trials.size()) +
                      " trials, coloured by " + escape(metric.name) +
                      " from worst (dark) to best (yellow): hover a line for its trial.</p>"
                : legend(loss.series));
}

// The scaling groups, as the scaling view matches trials with their 1-GPU baseline: a group is
// the done trials that agree on every setting the baseline must share (all but gpus and those
// that may vary with the GPU count or between repeats), by GPU count.
std::map<std::string, std::map<double, std::vector<size_t>>> scaling_groups(
    const ExperimentTrials& x) {
  std::map<std::string, std::map<double, std::vector<size_t>>> groups;
  for (size_t i = 0; i < x.trials.size(); ++i) {
    if (x.trials[i].trial.status != dps::TrialStatus::done) continue;
    std::string key;
    for (size_t c = 0; c < x.settings[i].size(); ++c) {
      const auto& [name, text] = x.settings[i][c];
      const bool shown = std::find(x.shown.begin(), x.shown.end(), c) != x.shown.end();
      if (name == "gpus" || x.baseline_may_differ[c] || !shown) continue;
      key += key.empty() ? (name == "model" ? text : name + "=" + text) : " " + name + "=" + text;
    }
    groups[key][std::stod(x.setting(i, "gpus"))].push_back(i);
  }
  return groups;
}

// Seconds per epoch, speedup and efficiency against the GPU count, one line per group; "" when
// no group has several GPU counts. Several trials of a group with one GPU count (a seed or
// learning-rate sweep) are averaged, as the view averages baselines.
std::string scaling_charts(const ExperimentTrials& x) {
  const auto groups = scaling_groups(x);
  bool several_gpu_counts = false;
  for (const auto& [key, by_gpus] : groups) several_gpu_counts |= by_gpus.size() > 1;
  if (!several_gpu_counts) return "";
  Chart seconds{"Seconds per epoch", "GPUs", "s / epoch", {}, true, 0.0};
  Chart speedup{"Speedup over 1 GPU", "GPUs", "speedup", {}, true, 0.0};
  Chart efficiency{"Scaling efficiency", "GPUs", "efficiency", {}, true, 0.0};
  double max_gpus = 1;
  size_t g = 0;
  auto mean = [&](const std::vector<size_t>& members, auto field) -> std::optional<double> {
    double sum = 0;
    int n = 0;
    for (size_t i : members) {
      if (const auto v = field(x.trials[i])) sum += *v, ++n;
    }
    return n ? std::optional<double>(sum / n) : std::nullopt;
  };
  for (const auto& [key, by_gpus] : groups) {
    if (by_gpus.size() < 2) continue;
    const std::string color = kColors[g++ % 10];
    Series s{key, "group", color, {}, false}, sp = s, ef = s;
    for (const auto& [gpus, members] : by_gpus) {
      max_gpus = std::max(max_gpus, gpus);
      if (auto v = mean(members, [](const auto& t) { return t.mean_seconds_per_epoch; }))
        s.points.emplace_back(gpus, *v);
      if (auto v = mean(members, [](const auto& t) { return t.speedup; }))
        sp.points.emplace_back(gpus, *v);
      if (auto v = mean(members, [](const auto& t) { return t.efficiency; }))
        ef.points.emplace_back(gpus, *v);
    }
    seconds.series.push_back(s);
    speedup.series.push_back(sp);
    efficiency.series.push_back(ef);
  }
  speedup.series.push_back({"ideal (linear)", "", "#999", {{1, 1}, {max_gpus, max_gpus}}, true});
  efficiency.series.push_back({"ideal", "", "#999", {{1, 1}, {max_gpus, 1}}, true});
  return "<h3>Scaling</h3><div class=\"charts\">" + svg_chart(seconds) + svg_chart(speedup) +
         svg_chart(efficiency) + "</div>" + legend(speedup.series);
}

// The trial table, then the errors of the trials that have one.
std::string trial_table(const ExperimentTrials& x, const Epochs& epochs) {
  // In a box that scrolls sideways: on a narrow window the table keeps its columns.
  std::string out = "<h3>Trials</h3><div class=\"scroll\"><table><thead><tr><th>#</th>";
  for (size_t c : x.shown) out += "<th>" + escape(x.settings[0][c].first) + "</th>";
  out +=
      "<th>status</th><th>epochs</th><th>final acc</th><th>best acc</th><th>s/epoch</th>"
      "<th>examples/s</th><th title=\"peak memory of one replica (GPU memory on CUDA)\">"
      "memory</th><th>speedup</th><th>devices</th>";
  const bool any_tags = std::any_of(x.trials.begin(), x.trials.end(),
                                    [](const auto& t) { return !t.trial.tags.empty(); });
  if (any_tags) out += "<th>tags</th>";
  out += "</tr></thead><tbody>";
  std::string errors, notes;
  for (size_t i = 0; i < x.trials.size(); ++i) {
    const auto& t = x.trials[i];
    const std::string status = dps::status_name(t.trial.status);
    out += "<tr class=\"" + status + "\" data-trial=\"" + std::to_string(t.trial.id) + "\"><td>" +
           std::to_string(t.trial.id) + "</td>";
    for (size_t c : x.shown) out += "<td>" + escape(x.settings[i][c].second) + "</td>";
    out += "<td>" + status + "</td><td class=\"n\">" + std::to_string(t.trial.epochs_done) + "/" +
           escape(x.setting(i, "epochs")) + "</td><td class=\"n\">" +
           cell(t.final_test_acc, "%.4f") + "</td><td class=\"n\">" +
           cell(t.best_test_acc, "%.4f") + "</td><td class=\"n\">" +
           cell(t.mean_seconds_per_epoch, "%.2f") + "</td>";
    const TrialThroughput tp = trial_throughput(epochs[i]);
    out += "<td class=\"n\">" + cell(tp.examples_per_second, "%.0f") + "</td><td class=\"n\">" +
           (tp.peak_memory_mib ? num(*tp.peak_memory_mib, "%.0f") + " MiB" : "") + "</td>";
    const std::string no_speedup = x.no_speedup_reason(i);
    out += no_speedup.empty() ? "<td class=\"n\">"
                              : "<td class=\"n\" title=\"" + escape(no_speedup) + "\">";
    out += cell(t.speedup, "%.2fx") + "</td><td>" + escape(t.trial.devices) + "</td>";
    if (any_tags) out += "<td>" + tag_spans(t.trial.tags) + "</td>";
    out += "</tr>";
    if (!t.trial.note.empty())
      notes += "<p class=\"note trial-note\">trial " + std::to_string(t.trial.id) + " (" +
               escape(x.label(i)) + "): " + escape(t.trial.note) + "</p>";
    if (!no_speedup.empty())
      notes += "<p class=\"note\">trial " + std::to_string(t.trial.id) + " (" + escape(x.label(i)) +
               "): no speedup: " + escape(no_speedup) + "</p>";
    if (!t.trial.error.empty())
      errors += "<p class=\"error\">trial " + std::to_string(t.trial.id) + " (" +
                escape(x.label(i)) + "): " + escape(t.trial.error) + "</p>";
  }
  return out + "</tbody></table></div>" + errors + notes;
}

std::string experiment_section(dps::Store& store, const ExperimentTrials& x,
                               const HtmlReportOptions& options) {
  std::string out = "<section class=\"experiment\" data-experiment=\"" + escape(x.experiment.name) +
                    "\"><h2>" + escape(x.experiment.name) + "</h2>";
  if (!x.experiment.description.empty()) out += "<p>" + escape(x.experiment.description) + "</p>";
  out += "<p class=\"meta\">" + std::to_string(x.trials.size()) +
         (x.trials.size() == 1 ? " trial" : " trials") + "</p>";
  if (x.trials.empty()) return out + "</section>";
  Epochs epochs;
  for (const auto& t : x.trials) epochs.push_back(store.epochs(t.trial.id));
  const TrialMetric metric = resolve_metric(options.metric, epochs);
  const std::vector<std::optional<double>> values = metric_values(epochs, metric);
  // Each part in its own box (class "part NAME"): a stylesheet or a screenshot can pick one.
  auto part = [](const char* name, const std::string& html) {
    return html.empty() ? html : "<div class=\"part " + std::string(name) + "\">" + html + "</div>";
  };
  return out + part("curves", learning_curves(x, epochs, metric, values)) +
         part("scaling", scaling_charts(x)) + part("hparams", hyperparameter_views(x, epochs, metric, values)) +
         part("trials", trial_table(x, epochs)) + "</section>";
}

// "2026-11-26 18:43:04 UTC"
std::string now_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

std::string format_html_report(dps::Store& store, const SettingTable& table,
                               const HtmlReportOptions& options) {
  if (const std::string why = report_metric_problem(options.metric);
      !options.metric.empty() && !why.empty())
    throw std::invalid_argument(why);
  const auto experiments = experiment_trials(store, table);
  std::string out =
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" "
      "content=\"width=device-width, initial-scale=1\">";
  if (options.refresh_seconds > 0)
    out += "<meta http-equiv=\"refresh\" content=\"" + std::to_string(options.refresh_seconds) +
           "\">";
  out += "<title>dprun report: " + escape(store.path()) + "</title><style>" + kStyle +
         hparams_style() + "</style></head><body>";
  out += "<h1>dprun report</h1><p class=\"meta\">database " + escape(store.path()) + " &middot; " +
         std::to_string(experiments.size()) + " experiment" + (experiments.size() == 1 ? "" : "s") +
         " &middot; dprun " + escape(dp::version()) + "</p>";
  if (options.refresh_seconds > 0)
    out += "<p class=\"live\">Live: written " + now_utc() + "; this page reloads every " +
           std::to_string(options.refresh_seconds) +
           " s while the sweep runs (dprun report --refresh rewrites it).</p>";
  if (experiments.empty()) out += "<p>No experiments in this database yet.</p>";
  for (const auto& x : experiments) out += experiment_section(store, x, options);
  out +=
      "<p class=\"meta\">Seconds per epoch exclude epoch 1 (warm-up) when there are more. "
      "Speedup: seconds per epoch of the matching 1-GPU trial / this trial's.</p>";
  return out + "<script>" + hparams_script() + "</script></body></html>\n";
}

}  // namespace dprun
