// `dprun status`: reading where a sweep stands from its databases, and --watch (status_view.hpp).
// A local sweep's database is only read (WAL: its runner goes on writing beside us); where Slurm
// tasks are left to collect, the database is opened read-write for the merge, as before, and
// each running task's own database is read, read-only, for the epochs it has so far.
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>
#include <thread>
#include <variant>

#include "base/os.hpp"
#include "cli/liveness.hpp"
#include "cli/status_view.hpp"
#include "experiment/experiment.hpp"
#include "process/checkpoint_files.hpp"
#include "settings/keys.hpp"
#include "settings/settings.hpp"
#include "slurm/merge.hpp"
#include "sweep/sweep_runner.hpp"

namespace dprun::cli {

namespace fs = std::filesystem;

namespace {

// ---- one experiment ----------------------------------------------------------------------------

std::string live_state(const std::string& slurm_state) {
  if (slurm_state == "PENDING" || slurm_state == "REQUEUED" || slurm_state == "CONFIGURING" ||
      slurm_state == "REQUEUE_HOLD" || slurm_state == "REQUEUE_FED")
    return "queued";
  return "running";
}

int64_t int_setting(const dps::SettingValues& settings, const char* name) {
  auto it = settings.find(name);
  return it != settings.end() && std::holds_alternative<int64_t>(it->second)
             ? std::get<int64_t>(it->second)
             : 0;
}

// The trials of a database without its experiment file: the model and the settings that vary
// between the experiment's trials, as the sweep's labels.
std::vector<std::string> names_from_settings(const std::vector<dps::TrialRow>& rows) {
  std::map<std::string, std::set<std::string>> values;
  for (const auto& r : rows)
    for (const auto& [column, value] : r.settings) values[column].insert(stored_text(value));
  std::vector<std::string> names;
  for (const auto& r : rows) {
    auto model = r.settings.find("model");
    std::string name = model != r.settings.end() ? stored_text(model->second) : "trial";
    for (const auto& [column, value] : r.settings)
      if (column != "model" && values[column].size() > 1)
        name += " " + column + "=" + stored_text(value);
    names.push_back(name);
  }
  return names;
}

// "CPU x1" for "CPU (2 threads, oneDNN 2.6.3 avx2) x1": what a line of a table has room for.
std::string without_details(const std::string& devices) {
  std::string out;
  int depth = 0;
  for (char c : devices) {
    if (c == '(') ++depth;
    if (depth == 0) out += c;
    if (c == ')' && depth > 0) --depth;
  }
  for (size_t at; (at = out.find("  ")) != std::string::npos;) out.erase(at, 1);
  return out;
}

// What a trial's row and epochs say: its state, last epoch, timing and devices.
void fill_progress(TrialProgress& p, const dps::TrialRow& row,
                   const std::vector<dps::EpochRow>& epochs) {
  p.id = row.id;
  p.state = row.status == dps::TrialStatus::pending ? "not run" : dps::status_name(row.status);
  p.why = row.error;
  p.epoch = epochs.empty() ? 0 : epochs.back().epoch;
  p.train_loss = p.test_acc = p.val_acc = p.seconds_per_epoch = std::nullopt;
  if (!epochs.empty()) {
    const dps::EpochRow& last = epochs.back();
    p.train_loss = last.train_loss;
    p.test_acc = last.test_acc;
    if (!std::isnan(last.val_acc)) p.val_acc = last.val_acc;
    std::vector<double> seconds;
    for (const auto& e : epochs) seconds.push_back(e.seconds);
    p.seconds_per_epoch = mean_epoch_seconds(seconds);
  }
  if (row.status == dps::TrialStatus::pending && epochs.empty()) return;
  p.devices = !row.device_set.empty() ? row.device_set : without_details(row.devices);
  // Where, when not only here: a Slurm node, or the hosts of a trial's processes ("vm x2").
  const std::string& where = !row.hosts.empty() ? row.hosts : row.host;
  if (!where.empty() && where != host_name())
    p.devices += (p.devices.empty() ? "" : " on ") + where;
}

// A trial whose Slurm task is not collected yet: Slurm's state, and its epochs so far from the
// task's database.
void fill_from_task(TrialProgress& p, const dps::TaskRow& task, const std::string& main_db,
                    const MergeSummary& m) {
  auto live = m.live.find({task.submission_id, task.index});
  const std::string state = live != m.live.end() ? live_state(live->second) : "submitted";
  std::string why =
      task_name(task) + (live != m.live.end() ? " " + live->second : ": result not collected yet");
  const TaskProgress read = read_task_progress(main_db, task);
  if (read.state) {
    const int64_t id = p.id;  // the task's database numbers its trial its own way
    fill_progress(p, read.state->trial, read.state->epochs);
    p.id = id;
  } else if (state != "queued") {
    why += "; its database " + read.problem;
  }
  p.state = state;
  p.why = why;
}

// A trial of the sweep: its identity, the name to show and its settings.
struct Entry {
  std::string hash, name;
  dps::SettingValues settings;
};

// Where one trial stands: from its row (null: not in the database yet), and from its Slurm task
// while that is not collected.
TrialProgress progress_of(dps::Store& store, const Entry& entry, const dps::TrialRow* row,
                          const std::map<int64_t, dps::TaskRow>& last_task,
                          const MergeSummary& merge) {
  TrialProgress p;
  p.name = entry.name;
  p.shape = shape_of(entry.settings);
  p.epochs = int_setting(entry.settings, "epochs");
  p.state = "not run";
  if (!row) return p;
  fill_progress(p, *row,
                row->epochs_done > 0 ? store.epochs(row->id) : std::vector<dps::EpochRow>{});
  auto task = last_task.find(row->id);
  if (task != last_task.end() && task->second.state == dps::TaskState::submitted) {
    fill_from_task(p, task->second, store.path(), merge);
  } else if (row->status == dps::TrialStatus::pending && task != last_task.end() &&
             task->second.state == dps::TaskState::lost) {
    p.state = "lost";
    p.why = task->second.error;
  } else if (row->status == dps::TrialStatus::running && row->host == host_name() &&
             !dprun_alive(row->runner_pid)) {
    p.state = "stale";
    p.why = "its dprun (pid " + std::to_string(row->runner_pid) +
            ") is gone without recording its end; the next dprun run records it interrupted";
  }
  return p;
}

}  // namespace

std::string merge_line(const MergeSummary& m) {
  std::string line =
      "collected " + std::to_string(m.merged) + " task result" + (m.merged == 1 ? "" : "s");
  if (m.superseded) line += ", " + std::to_string(m.superseded) + " of older attempts (kept apart)";
  if (m.lost) line += ", " + std::to_string(m.lost) + " task(s) lost";
  line += "; " + std::to_string(m.waiting) + " task(s) still queued, running or left for later";
  return line;
}

TaskProgress read_task_progress(const std::string& main_db, const dps::TaskRow& task) {
  TaskProgress out;
  const std::string path = resolve_checkpoint_path(main_db, task.database);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    out.problem = ec ? path + " cannot be seen (" + ec.message() + ")" : "is not created yet";
    return out;
  }
  try {
    // Read only, and never migrated: the task may be writing it (rollback journal, as it was
    // created), and a reader must not change it.
    dps::Store db(path, dps::Store::Mode::read_only, {}, dps::Store::Journal::rollback);
    std::optional<dps::TrialRow> row;
    for (const auto& e : db.experiments())
      if (!row) row = db.find_trial(e.id, task.config_hash);
    if (!row) {
      out.problem = "holds no trial yet";
      return out;
    }
    out.state = db.trial_state(row->id);
  } catch (const std::exception& e) {
    out.problem = "cannot be read now (" + std::string(e.what()) + ")";
  }
  return out;
}

SweepStatus read_status(dps::Store& store, const dps::ExperimentRow& experiment,
                        const Experiment* file, const MergeSummary& merge) {
  SweepStatus sweep;
  sweep.experiment = experiment.name;
  const std::vector<dps::TrialRow> rows = store.trials(experiment.id);
  std::map<std::string, const dps::TrialRow*> by_hash;
  for (const auto& r : rows) by_hash[r.config_hash] = &r;
  // The newest task of each trial (tasks come oldest first), and the tasks not collected.
  std::map<int64_t, dps::TaskRow> last_task;
  std::set<std::string> jobs;
  bool open_tasks = false;
  for (const auto& task : store.tasks(experiment.id, false)) {
    last_task[task.trial_id] = task;
    if (!task.job_id.empty()) jobs.insert(task.job_id);
    open_tasks = open_tasks || task.state == dps::TaskState::submitted;
  }

  std::vector<Entry> entries;  // in sweep order: the file's, else the database's
  if (file) {
    for (const auto& spec : file->trials)
      entries.push_back({spec.config_hash, trial_display_name(spec), to_store(spec.settings)});
  } else {
    const auto names = names_from_settings(rows);
    for (size_t i = 0; i < rows.size(); ++i)
      entries.push_back({rows[i].config_hash, names[i], rows[i].settings});
  }

  for (const auto& entry : entries) {
    auto found = by_hash.find(entry.hash);
    TrialProgress p = progress_of(store, entry, found != by_hash.end() ? found->second : nullptr,
                                  last_task, merge);
    sweep.active = sweep.active || p.state == "queued" || p.state == "submitted";
    sweep.trials.push_back(std::move(p));
  }
  // Between two trials of a local sweep nothing runs for a moment: its dprun is what says the
  // sweep goes on; a trial left running by a runner that crashed elsewhere does not (liveness.hpp).
  sweep.active = sweep.active || open_tasks ||
                 !sweep_activity(store, experiment.id, SweepOptions{}.stale_seconds).empty();

  if (!jobs.empty()) {
    std::string list;
    for (const auto& j : jobs) list += (list.empty() ? "" : ", ") + j;
    sweep.slurm_lines.push_back("Slurm job" + std::string(jobs.size() == 1 ? " " : "s ") + list +
                                "; " + merge_line(merge));
  }
  for (const auto& note : merge.notes) sweep.slurm_lines.push_back("  note: " + note);
  if (file)
    sweep.rerun_command =
        std::string(jobs.empty() ? "dprun run " : "dprun submit ") + shell_quote(file->file);
  return sweep;
}

// ---- the command -------------------------------------------------------------------------------

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

std::vector<dps::ExperimentRow> experiments_in(dps::Store& store, const Experiment* file) {
  if (!file) return store.experiments();
  auto found = store.find_experiment(file->name);
  return found ? std::vector<dps::ExperimentRow>{*found} : std::vector<dps::ExperimentRow>{};
}

struct Snapshot {
  std::string text;
  bool active = false;
};

Snapshot take_snapshot(const std::string& db, const Experiment* file, const StatusLayout& layout) {
  bool to_merge = false;
  {
    dps::Store read(db, dps::Store::Mode::read_only);
    for (const auto& e : experiments_in(read, file))
      to_merge = to_merge || !read.tasks(e.id, true).empty();
  }
  // Merging writes (short transactions), so only where a Slurm task is left to collect; a local
  // sweep's database is only read while its runner writes.
  dps::Store store = to_merge ? dps::Store(db, dps::Store::Mode::read_write,
                                           file ? file->settings->store_columns()
                                                : std::vector<dps::SettingColumn>{})
                              : dps::Store(db, dps::Store::Mode::read_only);
  Snapshot shot;
  for (const auto& e : experiments_in(store, file)) {
    const MergeSummary m = to_merge ? merge_tasks(store, e.id) : MergeSummary{};
    const SweepStatus sweep = read_status(store, e, file, m);
    shot.text += format_status(sweep, layout);
    shot.active = shot.active || sweep.active;
  }
  shot.text += "database: " + db + "\n";
  return shot;
}

// The terminal's size, when stdout is one.
std::optional<winsize> terminal_size() {
  winsize ws{};
  if (!isatty(STDOUT_FILENO) || ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0)
    return std::nullopt;
  return ws;
}

// Redraws the frame in place: cursor home, each line cleared to its end, the rest of the screen
// cleared; no scrolling. The cursor is hidden while it watches.
class Screen {
 public:
  Screen() { std::fputs("\x1b[?25l\x1b[2J", stdout); }
  ~Screen() {
    std::fputs("\x1b[?25h", stdout);
    std::fflush(stdout);
  }
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;
  void draw(const std::string& text) {
    std::string frame = "\x1b[H";
    size_t start = 0;
    while (start < text.size()) {
      const size_t end = text.find('\n', start);
      frame += text.substr(start, end - start) + "\x1b[K\n";
      start = end == std::string::npos ? text.size() : end + 1;
    }
    frame += "\x1b[J";
    std::fputs(frame.c_str(), stdout);
    std::fflush(stdout);
  }
};

std::string clock_text() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &local);
  return buf;
}

// Sleeps `seconds`, or less when a stop signal came.
void wait_interval(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!g_stop_signal && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

int watch(const std::string& db, const Experiment* file, double interval, bool all) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  // A second Ctrl-C ends dprun at once, should a snapshot hang (a busy database, a slow squeue).
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  const bool tty = terminal_size().has_value();
  std::optional<Screen> screen;
  if (tty) screen.emplace();
  char every[64];
  std::snprintf(every, sizeof every, "%g", interval);
  bool first = true, active = true;
  while (active && !g_stop_signal) {
    StatusLayout layout;
    layout.max_trials = all ? 0 : 30;
    std::string text;
    if (auto size = terminal_size()) {
      layout.width = size->ws_col > 1 ? size->ws_col - 1u : 1u;
      if (!all) layout.max_trials = size->ws_row > 16 ? size->ws_row - 11u : 5u;
      text =
          "dprun status every " + std::string(every) + " s (Ctrl-C stops)   " + clock_text() + "\n";
    }
    try {
      const Snapshot shot = take_snapshot(db, file, layout);
      text += shot.text;
      active = shot.active;
    } catch (const std::exception& e) {
      if (first) throw;  // a database that cannot be read at all: the command's error
      text += std::string("cannot read the database now: ") + e.what() + "\n";
    }
    if (!active) text += "nothing runs or waits to run any more: --watch ends\n";
    if (screen) {
      // Never taller than the window (several experiments, Slurm notes): a frame that scrolls
      // would spoil the next redraw, which starts from the top left corner.
      if (auto size = terminal_size(); size && size->ws_row > 2) {
        size_t lines = 0, at = 0;
        for (; at < text.size() && lines + 1 < size->ws_row - 1u; ++at)
          if (text[at] == '\n') ++lines;
        if (at < text.size())
          text = text.substr(0, at) + "... (more below: a taller window, or dprun status without " +
                 "--watch, shows it)\n";
      }
      screen->draw(text);
    } else {
      std::fputs(((first ? "" : "\n") + text).c_str(), stdout);
      std::fflush(stdout);
    }
    first = false;
    if (active) wait_interval(interval);
  }
  screen.reset();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  // Ctrl-C is how a watch is meant to end; SIGTERM is a stop from elsewhere.
  return g_stop_signal == SIGTERM ? 128 + SIGTERM : 0;
}

}  // namespace

int show_status(const std::string& db, const Experiment* file, std::optional<double> interval,
                bool all) {
  {
    dps::Store read(db, dps::Store::Mode::read_only);
    if (experiments_in(read, file).empty()) {
      if (!file) {
        std::fprintf(stderr,
                     "dprun status: database %s holds no experiment; give the experiment file "
                     "(dprun status FILE.toml) or a database that has run or submitted one\n",
                     db.c_str());
        return 2;
      }
      std::printf("experiment %s: nothing submitted or run yet (database %s)\n", file->name.c_str(),
                  db.c_str());
      return 0;
    }
  }
  if (interval) return watch(db, file, *interval, all);
  StatusLayout layout;
  layout.max_trials = all ? 0 : 30;
  std::fputs(take_snapshot(db, file, layout).text.c_str(), stdout);
  return 0;
}

}  // namespace dprun::cli
