// A valid ABI record but no dprun_plugin_models alias.
#include "dp/plugin.hpp"

extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi;
extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi = {
    DPRUN_PLUGIN_MAGIC, DPRUN_PLUGIN_ABI_VERSION, DPRUN_VERSION_STRING};
