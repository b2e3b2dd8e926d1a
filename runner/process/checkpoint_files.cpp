// A trial's checkpoint files (see checkpoint_files.hpp).
#include "process/checkpoint_files.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dp/error.hpp"
#include "dpstore/store.hpp"

namespace dprun {

namespace fs = std::filesystem;

CheckpointMode parse_checkpoint_mode(const std::string& text) {
  if (text == "none") return CheckpointMode::none;
  if (text == "last") return CheckpointMode::last;
  if (text == "best") return CheckpointMode::best;
  if (text == "every") return CheckpointMode::every;
  throw dp::Error("checkpoint \"" + text + "\": expected none, last, best or every");
}

namespace {

fs::path db_folder(const std::string& db_path) {
  return fs::absolute(fs::path(db_path)).lexically_normal().parent_path();
}

std::string read_bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw dp::Error("cannot open " + path + ": " + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw dp::Error("cannot read " + path + ": " + std::strerror(errno));
  return bytes;
}

}  // namespace

std::string trial_checkpoint_dir(const std::string& db_path, int64_t trial_id) {
  const fs::path db = fs::path(db_path);
  return (db_folder(db_path) / (db.stem().string() + ".checkpoints") /
          ("trial-" + std::to_string(trial_id)))
      .string();
}

std::string stored_checkpoint_path(const std::string& db_path, const std::string& absolute) {
  const fs::path file = fs::path(absolute).lexically_normal();
  const fs::path relative = file.lexically_relative(db_folder(db_path));
  if (relative.empty() || *relative.begin() == "..") return file.string();
  return relative.string();
}

std::string resolve_checkpoint_path(const std::string& db_path, const std::string& stored) {
  const fs::path p(stored);
  if (p.is_absolute()) return p.string();
  return (db_folder(db_path) / p).lexically_normal().string();
}

std::string rebase_checkpoint_path(const std::string& from_db, const std::string& stored,
                                   const std::string& to_db) {
  const fs::path file(resolve_checkpoint_path(from_db, stored));
  const fs::path relative = file.lexically_relative(db_folder(to_db));
  int up = 0;
  for (const auto& part : relative) up += part == "..";
  if (relative.empty() || up > 2) return file.string();
  return relative.string();
}

std::string read_checkpoint_file(const std::string& path) { return read_bytes_of(path); }

std::string checkpoint_file_sha256(const std::string& path) {
  return dps::sha256_hex(read_bytes_of(path));
}

}  // namespace dprun
