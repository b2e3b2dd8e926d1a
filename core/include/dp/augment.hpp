#pragma once
// Data augmentation on the device: what the trainer's settings ask for (Augmentation), what one
// gather_batch call applies (GatherTransform), and the per-example draws, which come from a
// counter-based hash of (seed, epoch, position in the epoch's global order), not from a
// generator's state: k replicas draw what one replica draws for the same examples, and an epoch
// draws the same whatever ran before it (a resumed run included).
//
// The order is torchvision's RandomCrop(size, padding=P) on the uint8 image (padded pixels 0),
// then RandomHorizontalFlip(0.5), then ToTensor (v / 255), then Normalize(mean, std):
//   x[c][h][w] = (padded[c][oy + h][ox + w'] / 255 - mean[c]) / std[c],
//   w' = flip ? W - 1 - w : w, padded[c][i][j] = image[c][i - P][j - P] inside the image, else 0,
// with offsets oy, ox in [0, 2P].
#include <cstdint>
#include <vector>

namespace dp {

class Tensor;

/// The augmentation settings of a trial (part of its identity). Crop and flip apply in training
/// only; normalisation in training and evaluation. The defaults change nothing: x = v / 255
/// exactly as without augmentation.
struct Augmentation {
  /// Random crop of the original size from the image zero-padded by this on each side; 0: none.
  int64_t crop_padding = 0;
  /// Horizontal flip with probability 1/2, after the crop.
  bool flip = false;
  /// Per channel: x = (v / 255 - mean[c]) / std[c]. Empty, or one value per channel of the
  /// data; std values > 0.
  std::vector<float> mean, std;

  /// True when training draws per-example crops or flips.
  bool draws() const { return crop_padding > 0 || flip; }
};

/// The largest crop padding gather_batch accepts (a draw's offsets are packed in 12 bits).
constexpr int64_t kMaxCropPadding = 2047;
/// The most channels normalisation takes (the CUDA kernel carries mean and std as arguments).
constexpr int64_t kMaxNormaliseChannels = 16;

/// One example's crop offsets (0 <= oy, ox <= 2P) and flip, packed in an i32 as a draws table
/// holds them: oy | ox << 12 | flip << 24.
constexpr int32_t pack_draw(int64_t oy, int64_t ox, bool flip) {
  return static_cast<int32_t>(oy | (ox << 12) | (static_cast<int64_t>(flip) << 24));
}
constexpr int64_t draw_oy(int32_t d) { return d & 0xfff; }
constexpr int64_t draw_ox(int32_t d) { return (d >> 12) & 0xfff; }
constexpr bool draw_flip(int32_t d) { return ((d >> 24) & 1) != 0; }

/// The draw of the example at `position` of the global order of stream `stream` (the trainer:
/// the 1-based epoch; Trainer::step uses streams of its own) for a trial seeded `seed`: offsets
/// uniform in [0, 2P] (each from 30 bits of a 64-bit hash: a bias below 2^-18), flip with
/// probability 1/2 when `flip`, centre (P, P) and no flip for what is not asked for.
int32_t augment_draw(uint64_t seed, uint64_t stream, uint64_t position, int64_t crop_padding,
                     bool flip);
/// augment_draw for positions [first, first + count).
std::vector<int32_t> augment_draws(uint64_t seed, uint64_t stream, uint64_t first, int64_t count,
                                   int64_t crop_padding, bool flip);

/// What one gather_batch call does beyond v / 255 (Backend::gather_batch).
struct GatherTransform {
  /// P in [0, kMaxCropPadding]: examples are cropped from the image zero-padded by P.
  int64_t crop_padding = 0;
  /// (L) i32, parallel to gather_batch's indices (the same rows are read): each example's packed
  /// draw (pack_draw), offsets in [0, 2P]. Null: the centre crop without flip, i.e. the image as
  /// it is (evaluation).
  const Tensor* draws = nullptr;
  /// Per channel (C values) or empty (mean 0, std 1: no normalisation); std > 0.
  std::vector<float> mean, std;
};

}  // namespace dp
