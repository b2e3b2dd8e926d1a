#pragma once
// The table of trial settings. Every setting a trial can have is one row of builtin_settings()
// (settings_table.cpp), in the spirit of ccache's configuration key table: the experiment-file
// keys and their validation, the store's columns, the config hash, the record sent to the trial
// process, --filter, `dprun train`'s options, the report and the README's table of settings all
// follow from the rows. Adding a setting is one row plus the code that acts on its value.
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/json.hpp"
#include "dpstore/store.hpp"
#include "settings/keys.hpp"

namespace dprun {

/// A setting's value; the alternative follows from the setting's type (numbers: a fixed-size
/// list of floats).
using SettingValue = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

enum class SettingType {
  boolean,       // true or false
  integer,       // within the range
  number,        // a finite float within the range (an integer is accepted)
  numbers,       // `count` finite floats (or any number: kAnyCount), each within the range (betas)
  choice,        // one of `choices`
  model,         // the name of a model a plugin provides
  text,          // free text (where the data lives)
  json,          // a canonical JSON object (the plugin options)
  dataset,       // the name of a dataset, built in or from a plugin
  boolean_auto,  // true, false or "auto" (resolved where the trial runs): a bool, or the string
                 // "auto"
};

/// "boolean", "integer", ...: a type's name in messages.
const char* setting_type_name(SettingType t);

/// Bounds of an integer, number or numbers setting.
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  bool min_open = false;  // min itself excluded
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;
};
inline Range at_least(double min) { return {min, false}; }
inline Range greater_than(double min) { return {min, true}; }
inline Range from_to_below(double min, double max) { return {min, false, max, true}; }
inline Range above_up_to(double min, double max) { return {min, true, max, false}; }
inline Range from_to(double min, double max) { return {min, false, max, false}; }

/// When a setting means something: only for trials whose `key` setting (a choice) has one of
/// `values` ("momentum" only with optimizer "sgd"). Given for another trial, it is a mistake the
/// experiment file is told of, never silently ignored.
struct AppliesWhen {
  std::string key;
  std::vector<std::string> values;
};

/// Setting::count of a numbers setting whose length is not fixed (one value per channel).
inline constexpr size_t kAnyCount = static_cast<size_t>(-1);

/// The generation of the defaults: what a key the experiment file leaves out means. It grows by
/// one when a setting's default changes (2: layout "nchw" became "auto"; 3: graphs false became
/// "auto"). An experiment keeps
/// the generation it was begun with (the store records it), so a file run again against its
/// database means what it meant then: its trials keep their identities, and nothing stored runs
/// again. A new experiment gets this one.
inline constexpr int kDefaultsGeneration = 3;

/// A default a setting had before it changed: the default for experiments begun under
/// generation `until` or an earlier one.
struct EarlierDefault {
  int until = 1;
  SettingValue value;
};

/// One row of the table.
struct Setting {
  /// The key in [train] and [sweep]; "" for a setting the file sets elsewhere ([data], [model.X]).
  std::string key = {};
  /// The trials column, the name in the trial record and for --filter; "" for an input of the
  /// sweep expansion that is not recorded itself (lr_scaling acts through lr).
  std::string column = {};
  SettingType type = SettingType::integer;
  /// The value when the file does not give one. For a setting added after dprun 0.1.0 this must be
  /// what dprun did before the setting existed: trials stored before it ran with that value, and
  /// the default keeps their identity (see identity).
  SettingValue default_value = int64_t{0};
  Range range = {};                                               // integer, number, numbers
  std::vector<std::string> choices = {};                          // choice: the accepted values
  std::vector<std::pair<std::string, std::string>> refused = {};  // choice: (value, why not yet)
  size_t count = 0;  // numbers: how many (kAnyCount: any number of them, none included)
  /// Part of the trial's identity (its config hash): a trial is the same trial, and is not run
  /// again, exactly when every identity setting has the same value. A setting enters the hash
  /// only when it differs from its default (the settings of dprun 0.1.0 always do, for the
  /// hashes already stored), so adding a setting leaves the identity of every stored trial alone.
  bool identity = false;
  /// The scaling view's 1-GPU baseline may have another value (the setting varies with the GPU
  /// count, like lr, or between repeats, like seed). Every other setting must match.
  bool baseline_may_differ = false;
  /// Unset: it applies to every trial.
  std::optional<AppliesWhen> applies_when = {};
  std::string help = {};  // one line for the README, `dprun settings` and `dprun train --help`
  std::string default_doc = {};  // the default as documented, when the value alone would mislead
  /// The defaults this setting had before default_value, oldest first (see kDefaultsGeneration).
  /// A setting's default changes only this way: an experiment begun earlier keeps its default.
  std::vector<EarlierDefault> earlier_defaults = {};

  /// The default for an experiment of defaults generation `generation`.
  const SettingValue& default_for(int generation) const {
    for (const EarlierDefault& e : earlier_defaults)
      if (generation <= e.until) return e.value;
    return default_value;
  }
  /// The first default it ever had: what the identity and the store's column compare with, the
  /// same in every generation.
  const SettingValue& first_default() const {
    return earlier_defaults.empty() ? default_value : earlier_defaults.front().value;
  }
};

/// The rows, checked: unique keys and columns, defaults of the right type that pass their own
/// checks, identity settings recorded. A bad row is a programming error (std::logic_error).
class SettingTable {
 public:
  /// generation: the defaults generation its rows' default_value are of.
  explicit SettingTable(std::vector<Setting> rows, int generation = kDefaultsGeneration);
  const std::vector<Setting>& rows() const { return rows_; }
  int generation() const { return generation_; }
  /// The same rows with the defaults of an earlier generation as their default_value (itself
  /// for its own generation). Lives as long as this table.
  const SettingTable& with_defaults(int generation) const;
  const Setting* by_key(std::string_view key) const;        // null when there is none
  const Setting* by_column(std::string_view column) const;  // null when there is none
  /// The experiment-file keys in table order ("known keys" in messages).
  std::vector<std::string> keys() const;
  /// The rows with a column (what a trial records), in table order.
  const std::vector<const Setting*>& recorded() const { return recorded_; }
  /// The store's description of the recorded settings.
  std::vector<dps::SettingColumn> store_columns() const;

  SettingTable(const SettingTable&) = delete;  // recorded_ points into rows_
  SettingTable& operator=(const SettingTable&) = delete;

 private:
  std::vector<Setting> rows_;
  std::vector<const Setting*> recorded_;
  int generation_;
  mutable std::mutex earlier_mutex_;
  mutable std::map<int, std::unique_ptr<SettingTable>> earlier_;  // with_defaults' tables
};

/// The settings of this dprun, with the defaults of kDefaultsGeneration
/// (builtin_settings().with_defaults(g) for an experiment begun under generation g).
const SettingTable& builtin_settings();

/// Every recorded setting of one trial, by column. Starts at the defaults.
class TrialSettings {
 public:
  explicit TrialSettings(const SettingTable& table = builtin_settings());
  const SettingTable& table() const { return *table_; }

  /// std::logic_error naming the column when it is not a recorded setting or the type is wrong.
  const SettingValue& get(std::string_view column) const;
  void set(std::string_view column, SettingValue value);
  bool boolean(std::string_view column) const;
  int64_t integer(std::string_view column) const;
  double number(std::string_view column) const;
  const std::string& text(std::string_view column) const;  // choice, model, text, json
  const std::vector<double>& numbers(std::string_view column) const;

  /// The value of recorded()[i] of the table.
  const SettingValue& at(size_t i) const { return values_[i]; }

  /// Typed access by key (settings/keys.hpp): s[key::gpus] is an int64_t.
  template <class T>
  const T& operator[](SettingKey<T> k) const {
    return std::get<T>(get(k.column));
  }
  template <class T>
  void set(SettingKey<T> k, T value) {
    set(k.column, SettingValue(std::move(value)));
  }

 private:
  size_t index(std::string_view column) const;
  const SettingTable* table_;
  std::vector<SettingValue> values_;  // one per table_->recorded(), in that order
};

/// The settings of a trial from the values of the experiment-file keys given for it (by key; a
/// key not given takes its default), with what the inputs imply: batch_size = per_gpu_batch x
/// gpus when per_gpu_batch is given, per_gpu_batch = batch_size / gpus, and lr scaled by
/// batch_size / base_batch under lr_scaling = "linear".
TrialSettings settings_from_keys(const SettingTable& table,
                                 const std::map<std::string, SettingValue>& given);

/// A value as a user writes it: 2, 0.1, nchw, true, [0.9, 0.999]; JSON as it is.
std::string setting_text(const SettingValue& value);
/// "" when the value is acceptable for the setting (its type, range, choices), else what is
/// wrong ("must be at least 1, got 0"). Model names are the parser's to check (against plugins).
std::string check_setting_value(const Setting& setting, const SettingValue& value);
/// A value written as text, as on a command line: 2, 0.5, nhwc, true, 0.9,0.999 (a list),
/// checked as check_setting_value does; std::invalid_argument saying what is wrong otherwise.
SettingValue setting_from_text(const Setting& setting, const std::string& text);
/// How an acceptable value is described: "a positive integer", "a list of numbers" (list: a
/// list of such values was expected).
std::string expected_text(const Setting& setting, bool list);
/// The type as the documentation shows it: int ≥ 1, float in [0, 1), "nchw" | "nhwc".
std::string type_text(const Setting& setting);

/// The store's values of a trial's settings, and back. A setting the database has no column for
/// (written by an older dprun) reads as its default; a value of the wrong type is an error.
dps::SettingValues to_store(const TrialSettings& settings);
SettingValue from_store(const Setting& setting, const dps::SqlValue& value);
TrialSettings settings_from_store(const SettingTable& table, const dps::SettingValues& values);

/// The settings as the JSON object of the trial record (one member per column), and back;
/// JsonError naming the member that is missing, unknown or of the wrong type.
Json settings_to_json(const TrialSettings& settings);
TrialSettings settings_from_json(const Json& json, const SettingTable& table = builtin_settings());

/// The canonical serialisation of a trial's identity settings and its sha256 (the config hash).
std::string canonical_settings(const TrialSettings& settings);
std::string config_hash(const TrialSettings& settings);

/// The settings as a Markdown table: key, type, default, meaning (the README's, `dprun settings`).
std::string settings_markdown(const SettingTable& table);

}  // namespace dprun
