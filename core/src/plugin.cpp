#include "dp/plugin.hpp"

#include <charconv>
#include <cmath>

#include "dp/error.hpp"

namespace dp {

std::string option_type_name(const OptionValue& v) {
  switch (v.index()) {
    case 0:
      return "bool";
    case 1:
      return "int";
    case 2:
      return "float";
    default:
      return "string";
  }
}

// Written so the type can be read back from the text (floats always carry '.', 'e', "inf" or
// "nan"; strings are quoted), because the runner uses it in config hashes and messages.
std::string option_to_string(const OptionValue& v) {
  if (const bool* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const int64_t* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const double* d = std::get_if<double>(&v)) {
    if (std::isnan(*d)) return "nan";
    if (std::isinf(*d)) return *d > 0 ? "inf" : "-inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, *d);  // shortest round-trip form
    std::string s(buf, r.ptr);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  std::string out = "\"";
  for (char c : std::get<std::string>(v)) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

namespace {

// kind: "model" or "dataset", for the messages.
std::string known_options(const char* kind, const std::string& name,
                          const std::vector<OptionSpec>& options) {
  if (options.empty()) return std::string(kind) + " '" + name + "' takes no options";
  std::string s = "known options of '" + name + "': ";
  for (size_t i = 0; i < options.size(); ++i) {
    const OptionSpec& o = options[i];
    if (i) s += ", ";
    s += o.name + " (" + option_type_name(o.default_value) + ", default " +
         option_to_string(o.default_value) + ")";
  }
  return s;
}

std::map<std::string, OptionValue> resolve_options(const char* kind, const std::string& owner,
                                                   const std::vector<OptionSpec>& specs,
                                                   const std::map<std::string, OptionValue>& given) {
  std::map<std::string, OptionValue> out;
  for (const OptionSpec& o : specs) out[o.name] = o.default_value;
  for (const auto& [name, value] : given) {
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& o : specs)
      if (o.name == name) spec = &o;
    if (!spec)
      throw Error(std::string(kind) + " '" + owner + "' has no option '" + name + "'; " +
                  known_options(kind, owner, specs));
    if (value.index() == spec->default_value.index()) {
      out[name] = value;
    } else if (std::holds_alternative<double>(spec->default_value) &&
               std::holds_alternative<int64_t>(value)) {
      out[name] = static_cast<double>(std::get<int64_t>(value));
    } else {
      throw Error(std::string(kind) + " '" + owner + "': option '" + name + "' expects " +
                  option_type_name(spec->default_value) + ", got " + option_type_name(value) + " " +
                  option_to_string(value) + "; " + known_options(kind, owner, specs));
    }
  }
  return out;
}

}  // namespace

ModelOptions resolve_model_options(const ModelFactory& factory, const ModelOptions& given) {
  return resolve_options("model", factory.name, factory.options, given);
}

DatasetOptions resolve_dataset_options(const DatasetFactory& factory,
                                       const DatasetOptions& given) {
  return resolve_options("dataset", factory.name, factory.options, given);
}

}  // namespace dp
