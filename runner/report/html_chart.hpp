#pragma once
// The SVG charts of `dprun report --html`: line charts with axes, ticks and a legend (see
// report_html.cpp for why they are drawn here), and the text helpers of the page.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dprun::html {

/// Text for HTML content and attribute values: & < > " escaped.
std::string escape(const std::string& s);
/// A number for the page: printf's `fmt`.
std::string num(double v, const char* fmt = "%.4g");
/// Tableau 10: distinct in colour and in print (grey scale differs too).
extern const char* const kColors[10];

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
  /// A marker (a circle with its value as a tooltip) per data point. Off for charts of many
  /// trials, whose lines then carry class "dense" and the trial's label as a tooltip.
  bool markers = true;
};

/// 1, 2, 5 x 10^k steps giving about `target` ticks over [lo, hi].
double nice_step(double lo, double hi, int target);

/// The chart's legend: a swatch (dashed for dashed series) and the label of each series.
std::string legend(const std::vector<Series>& series);

// Where a chart's values land: its data's extent (padded) and the plot area's scales.
struct Frame {
  double width = 520, height = 300, left = 62, right = 16, top = 34, bottom = 46;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  double pw() const { return width - left - right; }
  double ph() const { return height - top - bottom; }
  double sx(double x) const { return left + (x - x0) / (x1 - x0) * pw(); }
  double sy(double y) const { return top + (1 - (y - y0) / (y1 - y0)) * ph(); }
};

/// The frame of a chart's finite points; nullopt when it has none.
std::optional<Frame> frame_of(const Chart& c);
/// Axes, grid, y ticks with their labels, x ticks (integer_x), axis titles: <g class="axes">.
std::string svg_axes(const Chart& c, const Frame& f);
/// A whole chart: <figure class="chart"><svg>, or its "no data" form.
std::string svg_chart(const Chart& c);

}  // namespace dprun::html
