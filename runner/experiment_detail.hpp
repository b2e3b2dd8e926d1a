#pragma once
// Internal to the experiment parser (experiment.cpp reads and validates, sweep.cpp expands):
// the validated, position-carrying form of an experiment file between the two steps.
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "experiment.hpp"

namespace dprun::detail {

/// A place in the file (1-based), for messages.
struct Pos {
  int line = 1, column = 1;
};

/// Collects every problem found in one file; thrown together as ConfigErrors.
class Diagnostics {
 public:
  explicit Diagnostics(std::string file) : file_(std::move(file)) {}
  void add(Pos pos, const std::string& key, const std::string& message);
  bool empty() const { return errors_.empty(); }
  /// Throws ConfigErrors with every error, in file order, when there is any.
  void throw_if_any() const;
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::vector<ConfigError> errors_;
  std::vector<std::tuple<int, int, std::string, std::string>> seen_;
};

/// One validated value and where it was written ("sweep.zip[0].gpus[1]").
struct Val {
  dp::OptionValue value;
  Pos pos;
  std::string path;
};

/// Where a setting's value comes from: one fixed value, or one axis of the sweep.
struct Binding {
  std::string key;          // "gpus", or "model.lenet.hidden" for a plugin option
  std::string path;         // where it was set: "train.gpus", "sweep.gpus", "sweep.zip[0].gpus"
  Pos pos;                  // of the value (a list for an axis)
  Pos key_pos;              // of the key
  int axis = -1;            // -1: fixed
  Val fixed;                // axis < 0
  std::vector<Val> points;  // axis >= 0: one value per point of the axis
};

/// One grid axis: a swept list, or a zip group whose lists advance together.
struct Axis {
  Pos pos;
  std::vector<std::string> keys;  // in file order
  size_t size = 0;
};

/// Everything the expansion needs, validated.
struct Validated {
  std::string dataset = "fashion-mnist";
  std::string data_path;
  std::map<std::string, Binding> bindings;  // by key; a [sweep] value replaces a [train] one
  std::vector<Axis> axes;                   // first axis outermost
  /// [model.<name>] tables: plugin options given for each model.
  std::map<std::string, std::map<std::string, Val>> model_tables;
  Pos sweep_pos, train_pos;
};

/// Expands the sweep into resolved trials (checks that need a whole trial, the trial limit).
std::vector<TrialSpec> expand(const Validated& v, const ModelCatalog& catalog,
                              const ParseOptions& options, Diagnostics& diag);

/// Text helpers shared by both files.
std::string quoted(const std::string& s);       // JSON string literal
std::string shortest(double d);                 // shortest text that reads back as d
std::string display(const dp::OptionValue& v);  // 0.2, 128, lenet, true (labels)

}  // namespace dprun::detail
