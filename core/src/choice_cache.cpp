#include "dp/choice_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>

#include "dp/error.hpp"

namespace dp {

namespace {

constexpr const char* kHeader = "# dprun choices v1\t";

// FNV-1a, 64 bits: a stable file name for a scope (std::hash may differ between builds).
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool plain(const std::string& s) { return s.find_first_of("\t\n\r") == std::string::npos; }

// An open file descriptor with a flock held; both released on destruction.
class LockedFile {
 public:
  LockedFile(const std::filesystem::path& path, int flags, int lock) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    while (::flock(fd_, lock) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        fd_ = -1;
        return;
      }
    }
  }
  ~LockedFile() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

ChoiceCache::ChoiceCache(std::string scope, std::filesystem::path dir) : scope_(std::move(scope)) {
  DP_CHECK(plain(scope_), "ChoiceCache: the scope must not contain tabs or line breaks");
  if (!dir.empty()) {
    char name[32];
    std::snprintf(name, sizeof name, "choices-%016llx.tsv",
                  static_cast<unsigned long long>(fnv1a(scope_)));
    file_ = dir / name;
  }
}

std::filesystem::path ChoiceCache::default_dir() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  const std::string explicit_dir = env("DPRUN_CACHE_DIR");
  if (explicit_dir == "none") return {};
  if (!explicit_dir.empty()) return explicit_dir;
  if (!env("XDG_CACHE_HOME").empty()) return std::filesystem::path(env("XDG_CACHE_HOME")) / "dprun";
  if (!env("HOME").empty()) return std::filesystem::path(env("HOME")) / ".cache" / "dprun";
  return {};
}

ChoiceCache& ChoiceCache::shared(const std::string& scope) {
  static std::mutex registry_mutex;
  static std::map<std::string, std::unique_ptr<ChoiceCache>> registry;
  const std::lock_guard<std::mutex> lock(registry_mutex);
  auto& slot = registry[scope];
  if (!slot) slot = std::make_unique<ChoiceCache>(scope, default_dir());
  return *slot;
}

void ChoiceCache::warn(const std::string& message) {
  if (warned_) return;
  warned_ = true;
  std::fprintf(stderr, "dprun: warning: choice cache %s: %s; measuring instead\n",
               file_.string().c_str(), message.c_str());
}

// Reads the whole file through `fd` (from its start).
bool read_all(int fd, std::string& text) {
  text.clear();
  char buf[65536];
  off_t at = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    text.append(buf, static_cast<size_t>(n));
    at += n;
  }
}

void ChoiceCache::parse(const std::string& text) {
  // Only complete lines: a last line without its newline is a write still going on (or one
  // that failed halfway) and is not read.
  const size_t complete = text.rfind('\n');
  if (complete == std::string::npos) return;
  std::istringstream in(text.substr(0, complete + 1));
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (number == 1) {
      if (line != kHeader + scope_) {
        unusable_ = true;
        warn("its first line is not \"" + std::string(kHeader) + scope_ +
             "\" (another scope or not a dprun cache); it is left alone");
        return;
      }
      continue;
    }
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || tab == 0 || line.find('\t', tab + 1) != std::string::npos) {
      // A torn or foreign line: said once, and its key (if any) is measured again.
      warn("line " + std::to_string(number) + " is not \"<key><TAB><value>\"");
      continue;
    }
    entries_.emplace(line.substr(0, tab), line.substr(tab + 1));  // the first line of a key wins
  }
}

void ChoiceCache::load() {
  if (file_.empty() || unusable_) return;
  const LockedFile f(file_, O_RDONLY, LOCK_SH);
  std::string text;
  if (f.fd() < 0 || !read_all(f.fd(), text)) {
    if (errno != ENOENT) warn(std::string("cannot be read (") + std::strerror(errno) + ")");
    return;
  }
  parse(text);
}

std::optional<std::string> ChoiceCache::find_locked(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    load();  // another process may have recorded it since
    it = entries_.find(key);
  }
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> ChoiceCache::find(const std::string& key) {
  const std::lock_guard<std::recursive_mutex> lock(mutex_);
  return find_locked(key);
}

std::string ChoiceCache::put_locked(const std::string& key, const std::string& value) {
  DP_CHECK(!key.empty() && plain(key) && plain(value),
           "ChoiceCache: a key must be non-empty, and neither key nor value may contain tabs or "
           "line breaks: '" +
               key + "'");
  if (auto known = find_locked(key)) return *known;
  if (file_.empty() || unusable_) return entries_.emplace(key, value).first->second;
  std::error_code ec;
  std::filesystem::create_directories(file_.parent_path(), ec);
  const LockedFile f(file_, O_RDWR | O_CREAT | O_APPEND, LOCK_EX);
  std::string text;
  if (f.fd() < 0 || !read_all(f.fd(), text)) {
    warn(std::string("cannot be written (") + std::strerror(errno) + ")");
    return entries_.emplace(key, value).first->second;
  }
  // Under the exclusive lock, what others appended since this process last read: a writer that
  // measured the same key first wins, so every trial ends up with one value.
  parse(text);
  if (unusable_) return entries_.emplace(key, value).first->second;
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  std::string line = text.empty() ? std::string(kHeader) + scope_ + "\n" : std::string();
  // A torn last line (a write cut short) is closed so that it cannot parse as an entry (two
  // tabs): readers report and skip it rather than trust half a value.
  if (!text.empty() && text.back() != '\n') line += "\t\t(torn)\n";
  line += key + "\t" + value + "\n";
  if (!write_all(f.fd(), line)) {
    warn(std::string("cannot be written (") + std::strerror(errno) + ")");
    if (::ftruncate(f.fd(), static_cast<off_t>(text.size())) != 0) {
      // The torn tail stays; readers skip it (it has no newline) until the next append closes it.
    }
  }
  return entries_.emplace(key, value).first->second;
}

std::string ChoiceCache::put(const std::string& key, const std::string& value) {
  const std::lock_guard<std::recursive_mutex> lock(mutex_);
  return put_locked(key, value);
}

std::string ChoiceCache::find_or_measure(const std::string& key,
                                         const std::function<std::string()>& measure) {
  const std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (auto known = find_locked(key)) return *known;
  const std::string value = measure();
  if (value.empty()) return value;  // nothing to keep: measured again next time
  return put_locked(key, value);
}

}  // namespace dp
