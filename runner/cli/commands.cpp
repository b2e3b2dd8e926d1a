// What each command of the dprun command line does (the table itself is in cli.cpp).
#include "cli/commands.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <variant>

#include "base/os.hpp"
#include "base/suggest.hpp"
#include "base/text.hpp"
#include "base/usage_error.hpp"
#include "dp/error.hpp"
#include "dp/plugin.hpp"
#include "dp/process_group.hpp"
#include "dpstore/store.hpp"
#include "models/plugin_loader.hpp"
#include "report/report.hpp"
#include "settings/settings.hpp"
#include "slurm/merge.hpp"
#include "sweep/sweep_runner.hpp"
#include "trial/trial_main.hpp"

namespace dprun::cli {

namespace {

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

// The number of processes the launcher started, from its environment; 0 when it does not say.
int launcher_world_size() {
  for (const char* v :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) {
    if (const char* s = std::getenv(v); s && *s) return std::atoi(s);
  }
  return 0;
}

}  // namespace

SweepOptions sweep_options(const Invocation& in) {
  const Args& a = in.args;
  const std::string& name = in.command;
  if (a.positional.size() != 1)
    throw UsageError("dprun " + name + " needs one experiment file" +
                     (a.positional.empty()
                          ? ""
                          : ", got " + std::to_string(a.positional.size()) + " arguments") +
                     " (see dprun " + name + " --help)");
  SweepOptions o;
  o.file = a.positional[0];
  o.db = a.last("--db").value_or("");
  o.run.backend = backend_option(a);
  o.dry_run = a.flag("--dry-run");
  o.run.rerun = a.flag("--rerun");
  o.run.restart = a.flag("--restart");
  o.force = a.flag("--force");
  o.run.oversubscribe = a.flag("--oversubscribe");
  o.run.verbose = a.flag("--verbose");
  for (const auto& f : a.all("--filter")) o.filters.push_back(key_value("--filter", f));
  o.overrides = a.all("--set");
  o.run.plugin_dirs = a.all("--plugins");
  o.run.threads = static_cast<int>(int_option(a, "--threads", 0, 1));
  o.run.trial_timeout = double_option(a, "--trial-timeout", 0, 0);
  if (auto jobs = a.last("--jobs")) {
    int64_t n = 0;
    auto res = std::from_chars(jobs->data(), jobs->data() + jobs->size(), n);
    if (*jobs == "auto")
      o.jobs = 0;  // as many as the devices allow
    else if (res.ec == std::errc() && res.ptr == jobs->data() + jobs->size() && n >= 1 && n <= 4096)
      o.jobs = static_cast<int>(n);
    else
      throw UsageError("--jobs " + *jobs + ": expected a positive integer or auto");
  }
  if (auto launcher = a.last("--launcher")) {
    const auto& known = known_launchers();
    if (std::find(known.begin(), known.end(), *launcher) == known.end())
      throw UsageError("--launcher " + *launcher + ": expected mpirun or srun");
    o.run.launch.launcher = *launcher;
  }
  if (auto hostfile = a.last("--hostfile")) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*hostfile, ec))
      throw UsageError("--hostfile " + *hostfile + ": no such file");
    if (o.run.launch.launcher == "srun")
      throw UsageError("--hostfile is for mpirun; srun runs on the nodes of its Slurm allocation");
    o.run.launch.hostfile = *hostfile;
  }
  o.run.launch.args = a.all("--launch-arg");
  std::string line = "dprun";
  for (int i = 1; i < in.argc; ++i) line.append(" ").append(shell_quote(in.argv[i]));
  o.command_line = line;
  return o;
}

// ---- the handlers -------------------------------------------------------------------------------

int run_command(const Invocation& in) {
  // The runner starts each trial's processes itself; started as several processes, each would
  // run the whole sweep.
  if (dp::under_mpi_launcher() && launcher_world_size() > 1)
    throw UsageError(
        "dprun run was started as " + std::to_string(launcher_world_size()) +
        " processes by mpirun or srun: start it once, as one process (it launches the processes "
        "of trials with processes > 1 itself, inside a Slurm allocation with srun); to run one "
        "trial as the processes of your own launcher, use mpirun -np N dprun train ...");
  const SweepOptions options = sweep_options(in);
  if (options.dry_run) return plan_sweep(options);
  const Experiment experiment = load_sweep(options);
  // Trials submitted to Slurm: what their tasks finished is collected first; those still queued
  // or running there are not run here as well.
  return run_experiment(experiment, options, collect_before_run(experiment, options));
}

int plan_command(const Invocation& in) { return plan_sweep(sweep_options(in)); }

namespace {

void print_options(const std::vector<dp::OptionSpec>& options) {
  if (options.empty()) {
    std::printf("  options: none\n");
    return;
  }
  std::vector<std::vector<std::string>> rows{{"option", "type", "default", "help"}};
  for (const auto& o : options)
    rows.push_back({o.name, dp::option_type_name(o.default_value),
                    dp::option_to_string(o.default_value), o.help});
  std::fputs(format_aligned(rows, "    ").c_str(), stdout);
}

// The datasets: built in first, then those of plugins, each with what it yields and how it is
// chosen ([data] dataset = NAME, its options in [data.NAME]).
void print_datasets(const PluginScan& scan) {
  std::printf("datasets ([data] dataset = \"NAME\", options in [data.NAME]):\n\n");
  for (const bool builtin : {true, false}) {
    for (const auto& [name, d] : scan.datasets) {
      if (d.plugin_path.empty() != builtin) continue;
      const dp::DatasetFactory& f = d.factory;
      std::printf("%s: %s\n", name.c_str(), f.description.c_str());
      if (builtin)
        std::printf("  built in\n");
      else
        std::printf("  file: %s\n  ABI version %u, built with dprun %s\n", d.plugin_path.c_str(),
                    d.abi_version, d.built_with.c_str());
      std::printf("  yields %s\n", dp::shape_text(f.shape).c_str());
      print_options(f.options);
      std::printf("\n");
    }
  }
}

}  // namespace

int plugins_command(const Invocation& in) {
  const Args& a = in.args;
  if (!a.positional.empty()) throw UsageError("dprun plugins takes no arguments");
  PluginScan scan = scan_plugins(a.all("--plugins"));
  if (!scan.models.empty()) std::printf("models ([train] model = \"NAME\", options in [model.NAME]):\n\n");
  for (const auto& [name, m] : scan.models) {
    const dp::ModelFactory& f = m.factory;
    std::printf("%s: %s\n", name.c_str(), f.description.c_str());
    // Every model is built for the data's shape (trial_main.cpp): the input it was designed
    // for is a description, not a requirement.
    std::printf(
        "  file: %s\n  ABI version %u, built with dprun %s; designed for input %dx%dx%d, %d "
        "classes; built for the shape and classes of the data it trains on\n",
        m.plugin_path.c_str(), m.abi_version, m.built_with.c_str(), f.input.channels,
        f.input.height, f.input.width, f.input.classes);
    print_options(f.options);
    std::printf("\n");
  }
  if (scan.models.empty()) std::printf("no models found\n\n");
  print_datasets(scan);
  std::printf("searched:");
  for (const auto& d : scan.searched) std::printf(" %s", d.c_str());
  std::printf("%s\n", scan.searched.empty() ? " (no plugin folder exists)" : "");
  for (const auto& e : scan.errors) std::fprintf(stderr, "dprun: plugin error: %s\n", e.c_str());
  for (const auto& s : scan.skipped) std::fprintf(stderr, "dprun: note: %s\n", s.c_str());
  // Non-zero when something the user should fix was found (a plugin that did not load, a
  // --plugins path that does not exist) or no model at all.
  return scan.errors.empty() && !scan.models.empty() ? 0 : 1;
}

namespace {

// --option values take the type of the option's default, so "hidden=64" is an int.
dp::OptionValue option_value(const std::vector<dp::OptionSpec>& options, const std::string& key,
                             const std::string& text, const char* flag = "--option") {
  for (const auto& spec : options) {
    if (spec.name != key) continue;
    const auto bad = [&](const char* what) {
      return UsageError(std::string(flag) + " " + key + "=" + text + ": expected " + what);
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
  return text;  // undeclared: resolve_*_options names it and lists the known options
}

// `dprun train` takes every experiment-file key as an option: lr_scaling as --lr-scaling.
std::string train_option_name(const Setting& setting) {
  std::string name = "--" + (setting.key.empty() ? setting.column : setting.key);
  std::replace(name.begin(), name.end(), '_', '-');
  std::replace(name.begin(), name.end(), '.', '-');  // stop.patience: --stop-patience
  return name;
}

std::string train_option_metavar(const Setting& setting) {
  switch (setting.type) {
    case SettingType::boolean:
      return "true|false";
    case SettingType::boolean_auto:
      return "true|false|auto";
    case SettingType::integer:
      return "N";
    case SettingType::number:
      return "X";
    case SettingType::numbers:
      return "X,...";
    case SettingType::choice: {
      std::string m;
      for (const auto& c : setting.choices) m += (m.empty() ? "" : "|") + c;
      return m;
    }
    case SettingType::model:
    case SettingType::dataset:
      return "NAME";
    default:
      return "TEXT";
  }
}

// The settings `dprun train` takes: the experiment-file keys, and the dataset of [data]; not
// retries, which the runner acts on (a failed `dprun train` is the user's to run again).
std::vector<const Setting*> train_settings() {
  std::vector<const Setting*> out;
  for (const Setting& s : builtin_settings().rows())
    if ((!s.key.empty() && s.key != "retries") || s.column == "dataset") out.push_back(&s);
  return out;
}

}  // namespace

std::vector<Opt> train_options() {
  std::vector<Opt> options;
  for (const Setting* s : train_settings()) {
    const std::string def =
        s->default_doc.empty() ? setting_text(s->default_value) : s->default_doc;
    // "(required)" stands for itself; a value is "the default".
    const std::string note = def.empty()     ? ""
                             : def[0] == '(' ? " " + def
                                             : " (default " + def + ")";
    options.push_back({train_option_name(*s), train_option_metavar(*s), s->help + note});
  }
  const Opt rest[] = {{"--data", "PATH", "folder with the dataset's files (or a folder above it)"},
                      {"--threads", "N", "CPU threads (default: all)"},
                      {"--oversubscribe", "", "let replicas share GPUs"},
                      {"--option", "KEY=VALUE", "a model option (see dprun plugins); repeatable"},
                      {"--data-option", "KEY=VALUE",
                       "an option of the dataset, as in [data.NAME] (see dprun plugins); "
                       "repeatable"},
                      {"--checkpoint-dir", "DIR",
                       "write the checkpoints --checkpoint keeps here (default: none written)"},
                      {"--plugins", "DIR",
                       "also look for plugins (models, datasets) here; repeatable"}};
  options.insert(options.end(), std::begin(rest), std::end(rest));
  return options;
}

namespace {

// The model of --model, from the plugins found; a UsageError naming the models found otherwise.
const LoadedModel& train_model(const PluginScan& scan, const std::string& model) {
  auto found = scan.models.find(model);
  if (found != scan.models.end()) return found->second;
  std::vector<std::string> names;
  std::string known;
  for (const auto& [n, m] : scan.models) {
    names.push_back(n);
    known += (known.empty() ? "" : ", ") + n;
  }
  std::string hint = did_you_mean(model, names);
  for (const auto& e : scan.errors) std::fprintf(stderr, "dprun: plugin error: %s\n", e.c_str());
  for (const auto& s : scan.skipped) std::fprintf(stderr, "dprun: note: %s\n", s.c_str());
  throw UsageError("unknown model \"" + model + "\"" +
                   (hint.empty() ? "" : "; did you mean " + hint + "?") +
                   " (models found: " + (known.empty() ? "none" : known) + ")");
}

// The settings an experiment file with these [train] keys (and [data] dataset) would give the
// trial; a UsageError for a value a setting refuses.
TrialSettings train_trial_settings(const Args& a) {
  std::map<std::string, SettingValue> given;
  std::string dataset = "fashion-mnist";
  for (const Setting* s : train_settings()) {
    auto text = a.last(train_option_name(*s));
    if (!text) continue;
    SettingValue value;
    try {
      value = setting_from_text(*s, *text);
    } catch (const std::invalid_argument& e) {
      throw UsageError(train_option_name(*s) + " " + *text + ": " + e.what());
    }
    if (s->key.empty())
      dataset = std::get<std::string>(value);
    else
      given[s->key] = value;
  }
  TrialSettings s = settings_from_keys(builtin_settings(), given);
  s.set("dataset", dataset);
  const int64_t gpus = s[key::gpus], batch_size = s[key::batch_size];
  if (batch_size < gpus)
    throw UsageError("--batch-size " + std::to_string(batch_size) + " is smaller than --gpus " +
                     std::to_string(gpus) + ": every replica needs at least one example");
  return s;
}

// The dataset of --dataset, from the built-in ones and the plugins' found; a UsageError naming
// those known otherwise.
const LoadedDataset& train_dataset(const PluginScan& scan, const std::string& dataset) {
  auto found = scan.datasets.find(dataset);
  if (found != scan.datasets.end()) return found->second;
  std::vector<std::string> names;
  for (const auto& [n, d] : scan.datasets) names.push_back(n);
  const std::string hint = did_you_mean(dataset, names);
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  for (const auto& e : scan.errors) std::fprintf(stderr, "dprun: plugin error: %s\n", e.c_str());
  throw UsageError("--dataset " + dataset + ": unknown dataset" +
                   (hint.empty() ? "" : "; did you mean " + hint + "?") + " (known datasets: " +
                   known + ")");
}

// The data_options setting from --data-option KEY=VALUE: the dataset's options resolved (its
// defaults filled in), as the canonical JSON an experiment file's [data.NAME] would give.
std::string train_data_options(const Args& a, const PluginScan& scan, const std::string& dataset) {
  const dp::DatasetFactory& f = train_dataset(scan, dataset).factory;
  dp::DatasetOptions given;
  for (const auto& kv : a.all("--data-option")) {
    auto [key, text] = key_value("--data-option", kv);
    given[key] = option_value(f.options, key, text, "--data-option");
  }
  try {
    return model_options_to_json(dp::resolve_dataset_options(f, given)).dump();
  } catch (const dp::Error& e) {
    throw UsageError(e.what());
  }
}

// Without a database there is no folder of its own: checkpoints go where the user says.
std::string train_checkpoint_dir(const Args& a, const TrialSettings& s) {
  if (auto dir = a.last("--checkpoint-dir")) {
    if (s[key::checkpoint] == "none")
      throw UsageError("--checkpoint-dir " + *dir +
                       " with --checkpoint none: nothing would be written there");
    return std::filesystem::absolute(*dir).lexically_normal().string();
  }
  if (a.last("--checkpoint") && s[key::checkpoint] != "none")
    throw UsageError("--checkpoint " + *a.last("--checkpoint") +
                     ": dprun train writes checkpoints only with --checkpoint-dir DIR");
  return "";
}

// `dprun train --processes N` needs a launcher that started N processes of it.
void check_train_processes(const Args& a, const TrialSettings& s, bool under_launcher) {
  const int64_t processes = s[key::processes];
  if (processes > 1 && !under_launcher)
    throw UsageError(
        "--processes " + std::to_string(processes) + ": start " + std::to_string(processes) +
        " processes of dprun train with a launcher, e.g. mpirun -np " + std::to_string(processes) +
        " dprun train ... (or srun --ntasks=" + std::to_string(processes) +
        " inside a Slurm allocation)" +
        (dp::mpi_compiled() ? ""
                            : "; this dprun was built without MPI: install "
                              "Open MPI (Debian: libopenmpi-dev openmpi-bin) "
                              "and rebuild"));
  if (!under_launcher) return;
  const int world = launcher_world_size();
  // The launcher's process count decides; a different --processes is a mistake.
  if (a.last("--processes") && world > 0 && world != processes)
    throw UsageError("--processes " + std::to_string(processes) + " but the launcher started " +
                     std::to_string(world) + " processes");
  if (s[key::gpus] % std::max(1, world) != 0)
    throw UsageError("--gpus " + std::to_string(s[key::gpus]) + " is not divisible by the " +
                     std::to_string(world) +
                     " processes the launcher started: each process runs gpus / processes "
                     "replicas");
}

}  // namespace

int train_command(const Invocation& in) {
  const Args& a = in.args;
  if (!a.positional.empty())
    throw UsageError("dprun train takes options only, got " + a.positional[0] +
                     " (to run an experiment file: dprun run FILE.toml)");
  auto model = a.last("--model");
  if (!model) throw UsageError("dprun train needs --model NAME (see dprun plugins)");
  TrialRequest r;
  r.run.plugin_dirs = a.all("--plugins");
  const PluginScan scan = scan_plugins(r.run.plugin_dirs);
  const LoadedModel& found = train_model(scan, *model);
  r.settings = train_trial_settings(a);
  r.run.backend = r.settings[key::backend_request];
  r.data_path = a.last("--data").value_or("");
  // Under mpirun or srun, this process is one of the trial's processes; without a launcher,
  // the trial is this process.
  const bool under_launcher = dp::under_mpi_launcher() && dp::mpi_compiled();
  check_train_processes(a, r.settings, under_launcher);
  r.run.oversubscribe = a.flag("--oversubscribe");
  r.run.threads = static_cast<int>(int_option(a, "--threads", 0, 1));
  r.checkpoint_dir = train_checkpoint_dir(a, r.settings);
  for (const auto& kv : a.all("--option")) {
    auto [key, text] = key_value("--option", kv);
    r.model_options[key] = option_value(found.factory.options, key, text);
  }
  // Unknown or mistyped options are command-line errors, found before any data is loaded.
  try {
    r.model_options = dp::resolve_model_options(found.factory, r.model_options);
  } catch (const dp::Error& e) {
    throw UsageError(e.what());
  }
  r.settings.set("data_options", train_data_options(a, scan, r.settings[key::dataset]));
  return under_launcher ? run_train_processes(r) : run_train(r);
}

int settings_command(const Invocation& in) {
  if (!in.args.positional.empty()) throw UsageError("dprun settings takes no arguments");
  std::fputs(settings_markdown(builtin_settings()).c_str(), stdout);
  return 0;
}

}  // namespace dprun::cli
