// The commands that read a results database: `dprun query`, `dprun report` and `dprun export`.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/os.hpp"
#include "base/usage_error.hpp"
#include "cli/commands.hpp"
#include "cli/liveness.hpp"
#include "dpstore/store.hpp"
#include "report/export.hpp"
#include "report/report.hpp"
#include "slurm/merge.hpp"

namespace dprun::cli {

namespace {

int64_t positive_integer(const std::string& what, const std::string& text) {
  int64_t x = 0;
  auto res = std::from_chars(text.data(), text.data() + text.size(), x);
  if (res.ec != std::errc() || res.ptr != text.data() + text.size() || x < 1)
    throw UsageError(what + " " + text + ": expected a positive integer");
  return x;
}

// Writes `text` to `path` whole: a browser reloading the page never reads half of it.
void write_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr)
    throw UsageError("--html " + path + ": cannot write " + tmp + ": " + std::strerror(errno));
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw UsageError("--html " + path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw UsageError("--html " + path + ": cannot replace it: " + why);
  }
}

// Whether a sweep of the database is still going (liveness.hpp).
bool sweep_running(dps::Store& store) {
  for (const auto& e : store.experiments())
    if (!sweep_activity(store, e.id, SweepOptions{}.stale_seconds).empty()) return true;
  return false;
}

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted = true; }

// `dprun report --html FILE --refresh SECONDS`: rewrites FILE every SECONDS while the sweep runs
// (the page reloads itself as often), then once more without the reload, and returns. Ctrl-C
// stops watching the same way.
int refresh_report(const std::string& db, const std::string& path, const HtmlReportOptions& base) {
  struct sigaction sa{};
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESETHAND;  // a second Ctrl-C ends dprun at once, as it would without us
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fprintf(stderr,
               "dprun: writing %s every %d s while the sweep runs (open it in a browser: it "
               "reloads itself); Ctrl-C stops\n",
               path.c_str(), base.refresh_seconds);
  for (int written = 0;; ++written) {
    merge_if_needed(db);
    bool running = false;
    std::string page;
    {
      dps::Store store(db, dps::Store::Mode::read_only);
      running = sweep_running(store) && !g_interrupted;
      HtmlReportOptions o = base;
      if (!running) o.refresh_seconds = 0;
      page = format_html_report(store, builtin_settings(), o);
    }
    write_whole(path, page);
    if (!running) {
      std::fprintf(stderr, "dprun: %s: wrote %s (%d update%s); it no longer reloads\n",
                   g_interrupted ? "stopped watching" : "the sweep has nothing running",
                   path.c_str(), written + 1, written == 0 ? "" : "s");
      return 0;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(base.refresh_seconds);
    while (!g_interrupted && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

std::string results_database(const Args& a, const std::string& command) {
  const std::string db = a.last("--db") ? *a.last("--db") : default_database(command);
  if (!std::filesystem::exists(db)) throw UsageError(db + ": no such database");
  return db;
}

int query_command(const Invocation& in) {
  const Args& a = in.args;
  if (a.positional.size() != 1)
    throw UsageError(
        "dprun query needs one SQL statement in quotes, e.g. dprun query --db "
        "results/x.db \"SELECT * FROM trial_summary\"");
  QueryFormat format = QueryFormat::table;
  if (auto f = a.last("--format")) {
    if (*f == "table")
      format = QueryFormat::table;
    else if (*f == "csv")
      format = QueryFormat::csv;
    else if (*f == "json")
      format = QueryFormat::json;
    else
      throw UsageError("--format " + *f + ": expected table, csv or json");
  }
  const std::string db = results_database(a, "query");
  dps::Store store(db, dps::Store::Mode::read_only);
  std::fputs(format_query(store.query(a.positional[0]), format).c_str(), stdout);
  return 0;
}

int report_command(const Invocation& in) {
  const Args& a = in.args;
  if (!a.positional.empty()) throw UsageError("dprun report takes no arguments (use --db PATH)");
  const std::string db = results_database(a, "report");
  // Results of Slurm tasks that have ended are collected first.
  merge_if_needed(db);
  HtmlReportOptions options;
  if (auto metric = a.last("--metric")) {
    if (const std::string why = report_metric_problem(*metric); !why.empty())
      throw UsageError("--metric: " + why);
    options.metric = *metric;
  }
  const auto refresh = a.last("--refresh");
  const auto html = a.last("--html");
  if (!html && (refresh || options.metric.size()))
    throw UsageError(std::string(refresh ? "--refresh" : "--metric") +
                     " applies to the HTML report: add --html FILE");
  if (refresh) {
    const int64_t seconds = positive_integer("--refresh", *refresh);
    if (seconds > 86400)
      throw UsageError("--refresh " + *refresh + ": at most 86400 (a day) between rewrites");
    options.refresh_seconds = static_cast<int>(seconds);
    if (*html == "-")
      throw UsageError("--refresh rewrites a file while the sweep runs: give --html FILE, not -");
    return refresh_report(db, *html, options);
  }
  dps::Store store(db, dps::Store::Mode::read_only);
  if (html) {
    const std::string page = format_html_report(store, builtin_settings(), options);
    std::FILE* f = *html == "-" ? stdout : std::fopen(html->c_str(), "w");
    if (f == nullptr)
      throw UsageError("--html " + *html + ": cannot write it: " + std::strerror(errno));
    const bool ok = std::fputs(page.c_str(), f) >= 0;
    if (f != stdout && std::fclose(f) != 0) throw UsageError("--html " + *html + ": write failed");
    if (!ok) throw UsageError("--html " + *html + ": write failed");
    if (f != stdout)
      std::fprintf(stderr, "dprun: wrote %s (open it in a browser; it needs no network)\n",
                   html->c_str());
    return 0;
  }
  std::fputs(format_report(store).c_str(), stdout);
  return 0;
}

int export_command(const Invocation& in) {
  const Args& a = in.args;
  if (a.positional.size() != 1)
    throw UsageError(
        "dprun export needs one trial id (the id column of trials or trial_summary, e.g. dprun "
        "query \"SELECT trial_id, model, gpus, status FROM trial_summary\")");
  const int64_t trial_id = positive_integer("trial id", a.positional[0]);
  ExportChoice which;
  which.best = a.flag("--best");
  if (auto epoch = a.last("--epoch")) which.epoch = positive_integer("--epoch", *epoch);
  return export_checkpoint(results_database(a, "export"), trial_id, which,
                           a.last("--output").value_or(""));
}

}  // namespace dprun::cli
