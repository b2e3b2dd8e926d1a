// A trial's settings as the store keeps them (one column each) and as the trial record sends them
// (one JSON member each), and back: what follows from the table of settings (settings.cpp) for
// the database and the trial process.
#include <stdexcept>

#include "settings/settings.hpp"

namespace dprun {

// ---- the store ---------------------------------------------------------------------------------

namespace {

// A list of floats as stored: the JSON array of their exact values.
std::string numbers_json(const std::vector<double>& list) {
  Json a = Json::array();
  for (double d : list) a.push(Json::number(d));
  return a.dump();
}

}  // namespace

dps::SettingValues to_store(const TrialSettings& settings) {
  dps::SettingValues out;
  const auto& recorded = settings.table().recorded();
  for (size_t i = 0; i < recorded.size(); ++i) {
    const SettingValue& v = settings.at(i);
    dps::SqlValue sql;
    if (auto* b = std::get_if<bool>(&v))
      sql = int64_t{*b ? 1 : 0};  // SQLite has no boolean
    else if (auto* n = std::get_if<int64_t>(&v))
      sql = *n;
    else if (auto* d = std::get_if<double>(&v))
      sql = *d;
    else if (auto* list = std::get_if<std::vector<double>>(&v))
      sql = numbers_json(*list);
    else
      sql = std::get<std::string>(v);
    out[recorded[i]->column] = std::move(sql);
  }
  return out;
}

SettingValue from_store(const Setting& s, const dps::SqlValue& v) {
  auto bad = [&]() -> SettingValue {
    throw std::runtime_error("stored setting " + s.column + ": not a value of a " +
                             setting_type_name(s.type) + " setting");
  };
  const auto* i = std::get_if<int64_t>(&v);
  const auto* d = std::get_if<double>(&v);
  const auto* t = std::get_if<std::string>(&v);
  switch (s.type) {
    case SettingType::boolean:
      return i ? SettingValue(*i != 0) : bad();
    case SettingType::boolean_auto:
      // A bool is stored as an integer, "auto" as the text.
      return i ? SettingValue(*i != 0) : t && *t == "auto" ? SettingValue(*t) : bad();
    case SettingType::integer:
      return i ? SettingValue(*i) : bad();
    case SettingType::number:
      // A REAL column keeps an integral value as an integer on disk; it reads as REAL, but
      // accept both.
      return d ? SettingValue(*d) : i ? SettingValue(static_cast<double>(*i)) : bad();
    case SettingType::numbers: {
      if (!t) return bad();
      std::vector<double> list;
      try {
        const Json parsed = Json::parse(*t);  // items() refers into it
        for (const Json& item : parsed.items()) list.push_back(item.as_double());
      } catch (const JsonError&) {
        return bad();
      }
      return list;
    }
    default:
      return t ? SettingValue(*t) : bad();
  }
}

TrialSettings settings_from_store(const SettingTable& table, const dps::SettingValues& values) {
  // A column the database lacks was not a setting yet: what dprun did then, its first default.
  TrialSettings s(table);
  for (const Setting* row : table.recorded()) {
    if (auto it = values.find(row->column); it != values.end())
      s.set(row->column, from_store(*row, it->second));
    else
      s.set(row->column, row->first_default());
  }
  return s;
}

// ---- the trial record --------------------------------------------------------------------------

Json settings_to_json(const TrialSettings& settings) {
  Json o = Json::object();
  const auto& recorded = settings.table().recorded();
  for (size_t i = 0; i < recorded.size(); ++i) {
    const SettingValue& v = settings.at(i);
    Json j;
    if (auto* b = std::get_if<bool>(&v))
      j = Json::boolean(*b);
    else if (auto* n = std::get_if<int64_t>(&v))
      j = Json::integer(*n);
    else if (auto* d = std::get_if<double>(&v))
      j = Json::number(*d);
    else if (auto* list = std::get_if<std::vector<double>>(&v))
      j = Json::parse(numbers_json(*list));
    else
      j = Json::string(std::get<std::string>(v));
    o.set(recorded[i]->column, j);
  }
  return o;
}

TrialSettings settings_from_json(const Json& json, const SettingTable& table) {
  TrialSettings s(table);
  for (const auto& [name, unused] : json.members())
    if (!table.by_column(name)) throw JsonError("settings: unknown setting \"" + name + "\"");
  for (const Setting* row : table.recorded()) {
    try {
      const Json& j = json.at(row->column);
      switch (row->type) {
        case SettingType::boolean:
          s.set(row->column, j.as_bool());
          break;
        case SettingType::boolean_auto:
          if (j.type() == Json::Type::string) {
            if (j.as_string() != "auto")
              throw JsonError("expected true, false or \"auto\", got \"" + j.as_string() + "\"");
            s.set(row->column, j.as_string());
          } else {
            s.set(row->column, j.as_bool());
          }
          break;
        case SettingType::integer:
          s.set(row->column, j.as_int());
          break;
        case SettingType::number:
          s.set(row->column, j.as_double());
          break;
        case SettingType::numbers: {
          std::vector<double> list;
          for (const Json& item : j.items()) list.push_back(item.as_double());
          s.set(row->column, list);
          break;
        }
        default:
          s.set(row->column, j.as_string());
      }
    } catch (const JsonError& e) {
      throw JsonError("settings: \"" + row->column + "\": " + e.what());
    }
  }
  return s;
}

}  // namespace dprun
