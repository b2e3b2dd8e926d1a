// [launch.slurm] of an experiment file: how `dprun submit` asks Slurm for each task's resources.
// Every mistake is reported where it was made, with the key and the value, before anything runs.
#include <algorithm>
#include <regex>

#include "experiment/experiment_detail.hpp"
#include "experiment/launch_tables.hpp"

namespace dprun::detail {

namespace {

const std::vector<std::string>& slurm_keys() {
  static const std::vector<std::string> keys = {"max_parallel",  "partition", "time",
                                                "account",       "qos",       "mem",
                                                "cpus_per_task", "gpus_as",   "args"};
  return keys;
}

// Slurm's forms (sbatch --time): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
bool is_slurm_time(const std::string& s) {
  static const std::regex form(
      R"(^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+)$)");
  return s == "UNLIMITED" || s == "INFINITE" || std::regex_match(s, form);
}

// sbatch --mem: a number with an optional unit.
bool is_slurm_memory(const std::string& s) {
  static const std::regex form(R"(^\d+[KMGT]?$)");
  return std::regex_match(s, form);
}

}  // namespace

namespace {

// One value of [launch.slurm] (its key known), into `out`; false, reported, when it is wrong.
bool read_slurm_number(const std::string& key, const toml::node& n, Pos at, const std::string& path,
                       Diagnostics& diag, SlurmConfig& out) {
  const auto* i = n.as_integer();
  if (!i || i->get() < 1) {
    diag.add(at, path,
             std::string("expected a positive integer (") +
                 (key == "max_parallel"
                      ? "the most tasks of the array running at once, sbatch --array=...%N"
                      : "CPUs for each process of a trial, sbatch --cpus-per-task") +
                 "), got " + describe(n));
    return false;
  }
  (key == "max_parallel" ? out.max_parallel : out.cpus_per_task) = i->get();
  return true;
}

bool read_slurm_args(const toml::node& n, Pos at, const std::string& path, Diagnostics& diag,
                     SlurmConfig& out) {
  const auto* list = n.as_array();
  const bool strings =
      list && std::all_of(list->begin(), list->end(), [](auto& x) { return x.is_string(); });
  if (!strings) {
    diag.add(at, path,
             "expected a list of strings (more sbatch arguments, e.g. [\"--constraint=a100\", "
             "\"--exclusive\"]), got " +
                 describe(n));
    return false;
  }
  std::vector<std::string> args;
  for (const auto& x : *list) args.push_back(x.as_string()->get());
  if (const std::string problem = sbatch_args_problem(args); !problem.empty()) {
    diag.add(at, path, problem);
    return false;
  }
  out.args.insert(out.args.end(), args.begin(), args.end());
  return true;
}

// partition, time, account, qos, mem: sbatch's options of those names.
bool read_slurm_text(const std::string& key, const toml::node& n, Pos at, const std::string& path,
                     Diagnostics& diag, SlurmConfig& out) {
  const auto* s = n.as_string();
  if (!s || s->get().empty()) {
    diag.add(at, path, "expected a non-empty string (sbatch --" + key + "), got " + describe(n));
    return false;
  }
  const std::string& v = s->get();
  if (key == "time" && !is_slurm_time(v)) {
    diag.add(at, path,
             "expected a Slurm time limit (minutes, \"MM:SS\", \"HH:MM:SS\", \"D-HH\", "
             "\"D-HH:MM:SS\" or \"UNLIMITED\"), got " +
                 describe(n));
    return false;
  }
  if (key == "mem" && !is_slurm_memory(v)) {
    diag.add(at, path,
             "expected memory per node as sbatch --mem takes it (a number with an optional "
             "unit K, M, G or T, e.g. \"16G\"), got " +
                 describe(n));
    return false;
  }
  if (key == "partition") out.partition = v;
  if (key == "time") out.time = v;
  if (key == "account") out.account = v;
  if (key == "qos") out.qos = v;
  if (key == "mem") out.mem = v;
  return true;
}

}  // namespace

void read_slurm_table(const toml::node& node, Pos fallback, Diagnostics& diag, SlurmConfig& out) {
  const Pos pos = pos_of(node.source(), fallback);
  const auto* t = node.as_table();
  if (!t) {
    diag.add(pos, "launch.slurm",
             "expected a table of sbatch settings (e.g. slurm = { partition = \"gpu\", time = "
             "\"2:00:00\", max_parallel = 8 }), got " +
                 describe(node));
    return;
  }
  out.given = true;
  for (auto [k, n] : in_file_order(*t)) {
    const std::string key(k->str());
    const std::string path = "launch.slurm." + key;
    const Pos at = pos_of(n->source(), pos_of(k->source(), pos));
    const auto& known = slurm_keys();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      diag.add(pos_of(k->source(), at), path,
               "unknown key" + typo_hint(key, known) + " (known keys: " + join(known, ", ", false) +
                   "; other sbatch options go in args, e.g. args = [\"--constraint=a100\"])");
    } else if (key == "max_parallel" || key == "cpus_per_task") {
      read_slurm_number(key, *n, at, path, diag, out);
    } else if (key == "gpus_as") {
      const auto* v = n->as_string();
      if (!v || (v->get() != "gpus-per-task" && v->get() != "gres")) {
        diag.add(at, path,
                 "expected \"gpus-per-task\" (sbatch --gpus-per-task=G, the default) or \"gres\" "
                 "(--gres=gpu:G per node, one process per node), got " +
                     describe(*n));
      } else {
        out.gres = v->get() == "gres";
      }
    } else if (key == "args") {
      read_slurm_args(*n, at, path, diag, out);
    } else {
      read_slurm_text(key, *n, at, path, diag, out);
    }
  }
}

}  // namespace dprun::detail
