// `--set KEY=VALUE`: command-line values that replace the experiment file's, applied to the
// parsed TOML before it is read, so they go through every check the file's values do. Their
// values carry the override as their source, so a problem is reported at "--set KEY=VALUE".
#include <algorithm>

#include "experiment/experiment_detail.hpp"

namespace dprun::detail {

namespace {

// `into` takes `from`'s entries: tables merge, anything else replaces. Moved, not copied: a
// copied TOML++ node forgets where it came from, and the messages need that.
void merge(toml::table& into, toml::table& from) {
  for (auto&& [k, v] : from) {
    auto* mine = into.get(k.str());
    // A distribution ({log_uniform = [...]}) is one value: it replaces, it does not merge.
    if (v.is_table() && mine != nullptr && mine->is_table() && !is_distribution(v) &&
        !is_distribution(*mine)) {
      merge(*mine->as_table(), *v.as_table());
      continue;
    }
    v.visit([&, &key = k](auto& node) { into.insert_or_assign(key, std::move(node)); });
  }
}

// The one path of keys an override document holds ("train" -> "epochs"), for messages.
std::vector<std::string> key_path(const toml::table& doc) {
  std::vector<std::string> path;
  const toml::table* t = &doc;
  while (t != nullptr && t->size() == 1) {
    // The iterator must outlive the pair it gives: TOML++ hands out a proxy that lives in it.
    const auto it = t->begin();
    path.emplace_back(it->first.str());
    t = it->second.as_table();
  }
  return path;
}

// Whether a table of [sweep] (or a zip group) sets `key` ("lr", or "stop.patience": quoted, or
// as nested tables).
bool sets_key(const toml::table& t, const std::string& key) {
  if (t.contains(key)) return true;
  const auto dot = key.find('.');
  if (dot == std::string::npos) return false;
  const auto* inner = t.get(key.substr(0, dot));
  return inner != nullptr && inner->is_table() && !is_distribution(*inner) &&
         sets_key(*inner->as_table(), key.substr(dot + 1));
}

std::string toml_string(const std::string& text) {
  std::string s = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') s += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;  // no control characters in a value
    s += c;
  }
  return s + "\"";
}

}  // namespace

void apply_overrides(toml::table& root, const std::vector<std::string>& overrides,
                     Diagnostics& diag) {
  for (const std::string& text : overrides) {
    const std::string origin = kOverrideOrigin + text;
    const Pos here{0, 0, origin};
    const auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0 || text.find_first_not_of(" \t") == eq) {
      diag.add(here, "",
               "expected KEY=VALUE, e.g. --set train.epochs=2, --set model.lenet.hidden=64 or "
               "--set sweep.lr=[0.1,0.2]");
      continue;
    }
    const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
    toml::table doc;
    try {
      doc = toml::parse(key + " = " + value, std::string_view(origin));
    } catch (const toml::parse_error&) {
      // Not a TOML value: a bare word (--set train.model=lenet) is the string it spells.
      try {
        doc = toml::parse(key + " = " + toml_string(value), std::string_view(origin));
      } catch (const toml::parse_error& e) {
        diag.add(here, "",
                 "not a TOML key: " + quoted(key) + " (" + std::string(e.description()) +
                     "); keys are dotted paths such as train.epochs or sweep.\"model.lenet." +
                     "hidden\"");
        continue;
      }
    }
    const std::vector<std::string> path = key_path(doc);
    // A [train] value, or a model's or the dataset's option, is replaced by a [sweep] one: an
    // override of one the file sweeps would change nothing, so say where to put it.
    std::string swept_key, table;  // the key as [sweep] names it; the table the override writes to
    if (path.size() >= 2 && path[0] == "train") {
      swept_key = path[1];  // a setting, or a group's (stop.patience)
      for (size_t i = 2; i < path.size(); ++i) swept_key += "." + path[i];
      table = "[train]";
    } else if (path.size() == 3 && (path[0] == "model" || path[0] == "data")) {
      swept_key = path[0] + "." + path[1] + "." + path[2];  // "model.lenet.hidden" in [sweep]
      table = "[" + path[0] + "." + path[1] + "]";
    }
    const toml::table* sweep = root["sweep"].as_table();
    bool swept = !swept_key.empty() && sweep != nullptr && sets_key(*sweep, swept_key);
    if (const auto* zip = sweep && !swept_key.empty() ? (*sweep)["zip"].as_array() : nullptr)
      for (const auto& group : *zip)
        if (const auto* g = group.as_table(); g != nullptr && sets_key(*g, swept_key)) swept = true;
    if (swept) {
      const std::string as_sweep =
          swept_key.find('.') == std::string::npos ? swept_key : detail::quoted(swept_key);
      diag.add(here, table == "[train]" ? "train." + swept_key : swept_key,
               "the file sweeps " + swept_key + " in [sweep], which replaces " + table +
                   "'s value: override the sweep instead, e.g. --set 'sweep." + as_sweep +
                   "=[...]'");
      continue;
    }
    merge(root, doc);
  }
}

}  // namespace dprun::detail
