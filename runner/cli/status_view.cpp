// `dprun status`: the arithmetic of a running sweep (time per epoch, ETAs) and its layout for a
// terminal of 100-120 columns (status_view.hpp).
#include "cli/status_view.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <variant>

#include "base/text.hpp"

namespace dprun::cli {

namespace {

// The settings that change how long an epoch takes; lr, seed, the optimizer and the like do not
// (enough to matter for an ETA). allow_tf32 and graphs do (exact fp32 took 3.2x TF32's time on an
// H200; graphs 13-38 %), and layout "auto" resolves with allow_tf32.
const char* const kShapeKeys[] = {"model",      "model_options",  "dataset",     "gpus",
                                  "processes",  "batch_size",     "train_limit", "test_limit",
                                  "validation", "precision",      "layout",      "allow_tf32",
                                  "graphs",     "backend_request"};

// The first `columns` columns of a line (UTF-8: continuation bytes take none).
std::string cut(const std::string& s, size_t columns) {
  size_t w = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
    if (w++ == columns) return s.substr(0, i);
  }
  return s;
}

// A reason as one line of text for the terminal: its control characters (a trial's stderr may
// carry colours and cursor moves) shown as \xNN, line breaks as " | ".
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      if (i + 1 < s.size()) out += " | ";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += s[i];
    }
  }
  return out;
}

// At most `columns` columns, "..." at the end when cut.
std::string shorten(const std::string& s, size_t columns) {
  const std::string head = cut(s, columns);
  return head.size() == s.size() ? s : cut(s, columns - 3) + "...";
}

bool is_running(const std::string& state) {
  return state == "running" || state == "stale" || state == "queued" || state == "submitted";
}
bool is_problem(const std::string& state) {
  return state == "failed" || state == "diverged" || state == "interrupted" || state == "lost";
}

// Display width in terminal columns (UTF-8: continuation bytes take none).
size_t columns_of(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++w;
  return w;
}

// The reasons after an aligned table, one per line, where they may run long: outside the
// table, so that the column of one long error does not widen its rule for every line.
std::string with_reasons(const std::string& table, const std::vector<std::string>& reasons) {
  std::vector<std::string> lines;
  for (size_t start = 0, end; start < table.size(); start = end + 1) {
    end = table.find('\n', start);
    lines.push_back(table.substr(start, end - start));
  }
  const bool any = std::any_of(reasons.begin() + 2, reasons.end(),
                               [](const std::string& r) { return !r.empty(); });
  if (!any || lines.size() < 2) return table;
  const size_t width = columns_of(lines[1]);  // the rule: no trailing spaces trimmed
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = lines[i];
    if (i < reasons.size() && !reasons[i].empty())
      line += std::string(width - std::min(width, columns_of(line)), ' ') + "  " + reasons[i];
    out += line + "\n";
  }
  return out;
}

// The states in the order the counts name them.
const std::vector<std::string>& state_order() {
  static const std::vector<std::string> order = {
      "done",   "stopped",  "pruned",      "running", "stale",   "queued", "submitted",
      "failed", "diverged", "interrupted", "lost",    "skipped", "not run"};
  return order;
}

std::string counts_text(const std::vector<TrialProgress>& trials,
                        const std::vector<size_t>& which) {
  std::map<std::string, int> counts;
  for (size_t i : which) ++counts[trials[i].state];
  std::string text;
  for (const auto& state : state_order())
    if (counts[state] > 0)
      text += (text.empty() ? "" : ", ") + std::to_string(counts[state]) + " " + state;
  return text;
}

// The trials to list, in the order to list them: every one when they fit, else the running
// ones, then the next to run and those that failed (sharing what room is left; the failed ones
// carry a reason to act on), then the latest of the rest.
std::vector<size_t> trials_to_show(const std::vector<TrialProgress>& trials, size_t room) {
  std::vector<size_t> all(trials.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (room == 0 || trials.size() <= room) return all;
  std::vector<size_t> running, next, problems, rest;
  for (size_t i : all) {
    const std::string& s = trials[i].state;
    (is_running(s)    ? running
     : s == "not run" ? next
     : is_problem(s)  ? problems
                      : rest)
        .push_back(i);
  }
  std::vector<size_t> shown(running.begin(), running.begin() + std::min(room, running.size()));
  const size_t left = room - shown.size();
  const size_t n_next =
      std::min(next.size(), std::max(left / 2, left - std::min(left, problems.size())));
  const size_t n_problems = std::min(problems.size(), left - n_next);
  const size_t n_rest = std::min(rest.size(), left - n_next - n_problems);
  shown.insert(shown.end(), next.begin(), next.begin() + n_next);
  shown.insert(shown.end(), problems.begin(), problems.begin() + n_problems);
  shown.insert(shown.end(), rest.end() - n_rest, rest.end());
  return shown;
}

std::string progress_line(const SweepStatus& sweep) {
  const SweepEta eta = sweep_eta(sweep.trials);
  std::string line = "progress: " + std::to_string(eta.epochs_done) + "/" +
                     std::to_string(eta.epochs_total) + " epochs";
  const std::string left =
      std::to_string(eta.left) + " trial" + (eta.left == 1 ? "" : "s") + " left";
  if (eta.left == 0 || !sweep.active) return line + "; nothing running now";
  if (!eta.seconds)
    return line + "; ETA unknown: " + std::to_string(eta.untimed) + " of the " + left +
           " have no timing yet, nor has a trial of their shape";
  return line + "; ETA " + format_duration(*eta.seconds) + " for the " + left + ", " +
         (eta.at_once == 1 ? std::string("one trial at a time")
                           : std::to_string(eta.at_once) + " at a time") +
         " (as many as run now)";
}

}  // namespace

std::string stored_text(const dps::SqlValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", *d);
    return buf;
  }
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  return "";
}

std::optional<double> mean_epoch_seconds(const std::vector<double>& seconds) {
  if (seconds.empty()) return std::nullopt;
  const size_t first = seconds.size() > 1 ? 1 : 0;
  double sum = 0;
  for (size_t i = first; i < seconds.size(); ++i) sum += seconds[i];
  return sum / static_cast<double>(seconds.size() - first);
}

std::string shape_of(const dps::SettingValues& settings) {
  std::string shape;
  for (const char* key : kShapeKeys) {
    auto it = settings.find(key);
    if (it == settings.end()) continue;
    if (!shape.empty()) shape += ' ';
    shape.append(key).append("=").append(stored_text(it->second));
  }
  return shape;
}

bool is_left(const std::string& state) {
  return state == "running" || state == "queued" || state == "submitted" || state == "not run";
}

std::map<std::string, double> shape_seconds(const std::vector<TrialProgress>& trials) {
  std::map<std::string, std::pair<double, int>> sums;
  for (const auto& t : trials)
    if (t.seconds_per_epoch) {
      sums[t.shape].first += *t.seconds_per_epoch;
      ++sums[t.shape].second;
    }
  std::map<std::string, double> means;
  for (const auto& [shape, sum] : sums) means[shape] = sum.first / sum.second;
  return means;
}

std::optional<double> trial_eta(const TrialProgress& t,
                                const std::map<std::string, double>& by_shape) {
  if (!is_left(t.state) || t.epochs <= 0) return std::nullopt;
  const int64_t remaining = std::max<int64_t>(0, t.epochs - t.epoch);
  if (remaining == 0) return 0.0;
  std::optional<double> per_epoch = t.seconds_per_epoch;
  if (!per_epoch) {
    auto shape = by_shape.find(t.shape);
    if (shape == by_shape.end()) return std::nullopt;
    per_epoch = shape->second;
  }
  return static_cast<double>(remaining) * *per_epoch;
}

SweepEta sweep_eta(const std::vector<TrialProgress>& trials) {
  SweepEta eta;
  const auto by_shape = shape_seconds(trials);
  double total = 0, longest = 0;
  int running = 0;
  for (const auto& t : trials) {
    if (t.epochs > 0) {
      eta.epochs_total += t.epochs;
      eta.epochs_done += std::min(t.epoch, t.epochs);
    }
    if (!is_left(t.state)) continue;
    ++eta.left;
    if (t.state == "running") ++running;
    const auto seconds = trial_eta(t, by_shape);
    if (!seconds) {
      ++eta.untimed;
      continue;
    }
    total += *seconds;
    if (t.state == "running") longest = std::max(longest, *seconds);
  }
  // How many trials run at once is not recorded (--jobs is the runner's, Slurm's limit the
  // cluster's): the trials running now are the best measure of it.
  eta.at_once = std::max(1, running);
  if (eta.untimed == 0) eta.seconds = std::max(longest, total / eta.at_once);
  return eta;
}

std::string format_duration(double seconds) {
  const long n = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (n == 0 && seconds > 0)
    return "<1s";
  else if (n < 60)
    std::snprintf(buf, sizeof buf, "%lds", n);
  else if (n < 3600)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", n / 60, n % 60);
  else if (n < 86400)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", n / 3600, n % 3600 / 60);
  else
    std::snprintf(buf, sizeof buf, "%ldd%02ldh", n / 86400, n % 86400 / 3600);
  return buf;
}

std::string format_status(const SweepStatus& sweep, const StatusLayout& layout) {
  const auto& trials = sweep.trials;
  std::vector<size_t> every(trials.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = i;
  std::string out = "experiment " + sweep.experiment + ": " + std::to_string(trials.size()) +
                    " trial" + (trials.size() == 1 ? "" : "s") + ": " + counts_text(trials, every) +
                    "\n";
  out += progress_line(sweep) + "\n";
  for (const auto& line : sweep.slurm_lines) out += line + "\n";

  const auto by_shape = shape_seconds(trials);
  const bool validation = std::any_of(trials.begin(), trials.end(),
                                      [](const TrialProgress& t) { return t.val_acc.has_value(); });
  const std::vector<size_t> shown = trials_to_show(trials, layout.max_trials);
  std::vector<std::vector<std::string>> table{
      {"id", "trial", "state", "epoch", "train_loss", "test_acc"}};
  if (validation) table[0].push_back("val_acc");
  for (const char* h : {"s/epoch", "ETA", "devices"}) table[0].push_back(h);
  std::vector<std::string> why{"why", "---"};
  for (size_t i : shown) {
    const TrialProgress& t = trials[i];
    std::vector<std::string> row{
        t.id > 0 ? std::to_string(t.id) : "-",
        shorten(t.name, 44),
        t.state,
        std::to_string(t.epoch) + "/" + (t.epochs > 0 ? std::to_string(t.epochs) : "?"),
        number_cell(t.train_loss, "%.4f", true),
        number_cell(t.test_acc, "%.4f", true)};
    if (validation) row.push_back(number_cell(t.val_acc, "%.4f", true));
    row.push_back(number_cell(t.seconds_per_epoch, "%.2f", true));
    const auto eta = trial_eta(t, by_shape);
    row.push_back(eta ? format_duration(*eta) : is_left(t.state) ? "?" : "-");
    row.push_back(t.devices.empty() ? "-" : shorten(t.devices, 28));
    why.push_back(printable(t.why));
    table.push_back(std::move(row));
  }
  if (!shown.empty()) out += with_reasons(format_aligned(table, "  "), why);
  if (shown.size() < trials.size()) {
    std::set<size_t> listed(shown.begin(), shown.end());
    std::vector<size_t> hidden;
    for (size_t i : every)
      if (!listed.count(i)) hidden.push_back(i);
    out +=
        "  not shown: " + counts_text(trials, hidden) + " (dprun status --all lists every trial)\n";
  }
  const bool to_rerun = std::any_of(trials.begin(), trials.end(), [&](const TrialProgress& t) {
    return is_problem(t.state) || t.state == "stale" || (t.state == "not run" && !sweep.active);
  });
  if (to_rerun && !sweep.rerun_command.empty())
    out += "to run them (failed and interrupted ones resume from their last checkpoint): " +
           sweep.rerun_command + "\n";
  if (layout.width == 0) return out;
  std::string cut_out;
  size_t start = 0;
  while (start < out.size()) {
    const size_t end = out.find('\n', start);
    cut_out += cut(out.substr(start, end - start), layout.width) + "\n";
    start = end + 1;
  }
  return cut_out;
}

}  // namespace dprun::cli
