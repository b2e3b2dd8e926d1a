// The database schema: its forward migrations, and the setting columns of `trials`, which come
// from the caller's descriptions instead (with the views that list them). Table and column names
// are a documented interface: users query them with plain SQL (`dprun query`), so they change
// only through a new migration, never by editing an applied one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "sqlite_util.hpp"
#include "views.hpp"

namespace dps {

namespace {

struct Migration {
  int version;      // user_version after applying `sql`
  const char* sql;  // DDL only: no values, so plain text is fine here
};

// Version 1: experiments, trials, epochs and the two views.
constexpr const char* kSchemaV1 = R"SQL(
CREATE TABLE experiments (
  id          INTEGER PRIMARY KEY,
  name        TEXT NOT NULL UNIQUE,
  description TEXT NOT NULL DEFAULT '',
  toml_source TEXT NOT NULL,
  toml_sha256 TEXT NOT NULL,
  created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
  updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);

-- One row per trial of a sweep. Every resolved setting is its own column (model_options holds
-- the plugin options as canonical JSON). Columns that describe a run (backend ... heartbeat_at)
-- are NULL until the trial first starts.
CREATE TABLE trials (
  id              INTEGER PRIMARY KEY,
  experiment_id   INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
  config_hash     TEXT NOT NULL,
  ordinal         INTEGER NOT NULL,
  model           TEXT NOT NULL,
  model_options   TEXT NOT NULL DEFAULT '{}',
  dataset         TEXT NOT NULL,
  data_path       TEXT NOT NULL,
  gpus            INTEGER NOT NULL,
  batch_size      INTEGER NOT NULL,
  per_gpu_batch   INTEGER NOT NULL,
  lr              REAL NOT NULL,
  epochs          INTEGER NOT NULL,
  seed            INTEGER NOT NULL,
  optimizer       TEXT NOT NULL,
  momentum        REAL NOT NULL,
  weight_decay    REAL NOT NULL,
  precision       TEXT NOT NULL,
  layout          TEXT NOT NULL,
  bn_mode         TEXT NOT NULL,
  eval_batch_size INTEGER NOT NULL,
  train_limit     INTEGER NOT NULL,
  test_limit      INTEGER NOT NULL,
  backend_request TEXT NOT NULL,
  status          TEXT NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'done', 'failed', 'diverged',
                                    'interrupted', 'skipped')),
  error           TEXT,
  attempts        INTEGER NOT NULL DEFAULT 0,
  backend         TEXT,
  devices         TEXT,
  oversubscribed  INTEGER NOT NULL DEFAULT 0 CHECK (oversubscribed IN (0, 1)),
  host            TEXT,
  dprun_version   TEXT,
  plugin_path     TEXT,
  plugin_sha256   TEXT,
  runner_pid      INTEGER,
  created_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
  started_at      TEXT,
  finished_at     TEXT,
  heartbeat_at    TEXT,
  UNIQUE (experiment_id, config_hash)
);
CREATE INDEX trials_by_ordinal ON trials(experiment_id, ordinal);
CREATE INDEX trials_by_status ON trials(status);
CREATE INDEX trials_by_model ON trials(experiment_id, model, per_gpu_batch, gpus);

-- One row per finished epoch (1-based). A NaN metric (a diverged trial) is stored as NULL.
CREATE TABLE epochs (
  trial_id            INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  epoch               INTEGER NOT NULL CHECK (epoch >= 1),
  train_loss          REAL,
  train_acc           REAL,
  test_acc            REAL,
  seconds             REAL,
  examples_per_second REAL,
  lr                  REAL,
  eval_seconds        REAL,
  peak_memory_bytes   INTEGER,
  recorded_at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
  PRIMARY KEY (trial_id, epoch)
);

CREATE VIEW trial_summary AS
-- One row per trial: its settings, status and what its epochs achieved.
--   final_test_acc / final_train_loss: of the last recorded epoch.
--   best_test_acc: the highest test accuracy over all epochs.
--   mean_seconds_per_epoch: mean of epochs.seconds EXCLUDING EPOCH 1 when the trial has more
--     than one epoch, because epoch 1 includes warm-up (allocations, library autotuning, first
--     touch of the data) and would bias timings and speedups; with a single epoch it is that
--     epoch's seconds. total_seconds sums every epoch, warm-up included.
SELECT
  e.name AS experiment, t.experiment_id, t.id AS trial_id, t.ordinal, t.config_hash,
  t.model, t.model_options, t.dataset, t.data_path, t.gpus, t.batch_size, t.per_gpu_batch,
  t.lr, t.epochs, t.seed, t.optimizer, t.momentum, t.weight_decay, t.precision, t.layout,
  t.bn_mode, t.eval_batch_size, t.train_limit, t.test_limit, t.backend_request,
  t.status, t.error, t.attempts,
  COALESCE(a.n, 0) AS epochs_done,
  last.test_acc AS final_test_acc,
  a.best_test_acc,
  CASE WHEN a.n > 1 THEN a.mean_after_first ELSE a.mean_all END AS mean_seconds_per_epoch,
  last.train_loss AS final_train_loss,
  a.total_seconds,
  t.backend, t.devices, t.oversubscribed, t.host, t.started_at, t.finished_at
FROM trials t
JOIN experiments e ON e.id = t.experiment_id
LEFT JOIN (
  SELECT trial_id, COUNT(*) AS n, MAX(epoch) AS last_epoch, MAX(test_acc) AS best_test_acc,
         AVG(seconds) AS mean_all, AVG(CASE WHEN epoch > 1 THEN seconds END) AS mean_after_first,
         SUM(seconds) AS total_seconds
  FROM epochs GROUP BY trial_id
) a ON a.trial_id = t.id
LEFT JOIN epochs last ON last.trial_id = t.id AND last.epoch = a.last_epoch;

CREATE VIEW scaling AS
-- Done trials with their speedup over the 1-GPU trial of the same configuration:
--   speedup = baseline seconds / this trial's mean_seconds_per_epoch; efficiency = speedup / gpus.
-- The baseline is the done 1-GPU trial of the same experiment, model, per_gpu_batch and backend
-- that also shares every other setting that changes the cost of an epoch (model_options,
-- dataset, precision, layout, bn_mode, optimizer, train_limit, test_limit, eval_batch_size);
-- settings that may legitimately vary with gpus (batch_size, lr) or between repeats (seed,
-- momentum, weight_decay, epochs) are not matched, and several matching 1-GPU trials (e.g. a
-- seed sweep) are averaged. speedup and efficiency are NULL when there is no such 1-GPU trial.
-- Seconds are mean_seconds_per_epoch of trial_summary (epoch 1, the warm-up, excluded).
SELECT
  s.experiment, s.experiment_id, s.trial_id, s.model, s.per_gpu_batch, s.backend, s.gpus,
  s.batch_size, s.lr, s.seed, s.precision, s.bn_mode, s.mean_seconds_per_epoch,
  b.base_seconds / s.mean_seconds_per_epoch AS speedup,
  b.base_seconds / s.mean_seconds_per_epoch / s.gpus AS efficiency,
  s.final_test_acc
FROM trial_summary s
LEFT JOIN (
  SELECT experiment_id, model, model_options, dataset, per_gpu_batch, backend, precision, layout,
         bn_mode, optimizer, train_limit, test_limit, eval_batch_size,
         AVG(mean_seconds_per_epoch) AS base_seconds
  FROM trial_summary
  WHERE status = 'done' AND gpus = 1
  GROUP BY experiment_id, model, model_options, dataset, per_gpu_batch, backend, precision,
           layout, bn_mode, optimizer, train_limit, test_limit, eval_batch_size
) b ON b.experiment_id = s.experiment_id AND b.model = s.model
   AND b.model_options = s.model_options AND b.dataset = s.dataset
   AND b.per_gpu_batch = s.per_gpu_batch AND b.backend IS s.backend
   AND b.precision = s.precision AND b.layout = s.layout AND b.bn_mode = s.bn_mode
   AND b.optimizer = s.optimizer AND b.train_limit = s.train_limit
   AND b.test_limit = s.test_limit AND b.eval_batch_size = s.eval_batch_size
WHERE s.status = 'done';
)SQL";

// Version 2 (trials across processes, several trials at once): how a trial ran. NULL for trials
// that have not started since. hosts: the host of every process of the trial, grouped in rank
// order ("nodeA x8, nodeB x8"); launch: the command that started the trial process (mpirun or
// srun for a trial of several processes); device_set: the GPUs or CPU cores `--jobs` gave the
// trial ("gpus 2,3", "cores 0,1"; NULL: the whole machine).
constexpr const char* kSchemaV2 = R"SQL(
ALTER TABLE trials ADD COLUMN hosts TEXT;
ALTER TABLE trials ADD COLUMN launch TEXT;
ALTER TABLE trials ADD COLUMN device_set TEXT;
)SQL";

// Version 3 (checkpoints and resuming): the model files a trial wrote, and where its last
// attempt began.
//   checkpoints: one row per file the trial keeps. role 'last' (one per trial: the last completed
//     epoch, with the optimizer's state beside it, which resuming reads), 'best' (one per trial:
//     the epoch of the highest test accuracy so far) or 'epoch' (one per epoch, checkpoint =
//     "every"). path is the model (PyTorch's state_dict as safetensors), relative to the
//     database's folder unless absolute; sha256 and bytes are the file's.
//   trials.resumed_from_epoch: the checkpoint epoch the trial's last attempt continued from (its
//     epochs up to it come from earlier attempts); NULL: the last attempt started at epoch 1.
constexpr const char* kSchemaV3 = R"SQL(
CREATE TABLE checkpoints (
  trial_id         INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  role             TEXT NOT NULL CHECK (role IN ('last', 'best', 'epoch')),
  epoch            INTEGER NOT NULL CHECK (epoch >= 1),
  path             TEXT NOT NULL,
  sha256           TEXT NOT NULL,
  bytes            INTEGER NOT NULL,
  optimizer_path   TEXT,
  optimizer_sha256 TEXT,
  recorded_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
  PRIMARY KEY (trial_id, role, epoch)
);
ALTER TABLE trials ADD COLUMN resumed_from_epoch INTEGER;
)SQL";

// Version 4 (sweeps on a cluster): trials run elsewhere as the tasks of a batch scheduler's job
// (a Slurm job array), each task writing its own small database, which a merge folds into this
// one. SQLite is not shared across hosts: only the host that submits and merges opens this file.
//   submissions: one per job handed to the scheduler. job_id is the scheduler's (NULL until it
//     answered); folder holds the task databases, relative to this database's folder unless
//     absolute; command is how it was submitted.
//   tasks: one per task of a submission, each one attempt at one trial. database is the task's
//     own database (relative like folder); base_attempts the trial's attempts when submitted (a
//     task database holding more has started the trial). state: submitted (not collected yet),
//     merged (its database was folded in; status and error are the trial's at the task's end),
//     lost (it ended without a result; error says why). closed_at: when it was merged or lost.
constexpr const char* kSchemaV4 = R"SQL(
CREATE TABLE submissions (
  id            INTEGER PRIMARY KEY,
  experiment_id INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
  scheduler     TEXT NOT NULL,
  job_id        TEXT,
  folder        TEXT NOT NULL,
  command       TEXT NOT NULL,
  submitted_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);
CREATE TABLE tasks (
  submission_id INTEGER NOT NULL REFERENCES submissions(id) ON DELETE CASCADE,
  task_index    INTEGER NOT NULL CHECK (task_index >= 0),
  trial_id      INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  database      TEXT NOT NULL,
  base_attempts INTEGER NOT NULL,
  state         TEXT NOT NULL DEFAULT 'submitted' CHECK (state IN ('submitted', 'merged', 'lost')),
  status        TEXT,
  error         TEXT,
  closed_at     TEXT,
  PRIMARY KEY (submission_id, task_index)
);
CREATE INDEX tasks_by_trial ON tasks(trial_id);
CREATE INDEX tasks_open ON tasks(state) WHERE state = 'submitted';
)SQL";

// Version 5 (sweeps that stop trials early, and retries):
//   trials.status may also be 'stopped' (its stopping rule ended it before its last epoch: the
//     reason is in error) and 'pruned' (a [search] scheduler did not promote it past the epoch
//     it reached; a later run may promote it). SQLite cannot alter a CHECK constraint, so the
//     statement in sqlite_schema is widened in place, as SQLite's documentation describes for
//     constraint changes that no existing row can violate (lang_altertable.html, "Making Other
//     Kinds Of Table Schema Changes"); the schema cookie is bumped so that other connections
//     read the schema again (migrate()). The ALTER TABLE comes first: SQLite edits the
//     statement's text at offsets it parsed before, which the rewrite would move.
//   attempts: one row per finished attempt at a trial (trials.attempts counts them): how it
//     ended and why, when it ran, the checkpoint it continued from, the epochs it had then.
//   trials.rung: under a [search] scheduler (asha), the rung the trial may run to (0: the first
//     rung's epoch; a promotion raises it); NULL outside a scheduler.
constexpr const char* kSchemaV5 = R"SQL(
ALTER TABLE trials ADD COLUMN rung INTEGER;
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql, '''interrupted'', ''skipped'')',
                  '''interrupted'', ''skipped'', ''stopped'', ''pruned'')')
WHERE type = 'table' AND name = 'trials';
PRAGMA writable_schema = OFF;
CREATE TABLE attempts (
  trial_id           INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  attempt            INTEGER NOT NULL CHECK (attempt >= 1),
  status             TEXT NOT NULL,
  error              TEXT,
  started_at         TEXT,
  finished_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
  resumed_from_epoch INTEGER,
  epochs_done        INTEGER NOT NULL,
  PRIMARY KEY (trial_id, attempt)
);
)SQL";

// Version 6 (the user's words about trials: dprun tag, dprun note, dprun forget):
//   trial_tags: one row per tag of a trial, a name of 1 to 64 of A-Z a-z 0-9 _ . - (no commas,
//     so the trial_summary view's comma-separated list reads back as it was). A table of its
//     own, not a list in a column: a tag is added or removed without rewriting the others, one
//     index finds the trials of a tag (--filter tag=NAME), and the pair is unique.
//   trials.note: the trial's note, NULL for none. A column, not a table: a trial has at most one
//     note, read with the rest of its row, and it goes when the trial goes.
// Deleting a trial (forget) takes its tags along (ON DELETE CASCADE), as its epochs.
constexpr const char* kSchemaV6 = R"SQL(
ALTER TABLE trials ADD COLUMN note TEXT;
CREATE TABLE trial_tags (
  trial_id  INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  tag       TEXT NOT NULL
            CHECK (length(tag) BETWEEN 1 AND 64 AND tag NOT GLOB '*[^-A-Za-z0-9_.]*'),
  tagged_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
  PRIMARY KEY (trial_id, tag)
);
CREATE INDEX trial_tags_by_tag ON trial_tags(tag);
)SQL";

// Version 7 (data larger than the device's budget is streamed from host memory):
//   trials.data_residence: where the attempt kept its datasets, "device" (uploaded once) or
//     "streamed" (in host memory, copied to the device in chunks of steps: data_budget_mib); NULL
//     before the trial ran, and for trials run by an older dprun (always on the device then).
//     A fact of the run, not a setting: both paths compute the same bits.
constexpr const char* kSchemaV7 = R"SQL(
ALTER TABLE trials ADD COLUMN data_residence TEXT CHECK (data_residence IN ('device', 'streamed'));
)SQL";

// Version 8 (a setting's default may change: layout "nchw" became "auto"):
//   experiments.defaults: the generation of the settings' defaults the experiment was begun
//     with (dprun's kDefaultsGeneration then). A key its file leaves out keeps meaning what it
//     meant then, so a file run again against its database yields the trials it stored. Every
//     experiment begun by an older dprun is generation 1.
//   trials.layout_used: the activation layout the trial's last attempt ran with, "nchw" or
//     "nhwc" (layout = "auto" resolves on the machine that runs the trial); NULL before the
//     trial ran, and for trials run by an older dprun (which ran the layout setting as given).
constexpr const char* kSchemaV8 = R"SQL(
ALTER TABLE experiments ADD COLUMN defaults INTEGER NOT NULL DEFAULT 1 CHECK (defaults >= 1);
ALTER TABLE trials ADD COLUMN layout_used TEXT CHECK (layout_used IN ('nchw', 'nhwc'));
)SQL";

// Version 9 (graphs false became "auto", resolved on the machine that runs the trial):
//   trials.graphs_used: whether the trial's last attempt captured its steps (CUDA graphs, or the
//     CPU's recording), 1 or 0; NULL before the trial ran, and for trials run by an older dprun
//     (which ran the graphs setting as given).
constexpr const char* kSchemaV9 = R"SQL(
ALTER TABLE trials ADD COLUMN graphs_used INTEGER CHECK (graphs_used IN (0, 1));
)SQL";

// Append new versions here ({10, kSchemaV10}, ...); applied ones are never edited.
constexpr Migration kMigrations[] = {
    {1, kSchemaV1}, {2, kSchemaV2}, {3, kSchemaV3}, {4, kSchemaV4}, {5, kSchemaV5},
    {6, kSchemaV6}, {7, kSchemaV7}, {8, kSchemaV8}, {9, kSchemaV9},
};

}  // namespace

int schema_version() { return kMigrations[std::size(kMigrations) - 1].version; }

namespace detail {

namespace {

[[noreturn]] void throw_newer(const std::string& path, int found) {
  throw StoreError(path + ": database schema version " + std::to_string(found) +
                   " is newer than this dprun supports (" + std::to_string(schema_version()) +
                   "): upgrade dprun");
}

}  // namespace

int migrate(sqlite3* db, const std::string& path) {
  int found = read_user_version(db);
  if (found > schema_version()) throw_newer(path, found);
  if (found == schema_version()) return found;

  WriteTransaction txn(db);
  // Another process (a second dprun on the same new file) may have migrated between the read
  // above and taking the write lock: read again before judging the file by its tables.
  found = read_user_version(db);
  if (found > schema_version()) throw_newer(path, found);
  if (found == schema_version()) return found;  // the transaction rolls back: nothing to do
  if (found == 0) {
    // Version 0 is a brand-new file; one that already has tables belongs to someone else.
    Stmt tables(db, "SELECT COUNT(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'");
    tables.step();
    if (tables.int64(0) > 0) {
      throw StoreError(path +
                       ": an SQLite database, but not a dprun one (it has tables and no dprun "
                       "schema version); give a new file name or an existing dprun database");
    }
  }
  // Version 5 edits sqlite_schema, which SQLite's defensive mode (off by default, but a build
  // may turn it on) forbids; this connection is dprun's own.
  SQLITE_CHECK(db, sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 0, nullptr));
  for (const Migration& m : kMigrations) {
    if (m.version <= found) continue;
    SQLITE_CHECK(db, sqlite3_exec(db, m.sql, nullptr, nullptr, nullptr));
    // A migration that rewrote a statement in sqlite_schema (version 5) bumps the schema cookie,
    // so that every connection parses the schema again.
    if (std::strstr(m.sql, "writable_schema") != nullptr) {
      int64_t cookie = 0;
      {
        Stmt read(db, "PRAGMA schema_version");
        read.step();
        cookie = read.int64(0);
      }
      const std::string bump = "PRAGMA schema_version = " + std::to_string(cookie + 1);
      SQLITE_CHECK(db, sqlite3_exec(db, bump.c_str(), nullptr, nullptr, nullptr));
      Stmt check(db, "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'trials'");
      if (!check.step() || check.text(0).find("'pruned'") == std::string::npos)
        throw StoreError(path + ": migrating to schema version " + std::to_string(m.version) +
                         ": the trials table's status check is not the one dprun wrote, so it "
                         "could not be widened; nothing was changed");
    }
    // PRAGMA takes no bound parameters; the value is our own integer constant.
    const std::string set_version = "PRAGMA user_version = " + std::to_string(m.version);
    SQLITE_CHECK(db, sqlite3_exec(db, set_version.c_str(), nullptr, nullptr, nullptr));
  }
  txn.commit();
  return schema_version();
}

const std::vector<std::string>& own_trial_columns() {
  // The columns of `trials` the store defines itself (schema versions 1 to 9); every other
  // column records a setting. A migration that adds a column of the store's own must add it here.
  static const std::vector<std::string> columns = {"id",
                                                   "experiment_id",
                                                   "config_hash",
                                                   "ordinal",
                                                   "status",
                                                   "error",
                                                   "attempts",
                                                   "backend",
                                                   "devices",
                                                   "oversubscribed",
                                                   "host",
                                                   "dprun_version",
                                                   "plugin_path",
                                                   "plugin_sha256",
                                                   "runner_pid",
                                                   "created_at",
                                                   "started_at",
                                                   "finished_at",
                                                   "heartbeat_at",
                                                   "hosts",
                                                   "launch",
                                                   "device_set",
                                                   "resumed_from_epoch",
                                                   "rung",
                                                   "note",
                                                   "data_residence",
                                                   "layout_used",
                                                   "graphs_used"};
  return columns;
}

std::vector<std::string> setting_columns(sqlite3* db) {
  const auto& own = own_trial_columns();
  std::vector<std::string> out;
  Stmt s(db, "SELECT name FROM pragma_table_info('trials') ORDER BY cid");
  while (s.step()) {
    std::string name = s.text(0);
    if (std::find(own.begin(), own.end(), name) == own.end()) out.push_back(std::move(name));
  }
  return out;
}

std::vector<std::string> absent_own_columns(sqlite3* db) {
  std::set<std::string> have;
  Stmt s(db, "SELECT name FROM pragma_table_info('trials')");
  while (s.step()) have.insert(s.text(0));
  std::vector<std::string> absent;
  for (const auto& c : own_trial_columns())
    if (!have.count(c)) absent.push_back(c);
  return absent;
}

namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// Column type and DEFAULT clause of a described column. Names and defaults come from the
// caller's description, never from user input, and are checked before they reach DDL (which
// takes no bound parameters).
std::string column_definition(const SettingColumn& c) {
  if (const auto* i = std::get_if<int64_t>(&c.default_value))
    return "INTEGER NOT NULL DEFAULT " + std::to_string(*i);
  if (const auto* d = std::get_if<double>(&c.default_value)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", *d);
    std::string text = buf;
    if (text.find_first_of(".e") == std::string::npos) text += ".0";
    return "REAL NOT NULL DEFAULT " + text;
  }
  std::string quoted = "'";
  for (char ch : std::get<std::string>(c.default_value))
    quoted += ch == '\'' ? "''" : std::string(1, ch);
  return "TEXT NOT NULL DEFAULT " + quoted + "'";
}

void check_descriptions(const std::string& path, const std::vector<SettingColumn>& described) {
  const auto& own = own_trial_columns();
  std::set<std::string> seen;
  for (const SettingColumn& c : described) {
    auto bad = [&](const std::string& why) {
      return StoreError(path + ": setting column \"" + c.name + "\": " + why);
    };
    if (!is_identifier(c.name)) throw bad("a column name is [a-z][a-z0-9_]*");
    if (std::find(own.begin(), own.end(), c.name) != own.end())
      throw bad("is one of the store's own trial columns");
    if (!seen.insert(c.name).second) throw bad("described twice");
    if (std::holds_alternative<std::monostate>(c.default_value)) throw bad("needs a default");
    if (const auto* d = std::get_if<double>(&c.default_value); d && !std::isfinite(*d))
      throw bad("the default must be finite");
  }
}

std::string view_sql(sqlite3* db, const char* name) {
  Stmt s(db, "SELECT sql FROM sqlite_schema WHERE type = 'view' AND name = ?1");
  s.bind(1, std::string(name));
  return s.step() ? s.text(0) : "";
}

// What opening would change: the described columns the table lacks, and the views when they
// differ from those of its setting columns. The views are left alone when the table has
// setting columns the caller does not describe (a newer dprun added them): an older dprun does
// not know whether their baselines may differ, and would otherwise undo the newer one's views.
struct SettingsPlan {
  std::vector<const SettingColumn*> missing;
  bool views = false;
  bool empty() const { return missing.empty() && !views; }
};

SettingsPlan plan_settings(sqlite3* db, const std::vector<SettingColumn>& described,
                           std::vector<std::string> columns) {
  SettingsPlan plan;
  std::set<std::string> have(columns.begin(), columns.end()), known, may_differ;
  for (const SettingColumn& c : described) {
    known.insert(c.name);
    if (c.baseline_may_differ) may_differ.insert(c.name);
    if (!have.count(c.name)) {
      plan.missing.push_back(&c);
      columns.push_back(c.name);
    }
  }
  for (const auto& c : columns)
    if (!known.count(c)) return plan;  // columns of a newer dprun: its views stay
  plan.views = view_sql(db, "trial_summary") != trial_summary_view(columns) ||
               view_sql(db, "scaling") != scaling_view(columns, may_differ);
  return plan;
}

void exec_sql(sqlite3* db, const std::string& sql) {
  sqlite_check(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), db, "sqlite3_exec",
               __FILE__, __LINE__, sql.c_str());
}

}  // namespace

std::vector<std::string> add_setting_columns(sqlite3* db, const std::string& path,
                                             const std::vector<SettingColumn>& described) {
  check_descriptions(path, described);
  if (plan_settings(db, described, setting_columns(db)).empty()) return setting_columns(db);
  WriteTransaction txn(db);
  // Another dprun may have done it between the look above and taking the write lock.
  const SettingsPlan plan = plan_settings(db, described, setting_columns(db));
  for (const SettingColumn* c : plan.missing)
    exec_sql(db, "ALTER TABLE trials ADD COLUMN \"" + c->name + "\" " + column_definition(*c));
  const std::vector<std::string> columns = setting_columns(db);
  if (plan.views) {
    std::set<std::string> may_differ;
    for (const SettingColumn& c : described)
      if (c.baseline_may_differ) may_differ.insert(c.name);
    exec_sql(db, "DROP VIEW IF EXISTS scaling");
    exec_sql(db, "DROP VIEW IF EXISTS trial_summary");
    exec_sql(db, trial_summary_view(columns));
    exec_sql(db, scaling_view(columns, may_differ));
  }
  txn.commit();
  return columns;
}

}  // namespace detail

}  // namespace dps
