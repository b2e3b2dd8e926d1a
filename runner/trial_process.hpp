#pragma once
// One trial in its own process, and the record protocol between that process and the runner.
//
// The runner starts `dprun __trial --record-fd 3` with fork + exec of /proc/self/exe (the child
// never runs runner code: CUDA, OpenMP and BLAS thread pools are only ever set up after exec).
// The trial request travels as one JSON object on the child's stdin. The child writes
// newline-delimited JSON records to fd 3:
//   {"type":"start","backend":"cpu","devices":"CPU (2 threads) x2","plugin_path":"...",
//    "plugin_sha256":"...","oversubscribed":false}
//   {"type":"epoch","epoch":1,"train_loss":0.9,"train_acc":0.6,"test_acc":0.7,"seconds":1.2,
//    "examples_per_second":500,"lr":0.1,"eval_seconds":0.1,"peak_memory_bytes":123}   (each)
//   then exactly one final record: {"type":"done"} | {"type":"diverged","reason":"..."} |
//   {"type":"skipped","reason":"..."} | {"type":"error","message":"..."}
// Its stdout and stderr go to one pipe the runner reads (the last lines explain a crash).
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dp/plugin.hpp"
#include "dpstore/store.hpp"
#include "json.hpp"
#include "settings.hpp"

namespace dprun {

/// Everything a trial process needs to run one trial.
struct TrialRequest {
  int64_t ordinal = 0;  // position in the sweep (selects DPRUN_FAULT targets)
  TrialSettings settings;
  dp::ModelOptions model_options;
  std::string data_path;                 // "" : the default dataset search
  std::vector<std::string> plugin_dirs;  // --plugins
  std::string backend = "auto";          // auto | cpu | cuda (after any --backend override)
  bool oversubscribe = false;
  int threads = 0;  // CPU threads for the trial (0: all hardware threads)
};

Json request_to_json(const TrialRequest& request);
/// Throws JsonError naming the missing or mistyped field.
TrialRequest request_from_json(const Json& json);

/// Model options as a JSON object; floats always carry a '.' or exponent so types survive.
Json model_options_to_json(const dp::ModelOptions& options);
dp::ModelOptions model_options_from_json(const Json& json);

/// One record of the protocol.
struct TrialRecord {
  enum class Kind { start, epoch, done, diverged, skipped, error };
  Kind kind = Kind::done;
  dps::TrialStart
      start;            // kind start: backend, devices, plugin_path, plugin_sha256, oversubscribed
  dps::EpochRow epoch;  // kind epoch (trial_id left 0)
  std::string message;  // diverged / skipped: the reason; error: the message

  bool is_final() const { return kind != Kind::start && kind != Kind::epoch; }
};

/// One line of JSON without the newline.
std::string encode_record(const TrialRecord& record);
/// Throws JsonError on a malformed line.
TrialRecord decode_record(const std::string& line);

/// Child side: writes whole records to a file descriptor (each record is one write of at most a
/// few hundred bytes, below PIPE_BUF, so a record is never split by a crash).
class RecordWriter {
 public:
  explicit RecordWriter(int fd) : fd_(fd) {}
  void write(const TrialRecord& record);
  /// Writes one line as it is (no record encoding); for fault injection in tests.
  void write_line(const std::string& line);

 private:
  int fd_;
};

/// Runner side: turns SIGINT/SIGTERM into a readable file descriptor (a self-pipe) while alive,
/// so a poll loop can wake up on them. One at a time per process.
class SignalPipe {
 public:
  SignalPipe();
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  int fd() const { return read_fd_; }
  /// The first signal received (0: none); drains the pipe.
  int received();

 private:
  int read_fd_ = -1;
  int first_ = 0;
};

struct SpawnOptions {
  std::string exe = "/proc/self/exe";
  /// Called with every line the child writes to stdout/stderr as it arrives (--verbose); the
  /// last stderr_tail_lines are kept either way.
  std::function<void(const std::string&)> on_output_line;
  size_t stderr_tail_lines = 20;
};

/// A running trial process. Several can exist at once (each owns its pipes); the caller polls
/// poll_fds() and calls pump() when they are readable. The destructor kills (SIGKILL) and reaps a
/// child that is still running.
class TrialProcess {
 public:
  TrialProcess(const TrialRequest& request, const SpawnOptions& options);
  ~TrialProcess();
  TrialProcess(const TrialProcess&) = delete;
  TrialProcess& operator=(const TrialProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// The pipe ends still open (records, then stderr); empty once both reached end of file.
  std::vector<int> poll_fds() const;
  /// Reads what is available; calls on_record for every complete record line. A line that is not
  /// a valid record becomes a protocol error (kept, see protocol_error()).
  void pump(const std::function<void(const TrialRecord&)>& on_record);
  /// True when both pipes reached end of file.
  bool streams_closed() const { return record_fd_ < 0 && stderr_fd_ < 0; }
  /// Non-blocking reap; true once the process has exited (status available).
  bool try_reap();
  /// Blocking reap.
  void reap();
  bool exited() const { return reaped_; }
  /// Exit status when it exited normally, else -1.
  int exit_code() const;
  /// The signal that ended it, else 0.
  int term_signal() const;
  /// Sends a signal (ignored once reaped).
  void send(int sig);

  const std::deque<std::string>& stderr_tail() const { return stderr_tail_; }
  const std::string& protocol_error() const { return protocol_error_; }

 private:
  void read_fd(int& fd, std::string& buffer, bool records,
               const std::function<void(const TrialRecord&)>& on_record);
  void line(const std::string& text, bool records,
            const std::function<void(const TrialRecord&)>& on_record);

  SpawnOptions options_;
  pid_t pid_ = -1;
  int record_fd_ = -1, stderr_fd_ = -1;
  std::string record_buffer_, stderr_buffer_;
  std::deque<std::string> stderr_tail_;
  std::string protocol_error_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

/// "SIGKILL" for 9, "SIGABRT" for 6, ...; "signal N" when unknown.
std::string signal_name(int sig);

}  // namespace dprun
