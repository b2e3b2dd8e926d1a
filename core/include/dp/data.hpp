#pragma once
// Datasets: MNIST-format IDX files (Fashion-MNIST, MNIST), gzipped or not, kept as bytes on
// the host and uploaded once to each device.
#include <cstdint>
#include <string>
#include <vector>

namespace dp {

struct Dataset {
  std::string name;  // "fashion-mnist/train"
  int64_t count = 0;
  int channels = 1, height = 28, width = 28;
  int classes = 10;
  std::vector<uint8_t> images;  // count * channels * height * width, example-major, NCHW
  std::vector<uint8_t> labels;  // count, each in [0, classes)

  int64_t example_bytes() const { return int64_t{channels} * height * width; }
  /// The first n examples (n <= count), for quick runs and tests.
  Dataset head(int64_t n) const;
  /// The examples at `indices`, in that order (each in [0, count)); name is the new set's.
  Dataset select(const std::vector<int64_t>& indices, const std::string& new_name) const;
};

/// A validation split: `count` examples of `train` (0 < count < train.count), chosen by `seed`
/// alone (the same examples for every trial that asks for the same count and seed, whatever its
/// other settings), held out in the order they were drawn. `train` keeps the rest, in their
/// order; the held-out set is returned, named "<train's name>:validation".
Dataset hold_out(Dataset& train, int64_t count, uint64_t seed);

struct DatasetPair {
  Dataset train, test;
  std::string directory;  // where the files were found
};

/// Known datasets: "fashion-mnist" and "mnist".
const std::vector<std::string>& known_datasets();

/// The directory to read `dataset` from: `path` when given, else $DPRUN_DATA (itself, or
/// $DPRUN_DATA/<dataset> when that holds the files), else /usr/share/datasets/<dataset>.
/// Throws dp::Error listing every place tried when none holds the files.
std::string resolve_dataset_directory(const std::string& dataset, const std::string& path);

/// Loads train and test splits from train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
/// t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz].
DatasetPair load_dataset(const std::string& dataset, const std::string& path = "");

/// Reads one images file and its labels file. Checks magic numbers (2051 images, 2049 labels),
/// dimensions, that the counts agree, label range and exact file sizes; errors name the file.
Dataset read_idx(const std::string& images_file, const std::string& labels_file,
                 const std::string& name, int classes = 10);

/// The whole content of a file, gunzipped when it is gzip (detected by magic bytes, not name).
std::vector<uint8_t> read_maybe_gzip(const std::string& file);

}  // namespace dp
