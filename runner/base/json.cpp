#include "base/json.hpp"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace dprun {

Json Json::boolean(bool b) {
  Json j;
  j.type_ = Type::boolean;
  j.bool_ = b;
  return j;
}

Json Json::number(double d) {
  if (!std::isfinite(d)) return Json();
  // Shortest text that reads back to the same double.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d);
  Json j;
  j.type_ = Type::number;
  j.text_.assign(buf, res.ptr);
  return j;
}

Json Json::integer(int64_t i) {
  Json j;
  j.type_ = Type::number;
  j.text_ = std::to_string(i);
  return j;
}

Json Json::string(std::string s) {
  Json j;
  j.type_ = Type::string;
  j.text_ = std::move(s);
  return j;
}

Json Json::array() {
  Json j;
  j.type_ = Type::array;
  return j;
}

Json Json::object() {
  Json j;
  j.type_ = Type::object;
  return j;
}

namespace {
const char* type_name(Json::Type t) {
  switch (t) {
    case Json::Type::null:
      return "null";
    case Json::Type::boolean:
      return "a boolean";
    case Json::Type::number:
      return "a number";
    case Json::Type::string:
      return "a string";
    case Json::Type::array:
      return "an array";
    case Json::Type::object:
      return "an object";
  }
  return "?";
}
[[noreturn]] void wrong_type(const char* wanted, Json::Type got) {
  throw JsonError(std::string("expected ") + wanted + ", got " + type_name(got));
}
}  // namespace

bool Json::as_bool() const {
  if (type_ != Type::boolean) wrong_type("a boolean", type_);
  return bool_;
}

double Json::as_double() const {
  if (type_ == Type::null) return std::nan("");
  if (type_ != Type::number) wrong_type("a number", type_);
  return std::strtod(text_.c_str(), nullptr);
}

int64_t Json::as_int() const {
  if (type_ != Type::number) wrong_type("an integer", type_);
  int64_t v = 0;
  auto res = std::from_chars(text_.data(), text_.data() + text_.size(), v);
  if (res.ec != std::errc() || res.ptr != text_.data() + text_.size())
    throw JsonError("expected an integer, got " + text_);
  return v;
}

const std::string& Json::as_string() const {
  if (type_ != Type::string) wrong_type("a string", type_);
  return text_;
}

const std::vector<Json>& Json::items() const {
  if (type_ != Type::array) wrong_type("an array", type_);
  return items_;
}

const std::vector<std::pair<std::string, Json>>& Json::members() const {
  if (type_ != Type::object) wrong_type("an object", type_);
  return members_;
}

bool Json::is_integer_text() const {
  return type_ == Type::number && text_.find_first_of(".eE") == std::string::npos;
}

bool Json::has(const std::string& key) const {
  if (type_ != Type::object) return false;
  for (const auto& [k, v] : members_)
    if (k == key) return true;
  return false;
}

const Json& Json::at(const std::string& key) const {
  for (const auto& [k, v] : members())
    if (k == key) return v;
  throw JsonError("missing key \"" + key + "\"");
}

const Json& Json::get(const std::string& key) const {
  static const Json null_value;
  if (type_ != Type::object) return null_value;
  for (const auto& [k, v] : members_)
    if (k == key) return v;
  return null_value;
}

Json& Json::set(const std::string& key, Json value) {
  if (type_ != Type::object) wrong_type("an object", type_);
  for (auto& [k, v] : members_)
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  members_.emplace_back(key, std::move(value));
  return *this;
}

Json& Json::push(Json value) {
  if (type_ != Type::array) wrong_type("an array", type_);
  items_.push_back(std::move(value));
  return *this;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
  return out;
}

std::string Json::dump() const {
  switch (type_) {
    case Type::null:
      return "null";
    case Type::boolean:
      return bool_ ? "true" : "false";
    case Type::number:
      return text_;
    case Type::string:
      return json_quote(text_);
    case Type::array: {
      std::string out = "[";
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i) out += ',';
        out += items_[i].dump();
      }
      return out + "]";
    }
    case Type::object: {
      std::string out = "{";
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i) out += ',';
        out += json_quote(members_[i].first);
        out += ':';
        out += members_[i].second.dump();
      }
      return out + "}";
    }
  }
  return "null";
}

namespace {

// nlohmann's tree -> ours. Numbers keep a text that says what they were: integers as written,
// floats with a '.' or exponent even when whole (2.0 stays a float), as Json::number writes them.
Json from_library(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Json();
    case nlohmann::ordered_json::value_t::boolean:
      return Json::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Json::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        throw JsonError("integer " + std::to_string(u) + " is out of range");
      return Json::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Json::parse_float_text(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Json::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Json a = Json::array();
      for (const auto& item : j) a.push(from_library(item));
      return a;
    }
    case nlohmann::ordered_json::value_t::object: {
      Json o = Json::object();
      for (const auto& [key, value] : j.items()) o.set(key, from_library(value));
      return o;
    }
    default:
      throw JsonError("unsupported JSON value");
  }
}

}  // namespace

Json Json::parse_float_text(double d) {
  Json j = number(d);
  if (j.type_ == Type::number && j.text_.find_first_of(".eE") == std::string::npos) j.text_ += ".0";
  return j;
}

// Parsing is nlohmann-json's (strict RFC 8259: no trailing commas, no comments, surrogate pairs,
// control characters refused); its errors name the byte offset.
Json Json::parse(const std::string& text) {
  try {
    return from_library(nlohmann::ordered_json::parse(text));
  } catch (const nlohmann::ordered_json::exception& e) {
    throw JsonError(std::string("JSON: ") + e.what());
  }
}

}  // namespace dprun
