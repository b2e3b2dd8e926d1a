// A well-formed plugin whose model list throws: the loader must turn that into a PluginError.
#include <stdexcept>
#include <vector>

#include "dp/plugin.hpp"

namespace {
std::vector<dp::ModelFactory> models() {
  throw std::runtime_error("this test plugin always fails");
}
}  // namespace

DPRUN_PLUGIN(models)
