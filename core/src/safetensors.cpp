// safetensors reading and writing. The header is JSON (nlohmann-json: a well-kept parser is
// worth more here than one of ours); tensors are stored little-endian, in name order, each
// starting where the previous ended, and the header is padded with spaces to 8 bytes as the
// format recommends (aligned reads for whoever maps the file).
#include "dp/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "dp/error.hpp"

namespace dp {

namespace {

static_assert(sizeof(float) == 4 && sizeof(int64_t) == 8);

using Type = SafeTensor::Type;
constexpr Type kTypes[] = {Type::f32, Type::i64, Type::i32, Type::i16, Type::u16, Type::u8};

size_t element_bytes(Type t) {
  switch (t) {
    case Type::f32:
    case Type::i32:
      return 4;
    case Type::i64:
      return 8;
    case Type::i16:
    case Type::u16:
      return 2;
    default:
      return 1;
  }
}

// How many values the tensor's storage holds (its numel when it is consistent).
size_t stored_count(const SafeTensor& t) {
  if (t.type == Type::f32) return t.f32.size();
  if (t.type == Type::u8) return t.u8.size();
  return t.i64.size();
}

// The bytes of a tensor whose values are widened to i64 in memory, narrowed to its dtype;
// a value out of the dtype's range is an error naming it (never silently wrapped).
template <typename T>
void append_narrowed(std::string& out, const std::string& name, const SafeTensor& t) {
  for (size_t i = 0; i < t.i64.size(); ++i) {
    const int64_t v = t.i64[i];
    if (v < int64_t{std::numeric_limits<T>::min()} || v > int64_t{std::numeric_limits<T>::max()})
      throw Error("safetensors: tensor " + name + " value #" + std::to_string(i) + " (" +
                  std::to_string(v) + ") does not fit its dtype " + safetensors_dtype(t.type));
    const T narrow = static_cast<T>(v);
    out.append(reinterpret_cast<const char*>(&narrow), sizeof narrow);
  }
}

template <typename T>
void widen_into(std::vector<int64_t>& to, const char* from, size_t count) {
  to.resize(count);
  for (size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, from + i * sizeof(T), sizeof(T));
    to[i] = v;
  }
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error("safetensors file " + path + ": " + what);
}

}  // namespace

const char* safetensors_dtype(SafeTensor::Type type) {
  switch (type) {
    case Type::f32:
      return "F32";
    case Type::i64:
      return "I64";
    case Type::i32:
      return "I32";
    case Type::i16:
      return "I16";
    case Type::u16:
      return "U16";
    default:
      return "U8";
  }
}

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string encode_safetensors(const SafeTensorsFile& file) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    const size_t count = stored_count(t);
    if (static_cast<int64_t>(count) != t.numel()) {
      throw Error("safetensors: tensor " + name + " has " + std::to_string(count) +
                  " values for its shape of " + std::to_string(t.numel()));
    }
    const uint64_t bytes = count * element_bytes(t.type);
    header[name] = {{"dtype", safetensors_dtype(t.type)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();
  std::string out;
  out.reserve(8 + length + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(length >> (8 * i)));
  out += text;
  // x86-64 and aarch64 are little-endian: the values' bytes are the format's.
  for (const auto& [name, t] : file.tensors) {
    switch (t.type) {
      case Type::f32:
        out.append(reinterpret_cast<const char*>(t.f32.data()), t.f32.size() * 4);
        break;
      case Type::i64:
        out.append(reinterpret_cast<const char*>(t.i64.data()), t.i64.size() * 8);
        break;
      case Type::u8:
        out.append(reinterpret_cast<const char*>(t.u8.data()), t.u8.size());
        break;
      case Type::i32:
        append_narrowed<int32_t>(out, name, t);
        break;
      case Type::i16:
        append_narrowed<int16_t>(out, name, t);
        break;
      case Type::u16:
        append_narrowed<uint16_t>(out, name, t);
        break;
    }
  }
  return out;
}

void write_bytes_atomically(const std::string& path, const std::string& bytes) {
  const std::filesystem::path target(path);
  // Built step by step: GCC 12 warns falsely on "." + std::string (-Wrestrict).
  std::string tmp_name = ".";
  tmp_name += target.filename().string();
  tmp_name += ".tmp";
  tmp_name += std::to_string(getpid());
  const std::filesystem::path tmp = target.parent_path() / tmp_name;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write " + tmp.string() + ": " + std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw Error("cannot write " + tmp.string() + " (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error("cannot move " + tmp.string() + " into place at " + path + ": " + ec.message());
  }
}

void write_safetensors(const std::string& path, const SafeTensorsFile& file) {
  write_bytes_atomically(path, encode_safetensors(file));
}

SafeTensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) bad(path, "is a folder, expected a file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) bad(path, std::string("cannot open it: ") + std::strerror(errno));
  // One read of the known size: datasets in this format run to hundreds of megabytes.
  const std::streamoff size = in.tellg();
  std::string bytes(static_cast<size_t>(std::max<std::streamoff>(size, 0)), '\0');
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.gcount() != static_cast<std::streamsize>(bytes.size()))
    bad(path, std::string("cannot read it: ") + std::strerror(errno));
  return decode_safetensors(bytes, path);
}

namespace {

std::string known_dtypes() {
  std::string out;
  for (Type t : kTypes) out += std::string(out.empty() ? "" : ", ") + safetensors_dtype(t);
  return out;
}

// The numel of a header's shape; an error for a negative dimension or one whose product does
// not fit (a damaged header must not overflow into a small, plausible size).
int64_t checked_numel(const std::string& path, const std::string& name,
                      const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) bad(path, "tensor " + name + " has a negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 8 / d)
      bad(path, "tensor " + name + " has a shape too large for any file");
    n *= d;
  }
  return n;
}

// One tensor of the header, its values copied out of `bytes` (data_start: where the tensors'
// bytes begin in the file; data_bytes: how many there are).
SafeTensor decode_tensor(const std::string& path, const std::string& name,
                         const nlohmann::json& entry, std::string_view bytes, uint64_t data_start,
                         uint64_t data_bytes) {
  const std::string dtype = entry.at("dtype").get<std::string>();
  SafeTensor t;
  bool known = false;
  for (Type type : kTypes) {
    if (dtype == safetensors_dtype(type)) {
      t.type = type;
      known = true;
    }
  }
  if (!known)
    bad(path, "tensor " + name + " has dtype " + dtype + "; dprun reads " + known_dtypes());
  t.shape = entry.at("shape").get<std::vector<int64_t>>();
  const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
  if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_bytes) {
    bad(path, "tensor " + name + " has data_offsets outside the file's data (its " +
                  std::to_string(data_bytes) + " bytes from offset " + std::to_string(data_start) +
                  "; truncated?)");
  }
  const auto count = static_cast<uint64_t>(checked_numel(path, name, t.shape));
  const uint64_t tensor_bytes = offsets[1] - offsets[0];
  t.file_offset = data_start + offsets[0];
  if (tensor_bytes != count * element_bytes(t.type)) {
    bad(path, "tensor " + name + " (offset " + std::to_string(t.file_offset) +
                  "): " + std::to_string(tensor_bytes) + " bytes for its shape of " +
                  std::to_string(count) + " " + dtype + " values (" +
                  std::to_string(count * element_bytes(t.type)) + " bytes)");
  }
  const char* from = bytes.data() + t.file_offset;
  const auto n = static_cast<size_t>(count);
  // An empty tensor (a zero in its shape) copies nothing: memcpy must not see its null data().
  switch (t.type) {
    case Type::f32:
      t.f32.resize(n);
      if (n > 0) std::memcpy(t.f32.data(), from, tensor_bytes);
      break;
    case Type::i64:
      t.i64.resize(n);
      if (n > 0) std::memcpy(t.i64.data(), from, tensor_bytes);
      break;
    case Type::u8:
      t.u8.assign(from, from + n);
      break;
    case Type::i32:
      widen_into<int32_t>(t.i64, from, n);
      break;
    case Type::i16:
      widen_into<int16_t>(t.i64, from, n);
      break;
    case Type::u16:
      widen_into<uint16_t>(t.i64, from, n);
      break;
  }
  return t;
}

}  // namespace

SafeTensorsFile decode_safetensors(std::string_view bytes, const std::string& path) {
  const uint64_t size = bytes.size();
  if (size < 8)
    bad(path, "shorter than its 8-byte header length (" + std::to_string(size) + " bytes)");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)]))
              << (8 * i);
  if (length > size - 8) {
    bad(path, "its header (offset 8) says " + std::to_string(length) + " bytes, the file has " +
                  std::to_string(size - 8) + " after the length (truncated?)");
  }
  const std::string text(bytes.substr(8, static_cast<size_t>(length)));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("its header (offset 8) is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) bad(path, "its header (offset 8) is not a JSON object");
  const uint64_t data_start = 8 + length;
  const uint64_t data_bytes = size - data_start;
  SafeTensorsFile out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad(path, "__metadata__ is not an object of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) bad(path, "__metadata__." + key + " is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    try {
      SafeTensor t = decode_tensor(path, name, entry, bytes, data_start, data_bytes);
      ranges.emplace_back(t.file_offset - data_start,
                          t.file_offset - data_start + t.numel() * element_bytes(t.type));
      out.tensors[name] = std::move(t);
    } catch (const nlohmann::json::exception& e) {
      bad(path, "tensor " + name + " has a malformed entry (" + e.what() + ")");
    }
  }
  // The format requires the byte ranges to cover the data exactly, without holes or overlap.
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != at)
      bad(path, "the tensors' byte ranges leave a hole or overlap at offset " +
                    std::to_string(data_start + at));
    at = end;
  }
  if (at != data_bytes) {
    bad(path, "the tensors cover " + std::to_string(at) + " of its " + std::to_string(data_bytes) +
                  " data bytes (from offset " + std::to_string(data_start) + ")");
  }
  return out;
}

}  // namespace dp
