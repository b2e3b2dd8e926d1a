// CIFAR-10's binary batches: fixed-size records with no header, so the file size and every label
// byte are all there is to check before trusting a pixel.
#include <filesystem>
#include <system_error>

#include "data_files.hpp"
#include "dp/data.hpp"
#include "dp/error.hpp"

namespace dp {

namespace {

constexpr int kChannels = 3, kSide = 32, kClasses = 10;
constexpr size_t kImageBytes = size_t{kChannels} * kSide * kSide;  // 3072: R, G, B planes
constexpr size_t kRecordBytes = 1 + kImageBytes;                   // label byte first

}  // namespace

Dataset read_cifar10(const std::vector<std::string>& files, const std::string& name) {
  DP_CHECK(!files.empty(), name + ": no CIFAR-10 batch files given");
  Dataset out;
  out.name = name;
  out.channels = kChannels;
  out.height = kSide;
  out.width = kSide;
  out.classes = kClasses;
  // Plain files' sizes give the final size, so the 150 MB of the training split is not copied
  // again at every growth (a gzipped file's size says nothing and only costs a regrowth).
  uintmax_t plain_bytes = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(f, ec);
    if (!ec) plain_bytes += size;
  }
  out.images.reserve(static_cast<size_t>(plain_bytes / kRecordBytes * kImageBytes));
  out.labels.reserve(static_cast<size_t>(plain_bytes / kRecordBytes));

  for (const auto& file : files) {
    const detail::FileBytes f = detail::read_file_bytes(file, "a CIFAR-10 binary batch");
    const size_t size = f.bytes.size();
    if (size == 0) {
      DP_THROW(file + ": empty file (0 bytes), expected CIFAR-10 records of " +
               std::to_string(kRecordBytes) +
               " bytes (a label byte, then a 32x32 image as red, green and blue planes): "
               "download it again");
    }
    if (size % kRecordBytes != 0) {
      DP_THROW(file + ": " + detail::size_note(f) + " is not a whole number of " +
               std::to_string(kRecordBytes) + "-byte records (" +
               std::to_string(size / kRecordBytes) + " records and " +
               std::to_string(size % kRecordBytes) +
               " bytes over): truncated or not a CIFAR-10 binary batch");
    }
    const size_t records = size / kRecordBytes;
    for (size_t r = 0; r < records; ++r) {
      const size_t offset = r * kRecordBytes;
      const uint8_t label = f.bytes[offset];
      if (label >= kClasses) {
        DP_THROW(file + ": record " + std::to_string(r) + " (offset " + std::to_string(offset) +
                 "): label " + std::to_string(label) + ", expected 0.." +
                 std::to_string(kClasses - 1));
      }
    }
    // The image bytes are already one example's CHW planes: copied as they are.
    for (size_t r = 0; r < records; ++r) {
      const auto record = f.bytes.begin() + static_cast<std::ptrdiff_t>(r * kRecordBytes);
      out.labels.push_back(*record);
      out.images.insert(out.images.end(), record + 1,
                        record + static_cast<std::ptrdiff_t>(kRecordBytes));
    }
    out.count += static_cast<int64_t>(records);
  }
  return out;
}

}  // namespace dp
