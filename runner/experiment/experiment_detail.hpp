#pragma once
// Internal to the experiment parser: experiment_values.cpp reads and checks single values,
// experiment.cpp reads the sections, sweep.cpp expands the validated form into trials.
#include <toml++/toml.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiment/experiment.hpp"

namespace dprun::detail {

/// A place in the file (1-based), for messages; or a value given on the command line (origin
/// "--set train.epochs=2", where line and column mean nothing).
struct Pos {
  int line = 1, column = 1;
  std::string origin = {};
};

/// Collects every problem found in one file; thrown together as ConfigErrors.
class Diagnostics {
 public:
  explicit Diagnostics(std::string file) : file_(std::move(file)) {}
  void add(Pos pos, const std::string& key, const std::string& message);
  bool empty() const { return errors_.empty(); }
  /// Throws ConfigErrors with every error, in file order, when there is any.
  void throw_if_any() const;
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::vector<ConfigError> errors_;
  std::vector<std::tuple<int, int, std::string, std::string>> seen_;
};

/// One validated value and where it was written ("sweep.zip[0].gpus[1]"): of a setting, or of a
/// plugin option (then bool, int64_t, double or string, as dp::OptionValue).
struct Val {
  SettingValue value;
  Pos pos;
  std::string path;
};

/// Where a setting's value comes from: one fixed value, or one axis of the sweep.
struct Binding {
  std::string key;          // "gpus", or "model.lenet.hidden" for a plugin option
  std::string path;         // where it was set: "train.gpus", "sweep.gpus", "sweep.zip[0].gpus"
  Pos pos;                  // of the value (a list for an axis)
  Pos key_pos;              // of the key
  int axis = -1;            // -1: fixed
  Val fixed;                // axis < 0
  std::vector<Val> points;  // axis >= 0: one value per point of the axis
  bool sampled = false;     // the points were drawn from a distribution ([search] samples)
};

/// One grid axis: a swept list, or a zip group whose lists advance together.
struct Axis {
  Pos pos;
  std::vector<std::string> keys;  // in file order
  size_t size = 0;
};

/// [search]: how many values each sampled key takes, and the seed of the draws.
struct Sampling {
  int64_t samples = 0;  // 0: no sampled keys allowed
  uint64_t seed = 0;
  Pos pos;  // of samples = N
};

/// What a sampled key's values are: integers, floats, or something else (choice only).
enum class SampledType { integer, real, other };

/// Draw `index` of `key` under `seed` as a number in [0, 1): a counter-based hash of the three,
/// the same on every machine.
double sample_unit(uint64_t seed, const std::string& key, int64_t index);
/// True when a [sweep] value is a distribution table ({log_uniform = [...]}, ...).
bool is_distribution(const toml::node& n);
/// The values a distribution gives `key` (one per sample, as TOML values for the key's reader
/// to check), or nothing when it is malformed (reported). uniform and log_uniform draws are
/// rounded to 6 significant digits (log_uniform of an integer key: to the nearest integer);
/// int_uniform [a, b] includes b; choice picks one of its values.
std::optional<toml::array> draw_samples(const toml::node& n, const std::string& key,
                                        const std::string& path, Pos pos, SampledType type,
                                        const Sampling& sampling, Diagnostics& diag);

/// Reads [search] (samples, seed, scheduler, eta, min_epochs, metric) into `sampling` and
/// `search`, reporting every problem.
void read_search_table(const toml::table& t, Diagnostics& diag, Sampling& sampling,
                       SearchConfig& search);
/// The checks of [search] that need the expanded trials (asha needs checkpoints; metric "auto"
/// resolved), reported at [search]'s keys.
void check_search(SearchConfig& search, const std::vector<TrialSpec>& trials, Pos at,
                  Diagnostics& diag);

/// A [sweep] key given as a distribution, where it was written and what it is.
struct SampledKey {
  std::string key, path;
  Pos value_pos, key_pos;
  const Setting* setting;  // one of the two
  const dp::OptionSpec* option;
  bool in_zip;
};
/// Reads one value of a key (a draw) as its checks say; nothing when it is bad (reported).
using ValueReader =
    std::function<std::optional<Val>(const toml::node&, const std::string&, bool list)>;
/// The binding of a sampled key: its points are the draws. Nothing when the distribution or a
/// draw is bad (reported).
std::optional<Binding> sampled_binding(const SampledKey& k, const toml::node& distribution,
                                       const Sampling& sampling, Diagnostics& diag,
                                       const ValueReader& read);

/// Everything the expansion needs, validated.
struct Validated {
  const SettingTable* settings = nullptr;
  std::string dataset = "fashion-mnist";
  std::string data_path;
  /// The [data.<dataset>] options given (checked against the dataset's declared options).
  std::map<std::string, Val> data_options;
  std::map<std::string, Binding> bindings;  // by key; a [sweep] value replaces a [train] one
  std::vector<Axis> axes;                   // first axis outermost
  /// [model.<name>] tables: plugin options given for each model.
  std::map<std::string, std::map<std::string, Val>> model_tables;
  Pos sweep_pos, train_pos;
  Sampling sampling;
  SearchConfig search;
  Pos search_pos;  // of [search]
};

/// Expands the sweep into resolved trials (checks that need a whole trial, the trial limit).
std::vector<TrialSpec> expand(const Validated& v, const ModelCatalog& catalog,
                              const ParseOptions& options, Diagnostics& diag);

/// Text helpers.
std::string quoted(const std::string& s);    // JSON string literal
std::string shortest(double d);              // shortest text that reads back as d
std::string display(const SettingValue& v);  // 0.2, 128, lenet, true (labels)
/// How a value is shown after "got": "two" (quoted), 3, 0.5, [1, 2], a table.
std::string describe(const toml::node& n);
/// "; did you mean \"lr\"?" when did_you_mean finds a likely typo among the candidates, else "".
std::string typo_hint(const std::string& word, const std::vector<std::string>& candidates);
std::string join(const std::vector<std::string>& items, const std::string& sep, bool quote);

/// The position of a source region, or `fallback` when TOML++ has none (implicit tables). A
/// value from a --set override has its origin.
Pos pos_of(const toml::source_region& r, Pos fallback);

/// The source path TOML++ gives the values of one --set override ("--set KEY=VALUE").
constexpr const char* kOverrideOrigin = "--set ";
/// Applies `dprun run --set KEY=VALUE` overrides to the parsed file, in order, each replacing
/// what the file (or an earlier override) gave at KEY (a TOML key: train.epochs,
/// model.lenet.hidden, sweep.lr, sweep."model.lenet.hidden"). VALUE is TOML (2, 0.5, [1, 2],
/// {log_uniform = [0.001, 1.0]}, "nhwc"), or else a string. Reports bad overrides to `diag`.
void apply_overrides(toml::table& root, const std::vector<std::string>& overrides,
                     Diagnostics& diag);
/// Entries of a table in the order they appear in the file (toml::table sorts by key).
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t);

/// Reads [launch.slurm] (node: its value) into `out`, reporting every problem; fallback: where
/// [launch] is, for a value TOML++ gives no position.
void read_slurm_table(const toml::node& node, Pos fallback, Diagnostics& diag, SlurmConfig& out);

class Validator;
/// Reads [data] (dataset, path, and the [data.<dataset>] options table) into `out`, reporting
/// every problem. The dataset must be known to the catalog (built in or from a plugin).
void read_data_table(const toml::table& t, Validator& val, Validated& out);
/// The option of a dataset option axis, [sweep] key "data.<dataset>.<option>" at `path`, and
/// its dataset in `dataset`: null (reported) when the key is not of that form (a bare "data":
/// the key was not quoted), or the dataset
/// is unknown, is not `chosen` (the one the experiment trains on) or declares no such option.
const dp::OptionSpec* sweep_data_option(Validator& val, const std::string& key,
                                        const std::string& path, Pos pos, const std::string& chosen,
                                        std::string& dataset);

/// "an integer" / "a list of integers" for a plugin option of the type of `v`.
std::string option_type(const dp::OptionValue& v, bool list);

/// A plugin option value as the plugin contract types it.
dp::OptionValue option_value(const SettingValue& v);

/// Reads and checks single values against the table of settings and the model catalog,
/// reporting every problem to its Diagnostics.
class Validator {
 public:
  Validator(const std::string& file, const ModelCatalog& catalog, const SettingTable& settings);
  Diagnostics& diag() { return diag_; }
  const ModelCatalog& catalog() const { return catalog_; }
  const SettingTable& settings() const { return settings_; }
  /// "known models: lenet, resnet18".
  std::string known_models() const;

  /// One value of a [train] key; `list` says a list was expected there (a [sweep] key), for
  /// the message. Nothing (reported) when the type or the range is wrong.
  std::optional<Val> read_train_value(const Setting& k, const toml::node& n,
                                      const std::string& path, Pos fallback, bool list);
  /// A plugin option's spec; null (reported at pos, for path) when the model or the option
  /// does not exist.
  const dp::OptionSpec* find_option(const std::string& model, const std::string& option,
                                    const std::string& path, Pos pos);
  /// A plugin option value, typed by the option's default (an integer is accepted for a float).
  /// `kind` names the owner in messages: "model" or "dataset".
  std::optional<Val> read_option_value(const dp::OptionSpec& spec, const std::string& model,
                                       const toml::node& n, const std::string& path, Pos fallback,
                                       bool list, const char* kind = "model");
  /// "known datasets: arrays, cifar10, fashion-mnist, mnist".
  std::string known_datasets() const;
  /// The names of the datasets known (built in and from plugins).
  std::vector<std::string> dataset_names() const;

 private:
  const ModelCatalog& catalog_;
  const SettingTable& settings_;
  std::vector<std::string> model_names_;
  Diagnostics diag_;
};

}  // namespace dprun::detail
