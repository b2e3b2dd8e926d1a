// Store::query: one read-only statement, values as text, NULL as nullopt.
#include "store_test_util.hpp"

using Catch::Matchers::Contains;
using dps::Store;
using dps::StoreError;
using dpstest::ScratchDir;

TEST_CASE("query returns column names and text values, NULL as nullopt", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  dps::QueryResult r = store.query(
      "SELECT 1 AS one, 2.5 AS half, 'text' AS t, NULL AS nada, 3.0 AS whole, 0.1 AS tenth, "
      "x'00ff' AS bytes, 9e999 AS big, -9e999 AS small, 1e301 AS huge");
  CHECK(r.columns == std::vector<std::string>{"one", "half", "t", "nada", "whole", "tenth", "bytes",
                                              "big", "small", "huge"});
  REQUIRE(r.rows.size() == 1);
  const auto& row = r.rows[0];
  CHECK(row[0] == "1");
  CHECK(row[1] == "2.5");
  CHECK(row[2] == "text");
  CHECK(row[3] == std::nullopt);
  CHECK(row[4] == "3.0");  // REALs keep a decimal point
  CHECK(row[5] == "0.1");  // shortest text that reads back to the same double
  CHECK(row[6] == "x'00ff'");
  CHECK(row[7] == "Inf");
  CHECK(row[8] == "-Inf");
  CHECK(row[9] == "1e+301");
  CHECK(store.query("SELECT 0.1 + 0.2").rows[0][0] == "0.30000000000000004");
  CHECK(store.query("SELECT '' AS empty").rows[0][0] == "");

  // Many rows, and no rows.
  dps::QueryResult many = store.query(
      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) "
      "SELECT i FROM n ORDER BY i");
  REQUIRE(many.rows.size() == 100);
  CHECK(many.rows[99][0] == "100");
  dps::QueryResult none = store.query("SELECT name FROM experiments");
  CHECK(none.columns == std::vector<std::string>{"name"});
  CHECK(none.rows.empty());
}

TEST_CASE("query accepts trailing semicolons, whitespace and comments", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  CHECK(dpstest::scalar(store, "  SELECT 7;  ") == "7");
  CHECK(dpstest::scalar(store, "SELECT 7; -- the answer\n /* done */ ;") == "7");
  CHECK(dpstest::scalar(store, "-- leading comment\nSELECT 7") == "7");
  REQUIRE_THROWS_WITH(store.query(""), Contains("no SQL statement"));
  REQUIRE_THROWS_WITH(store.query("  -- only a comment"), Contains("no SQL statement"));
}

TEST_CASE("query refuses several statements", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  REQUIRE_THROWS_WITH(store.query("SELECT 1; SELECT 2"),
                      Contains("exactly one statement is allowed") && Contains("SELECT 2"));
  // The classic: a harmless first statement hiding a write.
  REQUIRE_THROWS_WITH(store.query("SELECT 1; DELETE FROM trials"),
                      Contains("exactly one statement is allowed"));
  REQUIRE_THROWS_WITH(store.query("SELECT 1; garbage"), Contains("exactly one statement"));
}

TEST_CASE("query refuses statements that write or change the connection", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  const int64_t exp = store.upsert_experiment("e", "", "", 1);
  const std::string readonly = "query: only read-only statements are allowed (got: ";
  REQUIRE_THROWS_WITH(store.query("INSERT INTO experiments (name, toml_source, toml_sha256) "
                                  "VALUES ('x', '', '')"),
                      Contains(readonly + "INSERT INTO experiments"));
  REQUIRE_THROWS_WITH(store.query("DELETE FROM experiments"), Contains(readonly + "DELETE"));
  REQUIRE_THROWS_WITH(store.query("UPDATE experiments SET name = 'y'"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("DROP VIEW scaling"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("CREATE TEMP TABLE t (x)"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("BEGIN"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("SAVEPOINT s"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("PRAGMA foreign_keys = OFF"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("PRAGMA user_version = 9"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("PRAGMA journal_mode = DELETE"), Contains(readonly));
  REQUIRE_THROWS_WITH(store.query("ATTACH '" + dir.file("x.db") + "' AS x"), Contains(readonly));
  CHECK_FALSE(std::filesystem::exists(dir.file("x.db")));
  REQUIRE_THROWS_WITH(store.query("VACUUM INTO '" + dir.file("copy.db") + "'"), Contains(readonly));
  CHECK_FALSE(std::filesystem::exists(dir.file("copy.db")));
  // Nothing changed, and the store's own writes still work (no transaction left open).
  CHECK(dpstest::scalar(store, "SELECT COUNT(*) FROM experiments") == "1");
  CHECK(dpstest::scalar(store, "PRAGMA foreign_keys") == "1");
  CHECK(dpstest::scalar(store, "PRAGMA user_version") == std::to_string(dps::schema_version()));
  CHECK(store.upsert_experiment("f", "", "", 1) != exp);
  // Reporting PRAGMAs are fine.
  CHECK_FALSE(store.query("PRAGMA table_info(trials)").rows.empty());
}

TEST_CASE("query reports SQL errors with the statement", "[store]") {
  ScratchDir dir;
  Store store(dir.file("results.db"));
  REQUIRE_THROWS_AS(store.query("SELEC 1"), StoreError);
  REQUIRE_THROWS_WITH(store.query("SELECT nope FROM trials"),
                      Contains("no such column: nope") && Contains("SELECT nope FROM trials"));
}
