// Injected by test_report_html.cpp at the end of the report's <body>: once the page has loaded,
// looks at what the browser drew and laid out, and writes the findings as JSON into
// <pre id="dprun-test-result"> for the test to read from chromium's --dump-dom.
//
//   errors:   what report_html_errors.js recorded (script errors, console.error, failed loads)
//   page:     the window's width and the document's scroll width (wider: a horizontal scrollbar)
//   overflow: elements that stick out of their parent, the window or their own box
//   charts:   per chart its experiment and title, whether it is empty ("no data"), the data edges
//             of its plot area read through its own axis ticks, its series with their drawn
//             length and their vertices read back into data values through those axes (as a
//             reader of the chart would read them), and the problems found in its drawing.
//             Scatter charts (g.series.scatter: points, no line) are read the same way, with a
//             log x axis (svg data-xscale="log") read on log10 of its ticks, and a category x
//             axis (data-xscale="category") not read at all
//   pcoords:  per parallel-coordinates chart its axes (name, scale), its lines (each must have a
//             vertex on every axis, in axis order, inside the axis' span) and their problems
//   brushing: when the test set window.dprunBrushes (a list of {axis, from, to} in data values,
//             to: "top" for the axis' top end; or {axis, clear: true}), each is done with pointer
//             events on that axis' brush area, in order, and after each: how many lines, trial
//             table rows, scatter points and learning curves are still shown, and how long the
//             update took (ms)
//   timing:   ms from navigation start to this check (parsing, layout, the page's script);
//             with window.dprunTimingOnly set, the page is only timed and brushed, not checked
//
// The chart geometry mirrors runner/report/report_html.cpp: a plot area framed by two
// line.axis, y ticks as line.grid followed by their label, x ticks as numeric labels centred on
// their value, and a g.series per series with a polyline and, for data series, a circle per point.
(function () {
  var TOL = 1; // px (CSS or SVG user units): rounding of coordinates printed with 4 digits

  function fmt(v) {
    return Math.round(v * 100) / 100;
  }
  function describe(el) {
    var s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    if (typeof el.className === "string" && el.className) s += "." + el.className.split(" ").join(".");
    var text = (el.textContent || "").replace(/\s+/g, " ").trim();
    if (text) s += ' "' + text.slice(0, 40) + '"';
    return s;
  }

  // An element that scrolls sideways on purpose (overflow-x auto or scroll): what it holds may
  // be wider than it, and is reached by scrolling it, not the page.
  function scrolls(el) {
    var o = getComputedStyle(el).overflowX;
    return o === "auto" || o === "scroll";
  }
  function insideScroller(el) {
    for (var p = el.parentElement; p && p !== document.body; p = p.parentElement) if (scrolls(p)) return true;
    return false;
  }

  // (b) Nothing wider than its container or the window.
  function overflow(result) {
    var root = document.documentElement;
    var width = root.clientWidth;
    result.page = { window: window.innerWidth, client: width, scroll: root.scrollWidth };
    var all = document.body.querySelectorAll("*");
    for (var i = 0; i < all.length; ++i) {
      var el = all[i];
      if (el.id === "dprun-test-result") continue;
      if (el.closest("svg") && el.tagName.toLowerCase() !== "svg") continue; // charts(): inside
      var r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue; // not rendered (e.g. display: none)
      if (insideScroller(el)) continue; // clipped by its scrolling box, reached by scrolling it
      if (r.left < -TOL || r.right > width + TOL)
        result.overflow.push(
          describe(el) + " spans x " + fmt(r.left) + ".." + fmt(r.right) + " outside the window 0.." + width
        );
      var parent = el.parentElement;
      if (parent && parent !== document.body.parentElement) {
        var p = parent.getBoundingClientRect();
        if (r.left < p.left - TOL || r.right > p.right + TOL)
          result.overflow.push(
            describe(el) + " spans x " + fmt(r.left) + ".." + fmt(r.right) + " outside its parent " +
              describe(parent).split(" ")[0] + " (" + fmt(p.left) + ".." + fmt(p.right) + ")"
          );
      }
      // Content wider than the element's own box (clipped, scrolled or spilling out).
      if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + TOL && !scrolls(el))
        result.overflow.push(
          describe(el) + ": content " + el.scrollWidth + " px wide in a box of " + el.clientWidth + " px"
        );
    }
  }

  // A least-squares line value = a + b * position through the ticks; null when fewer than 2.
  function fit(ticks, problems, axis) {
    if (ticks.length < 2) {
      problems.push(axis + " axis: " + ticks.length + " tick(s), too few to read values");
      return null;
    }
    var n = ticks.length, sp = 0, sv = 0, spp = 0, spv = 0;
    ticks.forEach(function (t) {
      sp += t.pos;
      sv += t.value;
      spp += t.pos * t.pos;
      spv += t.pos * t.value;
    });
    var b = (n * spv - sp * sv) / (n * spp - sp * sp);
    var a = (sv - b * sp) / n;
    var lo = Math.min.apply(null, ticks.map(function (t) { return t.value; }));
    var hi = Math.max.apply(null, ticks.map(function (t) { return t.value; }));
    ticks.forEach(function (t) {
      if (Math.abs(a + b * t.pos - t.value) > 0.005 * (hi - lo))
        problems.push(axis + " axis: tick " + t.value + " at " + fmt(t.pos) + " is off the axis' linear scale");
    });
    if (!(isFinite(a) && isFinite(b)) || b === 0) {
      problems.push(axis + " axis: the ticks do not give a scale");
      return null;
    }
    return function (pos) {
      return a + b * pos;
    };
  }

  // From an element's own coordinates to its svg's user units (viewBox), transforms applied:
  // where it is drawn, whatever the attributes say.
  function toUser(el, svg) {
    return svg.getScreenCTM().inverse().multiply(el.getScreenCTM());
  }

  // The bounding box of an SVG element in its svg's user units.
  function userBox(el, svg) {
    var b = el.getBBox();
    var m = toUser(el, svg);
    var xs = [], ys = [];
    [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height], [b.x + b.width, b.y + b.height]].forEach(
      function (c) {
        var p = new DOMPoint(c[0], c[1]).matrixTransform(m);
        xs.push(p.x);
        ys.push(p.y);
      }
    );
    var x0 = Math.min.apply(null, xs), y0 = Math.min.apply(null, ys);
    var x1 = Math.max.apply(null, xs), y1 = Math.max.apply(null, ys);
    return { x: x0, y: y0, right: x1, bottom: y1, width: x1 - x0, height: y1 - y0 };
  }

  function visible(el) {
    var s = getComputedStyle(el);
    return s.display !== "none" && s.visibility !== "hidden" && parseFloat(s.opacity) > 0;
  }

  // (a) Every chart drawn, and drawn where its data says.
  function chart(svg) {
    var section = svg.closest("section.experiment");
    var titleEl = svg.querySelector("title");
    var c = {
      experiment: section ? section.getAttribute("data-experiment") : "",
      title: titleEl ? titleEl.textContent : "",
      empty: false,
      problems: [],
      series: []
    };
    var vb = svg.viewBox.baseVal;
    var rect = svg.getBoundingClientRect();
    if (!visible(svg) || rect.width < 100 || rect.height < 50)
      c.problems.push("the chart is " + fmt(rect.width) + " x " + fmt(rect.height) + " px on the page");
    if (vb && vb.width > 0 && Math.abs(rect.height / rect.width - vb.height / vb.width) > 0.01)
      c.problems.push("the chart is distorted: " + fmt(rect.width) + " x " + fmt(rect.height) + " px for a viewBox " + vb.width + " x " + vb.height);
    // Everything drawn lies inside the chart (an svg clips what sticks out).
    var drawn = svg.querySelectorAll("text, line, polyline, path, circle, rect");
    for (var i = 0; i < drawn.length; ++i) {
      var bb = userBox(drawn[i], svg);
      if (bb.x < vb.x - TOL || bb.y < vb.y - TOL || bb.right > vb.x + vb.width + TOL || bb.bottom > vb.y + vb.height + TOL)
        c.problems.push(describe(drawn[i]) + " at " + fmt(bb.x) + "," + fmt(bb.y) + ".." + fmt(bb.right) + "," + fmt(bb.bottom) + " is cut off by the chart's edge");
    }
    var axes = svg.querySelector("g.axes");
    if (!axes) {
      c.empty = /no data/.test(svg.textContent);
      if (!c.empty) c.problems.push("neither axes nor 'no data'");
      if (svg.querySelector("g.series")) c.problems.push("series without axes");
      return c;
    }
    // The plot area, from the axis lines as drawn.
    var plot = null;
    var lines = axes.querySelectorAll("line.axis");
    for (var i = 0; i < lines.length; ++i) {
      var b = userBox(lines[i], svg);
      plot = plot || {};
      if (b.width === 0) (plot.left = b.x), (plot.top = b.y), (plot.bottom = b.y + b.height);
      if (b.height === 0) plot.right = b.x + b.width;
    }
    if (!plot || [plot.left, plot.right, plot.top, plot.bottom].some(function (v) { return v === undefined; })) {
      c.problems.push("no x and y axis lines");
      return c;
    }
    c.plot = plot;
    var pw = plot.right - plot.left, ph = plot.bottom - plot.top;
    // The scales, as a reader reads them: y from the grid lines and their labels, x from the
    // labels centred under their value.
    var yticks = [], xticks = [];
    axes.querySelectorAll("line.grid").forEach(function (g) {
      var label = g.nextElementSibling;
      var y = userBox(g, svg).y;
      if (!label || label.tagName.toLowerCase() !== "text" || isNaN(parseFloat(label.textContent))) {
        c.problems.push("a grid line at y " + fmt(y) + " without a value label");
        return;
      }
      var lb = userBox(label, svg);
      if (Math.abs(lb.y + lb.height / 2 - y) > 6)
        c.problems.push("y tick label " + label.textContent + " is not beside its grid line at " + fmt(y));
      if (lb.x + lb.width > plot.left + TOL)
        c.problems.push("y tick label " + label.textContent + " runs into the plot area");
      yticks.push({ pos: y, value: parseFloat(label.textContent) });
    });
    axes.querySelectorAll("text").forEach(function (t) {
      if (t.getAttribute("text-anchor") !== "middle" || !/^-?[0-9.e+-]+$/.test(t.textContent.trim())) return;
      var b = userBox(t, svg);
      if (b.y < plot.bottom) c.problems.push("x tick label " + t.textContent + " is not below the x axis");
      xticks.push({ pos: b.x + b.width / 2, value: parseFloat(t.textContent) });
    });
    var xscale = svg.getAttribute("data-xscale") || "linear";
    c.xscale = xscale;
    var X = null;
    if (xscale === "category") {
      X = function () { return null; };
    } else if (xscale === "log") {
      var L = fit(xticks.map(function (t) { return { pos: t.pos, value: Math.log10(t.value) }; }), c.problems, "x (log)");
      if (L) X = function (pos) { return Math.pow(10, L(pos)); };
    } else {
      X = fit(xticks, c.problems, "x");
    }
    var Y = fit(yticks, c.problems, "y");
    if (!X || !Y) return c;
    c.x = [X(plot.left), X(plot.right)];
    c.y = [Y(plot.bottom), Y(plot.top)];
    if (!(c.y[1] > c.y[0])) c.problems.push("the y axis runs downwards: " + c.y[0] + " at the bottom, " + c.y[1] + " at the top");
    var all = { left: Infinity, right: -Infinity, top: Infinity, bottom: -Infinity };
    svg.querySelectorAll("g.series").forEach(function (g) {
      var label = g.getAttribute("data-label") || "";
      var s = { label: label, reference: g.classList.contains("reference"), points: [] };
      c.series.push(s);
      if (g.classList.contains("scatter")) {
        s.scatter = true;
        g.querySelectorAll("circle").forEach(function (m, k) {
          var mb = userBox(m, svg);
          var cx = mb.x + mb.width / 2, cy = mb.y + mb.height / 2;
          if (!(mb.width > 0) || !visible(m)) c.problems.push("series " + label + ": point " + k + " is not drawn");
          if (cx < plot.left - TOL || cx > plot.right + TOL || cy < plot.top - TOL || cy > plot.bottom + TOL)
            c.problems.push("series " + label + ": point " + fmt(cx) + "," + fmt(cy) + " is outside the plot area");
          all.top = Math.min(all.top, cy);
          all.bottom = Math.max(all.bottom, cy);
          s.points.push([X(cx), Y(cy)]);
        });
        return;
      }
      var line = g.querySelector("polyline, path");
      if (!line) {
        c.problems.push("series " + label + ": no line");
        return;
      }
      var st = getComputedStyle(line);
      if (!visible(line) || st.stroke === "none" || !(parseFloat(st.strokeWidth) > 0))
        c.problems.push("series " + label + ": its line is not visible (stroke " + st.stroke + ", width " + st.strokeWidth + ")");
      s.length = line.getTotalLength();
      var bb = userBox(line, svg);
      var m = toUser(line, svg);
      var vertices = [];
      function vertex(p) {
        var q = new DOMPoint(p.x, p.y).matrixTransform(m);
        vertices.push([q.x, q.y]);
      }
      if (line.points) {
        for (var k = 0; k < line.points.numberOfItems; ++k) vertex(line.points.getItem(k));
      } else if (s.length > 0) {
        vertex(line.getPointAtLength(0));
        vertex(line.getPointAtLength(s.length));
      }
      if (vertices.length === 0) c.problems.push("series " + label + ": its line has no points");
      if (vertices.length >= 2 && !(s.length > 0 && bb.width + bb.height > 0))
        c.problems.push("series " + label + ": its line of " + vertices.length + " points has no geometry (length " + s.length + ", box " + bb.width + " x " + bb.height + ")");
      vertices.forEach(function (v) {
        if (v[0] < plot.left - TOL || v[0] > plot.right + TOL || v[1] < plot.top - TOL || v[1] > plot.bottom + TOL)
          c.problems.push("series " + label + ": point " + fmt(v[0]) + "," + fmt(v[1]) + " is outside the plot area");
        all.left = Math.min(all.left, v[0]);
        all.right = Math.max(all.right, v[0]);
        all.top = Math.min(all.top, v[1]);
        all.bottom = Math.max(all.bottom, v[1]);
        s.points.push([X(v[0]), Y(v[1])]);
      });
      // Data series mark every point, on the line.
      var markers = g.querySelectorAll("circle");
      s.dense = g.classList.contains("dense");
      if (s.dense && markers.length > 0) c.problems.push("series " + label + ": a dense series with markers");
      if (!s.reference && !s.dense && markers.length !== vertices.length)
        c.problems.push("series " + label + ": " + markers.length + " markers for " + vertices.length + " points");
      for (var k = 0; k < markers.length && k < vertices.length; ++k) {
        var mb = userBox(markers[k], svg);
        if (!(mb.width > 0) || !visible(markers[k]))
          c.problems.push("series " + label + ": marker " + k + " is not drawn");
        if (Math.abs(mb.x + mb.width / 2 - vertices[k][0]) > TOL || Math.abs(mb.y + mb.height / 2 - vertices[k][1]) > TOL)
          c.problems.push("series " + label + ": marker " + k + " is off its line");
      }
    });
    if (c.series.length === 0) {
      c.problems.push("axes but no series");
      return c;
    }
    // The data fill the plot area: x is not padded (first and last x at its edges); y is padded
    // by 5% of the data's range (4.8% of the height) at the top, and at the bottom unless the
    // axis starts at 0.
    var scatter = c.series.some(function (s) { return s.scatter; });
    if (!scatter && (Math.abs(all.left - plot.left) > TOL || Math.abs(all.right - plot.right) > TOL))
      c.problems.push("the series span x " + fmt(all.left) + ".." + fmt(all.right) + ", not the plot area's " + fmt(plot.left) + ".." + fmt(plot.right));
    // (One value throughout: nothing to fill, it is drawn where its axis says.)
    var flat = all.bottom - all.top < TOL;
    if (!flat && all.top - plot.top > 0.06 * ph)
      c.problems.push("the highest point is " + fmt(all.top - plot.top) + " below the top of a plot area " + fmt(ph) + " high");
    if (!flat && plot.bottom - all.bottom > 0.06 * ph && Math.abs(c.y[0]) > 0.005 * (c.y[1] - c.y[0]))
      c.problems.push("the lowest point is " + fmt(plot.bottom - all.bottom) + " above the bottom of a plot area " + fmt(ph) + " high, which is at " + c.y[0] + ", not 0");
    return c;
  }

  // A parallel-coordinates chart: every line meets every axis, in order, within its span.
  function pcoords(fig) {
    var svg = fig.querySelector("svg");
    var section = fig.closest("section.experiment");
    var p = { experiment: section ? section.getAttribute("data-experiment") : "", axes: [], lines: 0, problems: [] };
    var axes = Array.prototype.slice.call(svg.querySelectorAll("g.pc-axis"));
    var spans = axes.map(function (g) {
      var b = userBox(g.querySelector("line.axis"), svg);
      p.axes.push({ name: g.getAttribute("data-name"), scale: g.getAttribute("data-scale"), ticks: g.querySelectorAll("text.tick").length });
      if (!g.querySelector("rect.brush-area")) p.problems.push("axis " + g.getAttribute("data-name") + ": no brush area");
      return b;
    });
    svg.querySelectorAll("g.pc-lines polyline").forEach(function (l) {
      ++p.lines;
      var id = l.getAttribute("data-trial");
      var m = toUser(l, svg);
      if (l.points.numberOfItems !== axes.length) {
        p.problems.push("trial " + id + ": " + l.points.numberOfItems + " vertices for " + axes.length + " axes");
        return;
      }
      if (!visible(l) || getComputedStyle(l).stroke === "none") p.problems.push("trial " + id + ": its line is not visible");
      for (var k = 0; k < axes.length; ++k) {
        var q = new DOMPoint(l.points.getItem(k).x, l.points.getItem(k).y).matrixTransform(m);
        var a = spans[k];
        if (Math.abs(q.x - a.x) > TOL || q.y < a.y - TOL || q.y > a.bottom + TOL)
          p.problems.push("trial " + id + ": vertex " + k + " at " + fmt(q.x) + "," + fmt(q.y) + " is off axis " + p.axes[k].name);
      }
    });
    return p;
  }

  // The shown (not "out") trials of each kind in the section of `fig`.
  function shown(fig) {
    var section = fig.closest("section.experiment");
    // Rows must be hidden by the stylesheet (their computed display); in charts the class dims.
    function count(sel, computed) {
      var n = 0;
      section.querySelectorAll(sel).forEach(function (el) {
        if (!el.classList.contains("out") && (!computed || getComputedStyle(el).display !== "none")) ++n;
      });
      return n;
    }
    return {
      lines: count("g.pc-lines polyline"),
      rows: count("table:not(.best) tbody tr[data-trial]", true),
      points: count("g.series.scatter circle"),
      curves: count("g.series[data-trial]:not(.scatter)")
    };
  }

  // Brushing as a user does it: pointer events on an axis' brush area.
  function brushing(result) {
    var fig = document.querySelector("figure.pcoords");
    if (!fig) return result.brushing.push({ problem: "no parallel-coordinates chart to brush" });
    var svg = fig.querySelector("svg");
    function axisOf(name) {
      var found = null;
      svg.querySelectorAll("g.pc-axis").forEach(function (g) {
        if (g.getAttribute("data-name") === name) found = g;
      });
      return found;
    }
    // The screen y of a data value on an axis, from its ticks (linear, or log10 for a log axis).
    function screenY(g, value) {
      var log = g.getAttribute("data-scale") === "log";
      var ticks = [];
      g.querySelectorAll("text.tick").forEach(function (t) {
        var b = t.getBoundingClientRect();
        var v = parseFloat(t.getAttribute("data-value"));
        ticks.push({ pos: log ? Math.log10(v) : v, value: b.top + b.height / 2 });
      });
      var f = fit(ticks, [], "brush");
      var area = g.querySelector("rect.brush-area").getBoundingClientRect();
      if (value === "top") return area.top - 2; // the brush stops at the axis' end
      return f(log ? Math.log10(value) : value);
    }
    function fire(el, type, x, y) {
      el.dispatchEvent(new PointerEvent(type, { bubbles: true, cancelable: true, pointerId: 1, isPrimary: true, clientX: x, clientY: y, buttons: type === "pointerup" ? 0 : 1 }));
    }
    (window.dprunBrushes || []).forEach(function (b) {
      var g = axisOf(b.axis);
      var step = { axis: b.axis };
      if (!g) {
        step.problem = "no axis " + b.axis;
        result.brushing.push(step);
        return;
      }
      var area = g.querySelector("rect.brush-area");
      var r = area.getBoundingClientRect();
      var x = r.left + r.width / 2;
      var y0 = b.clear ? r.top + r.height / 2 : screenY(g, b.from);
      var y1 = b.clear ? y0 : screenY(g, b.to);
      var t0 = performance.now();
      fire(area, "pointerdown", x, y0);
      fire(area, "pointermove", x, (y0 + y1) / 2);
      fire(area, "pointermove", x, y1);
      fire(area, "pointerup", x, y1);
      document.body.getBoundingClientRect(); // the style and layout the update causes
      step.ms = performance.now() - t0;
      step.shown = shown(fig);
      step.caption = fig.querySelector(".pc-count").textContent;
      result.brushing.push(step);
    });
  }

  function check() {
    var result = { errors: window.dprunTestErrors || ["report_html_errors.js did not run"], overflow: [], charts: [], pcoords: [], brushing: [] };
    try {
      result.timing = performance.now();
      // window.dprunTimingOnly (a big page, measured): no layout and geometry checks, which
      // would lay out and measure every element of it.
      if (!window.dprunTimingOnly) {
        overflow(result);
        document.querySelectorAll("figure.chart svg").forEach(function (svg) {
          result.charts.push(chart(svg));
        });
        document.querySelectorAll("figure.pcoords").forEach(function (fig) {
          result.pcoords.push(pcoords(fig));
        });
      }
      if (window.dprunBrushes) {
        var before = document.querySelector("figure.pcoords");
        if (before) result.before = shown(before);
        brushing(result);
      }
    } catch (e) {
      result.fatal = String(e && e.stack ? e.stack : e);
    }
    var pre = document.createElement("pre");
    pre.id = "dprun-test-result";
    // No & < > in the text, so the dumped DOM holds the JSON verbatim.
    pre.textContent = JSON.stringify(result).replace(/[&<>]/g, function (ch) {
      return "\\u" + ("000" + ch.charCodeAt(0).toString(16)).slice(-4);
    });
    pre.style.display = "none";
    document.body.appendChild(pre);
  }

  // After the load event, and after the tasks queued until then (the events of unhandled
  // promise rejections come in one): chromium's --virtual-time-budget runs them before it
  // dumps the DOM, however slow the machine.
  function later() {
    setTimeout(check, 0);
  }
  if (document.readyState === "complete") later();
  else window.addEventListener("load", later);
})();
