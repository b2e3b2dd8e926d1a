#include "process/trial_process.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <system_error>

#include "process/launch.hpp"

extern char** environ;

namespace dprun {

// ---- signals -----------------------------------------------------------------------------------

namespace {
int g_signal_write_fd = -1;
struct sigaction g_old_int, g_old_term;

void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  if (g_signal_write_fd >= 0) {
    ssize_t ignored = ::write(g_signal_write_fd, &byte, 1);
    (void)ignored;
  }
  errno = saved;
}
}  // namespace

SignalPipe::SignalPipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::system_error(errno, std::generic_category(), "creating the signal pipe");
  read_fd_ = fds[0];
  g_signal_write_fd = fds[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking call returns EINTR and the loop looks
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

SignalPipe::~SignalPipe() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  ::close(g_signal_write_fd);
  g_signal_write_fd = -1;
  ::close(read_fd_);
}

int SignalPipe::received() {
  unsigned char buf[64];
  for (;;) {
    ssize_t n = ::read(read_fd_, buf, sizeof buf);
    if (n <= 0) break;
    if (first_ == 0) first_ = buf[0];
  }
  return first_;
}

// ---- the child process -------------------------------------------------------------------------

namespace {

void check_sys(int rc, const char* what) {
  if (rc < 0) throw std::system_error(errno, std::generic_category(), what);
}

// Moves a descriptor above the standard ones so the dup2 calls in the child cannot clobber it.
int high_fd(int fd) {
  int h = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  check_sys(h, "fcntl(F_DUPFD_CLOEXEC)");
  ::close(fd);
  return h;
}

// The environment of the runner with `overrides` (NAME=VALUE) replacing or adding entries.
std::vector<std::string> child_environment(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(overrides.begin(), overrides.end(), [&](const auto& o) {
      return o.compare(0, name.size() + 1, name + "=") == 0;
    });
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& words) {
  std::vector<char*> out;
  for (auto& w : words) out.push_back(w.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

TrialProcess::TrialProcess(const TrialRequest& request, const SpawnOptions& options)
    : options_(options) {
  const std::string spec = request_to_json(request).dump() + "\n";
  int in_pipe[2], rec_pipe[2], err_pipe[2];
  check_sys(pipe2(in_pipe, O_CLOEXEC), "pipe2");
  check_sys(pipe2(rec_pipe, O_CLOEXEC), "pipe2");
  check_sys(pipe2(err_pipe, O_CLOEXEC), "pipe2");
  for (int* p : {in_pipe, rec_pipe, err_pipe}) {
    p[0] = high_fd(p[0]);
    p[1] = high_fd(p[1]);
  }
  // Everything the child needs is prepared before fork: after fork, only async-signal-safe calls.
  std::vector<std::string> words = options_.launch;
  if (words.empty()) words = {"dprun", "__trial", "--record-fd", "3"};
  const std::string exe = launched() ? words[0] : options_.exe;
  std::vector<char*> argv = pointers(words);
  std::vector<std::string> env_words = child_environment(options_.env);
  std::vector<char*> envp = pointers(env_words);
  cpu_set_t cores;
  CPU_ZERO(&cores);
  for (int c : options_.cores) CPU_SET(c, &cores);
  const bool pin = !options_.cores.empty();
  // A launcher is asked to stop (it then ends its processes on every host) rather than killed.
  const int death_signal = launched() ? SIGTERM : SIGKILL;
  const bool launched_child = launched();
  const pid_t runner = getpid();

  pid_t pid = fork();
  check_sys(pid, "fork");
  if (pid == 0) {
    // Die with the runner, and close the race where it died before prctl took effect.
    prctl(PR_SET_PDEATHSIG, death_signal);
    if (getppid() != runner) _exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
    sigaction(SIGTERM, &dfl, nullptr);
    sigaction(SIGPIPE, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Direct: records on fd 3, all output on the other pipe. Launched: records among stdout.
    const int out_fd = launched_child ? rec_pipe[1] : err_pipe[1];
    if (dup2(in_pipe[0], 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_pipe[1], 2) < 0 ||
        (!launched_child && dup2(rec_pipe[1], 3) < 0))
      _exit(127);
    // Descriptors the runner holds without O_CLOEXEC (a database, a terminal) stay with it.
    const unsigned first_closed = launched_child ? 3 : 4;
    if (close_range(first_closed, ~0U, 0) != 0)
      for (int fd = static_cast<int>(first_closed); fd < 1024; ++fd) ::close(fd);
    if (pin && sched_setaffinity(0, sizeof cores, &cores) != 0) {
      static const char msg[] = "dprun: cannot set the trial process's CPU affinity\n";
      ssize_t ignored = ::write(2, msg, sizeof msg - 1);
      (void)ignored;
      _exit(127);
    }
    execve(exe.c_str(), argv.data(), envp.data());
    static const char msg[] = "dprun: cannot exec the trial process\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127);
  }
  pid_ = pid;
  ::close(in_pipe[0]);
  ::close(rec_pipe[1]);
  ::close(err_pipe[1]);
  record_fd_ = rec_pipe[0];
  stderr_fd_ = err_pipe[0];
  // The request is a few kilobytes at most, below the pipe's capacity: this write never waits on
  // the child. A child that died at once gives EPIPE (SIGPIPE is ignored by the runner), which
  // shows later as its exit status.
  size_t done = 0;
  while (done < spec.size()) {
    ssize_t n = ::write(in_pipe[1], spec.data() + done, spec.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(in_pipe[1]);
  fcntl(record_fd_, F_SETFL, fcntl(record_fd_, F_GETFL) | O_NONBLOCK);
  fcntl(stderr_fd_, F_SETFL, fcntl(stderr_fd_, F_GETFL) | O_NONBLOCK);
}

TrialProcess::~TrialProcess() {
  if (!reaped_ && pid_ > 0) terminate(launched() ? 5.0 : 0.0);
  if (record_fd_ >= 0) ::close(record_fd_);
  if (stderr_fd_ >= 0) ::close(stderr_fd_);
}

void TrialProcess::terminate(double grace_seconds) {
  if (reaped_ || pid_ <= 0) return;
  if (grace_seconds > 0) {
    ::kill(pid_, SIGTERM);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
    while (!try_reap() && std::chrono::steady_clock::now() < deadline) ::poll(nullptr, 0, 20);
  }
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    reap();
  }
}

std::vector<int> TrialProcess::poll_fds() const {
  std::vector<int> fds;
  if (record_fd_ >= 0) fds.push_back(record_fd_);
  if (stderr_fd_ >= 0) fds.push_back(stderr_fd_);
  return fds;
}

void TrialProcess::pump(const std::function<void(const TrialRecord&)>& on_record) {
  read_fd(record_fd_, record_buffer_, true, on_record);
  read_fd(stderr_fd_, stderr_buffer_, false, on_record);
}

void TrialProcess::read_fd(int& fd, std::string& buffer, bool records,
                           const std::function<void(const TrialRecord&)>& on_record) {
  if (fd < 0) return;
  char chunk[4096];
  for (;;) {
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      n = 0;  // treat a read error as the end of the stream
    }
    if (n == 0) {
      if (!buffer.empty()) line(buffer, records, on_record);  // an unterminated last line
      buffer.clear();
      ::close(fd);
      fd = -1;
      return;
    }
    buffer.append(chunk, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1)
      line(buffer.substr(start, nl - start), records, on_record);
    buffer.erase(0, start);
  }
}

void TrialProcess::line(const std::string& text, bool records,
                        const std::function<void(const TrialRecord&)>& on_record) {
  // A launched trial's records share its stdout with whatever else the launcher prints there.
  const std::string prefix = launched() ? kRecordPrefix : "";
  if (records && text.compare(0, prefix.size(), prefix) != 0) records = false;
  if (!records) {
    if (options_.on_output_line) options_.on_output_line(text);
    stderr_tail_.push_back(text);
    while (stderr_tail_.size() > options_.stderr_tail_lines) stderr_tail_.pop_front();
    if (failure_lines_.size() < 64 && is_failure_line(text)) failure_lines_.push_back(text);
    return;
  }
  const std::string body = text.substr(prefix.size());
  if (body.empty()) return;
  TrialRecord record;
  try {
    record = decode_record(body);
  } catch (const JsonError& e) {
    if (protocol_error_.empty())
      protocol_error_ = std::string("malformed record from the trial process (") + e.what() +
                        "): " + body.substr(0, 200);
    return;
  }
  on_record(record);
}

bool TrialProcess::try_reap() {
  if (reaped_) return true;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    wait_status_ = status;
  }
  return reaped_;
}

void TrialProcess::reap() {
  while (!reaped_) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, 0);
    if (r == pid_) {
      reaped_ = true;
      wait_status_ = status;
    } else if (r < 0 && errno != EINTR) {
      reaped_ = true;  // not our child any more (cannot happen unless SIGCHLD is ignored)
      wait_status_ = 0;
    }
  }
}

int TrialProcess::exit_code() const {
  return reaped_ && WIFEXITED(wait_status_) ? WEXITSTATUS(wait_status_) : -1;
}

int TrialProcess::term_signal() const {
  return reaped_ && WIFSIGNALED(wait_status_) ? WTERMSIG(wait_status_) : 0;
}

void TrialProcess::send(int sig) {
  if (!reaped_ && pid_ > 0) ::kill(pid_, sig);
}

}  // namespace dprun
