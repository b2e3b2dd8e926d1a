#include "support/cifar10_files.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace dptest {

uint8_t cifar10_pixel(int64_t global_index, int channel, int row, int column) {
  return static_cast<uint8_t>((global_index * 131 + channel * 77 + row * 7 + column * 3) % 256);
}

uint8_t cifar10_label(int64_t global_index) { return static_cast<uint8_t>(global_index * 7 % 10); }

std::vector<uint8_t> cifar10_batch(int64_t first, int64_t records) {
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(records) * 3073);
  for (int64_t r = first; r < first + records; ++r) {
    out.push_back(cifar10_label(r));
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 32; ++y)
        for (int x = 0; x < 32; ++x) out.push_back(cifar10_pixel(r, c, y, x));
  }
  return out;
}

void write_cifar10_folder(const std::string& dir, int64_t per_train_batch, int64_t test_records) {
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) throw std::runtime_error(dir + "/" + name + ": cannot write");
  };
  for (int b = 0; b < 5; ++b)
    write("data_batch_" + std::to_string(b + 1) + ".bin",
          cifar10_batch(b * per_train_batch, per_train_batch));
  write("test_batch.bin", cifar10_batch(1000000, test_records));
}

}  // namespace dptest
