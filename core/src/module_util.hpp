#pragma once
// Internal helpers shared by the module and layer implementations.
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "dp/module.hpp"

namespace dp::detail {

/// Appends the output shape (after setup) and, at the root (indent 0), the final newline.
void end_description(std::ostream& os, const Module& m, int indent);
/// PyTorch-style container: "Type(\n  (name): child\n  ...\n)" plus the output shape.
void describe_children(std::ostream& os, const Module& m, int indent,
                       const std::vector<std::pair<std::string, const Module*>>& children);

/// Python's repr of a small float ("1e-05", "0.1").
std::string py_float(double v);

}  // namespace dp::detail
