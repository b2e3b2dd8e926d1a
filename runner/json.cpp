#include "json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

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

class JsonParser {
 public:
  explicit JsonParser(const std::string& t) : t_(t) {}

  Json parse_document() {
    Json v = value(0);
    skip_ws();
    if (i_ != t_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  const std::string& t_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) {
    throw JsonError("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r'))
      ++i_;
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (t_.compare(i_, n, word) == 0) {
      i_ += n;
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 64) fail("nesting too deep");
    skip_ws();
    if (i_ >= t_.size()) fail("unexpected end");
    char c = t_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Json::string(string_body());
    if (literal("true")) return Json::boolean(true);
    if (literal("false")) return Json::boolean(false);
    if (literal("null")) return Json();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
  }

  Json object(int depth) {
    Json o = Json::object();
    ++i_;
    skip_ws();
    if (i_ < t_.size() && t_[i_] == '}') {
      ++i_;
      return o;
    }
    for (;;) {
      skip_ws();
      if (i_ >= t_.size() || t_[i_] != '"') fail("expected a key");
      std::string key = string_body();
      skip_ws();
      if (i_ >= t_.size() || t_[i_] != ':') fail("expected ':'");
      ++i_;
      o.members_.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (i_ < t_.size() && t_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < t_.size() && t_[i_] == '}') {
        ++i_;
        return o;
      }
      fail("expected ',' or '}'");
    }
  }

  Json array(int depth) {
    Json a = Json::array();
    ++i_;
    skip_ws();
    if (i_ < t_.size() && t_[i_] == ']') {
      ++i_;
      return a;
    }
    for (;;) {
      a.items_.push_back(value(depth + 1));
      skip_ws();
      if (i_ < t_.size() && t_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < t_.size() && t_[i_] == ']') {
        ++i_;
        return a;
      }
      fail("expected ',' or ']'");
    }
  }

  Json number() {
    size_t start = i_;
    if (t_[i_] == '-') ++i_;
    auto digits = [&] {
      size_t s = i_;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
      return i_ > s;
    };
    if (!digits()) fail("bad number");
    if (i_ < t_.size() && t_[i_] == '.') {
      ++i_;
      if (!digits()) fail("bad number");
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      ++i_;
      if (i_ < t_.size() && (t_[i_] == '+' || t_[i_] == '-')) ++i_;
      if (!digits()) fail("bad number");
    }
    Json j;
    j.type_ = Json::Type::number;
    j.text_ = t_.substr(start, i_ - start);
    return j;
  }

  unsigned hex4() {
    if (i_ + 4 > t_.size()) fail("bad \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = t_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= unsigned(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= unsigned(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= unsigned(h - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string_body() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (i_ >= t_.size()) fail("unterminated string");
      char c = t_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= t_.size()) fail("unterminated string");
      char e = t_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 6 <= t_.size() && t_[i_] == '\\' &&
              t_[i_ + 1] == 'u') {
            i_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }
};

Json Json::parse(const std::string& text) { return JsonParser(text).parse_document(); }

}  // namespace dprun
