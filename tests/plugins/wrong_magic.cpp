// An ABI record whose magic is not "DPRN": the loader must refuse it without calling anything.
#include <boost/dll/alias.hpp>
#include <cstdlib>
#include <vector>

#include "dp/plugin.hpp"

extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi;
extern "C" BOOST_SYMBOL_EXPORT const ::dp::PluginAbi dprun_plugin_abi = {
    0x12345678u, DPRUN_PLUGIN_ABI_VERSION, DPRUN_VERSION_STRING};

namespace {
std::vector<dp::ModelFactory> models() { std::abort(); }  // never called
}  // namespace

BOOST_DLL_ALIAS(models, dprun_plugin_models)
