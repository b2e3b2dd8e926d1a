// The dprun command line. Every command is one row of kCommands (name, summary, usage, options,
// handler), as ninja's kTools[]: the main help, `dprun COMMAND --help`, option parsing and
// dispatch all read that table, so they cannot drift apart.
#include "cli.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <variant>

#include "dp/data.hpp"
#include "dp/error.hpp"
#include "dp/plugin.hpp"
#include "dp/version.hpp"
#include "dpstore/store.hpp"
#include "experiment.hpp"
#include "plugin_loader.hpp"
#include "report.hpp"
#include "suggest.hpp"
#include "sweep_runner.hpp"
#include "trial_main.hpp"
#include "usage_error.hpp"

namespace dprun {

namespace {

// ---- options and their parser -------------------------------------------------------------------

struct Opt {
  const char* name;     // "--db"
  const char* metavar;  // "PATH"; nullptr for a flag
  const char* help;
};

struct Args {
  std::map<std::string, std::vector<std::string>> values;  // by option name
  std::vector<std::string> positional;

  bool flag(const std::string& name) const { return values.count(name) > 0; }
  std::optional<std::string> last(const std::string& name) const {
    auto it = values.find(name);
    if (it == values.end() || it->second.empty()) return std::nullopt;
    return it->second.back();
  }
  std::vector<std::string> all(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }
};

struct Command;

/// What a handler is given: its command's row, the parsed arguments and the raw command line.
struct Invocation {
  const Command& command;
  Args args;
  int argc;
  char** argv;
};

struct Command {
  const char* name;
  const char* summary;  // one line in `dprun --help`
  const char* usage;
  const char* description;  // the paragraph under the usage in `dprun COMMAND --help`
  std::vector<Opt> options;
  const char* details;  // help text after the options; may be ""
  bool runs_trials;     // its help ends with the DPRUN_FAULT section
  int (*handler)(const Invocation&);
};

const Opt kHelp{"--help", nullptr, "show this help"};

Args parse_args(const Command& cmd, const std::vector<std::string>& argv) {
  Args args;
  bool options_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (options_done || a.size() < 2 || a[0] != '-') {
      args.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      options_done = true;
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    if (name == "-h") name = "--help";
    if (name == "-v") name = "--verbose";
    const Opt* opt = nullptr;
    for (const Opt& o : cmd.options)
      if (name == o.name) opt = &o;
    if (name == "--help") opt = &kHelp;
    if (!opt) {
      std::vector<std::string> names;
      for (const Opt& o : cmd.options) names.push_back(o.name);
      std::string hint = did_you_mean(name, names);
      throw UsageError("unknown option " + name + " for 'dprun " + cmd.name + "'" +
                       (hint.empty() ? "" : "; did you mean " + hint + "?") + " (see dprun " +
                       cmd.name + " --help)");
    }
    if (!opt->metavar) {
      if (has_value) throw UsageError(std::string(opt->name) + " takes no value");
      args.values[opt->name];
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argv.size())
        throw UsageError(std::string(opt->name) + " needs a value (" + opt->metavar + ")");
      value = argv[++i];
    }
    args.values[opt->name].push_back(value);
  }
  return args;
}

std::string help_text(const Command& cmd) {
  std::string out =
      std::string("usage: ") + cmd.usage + "\n\n" + cmd.description + "\n\noptions:\n";
  std::vector<std::pair<std::string, std::string>> lines;
  size_t w = 0;
  for (const Opt& o : cmd.options) {
    std::string left = std::string(o.name) + (o.metavar ? std::string(" ") + o.metavar : "");
    w = std::max(w, left.size());
    lines.emplace_back(left, o.help);
  }
  lines.emplace_back("--help", kHelp.help);
  for (const auto& [left, help] : lines)
    out += "  " + left + std::string(w + 2 - std::min(w, left.size()), ' ') + help + "\n";
  if (*cmd.details) out += std::string("\n") + cmd.details;
  if (cmd.runs_trials) out += std::string("\n") + fault_help();
  return out;
}

// ---- values -------------------------------------------------------------------------------------

int64_t int_option(const Args& a, const std::string& name, int64_t fallback, int64_t min) {
  auto v = a.last(name);
  if (!v) return fallback;
  int64_t x = 0;
  auto res = std::from_chars(v->data(), v->data() + v->size(), x);
  if (res.ec != std::errc() || res.ptr != v->data() + v->size() || x < min)
    throw UsageError(name + " " + *v + ": expected an integer >= " + std::to_string(min));
  return x;
}

double double_option(const Args& a, const std::string& name, double fallback, double min) {
  auto v = a.last(name);
  if (!v) return fallback;
  double x = 0;
  auto res = std::from_chars(v->data(), v->data() + v->size(), x);
  if (res.ec != std::errc() || res.ptr != v->data() + v->size() || !(x >= min))
    throw UsageError(name + " " + *v + ": expected a number >= " + std::to_string(min));
  return x;
}

std::string backend_option(const Args& a) {
  auto v = a.last("--backend");
  if (!v) return "";
  if (*v != "auto" && *v != "cpu" && *v != "cuda")
    throw UsageError("--backend " + *v + ": expected auto, cpu or cuda");
  return *v;
}

std::pair<std::string, std::string> key_value(const std::string& option, const std::string& text) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError(option + " " + text + ": expected KEY=VALUE");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

// ---- the handlers -------------------------------------------------------------------------------

SweepOptions sweep_options(const Invocation& in) {
  const Args& a = in.args;
  const char* name = in.command.name;
  if (a.positional.size() != 1)
    throw UsageError(std::string("dprun ") + name + " needs one experiment file" +
                     (a.positional.empty()
                          ? ""
                          : ", got " + std::to_string(a.positional.size()) + " arguments") +
                     " (see dprun " + name + " --help)");
  SweepOptions o;
  o.file = a.positional[0];
  o.db = a.last("--db").value_or("");
  o.backend = backend_option(a);
  o.dry_run = a.flag("--dry-run");
  o.rerun = a.flag("--rerun");
  o.force = a.flag("--force");
  o.oversubscribe = a.flag("--oversubscribe");
  o.verbose = a.flag("--verbose");
  for (const auto& f : a.all("--filter")) o.filters.push_back(key_value("--filter", f));
  o.plugin_dirs = a.all("--plugins");
  o.threads = static_cast<int>(int_option(a, "--threads", 0, 1));
  o.trial_timeout = double_option(a, "--trial-timeout", 0, 0);
  std::string line = "dprun";
  for (int i = 1; i < in.argc; ++i) line += " " + shell_quote(in.argv[i]);
  o.command_line = line;
  return o;
}

int run_command(const Invocation& in) { return run_sweep(sweep_options(in)); }

int plan_command(const Invocation& in) { return plan_sweep(sweep_options(in)); }

int plugins_command(const Invocation& in) {
  const Args& a = in.args;
  if (!a.positional.empty()) throw UsageError("dprun plugins takes no arguments");
  PluginScan scan = scan_plugins(a.all("--plugins"));
  for (const auto& [name, m] : scan.models) {
    const dp::ModelFactory& f = m.factory;
    std::printf("%s: %s\n", name.c_str(), f.description.c_str());
    std::printf("  file: %s\n  ABI version %u, built with dprun %s; input %dx%dx%d, %d classes\n",
                m.plugin_path.c_str(), m.abi_version, m.built_with.c_str(), f.input.channels,
                f.input.height, f.input.width, f.input.classes);
    if (f.options.empty()) {
      std::printf("  options: none\n");
    } else {
      std::vector<std::vector<std::string>> rows{{"option", "type", "default", "help"}};
      for (const auto& o : f.options)
        rows.push_back({o.name, dp::option_type_name(o.default_value),
                        dp::option_to_string(o.default_value), o.help});
      std::fputs(format_aligned(rows, "    ").c_str(), stdout);
    }
    std::printf("\n");
  }
  if (scan.models.empty()) std::printf("no models found\n");
  std::printf("searched:");
  for (const auto& d : scan.searched) std::printf(" %s", d.c_str());
  std::printf("%s\n", scan.searched.empty() ? " (no plugin folder exists)" : "");
  for (const auto& e : scan.errors) std::fprintf(stderr, "dprun: plugin error: %s\n", e.c_str());
  // Non-zero when something the user should fix was found (a plugin that did not load, a
  // --plugins path that does not exist) or no model at all.
  return scan.errors.empty() && !scan.models.empty() ? 0 : 1;
}

int query_command(const Invocation& in) {
  const Args& a = in.args;
  if (a.positional.size() != 1)
    throw UsageError(
        "dprun query needs one SQL statement in quotes, e.g. dprun query --db "
        "results/x.db \"SELECT * FROM trial_summary\"");
  QueryFormat format = QueryFormat::table;
  if (auto f = a.last("--format")) {
    if (*f == "table")
      format = QueryFormat::table;
    else if (*f == "csv")
      format = QueryFormat::csv;
    else if (*f == "json")
      format = QueryFormat::json;
    else
      throw UsageError("--format " + *f + ": expected table, csv or json");
  }
  const std::string db = a.last("--db") ? *a.last("--db") : default_database("query");
  if (!std::filesystem::exists(db)) throw UsageError(db + ": no such database");
  dps::Store store(db, dps::Store::Mode::read_only);
  std::fputs(format_query(store.query(a.positional[0]), format).c_str(), stdout);
  return 0;
}

int report_command(const Invocation& in) {
  const Args& a = in.args;
  if (!a.positional.empty()) throw UsageError("dprun report takes no arguments (use --db PATH)");
  const std::string db = a.last("--db") ? *a.last("--db") : default_database("report");
  if (!std::filesystem::exists(db)) throw UsageError(db + ": no such database");
  dps::Store store(db, dps::Store::Mode::read_only);
  std::fputs(format_report(store).c_str(), stdout);
  return 0;
}

// --option values take the type of the option's default, so "hidden=64" is an int.
dp::OptionValue option_value(const dp::ModelFactory& f, const std::string& key,
                             const std::string& text) {
  for (const auto& spec : f.options) {
    if (spec.name != key) continue;
    const auto bad = [&](const char* what) {
      return UsageError("--option " + key + "=" + text + ": expected " + what);
    };
    if (std::holds_alternative<bool>(spec.default_value)) {
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      throw bad("true or false");
    }
    if (std::holds_alternative<int64_t>(spec.default_value)) {
      int64_t x = 0;
      auto res = std::from_chars(text.data(), text.data() + text.size(), x);
      if (res.ec != std::errc() || res.ptr != text.data() + text.size()) throw bad("an integer");
      return x;
    }
    if (std::holds_alternative<double>(spec.default_value)) {
      double x = 0;
      auto res = std::from_chars(text.data(), text.data() + text.size(), x);
      if (res.ec != std::errc() || res.ptr != text.data() + text.size()) throw bad("a number");
      return x;
    }
    return text;
  }
  return text;  // undeclared: resolve_model_options names it and lists the known options
}

int train_command(const Invocation& in) {
  const Args& a = in.args;
  if (!a.positional.empty())
    throw UsageError("dprun train takes options only, got " + a.positional[0] +
                     " (to run an experiment file: dprun run FILE.toml)");
  auto model = a.last("--model");
  if (!model) throw UsageError("dprun train needs --model NAME (see dprun plugins)");
  TrialRequest r;
  r.plugin_dirs = a.all("--plugins");
  PluginScan scan = scan_plugins(r.plugin_dirs);
  auto found = scan.models.find(*model);
  if (found == scan.models.end()) {
    std::vector<std::string> names;
    std::string known;
    for (const auto& [n, m] : scan.models) {
      names.push_back(n);
      known += (known.empty() ? "" : ", ") + n;
    }
    std::string hint = did_you_mean(*model, names);
    for (const auto& e : scan.errors) std::fprintf(stderr, "dprun: plugin error: %s\n", e.c_str());
    throw UsageError("unknown model \"" + *model + "\"" +
                     (hint.empty() ? "" : "; did you mean " + hint + "?") +
                     " (models found: " + (known.empty() ? "none" : known) + ")");
  }
  dps::TrialSettings& s = r.settings;
  s.model = *model;
  s.gpus = int_option(a, "--gpus", 1, 1);
  s.batch_size = int_option(a, "--batch-size", 256, 1);
  s.per_gpu_batch = s.batch_size / s.gpus;
  s.lr = double_option(a, "--lr", 0.1, 0);
  s.epochs = int_option(a, "--epochs", 10, 1);
  s.seed = int_option(a, "--seed", 0, 0);
  s.momentum = double_option(a, "--momentum", 0, 0);
  s.weight_decay = double_option(a, "--weight-decay", 0, 0);
  s.eval_batch_size = int_option(a, "--eval-batch-size", 0, 0);
  s.layout = a.last("--layout").value_or("nchw");
  if (s.layout != "nchw" && s.layout != "nhwc")
    throw UsageError("--layout " + s.layout + ": expected nchw or nhwc");
  s.dataset = a.last("--dataset").value_or("fashion-mnist");
  const auto& known = dp::known_datasets();
  if (std::find(known.begin(), known.end(), s.dataset) == known.end())
    throw UsageError("--dataset " + s.dataset + ": expected fashion-mnist or mnist");
  s.train_limit = int_option(a, "--train-limit", 0, 0);
  s.test_limit = int_option(a, "--test-limit", 0, 0);
  if (s.batch_size < s.gpus)
    throw UsageError("--batch-size " + std::to_string(s.batch_size) + " is smaller than --gpus " +
                     std::to_string(s.gpus) + ": every replica needs at least one example");
  r.backend = backend_option(a);
  if (r.backend.empty()) r.backend = "auto";
  s.backend_request = r.backend;
  r.data_path = a.last("--data").value_or("");
  r.oversubscribe = a.flag("--oversubscribe");
  r.threads = static_cast<int>(int_option(a, "--threads", 0, 1));
  for (const auto& kv : a.all("--option")) {
    auto [key, text] = key_value("--option", kv);
    r.model_options[key] = option_value(found->second.factory, key, text);
  }
  // Unknown or mistyped options are command-line errors, found before any data is loaded.
  try {
    r.model_options = dp::resolve_model_options(found->second.factory, r.model_options);
  } catch (const dp::Error& e) {
    throw UsageError(e.what());
  }
  return run_train(r);
}

// ---- the table ----------------------------------------------------------------------------------

const Opt kDbOpt{"--db", "PATH",
                 "the database (default: [experiment].database, else results/NAME.db)"};
const Opt kBackendOpt{"--backend", "auto|cpu|cuda",
                      "run every trial on this backend (overrides the file)"};
const Opt kRerunOpt{"--rerun", nullptr, "run trials that are already done again"};
const Opt kFilterOpt{
    "--filter", "KEY=VALUE",
    "only run trials whose setting KEY (model, gpus, batch_size, lr, seed, option.NAME, ...) "
    "equals VALUE; repeatable (one key several times: any of the values)"};
const Opt kPluginsOpt{"--plugins", "DIR",
                      "also look for model plugins here (folder or file); repeatable"};
const Opt kForceOpt{"--force", nullptr, "allow a sweep of more than 1000 trials"};
const Opt kResultsDbOpt{"--db", "PATH", "the database (default: the only results/*.db here)"};

const Command kCommands[] = {
    {"run",
     "run an experiment file: train the trials not yet done, record every epoch",
     "dprun [run] FILE.toml [options]",
     "Runs an experiment: expands the sweep, skips trials the database already holds as done, and\n"
     "trains the others one after another, each in its own process. Every epoch is written to\n"
     "the database as it finishes; a failing trial never stops the sweep. Ctrl-C stops the\n"
     "running trial (recorded interrupted); running the same command again resumes the sweep.",
     {kDbOpt,
      kBackendOpt,
      {"--dry-run", nullptr, "print what would run and stop (the database is not changed)"},
      kRerunOpt,
      kFilterOpt,
      kPluginsOpt,
      kForceOpt,
      {"--oversubscribe", nullptr,
       "let CUDA replicas share GPUs when a trial wants more than the machine has"},
      {"--threads", "N", "CPU threads per trial (default: all)"},
      {"--trial-timeout", "SECONDS", "kill a trial that runs longer and record it failed"},
      {"--verbose", nullptr, "show the output of the trial processes"}},
     "",
     true,
     run_command},
    {"plan",
     "list the trials of an experiment and what a run would do with each",
     "dprun plan FILE.toml [options]",
     "Lists the trials of an experiment with a short config hash, their label and what a run "
     "would\ndo (run, skip: done, restart: interrupted, rerun: failed). Reads the database if it "
     "exists;\nnever creates or changes it.",
     {kDbOpt, kBackendOpt, kRerunOpt, kFilterOpt, kPluginsOpt, kForceOpt},
     "",
     false,
     plan_command},
    {"plugins",
     "list the models found, with their options",
     "dprun plugins [--plugins DIR]...",
     "Lists the model plugins found: model name, file, ABI version, description and options\n"
     "(name, type, default, help), and plugins that failed to load.",
     {kPluginsOpt},
     "Search path: --plugins, then $DPRUN_PLUGIN_PATH (':'-separated), then "
     "<dprun>/../lib/dprun/plugins,\nthen the build tree's plugin folder.\n",
     false,
     plugins_command},
    {"query",
     "run a read-only SQL statement on a results database",
     "dprun query [--db PATH] [--format table|csv|json] \"SQL\"",
     "Runs one read-only SQL statement on a results database and prints the rows. Tables:\n"
     "experiments, trials, epochs; views: trial_summary, scaling.",
     {{"--db", "PATH", "the database (default: the only results/*.db in this folder)"},
      {"--format", "table|csv|json", "output format (default: table)"}},
     "Example:\n  dprun query --db results/scaling.db \"SELECT model, gpus, batch_size, lr, "
     "final_test_acc,\n    mean_seconds_per_epoch FROM trial_summary\"\n",
     false,
     query_command},
    {"report",
     "summarise the experiments of a results database",
     "dprun report [--db PATH]",
     "Summarises every experiment in a database: settings, status, final and best test "
     "accuracy,\nseconds per epoch and speedup over the 1-GPU trial.",
     {kResultsDbOpt},
     "",
     false,
     report_command},
    {"train",
     "train one model in this process, without a database",
     "dprun train --model NAME [options]",
     "Trains one model in this process, without a database, printing one line per epoch\n"
     "(epoch, train loss, train accuracy, test accuracy, seconds, examples/s).",
     {{"--model", "NAME", "the model (see dprun plugins)"},
      {"--gpus", "K", "data-parallel replicas (default 1)"},
      {"--batch-size", "B", "global batch size (default 256)"},
      {"--lr", "X", "learning rate (default 0.1)"},
      {"--epochs", "N", "epochs (default 10)"},
      {"--seed", "S", "seed of initialisation and shuffling (default 0)"},
      {"--momentum", "M", "SGD momentum (default 0)"},
      {"--weight-decay", "W", "weight decay (default 0)"},
      {"--eval-batch-size", "B", "evaluation batch (default: the batch size)"},
      {"--layout", "nchw|nhwc", "activation layout (default nchw)"},
      {"--backend", "auto|cpu|cuda", "default auto: CUDA when a GPU is visible, else CPU"},
      {"--dataset", "D", "fashion-mnist (default) or mnist"},
      {"--data", "PATH", "folder with the dataset's IDX files"},
      {"--train-limit", "N", "train on the first N examples only"},
      {"--test-limit", "N", "evaluate on the first N examples only"},
      {"--threads", "N", "CPU threads (default: all)"},
      {"--oversubscribe", nullptr, "let replicas share GPUs"},
      {"--option", "KEY=VALUE", "a model option (see dprun plugins); repeatable"},
      {"--plugins", "DIR", "also look for model plugins here; repeatable"}},
     "",
     false,
     train_command},
};

const Command* find_command(const std::string& name) {
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

std::string main_help() {
  std::string out =
      "usage: dprun COMMAND [options]   (dprun FILE.toml is dprun run FILE.toml)\n\n"
      "dprun runs data-parallel training experiments declared in TOML files and records every\n"
      "epoch in SQLite.\n\ncommands:\n";
  size_t w = 0;
  for (const Command& c : kCommands) w = std::max(w, std::string(c.name).size());
  for (const Command& c : kCommands)
    out += "  " + std::string(c.name) + std::string(w + 3 - std::string(c.name).size(), ' ') +
           c.summary + "\n";
  out +=
      "\n  dprun COMMAND --help   options of a command\n"
      "  dprun --version        the version\n\n"
      "exit status: 0 every trial done or skipped, 1 a trial failed or diverged, 2 a bad command\n"
      "line or experiment file, 130/143 stopped by SIGINT/SIGTERM.\n\n";
  out += fault_help();
  return out;
}

int dispatch(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(main_help().c_str(), stderr);
    return 2;
  }
  const std::string first = args[0];
  if (first == "__trial") return trial_child_main({args.begin() + 1, args.end()});
  if (first == "--help" || first == "-h") {
    std::fputs(main_help().c_str(), stdout);
    return 0;
  }
  if (first == "--version" || first == "version") {
    std::printf("dprun %s\n", dp::version());
    return 0;
  }
  if (first == "help") {
    const Command* c = args.size() > 1 ? find_command(args[1]) : nullptr;
    std::fputs(c ? help_text(*c).c_str() : main_help().c_str(), stdout);
    return 0;
  }

  const Command* cmd = find_command(first);
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (!cmd) {
    // `dprun FILE.toml [options]` and `dprun --db x FILE.toml` are `dprun run ...`.
    std::error_code ec;
    const bool is_file = first.size() > 5 && first.substr(first.size() - 5) == ".toml";
    if (is_file || first[0] == '-' || std::filesystem::is_regular_file(first, ec)) {
      cmd = find_command("run");
      rest = args;
    } else {
      std::vector<std::string> names;
      for (const Command& c : kCommands) names.push_back(c.name);
      std::string hint = did_you_mean(first, names);
      throw UsageError("unknown command '" + first + "'" +
                       (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                       " (see dprun --help)");
    }
  }
  const Invocation in{*cmd, parse_args(*cmd, rest), argc, argv};
  if (in.args.flag("--help")) {
    std::fputs(help_text(*cmd).c_str(), stdout);
    return 0;
  }
  return cmd->handler(in);
}

}  // namespace

int main_cli(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dprun: %s\n", e.what());
    return 2;
  } catch (const ConfigErrors& e) {
    for (const auto& err : e.errors()) std::fprintf(stderr, "%s\n", err.what());
    return 2;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Files that cannot be read, databases that cannot be opened, plugin failures: all found
    // before a trial runs (failures during a sweep are handled there).
    std::fprintf(stderr, "dprun: %s\n", e.what());
    return 2;
  }
}

}  // namespace dprun
