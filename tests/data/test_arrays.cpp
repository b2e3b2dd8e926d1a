// The "arrays" dataset format (safetensors of U8 images and integer labels): every layout read
// pixel by pixel against the definition, how the layout and the classes are decided, every
// damaged file refused naming the file, the tensor, the offset and what was expected; and the
// dataset factories (built in, options, the checks of load_checked).
#include <zlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "dp/data.hpp"
#include "dp/error.hpp"
#include "dp/plugin.hpp"
#include "dp/safetensors.hpp"
#include "support/arrays_files.hpp"
#include "support/check.hpp"
#include "support/env_var.hpp"
#include "support/error_message.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using dp::ArraysLayout;
using Type = dp::SafeTensor::Type;

namespace {

// Every pixel and label of `d` against the synthetic definition (CHW per example).
void check_examples(const dp::Dataset& d, const dptest::ArraysSpec& s) {
  REQUIRE(d.count == s.count);
  REQUIRE(d.channels == s.channels);
  REQUIRE(d.height == s.height);
  REQUIRE(d.width == s.width);
  REQUIRE(d.images.size() == static_cast<size_t>(d.count * d.example_bytes()));
  int64_t wrong = 0;
  size_t i = 0;
  for (int64_t n = 0; n < s.count; ++n) {
    if (d.labels[static_cast<size_t>(n)] != dptest::arrays_label(n, s.classes)) ++wrong;
    for (int c = 0; c < s.channels; ++c)
      for (int y = 0; y < s.height; ++y)
        for (int x = 0; x < s.width; ++x)
          wrong += d.images[i++] != dptest::arrays_pixel(n, c, y, x);
  }
  CHECK(wrong == 0);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("safetensors reads and writes U8, I16, U16, I32 and I64 tensors", "[data][arrays]") {
  dptest::TempDir dir;
  for (Type t : {Type::u8, Type::i16, Type::u16, Type::i32, Type::i64}) {
    INFO(dp::safetensors_dtype(t));
    dptest::ArraysSpec s;
    s.label_type = t;
    const std::string file = dir.path() + "/a.safetensors";
    dptest::write_arrays_file(file, s);
    const auto f = dp::read_safetensors(file);
    CHECK(f.tensors.at("labels").type == t);
    CHECK(f.tensors.at("images").u8 == dptest::arrays_content(s).tensors.at("images").u8);
    CHECK(f.tensors.at("images").file_offset > 8);
    check_examples(dp::read_arrays(file, "x", ArraysLayout::automatic, 10), s);
  }
  // A value that does not fit its dtype is refused, never wrapped.
  dp::SafeTensorsFile f;
  f.tensors["x"] = dp::SafeTensor{Type::i16, {1}, {}, {40000}, {}, 0};
  CHECK_THROWS_WITH(dp::encode_safetensors(f), Contains("does not fit its dtype I16"));
}

TEST_CASE("read_arrays reads N x C x H x W, N x H x W x C and N x H x W images", "[data][arrays]") {
  dptest::TempDir dir;
  const std::string file = dir.path() + "/train.safetensors";
  dptest::ArraysSpec s;
  SECTION("NCHW, 3 channels") {
    s.channels = 3;
    dptest::write_arrays_file(file, s);
    check_examples(dp::read_arrays(file, "x", ArraysLayout::automatic, 0), s);
    check_examples(dp::read_arrays(file, "x", ArraysLayout::nchw, 0), s);
  }
  SECTION("NHWC, 3 channels: transposed to CHW") {
    s.channels = 3;
    s.nhwc = true;
    dptest::write_arrays_file(file, s);
    check_examples(dp::read_arrays(file, "x", ArraysLayout::automatic, 0), s);
    check_examples(dp::read_arrays(file, "x", ArraysLayout::nhwc, 0), s);
  }
  SECTION("N x H x W: one channel") {
    s.three_d = true;
    dptest::write_arrays_file(file, s);
    check_examples(dp::read_arrays(file, "x", ArraysLayout::automatic, 0), s);
  }
  SECTION("gzipped") {
    s.channels = 3;
    s.nhwc = true;
    dptest::write_arrays_file(file, s);
    const std::string bytes = slurp(file);
    gzFile gz = gzopen((file + ".gz").c_str(), "wb");
    REQUIRE(gz != nullptr);
    REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) ==
            static_cast<int>(bytes.size()));
    REQUIRE(gzclose(gz) == Z_OK);
    check_examples(dp::read_arrays(file + ".gz", "x", ArraysLayout::automatic, 0), s);
  }
}

TEST_CASE(
    "read_arrays: the layout is the option's, the metadata's, or the only one the shape allows",
    "[data][arrays]") {
  dptest::TempDir dir;
  const std::string file = dir.path() + "/a.safetensors";
  dptest::ArraysSpec s;
  s.count = 4;
  s.channels = 3;
  s.height = 4;
  s.width = 4;  // N x 3 x 4 x 4: dimensions 1 and 3 could both be channels
  dptest::write_arrays_file(file, s);
  const std::string why =
      dptest::error_message_of([&] { dp::read_arrays(file, "x", ArraysLayout::automatic, 0); });
  CHECK_THAT(why, Contains(file + ": tensor images has shape [4, 3, 4, 4], which could be N x C x "
                                  "H x W or N x H x W x C") &&
                      Contains("layout = \"nchw\" or \"nhwc\""));
  check_examples(dp::read_arrays(file, "x", ArraysLayout::nchw, 0), s);

  s.metadata = {{"layout", "nchw"}};
  dptest::write_arrays_file(file, s);
  check_examples(dp::read_arrays(file, "x", ArraysLayout::automatic, 0), s);
  CHECK_THAT(dptest::error_message_of([&] { dp::read_arrays(file, "x", ArraysLayout::nhwc, 0); }),
             Contains(file + ": option layout = \"nhwc\" but the file's __metadata__ says "
                             "\"nchw\""));
  s.metadata = {{"layout", "chw"}};
  dptest::write_arrays_file(file, s);
  CHECK_THAT(
      dptest::error_message_of([&] { dp::read_arrays(file, "x", ArraysLayout::automatic, 0); }),
      Contains("__metadata__ layout \"chw\", expected \"nchw\" or \"nhwc\""));

  // Neither dimension can be a channel count: said, not guessed.
  s = {};
  s.channels = 1;
  s.height = 8;
  s.width = 8;
  auto content = dptest::arrays_content(s);
  content.tensors["images"].shape = {2, 8, 8, 4 * 8 * 8 / 8};  // 2 x 8 x 8 x 32 (its 4096 bytes)
  content.tensors["images"].u8.resize(2 * 8 * 8 * 32);
  content.tensors["labels"].shape = {2};
  content.tensors["labels"].i64.resize(2);
  dp::write_safetensors(file, content);
  CHECK_THAT(
      dptest::error_message_of([&] { dp::read_arrays(file, "x", ArraysLayout::automatic, 0); }),
      Contains("could be neither N x C x H x W nor N x H x W x C with at most 4 channels"));
  CHECK_THAT(dptest::error_message_of([&] { dp::read_arrays(file, "x", ArraysLayout::nhwc, 0); }),
             Contains("gives 32 channels, expected at most 4"));
}

TEST_CASE("read_arrays refuses damaged files, naming the file, the tensor and what was expected",
          "[data][arrays]") {
  dptest::TempDir dir;
  const std::string file = dir.path() + "/bad.safetensors";
  dptest::ArraysSpec s;
  s.count = 6;
  auto read = [&] {
    return dptest::error_message_of(
        [&] { dp::read_arrays(file, "x", ArraysLayout::automatic, 0); });
  };
  auto write = [&](const dp::SafeTensorsFile& f) { dp::write_safetensors(file, f); };

  SECTION("truncated") {
    dptest::write_arrays_file(file, s);
    const std::string good = slurp(file);
    spit(file, good.substr(0, good.size() - 5));
    CHECK_THAT(read(), Contains("safetensors file " + file) && Contains("truncated?"));
    spit(file, good.substr(0, 30));
    CHECK_THAT(read(), Contains(file) && Contains("truncated?"));
    spit(file, "");
    CHECK_THAT(read(), Contains(file) && Contains("shorter than its 8-byte header length"));
  }
  SECTION("a missing tensor") {
    auto f = dptest::arrays_content(s);
    f.tensors.erase("labels");
    write(f);
    CHECK_THAT(read(), Contains(file + ": no tensor \"labels\", expected integer labels, one per "
                                       "image (the file has: images)"));
    f = dptest::arrays_content(s);
    f.tensors["pixels"] = f.tensors["images"];
    f.tensors.erase("images");
    write(f);
    CHECK_THAT(read(), Contains(file + ": no tensor \"images\"") && Contains("labels, pixels"));
  }
  SECTION("wrong dtypes") {
    auto f = dptest::arrays_content(s);
    auto& images = f.tensors["images"];
    images.type = Type::f32;
    images.f32.assign(images.u8.begin(), images.u8.end());
    images.u8.clear();
    write(f);
    CHECK_THAT(read(),
               Contains(file + ": tensor images (offset ") && Contains("dtype F32, expected U8"));
    f = dptest::arrays_content(s);
    auto& labels = f.tensors["labels"];
    labels.type = Type::f32;
    labels.f32.assign(labels.i64.begin(), labels.i64.end());
    labels.i64.clear();
    write(f);
    CHECK_THAT(read(), Contains(file + ": tensor labels (offset ") &&
                           Contains("dtype F32, expected an integer dtype"));
  }
  SECTION("wrong shapes and counts that differ") {
    auto f = dptest::arrays_content(s);
    f.tensors["images"].shape = {6, 30};
    write(f);
    CHECK_THAT(read(), Contains("tensor images (offset ") &&
                           Contains("shape [6, 30], expected N x H x W, N x C x H x W or"));
    f = dptest::arrays_content(s);
    f.tensors["labels"].shape = {5};
    f.tensors["labels"].i64.resize(5);
    write(f);
    CHECK_THAT(read(), Contains("tensor labels (offset ") &&
                           Contains("shape [5], expected [6]: one label per image"));
    f = dptest::arrays_content(s);
    f.tensors["images"].shape = {0, 1, 5, 6};
    f.tensors["images"].u8.clear();
    f.tensors["labels"].shape = {0};
    f.tensors["labels"].i64.clear();
    write(f);
    CHECK_THAT(read(), Contains("expected at least one image"));
  }
  SECTION("labels out of range: the example and its byte offset") {
    auto f = dptest::arrays_content(s);
    f.tensors["labels"].i64[4] = 12;
    write(f);
    const uint64_t offset = dp::read_safetensors(file).tensors.at("labels").file_offset + 4 * 8;
    CHECK_THAT(
        dptest::error_message_of([&] { dp::read_arrays(file, "x", ArraysLayout::automatic, 10); }),
        Contains(file + ": tensor labels: label 12 of example 4 (offset " + std::to_string(offset) +
                 ") is out of range: expected 0..9 (option "
                 "classes = 10)"));
    f.tensors["labels"].i64[4] = -1;
    write(f);
    CHECK_THAT(read(), Contains("label -1 of example 4") && Contains("expected 0..255"));
    f.tensors["labels"].i64[4] = 9;  // the others are at most 8
    f.metadata = {{"classes", "9"}};
    write(f);
    CHECK_THAT(read(), Contains("label 9 of example 4") &&
                           Contains("expected 0..8 (__metadata__ classes = 9)"));
    f.metadata = {{"classes", "ten"}};
    write(f);
    CHECK_THAT(read(), Contains("__metadata__ classes \"ten\", expected an integer in 1..256"));
  }
  SECTION("not a file") {
    CHECK_THAT(read(), Contains(file + ": no such file"));
    CHECK_THAT(dptest::error_message_of(
                   [&] { dp::read_arrays(dir.path(), "x", ArraysLayout::automatic, 0); }),
               Contains(dir.path() + ": is a folder"));
  }
}

TEST_CASE("load_arrays: classes agree across splits, files are found where datasets are",
          "[data][arrays]") {
  dptest::TempDir dir;
  dptest::EnvVar env("DPRUN_DATA", std::nullopt);
  const std::string folder = dir.path() + "/arrays";
  fs::create_directories(folder);
  dptest::ArraysSpec train, test;
  train.count = 20;
  test.count = 3;  // labels 3, 0, 7: the test split lacks the last classes
  dptest::write_arrays_file(folder + "/train.safetensors", train);
  dptest::write_arrays_file(folder + "/test.safetensors", test);
  // The given path, or the dataset's folder below it.
  for (const std::string& path : {folder, dir.path()}) {
    const dp::DatasetPair p =
        dp::load_arrays("train.safetensors", "test.safetensors", path, ArraysLayout::automatic, 0);
    CHECK(p.directory == folder);
    CHECK(p.train.classes == 10);  // largest label 9 + 1, for both splits
    CHECK(p.test.classes == 10);
    check_examples(p.train, train);
  }
  // $DPRUN_DATA, and the factory with its default options.
  {
    dptest::EnvVar data("DPRUN_DATA", dir.path());
    const dp::DatasetPair p = dp::load_dataset("arrays");
    CHECK(p.train.count == 20);
    CHECK(p.test.name == "arrays/test");
  }
  CHECK(
      dp::load_arrays("train.safetensors", "test.safetensors", folder, ArraysLayout::automatic, 12)
          .test.classes == 12);
  // Not found: every place tried, and what to do.
  CHECK_THAT(dptest::error_message_of([&] {
               dp::load_arrays("mine.safetensors", "test.safetensors", folder,
                               ArraysLayout::automatic, 0);
             }),
             Contains("dataset arrays not found; looked for mine.safetensors[.gz] and "
                      "test.safetensors[.gz] in:") &&
                 Contains("[data.arrays] train = and test ="));
  // Absolute names need no search.
  CHECK(dp::load_arrays(folder + "/train.safetensors", folder + "/test.safetensors", "",
                        ArraysLayout::automatic, 0)
            .train.count == 20);
  // Metadata that disagrees across the splits.
  train.metadata = {{"classes", "10"}};
  test.metadata = {{"classes", "12"}};
  dptest::write_arrays_file(folder + "/train.safetensors", train);
  dptest::write_arrays_file(folder + "/test.safetensors", test);
  CHECK_THAT(dptest::error_message_of([&] {
               dp::load_arrays("train.safetensors", "test.safetensors", folder,
                               ArraysLayout::automatic, 0);
             }),
             Contains("says 10 classes in its __metadata__ but") && Contains("says 12"));
  // Images of another shape in the test split.
  test = {};
  test.count = 3;
  test.width = 7;
  dptest::write_arrays_file(folder + "/test.safetensors", test);
  CHECK_THAT(dptest::error_message_of([&] {
               dp::load_arrays("train.safetensors", "test.safetensors", folder,
                               ArraysLayout::automatic, 0);
             }),
             Contains("images of 1x5x7 but") && Contains("expected the same shape in both"));
}

TEST_CASE("dataset factories: the built-in ones, their options and load_checked's checks",
          "[data][arrays]") {
  std::vector<std::string> names;
  for (const auto& f : dp::builtin_datasets()) names.push_back(f.name);
  CHECK(names == std::vector<std::string>{"arrays", "cifar10", "fashion-mnist", "mnist"});
  const dp::DatasetFactory& fashion = *dp::find_builtin_dataset("fashion-mnist");
  CHECK(dp::shape_text(fashion.shape) == "1x28x28, 10 classes");
  CHECK(dp::find_builtin_dataset("imagenet") == nullptr);

  const dp::DatasetFactory& arrays = *dp::find_builtin_dataset("arrays");
  const auto resolved = dp::resolve_dataset_options(arrays, {{"classes", int64_t{5}}});
  CHECK(std::get<int64_t>(resolved.at("classes")) == 5);
  CHECK(std::get<std::string>(resolved.at("train")) == "train.safetensors");
  CHECK_THROWS_WITH(dp::resolve_dataset_options(arrays, {{"trian", std::string("x")}}),
                    Contains("dataset 'arrays' has no option 'trian'; known options of "
                             "'arrays': train (string, default \"train.safetensors\")"));
  CHECK_THROWS_WITH(dp::resolve_dataset_options(arrays, {{"classes", std::string("ten")}}),
                    Contains("dataset 'arrays': option 'classes' expects int, got string"));
  CHECK_THROWS_WITH(dp::resolve_dataset_options(fashion, {{"x", true}}),
                    Contains("dataset 'fashion-mnist' takes no options"));
  CHECK_THROWS_WITH(dp::load_checked(arrays, {{"layout", std::string("hwc")}}, "/nowhere"),
                    Contains("layout \"hwc\": expected \"auto\", \"nchw\" or \"nhwc\""));

  // A factory whose data contradicts what it declares, or itself, is refused by name.
  dp::DatasetFactory liar;
  liar.name = "liar";
  liar.shape = {1, 28, 28, 10, ""};
  dp::Dataset d;
  d.count = 2;
  d.channels = 3;
  d.height = d.width = 2;
  d.images.assign(2 * 12, 0);
  d.labels = {0, 1};
  liar.load = [&](const dp::DatasetOptions&, const std::string&) {
    return dp::DatasetPair{d, d, ""};
  };
  CHECK_THROWS_WITH(dp::load_checked(liar, {}, ""),
                    Contains("dataset liar: it declares 1x28x28, 10 classes but loaded 3x2x2, 10 "
                             "classes (train split)"));
  liar.shape = {};
  d.labels = {0, 10};
  CHECK_THROWS_WITH(dp::load_checked(liar, {}, ""),
                    Contains("dataset liar: the train split has label 10 of example 1, expected "
                             "0..9"));
  d.labels = {0, 1};
  d.images.pop_back();
  CHECK_THROWS_WITH(dp::load_checked(liar, {}, ""),
                    Contains("the train split has 23 image bytes, expected 24"));
  d.images.push_back(0);
  liar.load = [&](const dp::DatasetOptions&, const std::string&) -> dp::DatasetPair {
    throw std::runtime_error("disk on fire");
  };
  CHECK_THROWS_WITH(dp::load_checked(liar, {}, ""),
                    Contains("dataset liar: loading failed: disk on fire"));
}
