// Sweep expansion: the validated bindings of an experiment file become an ordered list of
// fully resolved trials (first axis outermost), each with its canonical settings and hash.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "experiment/experiment_detail.hpp"

namespace dprun::detail {

namespace {

constexpr int64_t kMaxTrialsWithoutForce = 1000;

std::string options_json(const dp::ModelOptions& options) {
  // Canonical: keys sorted (std::map), ints as ints, floats exactly (%.17g).
  std::string s = "{";
  for (const auto& [name, value] : options) {
    if (s.size() > 1) s += ",";
    s += quoted(name) + ":";
    if (auto* b = std::get_if<bool>(&value)) {
      s += *b ? "true" : "false";
    } else if (auto* i = std::get_if<int64_t>(&value)) {
      s += std::to_string(*i);
    } else if (auto* d = std::get_if<double>(&value)) {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", *d);
      s += buf;
    } else {
      s += quoted(std::get<std::string>(value));
    }
  }
  return s + "}";
}

/// The values of one trial: a point of every axis.
class Trial {
 public:
  Trial(const Validated& v, const std::vector<size_t>& point) : v_(v), point_(point) {}

  const Val* get(const std::string& key) const {
    auto it = v_.bindings.find(key);
    if (it == v_.bindings.end()) return nullptr;
    const Binding& b = it->second;
    return b.axis < 0 ? &b.fixed : &b.points[point_[b.axis]];
  }

 private:
  const Validated& v_;
  const std::vector<size_t>& point_;
};

}  // namespace

std::vector<TrialSpec> expand(const Validated& v, const ModelCatalog& catalog,
                              const ParseOptions& options, Diagnostics& diag) {
  // Count first (saturating), so a runaway sweep is refused before anything is allocated.
  int64_t count = 1;
  for (const auto& a : v.axes) {
    count = count > (int64_t{1} << 40) ? count : count * static_cast<int64_t>(a.size);
  }
  if (count > kMaxTrialsWithoutForce && !options.force) {
    diag.add(v.sweep_pos, "sweep",
             "sweep expands to " + std::to_string(count) +
                 " trials; pass --force to run more "
                 "than " +
                 std::to_string(kMaxTrialsWithoutForce));
    return {};
  }

  // The dataset's options: its declared defaults, then [data.<dataset>] (one dataset per file),
  // then per trial its "data.<dataset>.<option>" sweep keys. "{}" for a dataset the catalog
  // lacks (reported elsewhere).
  const bool known_dataset = catalog.datasets.count(v.dataset) > 0;
  dp::DatasetOptions file_data_options;
  if (known_dataset) {
    for (const auto& o : catalog.datasets.at(v.dataset).options)
      file_data_options[o.name] = o.default_value;
    for (const auto& [name, val] : v.data_options)
      file_data_options[name] = option_value(val.value);
  }
  const std::string data_prefix = "data." + v.dataset + ".";
  std::vector<TrialSpec> trials;
  std::map<std::string, size_t> hashes;  // config hash -> index of its trial
  std::set<std::string> reported_merge;  // keys already reported as merging trials
  std::set<std::string> option_axes_used;
  std::vector<size_t> point(v.axes.size(), 0);
  for (int64_t n = 0; n < count; ++n) {
    Trial t(v, point);
    // The settings: every key given for this point (fixed or from an axis), with what the
    // inputs imply; then those set outside [train] and [sweep].
    std::map<std::string, SettingValue> given;
    for (const auto& [key, b] : v.bindings)
      if (key.rfind("model.", 0) != 0 && key.rfind("data.", 0) != 0) given[key] = t.get(key)->value;
    TrialSettings s = settings_from_keys(*v.settings, given);
    s.set("dataset", v.dataset);
    s.set("data_path", v.data_path);
    dp::DatasetOptions data_options = file_data_options;
    for (const auto& [key, b] : v.bindings)
      if (key.rfind(data_prefix, 0) == 0)
        data_options[key.substr(data_prefix.size())] = option_value(t.get(key)->value);
    s.set("data_options", known_dataset ? options_json(data_options) : std::string("{}"));
    const std::string model = s[key::model];
    const int64_t gpus = s[key::gpus];
    const int64_t batch_size = s[key::batch_size];
    const int64_t eval_batch_size = s[key::eval_batch_size];

    // Every replica needs at least one example of each batch.
    auto smaller_than_gpus = [&](const char* key, int64_t batch) {
      const Val* where = t.get(key);
      if (!where && std::string(key) == "batch_size") where = t.get("gpus");
      const Val* gpus_at = t.get("gpus");
      diag.add(where ? where->pos : v.train_pos, where ? where->path : std::string("train.") + key,
               std::string(key) + " " + std::to_string(batch) + " is smaller than gpus " +
                   std::to_string(gpus) + (gpus_at ? " (" + gpus_at->path + ")" : "") +
                   ": every GPU needs at least one example per batch");
    };
    if (batch_size < gpus) smaller_than_gpus("batch_size", batch_size);
    // Every process runs the same number of replicas.
    if (const int64_t processes = s[key::processes]; gpus % processes != 0) {
      const Val* where = t.get("processes");
      const Val* gpus_at = t.get("gpus");
      diag.add(where     ? where->pos
               : gpus_at ? gpus_at->pos
                         : v.train_pos,
               where     ? where->path
               : gpus_at ? gpus_at->path
                         : std::string("train.processes"),
               "gpus " + std::to_string(gpus) + (gpus_at ? " (" + gpus_at->path + ")" : "") +
                   " is not divisible by processes " + std::to_string(processes) +
                   ": each process runs gpus / processes replicas (e.g. gpus = 16, processes = "
                   "2 is 2 hosts x 8 GPUs)");
    }
    if (eval_batch_size != 0 && eval_batch_size < gpus)
      smaller_than_gpus("eval_batch_size", eval_batch_size);

    // A key given for this trial that its other settings make meaningless is a mistake, not
    // something to ignore: say so at the key.
    auto does_not_apply = [&](const char* key, const std::string& why) {
      if (const Val* where = t.get(key)) diag.add(where->pos, where->path, why);
    };
    // Settings that mean something only for some values of another (momentum: optimizer
    // "sgd"), as the table says.
    for (const Setting& row : v.settings->rows()) {
      if (!row.applies_when || !t.get(row.key)) continue;
      const AppliesWhen& when = *row.applies_when;
      const std::string& actual = s.text(v.settings->by_key(when.key)->column);
      if (std::find(when.values.begin(), when.values.end(), actual) != when.values.end()) continue;
      std::vector<std::string> its_own;  // what does apply to this trial's value
      for (const Setting& other : v.settings->rows())
        if (other.applies_when && other.applies_when->key == when.key &&
            std::find(other.applies_when->values.begin(), other.applies_when->values.end(),
                      actual) != other.applies_when->values.end())
          its_own.push_back(other.key);
      does_not_apply(
          row.key.c_str(),
          row.key + " applies to " + when.key + " = " + join(when.values, " or ", true) +
              "; this trial's " + when.key + " is " + quoted(actual) +
              (its_own.empty() ? "" : " (its own keys: " + join(its_own, ", ", false) + ")"));
    }
    if (s[key::optimizer] == "sgd" && s[key::nesterov] && s[key::momentum] == 0.0)
      does_not_apply("nesterov", "nesterov = true needs momentum > 0 (as PyTorch's SGD)");
    if (const double v = s[key::validation]; v >= 1 && v != std::floor(v))
      does_not_apply("validation", "validation " + shortest(v) +
                                       ": a count of examples is a whole number (a fraction of "
                                       "the training set is below 1)");
    if (const std::string& m = s[key::stop_metric];
        (m == "val_acc" || m == "val_loss") && s[key::validation] == 0.0)
      does_not_apply("stop.metric", "stop.metric " + quoted(m) +
                                        " needs a validation split: set validation = N (examples "
                                        "held out of the training set) or a fraction");
    if (s[key::augment_mean].size() != s[key::augment_std].size())
      does_not_apply(t.get("augment.std") ? "augment.std" : "augment.mean",
                     "augment.mean has " + std::to_string(s[key::augment_mean].size()) +
                         " values and augment.std " + std::to_string(s[key::augment_std].size()) +
                         ": give both, one value per channel of the data, or neither");
    if (s[key::warmup_epochs] > static_cast<double>(s[key::epochs]))
      does_not_apply("warmup_epochs", "warmup_epochs " + shortest(s[key::warmup_epochs]) +
                                          " is longer than the training (" +
                                          std::to_string(s[key::epochs]) + " epochs)");

    // Plugin options: declared defaults, then the [model.<name>] table, then swept options.
    const dp::ModelFactory& factory = catalog.models.at(model);
    dp::ModelOptions resolved;
    for (const auto& o : factory.options) resolved[o.name] = o.default_value;
    if (auto it = v.model_tables.find(model); it != v.model_tables.end()) {
      for (const auto& [name, val] : it->second) resolved[name] = option_value(val.value);
    }
    const std::string option_prefix = "model." + model + ".";
    for (const auto& [key, b] : v.bindings) {
      if (key.rfind(option_prefix, 0) != 0) continue;
      resolved[key.substr(option_prefix.size())] = option_value(t.get(key)->value);
      option_axes_used.insert(key);
    }
    s.set("model_options", options_json(resolved));

    // The label shows the learning rate a trial runs with: with linear scaling that is the
    // scaled one, which varies with the batch even when lr itself is not swept.
    const Val* scaling = t.get("lr_scaling");
    const bool scaled = scaling && std::get<std::string>(scaling->value) == "linear";
    auto lr_text = [&] {
      if (!scaled) return shortest(s[key::lr]);
      char buf[32];  // a product: 0.1 * 768 / 256 shows as 0.3, not 0.30000000000000004
      std::snprintf(buf, sizeof buf, "%.6g", s[key::lr]);
      return std::string(buf);
    };
    bool lr_shown = false;
    std::string label;
    for (const auto& axis : v.axes) {
      for (const auto& key : axis.keys) {
        // An option of another model does not apply to this trial.
        if (key.rfind("model.", 0) == 0 && key.rfind(option_prefix, 0) != 0) continue;
        if (!label.empty()) label += " ";
        if (key == "lr") {
          label += "lr=" + lr_text();
          lr_shown = true;
        } else {
          label += key + "=" + display(t.get(key)->value);
        }
      }
    }
    if (scaled && !lr_shown && !v.axes.empty()) label += " lr=" + lr_text();

    TrialSpec spec{0, s, resolved, "", "", "", known_dataset ? data_options : dp::DatasetOptions{}};
    spec.canonical = canonical_settings(s);
    spec.config_hash = config_hash(s);
    spec.label = label;
    // A trial is identified by its settings: an option axis of one model repeats the trials of
    // the other models, which run once.
    if (auto [kept, fresh] = hashes.emplace(spec.config_hash, trials.size()); fresh) {
      spec.ordinal = static_cast<int64_t>(trials.size());
      trials.push_back(std::move(spec));
    } else {
      // The same trial again. A recorded setting outside the identity (what is kept of a run,
      // the backend that runs it) that differs from the kept trial's would be dropped without a
      // word: say so at its key.
      const TrialSettings& first = trials[kept->second].settings;
      for (const Setting* setting : v.settings->recorded()) {
        if (setting->identity || setting->key.empty()) continue;
        if (spec.settings.get(setting->column) == first.get(setting->column)) continue;
        const Val* where = t.get(setting->key);
        if (where == nullptr || !reported_merge.insert(setting->key).second) continue;
        diag.add(where->pos, where->path,
                 setting->key +
                     " is not part of a trial's identity: trials that differ only "
                     "in it are one trial, run once, so sweeping it would drop " +
                     setting->key + " = " + setting_text(spec.settings.get(setting->column)) +
                     "; set it in [train], or run the experiment again with another value");
      }
    }

    // Next point: the last axis advances fastest.
    for (size_t a = v.axes.size(); a-- > 0;) {
      if (++point[a] < v.axes[a].size) break;
      point[a] = 0;
    }
  }

  for (const auto& [key, b] : v.bindings) {
    if (key.rfind("model.", 0) == 0 && !option_axes_used.count(key)) {
      std::string model = key.substr(6, key.find('.', 6) - 6);
      diag.add(b.pos, b.path,
               "no trial uses model " + model + ", so this option changes nothing; add " + model +
                   " to the models of the sweep or remove the option");
    }
  }
  return trials;
}

}  // namespace dprun::detail
