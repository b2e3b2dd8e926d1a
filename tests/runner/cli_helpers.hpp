#pragma once
// Helpers for the end-to-end tests of the dprun binary: run it (blocking or in the background)
// with its output captured in files, write experiment files, read the database read-only, and
// look at processes through /proc.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/os.hpp"
#include "dp/process_group.hpp"
#include "dpstore/store.hpp"
#include "support/check.hpp"
#include "sweep/scheduler.hpp"

extern char** environ;

namespace clitest {

struct Result {
  int exit_code = -1;  // -1 when killed by a signal
  int term_signal = 0;
  std::string out, err;
};

inline std::string slurp(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const std::string& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
}

/// A dprun started in the background; stdout and stderr go to files in `dir`.
class Dprun {
 public:
  /// program: what to start instead of dprun (its path), e.g. mpirun with dprun among args.
  Dprun(const std::vector<std::string>& args, const std::string& dir,
        const std::vector<std::string>& env_extra = {}, const std::string& tag = "dprun",
        bool own_process_group = false, const std::string& program = DPRUN_TEST_EXE)
      : out_file_(dir + "/" + tag + ".out"), err_file_(dir + "/" + tag + ".err") {
    std::vector<std::string> argv_s{program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The environment without any DPRUN_FAULT of our own or any variable the extras set (the
    // first of two entries would win), plus the extras.
    auto overridden = [&](const std::string& entry) {
      if (entry.rfind("DPRUN_FAULT=", 0) == 0) return true;
      const std::string name = entry.substr(0, entry.find('=') + 1);
      for (const auto& extra : env_extra)
        if (extra.rfind(name, 0) == 0) return true;
      return false;
    };
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (!overridden(*e)) env_s.push_back(*e);
    env_s.insert(env_s.end(), env_extra.begin(), env_extra.end());
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    // dprun runs in `dir`, so relative paths (results/NAME.db) land in the test's folder.
    posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Catch2 or a shell may leave SIGINT ignored or blocked; dprun must see it as a user would.
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGQUIT, SIGHUP}) sigaddset(&dfl, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &dfl);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (own_process_group) {
      // As a shell's job: kill(-pid, SIGINT) then signals it and its trial processes, like the
      // Ctrl-C of a terminal.
      posix_spawnattr_setpgroup(&attr, 0);
      flags |= POSIX_SPAWN_SETPGROUP;
    }
    posix_spawnattr_setflags(&attr, flags);
    int rc = posix_spawn(&pid_, argv_s[0].c_str(), &fa, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) pid_ = -1;
  }
  ~Dprun() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  Result wait() {
    Result r;
    if (pid_ <= 0) {
      r.err = "could not start " DPRUN_TEST_EXE;
      return r;
    }
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    waited_ = true;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
    r.out = slurp(out_file_);
    r.err = slurp(err_file_);
    return r;
  }

 private:
  std::string out_file_, err_file_;
  pid_t pid_ = -1;
  bool waited_ = false;
};

inline Result run(const std::vector<std::string>& args, const std::string& dir,
                  const std::vector<std::string>& env_extra = {}) {
  return Dprun(args, dir, env_extra).wait();
}

/// Everything the output says, for failure messages.
inline std::string describe(const Result& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.term_signal) +
         "\n--- stdout ---\n" + r.out + "--- stderr ---\n" + r.err;
}

/// Exit status checks that print the command's output on failure (and only for that check).
/// `result` is evaluated once, so it may be the call that runs dprun.
#define DPRUN_REQUIRE_EXIT(result, code)               \
  do {                                                 \
    const ::clitest::Result& dprun_result_ = (result); \
    INFO(::clitest::describe(dprun_result_));          \
    REQUIRE(dprun_result_.exit_code == (code));        \
  } while (0)
#define DPRUN_CHECK_EXIT(result, code)                 \
  do {                                                 \
    const ::clitest::Result& dprun_result_ = (result); \
    INFO(::clitest::describe(dprun_result_));          \
    CHECK(dprun_result_.exit_code == (code));          \
  } while (0)

/// For mpirun: Open MPI as root in CI containers needs consent; the shared-memory transport's
/// single-copy mode needs ptrace rights containers often lack (as for ctest's mpi_np2/np3).
inline const std::vector<std::string> kMpiEnv{"OMPI_ALLOW_RUN_AS_ROOT=1",
                                              "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                              "OMPI_MCA_btl_vader_single_copy_mechanism=none"};

/// A small, fast experiment: LeNet on 512 training / 256 test examples, batch 64, CPU.
inline std::string experiment_toml(const std::string& name, const std::string& data_dir,
                                   const std::string& gpus = "[1, 2]", int epochs = 2) {
  return "[experiment]\nname = \"" + name +
         "\"\ndescription = \"end-to-end test\"\n\n[data]\ndataset = \"fashion-mnist\"\npath = \"" +
         data_dir + "\"\n\n[train]\nmodel = \"lenet\"\nepochs = " + std::to_string(epochs) +
         "\nbatch_size = 64\nlr = 0.1\ntrain_limit = 512\ntest_limit = 256\nbackend = \"cpu\"\n\n"
         "[sweep]\ngpus = " +
         gpus + "\n";
}

/// Runs SQL on the database read-only; every value as text ("" for NULL).
inline std::vector<std::vector<std::string>> sql(const std::string& db, const std::string& q) {
  dps::Store store(db, dps::Store::Mode::read_only);
  auto r = store.query(q);
  std::vector<std::vector<std::string>> rows;
  for (const auto& row : r.rows) {
    std::vector<std::string> cells;
    for (const auto& v : row) cells.push_back(v.value_or(""));
    rows.push_back(cells);
  }
  return rows;
}

inline std::string sql1(const std::string& db, const std::string& q) {
  auto rows = sql(db, q);
  return rows.empty() || rows[0].empty() ? "" : rows[0][0];
}

/// Polls `done` until it holds or the (generous) deadline passes.
inline bool wait_until(const std::function<bool()>& done, double seconds = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

/// Waits until the database holds `count` epochs (false when the generous deadline passes): a
/// deterministic point in a running sweep, such as a trial that hangs after its first epoch.
inline bool wait_for_epochs(const std::string& db, int count) {
  return wait_until([&] {
    try {
      return sql1(db, "SELECT COUNT(*) FROM epochs") == std::to_string(count);
    } catch (const std::exception&) {
      return false;  // the database is not created yet
    }
  });
}

/// Parent pid and state letter of a process from /proc, or nullopt when it does not exist.
inline std::optional<std::pair<pid_t, char>> proc_stat(pid_t pid) {
  std::string s = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close = s.rfind(')');
  if (s.empty() || close == std::string::npos || close + 4 > s.size()) return std::nullopt;
  std::istringstream rest(s.substr(close + 2));
  char state = '?';
  pid_t ppid = 0;
  rest >> state >> ppid;
  return std::make_pair(ppid, state);
}

/// Alive: it exists and is not a zombie (a dead child not yet reaped by whoever adopted it).
inline bool process_alive(pid_t pid) {
  auto st = proc_stat(pid);
  return st && st->second != 'Z' && st->second != 'X';
}

inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::stol(name));
    auto st = proc_stat(pid);
    if (st && st->first == parent) out.push_back(pid);
  }
  return out;
}

/// Every process below `root` (children, their children, ...).
inline std::vector<pid_t> descendants_of(pid_t root) {
  std::vector<pid_t> all, frontier{root};
  while (!frontier.empty()) {
    const pid_t p = frontier.back();
    frontier.pop_back();
    for (pid_t c : children_of(p)) {
      all.push_back(c);
      frontier.push_back(c);
    }
  }
  return all;
}

/// The folder with Fashion-MNIST, or "" (the caller WARNs and returns).
inline std::string data_dir() { return dptest::fashion_mnist_dir(); }

}  // namespace clitest

/// Skips the test case (with a message) where trials at once would run one at a time.
#define DPRUN_NEED_TWO_CORES()                                                                  \
  if (dprun::affinity_cores().size() < 2) {                                                     \
    DPTEST_SKIPPED("fewer than 2 CPU cores: --jobs 2 would run one trial at a time; skipping"); \
    return;                                                                                     \
  }

/// Skips the test case (with a message) where this dprun has no MPI or mpirun is missing.
#define DPRUN_NEED_MPI()                                                                 \
  if (!dp::mpi_compiled() || dprun::find_executable("mpirun").empty()) {                 \
    DPTEST_SKIPPED(                                                                      \
        "dprun built without MPI, or no mpirun on PATH: skipping this end-to-end test"); \
    return;                                                                              \
  }

/// `var`: the folder with Fashion-MNIST; without it, the test case says so and returns.
#define DPRUN_NEED_DATA(var)                                                           \
  const std::string var = clitest::data_dir();                                         \
  if (var.empty()) {                                                                   \
    DPTEST_SKIPPED(                                                                    \
        "Fashion-MNIST not found ($DPRUN_DATA or /usr/share/datasets/fashion-mnist): " \
        "skipping this end-to-end test");                                              \
    return;                                                                            \
  }
