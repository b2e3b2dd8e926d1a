// `dprun report --html`: the page's content from a database built here, and the page rendered
// by a real browser (Debian's chromium, headless) with the test's scripts injected
// (report_html_errors.js, report_html_check.js): no script error, nothing wider than its box or
// the window, every chart drawn with visible lines where its data says (read back through the
// chart's own axes). A screenshot (build/report-html-test.png) and the page with the test's
// scripts (build/report-html-test.html) are saved for a human to look at. Without chromium the
// browser half is skipped with a message.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "dpstore/store.hpp"
#include "report/report.hpp"
#include "settings/settings.hpp"
#include "support/check.hpp"

namespace {

using dprun::TrialSettings;

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

/// A database of two experiments: a scaling study (1, 2 and 4 GPUs, 3 epochs each, done) and one
/// with a failed trial whose description and error need escaping.
void fill(const std::string& path) {
  const auto& table = dprun::builtin_settings();
  dps::Store store(path, dps::Store::Mode::read_write, table.store_columns());
  const int64_t scaling = store.upsert_experiment("scaling", "1, 2 and 4 GPUs", "toml");
  for (int64_t gpus : {1, 2, 4}) {
    TrialSettings s(table);
    s.set("model", std::string("lenet"));
    s.set("gpus", gpus);
    s.set("batch_size", 256 * gpus);
    s.set("per_gpu_batch", int64_t{256});
    s.set("epochs", int64_t{3});
    const auto t =
        store.ensure_trial(scaling, "hash" + std::to_string(gpus), gpus, dprun::to_store(s));
    dps::TrialStart start;
    start.backend = "cpu";
    start.devices = "CPU (2 threads) x" + std::to_string(gpus);
    start.host = "host";
    store.start_trial(t.id, start);
    for (int64_t e = 1; e <= 3; ++e) {
      dps::EpochRow row;
      row.trial_id = t.id;
      row.epoch = e;
      row.train_loss = 2.0 / static_cast<double>(e);
      row.test_acc = 0.5 + 0.1 * static_cast<double>(e);
      row.seconds = 10.0 / static_cast<double>(gpus);
      store.record_epoch(row);
    }
    store.finish_trial(t.id, dps::TrialStatus::done);
  }
  const int64_t broken = store.upsert_experiment("broken", "<script>alert(1)</script>", "toml");
  TrialSettings s(table);
  s.set("model", std::string("resnet18"));
  const auto t = store.ensure_trial(broken, "hashx", 0, dprun::to_store(s));
  dps::TrialStart start;
  start.backend = "cpu";
  start.devices = "CPU";
  store.start_trial(t.id, start);
  store.finish_trial(t.id, dps::TrialStatus::failed, "killed by SIGKILL & <lost>");
}

}  // namespace

TEST_CASE("report --html: curves, scaling and trials in one self-contained page", "[report]") {
  dptest::TempDir dir;
  const std::string db = dir.path() + "/r.db";
  fill(db);
  dps::Store store(db, dps::Store::Mode::read_only);
  const std::string html = dprun::format_html_report(store);
  // Learning curves: train loss and test accuracy, a series per trial (3 + 1 trials).
  CHECK(count(html, "<g class=\"series\" data-label=\"lenet gpus=1") == 2);
  CHECK(count(html, "data-trial=\"") >= 8);
  // Scaling: seconds, speedup, efficiency for the lenet group, each with 3 points; the ideals.
  CHECK(html.find("Speedup over 1 GPU") != std::string::npos);
  CHECK(count(html, "class=\"series reference\" data-label=\"ideal") == 2);
  // The trials table, with the failed trial's error, everything escaped.
  CHECK(count(html, "<tr class=\"done\"") == 3);
  CHECK(count(html, "<tr class=\"failed\"") == 1);
  CHECK(html.find("killed by SIGKILL &amp; &lt;lost&gt;") != std::string::npos);
  CHECK(html.find("<script>") == std::string::npos);
  CHECK(html.find("&lt;script&gt;alert(1)&lt;/script&gt;") != std::string::npos);
  // Self-contained: no script, stylesheet, image or font fetched from anywhere.
  CHECK_FALSE(std::regex_search(html, std::regex(R"((src|href)\s*=)")));
  CHECK_FALSE(std::regex_search(html, std::regex(R"(url\()")));
  CHECK(html.find("@media print") != std::string::npos);
}

namespace {

using dprun::Json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The report with the test's scripts: report_html_errors.js first thing in <head> (before any
/// script of the page could fail), report_html_check.js last in <body>.
std::string instrument(std::string html) {
  const std::string dir = std::string(DPRUN_TEST_SOURCE_DIR) + "/tests/runner/";
  const std::string errors = read_file(dir + "report_html_errors.js");
  const std::string check = read_file(dir + "report_html_check.js");
  REQUIRE(!errors.empty());
  REQUIRE(!check.empty());
  const size_t head = html.find("<head>");
  const size_t body = html.rfind("</body>");
  REQUIRE(head != std::string::npos);
  REQUIRE(body != std::string::npos);
  html.insert(body, "<script>" + check + "</script>");
  html.insert(head + 6, "<script>" + errors + "</script>");
  return html;
}

/// What report_html_check.js wrote into the DOM chromium dumped.
Json findings(const std::string& dom) {
  const size_t pre = dom.rfind("<pre id=\"dprun-test-result\"");  // last in <body>
  const std::string tail = dom.substr(dom.size() - std::min<size_t>(dom.size(), 300));
  INFO("no result of report_html_check.js in the DOM from chromium ("
       << dom.size() << " bytes), which ends: " << tail);
  REQUIRE(pre != std::string::npos);
  const size_t begin = dom.find('>', pre) + 1;
  const size_t end = dom.find("</pre>", begin);
  REQUIRE(end != std::string::npos);
  return Json::parse(dom.substr(begin, end - begin));
}

/// A findings list, one item a line ("" when empty, so a CHECK shows the items).
std::string lines(const Json& list) {
  std::string out;
  for (const auto& item : list.items()) out += item.as_string() + "\n";
  return out;
}

const Json* chart_of(const Json& result, const std::string& experiment, const std::string& title) {
  for (const auto& c : result.at("charts").items())
    if (c.at("experiment").as_string() == experiment && c.at("title").as_string() == title)
      return &c;
  return nullptr;
}

using Points = std::vector<std::pair<double, double>>;

/// The series of `chart` whose label starts with `label` is drawn at `expected` data values, as
/// read through the chart's axes, within 1% of each axis' range (a pixel is about 0.2-0.5%).
void check_drawn(const Json& chart, const std::string& label, const Points& expected) {
  const Json* series = nullptr;
  for (const auto& s : chart.at("series").items())
    if (s.at("label").as_string().rfind(label, 0) == 0) series = &s;
  INFO(chart.at("title").as_string() << ": series " << label);
  REQUIRE(series != nullptr);
  const auto& x = chart.at("x").items();
  const auto& y = chart.at("y").items();
  const double xtol = 0.01 * (x[1].as_double() - x[0].as_double());
  const double ytol = 0.01 * (y[1].as_double() - y[0].as_double());
  const auto& drawn = series->at("points").items();
  REQUIRE(drawn.size() == expected.size());
  for (size_t i = 0; i < drawn.size(); ++i) {
    const double dx = drawn[i].items()[0].as_double(), dy = drawn[i].items()[1].as_double();
    INFO("point " << i << ": drawn at (" << dx << ", " << dy << "), data (" << expected[i].first
                  << ", " << expected[i].second << ")");
    CHECK(std::fabs(dx - expected[i].first) <= xtol);
    CHECK(std::fabs(dy - expected[i].second) <= ytol);
  }
}

}  // namespace

TEST_CASE("report --html renders in a real browser with every series in the DOM", "[report]") {
  std::string chromium;
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (std::filesystem::exists(c)) chromium = c;
  if (chromium.empty()) {
    DPTEST_SKIPPED(
        "chromium not found (Debian: apt-get install chromium, or scripts/install-deps --tests): "
        "the HTML report was not rendered in a browser");
    return;
  }
  dptest::TempDir dir;
  const std::string db = dir.path() + "/r.db";
  fill(db);
  const std::string page = dir.path() + "/report.html";
  std::string html;
  {
    dps::Store store(db, dps::Store::Mode::read_only);
    html = dprun::format_html_report(store);
  }
  std::ofstream(page) << html;
  // A copy with the test's scripts, kept next to the screenshot: opened in a browser, its
  // console and hidden <pre id="dprun-test-result"> show what the checks found.
  const std::string checked = std::string(DPRUN_TEST_BINARY_DIR) + "/report-html-test.html";
  std::ofstream(checked) << instrument(html);
  // As the machine's own browser test does: headless, no sandbox (root in CI), no background
  // networking (the network is closed), a fresh profile.
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
      " --disable-background-networking --disable-component-update --disable-sync"
      " --user-data-dir=" +
      dir.path() + "/profile";
  auto run = [&](const std::string& args) {
    const std::string cmd = "timeout 120 " + chromium + flags + " " + args + " 2>/dev/null";
    std::string out;
    if (std::FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
      pclose(p);
    }
    return out;
  };
  // A desktop window, a narrow one (two charts a row, then one) and a phone's (the trial table
  // scrolls in its own box). The virtual time budget
  // lets the page settle (load event, layout) before the DOM is dumped, whatever the machine's
  // speed.
  for (int width : {1280, 800, 500}) {
    INFO("window " << width << " px wide");
    const Json result =
        findings(run("--window-size=" + std::to_string(width) +
                     ",1000 --virtual-time-budget=5000 --dump-dom file://" + checked));
    INFO("report_html_check.js failed: " << result.get("fatal").dump());
    REQUIRE(result.get("fatal").is_null());
    // (c) No script error, console.error or failed load, from before the page's first element.
    CHECK(lines(result.at("errors")) == "");
    // (b) Nothing overflows: no horizontal scrollbar, every element inside its parent and the
    // window, no element's content wider than its box.
    const Json& p = result.at("page");
    CHECK(p.at("window").as_int() == width);
    CHECK(p.at("scroll").as_int() <= p.at("client").as_int());
    CHECK(lines(result.at("overflow")) == "");
    // (a) Every chart drawn: 2 learning curves and 3 scaling charts for "scaling", the failed
    // trial's 2 "no data" charts; each with visible lines of non-zero length inside the plot
    // area, markers on them, the series spanning the plot area, readable axes.
    REQUIRE(result.at("charts").items().size() == 7);
    int empty = 0;
    for (const auto& c : result.at("charts").items()) {
      INFO(c.at("experiment").as_string() << ": " << c.at("title").as_string());
      CHECK(lines(c.at("problems")) == "");
      empty += c.at("empty").as_bool() ? 1 : 0;
    }
    CHECK(empty == 2);
    // ... and the lines are where the data says, read back through each chart's own axes.
    const Json* loss = chart_of(result, "scaling", "Training loss");
    const Json* acc = chart_of(result, "scaling", "Test accuracy");
    const Json* seconds = chart_of(result, "scaling", "Seconds per epoch");
    const Json* speedup = chart_of(result, "scaling", "Speedup over 1 GPU");
    const Json* efficiency = chart_of(result, "scaling", "Scaling efficiency");
    REQUIRE(loss);
    REQUIRE(acc);
    REQUIRE(seconds);
    REQUIRE(speedup);
    REQUIRE(efficiency);
    CHECK(loss->at("series").items().size() == 3);
    CHECK(acc->at("series").items().size() == 3);
    for (int gpus : {1, 2, 4}) {
      const std::string label = "lenet gpus=" + std::to_string(gpus);
      check_drawn(*loss, label, {{1, 2.0}, {2, 1.0}, {3, 2.0 / 3}});
      check_drawn(*acc, label, {{1, 0.6}, {2, 0.7}, {3, 0.8}});
    }
    // Seconds per epoch 10 / gpus (the same every epoch), so speedup = gpus, efficiency 1.
    CHECK(seconds->at("series").items().size() == 1);
    check_drawn(*seconds, "lenet", {{1, 10}, {2, 5}, {4, 2.5}});
    CHECK(speedup->at("series").items().size() == 2);
    check_drawn(*speedup, "lenet", {{1, 1}, {2, 2}, {4, 4}});
    check_drawn(*speedup, "ideal (linear)", {{1, 1}, {4, 4}});
    CHECK(efficiency->at("series").items().size() == 2);
    check_drawn(*efficiency, "lenet", {{1, 1}, {2, 1}, {4, 1}});
    check_drawn(*efficiency, "ideal", {{1, 1}, {4, 1}});
  }
  const std::string shot = std::string(DPRUN_TEST_BINARY_DIR) + "/report-html-test.png";
  std::filesystem::remove(shot);
  run("--window-size=1200,1600 --screenshot=" + shot + " file://" + page);
  REQUIRE(std::filesystem::exists(shot));
  CHECK(std::filesystem::file_size(shot) > 20000);  // a rendered page, not a blank one
}
