#pragma once
// Text layouts shared by the commands that print tables.
#include <string>
#include <vector>

namespace dprun {

/// True for the text of a JSON number (-1, 0.5, 2e-3): right-aligned in tables, a number in JSON.
bool looks_numeric(const std::string& s);

/// Rows of cells as aligned columns (the first row is the header, underlined); every line starts
/// with `indent`. Numbers are right-aligned.
std::string format_aligned(const std::vector<std::vector<std::string>>& rows,
                           const std::string& indent = "");

}  // namespace dprun
