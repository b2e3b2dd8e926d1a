// `dprun report --html`: the page's content from a database built here, and the page rendered
// by a real browser (Debian's chromium, headless): the DOM after loading holds every series, and
// a screenshot is saved (build/report-html-test.png) for a human to look at. Without chromium
// the browser half is skipped with a message.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

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
  {
    dps::Store store(db, dps::Store::Mode::read_only);
    std::ofstream(page) << dprun::format_html_report(store);
  }
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
  const std::string dom = run("--dump-dom file://" + page);
  INFO("DOM from chromium: " << dom.substr(0, 300));
  REQUIRE(!dom.empty());
  CHECK(count(dom, "<g class=\"series\" data-label=\"lenet gpus=4") == 2);
  // 6 curves (3 trials x loss and accuracy), 3 scaling series, 2 ideals; the failed trial has no
  // epoch, so its experiment's charts say "no data".
  CHECK(count(dom, "<polyline") == 11);
  CHECK(count(dom, ">no data</text>") == 2);
  CHECK(count(dom, "<circle") >= 3 * 3 * 2 + 3 * 3);
  CHECK(dom.find("Scaling efficiency") != std::string::npos);
  const std::string shot = std::string(DPRUN_TEST_BINARY_DIR) + "/report-html-test.png";
  std::filesystem::remove(shot);
  run("--window-size=1200,1600 --screenshot=" + shot + " file://" + page);
  REQUIRE(std::filesystem::exists(shot));
  CHECK(std::filesystem::file_size(shot) > 20000);  // a rendered page, not a blank one
}
