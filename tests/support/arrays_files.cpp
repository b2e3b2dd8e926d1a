#include "support/arrays_files.hpp"

namespace dptest {

uint8_t arrays_pixel(int64_t n, int channel, int row, int column) {
  return static_cast<uint8_t>((n * 37 + channel * 101 + row * 11 + column * 3) % 251);
}

uint8_t arrays_label(int64_t n, int classes) {
  return static_cast<uint8_t>((n * 7 + 3) % classes);
}

dp::SafeTensorsFile arrays_content(const ArraysSpec& s) {
  dp::SafeTensor images;
  images.type = dp::SafeTensor::Type::u8;
  if (s.three_d)
    images.shape = {s.count, s.height, s.width};
  else if (s.nhwc)
    images.shape = {s.count, s.height, s.width, s.channels};
  else
    images.shape = {s.count, s.channels, s.height, s.width};
  for (int64_t n = 0; n < s.count; ++n) {
    if (s.nhwc) {
      for (int y = 0; y < s.height; ++y)
        for (int x = 0; x < s.width; ++x)
          for (int c = 0; c < s.channels; ++c) images.u8.push_back(arrays_pixel(n, c, y, x));
    } else {
      for (int c = 0; c < s.channels; ++c)
        for (int y = 0; y < s.height; ++y)
          for (int x = 0; x < s.width; ++x) images.u8.push_back(arrays_pixel(n, c, y, x));
    }
  }
  dp::SafeTensor labels;
  labels.type = s.label_type;
  labels.shape = {s.count};
  for (int64_t n = 0; n < s.count; ++n) {
    if (s.label_type == dp::SafeTensor::Type::u8)
      labels.u8.push_back(arrays_label(n, s.classes));
    else
      labels.i64.push_back(arrays_label(n, s.classes));
  }
  dp::SafeTensorsFile f;
  f.tensors["images"] = std::move(images);
  f.tensors["labels"] = std::move(labels);
  f.metadata = s.metadata;
  return f;
}

void write_arrays_file(const std::string& path, const ArraysSpec& spec) {
  dp::write_safetensors(path, arrays_content(spec));
}

}  // namespace dptest
