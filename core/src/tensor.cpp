#include "dp/tensor.hpp"

#include "dp/error.hpp"

namespace dp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

const char* layout_name(Layout l) { return l == Layout::nchw ? "nchw" : "nhwc"; }

const std::vector<std::string>& layout_names() {
  static const std::vector<std::string> names = {"nchw", "nhwc"};
  return names;
}

Layout parse_layout(const std::string& name) {
  for (Layout l : {Layout::nchw, Layout::nhwc})
    if (name == layout_name(l)) return l;
  DP_THROW("layout \"" + name + "\": the known layouts are nchw, nhwc");
}

std::string Device::str() const {
  return kind == DeviceKind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Shape::Shape(std::initializer_list<int64_t> d) {
  DP_CHECK(d.size() <= static_cast<size_t>(kMaxRank),
           "a shape has at most 4 dimensions, got " + std::to_string(d.size()));
  for (int64_t v : d) dims[static_cast<size_t>(rank++)] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

int64_t Shape::per_example() const {
  if (rank == 0) return 1;
  int64_t n = 1;
  for (int i = 1; i < rank; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

Shape Shape::with_batch(int64_t n) const {
  DP_ASSERT(rank >= 1);
  Shape s = *this;
  s.dims[0] = n;
  return s;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[static_cast<size_t>(i)]);
  }
  return s + ")";
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[static_cast<size_t>(i)] != o.dims[static_cast<size_t>(i)]) return false;
  return true;
}

float* Tensor::f32() const {
  DP_ASSERT(dtype == DType::f32);
  return static_cast<float*>(data);
}
int32_t* Tensor::i32() const {
  DP_ASSERT(dtype == DType::i32);
  return static_cast<int32_t*>(data);
}
uint8_t* Tensor::u8() const {
  DP_ASSERT(dtype == DType::u8);
  return static_cast<uint8_t*>(data);
}

Tensor Tensor::slice_batch(int64_t begin, int64_t count) const {
  DP_ASSERT(shape.rank >= 1);
  DP_ASSERT(begin >= 0 && count >= 0 && begin + count <= shape[0]);
  Tensor t = *this;
  // Batch-major in both layouts: example n starts at n * per_example elements.
  t.data = static_cast<char*>(data) +
           static_cast<size_t>(begin * shape.per_example()) * dtype_size(dtype);
  t.shape[0] = count;
  return t;
}

Tensor Tensor::reshaped(Shape s) const {
  DP_CHECK(s.numel() == shape.numel(),
           "cannot view a tensor of shape " + shape.str() + " as " + s.str());
  Tensor t = *this;
  t.shape = s;
  return t;
}

}  // namespace dp
