// A shared library with a model list but no dprun_plugin_abi record: the loader must refuse it
// without calling anything.
#include <boost/dll/alias.hpp>
#include <cstdlib>
#include <vector>

#include "dp/plugin.hpp"

namespace {
std::vector<dp::ModelFactory> models() { std::abort(); }  // never called
}  // namespace

BOOST_DLL_ALIAS(models, dprun_plugin_models)
