#pragma once
// One trial in its own process, and the record protocol between that process and the runner.
//
// The runner starts `dprun __trial --record-fd 3` with fork + exec of /proc/self/exe (the child
// never runs runner code: CUDA, OpenMP and BLAS thread pools are only ever set up after exec).
// The trial request travels as one JSON object on the child's stdin. The child writes
// newline-delimited JSON records to fd 3:
//   {"type":"start","backend":"cpu","devices":"CPU (2 threads, oneDNN 2.6.3 avx2)
//   x2","plugin_path":"...",
//    "plugin_sha256":"...","oversubscribed":false,"hosts":"vm","data_residence":"device",
//    "layout_used":"nchw","graphs_used":0,"rank_hosts":["vm"]}
//   {"type":"epoch","epoch":1,"train_loss":0.9,"train_acc":0.6,"test_acc":0.7,"seconds":1.2,
//    "examples_per_second":500,"lr":0.1,"eval_seconds":0.1,"peak_memory_bytes":123}   (each)
//   {"type":"checkpoint","role":"last","epoch":1,"path":"/abs/last.safetensors","sha256":"...",
//    "bytes":123,"optimizer_path":"...","optimizer_sha256":"..."}   (after an epoch's record)
//   then exactly one final record: {"type":"done"} | {"type":"diverged","reason":"..."} |
//   {"type":"skipped","reason":"..."} | {"type":"error","message":"..."}
// Its stdout and stderr go to one pipe the runner reads (the last lines explain a crash).
//
// A trial of several processes is started through a launcher instead (launch.hpp):
// `mpirun ... dprun __trial --records stdout`. A launcher gives stdin to process 0 only and no
// other descriptor, and its processes may be on other hosts, so process 0 reads the request and
// passes it on, and writes the same records on its stdout, each line prefixed with
// kRecordPrefix; whatever else the processes print goes to stderr. The runner reads the
// launcher's stdout and stderr.
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "dp/plugin.hpp"
#include "dpstore/store.hpp"
#include "process/run_options.hpp"
#include "settings/settings.hpp"

namespace dprun {

/// The checkpoint a trial continues from (see checkpoint.hpp).
struct ResumePoint {
  int64_t epoch = 0;                                                       // 0: start from scratch
  std::string model_path, model_sha256, optimizer_path, optimizer_sha256;  // absolute paths
  /// The best test accuracy of epochs 1..epoch and its epoch (checkpoint = "best": a later
  /// epoch replaces the best checkpoint only when it does better). best_epoch 0: none.
  int64_t best_epoch = 0;
  double best_test_acc = 0;
  /// The stopping rule's metric after epochs 1..epoch (stop_rule.hpp), so the resumed trial
  /// stops where one that ran straight through stops; empty without a rule.
  std::vector<double> stop_history;
};

/// Everything a trial process needs to run one trial.
struct TrialRequest {
  int64_t ordinal = 0;  // position in the sweep (selects DPRUN_FAULT targets)
  TrialSettings settings;
  dp::ModelOptions model_options;
  std::string data_path;  // "" : the default dataset search
  /// The runner's options; backend is the one this trial uses (auto | cpu | cuda, after any
  /// --backend override), threads its CPU threads (0: all hardware threads).
  RunOptions run = with_backend("auto");
  /// Where the trial's checkpoint files go (absolute; process 0 writes them); "": none, whatever
  /// the checkpoint setting says.
  std::string checkpoint_dir;
  ResumePoint resume;
  /// Stop after this epoch (a [search] scheduler's rung), reporting the trial paused; 0: run to
  /// its epochs.
  int64_t stop_after_epoch = 0;
};

Json request_to_json(const TrialRequest& request);
/// Throws JsonError naming the missing or mistyped field.
TrialRequest request_from_json(const Json& json);

/// Model options as a JSON object; floats always carry a '.' or exponent so types survive.
Json model_options_to_json(const dp::ModelOptions& options);
dp::ModelOptions model_options_from_json(const Json& json);

/// The start of a record line on a launched trial's stdout (see the top of this file).
inline constexpr const char* kRecordPrefix = "dprun-record ";

/// One record of the protocol.
struct TrialRecord {
  enum class Kind { start, epoch, checkpoint, done, diverged, skipped, stopped, paused, error };
  Kind kind = Kind::done;
  /// kind start: backend, devices, plugin_path, plugin_sha256, oversubscribed, hosts,
  /// data_residence.
  dps::TrialStart start;
  std::vector<std::string> rank_hosts;  // kind start: the host of each process, in rank order
  dps::EpochRow epoch;                  // kind epoch (trial_id left 0)
  dps::CheckpointRow checkpoint;        // kind checkpoint (trial_id left 0, paths absolute)
  std::string message;                  // diverged / skipped: the reason; error: the message

  bool is_final() const {
    return kind != Kind::start && kind != Kind::epoch && kind != Kind::checkpoint;
  }
};

/// One line of JSON without the newline.
std::string encode_record(const TrialRecord& record);
/// Throws JsonError on a malformed line.
TrialRecord decode_record(const std::string& line);

/// Child side: writes whole records to a file descriptor (each record is one write of at most a
/// few hundred bytes, below PIPE_BUF, so a record is never split by a crash).
class RecordWriter {
 public:
  /// prefix: written before every line (kRecordPrefix on a launched trial's stdout).
  explicit RecordWriter(int fd, std::string prefix = "") : fd_(fd), prefix_(std::move(prefix)) {}
  void write(const TrialRecord& record);
  /// Writes one line as it is (no record encoding); for fault injection in tests.
  void write_line(const std::string& line);

 private:
  int fd_;
  std::string prefix_;
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
  /// Empty: `exe __trial --record-fd 3`. Otherwise the command that launches the trial's
  /// processes (its first word a path), whose records come on its stdout with kRecordPrefix.
  std::vector<std::string> launch;
  /// NAME=VALUE entries set in the child's environment (CUDA_VISIBLE_DEVICES of --jobs).
  std::vector<std::string> env;
  /// The CPU cores the child may run on (--jobs); empty: those of the runner.
  std::vector<int> cores;
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
  /// Ends it and reaps it: SIGTERM, then SIGKILL after grace_seconds (0: SIGKILL at once).
  void terminate(double grace_seconds);

  const std::deque<std::string>& stderr_tail() const { return stderr_tail_; }
  /// The lines of its output that say a process failed (launch.hpp's is_failure_line), kept
  /// apart from the tail: a launcher's long messages would push them out of it.
  const std::vector<std::string>& failure_lines() const { return failure_lines_; }
  const std::string& protocol_error() const { return protocol_error_; }
  /// Started through a launcher (several processes).
  bool launched() const { return !options_.launch.empty(); }
  /// The program started: the launcher, or dprun itself.
  const std::string& program() const { return launched() ? options_.launch[0] : options_.exe; }

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
  std::vector<std::string> failure_lines_;
  std::string protocol_error_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

}  // namespace dprun
