// Planning a sweep: loading the experiment, filters, and what a run would do with each trial
// (`dprun plan`, `dprun run --dry-run`). Running it is sweep_runner.cpp.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "base/suggest.hpp"
#include "base/text.hpp"
#include "models/plugin_loader.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun {

namespace fs = std::filesystem;

// ---- settings as text, filters
// -------------------------------------------------------------------

namespace {

std::string num(double d) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, res.ptr);
}

std::optional<double> as_number(const std::string& s) {
  double d = 0;
  auto res = std::from_chars(s.data(), s.data() + s.size(), d);
  if (res.ec != std::errc() || res.ptr != s.data() + s.size()) return std::nullopt;
  return d;
}

// A string is compared without quotes, written with or without them (layout=nhwc, "nhwc").
bool same_value(const std::string& stored, std::string wanted) {
  if (wanted.size() >= 2 && wanted.front() == '"' && wanted.back() == '"')
    wanted = wanted.substr(1, wanted.size() - 2);
  auto a = as_number(stored), b = as_number(wanted);
  if (a && b) return std::fabs(*a - *b) <= 1e-12 * std::max({1.0, std::fabs(*a), std::fabs(*b)});
  return stored == wanted;
}

}  // namespace

std::map<std::string, std::string> trial_setting_values(const TrialSpec& spec) {
  std::map<std::string, std::string> v;
  const auto& recorded = spec.settings.table().recorded();
  for (size_t i = 0; i < recorded.size(); ++i) {
    // A setting answers to its column and to its key where they differ (bn_mode and bn).
    const std::string text = setting_text(spec.settings.at(i));
    v[recorded[i]->column] = text;
    if (!recorded[i]->key.empty()) v[recorded[i]->key] = text;
  }
  auto text = [](const dp::OptionValue& value) {
    if (const auto* s = std::get_if<std::string>(&value)) return *s;  // unquoted, as labels show it
    return std::holds_alternative<double>(value) ? num(std::get<double>(value))
                                                 : dp::option_to_string(value);
  };
  for (const auto& [name, value] : spec.model_options) v["option." + name] = text(value);
  // A dataset option answers to its sweep key, "data.<dataset>.<option>".
  for (const auto& [name, value] : spec.data_options)
    v["data." + spec.settings[key::dataset] + "." + name] = text(value);
  return v;
}

bool trial_matches(const TrialSpec& spec,
                   const std::vector<std::pair<std::string, std::string>>& filters,
                   const dps::TrialRow* stored) {
  if (filters.empty()) return true;
  const auto values = trial_setting_values(spec);
  std::map<std::string, bool> matched;  // per key: any of its values matched
  for (const auto& [key, wanted] : filters) {
    // A tag lives in the database, not in the experiment file: it is asked of the stored trial.
    if (key == "tag") {
      if (const std::string problem = dps::tag_name_problem(wanted); !problem.empty())
        throw UsageError("--filter tag=" + wanted + ": " + problem);
      matched[key] = matched[key] || (stored && std::find(stored->tags.begin(), stored->tags.end(),
                                                          wanted) != stored->tags.end());
      continue;
    }
    auto it = values.find(key);
    if (it == values.end() && key.rfind("option.", 0) != 0) {
      std::vector<std::string> known;
      for (const Setting* row : spec.settings.table().recorded())
        known.push_back(row->key.empty() ? row->column : row->key);
      std::vector<std::string> keys = known;
      keys.push_back("tag");
      const std::string hint = did_you_mean(key, keys);
      std::string list;
      for (const auto& k : known) list += k + ", ";
      throw UsageError("--filter " + key + "=" + wanted + ": unknown setting \"" + key + "\"" +
                       (hint.empty() ? "" : "; did you mean " + hint + "?") + " (known: " + list +
                       "option.NAME for a model option, data.DATASET.NAME for a dataset option, "
                       "tag for a tag given with dprun tag)");
    }
    bool ok = it != values.end() && same_value(it->second, wanted);
    matched[key] = matched[key] || ok;
  }
  return std::all_of(matched.begin(), matched.end(), [](const auto& kv) { return kv.second; });
}

std::string trial_display_name(const TrialSpec& spec) {
  const std::string& model = spec.settings[key::model];
  if (spec.label.empty()) return model;
  if (spec.label.find("model=") != std::string::npos) return spec.label;
  return model + " " + spec.label;
}

std::string database_path(const Experiment& experiment, const SweepOptions& options) {
  if (!options.db.empty()) return options.db;
  if (!experiment.database.empty()) return experiment.database;
  return "results/" + experiment.name + ".db";
}

// ---- plan
// ----------------------------------------------------------------------------------------

std::string PlannedTrial::describe() const {
  if (action == TrialAction::run) return why == "new" ? "run" : why;
  return "skip: " + why;
}

namespace {

// A failed or interrupted trial continues from its last checkpoint when it kept one (the runner
// checks the files before it does; see TrialRun::prepare_checkpoints).
bool resumes(const TrialSpec& spec, const dps::TrialRow& row, const SweepOptions& options) {
  return !options.run.restart && row.last_checkpoint_epoch > 0 &&
         spec.settings[key::checkpoint] != "none";
}

std::string resume_text(const dps::TrialRow& row) {
  return "resume after epoch " + std::to_string(row.last_checkpoint_epoch) + ": ";
}

}  // namespace

std::vector<PlannedTrial> plan_trials(const Experiment& experiment,
                                      const std::map<std::string, dps::TrialRow>& stored,
                                      const SweepOptions& options,
                                      const std::map<std::string, std::string>& elsewhere) {
  // A tag no trial of the experiment has would silently filter out every trial (a misspelling,
  // or the tags of another database): an error that lists the tags it has.
  for (const auto& [key, wanted] : options.filters) {
    if (key != "tag") continue;
    std::set<std::string> tags;
    for (const auto& [hash, row] : stored) tags.insert(row.tags.begin(), row.tags.end());
    if (tags.count(wanted)) continue;
    std::string list;
    for (const auto& t : tags) list += (list.empty() ? "" : ", ") + t;
    throw UsageError("--filter tag=" + wanted + ": no trial of experiment " + experiment.name +
                     " has that tag (its tags: " + (list.empty() ? "none" : list) +
                     "; dprun tag adds one)");
  }
  std::vector<PlannedTrial> plan;
  for (const TrialSpec& spec : experiment.trials) {
    PlannedTrial p;
    p.spec = &spec;
    if (auto it = stored.find(spec.config_hash); it != stored.end()) p.row = it->second;
    if (!trial_matches(spec, options.filters, p.row ? &*p.row : nullptr)) {
      p.action = TrialAction::skip;
      p.why = "filtered out";
      p.eligible = false;
    } else if (auto task = elsewhere.find(spec.config_hash); task != elsewhere.end()) {
      p.action = TrialAction::skip;
      p.why = "submitted: " + task->second;
      p.eligible = false;
    } else if (!p.row) {
      p.why = experiment.search.asha() ? "asha: run to the first rung" : "new";
    } else {
      using S = dps::TrialStatus;
      switch (p.row->status) {
        case S::pending:
          p.why = experiment.search.asha() ? "asha: run to the first rung" : "run";
          break;
        case S::done:
        case S::stopped:  // its stopping rule ended it: as final as done (the rule is identity)
          if (options.run.rerun) {
            p.why = std::string("rerun: ") + dps::status_name(p.row->status) + " (--rerun)";
          } else {
            p.action = TrialAction::skip;
            p.why = dps::status_name(p.row->status);
          }
          break;
        case S::failed:
          p.why = resumes(spec, *p.row, options) ? resume_text(*p.row) + "failed" : "rerun: failed";
          break;
        case S::diverged:
          p.why = "rerun: diverged";
          break;
        case S::interrupted:
          p.why = resumes(spec, *p.row, options) ? resume_text(*p.row) + "interrupted"
                                                 : "restart: interrupted";
          break;
        case S::skipped:
          p.why = "rerun: skipped before";
          break;
        case S::pruned:
          // Paused at a rung: the [search] scheduler promotes it, or not, when the run gets there.
          if (experiment.search.asha()) {
            p.why = "asha: paused at rung " + std::to_string(p.row->rung) +
                    ", promoted if in the top 1/" + std::to_string(experiment.search.eta);
          } else {
            p.action = TrialAction::skip;
            p.why = "pruned";
          }
          break;
        case S::running:
          // After recover_stale, a trial still running belongs to a live dprun elsewhere.
          p.action = TrialAction::skip;
          p.why = "running in another dprun (pid " + std::to_string(p.row->runner_pid) +
                  (p.row->host.empty() ? "" : " on " + p.row->host) + ")";
          break;
      }
    }
    plan.push_back(std::move(p));
  }
  return plan;
}

// ---- loading
// -------------------------------------------------------------------------------------

namespace {

// The defaults generation the database's experiment `name` was begun with; this dprun's when
// the database or the experiment does not exist yet.
int begun_with_defaults(const std::string& db, const std::string& name) {
  const std::optional<int> found = dps::experiment_defaults(db, name);
  if (!found) return kDefaultsGeneration;
  if (*found > kDefaultsGeneration)
    throw UsageError(db + ": experiment " + name + " was begun by a later dprun, whose defaults " +
                     "(generation " + std::to_string(*found) +
                     ") this one does not know (it knows up to " +
                     std::to_string(kDefaultsGeneration) + "): upgrade dprun");
  return *found;
}

// "layout = nchw, ...": the defaults of `earlier` that differ from those of `now`.
std::string changed_defaults(const SettingTable& earlier, const SettingTable& now) {
  std::string out;
  for (size_t i = 0; i < earlier.rows().size(); ++i) {
    const Setting& then = earlier.rows()[i];
    if (then.default_value == now.rows()[i].default_value) continue;
    out += (out.empty() ? "" : ", ") + (then.key.empty() ? then.column : then.key) + " = " +
           setting_text(then.default_value);
  }
  return out;
}

}  // namespace

Experiment load_sweep(const SweepOptions& options) {
  if (!options.run.backend.empty() && options.run.backend != "auto" &&
      options.run.backend != "cpu" && options.run.backend != "cuda")
    throw UsageError("--backend " + options.run.backend + ": expected auto, cpu or cuda");
  PluginScan scan = scan_plugins(options.run.plugin_dirs);
  for (const auto& e : scan.errors) std::fprintf(stderr, "dprun: warning: %s\n", e.c_str());
  for (const auto& s : scan.skipped) std::fprintf(stderr, "dprun: note: %s\n", s.c_str());
  ModelCatalog catalog;
  for (const auto& [name, m] : scan.models) catalog.models[name] = m.factory;
  for (const auto& [name, d] : scan.datasets) catalog.datasets[name] = d.factory;
  ParseOptions parse;
  parse.force = options.force;
  parse.overrides = options.overrides;
  if (options.settings) parse.settings = options.settings;
  Experiment experiment = load_experiment(options.file, catalog, parse);
  // An experiment begun under earlier defaults keeps them: its file means what it meant then.
  const std::string db = database_path(experiment, options);
  if (const int begun = begun_with_defaults(db, experiment.name);
      begun < experiment.settings->generation()) {
    parse.settings = &parse.settings->with_defaults(begun);
    const std::string changed = changed_defaults(*parse.settings, *experiment.settings);
    experiment = load_experiment(options.file, catalog, parse);
    if (!changed.empty())
      std::fprintf(stderr,
                   "dprun: note: experiment %s in %s was begun by an earlier dprun: the settings "
                   "its file leaves out keep the defaults it began with (%s), so its trials stay "
                   "the same trials; set them in the file to change them\n",
                   experiment.name.c_str(), db.c_str(), changed.c_str());
  }
  // Under asha a trial's epochs are the rungs' rankings: rerunning a done trial or restarting a
  // paused one at epoch 1 would pull its values out of them while it runs.
  if (experiment.search.asha() && (options.run.rerun || options.run.restart))
    throw UsageError(std::string(options.run.rerun ? "--rerun" : "--restart") +
                     " does not go with [search] scheduler = \"asha\" (" + options.file +
                     "): its trials' epochs are the rungs' rankings; give the experiment another "
                     "name to search again from scratch");
  // Unknown filter keys are command-line errors, found before anything runs.
  if (!experiment.trials.empty()) trial_matches(experiment.trials.front(), options.filters);
  // option.NAME must be an option of a model of this sweep: a misspelt one would silently
  // filter out every trial.
  std::set<std::string> option_names;
  for (const TrialSpec& spec : experiment.trials)
    for (const auto& [name, value] : spec.model_options) option_names.insert(name);
  for (const auto& [key, wanted] : options.filters) {
    if (key.rfind("option.", 0) != 0) continue;
    const std::string name = key.substr(7);
    if (option_names.count(name)) continue;
    std::vector<std::string> names(option_names.begin(), option_names.end());
    std::string known, hint = did_you_mean(name, names);
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + ("option." + n);
    throw UsageError("--filter " + key + "=" + wanted +
                     ": no model of this sweep has an option \"" + name + "\"" +
                     (hint.empty() ? "" : "; did you mean option." + hint + "?") +
                     " (options: " + (known.empty() ? "none" : known) + ")");
  }
  return experiment;
}

std::map<std::string, dps::TrialRow> stored_trials_read_only(
    const std::string& db, const std::string& experiment,
    std::map<std::string, std::string>& submitted) {
  std::map<std::string, dps::TrialRow> rows;
  if (!fs::exists(db)) return rows;
  dps::Store store(db, dps::Store::Mode::read_only);
  const auto found = store.find_experiment(experiment);
  if (!found) return rows;
  for (auto& row : store.trials(found->id)) rows[row.config_hash] = row;
  for (const auto& t : store.tasks(found->id, true))
    submitted[t.config_hash] = "Slurm job " + (t.job_id.empty() ? "?" : t.job_id) + "_" +
                               std::to_string(t.index) + ", not collected yet (dprun status)";
  return rows;
}

namespace {

void print_plan(const Experiment& experiment, const std::string& db,
                const std::vector<PlannedTrial>& plan) {
  std::printf("experiment %s: %zu trial%s, database %s%s\n", experiment.name.c_str(), plan.size(),
              plan.size() == 1 ? "" : "s", db.c_str(), fs::exists(db) ? "" : " (not created yet)");
  for (const auto& o : experiment.overrides) std::printf("override: --set %s\n", o.c_str());
  std::vector<std::vector<std::string>> table;
  table.push_back({"#", "hash", "trial", "action"});
  for (const auto& p : plan)
    table.push_back({std::to_string(p.spec->ordinal + 1), p.spec->config_hash.substr(0, 10),
                     trial_display_name(*p.spec), p.describe()});
  std::fputs(format_aligned(table).c_str(), stdout);
  size_t to_run = std::count_if(plan.begin(), plan.end(),
                                [](const PlannedTrial& p) { return p.action == TrialAction::run; });
  std::printf("%zu to run, %zu to skip\n", to_run, plan.size() - to_run);
}

}  // namespace

int plan_sweep(const SweepOptions& options) {
  Experiment experiment = load_sweep(options);
  const std::string db = database_path(experiment, options);
  std::map<std::string, std::string> elsewhere;
  auto plan = plan_trials(experiment, stored_trials_read_only(db, experiment.name, elsewhere),
                          options, elsewhere);
  print_plan(experiment, db, plan);
  return 0;
}

}  // namespace dprun
