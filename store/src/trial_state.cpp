// A trial's whole record (row, epochs, checkpoints) read from one database and written into
// another: how a trial reaches a Slurm task's own database, and how the task's result comes back.
#include <algorithm>

#include "sqlite_util.hpp"
#include "store_impl.hpp"

namespace dps {

using detail::Stmt;
using detail::WriteTransaction;

TrialState Store::trial_state(int64_t trial_id) {
  auto row = get_trial(trial_id);
  if (!row) {
    throw StoreError(impl_->path + ": trial_state: no trial with id " + std::to_string(trial_id));
  }
  TrialState state;
  state.trial = *row;
  state.epochs = epochs(trial_id);
  state.checkpoints = checkpoints(trial_id);
  return state;
}

namespace detail {

int64_t put_trial_state(sqlite3* db, const std::string& path,
                        const std::vector<std::string>& setting_columns, bool has_checkpoints,
                        int64_t experiment_id, const TrialState& state) {
  const TrialRow& t = state.trial;
  int64_t id = 0;
  {
    Stmt find(db, "SELECT id FROM trials WHERE experiment_id = ?1 AND config_hash = ?2");
    find.bind(1, experiment_id).bind(2, t.config_hash);
    if (find.step()) id = find.int64("id");
  }
  if (id == 0) {
    // Setting columns named by the source: only those this table has reach the statement, as
    // quoted identifiers; their values are bound.
    std::string columns = "experiment_id, config_hash, ordinal", params = "?1, ?2, ?3";
    int n = 3;
    for (const auto& [name, value] : t.settings) {
      const auto& have = setting_columns;
      if (std::find(have.begin(), have.end(), name) == have.end()) {
        throw StoreError(path + ": put_trial_state: trials has no setting column \"" + name +
                         "\" (the trial comes from a database of another dprun version)");
      }
      columns += ", \"" + name + "\"";
      params += ", ?" + std::to_string(++n);
    }
    Stmt ins(db, ("INSERT INTO trials (" + columns + ") VALUES (" + params + ")").c_str());
    ins.bind(1, experiment_id).bind(2, t.config_hash).bind(3, t.ordinal);
    n = 3;
    for (const auto& [name, value] : t.settings) ins.bind(++n, value);
    ins.run();
    id = sqlite3_last_insert_rowid(db);
    // The user's words come along with a trial new here; an existing trial keeps this
    // database's (a merge must not undo a tag given while its task ran).
    Stmt note(db, "UPDATE trials SET note = ?2 WHERE id = ?1");
    note.bind(1, id).bind_text_or_null(2, t.note);
    note.run();
    Stmt tag(db, "INSERT OR IGNORE INTO trial_tags (trial_id, tag) VALUES (?1, ?2)");
    for (const std::string& name : t.tags) {
      tag.bind(1, id).bind(2, name);
      tag.run();
      sqlite3_reset(tag.get());
    }
  }
  Stmt up(db,
          "UPDATE trials SET status = ?2, error = ?3, attempts = ?4, backend = ?5, devices = ?6, "
          "  oversubscribed = ?7, host = ?8, dprun_version = ?9, plugin_path = ?10, "
          "  plugin_sha256 = ?11, runner_pid = ?12, started_at = ?13, finished_at = ?14, "
          "  heartbeat_at = ?15, hosts = ?16, launch = ?17, device_set = ?18, "
          "  resumed_from_epoch = ?19, rung = ?20, data_residence = ?21, layout_used = ?22, "
          "  graphs_used = ?23 "
          "WHERE id = ?1");
  up.bind(1, id).bind(2, std::string(status_name(t.status))).bind_text_or_null(3, t.error);
  up.bind(4, t.attempts).bind_text_or_null(5, t.backend).bind_text_or_null(6, t.devices);
  up.bind(7, int64_t{t.oversubscribed ? 1 : 0}).bind_text_or_null(8, t.host);
  up.bind_text_or_null(9, t.dprun_version).bind_text_or_null(10, t.plugin_path);
  up.bind_text_or_null(11, t.plugin_sha256);
  if (t.runner_pid > 0) {
    up.bind(12, t.runner_pid);
  } else {
    up.bind_null(12);
  }
  up.bind_text_or_null(13, t.started_at).bind_text_or_null(14, t.finished_at);
  up.bind_text_or_null(15, t.heartbeat_at).bind_text_or_null(16, t.hosts);
  up.bind_text_or_null(17, t.launch).bind_text_or_null(18, t.device_set);
  if (t.resumed_from_epoch > 0) {
    up.bind(19, t.resumed_from_epoch);
  } else {
    up.bind_null(19);
  }
  if (t.rung >= 0) {
    up.bind(20, t.rung);
  } else {
    up.bind_null(20);
  }
  up.bind_text_or_null(21, t.data_residence).bind_text_or_null(22, t.layout_used);
  if (t.graphs_used >= 0) {
    up.bind(23, t.graphs_used);
  } else {
    up.bind_null(23);
  }
  up.run();

  Stmt del_epochs(db, "DELETE FROM epochs WHERE trial_id = ?1");
  del_epochs.bind(1, id);
  del_epochs.run();
  // recorded_at keeps the time the epoch was first written, wherever that was.
  const std::string insert_epoch = epoch_insert_sql(false, true);
  Stmt ins_epoch(db, insert_epoch.c_str());
  for (const EpochRow& e : state.epochs) {
    ins_epoch.bind_text_or_null(bind_epoch(ins_epoch, id, e), e.recorded_at);
    ins_epoch.run();
    sqlite3_reset(ins_epoch.get());
  }
  if (!has_checkpoints) {
    if (!state.checkpoints.empty()) {
      throw StoreError(path + ": put_trial_state: this database predates checkpoints");
    }
    return id;
  }
  Stmt del_checkpoints(db, "DELETE FROM checkpoints WHERE trial_id = ?1");
  del_checkpoints.bind(1, id);
  del_checkpoints.run();
  Stmt ins_checkpoint(db,
                      "INSERT INTO checkpoints (trial_id, role, epoch, path, sha256, bytes, "
                      "optimizer_path, optimizer_sha256, recorded_at) "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, COALESCE(?9, " DPS_NOW_SQL "))");
  for (const CheckpointRow& c : state.checkpoints) {
    ins_checkpoint.bind(1, id).bind(2, c.role).bind(3, c.epoch).bind(4, c.path);
    ins_checkpoint.bind(5, c.sha256).bind(6, c.bytes);
    ins_checkpoint.bind_text_or_null(7, c.optimizer_path);
    ins_checkpoint.bind_text_or_null(8, c.optimizer_sha256);
    ins_checkpoint.bind_text_or_null(9, c.recorded_at);
    ins_checkpoint.run();
    sqlite3_reset(ins_checkpoint.get());
  }
  return id;
}

}  // namespace detail

int64_t Store::put_trial_state(int64_t experiment_id, const TrialState& state) {
  WriteTransaction txn(impl_->db);
  {
    Stmt e(impl_->db, "SELECT 1 FROM experiments WHERE id = ?1");
    e.bind(1, experiment_id);
    if (!e.step()) {
      throw StoreError(impl_->path + ": put_trial_state: no experiment with id " +
                       std::to_string(experiment_id));
    }
  }
  const int64_t id = detail::put_trial_state(impl_->db, impl_->path, impl_->setting_columns,
                                             impl_->has_checkpoints(), experiment_id, state);
  txn.commit();
  return id;
}

}  // namespace dps
