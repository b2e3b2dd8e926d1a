#pragma once
// Experiment files: parse a TOML file into an Experiment, expand its sweep into TrialSpecs.
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dp/plugin.hpp"
#include "experiment/launch_tables.hpp"
#include "settings/settings.hpp"

namespace dprun {

/// A bad experiment file. what() is the full message in the form
///   "scaling.toml:12:9: sweep.gpus: expected a list of positive integers, got \"two\"".
class ConfigError : public std::runtime_error {
 public:
  ConfigError(const std::string& file, int line, int column, const std::string& key,
              const std::string& message);
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& key() const { return key_; }

 private:
  std::string file_, key_;
  int line_, column_;
};

/// Several errors found in one file; what() joins them one per line.
class ConfigErrors : public std::runtime_error {
 public:
  explicit ConfigErrors(std::vector<ConfigError> errors);
  const std::vector<ConfigError>& errors() const { return errors_; }

 private:
  std::vector<ConfigError> errors_;
};

/// dprun's built-in datasets by name (dp::builtin_datasets()).
std::map<std::string, dp::DatasetFactory> builtin_dataset_catalog();

/// What the parser needs to know about the models and datasets that exist (for "unknown model"
/// and "unknown dataset" errors and option validation). Filled by the plugin loader.
struct ModelCatalog {
  std::map<std::string, dp::ModelFactory> models;  // by name
  /// By name: the built-in datasets, and those of plugins.
  std::map<std::string, dp::DatasetFactory> datasets = builtin_dataset_catalog();
};

/// One trial after sweep expansion: every setting resolved.
struct TrialSpec {
  int64_t ordinal = 0;             // 0-based position in the sweep
  TrialSettings settings;          // what the store records
  dp::ModelOptions model_options;  // resolved plugin options (defaults filled in)
  std::string config_hash;         // sha256 of the canonical serialisation, hex
  std::string canonical;           // the canonical serialisation (for debugging / plan)
  /// The axis values that vary in this sweep, "gpus=2 batch_size=512 lr=0.2", for display.
  std::string label;
  dp::DatasetOptions data_options;  // resolved dataset options (as the data_options setting)
};

/// [search]: how the trials are searched beyond running each to its end.
struct SearchConfig {
  /// "none", or "asha": asynchronous successive halving. Each trial first runs to the first
  /// rung (epoch min_epochs) and pauses (status pruned); a trial whose metric there is in the
  /// top 1/eta of those that reached the rung is promoted to the next (epoch min_epochs * eta,
  /// then * eta^2, ...) and finally to its own epochs, resuming from its checkpoint.
  std::string scheduler = "none";
  int64_t eta = 3;
  int64_t min_epochs = 1;
  /// What ranks trials at a rung: an epoch metric (an accuracy: higher is better; a loss: lower).
  /// "auto" in the file becomes val_acc when every trial has a validation split, test_acc when
  /// none has.
  std::string metric = "auto";
  bool asha() const { return scheduler == "asha"; }
};

struct Experiment {
  const SettingTable* settings = &builtin_settings();  // the settings its trials have
  std::string file;                                    // as given
  std::string source;                                  // the TOML text
  std::string name;
  std::string description;
  std::string database;   // as written ("" when absent); relative paths are from the cwd
  std::string data_path;  // [data].path ("" when absent)
  LaunchConfig launch;    // [launch]: how trials of several processes are started
  SlurmConfig slurm;      // [launch.slurm]: what `dprun submit` asks Slurm for
  /// The --set overrides applied to the file (KEY=VALUE, in order); `source` ends with them as
  /// comments.
  std::vector<std::string> overrides;
  SearchConfig search;  // [search]
  std::vector<TrialSpec> trials;
};

struct ParseOptions {
  bool force = false;  // allow more than 1000 trials
  /// `--set KEY=VALUE`: values that replace the file's (see detail::apply_overrides), checked as
  /// the file's are; a problem is reported at "--set KEY=VALUE".
  std::vector<std::string> overrides;
  /// The settings a file may set (tests give a table with settings of a later dprun).
  const SettingTable* settings = &builtin_settings();
};

/// Reads and validates the file and expands the sweep. Throws ConfigErrors (every problem found,
/// each with file:line:column) on bad input; std::runtime_error when the file cannot be read.
Experiment load_experiment(const std::string& file, const ModelCatalog& catalog,
                           const ParseOptions& options = {});
/// The same from text already read (file is used in messages).
Experiment parse_experiment(const std::string& file, const std::string& source,
                            const ModelCatalog& catalog, const ParseOptions& options = {});

}  // namespace dprun
