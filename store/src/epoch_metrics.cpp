// The measured values of an epoch (dps::epoch_metrics), and the statements built from them.
#include <cmath>
#include <set>
#include <string>

#include "sqlite_util.hpp"
#include "store_impl.hpp"

namespace dps {

const std::vector<EpochMetric>& epoch_metrics() {
  static const std::vector<EpochMetric> metrics = {
      {"train_loss", &EpochRow::train_loss},
      {"train_acc", &EpochRow::train_acc},
      {"test_acc", &EpochRow::test_acc},
      {"seconds", &EpochRow::seconds},
      {"examples_per_second", &EpochRow::examples_per_second},
      {"lr", &EpochRow::lr},
      {"eval_seconds", &EpochRow::eval_seconds},
      {"peak_memory_bytes", nullptr, &EpochRow::peak_memory_bytes},
      {"test_loss", &EpochRow::test_loss},
      {"val_loss", &EpochRow::val_loss},
      {"val_acc", &EpochRow::val_acc},
  };
  return metrics;
}

namespace detail {

namespace {

std::set<std::string> epoch_columns(sqlite3* db) {
  std::set<std::string> have;
  Stmt s(db, "SELECT name FROM pragma_table_info('epochs')");
  while (s.step()) have.insert(s.text(0));
  return have;
}

}  // namespace

void add_epoch_columns(sqlite3* db) {
  std::set<std::string> have = epoch_columns(db);
  bool all = true;
  for (const EpochMetric& m : epoch_metrics()) all = all && have.count(m.name);
  if (all) return;
  WriteTransaction txn(db);
  have = epoch_columns(db);  // another process may have added them meanwhile
  for (const EpochMetric& m : epoch_metrics()) {
    if (have.count(m.name)) continue;
    const std::string sql = std::string("ALTER TABLE epochs ADD COLUMN ") + m.name +
                            (m.real != nullptr ? " REAL" : " INTEGER");
    sqlite_check(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), db, "sqlite3_exec",
                 __FILE__, __LINE__, sql.c_str());
  }
  txn.commit();
}

std::string epoch_insert_sql(bool or_replace, bool with_recorded_at) {
  std::string columns = "trial_id, epoch", values = "?1, ?2";
  int i = 3;
  for (const EpochMetric& m : epoch_metrics()) {
    columns += std::string(", ") + m.name;
    values += ", ?" + std::to_string(i++);
  }
  if (with_recorded_at) {
    columns += ", recorded_at";
    values += ", COALESCE(?" + std::to_string(i) + ", " DPS_NOW_SQL ")";
  }
  return std::string(or_replace ? "INSERT OR REPLACE" : "INSERT") + " INTO epochs (" + columns +
         ") VALUES (" + values + ")";
}

int bind_epoch(Stmt& s, int64_t trial_id, const EpochRow& row) {
  s.bind(1, trial_id).bind(2, row.epoch);
  int i = 3;
  for (const EpochMetric& m : epoch_metrics()) {
    if (m.real != nullptr) {
      s.bind(i++, row.*m.real);
    } else {
      s.bind(i++, row.*m.integer);
    }
  }
  return i;
}

std::string epoch_select_sql(sqlite3* db) {
  const std::set<std::string> have = epoch_columns(db);
  std::string columns = "trial_id, epoch";
  for (const EpochMetric& m : epoch_metrics())
    if (have.count(m.name)) columns += std::string(", ") + m.name;
  return "SELECT " + columns + ", recorded_at FROM epochs WHERE trial_id = ?1 ORDER BY epoch";
}

EpochRow read_epoch(const Stmt& s) {
  EpochRow r;
  r.trial_id = s.int64("trial_id");
  r.epoch = s.int64("epoch");
  for (const EpochMetric& m : epoch_metrics()) {
    const int column = s.find_column(m.name);  // -1: an older database, read as it is
    if (m.real != nullptr) {
      r.*m.real = column >= 0 ? s.real(column) : std::nan("");
    } else {
      r.*m.integer = column >= 0 ? s.int64(column) : 0;
    }
  }
  r.recorded_at = s.text("recorded_at");
  return r;
}

}  // namespace detail

}  // namespace dps
