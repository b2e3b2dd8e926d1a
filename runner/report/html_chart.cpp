// The SVG line charts of `dprun report --html` (html_chart.hpp).
#include "report/html_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace dprun::html {

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

std::string num(double v, const char* fmt) {
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Tableau 10: distinct in colour and in print (grey scale differs too).
const char* const kColors[10] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};



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
  if (f.y1 == f.y0) {  // one value: above a forced lower end, else in the middle
    const double d = f.y0 == 0 ? 1 : std::fabs(f.y0) * 0.1;
    if (c.y_min && *c.y_min < f.y0) f.y1 = f.y0 + d;
    else f.y0 -= d, f.y1 += d;
  }
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
    const bool dense = !c.markers && !s.trial.empty();
    out += "<g class=\"series" + std::string(s.trial.empty() ? " reference" : "") +
           (dense ? " dense" : "") + "\" data-label=\"" + escape(s.label) + "\"" +
           (s.trial.empty() ? "" : " data-trial=\"" + s.trial + "\"") + ">";
    if (dense) out += "<title>" + escape(s.label) + "</title>";
    std::string points;
    for (const auto& [x, y] : s.points) {
      if (std::isfinite(y)) points += num(f.sx(x)) + "," + num(f.sy(y)) + " ";
    }
    out += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"2\"" +
           (s.dashed ? " stroke-dasharray=\"5 4\"" : "") + " points=\"" + points + "\"/>";
    if (!s.trial.empty() && c.markers) {  // data has markers; reference lines do not
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

}  // namespace dprun::html
