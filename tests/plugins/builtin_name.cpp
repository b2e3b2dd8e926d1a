// A datasets-only plugin whose first dataset takes a built-in dataset's name ("cifar10"), which
// the loader must refuse (naming the file and the dataset) while keeping its other dataset.
#include <string>
#include <vector>

#include "dp/error.hpp"
#include "dp/plugin.hpp"

namespace {

dp::DatasetFactory named(const std::string& name) {
  dp::DatasetFactory f;
  f.name = name;
  f.description = "test plugin: never loads";
  f.shape = {1, 4, 4, 2, ""};
  f.load = [name](const dp::DatasetOptions&, const std::string&) -> dp::DatasetPair {
    DP_THROW("test plugin dataset " + name + " is not meant to load");
  };
  return f;
}

std::vector<dp::DatasetFactory> datasets() { return {named("cifar10"), named("not-builtin")}; }

}  // namespace

DPRUN_DATASET_PLUGIN(datasets)
