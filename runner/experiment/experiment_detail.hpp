#pragma once
// Internal to the experiment parser: experiment_values.cpp reads and checks single values,
// experiment.cpp reads the sections, sweep.cpp expands the validated form into trials.
#include <toml++/toml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "experiment/experiment.hpp"

namespace dprun::detail {

/// A place in the file (1-based), for messages.
struct Pos {
  int line = 1, column = 1;
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
};

/// One grid axis: a swept list, or a zip group whose lists advance together.
struct Axis {
  Pos pos;
  std::vector<std::string> keys;  // in file order
  size_t size = 0;
};

/// Everything the expansion needs, validated.
struct Validated {
  const SettingTable* settings = nullptr;
  std::string dataset = "fashion-mnist";
  std::string data_path;
  std::map<std::string, Binding> bindings;  // by key; a [sweep] value replaces a [train] one
  std::vector<Axis> axes;                   // first axis outermost
  /// [model.<name>] tables: plugin options given for each model.
  std::map<std::string, std::map<std::string, Val>> model_tables;
  Pos sweep_pos, train_pos;
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

/// The position of a source region, or `fallback` when TOML++ has none (implicit tables).
Pos pos_of(const toml::source_region& r, Pos fallback);
/// Entries of a table in the order they appear in the file (toml::table sorts by key).
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t);

/// Reads [launch.slurm] (node: its value) into `out`, reporting every problem; fallback: where
/// [launch] is, for a value TOML++ gives no position.
void read_slurm_table(const toml::node& node, Pos fallback, Diagnostics& diag, SlurmConfig& out);

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
  std::optional<Val> read_option_value(const dp::OptionSpec& spec, const std::string& model,
                                       const toml::node& n, const std::string& path, Pos fallback,
                                       bool list);

 private:
  const ModelCatalog& catalog_;
  const SettingTable& settings_;
  std::vector<std::string> model_names_;
  Diagnostics diag_;
};

}  // namespace dprun::detail
