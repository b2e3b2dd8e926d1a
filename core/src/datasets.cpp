// The datasets dprun provides, as factories of the same type as a plugin's (dp/plugin.hpp), and
// the checks every loaded dataset passes before a trainer sees it, whoever wrote its reader.
// They are compiled in, not a plugin: the default dataset (fashion-mnist) must exist whatever
// plugin folders are found, and `dp::load_dataset` serves programs that load no plugins.
#include <algorithm>

#include "dp/error.hpp"
#include "dp/plugin.hpp"

namespace dp {

namespace {

DatasetFactory known_files(const std::string& name, const std::string& description,
                           DatasetShape shape) {
  DatasetFactory f;
  f.name = name;
  f.description = description;
  f.shape = std::move(shape);
  f.load = [name](const DatasetOptions&, const std::string& path) {
    return load_dataset(name, path);
  };
  return f;
}

DatasetFactory arrays() {
  DatasetFactory f;
  f.name = "arrays";
  f.description =
      "your own images and labels: two safetensors files of U8 images and integer labels "
      "(README: \"Your own data\")";
  f.shape = {0, 0, 0, 0,
             "the images' shape in the files (N x H x W: 1 channel; N x C x H x W or "
             "N x H x W x C: see layout); classes: the option, else the files' metadata, else "
             "the largest label + 1"};
  f.options = {
      {"train", std::string("train.safetensors"),
       "the training split's file, in the data folder (or an absolute path)"},
      {"test", std::string("test.safetensors"), "the test split's file"},
      {"layout", std::string("auto"),
       "\"nchw\", \"nhwc\" or \"auto\": the files' metadata \"layout\", else the shape if only "
       "one layout has at most 4 channels"},
      {"classes", int64_t{0},
       "the number of classes (labels must be below it); 0: the files' metadata \"classes\", "
       "else the largest label + 1"},
  };
  f.load = [](const DatasetOptions& o, const std::string& path) {
    const int64_t classes = std::get<int64_t>(o.at("classes"));
    if (classes < 0 || classes > 256)
      DP_THROW("dataset arrays: option classes = " + std::to_string(classes) +
               ", expected 0 (from the files) or 1..256");
    return load_arrays(std::get<std::string>(o.at("train")), std::get<std::string>(o.at("test")),
                       path, parse_arrays_layout(std::get<std::string>(o.at("layout"))),
                       static_cast<int>(classes));
  };
  return f;
}

std::string dims(int c, int h, int w) {
  return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
}

// What is wrong with one split on its own ("" when nothing).
std::string split_problem(const Dataset& d) {
  if (d.count <= 0) return "no examples";
  if (d.channels < 1 || d.height < 1 || d.width < 1 || d.channels > 65536 || d.height > 65536 ||
      d.width > 65536)
    return "examples of " + dims(d.channels, d.height, d.width) +
           ", expected each dimension in 1..65536";
  if (d.classes < 1 || d.classes > 256)
    return std::to_string(d.classes) + " classes, expected 1..256 (labels are bytes)";
  const auto expected = static_cast<uint64_t>(d.count) * static_cast<uint64_t>(d.example_bytes());
  if (d.images.size() != expected)
    return std::to_string(d.images.size()) + " image bytes, expected " + std::to_string(expected) +
           " (" + std::to_string(d.count) + " examples of " + dims(d.channels, d.height, d.width) +
           ")";
  if (d.labels.size() != static_cast<size_t>(d.count))
    return std::to_string(d.labels.size()) + " labels for " + std::to_string(d.count) + " examples";
  for (size_t i = 0; i < d.labels.size(); ++i)
    if (d.labels[i] >= d.classes)
      return "label " + std::to_string(d.labels[i]) + " of example " + std::to_string(i) +
             ", expected 0.." + std::to_string(d.classes - 1);
  return "";
}

// A declared field that the loaded data contradicts ("" when none).
std::string shape_problem(const DatasetShape& s, const Dataset& d) {
  auto off = [](int declared, int got) { return declared != 0 && declared != got; };
  if (off(s.channels, d.channels) || off(s.height, d.height) || off(s.width, d.width) ||
      off(s.classes, d.classes))
    return "it declares " + shape_text(s) + " but loaded " + dims(d.channels, d.height, d.width) +
           ", " + std::to_string(d.classes) + " classes";
  return "";
}

}  // namespace

std::string shape_text(const DatasetShape& s) {
  if (s.channels == 0 && s.height == 0 && s.width == 0 && s.classes == 0 && !s.note.empty())
    return s.note;
  auto field = [](int v) { return v > 0 ? std::to_string(v) : std::string("?"); };
  std::string out = field(s.channels) + "x" + field(s.height) + "x" + field(s.width) + ", " +
                    field(s.classes) + " classes";
  if (!s.note.empty()) out += " (" + s.note + ")";
  return out;
}

const std::vector<DatasetFactory>& builtin_datasets() {
  static const std::vector<DatasetFactory> table = {
      arrays(),
      known_files("cifar10",
                  "CIFAR-10: 32x32 colour images of 10 classes, 50000 train and 10000 test, "
                  "the official binary batches",
                  {3, 32, 32, 10, ""}),
      known_files("fashion-mnist",
                  "Fashion-MNIST: 28x28 greyscale images of clothing, 60000 train and 10000 "
                  "test, the four IDX files",
                  {1, 28, 28, 10, ""}),
      known_files("mnist",
                  "MNIST: 28x28 greyscale handwritten digits, 60000 train and 10000 test, the "
                  "four IDX files",
                  {1, 28, 28, 10, ""}),
  };
  return table;
}

const DatasetFactory* find_builtin_dataset(const std::string& name) {
  for (const auto& f : builtin_datasets())
    if (f.name == name) return &f;
  return nullptr;
}

DatasetPair load_checked(const DatasetFactory& factory, const DatasetOptions& options,
                         const std::string& path) {
  const DatasetOptions resolved = resolve_dataset_options(factory, options);
  if (!factory.load) DP_THROW("dataset " + factory.name + " has no load function");
  DatasetPair pair;
  try {
    pair = factory.load(resolved, path);
  } catch (const Error&) {
    throw;  // dprun's own readers and plugins that use dp::Error already say where
  } catch (const std::exception& e) {
    DP_THROW("dataset " + factory.name + ": loading failed: " + e.what());
  }
  for (const Dataset* d : {&pair.train, &pair.test}) {
    const char* split = d == &pair.train ? "train" : "test";
    if (std::string why = split_problem(*d); !why.empty())
      DP_THROW("dataset " + factory.name + ": the " + split + " split has " + why);
    if (std::string why = shape_problem(factory.shape, *d); !why.empty())
      DP_THROW("dataset " + factory.name + ": " + why + " (" + split + " split)");
  }
  const Dataset &a = pair.train, &b = pair.test;
  if (a.channels != b.channels || a.height != b.height || a.width != b.width ||
      a.classes != b.classes)
    DP_THROW("dataset " + factory.name + ": the train split is " +
             dims(a.channels, a.height, a.width) + " with " + std::to_string(a.classes) +
             " classes, the test split " + dims(b.channels, b.height, b.width) + " with " +
             std::to_string(b.classes) + ": expected the same");
  return pair;
}

}  // namespace dp
