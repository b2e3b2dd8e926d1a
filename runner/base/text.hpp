#pragma once
// Text layouts shared by the commands that print tables.
#include <optional>
#include <string>
#include <vector>

namespace dprun {

/// True for the text of a JSON number (-1, 0.5, 2e-3): right-aligned in tables, a number in JSON.
bool looks_numeric(const std::string& s);

/// Rows of cells as aligned columns (the first row is the header, underlined); every line starts
/// with `indent`. Numbers are right-aligned.
std::string format_aligned(const std::vector<std::vector<std::string>>& rows,
                           const std::string& indent = "");

/// A table cell: `v` printed with `format` (a printf format of one double, "%.4f"), or "-" when
/// there is no value, or when it is not finite and `finite_only`.
std::string number_cell(const std::optional<double>& v, const char* format,
                        bool finite_only = false);

}  // namespace dprun
