// What follows from the table of settings: checking rows and values, a trial's settings and their
// text. Their store values and JSON record are in settings_records.cpp, the identity (config
// hash) in settings_identity.cpp, the rows themselves in settings_table.cpp.
#include "settings/settings.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "base/suggest.hpp"

namespace dprun {

namespace {

// The alternative of SettingValue a setting of this type holds (boolean_auto: the bool's; its
// "auto" is a string).
size_t value_index(SettingType t) {
  switch (t) {
    case SettingType::boolean:
    case SettingType::boolean_auto:
      return 0;
    case SettingType::integer:
      return 1;
    case SettingType::number:
      return 2;
    case SettingType::numbers:
      return 4;
    default:
      return 3;  // choice, model, text, json, dataset: a string
  }
}

// Whether v is of the alternative a setting of type t holds ("auto" of a boolean_auto: its
// value is checked by check_setting_value).
bool of_type(SettingType t, const SettingValue& v) {
  return v.index() == value_index(t) || (t == SettingType::boolean_auto && v.index() == 3);
}

}  // namespace

const char* setting_type_name(SettingType t) {
  static const char* names[] = {"boolean", "integer", "number", "numbers", "choice",
                                "model",   "text",    "json",   "dataset", "boolean-or-auto"};
  return names[static_cast<int>(t)];
}

namespace {

std::string shortest(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, r.ptr);
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// "stop.patience": identifiers joined by '.' (a key of a group of settings, written in a file as
// stop = {patience = 3} or stop.patience = 3).
bool is_dotted_identifier(const std::string& s) {
  size_t begin = 0;
  for (;;) {
    const size_t dot = s.find('.', begin);
    if (!is_identifier(s.substr(begin, dot - begin))) return false;
    if (dot == std::string::npos) return true;
    begin = dot + 1;
  }
}

bool within(const Range& r, double d) {
  return (r.min_open ? d > r.min : d >= r.min) && (r.max_open ? d < r.max : d <= r.max);
}

bool has_min(const Range& r) { return std::isfinite(r.min); }
bool has_max(const Range& r) { return std::isfinite(r.max); }

// "must be greater than 0", "must be in [0, 1)", "must be at least 1".
std::string range_text(const Range& r) {
  if (has_min(r) && has_max(r))
    return std::string("must be in ") + (r.min_open ? "(" : "[") + shortest(r.min) + ", " +
           shortest(r.max) + (r.max_open ? ")" : "]");
  if (has_min(r))
    return (r.min_open ? "must be greater than " : "must be at least ") + shortest(r.min);
  return (r.max_open ? "must be less than " : "must be at most ") + shortest(r.max);
}

// The range as the documentation writes it after the type: " ≥ 1", " in [0, 1)", "".
std::string range_doc(const Range& r) {
  if (has_min(r) && has_max(r))
    return std::string(" in ") + (r.min_open ? "(" : "[") + shortest(r.min) + ", " +
           shortest(r.max) + (r.max_open ? ")" : "]");
  if (has_min(r)) return (r.min_open ? " > " : " ≥ ") + shortest(r.min);
  if (has_max(r)) return (r.max_open ? " < " : " ≤ ") + shortest(r.max);
  return "";
}

[[noreturn]] void bad_row(const Setting& s, const std::string& why) {
  throw std::logic_error("setting " + (s.key.empty() ? s.column : s.key) + ": " + why);
}

}  // namespace

// ---- the table ---------------------------------------------------------------------------------

SettingTable::SettingTable(std::vector<Setting> rows, int generation)
    : rows_(std::move(rows)), generation_(generation) {
  if (generation_ < 1 || generation_ > kDefaultsGeneration)
    throw std::logic_error("setting table: defaults generation " + std::to_string(generation_) +
                           " is not in [1, " + std::to_string(kDefaultsGeneration) + "]");
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Setting& s = rows_[i];
    if (s.key.empty() && s.column.empty()) bad_row(s, "needs a key, a column or both");
    if (!s.key.empty() && !is_dotted_identifier(s.key))
      bad_row(s, "the key must be [a-z][a-z0-9_]*, or several joined by '.' (a group: stop.*)");
    if (!s.column.empty() && !is_identifier(s.column))
      bad_row(s, "the column must be [a-z][a-z0-9_]*");
    for (size_t j = 0; j < i; ++j) {
      if (!s.key.empty() && rows_[j].key == s.key) bad_row(s, "the key is used twice");
      if (!s.column.empty() && rows_[j].column == s.column) bad_row(s, "the column is used twice");
    }
    if (!of_type(s.type, s.default_value))
      bad_row(s, std::string("the default is not a value of a ") + setting_type_name(s.type) +
                     " setting");
    if (s.type == SettingType::numbers && s.count == 0)
      bad_row(s, "a numbers setting needs a count");
    if (s.type == SettingType::choice && s.choices.empty()) bad_row(s, "a choice needs choices");
    if (s.identity && s.column.empty()) bad_row(s, "an identity setting must be recorded");
    if (s.type != SettingType::model && s.type != SettingType::dataset) {
      if (auto why = check_setting_value(s, s.default_value); !why.empty())
        bad_row(s, "the default is refused by the setting's own check: " + why);
    }
    int until = 0;
    for (const EarlierDefault& e : s.earlier_defaults) {
      if (e.until <= until || e.until >= kDefaultsGeneration)
        bad_row(s, "earlier defaults must be of increasing generations before the current one");
      until = e.until;
      if (!of_type(s.type, e.value))
        bad_row(s, "an earlier default is not a value of the setting's type");
      if (auto why = check_setting_value(s, e.value); !why.empty())
        bad_row(s, "an earlier default is refused by the setting's own check: " + why);
    }
    if (s.help.empty()) bad_row(s, "needs a help line");
    if (s.applies_when && s.key.empty()) bad_row(s, "a setting that applies sometimes needs a key");
  }
  for (const Setting& s : rows_) {
    if (!s.applies_when) continue;
    const Setting* on = by_key(s.applies_when->key);
    if (on == nullptr || on->type != SettingType::choice || s.applies_when->values.empty())
      bad_row(s, "applies_when names no choice setting, or no value of it");
    for (const auto& v : s.applies_when->values)
      if (std::find(on->choices.begin(), on->choices.end(), v) == on->choices.end())
        bad_row(s, "applies_when: \"" + v + "\" is not a choice of " + on->key);
  }
  for (const Setting& s : rows_)
    if (!s.column.empty()) recorded_.push_back(&s);
}

const SettingTable& SettingTable::with_defaults(int generation) const {
  if (generation == generation_) return *this;
  std::lock_guard<std::mutex> lock(earlier_mutex_);
  auto& table = earlier_[generation];
  if (!table) {
    std::vector<Setting> rows = rows_;
    for (Setting& row : rows) row.default_value = row.default_for(generation);
    table = std::make_unique<SettingTable>(std::move(rows), generation);
  }
  return *table;
}

const Setting* SettingTable::by_key(std::string_view key) const {
  for (const Setting& s : rows_)
    if (!s.key.empty() && s.key == key) return &s;
  return nullptr;
}

const Setting* SettingTable::by_column(std::string_view column) const {
  for (const Setting& s : rows_)
    if (!s.column.empty() && s.column == column) return &s;
  return nullptr;
}

std::vector<std::string> SettingTable::keys() const {
  std::vector<std::string> keys;
  for (const Setting& s : rows_)
    if (!s.key.empty()) keys.push_back(s.key);
  return keys;
}

std::vector<dps::SettingColumn> SettingTable::store_columns() const {
  // A column's default fills the rows stored before the column existed: the setting's first
  // default, what dprun did then, in every generation.
  std::vector<dps::SettingColumn> columns;
  TrialSettings defaults(*this);
  for (const Setting* s : recorded_) defaults.set(s->column, s->first_default());
  const dps::SettingValues values = to_store(defaults);
  for (const Setting* s : recorded_)
    columns.push_back({s->column, values.at(s->column), s->baseline_may_differ});
  return columns;
}

// ---- one trial's settings ----------------------------------------------------------------------

TrialSettings::TrialSettings(const SettingTable& table) : table_(&table) {
  for (const Setting* s : table.recorded()) values_.push_back(s->default_value);
}

size_t TrialSettings::index(std::string_view column) const {
  const auto& recorded = table_->recorded();
  for (size_t i = 0; i < recorded.size(); ++i)
    if (recorded[i]->column == column) return i;
  throw std::logic_error("no recorded setting \"" + std::string(column) + "\"");
}

const SettingValue& TrialSettings::get(std::string_view column) const {
  return values_[index(column)];
}

void TrialSettings::set(std::string_view column, SettingValue value) {
  const size_t i = index(column);
  const Setting& s = *table_->recorded()[i];
  if (!of_type(s.type, value))
    throw std::logic_error("setting " + s.column + ": a " + setting_type_name(s.type) +
                           " setting given a value of another type");
  values_[i] = std::move(value);
}

namespace {

template <class V>
const V& typed(const TrialSettings& s, std::string_view column) {
  const SettingValue& v = s.get(column);
  if (const V* p = std::get_if<V>(&v)) return *p;
  throw std::logic_error("setting " + std::string(column) + " read as another type than its own");
}

}  // namespace

bool TrialSettings::boolean(std::string_view c) const { return typed<bool>(*this, c); }
int64_t TrialSettings::integer(std::string_view c) const { return typed<int64_t>(*this, c); }
double TrialSettings::number(std::string_view c) const { return typed<double>(*this, c); }
const std::string& TrialSettings::text(std::string_view c) const {
  return typed<std::string>(*this, c);
}
const std::vector<double>& TrialSettings::numbers(std::string_view c) const {
  return typed<std::vector<double>>(*this, c);
}

TrialSettings settings_from_keys(const SettingTable& table,
                                 const std::map<std::string, SettingValue>& given) {
  TrialSettings s(table);
  auto input = [&](const char* key) -> const SettingValue& {
    if (auto it = given.find(key); it != given.end()) return it->second;
    return table.by_key(key)->default_value;
  };
  for (const auto& [key, value] : given) {
    const Setting* row = table.by_key(key);
    if (!row) throw std::logic_error("settings_from_keys: no setting has the key " + key);
    if (!row->column.empty()) s.set(row->column, value);
  }
  // What the inputs imply. A replica needs whole examples: per_gpu_batch rounds down.
  const int64_t gpus = s.integer("gpus");
  if (given.count("per_gpu_batch"))
    s.set("batch_size", std::get<int64_t>(given.at("per_gpu_batch")) * gpus);
  const int64_t batch = s.integer("batch_size");
  s.set("per_gpu_batch", batch / gpus);
  if (std::get<std::string>(input("lr_scaling")) == "linear") {
    const double base = static_cast<double>(std::get<int64_t>(input("base_batch")));
    s.set("lr", s.number("lr") * static_cast<double>(batch) / base);
  }
  return s;
}

// ---- values as text ----------------------------------------------------------------------------

std::string setting_text(const SettingValue& v) {
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return shortest(*d);
  if (auto* list = std::get_if<std::vector<double>>(&v)) {
    std::string s = "[";
    for (size_t i = 0; i < list->size(); ++i) s += (i ? ", " : "") + shortest((*list)[i]);
    return s + "]";
  }
  return std::get<std::string>(v);
}

std::string check_setting_value(const Setting& s, const SettingValue& v) {
  if (!of_type(s.type, v)) return "expected " + expected_text(s, false);
  auto check_number = [&](double d) -> std::string {
    if (!std::isfinite(d)) return "must be a finite number, got " + shortest(d);
    if (!within(s.range, d)) return range_text(s.range) + ", got " + shortest(d);
    return "";
  };
  switch (s.type) {
    case SettingType::integer: {
      const int64_t i = std::get<int64_t>(v);
      if (!within(s.range, static_cast<double>(i)))
        return range_text(s.range) + ", got " + std::to_string(i);
      return "";
    }
    case SettingType::number:
      return check_number(std::get<double>(v));
    case SettingType::numbers: {
      const auto& list = std::get<std::vector<double>>(v);
      if (s.count != kAnyCount && list.size() != s.count)
        return "expected " + std::to_string(s.count) + " numbers, got " +
               std::to_string(list.size());
      for (double d : list)
        if (auto why = check_number(d); !why.empty()) return "each value " + why;
      return "";
    }
    case SettingType::boolean_auto: {
      const auto* text = std::get_if<std::string>(&v);
      if (text == nullptr || *text == "auto") return "";
      return "unknown value " + json_quote(*text) + " (expected " + expected_text(s, false) + ")";
    }
    case SettingType::choice: {
      const std::string& text = std::get<std::string>(v);
      if (std::find(s.choices.begin(), s.choices.end(), text) != s.choices.end()) return "";
      for (const auto& [value, why] : s.refused)
        if (value == text) return why;
      std::string known;
      for (const auto& c : s.choices) known += (known.empty() ? "" : ", ") + json_quote(c);
      const std::string hint = did_you_mean(text, s.choices);
      return "unknown value " + json_quote(text) +
             (hint.empty() ? "" : "; did you mean " + json_quote(hint) + "?") +
             " (expected one of " + known + ")";
    }
    default:
      return "";
  }
}

SettingValue setting_from_text(const Setting& setting, const std::string& text) {
  auto expected = [&] {
    return std::invalid_argument("expected " + expected_text(setting, false));
  };
  auto number = [&](const std::string& t) {
    double x = 0;
    auto res = std::from_chars(t.data(), t.data() + t.size(), x);
    if (res.ec != std::errc() || res.ptr != t.data() + t.size()) throw expected();
    return x;
  };
  SettingValue value = text;
  switch (setting.type) {
    case SettingType::boolean:
      if (text != "true" && text != "false") throw expected();
      value = text == "true";
      break;
    case SettingType::boolean_auto:
      if (text != "true" && text != "false" && text != "auto") throw expected();
      if (text != "auto") value = text == "true";
      break;
    case SettingType::integer: {
      int64_t x = 0;
      auto res = std::from_chars(text.data(), text.data() + text.size(), x);
      if (res.ec != std::errc() || res.ptr != text.data() + text.size()) throw expected();
      value = x;
      break;
    }
    case SettingType::number:
      value = number(text);
      break;
    case SettingType::numbers: {
      std::vector<double> list;
      for (size_t start = 0;;) {
        const size_t comma = text.find(',', start);
        list.push_back(number(text.substr(start, comma - start)));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      value = list;
      break;
    }
    default:
      break;
  }
  if (auto why = check_setting_value(setting, value); !why.empty())
    throw std::invalid_argument(why);
  return value;
}

std::string expected_text(const Setting& s, bool list) {
  const char* one = "a string";
  const char* many = "a list of strings";
  switch (s.type) {
    case SettingType::boolean:
      one = "a boolean", many = "a list of booleans";
      break;
    case SettingType::boolean_auto:
      one = "true, false or \"auto\"", many = "a list of true, false or \"auto\"";
      break;
    case SettingType::integer:
      if (s.range.min == 1 && !s.range.min_open && !has_max(s.range))
        one = "a positive integer", many = "a list of positive integers";
      else if (s.range.min == 0 && !s.range.min_open && !has_max(s.range))
        one = "a non-negative integer", many = "a list of non-negative integers";
      else
        one = "an integer", many = "a list of integers";
      break;
    case SettingType::number:
      one = "a number", many = "a list of numbers";
      break;
    case SettingType::numbers: {
      const std::string n = s.count == kAnyCount ? "" : std::to_string(s.count) + " ";
      return list ? "a list of lists of " + n + "numbers" : "a list of " + n + "numbers";
    }
    case SettingType::model:
      one = "a model name", many = "a list of model names";
      break;
    case SettingType::dataset:
      one = "a dataset name", many = "a list of dataset names";
      break;
    default:
      break;
  }
  return list ? many : one;
}

std::string type_text(const Setting& s) {
  switch (s.type) {
    case SettingType::boolean:
      return "bool";
    case SettingType::boolean_auto:
      return "bool | \"auto\"";
    case SettingType::integer:
      return "int" + range_doc(s.range);
    case SettingType::number:
      return "float" + range_doc(s.range);
    case SettingType::numbers:
      return (s.count == kAnyCount ? std::string("floats") : std::to_string(s.count) + " floats") +
             range_doc(s.range);
    case SettingType::choice: {
      std::string t;
      for (const auto& c : s.choices) t += (t.empty() ? "\"" : " | \"") + c + "\"";
      return t;
    }
    case SettingType::model:
      return "model name";
    case SettingType::text:
      return "string";
    case SettingType::json:
      return "JSON object";
    case SettingType::dataset:
      return "dataset name";
  }
  return "";
}

// ---- documentation -----------------------------------------------------------------------------

std::string settings_markdown(const SettingTable& table) {
  auto cell = [](std::string s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string out =
      "| key (in `[train]`, or a list in `[sweep]`) | type | default | meaning |\n"
      "| --- | --- | --- | --- |\n";
  for (const Setting& s : table.rows()) {
    if (s.key.empty()) continue;
    std::string def = s.default_doc;
    if (def.empty()) {
      def = setting_text(s.default_value);
      if (std::holds_alternative<std::string>(s.default_value)) def = "\"" + def + "\"";
    }
    std::vector<std::string> notes;
    if (!s.column.empty() && s.column != s.key) notes.push_back("column `" + s.column + "`");
    if (s.column.empty()) notes.push_back("not recorded itself");
    for (const auto& [value, unused] : s.refused)
      notes.push_back("not supported yet: \"" + value + "\"");
    std::string meaning = s.help;
    for (size_t i = 0; i < notes.size(); ++i) meaning += (i ? "; " : " (") + notes[i];
    if (!notes.empty()) meaning += ")";
    out += "| `" + s.key + "` | " + cell(type_text(s)) + " | " + cell(def) + " | " + cell(meaning) +
           " |\n";
  }
  return out;
}

}  // namespace dprun
