#pragma once
// Private helpers of the store: the SQLITE_CHECK macro and a prepared-statement wrapper that
// binds parameters by position (values never reach SQL text) and reads result columns by name.
#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dpstore/store.hpp"

namespace dps::detail {

/// Throws StoreError when rc is not SQLITE_OK / SQLITE_ROW / SQLITE_DONE. The message names the
/// database file, SQLite's own error string, the failing C++ statement (and the SQL when known)
/// and file:line.
void sqlite_check(int rc, sqlite3* db, const char* call, const char* file, int line,
                  const char* sql = nullptr);
/// For destructors: reports a failure on stderr instead of throwing.
void sqlite_check_nothrow(int rc, sqlite3* db, const char* call, const char* file,
                          int line) noexcept;

#define SQLITE_CHECK(db, call) ::dps::detail::sqlite_check((call), (db), #call, __FILE__, __LINE__)
#define SQLITE_CHECK_NOTHROW(db, call) \
  ::dps::detail::sqlite_check_nothrow((call), (db), #call, __FILE__, __LINE__)

/// The database file a connection is open on, for messages ("" for in-memory).
std::string db_name(sqlite3* db);

/// Current time as stored everywhere: ISO 8601 UTC with milliseconds, computed by SQLite.
#define DPS_NOW_SQL "strftime('%Y-%m-%dT%H:%M:%fZ','now')"

/// One prepared statement; parameters are 1-based as in SQLite.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql);
  ~Stmt();
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v);
  Stmt& bind(int i, double v);  // NaN is stored as NULL (SQLite has no NaN)
  Stmt& bind(int i, const std::string& v);
  Stmt& bind_text_or_null(int i, const std::string& v);  // "" -> NULL
  Stmt& bind_null(int i);
  Stmt& bind(int i, const SqlValue& v);

  /// Steps once: true when a row is available, false when done.
  bool step();
  /// Steps to completion (for statements that return no rows).
  void run();

  int64_t int64(int col) const;
  double real(int col) const;       // NULL -> NaN
  std::string text(int col) const;  // NULL -> ""
  bool is_null(int col) const;
  SqlValue value(int col) const;  // as stored: NULL, INTEGER, REAL or TEXT (a BLOB as TEXT)

  /// The same by result column name (as the SELECT names it, alias included), so a reader does
  /// not depend on the order of a column list. StoreError naming the statement when absent.
  int column(const std::string& name) const;
  /// The same, or -1 when the statement has no such column.
  int find_column(const std::string& name) const;
  int64_t int64(const std::string& name) const { return int64(column(name)); }
  double real(const std::string& name) const { return real(column(name)); }
  std::string text(const std::string& name) const { return text(column(name)); }
  bool is_null(const std::string& name) const { return is_null(column(name)); }
  std::optional<double> real_or_null(const std::string& name) const;

  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  mutable std::vector<std::string> names_;  // result column names, read on first use
};

/// BEGIN IMMEDIATE ... COMMIT. Takes the write lock at once (waiting up to the busy timeout)
/// so that a transaction never has to upgrade a read lock, which SQLite would answer with an
/// immediate SQLITE_BUSY instead of waiting. Rolls back when destroyed uncommitted.
class WriteTransaction {
 public:
  explicit WriteTransaction(sqlite3* db);
  ~WriteTransaction();
  WriteTransaction(const WriteTransaction&) = delete;
  WriteTransaction& operator=(const WriteTransaction&) = delete;
  void commit();

 private:
  sqlite3* db_;
  bool open_ = false;
};

/// Applies every migration after the database's user_version, in one write transaction.
/// Refuses a database newer than this build. Returns the resulting user_version.
int migrate(sqlite3* db, const std::string& path);
/// Reads PRAGMA user_version.
int read_user_version(sqlite3* db);

/// The columns of `trials` the store defines itself; every other one records a setting.
const std::vector<std::string>& own_trial_columns();
/// The setting columns of `trials`, in table order.
std::vector<std::string> setting_columns(sqlite3* db);
/// The store's own columns `trials` lacks (a database of an older schema, read as it is).
std::vector<std::string> absent_own_columns(sqlite3* db);
/// Adds the described setting columns `trials` lacks (each filled with its default) and
/// regenerates the views when they do not list the setting columns the table has, in one write
/// transaction, only when something changes. Returns the setting columns, in table order.
std::vector<std::string> add_setting_columns(sqlite3* db, const std::string& path,
                                             const std::vector<SettingColumn>& described);

}  // namespace dps::detail
