// IDX dataset reader: good files (raw and gzipped), every malformed-file error, the folder
// search order, and the real Fashion-MNIST when it is installed.
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "dp/data.hpp"
#include "dp/error.hpp"
#include "support/check.hpp"
#include "support/env_var.hpp"
#include "support/error_message.hpp"

namespace fs = std::filesystem;

namespace {

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

// An IDX images file: header (magic, count, rows, cols) then `pixels`.
std::vector<uint8_t> images_bytes(uint32_t count, uint32_t rows, uint32_t cols,
                                  const std::vector<uint8_t>& pixels, uint32_t magic = 2051) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, count);
  put_be32(out, rows);
  put_be32(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

std::vector<uint8_t> labels_bytes(uint32_t count, const std::vector<uint8_t>& labels,
                                  uint32_t magic = 2049) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  put_be32(out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void write_raw(const std::string& file, const std::vector<uint8_t>& bytes) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gz(const std::string& file, const std::vector<uint8_t>& bytes) {
  gzFile gz = gzopen(file.c_str(), "wb");
  REQUIRE(gz != nullptr);
  REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(gz) == Z_OK);
}

std::vector<uint8_t> read_all(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// 5 examples of 3x4 (not square, so rows and columns cannot be swapped unnoticed).
constexpr uint32_t kCount = 5, kRows = 3, kCols = 4;

std::vector<uint8_t> sample_pixels() {
  std::vector<uint8_t> p(kCount * kRows * kCols);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  return p;
}
const std::vector<uint8_t> kLabels = {9, 0, 3, 7, 1};

// Writes the four files of a small dataset into `dir` (gzipped or not).
void write_dataset(const std::string& dir, bool gz) {
  fs::create_directories(dir);
  auto write = gz ? write_gz : write_raw;
  const std::string suffix = gz ? ".gz" : "";
  write(dir + "/train-images-idx3-ubyte" + suffix,
        images_bytes(kCount, kRows, kCols, sample_pixels()));
  write(dir + "/train-labels-idx1-ubyte" + suffix, labels_bytes(kCount, kLabels));
  write(dir + "/t10k-images-idx3-ubyte" + suffix,
        images_bytes(2, kRows, kCols, std::vector<uint8_t>(2 * kRows * kCols, 200)));
  write(dir + "/t10k-labels-idx1-ubyte" + suffix, labels_bytes(2, {4, 5}));
}

using dptest::EnvVar;

using Catch::Matchers::Contains;

}  // namespace

TEST_CASE("read_idx reads raw and gzipped files", "[data]") {
  dptest::TempDir tmp;
  const bool gz = GENERATE(false, true);
  INFO((gz ? "gzipped" : "raw"));
  const std::string images = tmp.path() + "/images", labels = tmp.path() + "/labels";
  (gz ? write_gz : write_raw)(images, images_bytes(kCount, kRows, kCols, sample_pixels()));
  (gz ? write_gz : write_raw)(labels, labels_bytes(kCount, kLabels));

  const dp::Dataset d = dp::read_idx(images, labels, "tiny/train", 10);
  CHECK(d.name == "tiny/train");
  CHECK(d.count == kCount);
  CHECK(d.channels == 1);
  CHECK(d.height == static_cast<int>(kRows));
  CHECK(d.width == static_cast<int>(kCols));
  CHECK(d.classes == 10);
  CHECK(d.example_bytes() == kRows * kCols);
  CHECK(d.images == sample_pixels());
  CHECK(d.labels == kLabels);
}

TEST_CASE("read_maybe_gzip decides by the magic bytes, not the file name", "[data]") {
  dptest::TempDir tmp;
  const std::vector<uint8_t> content = images_bytes(kCount, kRows, kCols, sample_pixels());
  // gzip content under a plain name, plain content under a .gz name.
  write_gz(tmp.path() + "/plain-name", content);
  write_raw(tmp.path() + "/gz-name.gz", content);
  REQUIRE(read_all(tmp.path() + "/plain-name") != content);  // really compressed
  CHECK(dp::read_maybe_gzip(tmp.path() + "/plain-name") == content);
  CHECK(dp::read_maybe_gzip(tmp.path() + "/gz-name.gz") == content);
  // An empty file is a valid (empty) plain file.
  write_raw(tmp.path() + "/empty", {});
  CHECK(dp::read_maybe_gzip(tmp.path() + "/empty").empty());
}

TEST_CASE("read_idx rejects truncated files and trailing bytes", "[data]") {
  dptest::TempDir tmp;
  const std::string images = tmp.path() + "/train-images-idx3-ubyte.gz";
  const std::string labels = tmp.path() + "/train-labels-idx1-ubyte.gz";
  write_gz(labels, labels_bytes(kCount, kLabels));
  auto pixels = sample_pixels();

  SECTION("images: one example short") {
    pixels.resize(pixels.size() - kRows * kCols);
    write_gz(images, images_bytes(kCount, kRows, kCols, pixels));
    const auto m = dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); });
    CHECK_THAT(m, Contains(images + ": truncated: header says 5 images of 3x4 (76 bytes), "
                                    "file has 64 bytes after gunzip"));
  }
  SECTION("images: trailing garbage") {
    pixels.push_back(0);
    write_raw(images, images_bytes(kCount, kRows, kCols, pixels));
    const auto m = dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); });
    CHECK_THAT(m, Contains(images + ": trailing bytes: header says 5 images of 3x4 (76 bytes), "
                                    "file has 77 bytes"));
  }
  SECTION("labels: short and long") {
    write_raw(images, images_bytes(kCount, kRows, kCols, pixels));
    write_raw(labels, labels_bytes(kCount, {1, 2, 3}));
    CHECK_THAT(
        dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); }),
        Contains(labels + ": truncated: header says 5 labels (13 bytes), file has 11 bytes"));
    write_raw(labels, labels_bytes(kCount, {1, 2, 3, 4, 5, 6}));
    CHECK_THAT(dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); }),
               Contains(labels + ": trailing bytes"));
  }
  SECTION("shorter than the header") {
    write_raw(images, {0, 0, 8, 3, 0, 0});
    CHECK_THAT(dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); }),
               Contains(images + ": too short for an IDX images file: 6 bytes"));
  }
  SECTION("a gzip stream cut in the middle") {
    // Incompressible pixels so the cut lands inside the deflate data.
    std::vector<uint8_t> noise(2000 * kRows * kCols);
    uint32_t x = 12345;
    for (auto& b : noise) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
    write_gz(images, images_bytes(2000, kRows, kCols, noise));
    auto whole = read_all(images);
    whole.resize(whole.size() / 2);
    write_raw(images, whole);
    CHECK_THAT(dptest::error_message_of([&] { dp::read_maybe_gzip(images); }),
               Contains(images + ": corrupt or truncated gzip data"));
  }
}

TEST_CASE("read_idx rejects wrong magic numbers and bad dimensions", "[data]") {
  dptest::TempDir tmp;
  const std::string images = tmp.path() + "/images", labels = tmp.path() + "/labels";
  write_raw(images, images_bytes(kCount, kRows, kCols, sample_pixels()));
  write_raw(labels, labels_bytes(kCount, kLabels));

  SECTION("images and labels swapped") {
    const auto m = dptest::error_message_of([&] { dp::read_idx(labels, images, "t"); });
    CHECK_THAT(m, Contains(labels + ": magic number 2049 (0x00000801), expected 2051 "
                                    "(0x00000803) for an IDX images file; this is a labels file"));
  }
  SECTION("labels file with another magic") {
    write_raw(labels, labels_bytes(kCount, kLabels, 2050));
    const auto m = dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); });
    CHECK_THAT(m, Contains(labels + ": magic number"));
    CHECK_THAT(m, Contains("expected 2049"));
  }
  SECTION("zero rows") {
    write_raw(images, images_bytes(kCount, 0, kCols, {}));
    CHECK_THAT(dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); }),
               Contains(images + ": header says images of 0x4"));
  }
}

TEST_CASE("read_idx checks that counts agree and labels are in range", "[data]") {
  dptest::TempDir tmp;
  const std::string images = tmp.path() + "/images", labels = tmp.path() + "/labels";
  write_raw(images, images_bytes(kCount, kRows, kCols, sample_pixels()));

  SECTION("more images than labels") {
    write_raw(labels, labels_bytes(4, {1, 2, 3, 4}));
    CHECK_THAT(dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); }),
               Contains(images + " has 5 images but " + labels + " has 4 labels"));
  }
  SECTION("a label equal to the class count") {
    write_raw(labels, labels_bytes(kCount, {1, 2, 3, 10, 4}));
    CHECK_THAT(dptest::error_message_of([&] { dp::read_idx(images, labels, "t", 10); }),
               Contains(labels + ": label 10 of example 3 is out of range: expected 0..9"));
    // The same file is fine for a dataset with more classes.
    CHECK(dp::read_idx(images, labels, "t", 11).labels[3] == 10);
  }
}

TEST_CASE("read_idx names a missing file", "[data]") {
  dptest::TempDir tmp;
  const std::string images = tmp.path() + "/images", labels = tmp.path() + "/nope-labels";
  write_raw(images, images_bytes(kCount, kRows, kCols, sample_pixels()));
  CHECK_THAT(dptest::error_message_of([&] { dp::read_idx(images, labels, "t"); }),
             Contains(labels + ": no such file"));
  CHECK_THAT(dptest::error_message_of([&] { dp::read_maybe_gzip(tmp.path()); }),
             Contains(tmp.path() + ": is a folder"));
}

TEST_CASE("Dataset::head takes the first examples", "[data]") {
  dptest::TempDir tmp;
  write_dataset(tmp.path(), false);
  const dp::Dataset d = dp::read_idx(tmp.path() + "/train-images-idx3-ubyte",
                                     tmp.path() + "/train-labels-idx1-ubyte", "tiny/train");
  const dp::Dataset h = d.head(2);
  CHECK(h.count == 2);
  CHECK(h.name == d.name);
  CHECK(h.height == d.height);
  CHECK(h.width == d.width);
  CHECK(h.labels == std::vector<uint8_t>{9, 0});
  CHECK(h.images == std::vector<uint8_t>(d.images.begin(), d.images.begin() + 2 * kRows * kCols));
  CHECK(d.head(0).count == 0);
  CHECK(d.head(kCount).images == d.images);
  CHECK_THROWS_AS(d.head(kCount + 1), dp::Error);
}

TEST_CASE("load_dataset reads a folder of gzipped or plain files", "[data]") {
  dptest::TempDir tmp;
  const bool gz = GENERATE(false, true);
  INFO((gz ? "gzipped" : "raw"));
  write_dataset(tmp.path(), gz);
  const dp::DatasetPair p = dp::load_dataset("mnist", tmp.path());
  CHECK(p.directory == tmp.path());
  CHECK(p.train.name == "mnist/train");
  CHECK(p.test.name == "mnist/test");
  CHECK(p.train.count == kCount);
  CHECK(p.train.images == sample_pixels());
  CHECK(p.train.labels == kLabels);
  CHECK(p.test.count == 2);
  CHECK(p.test.labels == std::vector<uint8_t>{4, 5});
  CHECK(p.test.images == std::vector<uint8_t>(2 * kRows * kCols, 200));
}

TEST_CASE("load_dataset reports a bad file with its name", "[data]") {
  dptest::TempDir tmp;
  write_dataset(tmp.path(), true);
  const std::string labels = tmp.path() + "/t10k-labels-idx1-ubyte.gz";
  write_gz(labels, labels_bytes(2, {4, 12}));
  CHECK_THAT(dptest::error_message_of([&] { dp::load_dataset("fashion-mnist", tmp.path()); }),
             Contains(labels + ": label 12 of example 1 is out of range"));
}

TEST_CASE("resolve_dataset_directory: given path, then DPRUN_DATA, then the default", "[data]") {
  dptest::TempDir given, env;
  write_dataset(given.path(), true);

  SECTION("a given path wins over DPRUN_DATA") {
    write_dataset(env.path(), false);
    EnvVar v("DPRUN_DATA", env.path());
    CHECK(dp::resolve_dataset_directory("fashion-mnist", given.path()) == given.path());
  }
  SECTION("a given path may hold the dataset in a subfolder") {
    dptest::TempDir parent;
    write_dataset(parent.path() + "/mnist", false);
    CHECK(dp::resolve_dataset_directory("mnist", parent.path()) == parent.path() + "/mnist");
  }
  SECTION("a given path without the files is an error, never a silent fallback") {
    write_dataset(env.path(), false);
    EnvVar v("DPRUN_DATA", env.path());
    const std::string bad = given.path() + "/empty";
    fs::create_directories(bad);
    const auto m =
        dptest::error_message_of([&] { dp::resolve_dataset_directory("fashion-mnist", bad); });
    CHECK_THAT(m, Contains(bad + " (given path): missing train-images-idx3-ubyte[.gz]"));
    CHECK_THAT(m, Contains(bad + "/fashion-mnist (given path/<dataset>): no such folder"));
    CHECK_THAT(m, !Contains(env.path()));
    CHECK_THAT(m, Contains("apt install dataset-fashion-mnist"));
  }
  SECTION("DPRUN_DATA itself") {
    write_dataset(env.path(), false);
    EnvVar v("DPRUN_DATA", env.path());
    CHECK(dp::resolve_dataset_directory("mnist", "") == env.path());
  }
  SECTION("DPRUN_DATA/<dataset> comes before DPRUN_DATA itself") {
    write_dataset(env.path(), false);
    write_dataset(env.path() + "/mnist", true);
    EnvVar v("DPRUN_DATA", env.path());
    CHECK(dp::resolve_dataset_directory("mnist", "") == env.path() + "/mnist");
    // And a partial subfolder does not hide complete files in DPRUN_DATA itself.
    fs::remove(env.path() + "/mnist/t10k-labels-idx1-ubyte.gz");
    CHECK(dp::resolve_dataset_directory("mnist", "") == env.path());
  }
  SECTION("nothing found: every place tried is listed") {
    EnvVar v("DPRUN_DATA", env.path());
    write_dataset(env.path() + "/mnist", false);
    fs::remove(env.path() + "/mnist/t10k-images-idx3-ubyte");
    if (fs::exists("/usr/share/datasets/mnist")) {
      DPTEST_SKIPPED("/usr/share/datasets/mnist exists: the not-found case is not checked");
      return;
    }
    const auto m = dptest::error_message_of([&] { dp::resolve_dataset_directory("mnist", ""); });
    CHECK_THAT(m, Contains(env.path() + "/mnist ($DPRUN_DATA/<dataset>): missing "
                                        "t10k-images-idx3-ubyte[.gz]"));
    CHECK_THAT(m, Contains(env.path() + " ($DPRUN_DATA): missing train-images-idx3-ubyte[.gz] "
                                        "train-labels-idx1-ubyte[.gz]"));
    CHECK_THAT(m, Contains("/usr/share/datasets/mnist (default): no such folder"));
    CHECK_THAT(m, Contains("set DPRUN_DATA"));
  }
  SECTION("an unknown dataset lists the known ones") {
    CHECK_THAT(
        dptest::error_message_of([&] { dp::resolve_dataset_directory("cifar100", given.path()); }),
        Contains("unknown dataset \"cifar100\": known datasets are cifar10, "
                 "fashion-mnist, mnist"));
  }
}

TEST_CASE("the real Fashion-MNIST loads with its known contents", "[data]") {
  const std::string dir = dptest::fashion_mnist_dir();
  if (dir.empty()) {
    DPTEST_SKIPPED(
        "Fashion-MNIST not found (apt install dataset-fashion-mnist, or set DPRUN_DATA): "
        "the real-data test did not run");
    return;
  }
  const dp::DatasetPair p = dp::load_dataset("fashion-mnist", dir);
  REQUIRE(p.train.count == 60000);
  REQUIRE(p.test.count == 10000);
  CHECK(p.train.height == 28);
  CHECK(p.train.width == 28);
  CHECK(p.train.images.size() == 60000u * 784u);
  CHECK(p.test.images.size() == 10000u * 784u);
  CHECK(p.train.labels[0] == 9);  // ankle boot
  CHECK(p.test.labels[0] == 9);
  // Fashion-MNIST is balanced: 6000 training and 1000 test examples per class.
  for (int c = 0; c < 10; ++c) {
    INFO("class " << c);
    CHECK(std::count(p.train.labels.begin(), p.train.labels.end(), c) == 6000);
    CHECK(std::count(p.test.labels.begin(), p.test.labels.end(), c) == 1000);
  }
  // Mean pixel ~72.9 of 255 (the 0.286 normalisation constant); the first image's bytes sum to
  // 76247: a header off by a byte or a wrong split would change both.
  const double train_mean =
      std::accumulate(p.train.images.begin(), p.train.images.end(), 0.0) / p.train.images.size();
  CHECK(train_mean > 70.0);
  CHECK(train_mean < 76.0);
  CHECK(std::accumulate(p.train.images.begin(), p.train.images.begin() + 784, int64_t{0}) == 76247);
}
