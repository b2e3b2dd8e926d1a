#pragma once
// safetensors files (the format of Hugging Face's safetensors, which PyTorch loads with
// safetensors.torch.load_file): an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, free-form string metadata under "__metadata__",
// then the tensors' bytes. dprun writes its checkpoints in it so a trained model leaves dprun
// for PyTorch without conversion.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dp {

struct SafeTensor {
  /// The dtypes dprun reads and writes: F32 (parameters), I64 (counters), and U8 with the
  /// smaller integers for datasets (images as bytes, labels as any integer type).
  enum class Type { f32, i64, i32, i16, u16, u8 };
  Type type = Type::f32;
  std::vector<int64_t> shape;  // empty: a scalar
  std::vector<float> f32;      // type f32: numel values
  std::vector<int64_t> i64;    // types i64, i32, i16, u16: numel values, widened to 64 bits
  std::vector<uint8_t> u8;     // type u8: numel values (kept as bytes: images are large)
  /// Read from a file: the byte offset of its first value in that file (after the 8-byte
  /// length and the header), so messages about one value can say where it is. 0 otherwise.
  uint64_t file_offset = 0;
  int64_t numel() const;
};

/// The format's name of a dtype: "F32", "I64", "I32", "I16", "U16", "U8".
const char* safetensors_dtype(SafeTensor::Type type);

struct SafeTensorsFile {
  std::map<std::string, SafeTensor> tensors;    // written in name order
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

/// Writes the file atomically (a temporary file in the same folder, then rename), so a crash
/// never leaves a half-written checkpoint under the final name. Throws dp::Error naming the
/// path on failure.
void write_safetensors(const std::string& path, const SafeTensorsFile& file);
/// Reads a file written by write_safetensors (or any safetensors file of F32, I64, I32, I16, U16
/// and U8 tensors). Throws dp::Error naming the path and what is wrong (truncated, bad header,
/// unsupported dtype, byte ranges that do not tile the data), with the byte offset where it is
/// about a tensor's bytes.
SafeTensorsFile read_safetensors(const std::string& path);

/// The file's bytes, as write_safetensors writes them (for hashing, or sending to another
/// process before anything touches the disk).
std::string encode_safetensors(const SafeTensorsFile& file);
/// Reads the bytes of a safetensors file; `name` (a path, or where the bytes came from) is what
/// the error messages say. Throws dp::Error as read_safetensors does.
SafeTensorsFile decode_safetensors(std::string_view bytes, const std::string& name);
/// Writes bytes to path atomically (a temporary file in the same folder, then rename).
void write_bytes_atomically(const std::string& path, const std::string& bytes);

}  // namespace dp
