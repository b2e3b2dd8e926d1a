// The commands that read a results database: `dprun query`, `dprun report` and `dprun export`.
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/usage_error.hpp"
#include "cli/commands.hpp"
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
  dps::Store store(db, dps::Store::Mode::read_only);
  if (auto html = a.last("--html")) {
    const std::string page = format_html_report(store);
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
