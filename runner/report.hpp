#pragma once
// Formatting query results (`dprun query`) and the per-experiment summary (`dprun report`).
#include <string>
#include <vector>

#include "dpstore/store.hpp"
#include "settings.hpp"

namespace dprun {

/// Rows of cells as aligned columns (the first row is the header, underlined); every line starts
/// with `indent`. Numbers are right-aligned.
std::string format_aligned(const std::vector<std::vector<std::string>>& rows,
                           const std::string& indent = "");

enum class QueryFormat { table, csv, json };

/// table: aligned columns, NULL shown as NULL. csv: RFC 4180 (CRLF, fields with a comma, quote
/// or line break quoted, quotes doubled; NULL as an empty field). json: an array of objects;
/// values that are JSON numbers in their text form are emitted as numbers, NULL as null.
std::string format_query(const dps::QueryResult& result, QueryFormat format);

/// The database to use when --db is not given: the only results/*.db in the current folder.
/// Throws UsageError telling to pass --db otherwise.
std::string default_database(const std::string& command);

/// `dprun report`: per experiment, its trials (settings that vary, status, final and best test
/// accuracy, s/epoch, speedup over 1 GPU). Returns the text.
std::string format_report(dps::Store& store, const SettingTable& table = builtin_settings());

}  // namespace dprun
