#pragma once
// The state behind dps::Store, shared by store.cpp (opening, the trial lifecycle), reads.cpp
// (typed reads), query.cpp (read-only SQL), trial_state.cpp (a trial's whole record, between
// databases) and tasks.cpp (submissions to a batch scheduler and merging their results).
#include <sqlite3.h>

#include <string>
#include <vector>

#include "dpstore/store.hpp"
#include "sqlite_util.hpp"

namespace dps {

struct Store::Impl {
  sqlite3* db = nullptr;
  std::string path;  // as given by the caller, for messages
  Mode mode = Mode::read_write;
  int user_version = 0;
  std::vector<std::string> setting_columns;  // of `trials`, in table order
  /// The store's own trial columns an older schema lacks (read-only: they read as NULL).
  std::vector<std::string> absent_columns;
  // Set by the query authorizer when it refuses an action, so query() can tell a refusal from
  // an ordinary SQL error.
  std::string refused_action;
  /// The checkpoints table exists (schema 3 or later).
  bool has_checkpoints() const { return user_version >= 3; }
  /// The submissions and tasks tables exist (schema 4 or later).
  bool has_tasks() const { return user_version >= 4; }
  /// The trial_tags table exists (schema 6 or later).
  bool has_tags() const { return user_version >= 6; }

  ~Impl();
};

namespace detail {

/// "SELECT <every column of a TrialRow>" + more_columns + " FROM trials " + where.
/// absent: own columns the database lacks (an older schema opened read-only), read as NULL.
/// has_checkpoints: the database has the checkpoints table (else last_checkpoint_epoch is NULL);
/// has_tags: it has the trial_tags table (else the tags read as none).
std::string select_trials(const std::vector<std::string>& setting_columns,
                          const std::vector<std::string>& absent, bool has_checkpoints,
                          bool has_tags, const std::string& where,
                          const std::string& more_columns = "");
/// The TrialRow of the current row of a statement made from select_trials (read by name).
TrialRow read_trial(const std::vector<std::string>& setting_columns, const Stmt& s);
/// True only when the process certainly does not exist on this host.
bool process_is_gone(int64_t pid);
/// This host's name ("" when unknown).
std::string this_host();
/// Store::put_trial_state inside the caller's write transaction (path for messages).
int64_t put_trial_state(sqlite3* db, const std::string& path,
                        const std::vector<std::string>& setting_columns, bool has_checkpoints,
                        int64_t experiment_id, const TrialState& state);

/// The epochs table's measured columns (dps::epoch_metrics, epoch_metrics.cpp): adds those a
/// database lacks (read-write opens); the INSERT of an epoch with every metric (?1 trial_id,
/// ?2 epoch, then the metrics in list order, then recorded_at when asked: NULL keeps now);
/// binds a row to it (returns the next parameter index); the SELECT of a trial's epochs with the
/// metrics the table has (?1 trial_id); and one row of it, by column name.
void add_epoch_columns(sqlite3* db);
std::string epoch_insert_sql(bool or_replace, bool with_recorded_at);
int bind_epoch(Stmt& s, int64_t trial_id, const EpochRow& row);
std::string epoch_select_sql(sqlite3* db);
EpochRow read_epoch(const Stmt& s);

}  // namespace detail

}  // namespace dps
