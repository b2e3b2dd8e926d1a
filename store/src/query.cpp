// Store::query: one user-written SQL statement with no side effects (`dprun query "SQL"`).
// sqlite3_stmt_readonly catches statements that write the file; an authorizer also refuses
// what it lets through but still changes state: transaction control (BEGIN would leave the
// connection inside a transaction), ATTACH/DETACH (ATTACH creates files) and PRAGMAs that set
// something (foreign_keys = OFF would silently change this connection).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>

#include "sqlite_util.hpp"
#include "store_impl.hpp"

namespace dps {

namespace {

// PRAGMAs that only report, with or without an argument (table_info(trials) ...).
constexpr const char* kReportingPragmas[] = {
    "table_info",      "table_xinfo", "table_list",       "index_list",
    "index_info",      "index_xinfo", "foreign_key_list", "foreign_key_check",
    "integrity_check", "quick_check", "database_list",    "collation_list",
    "function_list",   "module_list", "pragma_list",      "compile_options"};
// PRAGMAs that read a setting without an argument and change it with one.
constexpr const char* kSettingPragmas[] = {"user_version", "schema_version", "application_id",
                                           "page_count",   "page_size",      "freelist_count",
                                           "foreign_keys", "busy_timeout",   "synchronous",
                                           "encoding",     "data_version"};

bool in_list(const std::string& name, const char* const* first, const char* const* last) {
  return std::any_of(first, last, [&](const char* p) { return name == p; });
}

int authorize(void* user, int action, const char* arg1, const char* arg2, const char*,
              const char*) {
  auto* refused = static_cast<std::string*>(user);
  switch (action) {
    case SQLITE_TRANSACTION:
      *refused = "transaction control";
      return SQLITE_DENY;
    case SQLITE_SAVEPOINT:
      *refused = "SAVEPOINT";
      return SQLITE_DENY;
    case SQLITE_ATTACH:
      *refused = "ATTACH";
      return SQLITE_DENY;
    case SQLITE_DETACH:
      *refused = "DETACH";
      return SQLITE_DENY;
    case SQLITE_PRAGMA: {
      std::string name = arg1 ? arg1 : "";
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      const bool reports =
          in_list(name, std::begin(kReportingPragmas), std::end(kReportingPragmas));
      const bool reads_setting =
          !arg2 && in_list(name, std::begin(kSettingPragmas), std::end(kSettingPragmas));
      if (reports || reads_setting) return SQLITE_OK;
      *refused = "PRAGMA " + name + (arg2 ? " = " + std::string(arg2) : "");
      return SQLITE_DENY;
    }
    case SQLITE_FUNCTION:
      if (arg2 && std::strcmp(arg2, "load_extension") == 0) {
        *refused = "load_extension()";
        return SQLITE_DENY;
      }
      return SQLITE_OK;
    default:
      return SQLITE_OK;
  }
}

// Installs the authorizer for as long as a query statement lives (SQLite consults it again
// when it re-prepares a statement after a schema change).
class AuthorizerScope {
 public:
  // refused: where the authorizer names what it refused.
  AuthorizerScope(sqlite3* db, std::string* refused) : db_(db) {
    SQLITE_CHECK(db_, sqlite3_set_authorizer(db_, authorize, refused));
  }
  ~AuthorizerScope() { SQLITE_CHECK_NOTHROW(db_, sqlite3_set_authorizer(db_, nullptr, nullptr)); }
  AuthorizerScope(const AuthorizerScope&) = delete;
  AuthorizerScope& operator=(const AuthorizerScope&) = delete;

 private:
  sqlite3* db_;
};

struct Finalizer {
  sqlite3_stmt* stmt = nullptr;
  ~Finalizer() { sqlite3_finalize(stmt); }
};

// The statement for messages: whitespace collapsed, at most ~60 characters.
std::string excerpt(const std::string& sql) {
  std::string out;
  bool space = false;
  for (char c : sql) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  if (out.size() > 60) out = out.substr(0, 57) + "...";
  return out;
}

[[noreturn]] void refuse(const std::string& what) {
  throw StoreError("query: only read-only statements are allowed (got: " + what + ")");
}

// REALs as the shortest text that reads back to the same double (std::to_chars), with ".0"
// on integral values so they stay distinguishable from INTEGERs, as the sqlite3 shell does.
std::string format_real(double v) {
  if (std::isinf(v)) return v > 0 ? "Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string format_blob(const void* data, int n) {
  static const char* hex = "0123456789abcdef";
  std::string s = "x'";
  const auto* p = static_cast<const unsigned char*>(data);
  for (int i = 0; i < n; ++i) {
    s += hex[p[i] >> 4];
    s += hex[p[i] & 0xf];
  }
  return s + "'";
}

}  // namespace

QueryResult Store::query(const std::string& sql) {
  sqlite3* db = impl_->db;
  impl_->refused_action.clear();
  AuthorizerScope auth(db, &impl_->refused_action);

  Finalizer stmt;
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()), &stmt.stmt, &tail);
  if (rc != SQLITE_OK) {
    if (!impl_->refused_action.empty()) refuse(impl_->refused_action + ": " + excerpt(sql));
    throw StoreError(std::string("query: ") + sqlite3_errmsg(db) + " (in: " + excerpt(sql) + ")");
  }
  if (!stmt.stmt) throw StoreError("query: no SQL statement given (only whitespace or comments)");

  // Exactly one statement: what follows it may only be whitespace, comments or semicolons,
  // which prepare to no statement at all.
  const char* const sql_end = sql.c_str() + sql.size();
  while (tail && tail < sql_end) {
    Finalizer next;
    const char* next_tail = nullptr;
    int next_rc =
        sqlite3_prepare_v2(db, tail, static_cast<int>(sql_end - tail), &next.stmt, &next_tail);
    if (next_rc != SQLITE_OK || next.stmt) {
      throw StoreError("query: exactly one statement is allowed; found more after the first: " +
                       excerpt(std::string(tail, sql_end)));
    }
    if (next_tail == tail) break;
    tail = next_tail;
  }

  if (!sqlite3_stmt_readonly(stmt.stmt)) refuse(excerpt(sqlite3_sql(stmt.stmt)));

  QueryResult result;
  const int ncol = sqlite3_column_count(stmt.stmt);
  for (int c = 0; c < ncol; ++c) {
    const char* name = sqlite3_column_name(stmt.stmt, c);
    result.columns.emplace_back(name ? name : "");
  }
  while (true) {
    rc = sqlite3_step(stmt.stmt);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) {
      throw StoreError(std::string("query: ") + sqlite3_errmsg(db) + " (in: " + excerpt(sql) + ")");
    }
    std::vector<std::optional<std::string>> row;
    row.reserve(static_cast<size_t>(ncol));
    for (int c = 0; c < ncol; ++c) {
      switch (sqlite3_column_type(stmt.stmt, c)) {
        case SQLITE_NULL:
          row.emplace_back(std::nullopt);
          break;
        case SQLITE_INTEGER:
          row.emplace_back(std::to_string(sqlite3_column_int64(stmt.stmt, c)));
          break;
        case SQLITE_FLOAT:
          row.emplace_back(format_real(sqlite3_column_double(stmt.stmt, c)));
          break;
        case SQLITE_BLOB:
          row.emplace_back(
              format_blob(sqlite3_column_blob(stmt.stmt, c), sqlite3_column_bytes(stmt.stmt, c)));
          break;
        default: {
          const unsigned char* p = sqlite3_column_text(stmt.stmt, c);
          const int n = sqlite3_column_bytes(stmt.stmt, c);
          row.emplace_back(p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n))
                             : std::string());
        }
      }
    }
    result.rows.push_back(std::move(row));
  }
  return result;
}

}  // namespace dps
