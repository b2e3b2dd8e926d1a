// Experiment files: read the TOML, validate every section against what dprun and the model
// catalog know (single values and the error types: experiment_values.cpp; [search] and sampled
// keys: sampling.cpp; --set: overrides.cpp), and hand the validated bindings to the sweep
// expansion (expand.cpp).
#include "experiment/experiment.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "experiment/experiment_detail.hpp"

namespace dprun {

namespace {

using detail::Binding;
using detail::describe;
using detail::Diagnostics;
using detail::in_file_order;
using detail::join;
using detail::option_type;
using detail::Pos;
using detail::pos_of;
using detail::typo_hint;
using detail::Val;
using detail::Validator;

/// Reads the sections of one parsed file into the validated form.
class FileReader {
 public:
  FileReader(Validator& val, const toml::table& root) : val_(val), diag_(val.diag()), root_(root) {}

  detail::Validated read(Experiment& ex) {
    static const std::vector<std::string> sections = {"experiment", "data",  "train", "model",
                                                      "search",     "sweep", "launch"};
    for (auto [k, n] : in_file_order(root_)) {
      const std::string name(k->str());
      Pos pos = pos_of(k->source(), pos_of(n->source(), {}));
      if (std::find(sections.begin(), sections.end(), name) == sections.end()) {
        diag_.add(pos, name,
                  "unknown section" + typo_hint(name, sections) +
                      " (known sections: " + join(sections, ", ", false) + ")");
      } else if (!n->is_table()) {
        diag_.add(pos_of(n->source(), pos), name,
                  "expected a table [" + name + "], got " + describe(*n));
      }
    }
    read_experiment(ex);
    read_data();
    read_train();
    read_models();
    read_search();
    read_sweep();
    read_launch(ex);
    check_whole();
    return std::move(out_);
  }

 private:
  const toml::table* section(const char* name) {
    auto* n = root_.get(name);
    return n ? n->as_table() : nullptr;
  }

  static Pos table_pos(const toml::table* t) { return t ? pos_of(t->source(), {}) : Pos{}; }

  /// Reports keys of `t` that are not in `known`.
  void unknown_keys(const toml::table& t, const std::string& prefix,
                    const std::vector<std::string>& known) {
    for (auto [k, n] : in_file_order(t)) {
      if (std::find(known.begin(), known.end(), std::string(k->str())) != known.end()) continue;
      diag_.add(pos_of(k->source(), pos_of(n->source(), table_pos(&t))),
                prefix + std::string(k->str()),
                "unknown key" + typo_hint(std::string(k->str()), known) +
                    " (known keys: " + join(known, ", ", false) + ")");
    }
  }

  /// A string value, or "" (with an error) when it has another type.
  std::optional<std::string> string_at(const toml::table& t, const char* key,
                                       const std::string& path) {
    auto* n = t.get(key);
    if (!n) return std::nullopt;
    if (!n->is_string()) {
      diag_.add(pos_of(n->source(), table_pos(&t)), path, "expected a string, got " + describe(*n));
      return std::nullopt;
    }
    return n->as_string()->get();
  }

  static std::string bad_name_reason(const std::string& name) {
    if (name == "." || name == "..") return "is not a file name";
    for (unsigned char c : name) {
      if (c == '/' || c == '\\') return "must not contain '/' or '\\'";
      if (c < 0x20 || c == 0x7f) return "must not contain control characters (newline, tab, ...)";
    }
    return "";
  }

  void read_experiment(Experiment& ex) {
    auto* t = section("experiment");
    if (!t) {
      if (!root_.get("experiment"))
        diag_.add({}, "experiment.name",
                  "missing: every experiment file needs an [experiment] table with name = \"...\""
                  " (the name identifies the experiment in the database)");
      return;
    }
    unknown_keys(*t, "experiment.", {"name", "description", "database"});
    if (auto name = string_at(*t, "name", "experiment.name")) {
      const auto name_pos = pos_of(t->get("name")->source(), table_pos(t));
      if (name->empty()) {
        diag_.add(name_pos, "experiment.name", "must not be empty");
      } else if (auto why = bad_name_reason(*name); !why.empty()) {
        // The name is the default database file (results/NAME.db) and is printed in tables:
        // a path separator would put the database elsewhere, a control character garbles both.
        diag_.add(name_pos, "experiment.name",
                  detail::quoted(*name) + ": " + why +
                      "; the name is also the default database file results/NAME.db (use "
                      "letters, digits, spaces, '-', '_' or '.')");
      }
      ex.name = *name;
    } else if (!t->get("name")) {
      diag_.add(table_pos(t), "experiment.name",
                "missing: give the experiment a name (it identifies the experiment in the "
                "database)");
    }
    if (auto d = string_at(*t, "description", "experiment.description")) ex.description = *d;
    if (auto d = string_at(*t, "database", "experiment.database")) ex.database = *d;
  }

  void read_data() {
    if (auto* t = section("data")) detail::read_data_table(*t, val_, out_);
  }

  void read_train() {
    auto* t = section("train");
    if (!t) return;
    out_.train_pos = table_pos(t);
    for (auto [k, n] : in_file_order(*t)) {
      const std::string name(k->str());
      // A group of settings (stop = {patience = 3, ...}, or stop.patience = 3): its keys.
      if (is_group(name) && n->is_table()) {
        for (auto [sk, sn] : in_file_order(*n->as_table()))
          read_train_entry(name + "." + std::string(sk->str()), *sk, *sn);
        continue;
      }
      read_train_entry(name, *k, *n);
    }
  }

  // True when `name` is the group of settings keyed "name.*" (stop: stop.patience, ...).
  bool is_group(const std::string& name) const {
    if (val_.settings().by_key(name) != nullptr) return false;
    for (const std::string& key : val_.settings().keys())
      if (key.rfind(name + ".", 0) == 0) return true;
    return false;
  }

  void read_train_entry(const std::string& name, const toml::key& k, const toml::node& n) {
    const std::string path = "train." + name;
    const Pos kpos = pos_of(k.source(), out_.train_pos);
    const Setting* spec = val_.settings().by_key(name);
    if (!spec) {
      const auto known = val_.settings().keys();
      diag_.add(kpos, path,
                "unknown key" + typo_hint(name, known) +
                    " (known keys: " + join(known, ", ", false) + ")");
      return;
    }
    given_.push_back({name, path, kpos});
    auto v = val_.read_train_value(*spec, n, path, kpos, false);
    if (!v) return;
    out_.bindings[name] = Binding{name, path, v->pos, kpos, -1, *v, {}};
  }

  void read_models() {
    auto* n = root_.get("model");
    if (!n || !n->is_table()) return;
    for (auto [k, m] : in_file_order(*n->as_table())) {
      const std::string model(k->str());
      std::string path = "model." + model;
      Pos pos = pos_of(m->source(), pos_of(k->source(), {}));
      if (!m->is_table()) {
        diag_.add(pos, path,
                  "expected a table [model." + model + "] of options for the " + model +
                      " plugin, got " + describe(*m) +
                      " (the model to train is set with model = ... in [train] or [sweep])");
        continue;
      }
      if (!val_.catalog().models.count(model)) {
        val_.find_option(model, "", path, pos);  // reports the unknown model
        continue;
      }
      auto& options = out_.model_tables[model];
      for (auto [ok, on] : in_file_order(*m->as_table())) {
        std::string opath = path + "." + std::string(ok->str());
        Pos opos = pos_of(ok->source(), pos);
        const dp::OptionSpec* spec = val_.find_option(model, std::string(ok->str()), opath, opos);
        if (!spec) continue;
        if (auto v = val_.read_option_value(*spec, model, *on, opath, opos, false))
          options[std::string(ok->str())] = *v;
      }
    }
  }

  // [launch]: how a trial of several processes is started. Where a trial runs does not change
  // what it computes, so nothing here is part of a trial's identity.
  void read_launch(Experiment& ex) {
    auto* t = section("launch");
    if (!t) return;
    unknown_keys(*t, "launch.", {"launcher", "hostfile", "args", "slurm"});
    if (auto* n = t->get("slurm")) detail::read_slurm_table(*n, table_pos(t), diag_, ex.slurm);
    if (auto l = string_at(*t, "launcher", "launch.launcher")) {
      const auto& known = known_launchers();
      if (std::find(known.begin(), known.end(), *l) == known.end())
        diag_.add(pos_of(t->get("launcher")->source(), table_pos(t)), "launch.launcher",
                  "unknown launcher " + detail::quoted(*l) + typo_hint(*l, known) +
                      " (known launchers: " + join(known, ", ", false) + ")");
      else
        ex.launch.launcher = *l;
    }
    if (auto h = string_at(*t, "hostfile", "launch.hostfile")) {
      const Pos pos = pos_of(t->get("hostfile")->source(), table_pos(t));
      std::error_code ec;
      if (h->empty()) {
        diag_.add(pos, "launch.hostfile",
                  "must not be empty (leave it out for the launcher's default hosts)");
      } else if (!std::filesystem::is_regular_file(*h, ec)) {
        diag_.add(pos, "launch.hostfile",
                  "no such file " + detail::quoted(*h) +
                      " (a relative path is from the folder dprun runs in; the file lists one "
                      "host per line, e.g. \"nodeA slots=8\")");
      } else if (ex.launch.launcher == "srun") {
        diag_.add(pos, "launch.hostfile",
                  "a hostfile is for mpirun; srun runs on the nodes of its Slurm allocation (give "
                  "srun options in launch.args, e.g. \"--nodelist=nodeA,nodeB\")");
      } else {
        ex.launch.hostfile = *h;
      }
    }
    if (auto* n = t->get("args")) {
      const auto* list = n->as_array();
      const bool strings =
          list && std::all_of(list->begin(), list->end(), [](auto& x) { return x.is_string(); });
      if (!strings) {
        diag_.add(pos_of(n->source(), table_pos(t)), "launch.args",
                  "expected a list of strings (arguments for the launcher, e.g. [\"--mca\", "
                  "\"btl\", \"tcp,self\"]), got " +
                      describe(*n));
      } else {
        for (const auto& x : *list) ex.launch.args.push_back(x.as_string()->get());
      }
    }
  }

  // [search]: how sweep keys given as distributions are sampled (sampling.cpp).
  void read_search() {
    if (auto* t = section("search")) {
      out_.search_pos = table_pos(t);
      detail::read_search_table(*t, diag_, out_.sampling, out_.search);
    }
  }

  /// One key of [sweep] or of a zip group. Returns the binding (fixed or with points) or
  /// nothing when the key or a value is bad (reported).
  std::optional<Binding> sweep_entry(const toml::key& k, const toml::node& n,
                                     const std::string& prefix, bool in_zip,
                                     const std::string& name = "") {
    const std::string key = name.empty() ? std::string(k.str()) : name;
    std::string path = prefix + key;
    Pos kpos = pos_of(k.source(), pos_of(n.source(), out_.sweep_pos));
    Pos vpos = pos_of(n.source(), kpos);
    // A plugin option axis: "model.lenet.hidden" = [64, 128] (quoted: a bare dotted key
    // would collide with the model list), or a dataset option axis: "data.stripes.noise".
    const Setting* spec = nullptr;
    const dp::OptionSpec* option = nullptr;
    std::string model;           // the option's owner: a model, or the dataset
    const char* kind = "model";  // which, for read_option_value's messages
    if (key == "data" || key.rfind("data.", 0) == 0) {
      kind = "dataset";
      option = detail::sweep_data_option(val_, key, path, kpos, out_.dataset, model);
      if (!option) return std::nullopt;
    } else if (key.rfind("model.", 0) == 0) {
      auto dot = key.find('.', 6);
      if (dot == std::string::npos || dot == 6 || dot + 1 == key.size() ||
          key.find('.', dot + 1) != std::string::npos) {
        diag_.add(kpos, path,
                  "a model option axis is written \"model.<model>.<option>\", e.g. "
                  "\"model.lenet.hidden\" = [64, 128]");
        return std::nullopt;
      }
      model = key.substr(6, dot - 6);
      option = val_.find_option(model, key.substr(dot + 1), path, kpos);
      if (!option) return std::nullopt;
    } else {
      spec = val_.settings().by_key(key);
      if (!spec) {
        auto known = val_.settings().keys();
        if (!in_zip) known.push_back("zip");
        diag_.add(kpos, path,
                  "unknown key" + typo_hint(key, known) +
                      "; a sweep takes the keys of [train], \"model.<model>.<option>\", "
                      "\"data.<dataset>.<option>\"" +
                      (in_zip ? "" : " and [[sweep.zip]] groups"));
        return std::nullopt;
      }
      given_.push_back({key, path, kpos});
      if (key == "model" && n.is_table() && !detail::is_distribution(n)) {
        diag_.add(vpos, path,
                  "expected a list of model names, got a table; to sweep a model option, quote "
                  "the key: \"model.lenet.hidden\" = [64, 128]");
        return std::nullopt;
      }
    }
    auto read = [&](const toml::node& v, const std::string& p, bool list) {
      return spec ? val_.read_train_value(*spec, v, p, vpos, list)
                  : val_.read_option_value(*option, model, v, p, vpos, list, kind);
    };
    if (option) given_.push_back({key, path, kpos});
    if (n.is_table()) {
      any_sampled_ = true;  // a wrong distribution is reported as such, not as nothing to sample
      return detail::sampled_binding({key, path, vpos, kpos, spec, option, in_zip}, n,
                                     out_.sampling, diag_, read);
    }
    Binding b{key, path, vpos, kpos, -1, {}, {}};
    auto* arr = n.as_array();
    // A list-valued setting is one value when written as a list of numbers; its axis is a list
    // of such lists.
    if (arr && spec && spec->type == SettingType::numbers &&
        !std::all_of(arr->begin(), arr->end(), [](const toml::node& x) { return x.is_array(); }))
      arr = nullptr;
    if (!arr) {
      if (in_zip) {
        std::string what =
            spec ? expected_text(*spec, true) : option_type(option->default_value, true);
        diag_.add(vpos, path,
                  "expected " + what + " (the lists of one zip group advance together), got " +
                      describe(n));
        return std::nullopt;
      }
      auto v = read(n, path, true);
      if (!v) return std::nullopt;
      b.fixed = *v;
      return b;
    }
    if (arr->empty()) {
      diag_.add(vpos, path, "empty list: a sweep axis needs at least one value");
      return std::nullopt;
    }
    bool ok = true;
    for (size_t i = 0; i < arr->size(); ++i) {
      auto v = read((*arr)[i], path + "[" + std::to_string(i) + "]", false);
      if (v)
        b.points.push_back(*v);
      else
        ok = false;
    }
    if (!ok) return std::nullopt;
    b.axis = 0;  // set for real once the axes are ordered
    return b;
  }

  /// Registers a sweep key; a key may be swept in one place only.
  bool claim(const Binding& b) {
    auto it = swept_.find(b.key);
    if (it != swept_.end()) {
      diag_.add(b.key_pos, b.path,
                b.key + " is already set in the sweep at " + it->second.first + " (line " +
                    std::to_string(it->second.second.line) +
                    "); a key may appear in only one place of the sweep");
      return false;
    }
    swept_[b.key] = {b.path, b.pos};
    return true;
  }

  void read_sweep() {
    auto* t = section("sweep");
    if (!t) return;
    out_.sweep_pos = table_pos(t);
    struct PendingAxis {
      Pos pos;
      std::vector<Binding> bindings;
    };
    std::vector<PendingAxis> pending;
    std::vector<Binding> fixed;
    std::optional<size_t> sampled;  // the axis of the sampled keys, which advance together
    for (auto [k, n] : in_file_order(*t)) {
      if (std::string(k->str()) == "zip") {
        read_zip_groups(*n, pending);
        continue;
      }
      // A group of settings (stop.patience = [2, 3] unquoted): each of its keys.
      if (const std::string name(k->str());
          is_group(name) && n->is_table() && !detail::is_distribution(*n)) {
        for (auto [sk, sn] : in_file_order(*n->as_table())) {
          auto b = sweep_entry(*sk, *sn, "sweep.", false, name + "." + std::string(sk->str()));
          if (b && claim(*b)) add_sweep_binding(*b, pending, fixed, sampled);
        }
        continue;
      }
      auto b = sweep_entry(*k, *n, "sweep.", false);
      if (!b || !claim(*b)) continue;
      add_sweep_binding(*b, pending, fixed, sampled);
    }
    any_sampled_ = any_sampled_ || sampled.has_value();
    std::stable_sort(pending.begin(), pending.end(), [](const auto& a, const auto& b) {
      return std::make_pair(a.pos.line, a.pos.column) < std::make_pair(b.pos.line, b.pos.column);
    });
    for (auto& b : fixed) out_.bindings[b.key] = b;
    for (auto& p : pending) {
      detail::Axis axis{p.pos, {}, p.bindings.front().points.size()};
      for (auto& b : p.bindings) {
        b.axis = static_cast<int>(out_.axes.size());
        axis.keys.push_back(b.key);
        out_.bindings[b.key] = b;
      }
      out_.axes.push_back(axis);
    }
  }

  // A [sweep] key's binding: fixed, its own axis, or one of the sampled keys' axis.
  template <typename Pending>
  static void add_sweep_binding(const Binding& b, std::vector<Pending>& pending,
                                std::vector<Binding>& fixed, std::optional<size_t>& sampled) {
    if (b.axis < 0) {
      fixed.push_back(b);
    } else if (b.sampled) {
      if (!sampled) {
        sampled = pending.size();
        pending.push_back({b.pos, {}});
      }
      pending[*sampled].bindings.push_back(b);
    } else {
      pending.push_back({b.pos, {b}});
    }
  }

  template <typename Pending>
  void read_zip_groups(const toml::node& n, std::vector<Pending>& pending) {
    Pos zpos = pos_of(n.source(), out_.sweep_pos);
    auto* groups = n.as_array();
    if (!groups || !groups->is_array_of_tables()) {
      diag_.add(zpos, "sweep.zip",
                "expected [[sweep.zip]] tables (each a group of lists that advance together), "
                "got " +
                    describe(n));
      return;
    }
    for (size_t g = 0; g < groups->size(); ++g) {
      const auto& group = *(*groups)[g].as_table();
      std::string prefix = "sweep.zip[" + std::to_string(g) + "].";
      Pos gpos = pos_of(group.source(), zpos);
      Pending axis{gpos, {}};
      bool ok = true;
      for (auto [k, v] : in_file_order(group)) {
        auto b = sweep_entry(*k, *v, prefix, true);
        if (!b || !claim(*b)) {
          ok = false;
          continue;
        }
        if (!axis.bindings.empty() && axis.bindings.front().points.size() != b->points.size()) {
          const auto& first = axis.bindings.front();
          diag_.add(b->pos, b->path,
                    "the lists of one zip group must have the same length: " + first.key + " has " +
                        std::to_string(first.points.size()) + " values, " + b->key + " has " +
                        std::to_string(b->points.size()));
          ok = false;
          continue;
        }
        axis.bindings.push_back(*b);
      }
      if (group.empty()) {
        diag_.add(gpos, prefix.substr(0, prefix.size() - 1),
                  "empty zip group: give lists that advance together, e.g. gpus = [1, 2] and "
                  "batch_size = [256, 512]");
      } else if (ok) {
        pending.push_back(std::move(axis));
      }
    }
  }

  /// Checks that need the whole file.
  void check_whole() {
    if (out_.sampling.samples > 0 && !any_sampled_)
      diag_.add(out_.sampling.pos, "search.samples",
                "no [sweep] key is a distribution, so there is nothing to sample; give one, "
                "e.g. lr = {log_uniform = [0.001, 1.0]}");
    if (!out_.bindings.count("model") && !swept_.count("model")) {
      bool model_given = false;
      for (const auto& g : given_) model_given |= g.key == "model";
      if (!model_given) {
        diag_.add(out_.train_pos, "train.model",
                  "no model given: set model = \"...\" in [train] or model = [...] in [sweep]; " +
                      val_.known_models());
      }
    }
    const Given* batch = nullptr;
    const Given* per_gpu = nullptr;
    for (const auto& g : given_) {
      if (g.key == "batch_size" && !batch) batch = &g;
      if (g.key == "per_gpu_batch" && !per_gpu) per_gpu = &g;
    }
    if (batch && per_gpu) {
      diag_.add(per_gpu->pos, per_gpu->path,
                "give either batch_size or per_gpu_batch, not both (batch_size is set at " +
                    batch->path + ", line " + std::to_string(batch->pos.line) + ")");
    }
  }

  struct Given {
    std::string key, path;
    Pos pos;
  };

  Validator& val_;
  Diagnostics& diag_;
  const toml::table& root_;
  detail::Validated out_;
  std::vector<Given> given_;                                  // every key set, in order
  bool any_sampled_ = false;                                  // a [sweep] key is a distribution
  std::map<std::string, std::pair<std::string, Pos>> swept_;  // key -> (path, pos)
};

}  // namespace

Experiment parse_experiment(const std::string& file, const std::string& source,
                            const ModelCatalog& catalog, const ParseOptions& options) {
  Experiment ex;
  ex.file = file;
  ex.source = source;
  toml::table root;
  try {
    root = toml::parse(std::string_view(source), std::string_view(file));
  } catch (const toml::parse_error& e) {
    Pos pos = pos_of(e.source(), {});
    throw ConfigErrors({ConfigError(file, pos.line, pos.column, "",
                                    "TOML syntax error: " + std::string(e.description()))});
  }
  ex.settings = options.settings;
  if (!options.overrides.empty()) {
    detail::Diagnostics override_errors(file);
    detail::apply_overrides(root, options.overrides, override_errors);
    override_errors.throw_if_any();
    // The stored source says how the file was run: the overrides follow as comments.
    ex.source += "\n# dprun overrides (--set):\n";
    for (const auto& o : options.overrides) ex.source += "#   " + o + "\n";
    ex.overrides = options.overrides;
  }
  Validator val(file, catalog, *options.settings);
  detail::Validated validated = FileReader(val, root).read(ex);
  validated.settings = options.settings;
  val.diag().throw_if_any();
  ex.data_path = validated.data_path;
  ex.trials = detail::expand(validated, catalog, options, val.diag());
  ex.search = validated.search;
  detail::check_search(ex.search, ex.trials, validated.search_pos, val.diag());
  val.diag().throw_if_any();
  return ex;
}

std::map<std::string, dp::DatasetFactory> builtin_dataset_catalog() {
  std::map<std::string, dp::DatasetFactory> out;
  for (const auto& f : dp::builtin_datasets()) out.emplace(f.name, f);
  return out;
}

Experiment load_experiment(const std::string& file, const ModelCatalog& catalog,
                           const ParseOptions& options) {
  // An ifstream opens a folder and reads it as empty, which would report a missing
  // [experiment] table instead of the real mistake.
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    throw std::runtime_error("cannot read experiment file " + file +
                             ": it is a folder; give the path of a .toml file");
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read experiment file " + file + ": " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read experiment file " + file);
  return parse_experiment(file, text.str(), catalog, options);
}

}  // namespace dprun
