// Collecting the results of Slurm tasks (see merge.hpp).
#include "slurm/merge.hpp"

#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>

#include "base/os.hpp"
#include "process/checkpoint_files.hpp"
#include "slurm/slurm.hpp"

namespace dprun {

namespace fs = std::filesystem;

std::string task_name(const dps::TaskRow& task) {
  if (task.job_id.empty())
    return "task " + std::to_string(task.index) + " of submission " +
           std::to_string(task.submission_id);
  return "Slurm job " + task.job_id + "_" + std::to_string(task.index);
}

namespace {

// What Slurm says of the tasks, asked once per merge (squeue for all jobs; scontrol per job, only
// for tasks whose end needs explaining).
class SlurmView {
 public:
  explicit SlurmView(const std::vector<dps::TaskRow>& open) {
    std::set<std::string> jobs;
    for (const auto& t : open)
      if (!t.job_id.empty()) jobs.insert(t.job_id);
    live_ = live_array_tasks({jobs.begin(), jobs.end()}, problem_, absent_);
  }
  bool known() const { return live_.has_value(); }
  /// Slurm cannot be asked because there is no squeue here (not because squeue failed).
  bool absent() const { return !live_ && absent_; }
  const std::string& problem() const { return problem_; }
  /// Slurm's state of a live task, "" when it has ended (or its job has no id, or Slurm cannot
  /// be asked: see known()).
  std::string live_state(const dps::TaskRow& t) const {
    if (!live_ || t.job_id.empty()) return "";
    auto job = live_->find(t.job_id);
    if (job == live_->end()) return "";
    auto task = job->second.find(t.index);
    return task == job->second.end() ? "" : task->second;
  }
  /// Whether the task has certainly ended: Slurm answered and no longer lists it.
  bool ended(const dps::TaskRow& t) const {
    return live_ && !t.job_id.empty() && live_state(t).empty();
  }
  /// Why an ended task ended, from what slurmstepd wrote in its output, else from scontrol;
  /// "" when neither says.
  std::string cause(const dps::TaskRow& t, const std::string& output) {
    std::string c = cause_from_output(file_tail(output));
    if (!c.empty() || t.job_id.empty()) return c;
    auto job = ended_.find(t.job_id);
    if (job == ended_.end()) job = ended_.emplace(t.job_id, ended_array_tasks(t.job_id)).first;
    auto task = job->second.find(t.index);
    if (task == job->second.end()) return "";
    c = cause_from_state(task->second);
    if (c.empty()) c = ended_task_text(task->second);
    return c;
  }

 private:
  std::optional<std::map<std::string, std::map<int64_t, std::string>>> live_;
  std::string problem_;
  bool absent_ = false;
  std::map<std::string, std::map<int64_t, EndedTask>> ended_;
};

// The last non-empty line of a task's output: what a task that never reached dprun said.
std::string last_line(const std::string& output) {
  const std::string tail = file_tail(output, 4096);
  size_t end = tail.find_last_not_of("\n\r ");
  if (end == std::string::npos) return "";
  size_t start = tail.rfind('\n', end);
  return tail.substr(start == std::string::npos ? 0 : start + 1,
                     end + 1 - (start == std::string::npos ? 0 : start + 1));
}

std::string after_epoch_text(int64_t epochs) {
  return epochs > 0 ? "after epoch " + std::to_string(epochs) : "before its first epoch";
}

bool generic_interruption(const std::string& error) {
  return error.rfind("interrupted by SIG", 0) == 0;
}

}  // namespace

namespace {

// A task whose database is not there (yet): left for later while Slurm lists it or its folder
// cannot be read, else closed as lost with the cause Slurm gives.
void task_without_database(dps::Store& store, const dps::TaskRow& t, const std::string& task_db,
                           const std::string& output, SlurmView& slurm, MergeSummary& summary) {
  const std::string name = task_name(t);
  const fs::path folder = fs::path(task_db).parent_path();
  std::error_code folder_ec;
  if (!fs::is_directory(folder, folder_ec)) {
    // Without its submission folder (not mounted here, moved, deleted) the task's end cannot be
    // read: closing it lost would be final.
    ++summary.waiting;
    summary.notes.push_back(name + ": its submission folder " + folder.string() +
                            (folder_ec ? " cannot be read (" + folder_ec.message() + ")"
                                       : " is missing or not a folder") +
                            "; left for a later merge: mount or restore it and merge again");
    return;
  }
  if (!slurm.ended(t)) {
    ++summary.waiting;
    return;
  }
  std::string why = slurm.cause(t, output);
  if (why.empty()) why = "Slurm no longer lists it";
  const std::string said = last_line(output);
  why = name + " ended before dprun started the trial: " + why +
        (said.empty() ? "" : "; its output ends: " + said);
  if (store.close_lost_task(t.submission_id, t.index, why)) {
    ++summary.lost;
    summary.notes.push_back(why);
  }
}

// The task's trial as its database holds it, checkpoint paths rebased for the experiment's
// database; nullopt (with a note) when it cannot be read.
std::optional<dps::TrialState> read_task(const dps::TaskRow& t, const std::string& task_db,
                                         const std::string& db, MergeSummary& summary) {
  try {
    dps::Store task(task_db, dps::Store::Mode::read_write, {}, dps::Store::Journal::rollback);
    std::optional<dps::TrialRow> row;
    for (const auto& e : task.experiments())
      if (!row) row = task.find_trial(e.id, t.config_hash);
    if (!row) throw dps::StoreError("it holds no trial " + t.config_hash.substr(0, 12) + "...");
    dps::TrialState state = task.trial_state(row->id);
    for (auto& c : state.checkpoints) {
      c.path = rebase_checkpoint_path(task_db, c.path, db);
      if (!c.optimizer_path.empty())
        c.optimizer_path = rebase_checkpoint_path(task_db, c.optimizer_path, db);
    }
    return state;
  } catch (const std::exception& e) {
    ++summary.waiting;
    summary.notes.push_back(task_name(t) + ": cannot read its database " + task_db + " (" +
                            e.what() + "); left for a later merge");
    return std::nullopt;
  }
}

// Folds the task's trial into the experiment's database. A trial that did not record its end is
// left for later while Slurm lists its task, else recorded interrupted (or the task closed as
// lost when the trial never started) with the cause Slurm gives.
void fold_task(dps::Store& store, const dps::TaskRow& t, dps::TrialState state,
               const std::string& output, SlurmView& slurm, MergeSummary& summary) {
  dps::TrialRow& trial = state.trial;
  const bool started =
      trial.attempts > t.base_attempts || trial.status == dps::TrialStatus::running;
  if (!started || trial.status == dps::TrialStatus::running) {
    if (!slurm.ended(t)) {
      ++summary.waiting;
      return;
    }
    const std::string why = slurm.cause(t, output);
    if (!started) {
      const std::string text =
          task_name(t) + " ended before dprun started the trial" + (why.empty() ? "" : ": " + why);
      if (store.close_lost_task(t.submission_id, t.index, text)) {
        ++summary.lost;
        summary.notes.push_back(text);
      }
      return;
    }
    trial.status = dps::TrialStatus::interrupted;
    trial.error = (why.empty() ? "the Slurm task ended without recording the trial's end "
                                 "(killed with SIGKILL, or its node failed)"
                               : why) +
                  ", " + after_epoch_text(static_cast<int64_t>(state.epochs.size()));
  } else if (trial.status == dps::TrialStatus::interrupted && generic_interruption(trial.error) &&
             slurm.ended(t)) {
    if (const std::string why = slurm.cause(t, output); !why.empty())
      trial.error = why + " (" + trial.error + ")";
  }
  switch (store.merge_task(t.submission_id, t.index, state)) {
    case dps::MergeOutcome::applied:
      ++summary.merged;
      break;
    case dps::MergeOutcome::superseded:
      ++summary.superseded;
      break;
    case dps::MergeOutcome::closed:
      break;  // another merge collected it meanwhile
  }
}

// One task that has not been collected yet.
void merge_one(dps::Store& store, const dps::TaskRow& t, SlurmView& slurm, MergeSummary& summary) {
  if (std::string state = slurm.live_state(t); !state.empty()) {
    summary.live[{t.submission_id, t.index}] = state;
    ++summary.waiting;
    return;
  }
  const std::string& db = store.path();
  const std::string task_db = resolve_checkpoint_path(db, t.database);
  const std::string output = fs::path(task_db).replace_extension(".out").string();
  std::error_code ec;
  const bool exists = fs::exists(task_db, ec);
  if (ec) {
    // An I/O or permission error says nothing of whether the task wrote its database.
    ++summary.waiting;
    summary.notes.push_back(task_name(t) + ": cannot tell whether its database " + task_db +
                            " exists (" + ec.message() +
                            "); left for a later merge: fix access to it and merge again");
    return;
  }
  if (!exists) {
    task_without_database(store, t, task_db, output, slurm, summary);
    return;
  }
  if (auto state = read_task(t, task_db, db, summary))
    fold_task(store, t, std::move(*state), output, slurm, summary);
}

}  // namespace

MergeSummary merge_tasks(dps::Store& store, int64_t experiment_id) {
  MergeSummary summary;
  const auto open = store.tasks(experiment_id, true);
  if (open.empty()) return summary;
  SlurmView slurm(open);
  summary.slurm_known = slurm.known();
  summary.slurm_problem = slurm.problem();
  if (!slurm.known() && !slurm.absent()) {
    // squeue is there but gave no answer to trust: any task may still run (or be requeued), so
    // no task database is opened, not even one whose trial records its end.
    summary.waiting = static_cast<int>(open.size());
    summary.notes.push_back("Slurm cannot be asked (" + summary.slurm_problem +
                            "): no task database read; " + std::to_string(summary.waiting) +
                            " task(s) left for a later merge: merge again once squeue answers");
    return summary;
  }
  for (const dps::TaskRow& t : open) merge_one(store, t, slurm, summary);
  if (!summary.slurm_known && summary.waiting > 0)
    summary.notes.push_back("Slurm cannot be asked (" + summary.slurm_problem +
                            "): " + std::to_string(summary.waiting) +
                            " task(s) without a final result left for a later merge");
  return summary;
}

namespace {

// merge_tasks, its notes and how many results it collected said on stderr.
MergeSummary merge_and_say(dps::Store& store, int64_t experiment_id) {
  const MergeSummary m = merge_tasks(store, experiment_id);
  for (const auto& note : m.notes) std::fprintf(stderr, "dprun: %s\n", note.c_str());
  const int collected = m.merged + m.superseded + m.lost;
  if (collected > 0)
    std::fprintf(stderr, "dprun: collected the results of %d Slurm task%s\n", collected,
                 collected == 1 ? "" : "s");
  return m;
}

}  // namespace

std::map<std::string, std::string> merge_before_running(dps::Store& store, int64_t experiment_id) {
  std::map<std::string, std::string> elsewhere;
  if (store.tasks(experiment_id, true).empty()) return elsewhere;
  const MergeSummary m = merge_and_say(store, experiment_id);
  for (const auto& t : store.tasks(experiment_id, true)) {
    auto live = m.live.find({t.submission_id, t.index});
    elsewhere[t.config_hash] =
        task_name(t) + (live != m.live.end() ? " (" + live->second + ")" : " (state unknown)");
  }
  return elsewhere;
}

void merge_if_needed(const std::string& db) {
  std::vector<int64_t> open;
  {
    dps::Store read(db, dps::Store::Mode::read_only);
    for (const auto& e : read.experiments())
      if (!read.tasks(e.id, true).empty()) open.push_back(e.id);
  }
  if (open.empty()) return;
  dps::Store store(db, dps::Store::Mode::read_write);
  for (int64_t id : open) {
    merge_and_say(store, id);
  }
}

std::map<std::string, std::string> collect_before_run(const Experiment& experiment,
                                                      const SweepOptions& options) {
  dps::Store store(database_path(experiment, options), dps::Store::Mode::read_write,
                   experiment.settings->store_columns(), options.journal);
  const int64_t id = store.upsert_experiment(experiment.name, experiment.description,
                                             experiment.source, experiment.settings->generation());
  return merge_before_running(store, id);
}

}  // namespace dprun
