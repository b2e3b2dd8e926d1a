#include "report/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "base/json.hpp"
#include "base/text.hpp"
#include "base/usage_error.hpp"

namespace dprun {

namespace fs = std::filesystem;

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string format_query(const dps::QueryResult& result, QueryFormat format) {
  switch (format) {
    case QueryFormat::table: {
      std::vector<std::vector<std::string>> rows;
      rows.push_back(result.columns);
      for (const auto& r : result.rows) {
        std::vector<std::string> cells;
        for (const auto& v : r) cells.push_back(v ? *v : "NULL");
        rows.push_back(std::move(cells));
      }
      std::string out = format_aligned(rows);
      out += '(';
      out += std::to_string(result.rows.size());
      out += result.rows.size() == 1 ? " row)\n" : " rows)\n";
      return out;
    }
    case QueryFormat::csv: {
      std::string out;
      for (size_t c = 0; c < result.columns.size(); ++c)
        out.append(c ? "," : "").append(csv_field(result.columns[c]));
      out += "\r\n";
      for (const auto& r : result.rows) {
        for (size_t c = 0; c < r.size(); ++c)
          out.append(c ? "," : "").append(csv_field(r[c].value_or("")));
        out += "\r\n";
      }
      return out;
    }
    case QueryFormat::json: {
      std::string out = "[";
      for (size_t i = 0; i < result.rows.size(); ++i) {
        Json o = Json::object();
        const auto& r = result.rows[i];
        for (size_t c = 0; c < result.columns.size() && c < r.size(); ++c) {
          if (!r[c])
            o.set(result.columns[c], Json());
          else if (looks_numeric(*r[c]))
            o.set(result.columns[c], Json::parse(*r[c]));
          else
            o.set(result.columns[c], Json::string(*r[c]));
        }
        out += (i ? ",\n " : "\n ") + o.dump();
      }
      out += result.rows.empty() ? "]\n" : "\n]\n";
      return out;
    }
  }
  return "";
}

std::string default_database(const std::string& command) {
  std::vector<std::string> found;
  std::error_code ec;
  if (fs::is_directory("results", ec))
    for (const auto& e : fs::directory_iterator("results", ec))
      if (e.path().extension() == ".db") found.push_back(e.path().string());
  if (found.size() == 1) {
    std::fprintf(stderr, "dprun: using %s (the only database in results/; pass --db to choose)\n",
                 found[0].c_str());
    return found[0];
  }
  std::string msg = "dprun " + command + " needs a database: pass --db PATH";
  if (found.empty()) {
    msg += " (no results/*.db in the current folder)";
  } else {
    std::sort(found.begin(), found.end());
    msg += " (several in results/:";
    for (const auto& f : found) msg += " " + f;
    msg += ")";
  }
  throw UsageError(msg);
}

namespace {

// Each recorded setting of a stored trial as (column, text), in table order; a setting the
// database predates reads as its default.
std::vector<std::pair<std::string, std::string>> setting_texts(const SettingTable& table,
                                                               const dps::TrialRow& trial) {
  const TrialSettings settings = settings_from_store(table, trial.settings);
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < table.recorded().size(); ++i)
    out.emplace_back(table.recorded()[i]->column, setting_text(settings.at(i)));
  return out;
}

std::string joined_tags(const dps::TrialRow& trial) {
  std::string out;
  for (const auto& tag : trial.tags) out += (out.empty() ? "" : ",") + tag;
  return out.empty() ? "-" : out;
}

// A note as lines under the table: its own line breaks kept (indented under the first line),
// every other control character escaped as \xNN, so a note cannot move the cursor or recolour
// the terminal.
std::string note_lines(const std::string& note, const std::string& indent) {
  std::string out;
  for (unsigned char c : note) {
    if (c == '\n') {
      out += "\n" + indent;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\n";
}

}  // namespace

std::string ExperimentTrials::label(size_t i) const {
  std::string out;
  for (size_t c : shown) {
    const auto& [name, text] = settings[i][c];
    out += out.empty() ? (name == "model" ? text : name + "=" + text) : " " + name + "=" + text;
  }
  return out;
}

std::string ExperimentTrials::setting(size_t i, const std::string& column) const {
  for (const auto& [name, text] : settings[i])
    if (name == column) return text;
  return "";
}

std::string ExperimentTrials::no_speedup_reason(size_t i) const {
  const dps::TrialSummary& t = trials[i];
  if (t.speedup || t.trial.status != dps::TrialStatus::done) return "";
  const std::string& backend = t.trial.backend;
  // The done 1-GPU trials on the same backend, and for each the baseline settings it differs in.
  std::vector<std::string> best;
  bool any = false;
  for (size_t j = 0; j < trials.size(); ++j) {
    if (trials[j].trial.status != dps::TrialStatus::done || trials[j].trial.backend != backend ||
        setting(j, "gpus") != "1")
      continue;
    std::vector<std::string> differ;
    for (size_t c = 0; c < settings[i].size(); ++c) {
      const auto& [name, text] = settings[i][c];
      if (name == "gpus" || baseline_may_differ[c] || text == settings[j][c].second) continue;
      differ.push_back(name + " is " + text + ", the 1-GPU trial's " + settings[j][c].second);
    }
    if (!any || differ.size() < best.size()) best = differ;
    any = true;
  }
  if (!any) return "no done 1-GPU trial on " + backend + " in this experiment to compare with";
  if (best.empty()) return "";  // a baseline exists (its seconds were not measured)
  std::string out = "its ";
  for (size_t k = 0; k < best.size(); ++k) out += (k ? "; its " : "") + best[k];
  return out +
         " (speedup compares trials that differ only in gpus, and in settings that may vary "
         "with it, such as batch_size and lr)";
}

TrialThroughput trial_throughput(const std::vector<dps::EpochRow>& epochs) {
  TrialThroughput t;
  double sum = 0, peak = 0;
  int n = 0;
  for (const auto& e : epochs) {
    peak = std::max(peak, static_cast<double>(e.peak_memory_bytes));
    if (epochs.size() > 1 && e.epoch == 1) continue;
    if (std::isfinite(e.examples_per_second) && e.examples_per_second > 0)
      sum += e.examples_per_second, ++n;
  }
  if (n > 0) t.examples_per_second = sum / n;
  if (peak > 0) t.peak_memory_mib = peak / (1024.0 * 1024.0);
  return t;
}

std::vector<ExperimentTrials> experiment_trials(dps::Store& store, const SettingTable& table) {
  std::vector<ExperimentTrials> out;
  for (const auto& e : store.experiments()) {
    ExperimentTrials x;
    x.experiment = e;
    x.trials = store.trial_summaries(e.id);
    for (const auto& t : x.trials) x.settings.push_back(setting_texts(table, t.trial));
    for (const Setting* row : table.recorded())
      x.baseline_may_differ.push_back(row->baseline_may_differ);
    if (!x.settings.empty()) {
      for (size_t c = 0; c < x.settings[0].size(); ++c) {
        std::set<std::string> distinct;
        for (const auto& row : x.settings) distinct.insert(row[c].second);
        const std::string& name = x.settings[0][c].first;
        if (name == "model" || name == "gpus" || (distinct.size() > 1 && name != "data_path"))
          x.shown.push_back(c);
      }
    }
    out.push_back(std::move(x));
  }
  return out;
}

std::string format_report(dps::Store& store, const SettingTable& table) {
  const auto experiments = experiment_trials(store, table);
  if (experiments.empty()) return "no experiments in " + store.path() + "\n";
  std::string out;
  for (const auto& x : experiments) {
    const auto& e = x.experiment;
    const auto& trials = x.trials;
    const auto& settings = x.settings;
    const auto& shown = x.shown;
    out += "experiment " + e.name;
    if (!e.description.empty()) out += ": " + e.description;
    out +=
        " (" + std::to_string(trials.size()) + " trial" + (trials.size() == 1 ? "" : "s") + ")\n";
    if (trials.empty()) {
      out += "\n";
      continue;
    }
    std::vector<std::vector<std::string>> table;
    std::vector<std::string> header{"#"};  // the trial id (dprun tag, note, export, forget)
    for (size_t c : shown) header.push_back(settings[0][c].first);
    for (const char* h : {"status", "epochs", "final_acc", "best_acc", "s/epoch", "ex/s", "memory",
                          "speedup", "backend"})
      header.push_back(h);
    const bool any_tags = std::any_of(trials.begin(), trials.end(),
                                      [](const auto& t) { return !t.trial.tags.empty(); });
    if (any_tags) header.push_back("tags");
    table.push_back(header);
    std::vector<std::string> errors, no_speedup, notes;
    for (size_t i = 0; i < trials.size(); ++i) {
      const dps::TrialSummary& t = trials[i];
      std::vector<std::string> cells{std::to_string(t.trial.id)};
      for (size_t c : shown) cells.push_back(settings[i][c].second);
      cells.push_back(dps::status_name(t.trial.status));
      std::string epochs = "?";
      for (const auto& [name, text] : settings[i])
        if (name == "epochs") epochs = text;
      cells.push_back(std::to_string(t.trial.epochs_done) + "/" + epochs);
      cells.push_back(number_cell(t.final_test_acc, "%.4f"));
      cells.push_back(number_cell(t.best_test_acc, "%.4f"));
      cells.push_back(number_cell(t.mean_seconds_per_epoch, "%.2f"));
      const TrialThroughput tp = trial_throughput(store.epochs(t.trial.id));
      cells.push_back(number_cell(tp.examples_per_second, "%.0f"));
      cells.push_back(tp.peak_memory_mib ? number_cell(tp.peak_memory_mib, "%.0f") + " MiB" : "-");
      cells.push_back(number_cell(t.speedup, "%.2fx"));
      cells.push_back(t.trial.backend.empty() ? "-" : t.trial.backend);
      if (any_tags) cells.push_back(joined_tags(t.trial));
      table.push_back(cells);
      if (!t.trial.note.empty())
        notes.push_back("trial " + std::to_string(t.trial.id) + " (" + x.label(i) +
                        "): " + note_lines(t.trial.note, "      "));
      if (const std::string why = x.no_speedup_reason(i); !why.empty())
        no_speedup.push_back(x.label(i) + ": no speedup: " + why);
      if (!t.trial.error.empty()) {
        std::string label;
        for (size_t c : shown)
          label += (label.empty() ? "" : " ") + settings[i][c].first + "=" + settings[i][c].second;
        errors.push_back(label + ": " + t.trial.error);
      }
    }
    out += format_aligned(table, "  ");
    for (const auto& err : errors) out += "  ! " + err + "\n";
    for (const auto& why : no_speedup) out += "  - " + why + "\n";
    if (!notes.empty()) out += "  notes:\n";
    for (const auto& note : notes) out += "    " + note;
    out += "\n";
  }
  out +=
      "speedup: seconds per epoch of the matching 1-GPU trial / this trial's (epoch 1, the "
      "warm-up, excluded)\n";
  return out;
}

}  // namespace dprun
