// `dprun report --html`: one self-contained page. The charts are SVG written here rather than
// drawn by a charting library: the libraries that fit one offline file either draw on a canvas
// (Chart.js: blurry in print, invisible to the DOM, so a browser test cannot see the series) or
// are toolkits that need as much code of ours (d3), inlined at ~270 KB into every report. Line
// charts with axes, ticks and a legend are little code, print sharply, need no JavaScript at all,
// and every series is an element a test (or a screen reader) can find: <g class="series">.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dp/version.hpp"
#include "report/report.hpp"

namespace dprun {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v, const char* fmt = "%.4g") {
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Tableau 10: distinct in colour and in print (grey scale differs too).
const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

struct Series {
  std::string label;
  std::string trial;  // trial id, or "" for a reference line
  std::string color;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool integer_x = true;
  std::optional<double> y_min;  // forced lower end (0 for accuracy, speedup)
};

// 1, 2, 5 x 10^k steps giving about `target` ticks over [lo, hi].
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

std::string legend(const std::vector<Series>& series) {
  std::string out = "<div class=\"legend\">";
  for (const auto& s : series) {
    const std::string swatch =
        s.dashed ? "repeating-linear-gradient(90deg," + s.color + " 0 5px,transparent 5px 9px)"
                 : s.color;
    out += "<span><i style=\"background:" + swatch + "\"></i>" + escape(s.label) + "</span>";
  }
  return out + "</div>";
}

// Where a chart's values land: its data's extent (padded) and the plot area's scales.
struct Frame {
  double width = 520, height = 300, left = 62, right = 16, top = 34, bottom = 46;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  double pw() const { return width - left - right; }
  double ph() const { return height - top - bottom; }
  double sx(double x) const { return left + (x - x0) / (x1 - x0) * pw(); }
  double sy(double y) const { return top + (1 - (y - y0) / (y1 - y0)) * ph(); }
};

// The frame of a chart's finite points; nullopt when it has none.
std::optional<Frame> frame_of(const Chart& c) {
  Frame f;
  for (const auto& s : c.series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      f.x0 = std::min(f.x0, x), f.x1 = std::max(f.x1, x);
      f.y0 = std::min(f.y0, y), f.y1 = std::max(f.y1, y);
    }
  if (f.x0 > f.x1) return std::nullopt;
  if (c.y_min) f.y0 = std::min(f.y0, *c.y_min);
  if (f.x1 == f.x0) f.x0 -= 1, f.x1 += 1;
  if (f.y1 == f.y0) f.y1 = f.y0 + (f.y0 == 0 ? 1 : std::fabs(f.y0) * 0.1);
  const double pad = (f.y1 - f.y0) * 0.05;
  f.y1 += pad;
  if (!c.y_min) f.y0 -= pad;
  return f;
}

// Axes, grid, ticks and labels.
std::string svg_axes(const Chart& c, const Frame& f) {
  std::string out = "<g class=\"axes\">";
  const double ystep = nice_step(f.y0, f.y1, 5);
  for (double t = std::ceil(f.y0 / ystep) * ystep; t <= f.y1 + 1e-12; t += ystep) {
    out += "<line class=\"grid\" x1=\"" + num(f.left) + "\" x2=\"" + num(f.width - f.right) +
           "\" y1=\"" + num(f.sy(t)) + "\" y2=\"" + num(f.sy(t)) + "\"/><text x=\"" +
           num(f.left - 6) + "\" y=\"" + num(f.sy(t) + 4) + "\" text-anchor=\"end\">" +
           num(std::fabs(t) < 1e-12 ? 0 : t) + "</text>";
  }
  std::vector<double> xticks;
  if (c.integer_x) {
    std::set<double> xs;
    for (const auto& s : c.series)
      for (const auto& p : s.points) xs.insert(p.first);
    if (xs.size() <= 12) {
      xticks.assign(xs.begin(), xs.end());
    } else {
      const double step = std::max(1.0, std::round(nice_step(f.x0, f.x1, 8)));
      for (double t = std::ceil(f.x0 / step) * step; t <= f.x1; t += step) xticks.push_back(t);
    }
  }
  for (double t : xticks) {
    out += "<text x=\"" + num(f.sx(t)) + "\" y=\"" + num(f.height - f.bottom + 16) +
           "\" text-anchor=\"middle\">" + num(t, "%g") + "</text>";
  }
  out += "<line class=\"axis\" x1=\"" + num(f.left) + "\" x2=\"" + num(f.left) + "\" y1=\"" +
         num(f.top) + "\" y2=\"" + num(f.height - f.bottom) + "\"/><line class=\"axis\" x1=\"" +
         num(f.left) + "\" x2=\"" + num(f.width - f.right) + "\" y1=\"" + num(f.height - f.bottom) +
         "\" y2=\"" + num(f.height - f.bottom) + "\"/>";
  out += "<text x=\"" + num(f.left + f.pw() / 2) + "\" y=\"" + num(f.height - 8) +
         "\" text-anchor=\"middle\">" + escape(c.x_label) + "</text>";
  out += "<text transform=\"translate(14 " + num(f.top + f.ph() / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + escape(c.y_label) + "</text></g>";
  return out;
}

// Series: a polyline and a marker per point, each point with its value as a tooltip.
std::string svg_series(const Chart& c, const Frame& f) {
  std::string out;
  for (const auto& s : c.series) {
    out += "<g class=\"series" + std::string(s.trial.empty() ? " reference" : "") +
           "\" data-label=\"" + escape(s.label) + "\"" +
           (s.trial.empty() ? "" : " data-trial=\"" + s.trial + "\"") + ">";
    std::string points;
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(y)) points += num(f.sx(x)) + "," + num(f.sy(y)) + " ";
    }
    out += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"2\"" +
           (s.dashed ? " stroke-dasharray=\"5 4\"" : "") + " points=\"" + points + "\"/>";
    if (!s.trial.empty()) {  // data has markers; reference lines do not
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(y)) continue;
        out += "<circle cx=\"" + num(f.sx(x)) + "\" cy=\"" + num(f.sy(y)) + "\" r=\"3\" fill=\"" +
               s.color + "\"><title>" + escape(s.label) + ": " + escape(c.x_label) + " " +
               num(x, "%g") + ", " + escape(c.y_label) + " " + num(y) + "</title></circle>";
      }
    }
    out += "</g>";
  }
  return out;
}

std::string svg_chart(const Chart& c) {
  const Frame layout;
  std::string out = "<figure class=\"chart\"><svg role=\"img\" viewBox=\"0 0 " + num(layout.width) +
                    " " + num(layout.height) + "\" xmlns=\"http://www.w3.org/2000/svg\"><title>" +
                    escape(c.title) + "</title>";
  out += "<text class=\"title\" x=\"" + num(layout.left) + "\" y=\"20\">" + escape(c.title) +
         "</text>";
  const std::optional<Frame> f = frame_of(c);
  if (!f) {  // no data yet
    out += "<text x=\"" + num(layout.width / 2) + "\" y=\"" + num(layout.height / 2) +
           "\" text-anchor=\"middle\">no data</text></svg></figure>";
    return out;
  }
  return out + svg_axes(c, *f) + svg_series(c, *f) + "</svg></figure>";
}

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
.note { color: #555; font-size: 12px; }
.scroll { overflow-x: auto; }
@media print { body { max-width: none; margin: 0; } section.experiment { break-before: page; }
  figure.chart { break-inside: avoid; } }
)";

std::string cell(const std::optional<double>& v, const char* fmt) { return v ? num(*v, fmt) : ""; }

// Learning curves, one line per trial.
std::string learning_curves(dps::Store& store, const ExperimentTrials& x) {
  Chart loss{"Training loss", "epoch", "train loss", {}, true, std::nullopt};
  Chart acc{"Test accuracy", "epoch", "test accuracy", {}, true, 0.0};
  for (size_t i = 0; i < x.trials.size(); ++i) {
    const auto& t = x.trials[i];
    const std::string color = kColors[i % 10];
    // Past ten trials the colours repeat; the second ten are dashed, so lines stay apart.
    Series l{x.label(i), std::to_string(t.trial.id), color, {}, (i / 10) % 2 == 1};
    Series a = l;
    for (const auto& e : store.epochs(t.trial.id)) {
      l.points.emplace_back(static_cast<double>(e.epoch), e.train_loss);
      a.points.emplace_back(static_cast<double>(e.epoch), e.test_acc);
    }
    loss.series.push_back(std::move(l));
    acc.series.push_back(std::move(a));
  }
  return "<h3>Learning curves</h3><div class=\"charts\">" + svg_chart(loss) + svg_chart(acc) +
         "</div>" + legend(loss.series);
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
std::string trial_table(const ExperimentTrials& x) {
  // In a box that scrolls sideways: on a narrow window the table keeps its columns.
  std::string out = "<h3>Trials</h3><div class=\"scroll\"><table><thead><tr><th>#</th>";
  for (size_t c : x.shown) out += "<th>" + escape(x.settings[0][c].first) + "</th>";
  out +=
      "<th>status</th><th>epochs</th><th>final acc</th><th>best acc</th><th>s/epoch</th>"
      "<th>speedup</th><th>devices</th></tr></thead><tbody>";
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
    const std::string no_speedup = x.no_speedup_reason(i);
    out += no_speedup.empty() ? "<td class=\"n\">"
                              : "<td class=\"n\" title=\"" + escape(no_speedup) + "\">";
    out += cell(t.speedup, "%.2fx") + "</td><td>" + escape(t.trial.devices) + "</td></tr>";
    if (!no_speedup.empty())
      notes += "<p class=\"note\">trial " + std::to_string(t.trial.id) + " (" + escape(x.label(i)) +
               "): no speedup: " + escape(no_speedup) + "</p>";
    if (!t.trial.error.empty())
      errors += "<p class=\"error\">trial " + std::to_string(t.trial.id) + " (" +
                escape(x.label(i)) + "): " + escape(t.trial.error) + "</p>";
  }
  return out + "</tbody></table></div>" + errors + notes;
}

std::string experiment_section(dps::Store& store, const ExperimentTrials& x) {
  std::string out = "<section class=\"experiment\" data-experiment=\"" + escape(x.experiment.name) +
                    "\"><h2>" + escape(x.experiment.name) + "</h2>";
  if (!x.experiment.description.empty()) out += "<p>" + escape(x.experiment.description) + "</p>";
  out += "<p class=\"meta\">" + std::to_string(x.trials.size()) +
         (x.trials.size() == 1 ? " trial" : " trials") + "</p>";
  if (x.trials.empty()) return out + "</section>";
  return out + learning_curves(store, x) + scaling_charts(x) + trial_table(x) + "</section>";
}

}  // namespace

std::string format_html_report(dps::Store& store, const SettingTable& table) {
  const auto experiments = experiment_trials(store, table);
  std::string out =
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" "
      "content=\"width=device-width, initial-scale=1\"><title>dprun report: " +
      escape(store.path()) + "</title><style>" + kStyle + "</style></head><body>";
  out += "<h1>dprun report</h1><p class=\"meta\">database " + escape(store.path()) + " &middot; " +
         std::to_string(experiments.size()) + " experiment" + (experiments.size() == 1 ? "" : "s") +
         " &middot; dprun " + escape(dp::version()) + "</p>";
  if (experiments.empty()) out += "<p>No experiments in this database yet.</p>";
  for (const auto& x : experiments) out += experiment_section(store, x);
  out +=
      "<p class=\"meta\">Seconds per epoch exclude epoch 1 (warm-up) when there are more. "
      "Speedup: seconds per epoch of the matching 1-GPU trial / this trial's.</p>";
  return out + "</body></html>\n";
}

}  // namespace dprun
