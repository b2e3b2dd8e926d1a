// An example dataset plugin: "stripes", greyscale images of horizontal, vertical or diagonal
// stripes (3 classes) under pixel noise, made from a seed, so it needs no files. Copy this file
// to read your own format: fill a dp::Dataset per split (NCHW bytes, one label byte per example)
// and return them from `load`; dprun checks what comes back against `shape` and itself.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dp/error.hpp"
#include "dp/plugin.hpp"

namespace {

dp::Dataset make_split(const std::string& name, int64_t count, int size, double noise,
                       uint64_t seed) {
  dp::Dataset d;
  d.name = name;
  d.count = count;
  d.channels = 1;
  d.height = d.width = size;
  d.classes = 3;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  d.images.reserve(static_cast<size_t>(count) * static_cast<size_t>(size * size));
  for (int64_t n = 0; n < count; ++n) {
    const auto label = static_cast<uint8_t>(rng() % 3);
    const int period = 2 + static_cast<int>(rng() % 3), phase = static_cast<int>(rng() % 4);
    for (int y = 0; y < size; ++y) {
      for (int x = 0; x < size; ++x) {
        const int along = label == 0 ? y : label == 1 ? x : x + y;
        double v = ((along + phase) / period) % 2 == 0 ? 0.9 : 0.1;
        if (unit(rng) < noise) v = unit(rng);
        d.images.push_back(static_cast<uint8_t>(v * 255.0));
      }
    }
    d.labels.push_back(label);
  }
  return d;
}

std::vector<dp::DatasetFactory> datasets() {
  dp::DatasetFactory stripes;
  stripes.name = "stripes";
  stripes.description = "example plugin: horizontal, vertical or diagonal stripes under noise";
  stripes.shape = {1, 0, 0, 3, "size x size from the option size"};
  stripes.options = {
      {"train_count", int64_t{1200}, "training examples"},
      {"test_count", int64_t{300}, "test examples"},
      {"size", int64_t{16}, "image side in pixels (LeNet needs at least 14)"},
      {"noise", 0.2, "fraction of pixels replaced by noise"},
      {"seed", int64_t{1}, "the data's seed (the trial's seed shuffles; this makes the images)"},
  };
  // `path` ([data] path) is unused: the data is made, not read. A reader of files would find
  // them with dp::find_dataset_folder("stripes", {"train.csv", "test.csv"}, path).
  stripes.load = [](const dp::DatasetOptions& o, const std::string& path) {
    const int64_t size = std::get<int64_t>(o.at("size"));
    if (size < 1 || size > 1024)
      DP_THROW("stripes: option size = " + std::to_string(size) + ", expected 1..1024");
    const auto seed = static_cast<uint64_t>(std::get<int64_t>(o.at("seed")));
    const double noise = std::get<double>(o.at("noise"));
    dp::DatasetPair pair;
    pair.train = make_split("stripes/train", std::get<int64_t>(o.at("train_count")),
                            static_cast<int>(size), noise, seed);
    pair.test = make_split("stripes/test", std::get<int64_t>(o.at("test_count")),
                           static_cast<int>(size), noise, seed + 1000003);
    pair.directory = "(made by the plugin)";
    return pair;
  };
  return {stripes};
}

}  // namespace

DPRUN_DATASET_PLUGIN(datasets)
