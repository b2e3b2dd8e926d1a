#pragma once
// Finding and loading plugins (models and datasets) with Boost.DLL. Every loaded library stays loaded until the
// process ends (objects a plugin creates must never outlive its code).
#include <map>
#include <string>
#include <vector>

#include "dp/plugin.hpp"

namespace dprun {

/// A plugin that could not be used. what() names the file and the problem.
class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LoadedModel {
  dp::ModelFactory factory;
  std::string plugin_path;  // absolute path of the shared library
  uint32_t abi_version = 0;
  std::string built_with;  // dprun version the plugin was built with
};

/// A dataset: built into dprun (plugin_path "") or from a plugin.
struct LoadedDataset {
  dp::DatasetFactory factory;
  std::string plugin_path;  // absolute path of the shared library; "" for a built-in dataset
  uint32_t abi_version = 0;
  std::string built_with;
};

/// What one plugin file provides (at least one model or dataset).
struct LoadedPlugin {
  std::vector<LoadedModel> models;
  std::vector<LoadedDataset> datasets;
};

/// The folders searched, in order: `extra` (--plugins, each may be a folder or a file), then
/// $DPRUN_PLUGIN_PATH (':'-separated), then the install's plugin folder
/// (<exe>/../lib/dprun/plugins), then the build tree's plugin folder. Missing folders are
/// skipped.
std::vector<std::string> plugin_search_path(const std::vector<std::string>& extra);

/// Loads one plugin file. Checks, in order: the file exists, it is a loadable shared library,
/// it exports dprun_plugin_abi with the right magic, its ABI version equals ours, it exports
/// dprun_plugin_models or dprun_plugin_datasets (or both), each list is well formed (names, no
/// name twice, a build or load function). Each failure is a PluginError naming the file and the
/// problem (for the version: both versions).
LoadedPlugin load_plugin_file(const std::string& file);
/// The models of load_plugin_file (none for a plugin of datasets only).
std::vector<LoadedModel> load_plugin(const std::string& file);

/// dprun's built-in datasets (dp::builtin_datasets()) as LoadedDatasets, by name.
std::map<std::string, LoadedDataset> builtin_dataset_map();

struct PluginScan {
  std::map<std::string, LoadedModel> models;  // by model name; the first found wins
  /// By dataset name: the built-in ones, then the plugins' (the first found wins; a plugin's
  /// dataset named like a built-in one is not taken, and said in `errors`).
  std::map<std::string, LoadedDataset> datasets = builtin_dataset_map();
  std::vector<std::string> errors;            // plugins that failed to load (one message each)
  /// Shared libraries in a plugin folder that the scan did not load, each with the reason (a
  /// name that is not lib*dprun*.so): never silently ignored.
  std::vector<std::string> skipped;
  std::vector<std::string> searched;  // folders searched
};

/// Loads every lib*dprun*.so in the search path's folders, and any file given explicitly.
/// Other shared libraries in those folders are listed in `skipped` with the reason.
PluginScan scan_plugins(const std::vector<std::string>& extra);

/// sha256 (hex) of a file's bytes.
std::string file_sha256(const std::string& file);

}  // namespace dprun
