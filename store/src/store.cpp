// dps::Store: opening (pragmas, version check, migrations) and the trial lifecycle.
// Every write is one short BEGIN IMMEDIATE transaction, so several runners can share a file:
// a writer waits for the lock (busy timeout) instead of failing, and nobody holds it long.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>

#include "sqlite_util.hpp"
#include "store_impl.hpp"

namespace dps {

using detail::Stmt;
using detail::WriteTransaction;

namespace {

constexpr int kBusyTimeoutMs = 10000;

const TrialStatus kAllStatuses[] = {
    TrialStatus::pending, TrialStatus::running,  TrialStatus::done,
    TrialStatus::failed,  TrialStatus::diverged, TrialStatus::interrupted,
    TrialStatus::skipped, TrialStatus::stopped,  TrialStatus::pruned};

void exec(sqlite3* db, const char* sql) {
  detail::sqlite_check(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), db, "sqlite3_exec",
                       __FILE__, __LINE__, sql);
}

// Switching a file to WAL needs an exclusive lock for a moment, and SQLite answers SQLITE_BUSY
// at once, without the busy handler, while another connection (a second dprun creating the
// same new file) holds a lock. The mode is stored in the file, so this runs once per file:
// retry until the busy timeout.
void enable_wal(sqlite3* db) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  for (;;) {
    {
      Stmt mode(db, "PRAGMA journal_mode");
      if (mode.step() && mode.text(0) == "wal") return;
    }
    const int rc = sqlite3_exec(db, "PRAGMA journal_mode = WAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return;
    if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) || std::chrono::steady_clock::now() > deadline)
      detail::sqlite_check(rc, db, "sqlite3_exec", __FILE__, __LINE__, "PRAGMA journal_mode = WAL");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

namespace detail {

std::string this_host() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// kill(pid, 0) can also fail with EPERM for a live process of another user, which must not
// count as dead.
bool process_is_gone(int64_t pid) {
  if (pid <= 0 || pid > INT_MAX) return false;  // 0 / negative would address process groups
  return kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH;
}

}  // namespace detail

const char* status_name(TrialStatus s) {
  switch (s) {
    case TrialStatus::pending:
      return "pending";
    case TrialStatus::running:
      return "running";
    case TrialStatus::done:
      return "done";
    case TrialStatus::failed:
      return "failed";
    case TrialStatus::diverged:
      return "diverged";
    case TrialStatus::interrupted:
      return "interrupted";
    case TrialStatus::skipped:
      return "skipped";
    case TrialStatus::stopped:
      return "stopped";
    case TrialStatus::pruned:
      return "pruned";
  }
  return "unknown";
}

TrialStatus parse_status(const std::string& s) {
  for (TrialStatus t : kAllStatuses) {
    if (s == status_name(t)) return t;
  }
  throw StoreError("unknown trial status \"" + s +
                   "\": expected one of pending, running, done, failed, diverged, interrupted, "
                   "skipped, stopped, pruned");
}

Store::Impl::~Impl() {
  if (db) SQLITE_CHECK_NOTHROW(db, sqlite3_close_v2(db));
}

Store::Store(const std::string& path, Mode mode, const std::vector<SettingColumn>& settings,
             Journal journal)
    : impl_(nullptr) {
  namespace fs = std::filesystem;
  if (path.empty()) throw StoreError("database path is empty: give a file name such as results.db");
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->mode = mode;

  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw StoreError(path + ": is a folder, not a database file; give a file name such as " +
                     (fs::path(path) / "results.db").string());
  }
  if (mode == Mode::read_only) {
    if (!fs::exists(path, ec)) {
      throw StoreError(path +
                       ": no such database file (opening read-only needs an existing database: "
                       "check the path, or run the experiment first)");
    }
  } else {
    fs::path parent = fs::path(path).parent_path();
    if (!parent.empty() && !fs::exists(parent, ec)) {
      fs::create_directories(parent, ec);
      if (ec) {
        throw StoreError(path + ": cannot create the folder " + parent.string() + ": " +
                         ec.message());
      }
    }
  }

  const int flags =
      mode == Mode::read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  int rc = sqlite3_open_v2(path.c_str(), &impl->db, flags, nullptr);
  if (rc != SQLITE_OK) {
    throw StoreError(path + ": cannot open the database: " +
                     (impl->db ? sqlite3_errmsg(impl->db) : sqlite3_errstr(rc)));
  }
  sqlite3* db = impl->db;
  SQLITE_CHECK(db, sqlite3_busy_timeout(db, kBusyTimeoutMs));

  try {
    // The first statement reads the file header: a file that is not a database fails here.
    int version = detail::read_user_version(db);
    if (version > schema_version()) {
      throw StoreError(path + ": database schema version " + std::to_string(version) +
                       " is newer than this dprun supports (" + std::to_string(schema_version()) +
                       "): upgrade dprun");
    }
    exec(db, "PRAGMA foreign_keys = ON");
    if (mode == Mode::read_write) {
      if (journal == Journal::wal) {
        // WAL lets readers (dprun query) run while a runner writes; NORMAL sync is safe in WAL
        // (a power loss may drop the last commits, never corrupt the file).
        enable_wal(db);
        exec(db, "PRAGMA synchronous = NORMAL");
      } else {
        // One writer, on whatever host, and readers only after it: no shared memory needed.
        // FULL: a commit is on the disk (or the file server) before the task goes on.
        exec(db, "PRAGMA journal_mode = DELETE");
        exec(db, "PRAGMA synchronous = FULL");
      }
      impl->user_version = detail::migrate(db, path);
      impl->setting_columns = detail::add_setting_columns(db, path, settings);
      detail::add_epoch_columns(db);
    } else {
      if (version == 0) {
        throw StoreError(path + ": not a dprun database (it has no dprun schema)");
      }
      impl->user_version = version;
      // As it is, never migrated (reading must not change a file): a setting column it lacks
      // reads as that setting's default in the caller, a column of a later schema as NULL.
      impl->setting_columns = detail::setting_columns(db);
      impl->absent_columns = detail::absent_own_columns(db);
    }
  } catch (const StoreError&) {
    if (sqlite3_errcode(db) == SQLITE_NOTADB) {
      throw StoreError(path + ": not an SQLite database (" + sqlite3_errmsg(db) +
                       "); give the path of a dprun results database or a new file name");
    }
    throw;
  }
  impl_ = impl.release();
}

Store::~Store() { delete impl_; }

Store::Store(Store&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}

Store& Store::operator=(Store&& other) noexcept {
  if (this != &other) {
    delete impl_;
    impl_ = std::exchange(other.impl_, nullptr);
  }
  return *this;
}

std::optional<int> experiment_defaults(const std::string& path, const std::string& name) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  {
    // A dprun creating the database right now: the file is there, its schema not yet (it is
    // written in one transaction). Nothing of the experiment yet, as if there were no file.
    sqlite3* raw = nullptr;
    bool creating = false;
    if (sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK &&
        sqlite3_busy_timeout(raw, kBusyTimeoutMs) == SQLITE_OK) {
      try {
        Stmt tables(raw, "SELECT COUNT(*) FROM sqlite_schema");
        creating = detail::read_user_version(raw) == 0 && tables.step() && tables.int64(0) == 0;
      } catch (const StoreError&) {
        // Not a database, or unreadable: the Store below says what is wrong.
      }
    }
    sqlite3_close(raw);
    if (creating) return std::nullopt;
  }
  Store store(path, Store::Mode::read_only);
  const auto found = store.find_experiment(name);
  if (!found) return std::nullopt;
  return found->defaults;
}

const std::string& Store::path() const { return impl_->path; }

const std::vector<std::string>& Store::setting_columns() const { return impl_->setting_columns; }

int Store::user_version() const { return impl_->user_version; }

int64_t Store::upsert_experiment(const std::string& name, const std::string& description,
                                 const std::string& toml_source, int defaults) {
  if (defaults < 1)
    throw StoreError(impl_->path + ": experiment \"" + name + "\": defaults generation " +
                     std::to_string(defaults) + " is not at least 1");
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  // The generation is written when the experiment is made, never updated.
  Stmt ins(db,
           "INSERT INTO experiments (name, description, toml_source, toml_sha256, defaults) "
           "VALUES (?1, ?2, ?3, ?4, ?5) "
           "ON CONFLICT (name) DO UPDATE SET description = excluded.description, "
           "  toml_source = excluded.toml_source, toml_sha256 = excluded.toml_sha256, "
           "  updated_at = " DPS_NOW_SQL
           " WHERE toml_sha256 != excluded.toml_sha256 OR description != excluded.description");
  ins.bind(1, name).bind(2, description).bind(3, toml_source).bind(4, sha256_hex(toml_source));
  ins.bind(5, int64_t{defaults});
  ins.run();
  Stmt sel(db, "SELECT id, defaults FROM experiments WHERE name = ?1");
  sel.bind(1, name);
  if (!sel.step()) throw StoreError(impl_->path + ": experiment \"" + name + "\" vanished");
  int64_t id = sel.int64(0);
  // The caller read its file with `defaults`' values for the keys it leaves out: trials of
  // another generation's defaults would be other trials (nothing is written: the transaction
  // rolls back).
  if (const int64_t stored = sel.int64(1); stored != defaults) {
    throw StoreError(impl_->path + ": experiment \"" + name + "\" was begun with the defaults of " +
                     "generation " + std::to_string(stored) + ", but its file was read with " +
                     "those of generation " + std::to_string(defaults) +
                     " (another dprun began it meanwhile?): run the command again");
  }
  txn.commit();
  return id;
}

TrialRow Store::ensure_trial(int64_t experiment_id, const std::string& config_hash, int64_t ordinal,
                             const SettingValues& settings) {
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  {
    Stmt e(db, "SELECT 1 FROM experiments WHERE id = ?1");
    e.bind(1, experiment_id);
    if (!e.step()) {
      throw StoreError(impl_->path + ": ensure_trial: no experiment with id " +
                       std::to_string(experiment_id));
    }
  }
  // Setting columns are named by the caller: only those the table has reach the statement, as
  // quoted identifiers; their values are bound.
  std::string columns = "experiment_id, config_hash, ordinal", params = "?1, ?2, ?3";
  int n = 3;
  for (const auto& [name, value] : settings) {
    const auto& have = impl_->setting_columns;
    if (std::find(have.begin(), have.end(), name) == have.end()) {
      throw StoreError(impl_->path + ": ensure_trial: trials has no setting column \"" + name +
                       "\" (describe it when opening the store)");
    }
    columns += ", \"" + name + "\"";
    params += ", ?" + std::to_string(++n);
  }
  Stmt ins(db,
           ("INSERT INTO trials (" + columns + ") VALUES (" + params +
            ") ON CONFLICT (experiment_id, config_hash) DO UPDATE SET ordinal = excluded.ordinal")
               .c_str());
  ins.bind(1, experiment_id).bind(2, config_hash).bind(3, ordinal);
  n = 3;
  for (const auto& [name, value] : settings) ins.bind(++n, value);
  ins.run();
  Stmt sel(db, detail::select_trials(impl_->setting_columns, impl_->absent_columns,
                                     impl_->has_checkpoints(), impl_->has_tags(),
                                     "WHERE trials.experiment_id = ?1 AND trials.config_hash = ?2")
                   .c_str());
  sel.bind(1, experiment_id).bind(2, config_hash);
  if (!sel.step()) throw StoreError(impl_->path + ": ensure_trial: the trial vanished");
  TrialRow row = detail::read_trial(impl_->setting_columns, sel);
  txn.commit();
  return row;
}

bool Store::claim_trial(int64_t trial_id, TrialStatus expected, int64_t runner_pid,
                        const std::string& host) {
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  Stmt up(db,
          "UPDATE trials SET status = 'running', runner_pid = ?3, host = ?4, "
          "  heartbeat_at = " DPS_NOW_SQL " WHERE id = ?1 AND status = ?2");
  up.bind(1, trial_id).bind(2, std::string(status_name(expected))).bind(3, runner_pid);
  up.bind_text_or_null(4, host);
  up.run();
  const bool claimed = sqlite3_changes(db) > 0;
  if (!claimed) {
    Stmt exists(db, "SELECT 1 FROM trials WHERE id = ?1");
    exists.bind(1, trial_id);
    if (!exists.step()) {
      throw StoreError(impl_->path + ": claim_trial: no trial with id " + std::to_string(trial_id));
    }
  }
  txn.commit();
  return claimed;
}

void Store::start_trial(int64_t trial_id, const TrialStart& start, int64_t resume_epoch) {
  if (resume_epoch < 0) {
    throw StoreError(impl_->path + ": start_trial: resume_epoch " + std::to_string(resume_epoch) +
                     " is negative");
  }
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  // Epochs of an earlier, unfinished attempt past where this one begins would mix with the new
  // run's: a start from scratch keeps none, a resumed one those up to its checkpoint.
  Stmt del(db, "DELETE FROM epochs WHERE trial_id = ?1 AND epoch > ?2");
  del.bind(1, trial_id).bind(2, resume_epoch);
  del.run();
  Stmt del_checkpoints(db, "DELETE FROM checkpoints WHERE trial_id = ?1 AND epoch > ?2");
  del_checkpoints.bind(1, trial_id).bind(2, resume_epoch);
  del_checkpoints.run();
  Stmt up(db,
          "UPDATE trials SET status = 'running', attempts = attempts + 1, error = NULL, "
          "  started_at = " DPS_NOW_SQL ", heartbeat_at = " DPS_NOW_SQL
          ", finished_at = NULL, "
          "  backend = ?2, devices = ?3, host = ?4, dprun_version = ?5, plugin_path = ?6, "
          "  plugin_sha256 = ?7, oversubscribed = ?8, runner_pid = ?9, hosts = ?10, launch = ?11, "
          "  device_set = ?12, resumed_from_epoch = ?13, data_residence = ?14, layout_used = ?15, "
          "  graphs_used = ?16 "
          "WHERE id = ?1");
  up.bind(1, trial_id);
  up.bind_text_or_null(2, start.backend).bind_text_or_null(3, start.devices);
  up.bind_text_or_null(4, start.host).bind_text_or_null(5, start.dprun_version);
  up.bind_text_or_null(6, start.plugin_path).bind_text_or_null(7, start.plugin_sha256);
  up.bind(8, int64_t{start.oversubscribed ? 1 : 0}).bind(9, start.runner_pid);
  up.bind_text_or_null(10, start.hosts).bind_text_or_null(11, start.launch);
  up.bind_text_or_null(12, start.device_set).bind_text_or_null(14, start.data_residence);
  up.bind_text_or_null(15, start.layout_used);
  if (start.graphs_used >= 0) {
    up.bind(16, start.graphs_used);
  } else {
    up.bind_null(16);
  }
  if (resume_epoch > 0) {
    up.bind(13, resume_epoch);
  } else {
    up.bind_null(13);
  }
  up.run();
  if (sqlite3_changes(db) == 0) {
    throw StoreError(impl_->path + ": start_trial: no trial with id " + std::to_string(trial_id));
  }
  txn.commit();
}

void Store::record_checkpoint(const CheckpointRow& row) {
  if (row.role != "last" && row.role != "best" && row.role != "epoch") {
    throw StoreError(impl_->path + ": record_checkpoint: role \"" + row.role +
                     "\": expected last, best or epoch");
  }
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  if (row.role != "epoch") {
    Stmt del(db, "DELETE FROM checkpoints WHERE trial_id = ?1 AND role = ?2");
    del.bind(1, row.trial_id).bind(2, row.role);
    del.run();
  }
  Stmt ins(db,
           "INSERT OR REPLACE INTO checkpoints (trial_id, role, epoch, path, sha256, bytes, "
           "optimizer_path, optimizer_sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  ins.bind(1, row.trial_id).bind(2, row.role).bind(3, row.epoch).bind(4, row.path);
  ins.bind(5, row.sha256).bind(6, row.bytes);
  ins.bind_text_or_null(7, row.optimizer_path).bind_text_or_null(8, row.optimizer_sha256);
  ins.run();
  txn.commit();
}

void Store::record_epoch(const EpochRow& row) {
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  Stmt hb(db, "UPDATE trials SET heartbeat_at = " DPS_NOW_SQL " WHERE id = ?1");
  hb.bind(1, row.trial_id);
  hb.run();
  if (sqlite3_changes(db) == 0) {
    throw StoreError(impl_->path + ": record_epoch: no trial with id " +
                     std::to_string(row.trial_id));
  }
  const std::string sql = detail::epoch_insert_sql(true, false);
  Stmt ins(db, sql.c_str());
  detail::bind_epoch(ins, row.trial_id, row);
  ins.run();
  txn.commit();
}

void Store::heartbeat(int64_t trial_id) {
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  Stmt hb(db, "UPDATE trials SET heartbeat_at = " DPS_NOW_SQL " WHERE id = ?1");
  hb.bind(1, trial_id);
  hb.run();
  if (sqlite3_changes(db) == 0) {
    throw StoreError(impl_->path + ": heartbeat: no trial with id " + std::to_string(trial_id));
  }
  txn.commit();
}

namespace {

// The attempt that just ended, as the trial row now tells it (an attempt of a trial that never
// started, attempts 0, is not one). Inside the caller's transaction. An attempt already recorded
// stays as it is: a runner that died between claiming a trial and starting its attempt leaves
// the attempt count of the one before, whose row must not be overwritten.
void record_attempt(sqlite3* db, int64_t trial_id) {
  Stmt attempt(db,
               "INSERT OR IGNORE INTO attempts (trial_id, attempt, status, error, started_at, "
               "  finished_at, resumed_from_epoch, epochs_done) "
               "SELECT id, attempts, status, error, started_at, finished_at, resumed_from_epoch, "
               "  (SELECT COUNT(*) FROM epochs WHERE trial_id = ?1) "
               "FROM trials WHERE id = ?1 AND attempts >= 1");
  attempt.bind(1, trial_id);
  attempt.run();
}

}  // namespace

void Store::finish_trial(int64_t trial_id, TrialStatus status, const std::string& error) {
  if (status == TrialStatus::pending || status == TrialStatus::running) {
    throw StoreError(impl_->path + ": finish_trial: " + status_name(status) +
                     " is not a final status (expected done, failed, diverged, interrupted or "
                     "skipped)");
  }
  sqlite3* db = impl_->db;
  WriteTransaction txn(db);
  Stmt up(db, "UPDATE trials SET status = ?2, error = ?3, finished_at = " DPS_NOW_SQL
              ", heartbeat_at = " DPS_NOW_SQL " WHERE id = ?1");
  up.bind(1, trial_id).bind(2, std::string(status_name(status))).bind_text_or_null(3, error);
  up.run();
  if (sqlite3_changes(db) == 0) {
    throw StoreError(impl_->path + ": finish_trial: no trial with id " + std::to_string(trial_id));
  }
  record_attempt(db, trial_id);
  txn.commit();
}

void Store::set_rung(int64_t trial_id, int64_t rung) {
  sqlite3* db = impl_->db;
  Stmt up(db, "UPDATE trials SET rung = ?2 WHERE id = ?1");
  up.bind(1, trial_id);
  if (rung >= 0) {
    up.bind(2, rung);
  } else {
    up.bind_null(2);
  }
  up.run();
  if (sqlite3_changes(db) == 0)
    throw StoreError(impl_->path + ": set_rung: no trial with id " + std::to_string(trial_id));
}

int Store::recover_stale(int64_t experiment_id, double stale_seconds) {
  sqlite3* db = impl_->db;
  const std::string host = detail::this_host();
  WriteTransaction txn(db);
  struct Stale {
    int64_t id, pid;
    std::string reason;
  };
  std::vector<Stale> stale;
  {
    Stmt s(db,
           "SELECT id, host, runner_pid, "
           "  (julianday('now') - julianday(heartbeat_at)) * 86400.0 "
           "FROM trials WHERE experiment_id = ?1 AND status = 'running'");
    s.bind(1, experiment_id);
    while (s.step()) {
      const int64_t pid = s.int64(2);
      // The pid says something only on the host that started it.
      const bool gone = !host.empty() && s.text(1) == host && detail::process_is_gone(pid);
      const bool silent = s.is_null(3) || s.real(3) > stale_seconds;
      if (gone) {
        stale.push_back({s.int64(0), pid, ""});
      } else if (silent) {
        std::string age = s.is_null(3) ? std::string("never")
                                       : std::to_string(static_cast<int64_t>(s.real(3))) + " s";
        stale.push_back({s.int64(0), pid, ": no heartbeat for " + age});
      }
    }
  }
  Stmt up(db, "UPDATE trials SET status = 'interrupted', error = ?2, finished_at = " DPS_NOW_SQL
              " WHERE id = ?1 AND status = 'running'");
  int count = 0;
  for (const Stale& t : stale) {
    up.bind(1, t.id).bind(2, "runner stopped without finishing this trial (pid " +
                                 std::to_string(t.pid) + ")" + t.reason);
    up.run();
    const int changed = sqlite3_changes(db);
    sqlite3_reset(up.get());
    if (changed > 0) record_attempt(db, t.id);
    count += changed;
  }
  txn.commit();
  return count;
}

}  // namespace dps
