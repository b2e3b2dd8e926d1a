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

void ChoiceCache::load() {
  if (file_.empty() || unusable_) return;
  const LockedFile f(file_, O_RDONLY, LOCK_SH);
  if (f.fd() < 0) {
    if (errno != ENOENT) warn(std::string("cannot be read (") + std::strerror(errno) + ")");
    return;
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(f.fd(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      warn(std::string("cannot be read (") + std::strerror(errno) + ")");
      return;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  std::istringstream in(text);
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
  entries_.emplace(key, value);
  if (file_.empty() || unusable_) return value;
  std::error_code ec;
  std::filesystem::create_directories(file_.parent_path(), ec);
  const LockedFile f(file_, O_RDWR | O_CREAT | O_APPEND, LOCK_EX);
  if (f.fd() < 0) {
    warn(std::string("cannot be written (") + std::strerror(errno) + ")");
    return value;
  }
  // Under the lock: a new (or emptied) file gets its header first.
  const off_t size = ::lseek(f.fd(), 0, SEEK_END);
  std::string text = size == 0 ? std::string(kHeader) + scope_ + "\n" : std::string();
  text += key + "\t" + value + "\n";
  if (!write_all(f.fd(), text)) {
    warn(std::string("cannot be written (") + std::strerror(errno) + ")");
  }
  return value;
}

std::string ChoiceCache::put(const std::string& key, const std::string& value) {
  const std::lock_guard<std::recursive_mutex> lock(mutex_);
  return put_locked(key, value);
}

std::string ChoiceCache::find_or_measure(const std::string& key,
                                         const std::function<std::string()>& measure) {
  const std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (auto known = find_locked(key)) return *known;
  return put_locked(key, measure());
}

}  // namespace dp
