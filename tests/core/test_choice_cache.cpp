// The on-disk cache of measured choices (core/src/choice_cache.hpp), which the cuda backend keeps
// its timed cuDNN algorithms in: what one cache records another finds, scopes do not mix, writers
// running at once lose nothing, and a broken or foreign file is reported and never fatal.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dp/choice_cache.hpp"
#include "support/check.hpp"

namespace fs = std::filesystem;

// The project's temporary folder, seen as a path.
struct TempDir {
  dptest::TempDir dir;
  fs::path path{dir.path()};
};

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What `f` writes to stderr (file descriptor 2).
template <typename F>
std::string stderr_of(F&& f) {
  std::fflush(stderr);
  char name[] = "/tmp/dprun-stderr-XXXXXX";
  const int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  const std::string text = read(name);
  ::unlink(name);
  return text;
}

// Sets an environment variable for a scope, restoring it afterwards.
struct ScopedEnv {
  std::string name;
  bool had;
  std::string old;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* v = std::getenv(n);
    had = v != nullptr;
    if (had) old = v;
    if (value != nullptr) {
      ::setenv(n, value, 1);
    } else {
      ::unsetenv(n);
    }
  }
  ~ScopedEnv() {
    if (had) {
      ::setenv(name.c_str(), old.c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
};

}  // namespace

TEST_CASE("choice cache: what one run records the next finds, per scope", "[cache]") {
  TempDir dir;
  const std::string scope = "cuDNN 91900, CUDA 13000, NVIDIA H100 80GB HBM3 sm_90";
  {
    dp::ChoiceCache cache(scope, dir.path);
    CHECK_FALSE(cache.find("fwd conv 64->64").has_value());
    CHECK(cache.put("fwd conv 64->64", "algo 1 fma 0") == "algo 1 fma 0");
    CHECK(cache.find("fwd conv 64->64") == std::optional<std::string>("algo 1 fma 0"));
  }
  dp::ChoiceCache next(scope, dir.path);  // a later run
  CHECK(next.find("fwd conv 64->64") == std::optional<std::string>("algo 1 fma 0"));
  CHECK(read(next.file()).rfind("# dprun choices v1\t" + scope + "\n", 0) == 0);
  // The first value of a key stays: a second measurement does not replace it.
  CHECK(next.put("fwd conv 64->64", "algo 6 fma 0") == "algo 1 fma 0");
  // Another scope (another cuDNN) is another file and sees nothing of this one.
  dp::ChoiceCache other("cuDNN 92000, CUDA 13000, NVIDIA H100 80GB HBM3 sm_90", dir.path);
  CHECK(other.file() != next.file());
  CHECK_FALSE(other.find("fwd conv 64->64").has_value());
  // Keys and values are single tab-free lines.
  CHECK_THROWS_WITH(next.put("a\tb", "x"), Catch::Contains("tabs or line breaks"));
  CHECK_THROWS_WITH(next.put("a", "x\ny"), Catch::Contains("tabs or line breaks"));
}

TEST_CASE("choice cache: writers at once lose nothing and measure a key once", "[cache]") {
  TempDir dir;
  const std::string scope = "test scope";
  SECTION("separate caches on one file (like the trials of a sweep) append under a lock") {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        dp::ChoiceCache cache(scope, dir.path);
        for (int i = 0; i < 50; ++i)
          cache.put("key " + std::to_string(t) + "." + std::to_string(i), std::to_string(i));
      });
    }
    for (auto& th : threads) th.join();
    dp::ChoiceCache reader(scope, dir.path);
    for (int t = 0; t < 4; ++t)
      for (int i = 0; i < 50; ++i)
        CHECK(reader.find("key " + std::to_string(t) + "." + std::to_string(i)) ==
              std::optional<std::string>(std::to_string(i)));
    // One header, 200 lines.
    const std::string text = read(reader.file());
    CHECK(std::count(text.begin(), text.end(), '\n') == 201);
  }
  SECTION("separate caches measuring one key at once all end with the first value recorded") {
    std::vector<std::string> got(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        dp::ChoiceCache cache(scope, dir.path);
        got[static_cast<size_t>(t)] =
            cache.find_or_measure("same key", [t] { return "value " + std::to_string(t); });
      });
    }
    for (auto& th : threads) th.join();
    for (const auto& g : got) CHECK(g == got[0]);
    CHECK(dp::ChoiceCache(scope, dir.path).find("same key") == std::optional<std::string>(got[0]));
  }
  SECTION("an empty measurement is returned but not kept") {
    dp::ChoiceCache cache(scope, dir.path);
    CHECK(cache.find_or_measure("k", [] { return std::string(); }).empty());
    CHECK_FALSE(cache.find("k").has_value());
    CHECK(cache.find_or_measure("k", [] { return std::string("v"); }) == "v");
  }
  SECTION("threads sharing one cache (replicas) measure once and agree") {
    dp::ChoiceCache cache(scope, dir.path);
    std::atomic<int> measured{0};
    std::vector<std::string> got(8);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        got[static_cast<size_t>(t)] = cache.find_or_measure(
            "bwd-filter conv", [&] { return "algo " + std::to_string(measured.fetch_add(1)); });
      });
    }
    for (auto& th : threads) th.join();
    CHECK(measured == 1);
    for (const auto& g : got) CHECK(g == "algo 0");
  }
}

TEST_CASE("choice cache: a broken, foreign or unwritable file is reported, never fatal",
          "[cache]") {
  TempDir dir;
  const std::string scope = "test scope";
  SECTION("a torn line is skipped with a warning; the other lines still count") {
    {
      dp::ChoiceCache cache(scope, dir.path);
      cache.put("good", "1");
    }
    {
      std::ofstream out(dp::ChoiceCache(scope, dir.path).file(), std::ios::app);
      out << "torn line without a tab\n";
    }
    dp::ChoiceCache cache(scope, dir.path);
    std::optional<std::string> good;
    const std::string err = stderr_of([&] { good = cache.find("good"); });
    CHECK(good == std::optional<std::string>("1"));
    CHECK_THAT(err, Catch::Contains("line 3 is not") && Catch::Contains(cache.file().string()) &&
                        Catch::Contains("measuring instead"));
    CHECK(cache.find_or_measure("new", [] { return std::string("2"); }) == "2");
    CHECK(dp::ChoiceCache(scope, dir.path).find("new") == std::optional<std::string>("2"));
  }
  SECTION("a last line without its newline (a write cut short) is never read as an entry") {
    {
      dp::ChoiceCache cache(scope, dir.path);
      cache.put("good", "1");
    }
    {
      std::ofstream out(dp::ChoiceCache(scope, dir.path).file(), std::ios::app);
      out << "cut\tsho";
    }
    dp::ChoiceCache cache(scope, dir.path);
    CHECK(stderr_of([&] { CHECK_FALSE(cache.find("cut").has_value()); }).empty());
    CHECK(cache.put("next", "2") == "2");
    const std::string err = stderr_of([&] {
      dp::ChoiceCache reader(scope, dir.path);
      CHECK(reader.find("next") == std::optional<std::string>("2"));
      CHECK_FALSE(reader.find("cut").has_value());  // closed as a line that does not parse
    });
    CHECK_THAT(err, Catch::Contains("line 3 is not"));
  }
  SECTION("a file of another scope is left alone") {
    dp::ChoiceCache cache(scope, dir.path);
    fs::create_directories(dir.path);
    { std::ofstream(cache.file()) << "something else entirely\nk\tv\n"; }
    const std::string before = read(cache.file());
    std::string err = stderr_of([&] {
      CHECK_FALSE(cache.find("k").has_value());
      CHECK(cache.put("k", "mine") == "mine");
    });
    CHECK_THAT(
        err, Catch::Contains("is not \"# dprun choices v1") && Catch::Contains("it is left alone"));
    CHECK(read(cache.file()) == before);
    CHECK(cache.find("k") == std::optional<std::string>("mine"));  // in memory only
  }
  SECTION("a folder that cannot be made keeps the choices in memory") {
    const fs::path blocker = dir.path / "a-file";
    { std::ofstream(blocker) << "x"; }
    dp::ChoiceCache cache(scope, blocker / "sub");
    std::string err = stderr_of([&] { CHECK(cache.put("k", "v") == "v"); });
    // Said once per file: here the first attempt, to read it, already fails.
    CHECK_THAT(err, Catch::Contains("cannot be read") && Catch::Contains("measuring instead"));
    CHECK(cache.find("k") == std::optional<std::string>("v"));
  }
  SECTION("no folder: memory only, silently by request") {
    dp::ChoiceCache cache(scope, {});
    CHECK(cache.file().empty());
    CHECK(stderr_of([&] { cache.put("k", "v"); }).empty());
    CHECK(cache.find("k") == std::optional<std::string>("v"));
  }
}

TEST_CASE("choice cache: where it lives", "[cache]") {
  ScopedEnv xdg("XDG_CACHE_HOME", "/somewhere/cache");
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv d("DPRUN_CACHE_DIR", nullptr);
    CHECK(dp::ChoiceCache::default_dir() == fs::path("/somewhere/cache/dprun"));
    ScopedEnv no_xdg("XDG_CACHE_HOME", nullptr);
    CHECK(dp::ChoiceCache::default_dir() == fs::path("/home/someone/.cache/dprun"));
    ScopedEnv no_home("HOME", nullptr);
    CHECK(dp::ChoiceCache::default_dir().empty());
  }
  ScopedEnv d("DPRUN_CACHE_DIR", "/scratch/dprun-cache");
  CHECK(dp::ChoiceCache::default_dir() == fs::path("/scratch/dprun-cache"));
  ScopedEnv none("DPRUN_CACHE_DIR", "none");
  CHECK(dp::ChoiceCache::default_dir().empty());
}
