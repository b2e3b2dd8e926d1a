#pragma once
// Datasets: MNIST-format IDX files (Fashion-MNIST, MNIST), CIFAR-10's binary batches and
// safetensors files of images and labels ("arrays"), gzipped or not, kept as bytes on the host
// and uploaded once to each device. Each is a dp::DatasetFactory (dp/plugin.hpp), as the
// datasets of plugins are.
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

/// The datasets whose files dprun knows by name: "cifar10", "fashion-mnist" and "mnist" (every
/// dataset, "arrays" and those of plugins too, is a dp::DatasetFactory: dp::builtin_datasets()).
const std::vector<std::string>& known_datasets();

/// The folder that holds every one of `files` (names relative to it; each may also be found
/// with ".gz" appended) for a dataset named `dataset`, searched as resolve_dataset_directory
/// searches: `path` then `path`/<dataset> when a path is given, else $DPRUN_DATA/<dataset>,
/// $DPRUN_DATA, /usr/share/datasets/<dataset>. Throws dp::Error listing every place tried and
/// what was missing there. For plugins: their datasets are found where dprun's are.
std::string find_dataset_folder(const std::string& dataset, const std::vector<std::string>& files,
                                const std::string& path);

/// The directory to read `dataset` from: `path` or `path`/<dataset> when a path is given, else
/// $DPRUN_DATA/<dataset> or $DPRUN_DATA itself, else /usr/share/datasets/<dataset>. For cifar10
/// each of those folders that exists is also looked into for cifar-10-batches-bin, the folder
/// the official archive unpacks to. Throws dp::Error listing every place tried, and what was
/// missing there, when none holds all of the dataset's files.
std::string resolve_dataset_directory(const std::string& dataset, const std::string& path);

/// Loads the train and test splits of a built-in dataset with its default options (for "arrays":
/// train.safetensors and test.safetensors; see read_arrays). MNIST and Fashion-MNIST: train-images-idx3-ubyte,
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

/// How the images tensor of an arrays file is laid out.
enum class ArraysLayout {
  automatic,  // the file's metadata "layout", else the shape when only one reading fits
  nchw,       // N x C x H x W
  nhwc,       // N x H x W x C (numpy / PIL order); transposed to NCHW on reading
};
/// "auto", "nchw", "nhwc"; and back (std::nullopt-free: throws dp::Error on another text).
const char* arrays_layout_name(ArraysLayout layout);
ArraysLayout parse_arrays_layout(const std::string& text);

/// Reads one split of the "arrays" format: a safetensors file (gzipped or not) holding
///   images: U8, N x H x W (one channel), N x C x H x W or N x H x W x C;
///   labels: U8, I16, U16, I32 or I64, N values, each in [0, classes).
/// Other tensors are ignored. The layout of a 4-D images tensor: `layout` when it is nchw or
/// nhwc; under automatic, the file's __metadata__ "layout" ("nchw" or "nhwc"), else the shape
/// when exactly one of dimensions 1 and 3 can be a channel count (at most 4) -- N x 3 x 32 x 32
/// is NCHW, N x 32 x 32 x 3 NHWC -- and an error asking for the layout when both or neither
/// can (N x 3 x 4 x 4). A metadata layout that contradicts `layout` is an error.
/// `classes` > 0: the labels must be below it. 0: the file's __metadata__ "classes" when it has
/// one, else max label + 1 (the caller makes both splits agree: load_arrays). Errors name the
/// file, the tensor, the byte offset where it matters (a label out of range) and what was
/// expected: a missing tensor, a wrong dtype or rank, counts that differ, an empty images
/// tensor, a truncated or damaged file.
Dataset read_arrays(const std::string& file, const std::string& name, ArraysLayout layout,
                    int classes);

/// The "arrays" dataset: read_arrays of the train and test files, found in `path` (or by the
/// usual search, as dataset "arrays", for names that are not absolute). With classes 0 both
/// splits take the larger of their classes (so a test split missing the last class still
/// agrees), unless their metadata says different numbers (an error).
DatasetPair load_arrays(const std::string& train_file, const std::string& test_file,
                        const std::string& path, ArraysLayout layout, int classes);

/// The whole content of a file, gunzipped when it is gzip (detected by magic bytes, not name).
std::vector<uint8_t> read_maybe_gzip(const std::string& file);

}  // namespace dp
