#include "sqlite_util.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace dps::detail {

namespace {

std::string where(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

std::string failure_message(int rc, sqlite3* db, const char* call, const char* file, int line,
                            const char* sql) {
  std::string name = db_name(db);
  std::string m = name.empty() ? std::string("sqlite") : name;
  // sqlite3_errmsg describes the most recent failure on the connection; without a connection
  // (or when the code came from elsewhere) fall back to the generic text of the code.
  m += ": ";
  m += db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
    m += " (another dprun is writing this database and did not finish within the busy timeout;"
         " retry when it is done)";
  }
  m += " [in ";
  m += call;
  if (sql) {
    m += ", SQL: ";
    m += sql;
  }
  m += " at " + where(file, line) + "]";
  return m;
}

}  // namespace

std::string db_name(sqlite3* db) {
  if (!db) return "";
  const char* f = sqlite3_db_filename(db, "main");
  return f ? std::string(f) : std::string();
}

void sqlite_check(int rc, sqlite3* db, const char* call, const char* file, int line,
                  const char* sql) {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
  throw StoreError(failure_message(rc, db, call, file, line, sql));
}

void sqlite_check_nothrow(int rc, sqlite3* db, const char* call, const char* file,
                          int line) noexcept {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
  try {
    std::fprintf(stderr, "dprun store: %s\n",
                 failure_message(rc, db, call, file, line, nullptr).c_str());
  } catch (...) {
    std::fprintf(stderr, "dprun store: %s failed (%s)\n", call, sqlite3_errstr(rc));
  }
}

Stmt::Stmt(sqlite3* db, const char* sql) : db_(db) {
  sqlite_check(sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr), db, "sqlite3_prepare_v2", __FILE__,
               __LINE__, sql);
}

Stmt::~Stmt() { sqlite3_finalize(stmt_); }  // its result repeats the last step's error

Stmt& Stmt::bind(int i, int64_t v) {
  SQLITE_CHECK(db_, sqlite3_bind_int64(stmt_, i, v));
  return *this;
}

Stmt& Stmt::bind(int i, double v) {
  if (std::isnan(v)) return bind_null(i);
  SQLITE_CHECK(db_, sqlite3_bind_double(stmt_, i, v));
  return *this;
}

Stmt& Stmt::bind(int i, const std::string& v) {
  SQLITE_CHECK(db_,
               sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  return *this;
}

Stmt& Stmt::bind_text_or_null(int i, const std::string& v) {
  return v.empty() ? bind_null(i) : bind(i, v);
}

Stmt& Stmt::bind_null(int i) {
  SQLITE_CHECK(db_, sqlite3_bind_null(stmt_, i));
  return *this;
}

Stmt& Stmt::bind(int i, const SqlValue& v) {
  if (const auto* n = std::get_if<int64_t>(&v)) return bind(i, *n);
  if (const auto* d = std::get_if<double>(&v)) return bind(i, *d);
  if (const auto* t = std::get_if<std::string>(&v)) return bind(i, *t);
  return bind_null(i);
}

bool Stmt::step() {
  int rc = sqlite3_step(stmt_);
  sqlite_check(rc, db_, "sqlite3_step", __FILE__, __LINE__, sqlite3_sql(stmt_));
  return rc == SQLITE_ROW;
}

void Stmt::run() {
  while (step()) {
  }
}

int64_t Stmt::int64(int col) const { return sqlite3_column_int64(stmt_, col); }

double Stmt::real(int col) const {
  if (is_null(col)) return std::numeric_limits<double>::quiet_NaN();
  return sqlite3_column_double(stmt_, col);
}

std::string Stmt::text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  if (!p) return "";
  return std::string(reinterpret_cast<const char*>(p),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
}

bool Stmt::is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

SqlValue Stmt::value(int col) const {
  switch (sqlite3_column_type(stmt_, col)) {
    case SQLITE_NULL:
      return std::monostate{};
    case SQLITE_INTEGER:
      return int64(col);
    case SQLITE_FLOAT:
      return sqlite3_column_double(stmt_, col);
    default:
      return text(col);
  }
}

int Stmt::find_column(const std::string& name) const {
  if (names_.empty()) {
    for (int c = 0; c < sqlite3_column_count(stmt_); ++c) {
      const char* n = sqlite3_column_name(stmt_, c);
      names_.emplace_back(n ? n : "");
    }
  }
  for (size_t c = 0; c < names_.size(); ++c)
    if (names_[c] == name) return static_cast<int>(c);
  return -1;
}

int Stmt::column(const std::string& name) const {
  if (const int c = find_column(name); c >= 0) return c;
  throw StoreError(db_name(db_) + ": no result column \"" + name + "\" in: " + sqlite3_sql(stmt_));
}

std::optional<double> Stmt::real_or_null(const std::string& name) const {
  const int c = column(name);
  if (is_null(c)) return std::nullopt;
  return real(c);
}

WriteTransaction::WriteTransaction(sqlite3* db) : db_(db) {
  SQLITE_CHECK(db_, sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr));
  open_ = true;
}

WriteTransaction::~WriteTransaction() {
  // Some errors (SQLITE_FULL, SQLITE_IOERR...) roll back on their own; then there is nothing
  // left to roll back and ROLLBACK would only report a second, misleading error.
  if (open_ && !sqlite3_get_autocommit(db_)) {
    SQLITE_CHECK_NOTHROW(db_, sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr));
  }
}

void WriteTransaction::commit() {
  SQLITE_CHECK(db_, sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr));
  open_ = false;
}

int read_user_version(sqlite3* db) {
  Stmt s(db, "PRAGMA user_version");
  s.step();
  return static_cast<int>(s.int64(0));
}

}  // namespace dps::detail
