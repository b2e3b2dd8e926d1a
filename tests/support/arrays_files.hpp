#pragma once
// Synthetic files of the "arrays" dataset format (safetensors: U8 images, integer labels) for
// the reader's tests and end-to-end runs. Pixels depend on the example, channel, row and column,
// so a layout or offset mistake changes what is read.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dp/safetensors.hpp"

namespace dptest {

/// The pixel example n holds at (channel, row, column).
uint8_t arrays_pixel(int64_t n, int channel, int row, int column);
/// The label of example n, below `classes`.
uint8_t arrays_label(int64_t n, int classes);

struct ArraysSpec {
  int64_t count = 8;
  int channels = 1, height = 5, width = 6;
  bool nhwc = false;   // images N x H x W x C instead of N x C x H x W
  bool three_d = false;  // images N x H x W (channels must be 1)
  dp::SafeTensor::Type label_type = dp::SafeTensor::Type::i64;
  int classes = 10;  // labels are arrays_label(n, classes)
  std::map<std::string, std::string> metadata;
};

/// The file's content as a SafeTensorsFile (to damage before writing), and written.
dp::SafeTensorsFile arrays_content(const ArraysSpec& spec);
void write_arrays_file(const std::string& path, const ArraysSpec& spec);

}  // namespace dptest
