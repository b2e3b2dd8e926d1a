#pragma once
// The model plugin contract. A plugin is a shared library that exports, with Boost.DLL:
//   - `dprun_plugin_abi`: a PluginAbi record (plain data), checked before anything is called;
//   - `dprun_plugin_models`: an alias to a function returning the models it provides.
// Use DPRUN_PLUGIN(function) once in the plugin to export both.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "dp/module.hpp"

#define DPRUN_PLUGIN_ABI_VERSION 1u
#define DPRUN_PLUGIN_MAGIC 0x4450524Eu /* "DPRN" */

namespace dp {

struct PluginAbi {
  uint32_t magic;        // DPRUN_PLUGIN_MAGIC
  uint32_t abi_version;  // DPRUN_PLUGIN_ABI_VERSION the plugin was built against
  const char* built_with_dprun;  // dp::version() at build time
};

/// A model option's value: bool, integer, float or string.
using OptionValue = std::variant<bool, int64_t, double, std::string>;
using ModelOptions = std::map<std::string, OptionValue>;
std::string option_type_name(const OptionValue& v);  // "bool", "int", "float", "string"
std::string option_to_string(const OptionValue& v);

struct OptionSpec {
  std::string name;
  OptionValue default_value;  // its alternative is the option's type
  std::string help;
};

/// What the model is built for.
struct ModelInput {
  int channels = 1, height = 28, width = 28;
  int classes = 10;
};

struct ModelFactory {
  std::string name;         // "lenet"
  std::string description;  // one line
  ModelInput input;         // the input it was designed for
  std::vector<OptionSpec> options;
  /// Builds one replica's model. `options` holds every declared option (defaults filled in).
  std::function<std::unique_ptr<Module>(const ModelOptions& options, const ModelInput& input)>
      build;
};

using PluginModelsFn = std::vector<ModelFactory>();

/// Fills the defaults of `spec` into `given`, checking that every given option is declared
/// and of the declared type (an int is accepted for a float). Throws dp::Error naming the
/// model, the option and the problem, listing the known options.
ModelOptions resolve_model_options(const ModelFactory& factory, const ModelOptions& given);

}  // namespace dp

#if defined(DPRUN_BUILDING_PLUGIN)
#include <boost/dll/alias.hpp>
/// Exports the ABI record and the model list function from a plugin.
#define DPRUN_PLUGIN(models_function)                                                    \
  extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi;                 \
  extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi = {              \
      DPRUN_PLUGIN_MAGIC, DPRUN_PLUGIN_ABI_VERSION, DPRUN_VERSION_STRING};               \
  BOOST_DLL_ALIAS(models_function, dprun_plugin_models)
#endif
