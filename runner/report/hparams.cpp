// The hyperparameter views of `dprun report --html` (hparams.hpp). Like the other charts they
// are SVG written here: every line and point is an element a browser test can find. Brushing
// is the page's one script, small and inline; without it the charts are still all there.
#include "report/hparams.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <stdexcept>

#include "report/html_chart.hpp"
#include "settings/settings.hpp"

namespace dprun {

namespace {

struct EpochField {
  const char* name;
  const char* what;
  double dps::EpochRow::*field;
  bool accuracy;
};

const std::vector<EpochField>& epoch_fields() {
  static const std::vector<EpochField> fields = {
      {"val_acc", "validation accuracy", &dps::EpochRow::val_acc, true},
      {"test_acc", "test accuracy", &dps::EpochRow::test_acc, true},
      {"train_acc", "training accuracy", &dps::EpochRow::train_acc, true},
      {"val_loss", "validation loss", &dps::EpochRow::val_loss, false},
      {"test_loss", "test loss", &dps::EpochRow::test_loss, false},
      {"train_loss", "training loss", &dps::EpochRow::train_loss, false},
  };
  return fields;
}

}  // namespace

const std::vector<std::string>& report_metric_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const char* which : {"best_", "final_"})
      for (const auto& f : epoch_fields()) out.push_back(which + std::string(f.name));
    return out;
  }();
  return names;
}

std::string report_metric_problem(const std::string& name) {
  const auto& names = report_metric_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return "";
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return "unknown metric \"" + name + "\"; the metrics are " + list;
}

namespace html {

std::optional<double> TrialMetric::of(const std::vector<dps::EpochRow>& epochs) const {
  std::optional<double> out;
  for (const auto& e : epochs) {
    const double v = e.*field;
    if (!std::isfinite(v)) continue;
    if (!best || !out || (higher_better ? v > *out : v < *out)) out = v;
  }
  // final_: the last epoch's value, not the last finite one.
  if (!best && !epochs.empty() && !std::isfinite(epochs.back().*field)) return std::nullopt;
  return out;
}

TrialMetric trial_metric(const std::string& name) {
  if (const std::string why = report_metric_problem(name); !why.empty())
    throw std::invalid_argument(why);
  const bool best = name.rfind("best_", 0) == 0;
  const std::string field_name = name.substr(best ? 5 : 6);
  for (const auto& f : epoch_fields())
    if (field_name == f.name)
      return {name, std::string(best ? "best " : "final ") + f.what, f.accuracy, best, f.field};
  throw std::invalid_argument("unknown metric " + name);
}

TrialMetric resolve_metric(const std::string& name,
                           const std::vector<std::vector<dps::EpochRow>>& epochs) {
  if (!name.empty()) return trial_metric(name);
  for (const auto& trial : epochs)
    for (const auto& e : trial)
      if (std::isfinite(e.val_acc)) return trial_metric("best_val_acc");
  return trial_metric("best_test_acc");
}

std::vector<size_t> swept_settings(const ExperimentTrials& x) {
  std::vector<size_t> out;
  for (size_t c : x.shown) {
    std::set<std::string> distinct;
    for (const auto& row : x.settings) distinct.insert(row[c].second);
    if (distinct.size() > 1) out.push_back(c);
  }
  return out;
}

namespace {

bool parse_number(const std::string& text, double& v) {
  if (text.empty()) return false;
  char* end = nullptr;
  v = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(v);
}

// One axis of the views: a swept setting (numbers, on a log scale when they are positive and
// span two decades or more; otherwise categories in the order of their first trial) or the
// metric. pos() maps a value to [0, 1] along the axis.
struct Axis {
  std::string name;
  bool numeric = true, log = false;
  double lo = 0, hi = 0;                 // of the values (log10 of them when log)
  std::vector<std::string> categories;  // when not numeric
  std::vector<double> tick_values;      // numeric: where to put ticks (raw values)

  double t(double v) const { return log ? std::log10(v) : v; }
  double pos(const std::string& text) const {
    if (!numeric) {
      const auto at = std::find(categories.begin(), categories.end(), text) - categories.begin();
      return categories.size() < 2 ? 0.5 : static_cast<double>(at) / (categories.size() - 1);
    }
    double v = 0;
    parse_number(text, v);
    return pos(v);
  }
  double pos(double v) const { return hi == lo ? 0.5 : (t(v) - lo) / (hi - lo); }
  std::string scale() const { return !numeric ? "category" : log ? "log" : "linear"; }
};

Axis numeric_axis(const std::string& name, const std::vector<double>& values, bool allow_log) {
  Axis a;
  a.name = name;
  const double mn = *std::min_element(values.begin(), values.end());
  const double mx = *std::max_element(values.begin(), values.end());
  a.log = allow_log && mn > 0 && mx / mn >= 100;
  a.lo = a.t(mn), a.hi = a.t(mx);
  std::set<double> distinct(values.begin(), values.end());
  if (distinct.size() <= 8) {
    a.tick_values.assign(distinct.begin(), distinct.end());
  } else if (a.log) {
    for (double d = std::ceil(a.lo); d <= a.hi + 1e-9; d += 1) a.tick_values.push_back(std::pow(10, d));
    if (a.tick_values.size() < 2) a.tick_values = {mn, mx};
  } else {
    const double step = html::nice_step(mn, mx, 5);
    for (double v = std::ceil(mn / step) * step; v <= mx + step * 1e-9; v += step)
      a.tick_values.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
    if (a.tick_values.size() < 2) a.tick_values = {mn, mx};
  }
  return a;
}

Axis setting_axis(const ExperimentTrials& x, size_t column, const std::vector<size_t>& trials) {
  std::vector<double> values;
  bool numeric = true;
  for (size_t i : trials) {
    double v = 0;
    if (!parse_number(x.settings[i][column].second, v)) numeric = false;
    values.push_back(v);
  }
  const std::string& name = x.settings[trials[0]][column].first;
  if (numeric) return numeric_axis(name, values, true);
  Axis a;
  a.name = name;
  a.numeric = false;
  for (size_t i : trials) {
    const std::string& text = x.settings[i][column].second;
    if (std::find(a.categories.begin(), a.categories.end(), text) == a.categories.end())
      a.categories.push_back(text);
  }
  return a;
}

std::string tick_text(double v) { return html::num(v, "%g"); }

// At most `chars` characters of a label (UTF-8: never half a character), "…" when cut.
std::string short_label(const std::string& s, size_t chars) {
  size_t n = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
    if (n++ == chars) break;
  }
  return i >= s.size() ? s : s.substr(0, i) + "\u2026";
}

// Viridis, from worst (dark purple) to best (yellow): readable on white, in grey scale, and by
// the colour-blind.
std::string metric_color(double t) {
  static const double stops[5][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int k = std::min(3, static_cast<int>(t));
  const double f = t - k;
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x",
                static_cast<int>(std::lround(stops[k][0] + f * (stops[k + 1][0] - stops[k][0]))),
                static_cast<int>(std::lround(stops[k][1] + f * (stops[k + 1][1] - stops[k][1]))),
                static_cast<int>(std::lround(stops[k][2] + f * (stops[k + 1][2] - stops[k][2]))));
  return buf;
}

struct Ranked {
  std::vector<size_t> trials;   // those with the metric, worst first (the best drawn on top)
  std::vector<double> values;   // by trial index of x (NaN: none)
  double lo = 0, hi = 0;        // of the values
  double goodness(size_t i, const html::TrialMetric& m) const {  // 0 worst .. 1 best
    if (hi == lo) return 1;
    const double t = (values[i] - lo) / (hi - lo);
    return m.higher_better ? t : 1 - t;
  }
};

// The parallel-coordinates chart: an axis per swept setting and one for the metric, a line per
// trial coloured by its metric. Each axis has a brush area (hparams_script()).
std::string parallel_coordinates(const ExperimentTrials& x, const std::vector<size_t>& swept,
                                 const Ranked& r, const html::TrialMetric& metric) {
  using html::escape;
  using html::num;
  std::vector<Axis> axes;
  for (size_t c : swept) axes.push_back(setting_axis(x, c, r.trials));
  std::vector<double> metric_values;
  for (size_t i : r.trials) metric_values.push_back(r.values[i]);
  axes.push_back(numeric_axis(metric.name, metric_values, false));
  // About the page's width in user units, so its text is drawn at the page's size on a desktop.
  const double width = std::max(1000.0, 130.0 * static_cast<double>(axes.size()));
  const double height = 360, left = 56, right = 64, top = 46, bottom = 30;
  const double ph = height - top - bottom;
  const double gap = (width - left - right) / static_cast<double>(axes.size() - 1);
  auto ax_x = [&](size_t k) { return left + gap * static_cast<double>(k); };
  auto ax_y = [&](double p) { return top + (1 - p) * ph; };

  std::string out = "<figure class=\"pcoords\" data-axes=\"" + std::to_string(axes.size()) +
                    "\"><svg role=\"img\" viewBox=\"0 0 " + num(width) + " " + num(height) +
                    "\" xmlns=\"http://www.w3.org/2000/svg\"><title>Parallel coordinates: " +
                    escape(metric.name) + " against the swept settings</title>";
  // The lines first, under the axes; worst first, so the best lie on top.
  out += "<g class=\"pc-lines\">";
  for (size_t i : r.trials) {
    std::string points;
    for (size_t k = 0; k + 1 < axes.size(); ++k)
      points += num(ax_x(k)) + "," + num(ax_y(axes[k].pos(x.settings[i][swept[k]].second))) + " ";
    points += num(ax_x(axes.size() - 1)) + "," + num(ax_y(axes.back().pos(r.values[i])));
    out += "<polyline data-trial=\"" + std::to_string(x.trials[i].trial.id) + "\" stroke=\"" +
           metric_color(r.goodness(i, metric)) + "\" points=\"" + points + "\"><title>" +
           escape(x.label(i)) + ": " + escape(metric.name) + " " + num(r.values[i]) +
           "</title></polyline>";
  }
  out += "</g>";
  for (size_t k = 0; k < axes.size(); ++k) {
    const Axis& a = axes[k];
    const double ax = ax_x(k);
    out += "<g class=\"pc-axis\" data-axis=\"" + std::to_string(k) + "\" data-name=\"" +
           escape(a.name) + "\" data-scale=\"" + a.scale() + "\"><line class=\"axis\" x1=\"" +
           num(ax) + "\" x2=\"" + num(ax) + "\" y1=\"" + num(top) + "\" y2=\"" + num(top + ph) +
           "\"/><text class=\"name\" x=\"" + num(ax) + "\" y=\"" + num(top - 18) +
           "\" text-anchor=\"middle\">" + escape(a.name) + "</text>";
    // Tick labels beside the axis: left of it, except the last axis's, which go right.
    const bool right_side = k + 1 == axes.size();
    const std::string anchor = right_side ? "start" : "end";
    const double tx = right_side ? ax + 6 : ax - 6;
    auto tick = [&](double p, const std::string& label, const std::string& value) {
      out += "<line class=\"tick\" x1=\"" + num(ax - 3) + "\" x2=\"" + num(ax + 3) + "\" y1=\"" +
             num(ax_y(p)) + "\" y2=\"" + num(ax_y(p)) + "\"/><text class=\"tick\" data-value=\"" +
             escape(value) + "\" x=\"" + num(tx) + "\" y=\"" + num(ax_y(p) + 4) +
             "\" text-anchor=\"" + anchor + "\">" + escape(label) + "</text>";
    };
    if (a.numeric) {
      for (double v : a.tick_values) tick(a.pos(v), tick_text(v), tick_text(v));
    } else {
      for (const auto& cat : a.categories) {
        const std::string label = short_label(cat, 14);
        tick(a.pos(cat), label, cat);
      }
    }
    out += "<rect class=\"brush\" x=\"" + num(ax - 7) + "\" width=\"14\" y=\"" + num(top) +
           "\" height=\"0\" visibility=\"hidden\"/><rect class=\"brush-area\" x=\"" + num(ax - 14) +
           "\" width=\"28\" y=\"" + num(top) + "\" height=\"" + num(ph) + "\"/></g>";
  }
  out += "</svg><figcaption><span class=\"pc-count\">" + std::to_string(r.trials.size()) +
         " trials</span>: one line per trial with a value of " + escape(metric.name) +
         ", coloured from worst (dark) to best (yellow). Drag along an axis to select a range; "
         "the trials outside it are hidden in the tables and dimmed in the charts. Click an axis "
         "to clear its selection.</figcaption></figure>";
  return out;
}

// The metric against one swept setting: a point per trial. Numbers on a linear or log x axis,
// categories evenly spaced.
std::string scatter(const ExperimentTrials& x, size_t column, const Ranked& r,
                    const html::TrialMetric& metric) {
  using html::escape;
  using html::num;
  const Axis a = setting_axis(x, column, r.trials);
  html::Chart c{metric.name + " against " + a.name, a.name, metric.name, {}, false, std::nullopt};
  html::Series s{"trials", "scatter", "#4e79a7", {}, false};
  for (size_t i : r.trials) s.points.emplace_back(a.pos(x.settings[i][column].second), r.values[i]);
  c.series.push_back(s);
  std::optional<html::Frame> f = html::frame_of(c);
  if (!f) return "";
  // x in axis position (0..1), padded so that no point sits on the y axis.
  f->x0 = -0.06, f->x1 = 1.06;
  std::string out = "<figure class=\"chart scatter\"><svg role=\"img\" data-xscale=\"" +
                    a.scale() + "\" viewBox=\"0 0 " + num(f->width) + " " + num(f->height) +
                    "\" xmlns=\"http://www.w3.org/2000/svg\"><title>" + escape(c.title) +
                    "</title><text class=\"title\" x=\"" + num(f->left) + "\" y=\"20\">" +
                    escape(c.title) + "</text>";
  // The x tick labels go inside the axes' group, with the y ticks and the axis lines.
  std::string axes = html::svg_axes(c, *f);
  axes.resize(axes.size() - 4);  // "</g>"
  out += axes;
  if (a.numeric) {
    for (double v : a.tick_values)
      out += "<text x=\"" + num(f->sx(a.pos(v))) + "\" y=\"" + num(f->height - f->bottom + 16) +
             "\" text-anchor=\"middle\">" + tick_text(v) + "</text>";
  } else {
    for (const auto& cat : a.categories)
      out += "<text class=\"category\" x=\"" + num(f->sx(a.pos(cat))) + "\" y=\"" +
             num(f->height - f->bottom + 16) + "\" text-anchor=\"middle\">" +
             escape(short_label(cat, 12)) + "</text>";
  }
  out += "</g><g class=\"series scatter\" data-label=\"trials\">";  // closes the axes
  for (size_t i : r.trials) {
    out += "<circle data-trial=\"" + std::to_string(x.trials[i].trial.id) + "\" cx=\"" +
           num(f->sx(a.pos(x.settings[i][column].second))) + "\" cy=\"" + num(f->sy(r.values[i])) +
           "\" r=\"3.5\" fill=\"" + metric_color(r.goodness(i, metric)) + "\"><title>" +
           escape(x.label(i)) + ": " + escape(metric.name) + " " + num(r.values[i]) +
           "</title></circle>";
  }
  return out + "</g></svg></figure>";
}

// The best trials by the metric: each with its value of every swept setting, after a line with
// the settings every trial shares that differ from the defaults the experiment was begun with
// (so each row shows all that is not a default).
std::string best_trials(const ExperimentTrials& x, const std::vector<size_t>& swept,
                        const Ranked& r, const html::TrialMetric& metric,
                        const std::vector<std::vector<dps::EpochRow>>& epochs) {
  using html::escape;
  using html::num;
  const SettingTable& table =
      builtin_settings().with_defaults(std::clamp(x.experiment.defaults, 1, kDefaultsGeneration));
  std::string shared;
  for (size_t c = 0; c < x.settings[0].size(); ++c) {
    const auto& [name, text] = x.settings[0][c];
    const Setting* row = table.by_column(name);
    if (row == nullptr || name == "data_path" || name == "model" ||
        std::find(swept.begin(), swept.end(), c) != swept.end())
      continue;
    const std::string def = setting_text(row->default_value);
    if (text != def)
      shared += "<span title=\"default " + escape(def) + "\">" + escape(name) + "=" +
                escape(text) + "</span> ";
  }
  std::vector<size_t> order(r.trials.rbegin(), r.trials.rend());  // best first
  const size_t shown = std::min<size_t>(order.size(), 10);
  std::string out = "<h3>Best trials by " + escape(metric.name) + "</h3>";
  if (!shared.empty())
    out += "<p class=\"meta shared\">Every trial also has, off dprun's defaults: " + shared + "</p>";
  out += "<div class=\"scroll\"><table class=\"best\"><thead><tr><th>rank</th><th>#</th><th>" +
         escape(metric.name) + "</th><th>status</th><th>epoch</th>";
  for (size_t c : swept) out += "<th>" + escape(x.settings[0][c].first) + "</th>";
  out += "<th>tags</th></tr></thead><tbody>";
  for (size_t k = 0; k < shown; ++k) {
    const size_t i = order[k];
    const auto& t = x.trials[i];
    // The epoch the metric comes from: the best epoch, or the last.
    int64_t epoch = epochs[i].empty() ? 0 : epochs[i].back().epoch;
    if (metric.best) {
      for (const auto& e : epochs[i])
        if (e.*metric.field == r.values[i]) {
          epoch = e.epoch;
          break;
        }
    }
    out += "<tr data-trial=\"" + std::to_string(t.trial.id) + "\"><td class=\"n\">" +
           std::to_string(k + 1) + "</td><td>" + std::to_string(t.trial.id) +
           "</td><td class=\"n\"><b>" + num(r.values[i], "%.4f") + "</b></td><td>" +
           dps::status_name(t.trial.status) + "</td><td class=\"n\">" + std::to_string(epoch) +
           "</td>";
    for (size_t c : swept) out += "<td>" + escape(x.settings[i][c].second) + "</td>";
    out += "<td>" + tag_spans(t.trial.tags) + "</td></tr>";
  }
  out += "</tbody></table></div>";
  if (order.size() > shown)
    out += "<p class=\"note\">" + std::to_string(order.size() - shown) +
           " more trials with a value; the trial table below lists them all.</p>";
  return out;
}

}  // namespace

std::string hyperparameter_views(const ExperimentTrials& x,
                                 const std::vector<std::vector<dps::EpochRow>>& epochs,
                                 const TrialMetric& metric,
                                 const std::vector<std::optional<double>>& values) {
  const std::vector<size_t> swept = swept_settings(x);
  Ranked r;
  r.values.assign(x.trials.size(), std::nan(""));
  for (size_t i = 0; i < x.trials.size(); ++i)
    if (values[i]) {
      r.values[i] = *values[i];
      r.trials.push_back(i);
    }
  std::string out = "<h3>Hyperparameters</h3>";
  if (swept.empty()) return "";
  if (r.trials.size() < 2)
    return out + "<p class=\"note\">" + std::to_string(r.trials.size()) + " of " +
           std::to_string(x.trials.size()) + " trials have a value of " + escape(metric.name) +
           " (" + escape(metric.what) +
           "): the views need two (dprun report --metric chooses another).</p>";
  std::stable_sort(r.trials.begin(), r.trials.end(), [&](size_t a, size_t b) {
    return metric.higher_better ? r.values[a] < r.values[b] : r.values[a] > r.values[b];
  });
  // Sorted worst first: the ends are the extremes.
  r.lo = std::min(r.values[r.trials.front()], r.values[r.trials.back()]);
  r.hi = std::max(r.values[r.trials.front()], r.values[r.trials.back()]);
  out += "<p class=\"meta\">metric: <b>" + escape(metric.name) + "</b> (" + escape(metric.what) +
         " of each trial; " + (metric.higher_better ? "higher" : "lower") + " is better";
  if (r.trials.size() < x.trials.size())
    out += "; " + std::to_string(x.trials.size() - r.trials.size()) +
           " trial(s) without a value are not drawn";
  out += ")</p>" + parallel_coordinates(x, swept, r, metric) + "<div class=\"charts\">";
  for (size_t c : swept) out += scatter(x, c, r, metric);
  return out + "</div>" + best_trials(x, swept, r, metric, epochs);
}

std::vector<std::optional<double>> metric_values(
    const std::vector<std::vector<dps::EpochRow>>& epochs, const TrialMetric& metric) {
  std::vector<std::optional<double>> values;
  values.reserve(epochs.size());
  for (const auto& e : epochs) values.push_back(metric.of(e));
  return values;
}

std::string tag_spans(const std::vector<std::string>& tags) {
  std::string out;
  for (const auto& tag : tags) out += "<span class=\"tag\">" + escape(tag) + "</span>";
  return out;
}

std::vector<std::string> metric_colors(const std::vector<std::optional<double>>& values,
                                       const TrialMetric& metric) {
  double lo = 1e300, hi = -1e300;
  for (const auto& v : values)
    if (v) lo = std::min(lo, *v), hi = std::max(hi, *v);
  std::vector<std::string> out;
  for (const auto& v : values) {
    if (!v) {
      out.emplace_back();
      continue;
    }
    const double t = hi == lo ? 1 : (*v - lo) / (hi - lo);
    out.push_back(metric_color(metric.higher_better ? t : 1 - t));
  }
  return out;
}

const char* hparams_style() {
  return R"(
figure.pcoords { margin: 8px 0; } figure.pcoords svg { width: 100%; height: auto; display: block; }
figure.pcoords figcaption { font-size: 12px; color: #555; }
.pc-lines polyline { fill: none; stroke-width: 1.5; stroke-opacity: 0.75; }
.pc-lines polyline.out { stroke: #d8d8d8; stroke-opacity: 0.35; }
.pc-axis text.name { font-weight: 600; }
.pc-axis line.tick { stroke: #888; }
.pc-axis text { paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
rect.brush-area { fill: transparent; cursor: crosshair; }
rect.brush { fill: #4e79a7; fill-opacity: 0.18; stroke: #4e79a7; pointer-events: none; }
circle.out { opacity: 0.12; } g.series.out { opacity: 0.12; }
tr.out { display: none; }
p.shared span { white-space: nowrap; }
)";
}

namespace {

// The script, kept as it is read (JavaScript, not C++).
const char* const kBrushingScript = R"JS(
(function () {
  // Brushing in every parallel-coordinates chart: a selected range per axis; a trial stays when
  // its line passes through every selected range. The others get class "out" wherever the
  // experiment's section shows them (table rows, scatter points, learning curves).
  function init(fig) {
    var svg = fig.querySelector("svg");
    var section = fig.closest("section.experiment") || document;
    var lines = Array.prototype.slice.call(svg.querySelectorAll("g.pc-lines polyline"));
    var ys = lines.map(function (l) {
      var a = [];
      for (var i = 0; i < l.points.numberOfItems; ++i) a.push(l.points.getItem(i).y);
      return a;
    });
    var members = {};  // trial id -> the section's elements of that trial
    section.querySelectorAll("[data-trial]").forEach(function (el) {
      if (el.closest("svg") === svg) return;
      var id = el.getAttribute("data-trial");
      (members[id] = members[id] || []).push(el);
    });
    var brushes = {}, state = {}, shows = {};
    var count = fig.querySelector(".pc-count");
    function apply() {
      var keys = Object.keys(brushes), kept = {}, n = 0;
      lines.forEach(function (l, i) {
        var ok = true;
        for (var j = 0; j < keys.length && ok; ++j) {
          var b = brushes[keys[j]], y = ys[i][keys[j]];
          ok = y >= b[0] - 0.5 && y <= b[1] + 0.5;
        }
        l.classList.toggle("out", !ok);
        if (ok) kept[l.getAttribute("data-trial")] = true, ++n;
      });
      // Only the trials whose state changed are touched: each change restyles its elements.
      Object.keys(members).forEach(function (id) {
        var out = keys.length > 0 && !kept[id];
        if (state[id] === out) return;
        state[id] = out;
        members[id].forEach(function (el) { el.classList.toggle("out", out); });
      });
      count.textContent = keys.length ? n + " of " + lines.length + " trials selected" : lines.length + " trials";
      // Kept for the page's next load: `dprun report --refresh` reloads it while a sweep runs.
      try { sessionStorage.setItem(key, JSON.stringify(brushes)); } catch (err) { /* storage off */ }
    }
    var key = "dprun-brushes:" + location.pathname + ":" + (section.getAttribute ? section.getAttribute("data-experiment") : "");
    function userY(e) {
      var p = svg.createSVGPoint();
      p.x = e.clientX, p.y = e.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse()).y;
    }
    svg.querySelectorAll("g.pc-axis").forEach(function (g) {
      var k = g.getAttribute("data-axis");
      var area = g.querySelector("rect.brush-area"), rect = g.querySelector("rect.brush");
      var top = area.y.baseVal.value, bottom = top + area.height.baseVal.value;
      var y0 = null, pending = false;
      shows[k] = show;
      function show(a, b) {
        var lo = Math.max(top, Math.min(a, b)), hi = Math.min(bottom, Math.max(a, b));
        rect.setAttribute("y", lo);
        rect.setAttribute("height", hi - lo);
        rect.setAttribute("visibility", "visible");
        brushes[k] = [lo, hi];
      }
      area.addEventListener("pointerdown", function (e) {
        y0 = userY(e);
        try { area.setPointerCapture(e.pointerId); } catch (err) { /* synthetic pointer */ }
        e.preventDefault();
      });
      area.addEventListener("pointermove", function (e) {
        if (y0 === null) return;
        show(y0, userY(e));
        if (!pending) pending = true, requestAnimationFrame(function () { pending = false; apply(); });
      });
      area.addEventListener("pointerup", function (e) {
        if (y0 === null) return;
        var y1 = userY(e);
        if (Math.abs(y1 - y0) < 2) {
          delete brushes[k];
          rect.setAttribute("visibility", "hidden");
        } else {
          show(y0, y1);
        }
        y0 = null;
        apply();
      });
    });
    var kept = null;
    try { kept = JSON.parse(sessionStorage.getItem(key) || "null"); } catch (err) { kept = null; }
    if (kept && typeof kept === "object") {
      Object.keys(kept).forEach(function (k) {
        if (shows[k] && kept[k] && kept[k].length === 2) shows[k](kept[k][0], kept[k][1]);
      });
      apply();
    }
  }
  document.querySelectorAll("figure.pcoords").forEach(init);
})();
)JS";

}  // namespace

const char* hparams_script() { return kBrushingScript; }

}  // namespace html

}  // namespace dprun
