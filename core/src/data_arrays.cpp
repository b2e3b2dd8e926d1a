// The "arrays" dataset: safetensors files of a U8 images tensor and an integer labels tensor,
// the format anyone can write from numpy in a few lines. The shape decides little on its own
// (N x 3 x 4 x 4 could be either layout), so every guess is one that only one reading allows,
// and what cannot be decided is an error that says how to decide it.
#include <algorithm>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data_files.hpp"
#include "dp/data.hpp"
#include "dp/error.hpp"
#include "dp/safetensors.hpp"

namespace dp {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxChannels = 4;  // grey, grey+alpha, RGB, RGBA: what a channel count can be

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafeTensor& tensor(SafeTensorsFile& f, const std::string& file, const char* name,
                   const char* expected) {
  auto it = f.tensors.find(name);
  if (it != f.tensors.end()) return it->second;
  std::string have;
  for (const auto& [n, t] : f.tensors) have += (have.empty() ? "" : ", ") + n;
  DP_THROW(file + ": no tensor \"" + name + "\", expected " + expected +
           " (the file has: " + (have.empty() ? "no tensors" : have) + ")");
}

// The layout of a 4-D images tensor (see read_arrays in data.hpp for the rule).
ArraysLayout decide_layout(const std::string& file, const SafeTensorsFile& f,
                           const std::vector<int64_t>& shape, ArraysLayout asked) {
  auto meta = f.metadata.find("layout");
  if (meta != f.metadata.end()) {
    ArraysLayout said;
    try {
      said = parse_arrays_layout(meta->second);
    } catch (const Error&) {
      DP_THROW(file + ": __metadata__ layout \"" + meta->second +
               "\", expected \"nchw\" or \"nhwc\"");
    }
    if (said == ArraysLayout::automatic)
      DP_THROW(file + ": __metadata__ layout \"auto\", expected \"nchw\" or \"nhwc\"");
    if (asked != ArraysLayout::automatic && asked != said)
      DP_THROW(file + ": option layout = \"" + arrays_layout_name(asked) +
               "\" but the file's __metadata__ says \"" + meta->second +
               "\": one of them is wrong (leave the option at \"auto\" to use the file's)");
    return said;
  }
  if (asked != ArraysLayout::automatic) return asked;
  const bool first = shape[1] <= kMaxChannels, last = shape[3] <= kMaxChannels;
  if (first != last) return first ? ArraysLayout::nchw : ArraysLayout::nhwc;
  DP_THROW(file + ": tensor images has shape " + shape_text(shape) + ", which could be " +
           (first ? "N x C x H x W or N x H x W x C (both dimensions 1 and 3 are at most 4)"
                  : "neither N x C x H x W nor N x H x W x C with at most 4 channels") +
           ": say which with [data.arrays] layout = \"nchw\" or \"nhwc\", or in the file's "
           "metadata (metadata={\"layout\": \"nhwc\"})");
}

// The images as example-major CHW bytes.
std::vector<uint8_t> to_nchw(std::vector<uint8_t> bytes, ArraysLayout layout, int64_t n, int c,
                             int h, int w) {
  if (layout == ArraysLayout::nchw || c == 1) return bytes;  // one channel: the same bytes
  std::vector<uint8_t> out(bytes.size());
  const auto plane = static_cast<size_t>(h) * static_cast<size_t>(w);
  const size_t example = plane * static_cast<size_t>(c);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* from = bytes.data() + static_cast<size_t>(i) * example;
    uint8_t* to = out.data() + static_cast<size_t>(i) * example;
    for (size_t p = 0; p < plane; ++p)
      for (int ch = 0; ch < c; ++ch) to[static_cast<size_t>(ch) * plane + p] = from[p * c + ch];
  }
  return out;
}

int classes_from_metadata(const std::string& file, const SafeTensorsFile& f) {
  auto it = f.metadata.find("classes");
  if (it == f.metadata.end()) return 0;
  int v = 0;
  size_t used = 0;
  try {
    v = std::stoi(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != it->second.size() || v < 1 || v > 256)
    DP_THROW(file + ": __metadata__ classes \"" + it->second +
             "\", expected an integer in 1..256 (as a string: metadata values are strings)");
  return v;
}

// The labels as bytes, each checked against the classes (the option's, else the metadata's,
// else the byte range); max_label: the largest.
std::vector<uint8_t> checked_labels(const std::string& file, const SafeTensor& labels, int classes,
                                    int from_meta, int& max_label) {
  const int limit = classes > 0 ? classes : from_meta > 0 ? from_meta : 256;
  const size_t width = labels.type == SafeTensor::Type::u8    ? 1
                       : labels.type == SafeTensor::Type::i64 ? 8
                       : labels.type == SafeTensor::Type::i32 ? 4
                                                              : 2;
  const auto n = static_cast<size_t>(labels.numel());
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = labels.type == SafeTensor::Type::u8 ? labels.u8[i] : labels.i64[i];
    if (v < 0 || v >= limit)
      DP_THROW(file + ": tensor labels: label " + std::to_string(v) + " of example " +
               std::to_string(i) + " (offset " + std::to_string(labels.file_offset + i * width) +
               ") is out of range: expected 0.." + std::to_string(limit - 1) +
               (classes > 0     ? " (option classes = " + std::to_string(classes) + ")"
                : from_meta > 0 ? " (__metadata__ classes = " + std::to_string(from_meta) + ")"
                                : " (labels are class numbers, at most 256 classes)"));
    out[i] = static_cast<uint8_t>(v);
    max_label = std::max(max_label, static_cast<int>(v));
  }
  return out;
}

}  // namespace

const char* arrays_layout_name(ArraysLayout layout) {
  switch (layout) {
    case ArraysLayout::nchw:
      return "nchw";
    case ArraysLayout::nhwc:
      return "nhwc";
    default:
      return "auto";
  }
}

ArraysLayout parse_arrays_layout(const std::string& text) {
  if (text == "auto") return ArraysLayout::automatic;
  if (text == "nchw") return ArraysLayout::nchw;
  if (text == "nhwc") return ArraysLayout::nhwc;
  DP_THROW("layout \"" + text + "\": expected \"auto\", \"nchw\" or \"nhwc\"");
}

namespace detail {

// read_arrays, also saying whether the classes came from the file's metadata.
Dataset read_arrays_split(const std::string& file, const std::string& name, ArraysLayout layout,
                          int classes, bool& classes_from_file) {
  // At most twice the file in memory: its bytes and the tensors decoded from them, then the
  // tensors alone (an NHWC file's images are transposed into a second copy after that).
  SafeTensorsFile f;
  {
    const FileBytes raw = read_file_bytes(file, "a safetensors file of images and labels");
    f = decode_safetensors(
        std::string_view(reinterpret_cast<const char*>(raw.bytes.data()), raw.bytes.size()), file);
  }
  SafeTensor& images =
      tensor(f, file, "images", "U8 images, N x H x W, N x C x H x W or N x H x W x C");
  const SafeTensor& labels = tensor(f, file, "labels", "integer labels, one per image");
  const std::string at_images =
      file + ": tensor images (offset " + std::to_string(images.file_offset) + ")";
  if (images.type != SafeTensor::Type::u8)
    DP_THROW(at_images + ": dtype " + safetensors_dtype(images.type) +
             ", expected U8 (pixel bytes 0..255; numpy: images.astype(np.uint8))");
  const auto& s = images.shape;
  if (s.size() != 3 && s.size() != 4)
    DP_THROW(at_images + ": shape " + shape_text(s) +
             ", expected N x H x W, N x C x H x W or N x H x W x C");
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] == 0 || (d > 0 && s[d] > 65536))
      DP_THROW(at_images + ": shape " + shape_text(s) +
               (s[d] == 0 ? ", expected at least one image of at least 1x1"
                          : ", expected dimensions up to 65536"));
  ArraysLayout decided = ArraysLayout::nchw;
  int c = 1, h = static_cast<int>(s[1]), w = static_cast<int>(s[2]);
  if (s.size() == 4) {
    decided = decide_layout(file, f, s, layout);
    const bool first = decided == ArraysLayout::nchw;
    c = static_cast<int>(first ? s[1] : s[3]);
    h = static_cast<int>(first ? s[2] : s[1]);
    w = static_cast<int>(first ? s[3] : s[2]);
    if (c > kMaxChannels)
      DP_THROW(at_images + ": shape " + shape_text(s) + " read as " + arrays_layout_name(decided) +
               " gives " + std::to_string(c) + " channels, expected at most " +
               std::to_string(kMaxChannels) + " (is the layout the other one?)");
  }
  const std::string at_labels =
      file + ": tensor labels (offset " + std::to_string(labels.file_offset) + ")";
  if (labels.type == SafeTensor::Type::f32)
    DP_THROW(at_labels +
             ": dtype F32, expected an integer dtype (U8, I16, U16, I32 or I64; "
             "numpy: labels.astype(np.int64))");
  if (labels.shape.size() != 1 || labels.shape[0] != s[0])
    DP_THROW(at_labels + ": shape " + shape_text(labels.shape) + ", expected [" +
             std::to_string(s[0]) + "]: one label per image (images has " + std::to_string(s[0]) +
             ")");
  const int from_meta = classes_from_metadata(file, f);
  if (classes > 0 && from_meta > 0 && classes != from_meta)
    DP_THROW(file + ": option classes = " + std::to_string(classes) +
             " but the file's __metadata__ says " + std::to_string(from_meta));
  int max_label = 0;
  std::vector<uint8_t> label_bytes = checked_labels(file, labels, classes, from_meta, max_label);
  Dataset out;
  out.name = name;
  out.count = s[0];
  out.channels = c;
  out.height = h;
  out.width = w;
  classes_from_file = classes == 0 && from_meta > 0;
  out.classes = classes > 0 ? classes : from_meta > 0 ? from_meta : max_label + 1;
  out.images = to_nchw(std::move(images.u8), decided, out.count, c, h, w);
  out.labels = std::move(label_bytes);
  return out;
}

}  // namespace detail

Dataset read_arrays(const std::string& file, const std::string& name, ArraysLayout layout,
                    int classes) {
  bool from_file = false;
  return detail::read_arrays_split(file, name, layout, classes, from_file);
}

DatasetPair load_arrays(const std::string& train_file, const std::string& test_file,
                        const std::string& path, ArraysLayout layout, int classes) {
  DP_CHECK(classes >= 0 && classes <= 256,
           "arrays: classes must be in 0..256 (0: from the files), got " + std::to_string(classes));
  std::vector<std::string> relative;
  for (const auto& f : {train_file, test_file})
    if (!fs::path(f).is_absolute()) relative.push_back(f);
  DatasetPair out;
  out.directory = relative.empty() ? fs::path(train_file).parent_path().string()
                                   : find_dataset_folder("arrays", relative, path);
  auto full = [&](const std::string& f) {
    return fs::path(f).is_absolute() ? f : (fs::path(out.directory) / f).string();
  };
  bool train_meta = false, test_meta = false;
  out.train =
      detail::read_arrays_split(full(train_file), "arrays/train", layout, classes, train_meta);
  out.test = detail::read_arrays_split(full(test_file), "arrays/test", layout, classes, test_meta);
  if (classes == 0) {
    if (train_meta && test_meta && out.train.classes != out.test.classes)
      DP_THROW(full(train_file) + " says " + std::to_string(out.train.classes) +
               " classes in its __metadata__ but " + full(test_file) + " says " +
               std::to_string(out.test.classes) + ": expected the same");
    const int both = std::max(out.train.classes, out.test.classes);
    for (const auto* d : {&out.train, &out.test}) {
      const bool meta = d == &out.train ? train_meta : test_meta;
      if (meta && d->classes != both)
        DP_THROW(full(d == &out.train ? train_file : test_file) + ": __metadata__ classes " +
                 std::to_string(d->classes) + " but the other split has labels up to " +
                 std::to_string(both - 1));
    }
    out.train.classes = out.test.classes = both;
  }
  if (out.train.channels != out.test.channels || out.train.height != out.test.height ||
      out.train.width != out.test.width)
    DP_THROW(full(test_file) + ": images of " + std::to_string(out.test.channels) + "x" +
             std::to_string(out.test.height) + "x" + std::to_string(out.test.width) + " but " +
             full(train_file) + " has " + std::to_string(out.train.channels) + "x" +
             std::to_string(out.train.height) + "x" + std::to_string(out.train.width) +
             ": expected the same shape in both splits");
  return out;
}

}  // namespace dp
