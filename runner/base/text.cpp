// Text layouts (base/text.hpp).
#include "base/text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

namespace dprun {

bool looks_numeric(const std::string& s) {
  static const std::regex number(R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)");
  return !s.empty() && std::regex_match(s, number);
}

namespace {

// Display width in terminal columns: UTF-8 continuation bytes take no column.
size_t width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++w;
  return w;
}

}  // namespace

std::string format_aligned(const std::vector<std::vector<std::string>>& rows,
                           const std::string& indent) {
  if (rows.empty()) return "";
  size_t columns = 0;
  for (const auto& r : rows) columns = std::max(columns, r.size());
  std::vector<size_t> widths(columns, 0);
  std::vector<bool> numeric(columns, true);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t c = 0; c < rows[i].size(); ++c) {
      widths[c] = std::max(widths[c], width(rows[i][c]));
      if (i > 0 && !looks_numeric(rows[i][c]) && rows[i][c] != "-" && rows[i][c] != "NULL")
        numeric[c] = false;
    }
  std::string out;
  auto emit = [&](const std::vector<std::string>& r) {
    std::string line = indent;
    for (size_t c = 0; c < columns; ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      const std::string pad(widths[c] - width(cell), ' ');
      if (c) line += "  ";
      line += numeric[c] && rows.size() > 1 ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(rows[0]);
  std::vector<std::string> rule;
  for (size_t c = 0; c < columns; ++c) rule.push_back(std::string(widths[c], '-'));
  emit(rule);
  for (size_t i = 1; i < rows.size(); ++i) emit(rows[i]);
  return out;
}

std::string number_cell(const std::optional<double>& v, const char* format, bool finite_only) {
  if (!v || (finite_only && !std::isfinite(*v))) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, *v);
  return buf;
}

}  // namespace dprun
