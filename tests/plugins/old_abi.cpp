// A plugin built against ABI version 0: the loader must name both versions and never call its
// model list (which aborts the process if it is called).
#include <boost/dll/alias.hpp>
#include <cstdlib>
#include <vector>

#include "dp/plugin.hpp"

extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi;
extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi = {DPRUN_PLUGIN_MAGIC, 0u,
                                                                         "0.0.1"};

namespace {
std::vector<dp::ModelFactory> models() { std::abort(); }  // never called
}  // namespace

BOOST_DLL_ALIAS(models, dprun_plugin_models)
