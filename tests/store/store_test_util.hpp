#pragma once
// Helpers for the store tests: a private temporary folder, raw SQL on a database file (to
// fake what a crashed or foreign process leaves behind), and a typical trial.
#include <sqlite3.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

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

/// The setting columns as dprun describes them today (written out here: the store's tests do not
/// depend on the runner's table of settings), with their defaults and which may differ from the
/// 1-GPU baseline of the scaling view.
inline std::vector<dps::SettingColumn> setting_columns() {
  using V = dps::SqlValue;
  auto text = [](const char* s) { return V(std::string(s)); };
  return {{"model", text(""), false},
          {"model_options", text("{}"), false},
          {"dataset", text("fashion-mnist"), false},
          {"data_path", text(""), true},
          {"epochs", V(int64_t{10}), true},
          {"seed", V(int64_t{0}), true},
          {"gpus", V(int64_t{1}), false},
          {"batch_size", V(int64_t{256}), true},
          {"per_gpu_batch", V(int64_t{256}), false},
          {"lr", V(0.1), true},
          {"optimizer", text("sgd"), false},
          {"momentum", V(0.0), true},
          {"weight_decay", V(0.0), true},
          {"precision", text("fp32"), false},
          {"layout", text("nchw"), false},
          {"bn_mode", text("per-replica"), false},
          {"eval_batch_size", V(int64_t{0}), false},
          {"train_limit", V(int64_t{0}), false},
          {"test_limit", V(int64_t{0}), false},
          {"backend_request", text("auto"), true}};
}

/// A store opened read-write with those setting columns.
inline dps::Store open_store(const std::string& path) {
  return dps::Store(path, dps::Store::Mode::read_write, setting_columns());
}

/// Every setting of a typical trial (schema version 1 gives its setting columns no default).
inline dps::SettingValues settings(const std::string& model, int64_t gpus, int64_t per_gpu = 64) {
  dps::SettingValues s;
  for (const auto& c : setting_columns()) s[c.name] = c.default_value;
  s["model"] = model;
  s["gpus"] = gpus;
  s["per_gpu_batch"] = per_gpu;
  s["batch_size"] = per_gpu * gpus;
  s["epochs"] = int64_t{3};
  return s;
}

/// One setting of a stored trial, of the type expected.
template <class T>
T setting(const dps::TrialRow& row, const std::string& column) {
  auto it = row.settings.find(column);
  INFO(column);
  REQUIRE(it != row.settings.end());
  REQUIRE(std::holds_alternative<T>(it->second));
  return std::get<T>(it->second);
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
