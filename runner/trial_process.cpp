#include "trial_process.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <stdexcept>
#include <system_error>

namespace dprun {

// ---- request ---------------------------------------------------------------------------------

Json model_options_to_json(const dp::ModelOptions& options) {
  Json o = Json::object();
  for (const auto& [name, value] : options) {
    if (const auto* b = std::get_if<bool>(&value)) {
      o.set(name, Json::boolean(*b));
    } else if (const auto* i = std::get_if<int64_t>(&value)) {
      o.set(name, Json::integer(*i));
    } else if (const auto* d = std::get_if<double>(&value)) {
      // A float option must stay a float: "1" would come back as an int.
      Json n = Json::number(*d);
      std::string text = n.dump();
      if (text.find_first_of(".eE") == std::string::npos && n.type() == Json::Type::number)
        n = Json::parse(text + ".0");
      o.set(name, n);
    } else {
      o.set(name, Json::string(std::get<std::string>(value)));
    }
  }
  return o;
}

dp::ModelOptions model_options_from_json(const Json& json) {
  dp::ModelOptions options;
  for (const auto& [name, v] : json.members()) {
    switch (v.type()) {
      case Json::Type::boolean:
        options[name] = v.as_bool();
        break;
      case Json::Type::number:
        if (v.is_integer_text())
          options[name] = v.as_int();
        else
          options[name] = v.as_double();
        break;
      case Json::Type::string:
        options[name] = v.as_string();
        break;
      default:
        throw JsonError("model option \"" + name + "\": unsupported JSON type");
    }
  }
  return options;
}

namespace {

// Each field read names itself when it is missing or of the wrong type.
template <class F>
auto field(const Json& o, const std::string& key, F read) {
  try {
    return read(o.at(key));
  } catch (const JsonError& e) {
    throw JsonError("trial request: \"" + key + "\": " + e.what());
  }
}

}  // namespace

Json request_to_json(const TrialRequest& r) {
  Json o = Json::object();
  o.set("ordinal", Json::integer(r.ordinal));
  o.set("settings", settings_to_json(r.settings));
  o.set("model_options", model_options_to_json(r.model_options));
  o.set("data_path", Json::string(r.data_path));
  Json dirs = Json::array();
  for (const auto& d : r.plugin_dirs) dirs.push(Json::string(d));
  o.set("plugin_dirs", dirs);
  o.set("backend", Json::string(r.backend));
  o.set("oversubscribe", Json::boolean(r.oversubscribe));
  o.set("threads", Json::integer(r.threads));
  return o;
}

TrialRequest request_from_json(const Json& o) {
  TrialRequest r;
  r.ordinal = field(o, "ordinal", [](const Json& j) { return j.as_int(); });
  r.settings = field(o, "settings", [](const Json& j) { return settings_from_json(j); });
  r.model_options =
      field(o, "model_options", [](const Json& j) { return model_options_from_json(j); });
  r.data_path = field(o, "data_path", [](const Json& j) { return j.as_string(); });
  r.plugin_dirs = field(o, "plugin_dirs", [](const Json& j) {
    std::vector<std::string> dirs;
    for (const auto& d : j.items()) dirs.push_back(d.as_string());
    return dirs;
  });
  r.backend = field(o, "backend", [](const Json& j) { return j.as_string(); });
  r.oversubscribe = field(o, "oversubscribe", [](const Json& j) { return j.as_bool(); });
  r.threads = static_cast<int>(field(o, "threads", [](const Json& j) { return j.as_int(); }));
  return r;
}

// ---- records ---------------------------------------------------------------------------------

std::string encode_record(const TrialRecord& r) {
  Json o = Json::object();
  switch (r.kind) {
    case TrialRecord::Kind::start:
      o.set("type", Json::string("start"));
      o.set("backend", Json::string(r.start.backend));
      o.set("devices", Json::string(r.start.devices));
      o.set("plugin_path", Json::string(r.start.plugin_path));
      o.set("plugin_sha256", Json::string(r.start.plugin_sha256));
      o.set("oversubscribed", Json::boolean(r.start.oversubscribed));
      break;
    case TrialRecord::Kind::epoch:
      o.set("type", Json::string("epoch"));
      o.set("epoch", Json::integer(r.epoch.epoch));
      o.set("train_loss", Json::number(r.epoch.train_loss));
      o.set("train_acc", Json::number(r.epoch.train_acc));
      o.set("test_acc", Json::number(r.epoch.test_acc));
      o.set("seconds", Json::number(r.epoch.seconds));
      o.set("examples_per_second", Json::number(r.epoch.examples_per_second));
      o.set("lr", Json::number(r.epoch.lr));
      o.set("eval_seconds", Json::number(r.epoch.eval_seconds));
      o.set("peak_memory_bytes", Json::integer(r.epoch.peak_memory_bytes));
      break;
    case TrialRecord::Kind::done:
      o.set("type", Json::string("done"));
      break;
    case TrialRecord::Kind::diverged:
      o.set("type", Json::string("diverged"));
      o.set("reason", Json::string(r.message));
      break;
    case TrialRecord::Kind::skipped:
      o.set("type", Json::string("skipped"));
      o.set("reason", Json::string(r.message));
      break;
    case TrialRecord::Kind::error:
      o.set("type", Json::string("error"));
      o.set("message", Json::string(r.message));
      break;
  }
  return o.dump();
}

TrialRecord decode_record(const std::string& line) {
  Json o = Json::parse(line);
  TrialRecord r;
  const std::string& type = o.at("type").as_string();
  if (type == "start") {
    r.kind = TrialRecord::Kind::start;
    r.start.backend = o.at("backend").as_string();
    r.start.devices = o.at("devices").as_string();
    r.start.plugin_path = o.at("plugin_path").as_string();
    r.start.plugin_sha256 = o.at("plugin_sha256").as_string();
    r.start.oversubscribed = o.at("oversubscribed").as_bool();
  } else if (type == "epoch") {
    r.kind = TrialRecord::Kind::epoch;
    r.epoch.epoch = o.at("epoch").as_int();
    r.epoch.train_loss = o.at("train_loss").as_double();
    r.epoch.train_acc = o.at("train_acc").as_double();
    r.epoch.test_acc = o.at("test_acc").as_double();
    r.epoch.seconds = o.at("seconds").as_double();
    r.epoch.examples_per_second = o.at("examples_per_second").as_double();
    r.epoch.lr = o.at("lr").as_double();
    r.epoch.eval_seconds = o.at("eval_seconds").as_double();
    r.epoch.peak_memory_bytes = o.at("peak_memory_bytes").as_int();
  } else if (type == "done") {
    r.kind = TrialRecord::Kind::done;
  } else if (type == "diverged") {
    r.kind = TrialRecord::Kind::diverged;
    r.message = o.at("reason").as_string();
  } else if (type == "skipped") {
    r.kind = TrialRecord::Kind::skipped;
    r.message = o.at("reason").as_string();
  } else if (type == "error") {
    r.kind = TrialRecord::Kind::error;
    r.message = o.at("message").as_string();
  } else {
    throw JsonError("unknown record type \"" + type + "\"");
  }
  return r;
}

void RecordWriter::write(const TrialRecord& record) { write_line(encode_record(record)); }

void RecordWriter::write_line(const std::string& text) {
  const std::string line = text + "\n";
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(),
                              "writing a trial record to fd " + std::to_string(fd_));
    }
    done += static_cast<size_t>(n);
  }
}

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

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal " + std::to_string(sig);
  }
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
  const std::string exe = options_.exe;
  const char* argv[] = {"dprun", "__trial", "--record-fd", "3", nullptr};
  const pid_t runner = getpid();

  pid_t pid = fork();
  check_sys(pid, "fork");
  if (pid == 0) {
    // Die with the runner, and close the race where it died before prctl took effect.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
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
    if (dup2(in_pipe[0], 0) < 0 || dup2(err_pipe[1], 1) < 0 || dup2(err_pipe[1], 2) < 0 ||
        dup2(rec_pipe[1], 3) < 0)
      _exit(127);
    // Descriptors the runner holds without O_CLOEXEC (a database, a terminal) stay with it.
    if (close_range(4, ~0U, 0) != 0)
      for (int fd = 4; fd < 1024; ++fd) ::close(fd);
    execv(exe.c_str(), const_cast<char* const*>(argv));
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
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    reap();
  }
  if (record_fd_ >= 0) ::close(record_fd_);
  if (stderr_fd_ >= 0) ::close(stderr_fd_);
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
  if (!records) {
    if (options_.on_output_line) options_.on_output_line(text);
    stderr_tail_.push_back(text);
    while (stderr_tail_.size() > options_.stderr_tail_lines) stderr_tail_.pop_front();
    return;
  }
  if (text.empty()) return;
  TrialRecord record;
  try {
    record = decode_record(text);
  } catch (const JsonError& e) {
    if (protocol_error_.empty())
      protocol_error_ = std::string("malformed record from the trial process (") + e.what() +
                        "): " + text.substr(0, 200);
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
