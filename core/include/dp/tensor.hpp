#pragma once
// Tensors are non-owning views: a pointer into memory owned by a replica's Arena (or by a test),
// a logical shape, an element type, a memory layout and the device the memory lives on.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace dp {

enum class DType : uint8_t { f32, bf16, i32, u8 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

/// Memory order of a rank-4 activation. The logical shape is always (N, C, H, W);
/// layout says how it is laid out in memory (as cuDNN's tensor formats do).
enum class Layout : uint8_t { nchw, nhwc };
const char* layout_name(Layout l);
/// "nchw", "nhwc": every layout by its name (a setting's choices); parse_layout throws dp::Error
/// naming the known ones.
const std::vector<std::string>& layout_names();
Layout parse_layout(const std::string& name);

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  std::string str() const;  // "cpu", "cuda:1"
  bool operator==(const Device&) const = default;
};

/// Up to four dimensions. dims[0] is the batch dimension for activations.
struct Shape {
  static constexpr int kMaxRank = 4;
  int rank = 0;
  std::array<int64_t, kMaxRank> dims{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  /// Elements per example: numel() / dims[0] (1 for rank 0).
  int64_t per_example() const;
  /// The same shape with dims[0] replaced.
  Shape with_batch(int64_t n) const;
  std::string str() const;  // "(256, 1, 28, 28)"
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  Device device;

  Tensor() = default;
  Tensor(void* d, Shape s, DType t = DType::f32, Device dev = {}, Layout l = Layout::nchw)
      : data(d), shape(s), dtype(t), layout(l), device(dev) {}

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }

  /// Typed access; throws dp::InternalError when the dtype does not match.
  float* f32() const;
  int32_t* i32() const;
  uint8_t* u8() const;

  /// A view of examples [begin, begin + count) along dims[0] (same memory).
  Tensor slice_batch(int64_t begin, int64_t count) const;
  /// A view with dims[0] = n (the first n examples; n may not exceed the current dims[0]).
  Tensor with_batch(int64_t n) const { return slice_batch(0, n); }
  /// The same memory seen with another shape of equal numel (layout kept).
  Tensor reshaped(Shape s) const;
};

}  // namespace dp
