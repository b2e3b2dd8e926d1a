// Datasets: which files each known dataset has and where they are found; IDX (MNIST-format)
// files: gunzipping, and checking every header field and size before trusting a byte, since a
// truncated download is the usual failure. CIFAR-10's reader is data_cifar10.cpp.
#include "dp/data.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "data_files.hpp"
#include "dp/error.hpp"
#include "dp/plugin.hpp"
#include "dp/random.hpp"

namespace dp {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dimension
constexpr size_t kImagesHeader = 16;     // magic, count, rows, cols
constexpr size_t kLabelsHeader = 8;      // magic, count

enum class Format { idx, cifar10 };

// One known dataset: its files and what the "not found" error tells the user.
struct DatasetFiles {
  std::string name;
  Format format;
  std::vector<std::string> stems;  // every file, without the optional ".gz"; train split first
  size_t train_files;              // how many of `stems` are the train split
  std::string archive_folder;      // the folder its official archive unpacks to ("" none)
  std::string what;                // "the four IDX files", for "set DPRUN_DATA to a folder..."
};

// The table, in the order `known_datasets` lists the names. Built on first use: the settings
// table may ask for the names while other translation units are still being initialised.
const std::vector<DatasetFiles>& dataset_table() {
  static const std::vector<DatasetFiles> table = [] {
    const std::vector<std::string> idx = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    return std::vector<DatasetFiles>{
        {"cifar10",
         Format::cifar10,
         {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
          "data_batch_5.bin", "test_batch.bin"},
         5,
         "cifar-10-batches-bin",
         "the six CIFAR-10 binary batches"},
        {"fashion-mnist", Format::idx, idx, 2, "", "the four IDX files"},
        {"mnist", Format::idx, idx, 2, "", "the four IDX files"},
    };
  }();
  return table;
}

const DatasetFiles* find_dataset(const std::string& name) {
  for (const auto& d : dataset_table())
    if (d.name == name) return &d;
  return nullptr;
}

uint32_t read_be32(const std::vector<uint8_t>& bytes, size_t offset) {
  return (uint32_t{bytes[offset]} << 24) | (uint32_t{bytes[offset + 1]} << 16) |
         (uint32_t{bytes[offset + 2]} << 8) | uint32_t{bytes[offset + 3]};
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

bool starts_with_gzip_magic(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  return in.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

std::vector<uint8_t> read_plain(const std::string& file) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) DP_THROW(file + ": cannot open: " + std::strerror(errno));
  const auto size = static_cast<std::streamoff>(in.tellg());
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  if (in.gcount() != size)
    DP_THROW(file + ": read error after " + std::to_string(in.gcount()) + " of " +
             std::to_string(size) + " bytes");
  return bytes;
}

// The gzip trailer holds the uncompressed size modulo 2^32: a good first capacity, never
// trusted as the real size (concatenated members or a damaged trailer would lie).
size_t gzip_size_hint(const std::string& file) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() < 18) return 0;
  in.seekg(-4, std::ios::end);
  unsigned char t[4];
  in.read(reinterpret_cast<char*>(t), 4);
  if (in.gcount() != 4) return 0;
  return size_t{t[0]} | (size_t{t[1]} << 8) | (size_t{t[2]} << 16) | (size_t{t[3]} << 24);
}

std::vector<uint8_t> read_gzip(const std::string& file) {
  std::vector<uint8_t> bytes;
  bytes.reserve(gzip_size_hint(file));
  gzFile gz = gzopen(file.c_str(), "rb");
  if (!gz) DP_THROW(file + ": cannot open: " + std::strerror(errno));
  gzbuffer(gz, 1 << 20);
  constexpr size_t kChunk = 1 << 20;
  size_t used = 0;
  for (;;) {
    if (bytes.size() < used + kChunk) bytes.resize(used + kChunk);
    const int n = gzread(gz, bytes.data() + used, static_cast<unsigned>(kChunk));
    if (n < 0) {
      int code = 0;
      std::string why = gzerror(gz, &code);
      gzclose(gz);
      DP_THROW(file + ": corrupt or truncated gzip data after " + std::to_string(used) +
               " uncompressed bytes (" + why + "): download the file again");
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  // gzread returns 0 both at a clean end and at a truncated stream; gzerror tells them apart.
  int code = 0;
  std::string why = gzerror(gz, &code);
  gzclose(gz);
  if (code != Z_OK) {
    DP_THROW(file + ": corrupt or truncated gzip data after " + std::to_string(used) +
             " uncompressed bytes (" + why + "): download the file again");
  }
  bytes.resize(used);
  return bytes;
}

std::string magic_problem(uint32_t found, uint32_t expected, const char* expected_kind) {
  std::string m = "magic number " + std::to_string(found) + " (" + hex32(found) + "), expected " +
                  std::to_string(expected) + " (" + hex32(expected) + ") for an IDX " +
                  expected_kind + " file";
  if (found == kImagesMagic) m += "; this is an images file";
  if (found == kLabelsMagic) m += "; this is a labels file";
  return m;
}

// Where a dataset's files are, by stem: "<dir>/<stem>" or "<dir>/<stem>.gz" ("" if neither).
// The uncompressed file wins when both exist (no inflate needed); content decides how it is
// read either way.
std::string find_file(const std::string& dir, const std::string& stem) {
  const fs::path plain = fs::path(dir) / stem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  if (fs::is_regular_file(plain)) return plain.string();
  if (fs::is_regular_file(gz)) return gz.string();
  return "";
}

// The stems missing from `dir` (empty when it holds all of them).
std::vector<std::string> missing_files(const std::string& dir,
                                       const std::vector<std::string>& stems) {
  std::vector<std::string> missing;
  for (const auto& stem : stems) {
    if (find_file(dir, stem).empty()) missing.push_back(stem);
  }
  return missing;
}

}  // namespace

namespace detail {

FileBytes read_file_bytes(const std::string& file, const char* expected) {
  if (!fs::exists(file)) DP_THROW(file + ": no such file");
  if (fs::is_directory(file)) DP_THROW(file + ": is a folder, expected " + expected);
  FileBytes out;
  out.gzip = starts_with_gzip_magic(file);
  out.bytes = out.gzip ? read_gzip(file) : read_plain(file);
  return out;
}

std::string size_note(const FileBytes& f) {
  return std::to_string(f.bytes.size()) + " bytes" + (f.gzip ? " after gunzip" : "");
}

}  // namespace detail

using detail::FileBytes;
using detail::read_file_bytes;
using detail::size_note;

Dataset Dataset::select(const std::vector<int64_t>& indices, const std::string& new_name) const {
  Dataset out;
  out.name = new_name;
  out.count = static_cast<int64_t>(indices.size());
  out.channels = channels;
  out.height = height;
  out.width = width;
  out.classes = classes;
  const auto bytes = static_cast<size_t>(example_bytes());
  out.images.reserve(indices.size() * bytes);
  out.labels.reserve(indices.size());
  for (const int64_t i : indices) {
    DP_CHECK(i >= 0 && i < count, name + ": no example " + std::to_string(i) + " among " +
                                      std::to_string(count));
    const auto at = images.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(i) * bytes);
    out.images.insert(out.images.end(), at, at + static_cast<std::ptrdiff_t>(bytes));
    out.labels.push_back(labels[static_cast<size_t>(i)]);
  }
  return out;
}

Dataset hold_out(Dataset& train, int64_t count, uint64_t seed) {
  DP_CHECK(count > 0 && count < train.count,
           train.name + ": cannot hold out " + std::to_string(count) + " of " +
               std::to_string(train.count) + " examples for validation (leave some to train on)");
  // Its own stream: the split must not move when the trial's seed (init, shuffles) changes.
  Rng rng = Rng(seed).fork(0x76616c6964ULL);  // "valid"
  const std::vector<int32_t> order = permutation(train.count, rng);
  std::vector<int64_t> held(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count));
  std::vector<bool> is_held(static_cast<size_t>(train.count), false);
  for (const int64_t i : held) is_held[static_cast<size_t>(i)] = true;
  std::vector<int64_t> kept;
  kept.reserve(static_cast<size_t>(train.count - count));
  for (int64_t i = 0; i < train.count; ++i)
    if (!is_held[static_cast<size_t>(i)]) kept.push_back(i);
  Dataset validation = train.select(held, train.name + ":validation");
  train = train.select(kept, train.name);
  return validation;
}

Dataset Dataset::head(int64_t n) const {
  DP_CHECK(n >= 0 && n <= count, name + ": cannot take the first " + std::to_string(n) +
                                     " examples of " + std::to_string(count));
  Dataset out;
  out.name = name;
  out.count = n;
  out.channels = channels;
  out.height = height;
  out.width = width;
  out.classes = classes;
  const auto image_bytes = static_cast<size_t>(n * example_bytes());
  out.images.assign(images.begin(), images.begin() + static_cast<std::ptrdiff_t>(image_bytes));
  out.labels.assign(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

const std::vector<std::string>& known_datasets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& d : dataset_table()) out.push_back(d.name);
    return out;
  }();
  return names;
}

std::vector<uint8_t> read_maybe_gzip(const std::string& file) {
  return read_file_bytes(file).bytes;
}

Dataset read_idx(const std::string& images_file, const std::string& labels_file,
                 const std::string& name, int classes) {
  DP_CHECK(classes > 0 && classes <= 256,
           name + ": classes must be in 1..256 for byte labels, got " + std::to_string(classes));
  FileBytes images = read_file_bytes(images_file);
  FileBytes labels = read_file_bytes(labels_file);

  // The magic first: a labels file given as images is "a labels file", not "too short".
  if (images.bytes.size() >= 4 && read_be32(images.bytes, 0) != kImagesMagic) {
    DP_THROW(images_file + ": " +
             magic_problem(read_be32(images.bytes, 0), kImagesMagic, "images"));
  }
  if (images.bytes.size() < kImagesHeader) {
    DP_THROW(images_file + ": too short for an IDX images file: " + size_note(images) +
             ", the header alone is 16 bytes");
  }
  const uint64_t count = read_be32(images.bytes, 4);
  const uint32_t rows = read_be32(images.bytes, 8);
  const uint32_t cols = read_be32(images.bytes, 12);
  if (rows == 0 || cols == 0 || rows > 65536 || cols > 65536) {
    DP_THROW(images_file + ": header says images of " + std::to_string(rows) + "x" +
             std::to_string(cols) + ", expected rows and columns in 1..65536");
  }
  const uint64_t expected_images = kImagesHeader + count * rows * cols;
  if (images.bytes.size() != expected_images) {
    const bool short_file = images.bytes.size() < expected_images;
    DP_THROW(images_file + ": " + (short_file ? "truncated" : "trailing bytes") + ": header says " +
             std::to_string(count) + " images of " + std::to_string(rows) + "x" +
             std::to_string(cols) + " (" + std::to_string(expected_images) + " bytes), file has " +
             size_note(images) + (short_file ? ": download the file again" : ""));
  }

  if (labels.bytes.size() >= 4 && read_be32(labels.bytes, 0) != kLabelsMagic) {
    DP_THROW(labels_file + ": " +
             magic_problem(read_be32(labels.bytes, 0), kLabelsMagic, "labels"));
  }
  if (labels.bytes.size() < kLabelsHeader) {
    DP_THROW(labels_file + ": too short for an IDX labels file: " + size_note(labels) +
             ", the header alone is 8 bytes");
  }
  const uint64_t label_count = read_be32(labels.bytes, 4);
  const uint64_t expected_labels = kLabelsHeader + label_count;
  if (labels.bytes.size() != expected_labels) {
    const bool short_file = labels.bytes.size() < expected_labels;
    DP_THROW(labels_file + ": " + (short_file ? "truncated" : "trailing bytes") + ": header says " +
             std::to_string(label_count) + " labels (" + std::to_string(expected_labels) +
             " bytes), file has " + size_note(labels) +
             (short_file ? ": download the file again" : ""));
  }
  if (label_count != count) {
    DP_THROW(images_file + " has " + std::to_string(count) + " images but " + labels_file +
             " has " + std::to_string(label_count) +
             " labels: expected the same count (are "
             "they from the same split?)");
  }
  for (size_t i = kLabelsHeader; i < labels.bytes.size(); ++i) {
    if (labels.bytes[i] >= classes) {
      DP_THROW(labels_file + ": label " + std::to_string(labels.bytes[i]) + " of example " +
               std::to_string(i - kLabelsHeader) + " is out of range: expected 0.." +
               std::to_string(classes - 1) + " (" + std::to_string(classes) + " classes)");
    }
  }

  Dataset out;
  out.name = name;
  out.count = static_cast<int64_t>(count);
  out.channels = 1;
  out.height = static_cast<int>(rows);
  out.width = static_cast<int>(cols);
  out.classes = classes;
  // Dropping the header in place: one memmove instead of a second 47 MB buffer.
  images.bytes.erase(images.bytes.begin(),
                     images.bytes.begin() + static_cast<std::ptrdiff_t>(kImagesHeader));
  labels.bytes.erase(labels.bytes.begin(),
                     labels.bytes.begin() + static_cast<std::ptrdiff_t>(kLabelsHeader));
  out.images = std::move(images.bytes);
  out.labels = std::move(labels.bytes);
  return out;
}

namespace {

// The folder that holds every file of `spec` (see resolve_dataset_directory).
// long function: the places, the checks of each and the message that lists them, in order.
std::string resolve_folder(const DatasetFiles* spec, const std::string& path) {
  const std::string& dataset = spec->name;

  // (folder, why it was tried). An explicit path is the user's choice: it is never silently
  // replaced by $DPRUN_DATA or the default. Under $DPRUN_DATA the per-dataset subfolder comes
  // first because MNIST and Fashion-MNIST use the same file names: a DPRUN_DATA holding both
  // in subfolders must not hand the wrong one out.
  std::vector<std::pair<std::string, std::string>> places;
  const char* env = std::getenv("DPRUN_DATA");
  const bool have_env = env != nullptr && *env != '\0';
  if (!path.empty()) {
    places.push_back({path, "given path"});
    places.push_back({(fs::path(path) / dataset).string(), "given path/<dataset>"});
  } else {
    if (have_env) {
      places.push_back({(fs::path(env) / dataset).string(), "$DPRUN_DATA/<dataset>"});
      places.push_back({env, "$DPRUN_DATA"});
    }
    places.push_back({"/usr/share/datasets/" + dataset, "default"});
  }

  std::string tried;
  // Whether `dir` holds every file; notes it in `tried` when not.
  auto holds_all = [&](const std::string& dir, const std::string& why) {
    std::string state;
    if (!fs::is_directory(dir)) {
      state = "no such folder";
    } else {
      const auto missing = missing_files(dir, spec->stems);
      if (missing.empty()) return true;
      state = "missing";
      for (const auto& m : missing) state += " " + m + "[.gz]";
    }
    tried += "\n  " + dir + " (" + why + "): " + state;
    return false;
  };
  for (const auto& [dir, why] : places) {
    if (holds_all(dir, why)) return dir;
    // The official archive unpacks to a folder of its own: looked into wherever it may have
    // been unpacked (only inside folders that exist, so the list stays short).
    if (!spec->archive_folder.empty() && fs::is_directory(dir)) {
      const std::string unpacked = (fs::path(dir) / spec->archive_folder).string();
      if (holds_all(unpacked, why + ", unpacked archive")) return unpacked;
    }
  }

  std::string looked_for;
  for (size_t i = 0; i < spec->stems.size(); ++i) {
    looked_for += (i == 0                        ? ""
                   : i + 1 == spec->stems.size() ? " and "
                                                 : ", ") +
                  spec->stems[i] + "[.gz]";
  }
  std::string fix = path.empty()
                        ? "set DPRUN_DATA to a folder holding " + spec->what
                        : "fix the data path, or leave it empty to use $DPRUN_DATA or the default";
  if (dataset == "arrays") fix += "; or name the files with [data.arrays] train = and test =";
  if (dataset == "fashion-mnist") {
    fix += "; `apt install dataset-fashion-mnist` installs them in /usr/share/datasets/" + dataset;
  }
  if (dataset == "cifar10") {
    // Unpacked where it will be looked for: the given path, else $DPRUN_DATA, else the default.
    const std::string into = !path.empty() ? path
                             : have_env    ? std::string(env)
                                           : "/usr/share/datasets/" + dataset;
    fix +=
        "; download the binary version and unpack it where dprun looks: curl -LO "
        "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz && mkdir -p " +
        into + " && tar xzf cifar-10-binary.tar.gz -C " + into + " (it unpacks to " +
        spec->archive_folder + "/, which is looked in)";
  }
  DP_THROW("dataset " + dataset + " not found; looked for " + looked_for + " in:" + tried + "\n" +
           fix);
}

}  // namespace

std::string resolve_dataset_directory(const std::string& dataset, const std::string& path) {
  const DatasetFiles* spec = find_dataset(dataset);
  if (spec == nullptr) {
    std::string list;
    for (const auto& k : known_datasets()) list += (list.empty() ? "" : ", ") + k;
    DP_THROW("unknown dataset \"" + dataset + "\": known datasets are " + list);
  }
  return resolve_folder(spec, path);
}

std::string find_dataset_folder(const std::string& dataset, const std::vector<std::string>& files,
                                const std::string& path) {
  DP_CHECK(!files.empty(), "find_dataset_folder(" + dataset + "): no files to look for");
  DatasetFiles spec{dataset, Format::idx, files, files.size(), "", ""};
  for (size_t i = 0; i < files.size(); ++i)
    spec.what += (i == 0 ? "" : i + 1 == files.size() ? " and " : ", ") + files[i];
  return resolve_folder(&spec, path);
}

DatasetPair load_dataset(const std::string& dataset, const std::string& path) {
  // A built-in dataset that is not a set of known files ("arrays"), with its default options.
  if (find_dataset(dataset) == nullptr) {
    if (const DatasetFactory* f = find_builtin_dataset(dataset)) return load_checked(*f, {}, path);
  }
  DatasetPair out;
  out.directory = resolve_dataset_directory(dataset, path);
  const DatasetFiles& spec = *find_dataset(dataset);
  std::vector<std::string> files;
  for (const auto& stem : spec.stems) {
    files.push_back(find_file(out.directory, stem));
    // Only possible when a file vanished since resolve_dataset_directory looked.
    if (files.back().empty()) {
      DP_THROW((fs::path(out.directory) / stem).string() + "[.gz]: no such file");
    }
  }
  const std::vector<std::string> train_files(
      files.begin(), files.begin() + static_cast<std::ptrdiff_t>(spec.train_files));
  const std::vector<std::string> test_files(
      files.begin() + static_cast<std::ptrdiff_t>(spec.train_files), files.end());
  auto read_split = [&](const std::vector<std::string>& split, const std::string& name) {
    if (spec.format == Format::cifar10) return read_cifar10(split, name);
    DP_ASSERT(split.size() == 2);  // images, labels
    return read_idx(split[0], split[1], name);
  };
  // The training split dominates (60000 images to inflate); the test split is read on a second
  // thread meanwhile. A std::async future waits in its destructor, so an exception from the
  // training split never leaves that thread running.
  auto test =
      std::async(std::launch::async, [&] { return read_split(test_files, dataset + "/test"); });
  out.train = read_split(train_files, dataset + "/train");
  out.test = test.get();
  return out;
}

}  // namespace dp
