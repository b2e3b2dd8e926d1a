// [data] of an experiment file: the dataset (built in or from a plugin), where its files are,
// and its options in [data.<dataset>], each checked against what the dataset declares, as
// [model.<model>] tables are against the model's plugin.
#include <algorithm>
#include <string>
#include <vector>

#include "experiment/experiment_detail.hpp"

namespace dprun::detail {

namespace {

Pos table_pos(const toml::table& t) { return pos_of(t.source(), {}); }

// The dataset's option `name`; null (reported at pos) when it declares none of that name.
const dp::OptionSpec* find_data_option(const dp::DatasetFactory& f, const std::string& name,
                                       const std::string& path, Pos pos, Diagnostics& diag) {
  std::vector<std::string> names, listing;
  for (const auto& o : f.options) {
    if (o.name == name) return &o;
    names.push_back(o.name);
    listing.push_back(o.name + ": " + dp::option_type_name(o.default_value) + " = " +
                      dp::option_to_string(o.default_value));
  }
  diag.add(pos, path,
           "unknown option " + quoted(name) + " of dataset " + f.name + typo_hint(name, names) +
               (listing.empty() ? " (the dataset takes no options)"
                                : " (known options: " + join(listing, ", ", false) + ")"));
  return nullptr;
}

// Dataset `name`, whose options are given at `path` ([data.NAME] or a sweep key): null
// (reported) when it is unknown or not `chosen`, the dataset the file trains on.
const dp::DatasetFactory* options_dataset(const std::string& name, const std::string& path, Pos pos,
                                          Validator& val, const std::string& chosen,
                                          const char* how) {
  Diagnostics& diag = val.diag();
  const auto& datasets = val.catalog().datasets;
  auto it = datasets.find(name);
  if (it == datasets.end()) {
    diag.add(pos, path,
             "unknown dataset " + quoted(name) + typo_hint(name, val.dataset_names()) + " (" +
                 val.known_datasets() + "; " + how + ")");
    return nullptr;
  }
  if (name != chosen) {
    diag.add(pos, path,
             "options for dataset " + name + ", but the experiment trains on " + chosen +
                 " ([data] dataset = " + quoted(chosen) + "): set the dataset, or remove " +
                 (path.find('.', 5) == std::string::npos ? "the table" : "the key"));
    return nullptr;
  }
  return &it->second;
}

// [data.<name>]: its options, read into `out` when `name` is the dataset the file trains on.
void read_options_table(const std::string& name, const toml::node& n, Pos key_pos, Validator& val,
                        Validated& out, const std::string& chosen) {
  Diagnostics& diag = val.diag();
  const std::string path = "data." + name;
  const dp::DatasetFactory* dataset = options_dataset(
      name, path, key_pos, val, chosen, "[data.NAME] holds the options of dataset NAME");
  if (dataset == nullptr) return;
  for (auto [ok, on] : in_file_order(*n.as_table())) {
    const std::string option(ok->str());
    const std::string opath = path + "." + option;
    const Pos opos = pos_of(ok->source(), key_pos);
    const dp::OptionSpec* spec = find_data_option(*dataset, option, opath, opos, diag);
    if (!spec) continue;
    if (auto v = val.read_option_value(*spec, name, *on, opath, opos, false, "dataset"))
      out.data_options[option] = *v;
  }
}

}  // namespace

const dp::OptionSpec* sweep_data_option(Validator& val, const std::string& key,
                                        const std::string& path, Pos pos, const std::string& chosen,
                                        std::string& dataset) {
  if (key == "data") {  // data.arrays.classes = [...] unquoted: a table "data"
    val.diag().add(pos, path,
                   "to sweep a dataset option, quote the key: \"data." + chosen +
                       ".<option>\" = [...] (a bare dotted key makes a table)");
    return nullptr;
  }
  // The experiment's own dataset first: its name may hold dots ([data."my.set"]).
  const std::string own = "data." + chosen + ".";
  std::string option;
  if (key.size() > own.size() && key.compare(0, own.size(), own) == 0 &&
      std::count(key.begin() + static_cast<std::ptrdiff_t>(own.size()), key.end(), '.') == 0) {
    dataset = chosen;
    option = key.substr(own.size());
  } else {
    std::vector<std::string> parts(1);  // the key split at its dots
    for (char ch : key) {
      if (ch == '.')
        parts.emplace_back();
      else
        parts.back() += ch;
    }
    if (parts.size() != 3 || parts[0] != "data" || parts[1].empty() || parts[2].empty()) {
      val.diag().add(pos, path,
                     "a dataset option axis is written \"data.<dataset>.<option>\", e.g. "
                     "\"data.stripes.noise\" = [0.1, 0.3]");
      return nullptr;
    }
    dataset = parts[1];
    option = parts[2];
  }
  const dp::DatasetFactory* f = options_dataset(
      dataset, path, pos, val, chosen, "\"data.NAME.OPTION\" sweeps option OPTION of dataset NAME");
  return f == nullptr ? nullptr : find_data_option(*f, option, path, pos, val.diag());
}

void read_data_table(const toml::table& t, Validator& val, Validated& out) {
  Diagnostics& diag = val.diag();
  const Pos at = table_pos(t);
  if (auto* n = t.get("dataset")) {
    const Pos pos = pos_of(n->source(), at);
    if (!n->is_string()) {
      diag.add(pos, "data.dataset", "expected a string, got " + describe(*n));
    } else {
      const std::string d = n->as_string()->get();
      if (!val.catalog().datasets.count(d))
        diag.add(pos, "data.dataset",
                 "unknown dataset " + quoted(d) + typo_hint(d, val.dataset_names()) + " (" +
                     val.known_datasets() + ")");
      out.dataset = d;
    }
  }
  if (auto* n = t.get("path")) {
    if (n->is_string())
      out.data_path = n->as_string()->get();
    else
      diag.add(pos_of(n->source(), at), "data.path", "expected a string, got " + describe(*n));
  }
  const std::vector<std::string> known = {"dataset", "path"};
  for (auto [k, n] : in_file_order(t)) {
    const std::string key(k->str());
    if (key == "dataset" || key == "path") continue;
    const Pos kpos = pos_of(k->source(), pos_of(n->source(), at));
    if (n->is_table()) {
      read_options_table(key, *n, kpos, val, out, out.dataset);
      continue;
    }
    diag.add(kpos, "data." + key,
             "unknown key" + typo_hint(key, known) +
                 " (known keys: dataset, path; a dataset's options go in a table [data." +
                 out.dataset + "])");
  }
}

}  // namespace dprun::detail
