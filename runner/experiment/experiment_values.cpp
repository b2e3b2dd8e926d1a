// Experiment files, the value layer: what each key accepts, reading and checking one TOML
// value, the messages (did-you-mean, how a value is shown), collecting errors.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/json.hpp"
#include "base/suggest.hpp"
#include "experiment/experiment_detail.hpp"

namespace dprun {

namespace {

std::string format_error(const std::string& file, int line, int column, const std::string& key,
                         const std::string& message) {
  // Line 0: not a place in a file but a value given elsewhere ("--set train.epochs=two").
  std::string s = line == 0 ? file + ": "
                            : file + ":" + std::to_string(line) + ":" + std::to_string(column) + ": ";
  if (!key.empty()) s += key + ": ";
  return s + message;
}

std::string join_messages(const std::vector<ConfigError>& errors) {
  std::string s;
  for (const auto& e : errors) {
    if (!s.empty()) s += "\n";
    s += e.what();
  }
  return s;
}

}  // namespace

ConfigError::ConfigError(const std::string& file, int line, int column, const std::string& key,
                         const std::string& message)
    : std::runtime_error(format_error(file, line, column, key, message)),
      file_(file),
      key_(key),
      line_(line),
      column_(column) {}

ConfigErrors::ConfigErrors(std::vector<ConfigError> errors)
    : std::runtime_error(join_messages(errors)), errors_(std::move(errors)) {}

}  // namespace dprun

namespace dprun::detail {

void Diagnostics::add(Pos pos, const std::string& key, const std::string& message) {
  // The same problem can be reached twice (e.g. one value used by many trials): report it once.
  auto id = std::make_tuple(pos.line, pos.column, key, message);
  if (std::find(seen_.begin(), seen_.end(), id) != seen_.end()) return;
  seen_.push_back(id);
  if (!pos.origin.empty())
    errors_.emplace_back(pos.origin, 0, 0, key, message);
  else
    errors_.emplace_back(file_, pos.line, pos.column, key, message);
}

void Diagnostics::throw_if_any() const {
  if (errors_.empty()) return;
  auto sorted = errors_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const ConfigError& a, const ConfigError& b) {
    return std::make_pair(a.line(), a.column()) < std::make_pair(b.line(), b.column());
  });
  throw ConfigErrors(std::move(sorted));
}

std::string quoted(const std::string& s) { return json_quote(s); }

std::string shortest(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, r.ptr);
}

std::string display(const SettingValue& v) { return setting_text(v); }

std::string display(const dp::OptionValue& v) {
  return std::visit([](const auto& x) { return setting_text(SettingValue(x)); }, v);
}

dp::OptionValue option_value(const SettingValue& v) {
  if (auto* b = std::get_if<bool>(&v)) return *b;
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  if (auto* d = std::get_if<double>(&v)) return *d;
  return std::get<std::string>(v);  // a plugin option is never a list
}

namespace {

/// The option type names of the plugin contract: "bool", "int", "float", "string".
std::string type_name(const dp::OptionValue& v) {
  static const char* names[] = {"bool", "int", "float", "string"};
  return names[v.index()];
}

}  // namespace

Pos pos_of(const toml::source_region& r, Pos fallback) {
  if (r.path && r.path->rfind(kOverrideOrigin, 0) == 0) return {0, 0, *r.path};
  if (r.begin.line == 0) return fallback;
  return {static_cast<int>(r.begin.line), static_cast<int>(r.begin.column), {}};
}

std::string describe(const toml::node& n) {
  if (auto* s = n.as_string()) return detail::quoted(s->get());
  if (auto* i = n.as_integer()) return std::to_string(i->get());
  if (auto* f = n.as_floating_point()) return detail::shortest(f->get());
  if (auto* b = n.as_boolean()) return b->get() ? "true" : "false";
  if (auto* a = n.as_array()) {
    std::string s = "[";
    for (size_t i = 0; i < a->size(); ++i) {
      if (i) s += ", ";
      if (i == 8) return s + "...]";
      s += describe((*a)[i]);
    }
    return s + "]";
  }
  if (n.is_table()) return "a table";
  return "a date/time";
}

std::string typo_hint(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string best = did_you_mean(word, candidates);
  return best.empty() ? "" : "; did you mean " + detail::quoted(best) + "?";
}

std::string join(const std::vector<std::string>& items, const std::string& sep, bool quote) {
  std::string s;
  for (const auto& i : items) {
    if (!s.empty()) s += sep;
    s += quote ? detail::quoted(i) : i;
  }
  return s;
}

std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t) {
  std::vector<std::pair<const toml::key*, const toml::node*>> out;
  for (auto&& [k, v] : t) out.emplace_back(&k, &v);
  auto at = [](const std::pair<const toml::key*, const toml::node*>& e) {
    auto r = e.first->source().begin.line ? e.first->source() : e.second->source();
    return std::make_pair(r.begin.line, r.begin.column);
  };
  std::stable_sort(out.begin(), out.end(),
                   [&](const auto& a, const auto& b) { return at(a) < at(b); });
  return out;
}

std::string option_type(const dp::OptionValue& v, bool list) {
  static const char* one[] = {"a boolean", "an integer", "a number", "a string"};
  static const char* many[] = {"a list of booleans", "a list of integers", "a list of numbers",
                               "a list of strings"};
  return (list ? many : one)[v.index()];
}

Validator::Validator(const std::string& file, const ModelCatalog& catalog,
                     const SettingTable& settings)
    : catalog_(catalog), settings_(settings), diag_(file) {
  for (const auto& [name, f] : catalog_.models) model_names_.push_back(name);
}

std::vector<std::string> Validator::dataset_names() const {
  std::vector<std::string> names;
  for (const auto& [name, f] : catalog_.datasets) names.push_back(name);
  return names;
}

std::string Validator::known_datasets() const {
  return "known datasets: " + join(dataset_names(), ", ", false);
}

std::string Validator::known_models() const {
  if (model_names_.empty()) return "known models: none (no model plugins were found)";
  return "known models: " + join(model_names_, ", ", false);
}

std::optional<Val> Validator::read_train_value(const Setting& k, const toml::node& n,
                                               const std::string& path, Pos fallback, bool list) {
  Pos pos = pos_of(n.source(), fallback);
  auto type_error = [&] {
    diag_.add(pos, path, "expected " + expected_text(k, list) + ", got " + describe(n));
    return std::nullopt;
  };
  auto number = [](const toml::node& x) {
    return x.is_integer() ? static_cast<double>(x.as_integer()->get())
                          : x.as_floating_point()->get();
  };
  Val v{{}, pos, path};
  switch (k.type) {
    case SettingType::boolean:
      if (!n.is_boolean()) return type_error();
      v.value = n.as_boolean()->get();
      break;
    case SettingType::boolean_auto:
      if (n.is_boolean()) {
        v.value = n.as_boolean()->get();
      } else if (n.is_string()) {
        v.value = n.as_string()->get();  // check_setting_value refuses all but "auto"
      } else {
        return type_error();
      }
      break;
    case SettingType::integer:
      if (!n.is_integer()) return type_error();
      v.value = n.as_integer()->get();
      break;
    case SettingType::number:
      // An integer is accepted where a float is expected ("lr = 1").
      if (!n.is_number()) return type_error();
      v.value = number(n);
      break;
    case SettingType::numbers: {
      const auto* a = n.as_array();
      if (!a) return type_error();
      std::vector<double> list;
      for (const auto& item : *a) {
        if (!item.is_number()) return type_error();
        list.push_back(number(item));
      }
      v.value = list;
      break;
    }
    case SettingType::model: {
      if (!n.is_string()) return type_error();
      const std::string& s = n.as_string()->get();
      if (!catalog_.models.count(s)) {
        diag_.add(pos, path,
                  "unknown model " + detail::quoted(s) + typo_hint(s, model_names_) + " (" +
                      known_models() + ")");
        return std::nullopt;
      }
      v.value = s;
      break;
    }
    default:
      if (!n.is_string()) return type_error();
      v.value = n.as_string()->get();
  }
  if (auto why = check_setting_value(k, v.value); !why.empty()) {
    diag_.add(pos, path, why);
    return std::nullopt;
  }
  return v;
}

const dp::OptionSpec* Validator::find_option(const std::string& model, const std::string& option,
                                             const std::string& path, Pos pos) {
  auto it = catalog_.models.find(model);
  if (it == catalog_.models.end()) {
    diag_.add(pos, path,
              "unknown model " + detail::quoted(model) + typo_hint(model, model_names_) + " (" +
                  known_models() + ")");
    return nullptr;
  }
  std::vector<std::string> names, listing;
  for (const auto& o : it->second.options) {
    if (o.name == option) return &o;
    names.push_back(o.name);
    auto* text = std::get_if<std::string>(&o.default_value);
    listing.push_back(o.name + ": " + type_name(o.default_value) + " = " +
                      (text ? detail::quoted(*text) : detail::display(o.default_value)));
  }
  diag_.add(pos, path,
            "unknown option " + detail::quoted(option) + " of model " + model +
                typo_hint(option, names) +
                (listing.empty() ? " (the model takes no options)"
                                 : " (known options: " + join(listing, ", ", false) + ")"));
  return nullptr;
}

std::optional<Val> Validator::read_option_value(const dp::OptionSpec& spec,
                                                const std::string& model, const toml::node& n,
                                                const std::string& path, Pos fallback, bool list,
                                                const char* kind) {
  Pos pos = pos_of(n.source(), fallback);
  Val v{{}, pos, path};
  bool ok = false;
  switch (spec.default_value.index()) {
    case 0:
      if ((ok = n.is_boolean())) v.value = n.as_boolean()->get();
      break;
    case 1:
      if ((ok = n.is_integer())) v.value = n.as_integer()->get();
      break;
    case 2:
      // An integer is accepted where a float is declared ("init_std = 1").
      if ((ok = n.is_number()))
        v.value = n.is_integer() ? static_cast<double>(n.as_integer()->get())
                                 : n.as_floating_point()->get();
      if (ok && !std::isfinite(std::get<double>(v.value))) {
        diag_.add(pos, path, "must be a finite number, got " + describe(n));
        return std::nullopt;
      }
      break;
    default:
      if ((ok = n.is_string())) v.value = n.as_string()->get();
  }
  if (!ok) {
    diag_.add(pos, path,
              "expected " + option_type(spec.default_value, list) + " (option " + spec.name +
                  " of " + kind + " " + model + " is " + type_name(spec.default_value) + "), got " +
                  describe(n));
    return std::nullopt;
  }
  return v;
}

}  // namespace dprun::detail
