// The user's words about trials (schema 6): tags and notes (dprun tag, dprun note); and
// forgetting trials with everything recorded of them (dprun forget). Every call checks all its
// trial ids inside its one transaction, so a typo in one id changes nothing.
#include <algorithm>
#include <set>

#include "sqlite_util.hpp"
#include "store_impl.hpp"

namespace dps {

using detail::Stmt;
using detail::WriteTransaction;

std::string tag_name_problem(const std::string& tag) {
  auto allowed = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  };
  if (!tag.empty() && tag.size() <= 64 && std::all_of(tag.begin(), tag.end(), allowed)) return "";
  return "tag \"" + tag + "\": " +
         (tag.empty()       ? "is empty; "
          : tag.size() > 64 ? "is longer than 64 characters; "
                            : "") +
         "a tag is 1 to 64 of the characters A-Z a-z 0-9 _ . - (no spaces or commas)";
}

namespace {

std::string id_list(const std::set<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
  return out;
}

// The trial ids, each once, after checking inside the caller's transaction that the database
// has every one of them.
std::set<int64_t> existing_trials(sqlite3* db, const std::string& path,
                                  const std::vector<int64_t>& trial_ids, const char* what) {
  if (trial_ids.empty()) throw StoreError(path + ": " + what + ": no trial ids given");
  const std::set<int64_t> ids(trial_ids.begin(), trial_ids.end());
  std::set<int64_t> missing;
  Stmt find(db, "SELECT 1 FROM trials WHERE id = ?1");
  for (int64_t id : ids) {
    find.bind(1, id);
    if (!find.step()) missing.insert(id);
    sqlite3_reset(find.get());
  }
  if (!missing.empty()) {
    throw StoreError(path + ": " + what + ": " +
                     (missing.size() == 1 ? "no trial with id " : "no trials with ids ") +
                     id_list(missing) + " (nothing was changed)");
  }
  return ids;
}

// Tags and notes came with schema 6; a store opened read-only reads an older file as it is.
void require_tags(int user_version, const std::string& path, const char* what) {
  if (user_version < 6) {
    throw StoreError(path + ": " + what + ": the database is of schema version " +
                     std::to_string(user_version) +
                     ", before tags and notes (6): open it read-write to migrate it");
  }
}

// See Store::forget_refusal; the same judgement of a runner as Store::recover_stale's.
std::string refusal(sqlite3* db, const std::string& path, bool has_tasks, int64_t trial_id,
                    double stale_seconds) {
  Stmt t(db,
         "SELECT status, runner_pid, host, "
         "  (julianday('now') - julianday(heartbeat_at)) * 86400.0 AS age "
         "FROM trials WHERE id = ?1");
  t.bind(1, trial_id);
  if (!t.step()) {
    throw StoreError(path + ": forget: no trial with id " + std::to_string(trial_id));
  }
  if (t.text("status") == status_name(TrialStatus::running)) {
    const int64_t pid = t.int64("runner_pid");
    const std::string host = t.text("host"), here = detail::this_host();
    const bool gone = !here.empty() && host == here && detail::process_is_gone(pid);
    const bool silent = t.is_null("age") || t.real("age") > stale_seconds;
    if (!gone && !silent) {
      return "it is running in dprun pid " + std::to_string(pid) +
             (host.empty()   ? ""
              : host == here ? " on this host"
                             : " on " + host) +
             ": stop that dprun (Ctrl-C) or let it finish, then forget it";
    }
  }
  if (has_tasks) {
    Stmt task(db,
              "SELECT s.job_id, t.task_index FROM tasks t "
              "JOIN submissions s ON s.id = t.submission_id "
              "WHERE t.trial_id = ?1 AND t.state = 'submitted' LIMIT 1");
    task.bind(1, trial_id);
    if (task.step()) {
      const std::string job = task.text("job_id");
      return "Slurm job " + (job.empty() ? std::string("?") : job) + "_" +
             std::to_string(task.int64("task_index")) +
             " runs it and was not collected yet: let it end (or scancel it), run dprun merge, "
             "then forget it";
    }
  }
  return "";
}

}  // namespace

int64_t Store::tag_trials(const std::vector<int64_t>& trial_ids, const std::string& tag) {
  require_tags(impl_->user_version, impl_->path, "tag");
  if (const std::string problem = tag_name_problem(tag); !problem.empty())
    throw StoreError(impl_->path + ": " + problem);
  WriteTransaction txn(impl_->db);
  int64_t gained = 0;
  Stmt ins(impl_->db, "INSERT OR IGNORE INTO trial_tags (trial_id, tag) VALUES (?1, ?2)");
  for (int64_t id : existing_trials(impl_->db, impl_->path, trial_ids, "tag")) {
    ins.bind(1, id).bind(2, tag);
    ins.run();
    gained += sqlite3_changes(impl_->db);
    sqlite3_reset(ins.get());
  }
  txn.commit();
  return gained;
}

int64_t Store::untag_trials(const std::vector<int64_t>& trial_ids, const std::string& tag) {
  require_tags(impl_->user_version, impl_->path, "untag");
  if (const std::string problem = tag_name_problem(tag); !problem.empty())
    throw StoreError(impl_->path + ": " + problem);
  WriteTransaction txn(impl_->db);
  int64_t had = 0;
  Stmt del(impl_->db, "DELETE FROM trial_tags WHERE trial_id = ?1 AND tag = ?2");
  for (int64_t id : existing_trials(impl_->db, impl_->path, trial_ids, "untag")) {
    del.bind(1, id).bind(2, tag);
    del.run();
    had += sqlite3_changes(impl_->db);
    sqlite3_reset(del.get());
  }
  txn.commit();
  return had;
}

void Store::set_note(int64_t trial_id, const std::string& note) {
  require_tags(impl_->user_version, impl_->path, "note");
  WriteTransaction txn(impl_->db);
  existing_trials(impl_->db, impl_->path, {trial_id}, "note");
  Stmt up(impl_->db, "UPDATE trials SET note = ?2 WHERE id = ?1");
  up.bind(1, trial_id).bind_text_or_null(2, note);
  up.run();
  txn.commit();
}

std::string Store::forget_refusal(int64_t trial_id, double stale_seconds) {
  return refusal(impl_->db, impl_->path, impl_->has_tasks(), trial_id, stale_seconds);
}

std::vector<CheckpointRow> Store::forget_trials(const std::vector<int64_t>& trial_ids,
                                                double stale_seconds) {
  WriteTransaction txn(impl_->db);
  const std::set<int64_t> ids = existing_trials(impl_->db, impl_->path, trial_ids, "forget");
  std::string refused;
  for (int64_t id : ids) {
    if (const std::string why =
            refusal(impl_->db, impl_->path, impl_->has_tasks(), id, stale_seconds);
        !why.empty())
      refused += (refused.empty() ? "" : "; ") + ("trial " + std::to_string(id) + ": " + why);
  }
  if (!refused.empty())
    throw StoreError(impl_->path + ": forget: " + refused + " (nothing was changed)");
  std::vector<CheckpointRow> files;
  Stmt del(impl_->db, "DELETE FROM trials WHERE id = ?1");
  for (int64_t id : ids) {
    for (CheckpointRow& c : checkpoints(id)) files.push_back(std::move(c));
    // Epochs, attempts, checkpoints, tags and tasks go with it: their foreign keys cascade.
    del.bind(1, id);
    del.run();
    sqlite3_reset(del.get());
  }
  txn.commit();
  return files;
}

}  // namespace dps
