#pragma once
// The plugin contract. A plugin is a shared library that exports, with Boost.DLL:
//   - `dprun_plugin_abi`: a PluginAbi record (plain data), checked before anything is called;
//   - `dprun_plugin_models`: an alias to a function returning the models it provides, and/or
//   - `dprun_plugin_datasets`: an alias to a function returning the datasets it provides.
// Export them with one of, once in the plugin:
//   DPRUN_PLUGIN(models)                          models only (every plugin before datasets)
//   DPRUN_DATASET_PLUGIN(datasets)                datasets only
//   DPRUN_PLUGIN_MODELS_AND_DATASETS(models, datasets)
// The datasets alias is optional. The ABI version is that of the classes a plugin compiles
// against (dp::Module's virtual functions, the layers' sizes, the factories): version 2 added
// Module::fold_previous and the layers' bias fold, so a plugin built against version 1's headers
// would call through another vtable and allocate layers too small; it is refused instead.
// Version 3: dp::Backend gained virtual functions (batchnorm_takes_impl, conv_output_dtype_impl)
// before others in its vtable, dp::ConvUse a member (output_to_batchnorm), and BatchNorm2d one
// (input_of_), which moves its later members.
// Version 4: dp::Backend gained conv_takes_impl, dp::ConvUse and dp::ConvPlan an input dtype,
// Conv2d a member (input_from_) and BatchNorm2d two (output_to_, y_dtype_).
// Version 5: dp::Module gained virtual functions (takes_input, output_dtype) and two members
// (the dtypes its container gives: set_readers_take, set_input_dtype).
// Version 6: dp::Conv2d gained a member (input_grad_takes_: set_input_grad_takes), dp::BnEpilogue
// one (conv_bias) and dp::Backend a virtual function (batchnorm_folds_bias_impl).
// Version 7: the ReLU fold: dp::Backend gained a virtual function (relu_backward_bias_impl) and
// linear_forward_impl a parameter, dp::ConvUse and dp::ConvPlan a member (output_relu), Conv2d
// and Linear members (relu_, dz_, y_planned_), ReLU a member and two virtual overrides.
// Version 8: weights in the model's layout: dp::ParamRegistry gained a member (layout_) and
// add_parameter a parameter, its Entry a member (layout), dp::ConvUse and dp::ConvPlan a member
// (filter_layout), Conv2d a member (w_layout_). A
// plugin's own layer that reads a Conv2d's weight in an NHWC model now gets a (K, R, S, C) tensor
// (Tensor::layout nhwc): such code must look at the layout.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "dp/data.hpp"
#include "dp/module.hpp"

#define DPRUN_PLUGIN_ABI_VERSION 8u
#define DPRUN_PLUGIN_MAGIC 0x4450524Eu /* "DPRN" */

namespace dp {

struct PluginAbi {
  uint32_t magic;        // DPRUN_PLUGIN_MAGIC
  uint32_t abi_version;  // DPRUN_PLUGIN_ABI_VERSION the plugin was built against
  const char* built_with_dprun;  // dp::version() at build time
};

/// A model's or a dataset's option value: bool, integer, float or string.
using OptionValue = std::variant<bool, int64_t, double, std::string>;
using ModelOptions = std::map<std::string, OptionValue>;
using DatasetOptions = std::map<std::string, OptionValue>;
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

/// What a dataset yields: the shape of one example (channels x height x width) and the number
/// of classes. 0 in a field: it depends on the options or the files (said in `note`).
struct DatasetShape {
  int channels = 0, height = 0, width = 0;
  int classes = 0;
  std::string note;  // how what is 0 above is decided, e.g. "from the files' images tensor"
};
/// "1x28x28, 10 classes", with "?" for what depends on the files, then the note; the note alone
/// when every field depends on them.
std::string shape_text(const DatasetShape& shape);

struct DatasetFactory {
  std::string name;         // "fashion-mnist": [data] dataset = "fashion-mnist"
  std::string description;  // one line
  DatasetShape shape;       // what it yields; the runner checks the loaded data against it
  std::vector<OptionSpec> options;  // [data.NAME] keys
  /// Loads the train and test splits. `options` holds every declared option (defaults filled
  /// in); `path` is [data] path or --data ("" when not given): the folder to look in, which
  /// find_dataset_folder turns into dprun's usual search. Throws dp::Error naming the file and
  /// what is wrong with it.
  std::function<DatasetPair(const DatasetOptions& options, const std::string& path)> load;
};

using PluginDatasetsFn = std::vector<DatasetFactory>();

/// Fills the defaults of `spec` into `given`, checking that every given option is declared
/// and of the declared type (an int is accepted for a float). Throws dp::Error naming the
/// model, the option and the problem, listing the known options.
ModelOptions resolve_model_options(const ModelFactory& factory, const ModelOptions& given);
/// The same for a dataset's options ([data.NAME]); the messages name the dataset.
DatasetOptions resolve_dataset_options(const DatasetFactory& factory, const DatasetOptions& given);

/// The datasets dprun itself provides, in name order: "arrays" (safetensors files of images and
/// labels), "cifar10", "fashion-mnist", "mnist". Plugins add to these; they cannot replace them.
const std::vector<DatasetFactory>& builtin_datasets();
/// The built-in dataset of that name, or nullptr.
const DatasetFactory* find_builtin_dataset(const std::string& name);

/// Loads `factory`'s data with `options` resolved against it, then checks what came back
/// against its declared shape and against itself (counts, sizes, labels in range, the same
/// shape and classes in both splits). Throws dp::Error naming the dataset and the problem.
DatasetPair load_checked(const DatasetFactory& factory, const DatasetOptions& options,
                         const std::string& path);

}  // namespace dp

#if defined(DPRUN_BUILDING_PLUGIN)
#include <boost/dll/alias.hpp>
#define DPRUN_PLUGIN_ABI_RECORD_                                                         \
  extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi;                 \
  extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi = {              \
      DPRUN_PLUGIN_MAGIC, DPRUN_PLUGIN_ABI_VERSION, DPRUN_VERSION_STRING};
/// Exports the ABI record and the model list function from a plugin.
#define DPRUN_PLUGIN(models_function) \
  DPRUN_PLUGIN_ABI_RECORD_            \
  BOOST_DLL_ALIAS(models_function, dprun_plugin_models)
/// Exports the ABI record and the dataset list function from a plugin of datasets only.
#define DPRUN_DATASET_PLUGIN(datasets_function) \
  DPRUN_PLUGIN_ABI_RECORD_                      \
  BOOST_DLL_ALIAS(datasets_function, dprun_plugin_datasets)
/// Exports the ABI record, the model list and the dataset list functions.
#define DPRUN_PLUGIN_MODELS_AND_DATASETS(models_function, datasets_function) \
  DPRUN_PLUGIN_ABI_RECORD_                                                   \
  BOOST_DLL_ALIAS(models_function, dprun_plugin_models)                      \
  BOOST_DLL_ALIAS(datasets_function, dprun_plugin_datasets)
#endif
