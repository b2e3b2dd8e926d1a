#pragma once
// Measured choices kept on disk (cuDNN's convolution algorithms, chosen by timing them), so that
// the next run on the same device and libraries starts without measuring again.
//
// One text file per scope, the scope naming everything the choices depend on ("cuDNN 91900,
// CUDA runtime 13000, NVIDIA H100 80GB HBM3 sm_90"): a new library or device is a new scope, so
// a stale choice is never read (the driver is not part of it: a cached algorithm is validated
// again before use). The file starts with the line "# dprun choices v1<TAB><scope>"
// and then holds one "<key><TAB><value>" per line. Lines are appended under an exclusive lock
// (flock), so the trials of a sweep running at once can share one file; the first line of a key
// wins. Where it lives: $DPRUN_CACHE_DIR, else $XDG_CACHE_HOME/dprun, else $HOME/.cache/dprun;
// DPRUN_CACHE_DIR=none keeps the choices in memory only.
//
// A cache is a speed-up, never a reason to fail: a file that cannot be read or written, a line
// that does not parse, or a file of another scope is reported on stderr (once per file) and the
// choice is measured again.
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace dp {

class ChoiceCache {
 public:
  /// The cache of `scope` in folder `dir` (empty: memory only). The folder is created on the
  /// first write.
  ChoiceCache(std::string scope, std::filesystem::path dir);

  /// The value recorded for `key` (in this process or in the file), if any.
  std::optional<std::string> find(const std::string& key);
  /// Records `value` for `key`, in memory and appended to the file. A key already recorded keeps
  /// its first value (returned); keys and values must not contain tabs or line breaks.
  std::string put(const std::string& key, const std::string& value);
  /// find(key), else measure() and put its result; under one lock per cache, so threads asking
  /// for the same key (the replicas of a trial setting up at once) measure once and all get the
  /// same answer. An empty result is returned but not kept (a passing failure is measured again
  /// next time). Under an exclusive file lock the file is read again before appending, so when
  /// two processes measured the same key, both end up with the first one recorded.
  std::string find_or_measure(const std::string& key, const std::function<std::string()>& measure);

  const std::string& scope() const { return scope_; }
  /// The file (empty for a memory-only cache).
  const std::filesystem::path& file() const { return file_; }

  /// $DPRUN_CACHE_DIR (none: empty), else $XDG_CACHE_HOME/dprun, else $HOME/.cache/dprun, else
  /// empty.
  static std::filesystem::path default_dir();
  /// The process-wide cache of `scope` in default_dir().
  static ChoiceCache& shared(const std::string& scope);

 private:
  void load();  // reads the file's lines into entries_ (under a shared lock)
  void parse(const std::string& text);  // its complete lines into entries_
  void warn(const std::string& message);
  std::optional<std::string> find_locked(const std::string& key);
  std::string put_locked(const std::string& key, const std::string& value);

  std::string scope_;
  std::filesystem::path file_;
  std::map<std::string, std::string> entries_;
  bool unusable_ = false;  // the file is of another scope or cannot be read: memory only
  bool warned_ = false;
  std::recursive_mutex mutex_;
};

}  // namespace dp
