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
#include <nlohmann/json.hpp>

#include "dp/error.hpp"

namespace dp {

namespace {

static_assert(sizeof(float) == 4 && sizeof(int64_t) == 8);

const char* dtype_text(SafeTensor::Type t) { return t == SafeTensor::Type::f32 ? "F32" : "I64"; }

size_t element_bytes(SafeTensor::Type t) { return t == SafeTensor::Type::f32 ? 4 : 8; }

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error("safetensors file " + path + ": " + what);
}

}  // namespace

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string encode_safetensors(const SafeTensorsFile& file) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    const size_t count = t.type == SafeTensor::Type::f32 ? t.f32.size() : t.i64.size();
    if (static_cast<int64_t>(count) != t.numel()) {
      throw Error("safetensors: tensor " + name + " has " + std::to_string(count) +
                  " values for its shape of " + std::to_string(t.numel()));
    }
    const uint64_t bytes = count * element_bytes(t.type);
    header[name] = {{"dtype", dtype_text(t.type)},
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
    if (t.type == SafeTensor::Type::f32) {
      out.append(reinterpret_cast<const char*>(t.f32.data()), t.f32.size() * 4);
    } else {
      out.append(reinterpret_cast<const char*>(t.i64.data()), t.i64.size() * 8);
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
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, std::string("cannot open it: ") + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) bad(path, std::string("cannot read it: ") + std::strerror(errno));
  return decode_safetensors(bytes, path);
}

SafeTensorsFile decode_safetensors(const std::string& bytes, const std::string& path) {
  const uint64_t size = bytes.size();
  if (size < 8) bad(path, "shorter than its 8-byte header length");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)]))
              << (8 * i);
  if (length > size - 8) {
    bad(path, "its header says " + std::to_string(length) + " bytes, the file has " +
                  std::to_string(size - 8) + " after the length (truncated?)");
  }
  const std::string text = bytes.substr(8, static_cast<size_t>(length));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("its header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) bad(path, "its header is not a JSON object");
  const uint64_t data_bytes = size - 8 - length;
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
      const std::string dtype = entry.at("dtype").get<std::string>();
      SafeTensor t;
      if (dtype == "F32") {
        t.type = SafeTensor::Type::f32;
      } else if (dtype == "I64") {
        t.type = SafeTensor::Type::i64;
      } else {
        bad(path, "tensor " + name + " has dtype " + dtype + "; dprun reads F32 and I64");
      }
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_bytes) {
        bad(path, "tensor " + name + " has data_offsets outside the file's data");
      }
      for (int64_t d : t.shape)
        if (d < 0) bad(path, "tensor " + name + " has a negative dimension");
      const uint64_t tensor_bytes = offsets[1] - offsets[0];
      if (tensor_bytes != static_cast<uint64_t>(t.numel()) * element_bytes(t.type)) {
        bad(path, "tensor " + name + ": " + std::to_string(tensor_bytes) +
                      " bytes for its shape of " +
                      std::to_string(t.numel()) + " " + dtype + " values");
      }
      const char* from = bytes.data() + 8 + length + offsets[0];
      if (t.type == SafeTensor::Type::f32) {
        t.f32.resize(static_cast<size_t>(t.numel()));
        std::memcpy(t.f32.data(), from, tensor_bytes);
      } else {
        t.i64.resize(static_cast<size_t>(t.numel()));
        std::memcpy(t.i64.data(), from, tensor_bytes);
      }
      ranges.emplace_back(offsets[0], offsets[1]);
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
      bad(path, "the tensors' byte ranges leave a hole or overlap at byte " + std::to_string(at));
    at = end;
  }
  if (at != data_bytes) {
    bad(path, "the tensors cover " + std::to_string(at) + " of its " + std::to_string(data_bytes) +
                  " data bytes");
  }
  return out;
}

}  // namespace dp
