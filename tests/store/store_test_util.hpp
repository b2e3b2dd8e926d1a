#pragma once
// Helpers for the store tests: a private temporary folder, raw SQL on a database file (to
// fake what a crashed or foreign process leaves behind), and a typical trial.
#include <sqlite3.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "dpstore/store.hpp"

namespace dpstest {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dpstore-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Runs SQL on its own connection (foreign keys on), outside the Store under test.
inline void raw_exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open(path.c_str(), &db);
  std::string err;
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(db, 10000);
    rc = sqlite3_exec(db, ("PRAGMA foreign_keys = ON; " + sql).c_str(), nullptr, nullptr, nullptr);
  }
  if (rc != SQLITE_OK) err = sqlite3_errmsg(db);
  sqlite3_close(db);
  INFO(sql << ": " << err);
  REQUIRE(rc == SQLITE_OK);
}

/// The single value of a query on its own connection (for what Store::query refuses to run).
inline std::string raw_scalar(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string value;
  int rc = sqlite3_open(path.c_str(), &db);
  sqlite3_stmt* stmt = nullptr;
  if (rc == SQLITE_OK) rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr);
  if (rc == SQLITE_OK && sqlite3_step(stmt) == SQLITE_ROW) {
    const unsigned char* p = sqlite3_column_text(stmt, 0);
    value = p ? reinterpret_cast<const char*>(p) : "";
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  REQUIRE(rc == SQLITE_OK);
  return value;
}

inline dps::TrialSettings settings(const std::string& model, int64_t gpus, int64_t per_gpu = 64) {
  dps::TrialSettings s;
  s.model = model;
  s.gpus = gpus;
  s.per_gpu_batch = per_gpu;
  s.batch_size = per_gpu * gpus;
  s.epochs = 3;
  return s;
}

inline dps::EpochRow epoch_row(int64_t trial, int64_t epoch, double test_acc, double seconds,
                               double train_loss = 1.0) {
  dps::EpochRow r;
  r.trial_id = trial;
  r.epoch = epoch;
  r.train_loss = train_loss;
  r.train_acc = test_acc;
  r.test_acc = test_acc;
  r.seconds = seconds;
  r.examples_per_second = 1000.0 / seconds;
  r.lr = 0.1;
  r.eval_seconds = 0.5;
  r.peak_memory_bytes = 1 << 20;
  return r;
}

/// The single value of a one-row, one-column query.
inline std::optional<std::string> scalar(dps::Store& store, const std::string& sql) {
  dps::QueryResult r = store.query(sql);
  REQUIRE(r.rows.size() == 1);
  REQUIRE(r.rows[0].size() == 1);
  return r.rows[0][0];
}

}  // namespace dpstest
