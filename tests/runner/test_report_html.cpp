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
#include "base/os.hpp"
#include "cli_helpers.hpp"
#include "dpstore/store.hpp"
#include "report/html_chart.hpp"
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
  const int64_t scaling =
      store.upsert_experiment("scaling", "1, 2 and 4 GPUs", "toml", dprun::kDefaultsGeneration);
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
  const int64_t broken = store.upsert_experiment("broken", "<script>alert(1)</script>", "toml",
                                                 dprun::kDefaultsGeneration);
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
  CHECK(html.find("<script>alert") == std::string::npos);
  CHECK(count(html, "<script>") == 1);  // the page's own: brushing
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
std::string instrument(std::string html, const std::string& prelude = "") {
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
  html.insert(head + 6, "<script>" + errors + prelude + "</script>");
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

/// Debian's chromium, or "" (the caller skips, saying why).
std::string chromium_path() {
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (std::filesystem::exists(c)) return c;
  return "";
}

/// Headless chromium on pages written into `dir`, as the machine's own browser test does:
/// no sandbox (root in CI), no background networking (the network is closed), a fresh profile.
struct Browser {
  std::string exe, dir;
  std::string run(const std::string& args) const {
    const std::string flags =
        " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
        " --disable-background-networking --disable-component-update --disable-sync"
        " --user-data-dir=" +
        dir + "/profile";
    const std::string cmd = "timeout 120 " + exe + flags + " " + args + " 2>/dev/null";
    std::string out;
    if (std::FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
      pclose(p);
    }
    return out;
  }
  /// What report_html_check.js found in the page at file `page`, in a window `width` px wide.
  /// The virtual time budget lets the page settle (load event, layout) before the DOM is dumped,
  /// whatever the machine's speed.
  Json findings_of(const std::string& page, int width) const {
    return findings(run("--window-size=" + std::to_string(width) +
                        ",1000 --virtual-time-budget=5000 --dump-dom file://" + page));
  }
};

/// What every page must pass in the browser: no script error, nothing overflowing, every chart
/// and parallel-coordinates chart drawn without problems.
void check_page(const Json& result, int width) {
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
  for (const auto& c : result.at("charts").items()) {
    INFO(c.at("experiment").as_string() << ": " << c.at("title").as_string());
    CHECK(lines(c.at("problems")) == "");
  }
  for (const auto& c : result.at("pcoords").items()) {
    INFO(c.at("experiment").as_string() << ": parallel coordinates");
    CHECK(lines(c.at("problems")) == "");
  }
}

}  // namespace

TEST_CASE("report --html renders in a real browser with every series in the DOM", "[report]") {
  const std::string chromium = chromium_path();
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
  const Browser browser{chromium, dir.path()};
  auto run = [&](const std::string& args) { return browser.run(args); };
  // A desktop window, a narrow one (two charts a row, then one) and a phone's (the trial table
  // scrolls in its own box).
  for (int width : {1280, 800, 500}) {
    INFO("window " << width << " px wide");
    const Json result = browser.findings_of(checked, width);
    check_page(result, width);
    // (a) Every chart drawn: 2 learning curves, 3 scaling charts and a scatter per swept setting
    // (gpus, batch_size) for "scaling", the failed trial's 2 "no data" charts; each with visible
    // lines of non-zero length inside the plot area, markers on them, the series spanning the
    // plot area, readable axes; and the parallel coordinates of "scaling".
    REQUIRE(result.at("charts").items().size() == 9);
    REQUIRE(result.at("pcoords").items().size() == 1);
    int empty = 0;
    for (const auto& c : result.at("charts").items()) empty += c.at("empty").as_bool() ? 1 : 0;
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

// ---- the hyperparameter views ----------------------------------------------------------------

namespace {

// A sweep of lr (5 values over two decades) x batch_size (4) x optimizer (2) x seed: each trial's
// best test accuracy is 0.30 + 0.1 a + 0.015 b + 0.03 o + seed_step s (a, b, o, s: the indices of
// its values), reached at its last of 3 epochs. The trials of one lr stay within 0.09 of each
// other, so a value between two lr's groups (0.59: above every trial of the first three lrs,
// below every one of the last two) splits them with a margin of 0.007 or more.
struct SweepTrial {
  size_t a, b, o, s;
  double acc;
};
const double kLrs[] = {0.001, 0.003, 0.01, 0.03, 0.1};
const int64_t kBatches[] = {64, 128, 256, 512};
const char* const kOptimizers[] = {"sgd", "adamw"};

std::vector<SweepTrial> fill_sweep(const std::string& path, size_t seeds,
                                   const std::string& name = "sweep",
                                   const std::string& description = "lr x batch_size",
                                   bool validation = false) {
  const auto& table = dprun::builtin_settings();
  dps::Store store(path, dps::Store::Mode::read_write, table.store_columns());
  const int64_t e = store.upsert_experiment(name, description, "toml", dprun::kDefaultsGeneration);
  std::vector<SweepTrial> out;
  const double seed_step = 0.008 / static_cast<double>(seeds);
  int64_t ordinal = 0;
  for (size_t a = 0; a < 5; ++a)
    for (size_t b = 0; b < 4; ++b)
      for (size_t o = 0; o < 2; ++o)
        for (size_t sd = 0; sd < seeds; ++sd) {
          const double acc = 0.30 + 0.1 * a + 0.015 * b + 0.03 * o + seed_step * sd;
          TrialSettings s(table);
          s.set("model", std::string("lenet"));
          s.set("lr", kLrs[a]);
          s.set("batch_size", kBatches[b]);
          s.set("per_gpu_batch", kBatches[b]);
          s.set("optimizer", std::string(kOptimizers[o]));
          s.set("seed", static_cast<int64_t>(sd));
          s.set("epochs", int64_t{3});
          dps::TrialState state;
          state.trial.config_hash = std::to_string(ordinal);
          state.trial.config_hash.insert(0, 1, 'h');
          state.trial.ordinal = ordinal++;
          state.trial.settings = dprun::to_store(s);
          state.trial.status = dps::TrialStatus::done;
          state.trial.attempts = 1;
          state.trial.backend = "cpu";
          state.trial.devices = "CPU (2 threads)";
          for (int64_t ep = 1; ep <= 3; ++ep) {
            dps::EpochRow row;
            row.epoch = ep;
            row.train_loss = 2.0 / static_cast<double>(ep);
            row.test_acc = acc * (0.7 + 0.1 * static_cast<double>(ep));
            if (validation) row.val_acc = row.test_acc - 0.01;
            row.seconds = 4.0;
            row.examples_per_second = ep == 1 ? 1000 : 15000;
            row.peak_memory_bytes = int64_t{48} << 20;
            state.epochs.push_back(row);
          }
          state.trial.epochs_done = 3;
          store.put_trial_state(e, state);
          out.push_back({a, b, o, sd, acc});
        }
  return out;
}

}  // namespace

TEST_CASE("report --html: hyperparameter views, the best trials and each trial's throughput",
          "[report]") {
  dptest::TempDir dir;
  const std::string db = dir.path() + "/r.db";
  const auto trials = fill_sweep(db, 5);
  REQUIRE(trials.size() == 200);
  dps::Store store(db, dps::Store::Mode::read_only);
  const std::string html = dprun::format_html_report(store);
  // The default metric without a validation split: the best test accuracy.
  CHECK(html.find("metric: <b>best_test_acc</b>") != std::string::npos);
  // Parallel coordinates: an axis per swept setting (batch_size, per_gpu_batch, lr, optimizer,
  // seed, in the settings' order) and the metric's, a line per trial.
  CHECK(count(html, "<figure class=\"pcoords\" data-axes=\"6\">") == 1);
  for (const char* axis : {"batch_size", "per_gpu_batch", "lr", "optimizer", "seed"})
    CHECK(count(html, std::string("data-name=\"") + axis + "\"") == 1);
  CHECK(html.find("data-name=\"lr\" data-scale=\"log\"") != std::string::npos);
  CHECK(html.find("data-name=\"optimizer\" data-scale=\"category\"") != std::string::npos);
  CHECK(html.find("data-name=\"batch_size\" data-scale=\"linear\"") != std::string::npos);
  // The metric against each swept setting: 5 panels of 200 points.
  CHECK(count(html, "<figure class=\"chart scatter\">") == 5);
  CHECK(count(html, "<circle data-trial=") == 5 * 200);
  // The best trials: ten, best first; the best is lr 0.1, batch 512, adamw, the last seed.
  const size_t best = html.find("<table class=\"best\">");
  REQUIRE(best != std::string::npos);
  const std::string best_table = html.substr(best, html.find("</table>", best) - best);
  CHECK(count(best_table, "<tr data-trial=") == 10);
  CHECK(best_table.find("<b>" + dprun::html::num(0.30 + 0.4 + 0.045 + 0.03 + 0.0064, "%.4f") + "</b>") !=
        std::string::npos);
  // ... with its value of each swept setting, after the settings every trial shares that differ
  // from dprun's defaults.
  CHECK(best_table.find("<th>seed</th><th>batch_size</th><th>per_gpu_batch</th><th>lr</th>"
                        "<th>optimizer</th><th>tags</th>") != std::string::npos);
  CHECK(best_table.find("<td>4</td><td>512</td><td>512</td><td>0.1</td><td>adamw</td>") !=
        std::string::npos);
  const size_t shared = html.find("<p class=\"meta shared\">");
  REQUIRE(shared != std::string::npos);
  CHECK(shared < best);
  const std::string shared_line = html.substr(shared, html.find("</p>", shared) - shared);
  CHECK(shared_line.find(">epochs=3</span>") != std::string::npos);  // dprun's default: 10
  CHECK(shared_line.find("lr=") == std::string::npos);                // swept: in the table
  // Throughput: examples per second without the warm-up epoch, and the peak memory.
  CHECK(count(html, "<td class=\"n\">15000</td><td class=\"n\">48 MiB</td>") == 200);
  // Over 40 trials the learning curves are lines without markers or a legend.
  CHECK(count(html, "<g class=\"series dense\"") == 2 * 200);

  SECTION("tags in the trial table and the best trials, notes under the table, as text") {
    {
      dps::Store rw(db, dps::Store::Mode::read_write, dprun::builtin_settings().store_columns());
      const auto rows = rw.trials(rw.experiments().at(0).id);
      rw.tag_trials({rows.at(0).id, rows.at(199).id}, "keep");  // 199: the best trial
      rw.set_note(rows.at(0).id, "too slow <script>alert(1)</script>\nsecond line & more");
    }
    const std::string tagged = dprun::format_html_report(store);
    CHECK(tagged.find("<th>tags</th>") != std::string::npos);
    CHECK(count(tagged, "<span class=\"tag\">keep</span>") == 3);  // 2 rows + the best table
    CHECK(tagged.find("too slow &lt;script&gt;alert(1)&lt;/script&gt;\nsecond line &amp; more") !=
          std::string::npos);
    CHECK(tagged.find("<script>alert") == std::string::npos);
  }
  SECTION("with a validation split the default metric is the best validation accuracy") {
    const std::string db2 = dir.path() + "/val.db";
    fill_sweep(db2, 1, "val", "", true);
    dps::Store val(db2, dps::Store::Mode::read_only);
    const std::string page = dprun::format_html_report(val);
    CHECK(page.find("metric: <b>best_val_acc</b>") != std::string::npos);
    CHECK(page.find("<table class=\"best\">") != std::string::npos);
  }
  SECTION("--metric: a loss ranks the lowest first") {
    dprun::HtmlReportOptions o;
    o.metric = "final_train_loss";
    const std::string loss = dprun::format_html_report(store, dprun::builtin_settings(), o);
    CHECK(loss.find("metric: <b>final_train_loss</b>") != std::string::npos);
    CHECK(loss.find("lower is better") != std::string::npos);
  }
  SECTION("--metric: a metric no trial has says so instead of drawing") {
    dprun::HtmlReportOptions o;
    o.metric = "best_val_acc";
    const std::string none = dprun::format_html_report(store, dprun::builtin_settings(), o);
    CHECK(none.find("0 of 200 trials have a value of best_val_acc") != std::string::npos);
    CHECK(none.find("<figure class=\"pcoords\"") == std::string::npos);
  }
  SECTION("an unknown metric is refused, listing the metrics") {
    dprun::HtmlReportOptions o;
    o.metric = "best_acc";
    CHECK_THROWS_WITH(dprun::format_html_report(store, dprun::builtin_settings(), o),
                      Catch::Contains("unknown metric \"best_acc\"") &&
                          Catch::Contains("best_val_acc, best_test_acc"));
  }
  SECTION("--refresh: the page reloads itself and says when it was written") {
    dprun::HtmlReportOptions o;
    o.refresh_seconds = 7;
    const std::string live = dprun::format_html_report(store, dprun::builtin_settings(), o);
    CHECK(live.find("<meta http-equiv=\"refresh\" content=\"7\">") != std::string::npos);
    CHECK(live.find("reloads every 7 s") != std::string::npos);
    CHECK(html.find("http-equiv") == std::string::npos);
  }
}

namespace {

// The brushes of the browser tests, as report_html_check.js reads them (window.dprunBrushes):
// the metric from 0.59 to the top of its axis (the last two lrs), then lr around 0.03 (one lr),
// then lr cleared, then the metric cleared.
const char* kBrushes =
    "window.dprunBrushes = [{axis: 'best_test_acc', from: 0.59, to: 'top'},"
    " {axis: 'lr', from: 0.027, to: 0.033}, {axis: 'lr', clear: true},"
    " {axis: 'best_test_acc', clear: true}];";

}  // namespace

TEST_CASE("report --html: brushing the parallel coordinates filters the trials, in a real browser",
          "[report]") {
  const std::string chromium = chromium_path();
  if (chromium.empty()) {
    DPTEST_SKIPPED(
        "chromium not found (Debian: apt-get install chromium, or scripts/install-deps --tests): "
        "the hyperparameter views were not rendered in a browser");
    return;
  }
  dptest::TempDir dir;
  const std::string db = dir.path() + "/r.db";
  const auto trials = fill_sweep(db, 5, "sweep <&> \"lr\"", "<b>not bold</b> & escaped");
  size_t above = 0, one_lr = 0;
  for (const auto& t : trials) {
    above += t.acc >= 0.59;
    one_lr += t.acc >= 0.59 && t.a == 3;
  }
  REQUIRE(above == 80);
  REQUIRE(one_lr == 40);
  // Text of the user's that must reach the page as text: unescaped, this note would load an
  // image (a failed load) and call console.error, each an error the page check reports.
  {
    dps::Store store(db, dps::Store::Mode::read_write, dprun::builtin_settings().store_columns());
    const auto rows = store.trials(store.experiments().at(0).id);
    store.tag_trials({rows.at(0).id, rows.at(199).id}, "look.at-this_1");
    store.set_note(rows.at(199).id,
                   "<img src=nothing.png onerror=\"console.error('not escaped')\"> & <b>x</b>");
  }
  std::string html;
  {
    dps::Store store(db, dps::Store::Mode::read_only);
    html = dprun::format_html_report(store);
  }
  const std::string checked = std::string(DPRUN_TEST_BINARY_DIR) + "/report-html-hparams-test.html";
  std::ofstream(checked) << instrument(html, kBrushes);
  const Browser browser{chromium, dir.path()};
  for (int width : {1280, 500}) {
    INFO("window " << width << " px wide");
    const Json result = browser.findings_of(checked, width);
    check_page(result, width);
    // 2 learning curves and 5 scatter panels of 200 points; one parallel-coordinates chart with
    // an axis per swept setting and the metric's, a line per trial.
    REQUIRE(result.at("charts").items().size() == 7);
    int scatter_points = 0;
    for (const auto& c : result.at("charts").items())
      for (const auto& s : c.at("series").items())
        if (!s.get("scatter").is_null()) scatter_points += static_cast<int>(s.at("points").items().size());
    CHECK(scatter_points == 5 * 200);
    REQUIRE(result.at("pcoords").items().size() == 1);
    const Json& pc = result.at("pcoords").items()[0];
    std::vector<std::string> axes;
    for (const auto& a : pc.at("axes").items()) axes.push_back(a.at("name").as_string());
    CHECK(axes == std::vector<std::string>{"seed", "batch_size", "per_gpu_batch", "lr", "optimizer",
                                           "best_test_acc"});
    CHECK(pc.at("lines").as_int() == 200);
    // Brushing: what stays shown after each brush, everywhere the section shows the trials.
    const auto& steps = result.at("brushing").items();
    REQUIRE(steps.size() == 4);
    const size_t expected[] = {above, one_lr, above, 200};
    for (size_t k = 0; k < 4; ++k) {
      INFO("brush " << k << " on " << steps[k].at("axis").as_string() << ": "
                    << steps[k].get("problem").dump() << " caption "
                    << steps[k].get("caption").dump());
      REQUIRE(steps[k].get("shown").is_object());
      const Json& shown = steps[k].at("shown");
      CHECK(shown.at("lines").as_int() == static_cast<int64_t>(expected[k]));
      CHECK(shown.at("rows").as_int() == static_cast<int64_t>(expected[k]));
      CHECK(shown.at("points").as_int() == static_cast<int64_t>(5 * expected[k]));
      CHECK(shown.at("curves").as_int() == static_cast<int64_t>(2 * expected[k]));
    }
    CHECK(steps[1].at("caption").as_string() == std::to_string(one_lr) + " of 200 trials selected");
    // The tags and the note as text (errors would have caught them as markup).
    CHECK(html.find("<span class=\"tag\">look.at-this_1</span>") != std::string::npos);
    CHECK(html.find("<img src=nothing.png") == std::string::npos);  // not as markup
    CHECK(html.find("&lt;img src=nothing.png onerror=&quot;console.error('not escaped')&quot;&gt; "
                    "&amp; &lt;b&gt;x&lt;/b&gt;") != std::string::npos);
  }
}

// A sweep of a few thousand trials: measured, not asserted (a test never times): the ms from
// navigation to the check and per brush update are printed for the closing notes.
TEST_CASE("report --html: 3000 trials in a real browser, with the time brushing takes",
          "[report][scale]") {
  const std::string chromium = chromium_path();
  if (chromium.empty()) {
    DPTEST_SKIPPED(
        "chromium not found (Debian: apt-get install chromium, or scripts/install-deps --tests): "
        "the 3000-trial report was not rendered in a browser");
    return;
  }
  dptest::TempDir dir;
  const std::string db = dir.path() + "/r.db";
  const auto trials = fill_sweep(db, 75);
  REQUIRE(trials.size() == 3000);
  std::string html;
  {
    dps::Store store(db, dps::Store::Mode::read_only);
    html = dprun::format_html_report(store);
  }
  const std::string checked = std::string(DPRUN_TEST_BINARY_DIR) + "/report-html-3000-test.html";
  // The layout and geometry checks of the 200-trial test would lay out and measure all of it.
  std::ofstream(checked) << instrument(html, std::string(kBrushes) + "window.dprunTimingOnly = true;");
  const Browser browser{chromium, dir.path()};
  const Json result = browser.findings_of(checked, 1280);
  INFO("report_html_check.js failed: " << result.get("fatal").dump());
  REQUIRE(result.get("fatal").is_null());
  CHECK(lines(result.at("errors")) == "");
  const auto& steps = result.at("brushing").items();
  REQUIRE(steps.size() == 4);
  CHECK(steps[0].at("shown").at("rows").as_int() == 1200);
  CHECK(steps[3].at("shown").at("rows").as_int() == 3000);
  std::printf("report --html, 3000 trials (%zu bytes): %.0f ms from navigation to the check;"
              " brush updates",
              html.size(), result.at("timing").as_double());
  for (const auto& s : steps) std::printf(" %.1f", s.at("ms").as_double());
  std::printf(" ms (headless chromium, as performance.now() counts them)\n");
}

// ---- dprun report --html FILE --refresh SECONDS -----------------------------------------------

namespace {

// A process standing in for a sweep's runner: alive until killed.
pid_t start_sleeper() {
  pid_t pid = fork();
  if (pid == 0) {
    // argv[0] names dprun: liveness judges a runner by its pid and its program name.
    execlp("sleep", "dprun-runner-stand-in", "600", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

void end_sleeper(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// The "written ..." time the live page states ("" when it says none).
std::string written_at(const std::string& page) {
  const size_t at = page.find("Live: written ");
  return at == std::string::npos ? "" : page.substr(at + 14, 23);
}

}  // namespace

TEST_CASE("report --refresh: the page reloads itself while a trial runs, then is written once more "
          "without reloading",
          "[report][cli]") {
  dptest::TempDir dir;
  const std::string db = dir.path() + "/r.db";
  fill_sweep(db, 1);
  const pid_t runner = start_sleeper();
  REQUIRE(runner > 0);
  {
    const auto& table = dprun::builtin_settings();
    dps::Store store(db, dps::Store::Mode::read_write, table.store_columns());
    const auto trials = store.trials(store.experiments().at(0).id);
    REQUIRE(store.claim_trial(trials.at(3).id, dps::TrialStatus::done, runner, dprun::host_name()));
  }
  const std::string page = dir.path() + "/live.html";
  SECTION("until the sweep's runner has ended") {
    clitest::Dprun report({"report", "--db", db, "--html", page, "--refresh", "1"}, dir.path());
    std::string first;
    // Rewritten while the trial runs: a reloading page, and a later one with a later time.
    REQUIRE(clitest::wait_until([&] {
      first = written_at(clitest::slurp(page));
      return !first.empty();
    }));
    CHECK(clitest::slurp(page).find("<meta http-equiv=\"refresh\" content=\"1\">") !=
          std::string::npos);
    REQUIRE(clitest::wait_until([&] {
      const std::string now = written_at(clitest::slurp(page));
      return !now.empty() && now != first;
    }));
    end_sleeper(runner);
    const clitest::Result r = report.wait();
    DPRUN_REQUIRE_EXIT(r, 0);
    CHECK_THAT(r.err, Catch::Contains("the sweep has nothing running") &&
                          Catch::Contains("it no longer reloads"));
    const std::string last = clitest::slurp(page);
    CHECK(last.find("http-equiv") == std::string::npos);
    CHECK(last.find("Live: written") == std::string::npos);
    CHECK(last.find("<figure class=\"pcoords\"") != std::string::npos);
    // Written whole each time: no temporary file left beside it.
    int files = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir.path()))
      files += f.path().filename().string().rfind("live.html", 0) == 0;
    CHECK(files == 1);
  }
  SECTION("until Ctrl-C") {
    clitest::Dprun report({"report", "--db", db, "--html", page, "--refresh", "1"}, dir.path());
    REQUIRE(clitest::wait_until([&] { return !written_at(clitest::slurp(page)).empty(); }));
    ::kill(report.pid(), SIGINT);
    const clitest::Result r = report.wait();
    end_sleeper(runner);
    DPRUN_REQUIRE_EXIT(r, 0);
    CHECK_THAT(r.err, Catch::Contains("stopped watching"));
    CHECK(clitest::slurp(page).find("http-equiv") == std::string::npos);
  }
}

TEST_CASE("report: --metric and --refresh are checked, saying what is wrong", "[report][cli]") {
  dptest::TempDir dir;
  const std::string db = dir.path() + "/r.db";
  fill_sweep(db, 1);
  const std::string page = dir.path() + "/p.html";
  auto refused = [&](const std::vector<std::string>& args, const std::string& says) {
    std::vector<std::string> all{"report", "--db", db};
    all.insert(all.end(), args.begin(), args.end());
    const clitest::Result r = clitest::run(all, dir.path());
    DPRUN_CHECK_EXIT(r, 2);
    CHECK_THAT(r.err, Catch::Contains(says));
    CHECK_FALSE(std::filesystem::exists(page));
  };
  refused({"--html", page, "--metric", "best_acc"},
          "--metric: unknown metric \"best_acc\"; the metrics are best_val_acc, best_test_acc");
  refused({"--metric", "best_test_acc"}, "--metric applies to the HTML report: add --html FILE");
  refused({"--refresh", "5"}, "--refresh applies to the HTML report: add --html FILE");
  refused({"--html", page, "--refresh", "0"}, "--refresh 0: expected a positive integer");
  refused({"--html", "-", "--refresh", "5"}, "give --html FILE, not -");
  // Nothing running: one page, without the reload, at once.
  const clitest::Result r =
      clitest::run({"report", "--db", db, "--html", page, "--refresh", "5", "--metric",
                    "final_test_loss"},
                   dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  const std::string html = clitest::slurp(page);
  CHECK(html.find("metric: <b>final_test_loss</b>") != std::string::npos);
  CHECK(html.find("http-equiv") == std::string::npos);
}
