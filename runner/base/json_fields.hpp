#pragma once
// A struct as a JSON object by a list of its fields, so a record type's members are named once:
//   const JsonFields<RunOptions>& f = {{field("threads", &RunOptions::threads), ...}};
//   Json j = f.to_json(options);  RunOptions o = f.from_json(j, "run option");
// Members of the types below only: string, bool, int, int64_t, double, vector<string>,
// vector<double>.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/json.hpp"

namespace dprun {

namespace json_fields {
inline Json encode(const std::string& v) { return Json::string(v); }
inline Json encode(bool v) { return Json::boolean(v); }
inline Json encode(int v) { return Json::integer(v); }
inline Json encode(int64_t v) { return Json::integer(v); }
inline Json encode(double v) { return Json::number(v); }
inline Json encode(const std::vector<std::string>& v) {
  Json a = Json::array();
  for (const auto& s : v) a.push(Json::string(s));
  return a;
}
inline Json encode(const std::vector<double>& v) {
  Json a = Json::array();
  for (const double d : v) a.push(Json::number(d));  // NaN: null
  return a;
}
inline void decode(const Json& j, std::string& v) { v = j.as_string(); }
inline void decode(const Json& j, bool& v) { v = j.as_bool(); }
inline void decode(const Json& j, int& v) { v = static_cast<int>(j.as_int()); }
inline void decode(const Json& j, int64_t& v) { v = j.as_int(); }
inline void decode(const Json& j, double& v) { v = j.as_double(); }
inline void decode(const Json& j, std::vector<std::string>& v) {
  v.clear();
  for (const auto& s : j.items()) v.push_back(s.as_string());
}
inline void decode(const Json& j, std::vector<double>& v) {
  v.clear();
  for (const auto& d : j.items()) v.push_back(d.as_double());  // null: NaN
}
}  // namespace json_fields

/// One member of S as one member of a JSON object.
template <class S>
struct JsonField {
  const char* name;
  std::function<Json(const S&)> get;
  std::function<void(const Json&, S&)> set;
};

/// A field for member `m` of S.
template <class S, class T>
JsonField<S> field(const char* name, T S::*m) {
  return {name, [m](const S& s) { return json_fields::encode(s.*m); },
          [m](const Json& j, S& s) { json_fields::decode(j, s.*m); }};
}
/// A field for member `m` of S's member `outer` (a nested struct, flattened into the object).
template <class S, class O, class T>
JsonField<S> field(const char* name, O S::*outer, T O::*m) {
  return {name, [outer, m](const S& s) { return json_fields::encode(s.*outer.*m); },
          [outer, m](const Json& j, S& s) { json_fields::decode(j, s.*outer.*m); }};
}

template <class S>
class JsonFields {
 public:
  JsonFields(std::initializer_list<JsonField<S>> fields) : fields_(fields) {}
  /// Sets every field's member of `into` (an object; others it has are kept).
  void write(const S& s, Json& into) const {
    for (const auto& f : fields_) into.set(f.name, f.get(s));
  }
  Json to_json(const S& s) const {
    Json j = Json::object();
    write(s, j);
    return j;
  }
  /// Reads every field into `s`; JsonError naming `what` and the member that is missing or of
  /// the wrong type.
  void read(const Json& j, S& s, const std::string& what) const {
    for (const auto& f : fields_) {
      try {
        f.set(j.at(f.name), s);
      } catch (const JsonError& e) {
        throw JsonError(what + " \"" + f.name + "\": " + e.what());
      }
    }
  }

 private:
  std::vector<JsonField<S>> fields_;
};

}  // namespace dprun
