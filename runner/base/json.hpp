#pragma once
// A small JSON value for the runner <-> trial-process protocol (one object per line), the
// settings' canonical text and `dprun query --format json`. Parsing is nlohmann-json's; the
// encoder is ours because config hashes depend on its exact bytes (member order as inserted,
// numbers as their shortest text, json_quote's escapes), which no library promises to keep.
// Numbers keep their text, so 64-bit integers (seeds, byte counts) survive a round trip.
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dprun {

class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Json {
 public:
  enum class Type { null, boolean, number, string, array, object };

  Json() = default;  // null
  static Json boolean(bool b);
  static Json number(double d);  // non-finite values encode as null
  static Json integer(int64_t i);
  /// A float as read from a document: its shortest text, with ".0" when it is whole, so it
  /// stays a float (is_integer_text() false).
  static Json parse_float_text(double d);
  static Json string(std::string s);
  static Json array();
  static Json object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool is_object() const { return type_ == Type::object; }

  /// Typed access; throws JsonError naming the expected type.
  bool as_bool() const;
  double as_double() const;  // null reads as NaN (how non-finite numbers travel)
  int64_t as_int() const;    // the number must be an integer
  const std::string& as_string() const;
  const std::vector<Json>& items() const;
  const std::vector<std::pair<std::string, Json>>& members() const;
  /// True when the number was written without a fraction or exponent.
  bool is_integer_text() const;

  /// Object access: has(), at() throws JsonError "missing key", get() returns null when absent.
  bool has(const std::string& key) const;
  const Json& at(const std::string& key) const;
  const Json& get(const std::string& key) const;
  /// Object building: replaces an existing key or appends.
  Json& set(const std::string& key, Json value);
  /// Array building.
  Json& push(Json value);

  /// Compact one-line encoding (no newline inside, so it can serve as a protocol record).
  std::string dump() const;
  /// Parses exactly one value (surrounding whitespace allowed), with nlohmann-json; JsonError
  /// with the offset.
  static Json parse(const std::string& text);

 private:
  Type type_ = Type::null;
  bool bool_ = false;
  std::string text_;  // string value, or number text
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

/// `"text"` with JSON escapes.
std::string json_quote(const std::string& s);

}  // namespace dprun
