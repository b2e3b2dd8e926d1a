// Running a short external command (see command.hpp).
#include "base/command.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string_view>

#include "base/os.hpp"

extern char** environ;

namespace dprun {

std::string CommandOutput::failure() const {
  if (!started) return error;
  if (timed_out) return "did not finish in time (killed)";
  std::string first = err.substr(0, err.find('\n'));
  if (first.empty()) first = out.substr(0, out.find('\n'));
  std::string what = term_signal ? "killed by signal " + std::to_string(term_signal)
                                 : "exit status " + std::to_string(exit_code);
  return first.empty() ? what : what + ": " + first;
}

CommandOutput run_captured(const std::vector<std::string>& argv, double timeout_seconds,
                           const std::vector<std::string>& unset_env) {
  CommandOutput r;
  if (argv.empty()) {
    r.error = "no command";
    return r;
  }
  const std::string path = find_executable(argv[0]);
  if (path.empty()) {
    r.error = argv[0] + " is not on PATH";
    r.not_found = true;
    return r;
  }
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    r.error = std::string("pipe2: ") + std::strerror(errno);
    return r;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    r.error = std::string("pipe2: ") + std::strerror(errno);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool keep = true;
    for (const auto& u : unset_env)
      if (name == u) keep = false;
    if (keep) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, path.c_str(), &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    r.error = "cannot start " + path + ": " + std::strerror(rc);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    return r;
  }
  r.started = true;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  int fds[2] = {out_pipe[0], err_pipe[0]};
  std::string* into[2] = {&r.out, &r.err};
  while (fds[0] >= 0 || fds[1] >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p[2];
    nfds_t n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i)
      if (fds[i] >= 0) {
        p[n] = {fds[i], POLLIN, 0};
        which[n++] = i;
      }
    const int ready = ::poll(p, n, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) {
      ::kill(pid, SIGKILL);  // else the waitpid below could wait for it forever
      break;
    }
    for (nfds_t k = 0; k < n; ++k) {
      if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t got = ::read(p[k].fd, buf, sizeof buf);
      if (got > 0) {
        into[which[k]]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(p[k].fd);
        fds[which[k]] = -1;
      }
    }
  }
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  return r;
}

}  // namespace dprun
