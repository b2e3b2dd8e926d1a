#pragma once
// Reading a dataset file whole, gunzipped when it is gzip: shared by the IDX reader (data.cpp)
// and the CIFAR-10 reader (data_cifar10.cpp), so both say the same things about a bad file.
#include <cstdint>
#include <string>
#include <vector>

namespace dp::detail {

struct FileBytes {
  std::vector<uint8_t> bytes;
  bool gzip = false;
};

/// The content of `file`. Throws dp::Error naming it when it is missing, a folder (the message
/// says `expected`, e.g. "an IDX file"), unreadable, or a damaged gzip stream.
FileBytes read_file_bytes(const std::string& file, const char* expected = "an IDX file");

/// "N bytes" or "N bytes after gunzip", for messages about a file's size.
std::string size_note(const FileBytes& f);

}  // namespace dp::detail
