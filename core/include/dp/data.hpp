#pragma once
// Datasets: MNIST-format IDX files (Fashion-MNIST, MNIST) and CIFAR-10's binary batches, gzipped
// or not, kept as bytes on the host and uploaded once to each device.
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

/// Known datasets: "cifar10", "fashion-mnist" and "mnist".
const std::vector<std::string>& known_datasets();

/// The directory to read `dataset` from: `path` or `path`/<dataset> when a path is given, else
/// $DPRUN_DATA/<dataset> or $DPRUN_DATA itself, else /usr/share/datasets/<dataset>. For cifar10
/// each of those folders that exists is also looked into for cifar-10-batches-bin, the folder
/// the official archive unpacks to. Throws dp::Error listing every place tried, and what was
/// missing there, when none holds all of the dataset's files.
std::string resolve_dataset_directory(const std::string& dataset, const std::string& path);

/// Loads the train and test splits. MNIST and Fashion-MNIST: train-images-idx3-ubyte,
/// train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte. CIFAR-10:
/// data_batch_1.bin ... data_batch_5.bin (train) and test_batch.bin. Each file may be gzipped
/// (then also found with ".gz" appended to its name).
DatasetPair load_dataset(const std::string& dataset, const std::string& path = "");

/// Reads one images file and its labels file. Checks magic numbers (2051 images, 2049 labels),
/// dimensions, that the counts agree, label range and exact file sizes; errors name the file.
Dataset read_idx(const std::string& images_file, const std::string& labels_file,
                 const std::string& name, int classes = 10);

/// Reads CIFAR-10 binary batches, concatenated in the order given: each file a sequence of
/// 3073-byte records, a label byte in 0..9 then a 32x32 image as 1024 red, 1024 green and 1024
/// blue bytes, row-major (so each example is already CHW). Any number of records per file (the
/// official batches hold 10000). Errors name the file and, for a bad record, its index and byte
/// offset: a missing or empty file, a size that is not a whole number of records, a label out
/// of range. Gzipped files are read too (detected by their magic bytes).
/// -> Dataset of count records, channels 3, height 32, width 32, classes 10, named `name`.
Dataset read_cifar10(const std::vector<std::string>& files, const std::string& name);

/// The whole content of a file, gunzipped when it is gzip (detected by magic bytes, not name).
std::vector<uint8_t> read_maybe_gzip(const std::string& file);

}  // namespace dp
