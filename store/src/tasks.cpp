// Trials run elsewhere: the submissions of a batch scheduler's jobs, their tasks, and the merge of
// a task's result into this database (schema 4).
#include "sqlite_util.hpp"
#include "store_impl.hpp"

namespace dps {

using detail::Stmt;
using detail::WriteTransaction;

const char* task_state_name(TaskState s) {
  switch (s) {
    case TaskState::submitted:
      return "submitted";
    case TaskState::merged:
      return "merged";
    case TaskState::lost:
      return "lost";
  }
  return "unknown";
}

namespace {

TaskState parse_task_state(const std::string& path, const std::string& s) {
  for (TaskState t : {TaskState::submitted, TaskState::merged, TaskState::lost})
    if (s == task_state_name(t)) return t;
  throw StoreError(path + ": unknown task state \"" + s + "\"");
}

void require_tasks(bool has_tasks, const std::string& path, const char* what) {
  if (!has_tasks) {
    throw StoreError(path + ": " + what +
                     ": this database predates submissions (schema 3 or older); open it "
                     "read-write to migrate it");
  }
}

}  // namespace

int64_t Store::add_submission(const SubmissionRow& submission, const std::vector<TaskRow>& tasks) {
  require_tasks(impl_->has_tasks(), impl_->path, "add_submission");
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  Stmt ins(db,
           "INSERT INTO submissions (experiment_id, scheduler, job_id, folder, command) "
           "VALUES (?1, ?2, ?3, ?4, ?5)");
  ins.bind(1, submission.experiment_id).bind(2, submission.scheduler);
  ins.bind_text_or_null(3, submission.job_id).bind(4, submission.folder);
  ins.bind(5, submission.command);
  ins.run();
  const int64_t id = sqlite3_last_insert_rowid(db);
  Stmt task(db,
            "INSERT INTO tasks (submission_id, task_index, trial_id, database, base_attempts) "
            "VALUES (?1, ?2, ?3, ?4, ?5)");
  for (const TaskRow& t : tasks) {
    task.bind(1, id).bind(2, t.index).bind(3, t.trial_id).bind(4, t.database);
    task.bind(5, t.base_attempts);
    task.run();
    sqlite3_reset(task.get());
  }
  txn.commit();
  return id;
}

void Store::set_submission_job(int64_t submission_id, const std::string& job_id) {
  require_tasks(impl_->has_tasks(), impl_->path, "set_submission_job");
  WriteTransaction txn(impl_->db);
  Stmt up(impl_->db, "UPDATE submissions SET job_id = ?2 WHERE id = ?1");
  up.bind(1, submission_id).bind(2, job_id);
  up.run();
  if (sqlite3_changes(impl_->db) == 0) {
    throw StoreError(impl_->path + ": set_submission_job: no submission with id " +
                     std::to_string(submission_id));
  }
  txn.commit();
}

void Store::delete_submission(int64_t submission_id) {
  require_tasks(impl_->has_tasks(), impl_->path, "delete_submission");
  WriteTransaction txn(impl_->db);
  Stmt del(impl_->db, "DELETE FROM submissions WHERE id = ?1");  // its tasks go with it
  del.bind(1, submission_id);
  del.run();
  txn.commit();
}

std::vector<SubmissionRow> Store::submissions(int64_t experiment_id) {
  if (!impl_->has_tasks()) return {};
  Stmt s(impl_->db,
         "SELECT id, experiment_id, scheduler, job_id, folder, command, submitted_at "
         "FROM submissions WHERE experiment_id = ?1 ORDER BY id");
  s.bind(1, experiment_id);
  std::vector<SubmissionRow> rows;
  while (s.step()) {
    SubmissionRow r;
    r.id = s.int64("id");
    r.experiment_id = s.int64("experiment_id");
    r.scheduler = s.text("scheduler");
    r.job_id = s.text("job_id");
    r.folder = s.text("folder");
    r.command = s.text("command");
    r.submitted_at = s.text("submitted_at");
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<TaskRow> Store::tasks(int64_t experiment_id, bool open_only) {
  if (!impl_->has_tasks()) return {};
  Stmt s(
      impl_->db,
      (std::string("SELECT t.submission_id AS submission_id, t.task_index AS task_index, "
                   "t.trial_id AS trial_id, r.config_hash AS config_hash, "
                   "t.database AS database, t.base_attempts AS base_attempts, "
                   "t.state AS state, t.status AS status, t.error AS error, "
                   "t.closed_at AS closed_at, s.scheduler AS scheduler, s.job_id AS job_id, "
                   "s.folder AS folder "
                   "FROM tasks t JOIN submissions s ON s.id = t.submission_id "
                   "JOIN trials r ON r.id = t.trial_id WHERE s.experiment_id = ?1 ") +
       (open_only ? "AND t.state = 'submitted' " : "") + "ORDER BY t.submission_id, t.task_index")
          .c_str());
  s.bind(1, experiment_id);
  std::vector<TaskRow> rows;
  while (s.step()) {
    TaskRow r;
    r.submission_id = s.int64("submission_id");
    r.index = s.int64("task_index");
    r.trial_id = s.int64("trial_id");
    r.config_hash = s.text("config_hash");
    r.database = s.text("database");
    r.base_attempts = s.int64("base_attempts");
    r.state = parse_task_state(impl_->path, s.text("state"));
    r.status = s.text("status");
    r.error = s.text("error");
    r.closed_at = s.text("closed_at");
    r.scheduler = s.text("scheduler");
    r.job_id = s.text("job_id");
    r.folder = s.text("folder");
    rows.push_back(std::move(r));
  }
  return rows;
}

MergeOutcome Store::merge_task(int64_t submission_id, int64_t index, const TrialState& state) {
  require_tasks(impl_->has_tasks(), impl_->path, "merge_task");
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  int64_t trial_id = 0, experiment_id = 0;
  bool already_done = false;
  {
    Stmt task(db,
              "SELECT t.state AS state, t.trial_id AS trial_id, r.config_hash AS config_hash, "
              "r.experiment_id AS experiment_id, r.status AS status "
              "FROM tasks t JOIN trials r ON r.id = t.trial_id "
              "WHERE t.submission_id = ?1 AND t.task_index = ?2");
    task.bind(1, submission_id).bind(2, index);
    if (!task.step()) {
      throw StoreError(impl_->path + ": merge_task: no task " + std::to_string(index) +
                       " of submission " + std::to_string(submission_id));
    }
    if (task.text("state") != "submitted") return MergeOutcome::closed;  // rolls back: no change
    if (task.text("config_hash") != state.trial.config_hash) {
      throw StoreError(impl_->path + ": merge_task: task " + std::to_string(index) +
                       " of submission " + std::to_string(submission_id) + " ran trial " +
                       state.trial.config_hash.substr(0, 12) + "..., it was submitted for " +
                       task.text("config_hash").substr(0, 12) + "...");
    }
    trial_id = task.int64("trial_id");
    experiment_id = task.int64("experiment_id");
    already_done = task.text("status") == status_name(TrialStatus::done);
  }
  // Attempts are ordered by submission: the result of an older one that arrives late (its
  // database could not be read before) must not undo a newer attempt's.
  Stmt newer(db,
             "SELECT 1 FROM tasks WHERE trial_id = ?1 AND submission_id > ?2 AND state = 'merged'");
  newer.bind(1, trial_id).bind(2, submission_id);
  // Nor may a result short of done replace a trial another attempt finished (a later submission
  // of the same trial that failed, or a local `dprun run` that claimed it meanwhile).
  const bool superseded = newer.step() || (already_done && state.trial.status != TrialStatus::done);
  if (!superseded) {
    detail::put_trial_state(db, impl_->path, impl_->setting_columns, impl_->has_checkpoints(),
                            experiment_id, state);
  }
  Stmt close(db,
             "UPDATE tasks SET state = 'merged', status = ?3, error = ?4, closed_at = " DPS_NOW_SQL
             " WHERE submission_id = ?1 AND task_index = ?2");
  close.bind(1, submission_id).bind(2, index).bind(3, std::string(status_name(state.trial.status)));
  close.bind_text_or_null(4, state.trial.error);
  close.run();
  txn.commit();
  return superseded ? MergeOutcome::superseded : MergeOutcome::applied;
}

bool Store::close_lost_task(int64_t submission_id, int64_t index, const std::string& why) {
  require_tasks(impl_->has_tasks(), impl_->path, "close_lost_task");
  WriteTransaction txn(impl_->db);
  Stmt up(impl_->db, "UPDATE tasks SET state = 'lost', error = ?3, closed_at = " DPS_NOW_SQL
                     " WHERE submission_id = ?1 AND task_index = ?2 AND state = 'submitted'");
  up.bind(1, submission_id).bind(2, index).bind_text_or_null(3, why);
  up.run();
  const bool closed = sqlite3_changes(impl_->db) > 0;
  txn.commit();
  return closed;
}

}  // namespace dps
