// The dprun command line. Every command is one row of commands() (name, summary, usage, options,
// handler), as ninja's kTools[]: the main help, `dprun COMMAND --help`, option parsing and
// dispatch all read that table, so they cannot drift apart.
#include "cli/cli.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/suggest.hpp"
#include "base/usage_error.hpp"
#include "cli/commands.hpp"
#include "dp/backend.hpp"
#include "dp/conv_contract.hpp"
#include "dp/version.hpp"
#include "experiment/experiment.hpp"
#include "slurm/slurm_task.hpp"
#include "sweep/scheduler.hpp"
#include "trial/trial_main.hpp"

namespace dprun {

namespace {

using cli::Args;
using cli::Invocation;
using cli::Opt;
using namespace cli;  // the handlers

// ---- options and their parser -------------------------------------------------------------------

struct Command {
  const char* name;
  const char* summary;  // one line in `dprun --help`
  const char* usage;
  const char* description;  // the paragraph under the usage in `dprun COMMAND --help`
  std::vector<Opt> options;
  const char* details;  // help text after the options; may be ""
  bool runs_trials;     // its help ends with a pointer to `dprun help faults`
  int (*handler)(const Invocation&);
};

const Opt kHelp{"--help", "", "show this help"};

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
    if (opt->metavar == kRestMetavar) {
      // Everything after it belongs to another program (submit --slurm: sbatch's options).
      auto& rest = args.values[opt->name];
      if (has_value) rest.push_back(value);
      rest.insert(rest.end(), argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
      break;
    }
    if (opt->metavar.empty()) {
      if (has_value) throw UsageError(opt->name + " takes no value");
      args.values[opt->name];
      continue;
    }
    if (opt->metavar.front() == '[' && !has_value) {
      // An optional value (status --watch [SECONDS]): the next word only when it is a number,
      // so that `--watch exp.toml` leaves the file positional.
      auto& values = args.values[opt->name];
      char* end = nullptr;
      if (i + 1 < argv.size() && !argv[i + 1].empty() &&
          (std::strtod(argv[i + 1].c_str(), &end), *end == '\0'))
        values.push_back(argv[++i]);
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argv.size())
        throw UsageError(opt->name + " needs a value (" + opt->metavar + ")");
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
    std::string left = o.name + (o.metavar.empty() ? "" : " " + o.metavar);
    w = std::max(w, left.size());
    lines.emplace_back(left, o.help);
  }
  lines.emplace_back("--help", kHelp.help);
  for (const auto& [left, help] : lines)
    out += "  " + left + std::string(w + 2 - std::min(w, left.size()), ' ') + help + "\n";
  if (*cmd.details) out += std::string("\n") + cmd.details;
  if (cmd.runs_trials)
    out += "\ntesting: DPRUN_FAULT makes trial processes fail on purpose; see dprun help faults\n";
  return out;
}

// ---- the table ----------------------------------------------------------------------------------

const Opt kDbOpt{"--db", "PATH",
                 "the database (default: [experiment].database, else results/NAME.db)"};
const Opt kBackendOpt{"--backend", "auto|cpu|cuda",
                      "run every trial on this backend (overrides the file)"};
const Opt kRerunOpt{"--rerun", "", "run trials that are already done again"};
const Opt kRestartOpt{"--restart", "",
                      "start failed and interrupted trials at epoch 1, not at their last "
                      "checkpoint"};
const Opt kFilterOpt{
    "--filter", "KEY=VALUE",
    "only run trials whose setting KEY (model, gpus, batch_size, lr, seed, option.NAME, ...) "
    "equals VALUE, or with tag=NAME those given the tag (dprun tag); repeatable (one key several "
    "times: any of the values)"};
const Opt kSetOpt{"--set", "KEY=VALUE",
                  "replace a value of the file: train.epochs=2, model.lenet.hidden=64, "
                  "sweep.lr=[0.1,0.2] (TOML; a bare word is a string); checked as the file's "
                  "values, part of the trials' settings like them; repeatable"};
const Opt kPluginsOpt{"--plugins", "DIR",
                      "also look for plugins (models, datasets) here (folder or file); "
                      "repeatable"};
const Opt kForceOpt{"--force", "", "allow a sweep of more than 1000 trials"};
const Opt kResultsDbOpt{"--db", "PATH", "the database (default: the only results/*.db here)"};

// A function-local table: the train row's options are built from the settings table.
// long function: the command table, one row per command (ninja's kTools[]), so help and
// dispatch cannot drift apart; splitting it would split the table.
const std::vector<Command>& commands() {
  // `dprun train --help` ends with the GPU's precision contract (dp/conv_contract.hpp).
  static const std::string train_details =
      dp::conv_contract_text() +
      "--conv-choice picks among what the contract allows: measured (timed once per shape and\n"
      "kept in the choice cache) or heuristic (no timing; the same choice on every machine of\n"
      "one kind).\n";
  static const std::vector<Command> table = {
      {"run",
       "run an experiment file: train the trials not yet done, record every epoch",
       "dprun [run] FILE.toml [options]",
       "Runs an experiment: expands the sweep, skips trials the database already holds as done, "
       "and\n"
       "trains the others one after another (several at once with --jobs), each in its own\n"
       "process (a trial with processes > 1: its processes, started with mpirun or srun). Every\n"
       "epoch is written to the database as it finishes; a failing trial never stops the sweep.\n"
       "Ctrl-C stops the running trials (recorded interrupted); running the same command again\n"
       "resumes the sweep, and a failed or interrupted trial continues after the last epoch it\n"
       "kept a checkpoint of (see the checkpoint setting; --restart starts it again).",
       {kDbOpt,
        kBackendOpt,
        {"--dry-run", "", "print what would run and stop (the database is not changed)"},
        kRerunOpt,
        kRestartOpt,
        kFilterOpt,
        kSetOpt,
        kPluginsOpt,
        kForceOpt,
        {"--oversubscribe", "",
         "let CUDA replicas share GPUs when a trial wants more than the machine has"},
        {"--threads", "N", "CPU threads per trial (default: all; with --jobs, its cores)"},
        {"--jobs", "N|auto",
         "run up to N trials at once, each on its own GPUs or CPU cores (largest first, smaller "
         "ones filling what is left); auto: as many as the devices allow (default: 1)"},
        {"--launcher", "mpirun|srun",
         "start trials of several processes with this (default: [launch].launcher, else srun "
         "inside a Slurm allocation, else mpirun)"},
        {"--hostfile", "PATH", "mpirun's hostfile for trials of several processes"},
        {"--launch-arg", "ARG", "one more launcher argument (after [launch].args); repeatable"},
        {"--trial-timeout", "SECONDS", "kill a trial that runs longer and record it failed"},
        {"--verbose", "", "show the output of the trial processes"}},
       "",
       true,
       run_command},
      {"plan",
       "list the trials of an experiment and what a run would do with each",
       "dprun plan FILE.toml [options]",
       "Lists the trials of an experiment with a short config hash, their label and what a run "
       "would\ndo (run, skip: done, restart: interrupted, rerun: failed, resume after epoch 3: "
       "failed).\nReads the database if it exists; never creates or changes it.",
       {kDbOpt, kBackendOpt, kRerunOpt, kRestartOpt, kFilterOpt, kSetOpt, kPluginsOpt,
        kForceOpt},
       "",
       false,
       plan_command},
      {"plugins",
       "list the models and datasets found, with their options",
       "dprun plugins [--plugins DIR]...",
       "Lists the models found: name, file, ABI version, description and options (name, type,\n"
       "default, help); then the datasets, built in and from plugins: name, description, the\n"
       "shape and classes they yield, and options; and plugins that failed to load.",
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
       "dprun report [--db PATH] [--html FILE [--metric NAME] [--refresh SECONDS]]",
       "Summarises every experiment in a database: settings, status, final and best test "
       "accuracy,\nseconds per epoch and speedup over the 1-GPU trial. --html writes one "
       "self-contained page\ninstead (learning curves, scaling charts, hyperparameter views: "
       "parallel coordinates with\nbrushing, the metric against each swept setting, the best "
       "trials; the trials with their\nthroughput; no network needed, prints well).",
       {kResultsDbOpt,
        {"--html", "FILE", "write an HTML report to FILE (- for stdout)"},
        {"--metric", "NAME",
         "what the HTML report's hyperparameter views rank and colour trials by: best_ or final_ "
         "of val_acc, test_acc, train_acc, val_loss, test_loss, train_loss (default: best_val_acc "
         "with a validation split, else best_test_acc)"},
        {"--refresh", "SECONDS",
         "with --html FILE: rewrite FILE every SECONDS while a sweep of the database runs (the "
         "page reloads itself as often), then once more and stop"}},
       "",
       false,
       report_command},
      {"export",
       "copy a trial's model checkpoint out of the results",
       "dprun export [--db PATH] TRIAL_ID [--best | --epoch N] [--output FILE]",
       "Writes the model a trial kept (by default its last epoch's) to FILE, after checking the\n"
       "file's sha256 against the database. The file is PyTorch's state_dict as safetensors:\n"
       "  model.load_state_dict(safetensors.torch.load_file(FILE))\n"
       "loads it into the PyTorch module of the same architecture (names, shapes and NCHW\n"
       "order as torch.nn has them, batch norm's running statistics and counts included).",
       {kResultsDbOpt,
        {"--best", "",
         "the model of the epoch with the best test accuracy (checkpoint = \"best\")"},
        {"--epoch", "N", "the model of epoch N (checkpoint = \"every\", or the last or best one)"},
        {"--output", "FILE", "where to write it (default: trial-ID-epoch-N.safetensors here)"}},
       "Trial ids: dprun query \"SELECT trial_id, model, gpus, status, final_test_acc FROM "
       "trial_summary\"\n",
       false,
       export_command},
      {"tag",
       "tag trials of a results database (or take a tag off)",
       "dprun tag [--db PATH] [--remove] TRIAL_ID... NAME",
       "Gives the trials the tag NAME (1 to 64 of A-Z a-z 0-9 _ . -), or takes it off with\n"
       "--remove. dprun report shows the tags, trial_summary lists them (column tags), and\n"
       "--filter tag=NAME runs, plans or submits only the trials that have the tag. Every id must\n"
       "exist: an unknown one changes nothing.",
       {kResultsDbOpt, {"--remove", "", "take the tag off the trials instead"}},
       "Trial ids: dprun query \"SELECT trial_id, model, gpus, status, tags FROM trial_summary\"\n",
       false,
       tag_command},
      {"note",
       "write a note on a trial of a results database",
       "dprun note [--db PATH] TRIAL_ID [--] \"TEXT\"",
       "Sets the trial's note to TEXT (\"\" clears it). dprun report lists the notes under its\n"
       "table; trial_summary has them in its column note.",
       {kResultsDbOpt},
       "",
       false,
       note_command},
      {"forget",
       "delete trials from a results database, with their checkpoint files",
       "dprun forget [--db PATH] [--yes] TRIAL_ID...",
       "Deletes the trials with their epochs, attempts, tags, notes and checkpoints, and their\n"
       "checkpoint files, after listing them and asking. The next dprun run of their experiment\n"
       "runs them again from scratch. A trial running under a live dprun, or held by a Slurm task\n"
       "not collected yet, is refused.",
       {kResultsDbOpt, {"--yes", "", "do not ask (needed when standard input is not a terminal)"}},
       "Exit status: 0 forgotten, 1 answered no (nothing changed) or a file could not be removed\n"
       "(the trials are forgotten; the message names it), 2 a bad id or a refused trial (nothing\n"
       "changed).\n",
       false,
       forget_command},
      {"submit",
       "run an experiment file on a Slurm cluster: one job array, a task per trial",
       "dprun submit FILE.toml [options] [--slurm [sbatch options]]",
       "Submits the trials a run would run (new, failed, interrupted, ... see dprun plan) to\n"
       "Slurm as one job array per resource shape, each task running one trial into its own\n"
       "database in <database>.tasks/sNNNN/ (SQLite is never shared across hosts). dprun status\n"
       "follows the array; dprun merge (and status, report, run) folds what the tasks wrote into\n"
       "the experiment's database. Submitting the same file again submits only the trials not\n"
       "done, and failed or interrupted ones resume from their last checkpoint.",
       {kDbOpt,
        kBackendOpt,
        {"--dry-run", "", "print the plan and the sbatch commands, submit nothing"},
        kRerunOpt,
        kRestartOpt,
        kFilterOpt,
        kSetOpt,
        kPluginsOpt,
        kForceOpt,
        {"--max-parallel", "N",
         "at most N tasks of the array at once (sbatch --array=...%N; default: "
         "[launch.slurm].max_parallel, else no cap)"},
        {"--threads", "N", "CPU threads per trial (default: the CPUs Slurm gives the task)"},
        {"--oversubscribe", "",
         "let CUDA replicas share GPUs when a trial wants more than the task has"},
        {"--launcher", "mpirun|srun",
         "start trials of several processes with this (default: srun, inside the task's "
         "allocation)"},
        {"--launch-arg", "ARG", "one more launcher argument (after [launch].args); repeatable"},
        {"--trial-timeout", "SECONDS", "kill a trial that runs longer and record it failed"},
        {"--verbose", "", "show the output of the trial processes in the tasks' output"},
        {"--slurm", kRestMetavar,
         "submit to Slurm; every argument after it is passed to sbatch (after [launch.slurm])"}},
       "Each task asks for --ntasks=processes, --gpus-per-task=gpus/processes (on the CPU backend\n"
       "--cpus-per-task=gpus/processes instead), and what [launch.slurm] gives: partition, time,\n"
       "account, qos, mem, cpus_per_task, max_parallel, gpus_as (\"gres\": --gres=gpu:N per "
       "node),\n"
       "args. A task stopped by Slurm (scancel, time limit, preemption, node failure) is recorded\n"
       "interrupted with that cause.\n"
       "Exit status 2: nothing was submitted (a bad option or file, or sbatch refused the "
       "array).\n",
       false,
       submit_command},
      {"status",
       "where a sweep stands while it runs, local or on Slurm (--watch: live)",
       "dprun status [FILE.toml] [--db PATH] [--watch [SECONDS]] [--all]",
       "Counts the trials by state (done, running, queued, failed, interrupted, lost, not run,\n"
       "...), says how many epochs are done and the ETA of the sweep, and lists the trials, one\n"
       "line each: state, epoch k/n, the last epoch's train loss, test and validation accuracy,\n"
       "seconds per epoch, ETA, devices and why it stopped. A local sweep's database is only\n"
       "read. For Slurm it first collects the tasks that have ended (dprun merge), and reads\n"
       "the running tasks' own databases (read only) for their epochs so far.",
       {kDbOpt, kPluginsOpt,
        {"--watch", "[SECONDS]",
         "refresh every SECONDS (default 2) until nothing runs or is queued, or Ctrl-C"},
        {"--all", "", "list every trial (default: at most 30, the running ones first)"}},
       "ETA: a trial's remaining epochs x its mean seconds per epoch (epoch 1 left out when it\n"
       "has more), else the mean of the trials of its shape (model, gpus, batch size, ...) that\n"
       "timed an epoch; the sweep's is their sum over as many trials at a time as run now, and\n"
       "unknown while a trial left has no timing. A `stale` trial is recorded running but its\n"
       "dprun on this host is gone. --watch redraws in place on a terminal; elsewhere (a pipe,\n"
       "a file) it prints a snapshot per refresh, separated by a blank line.\n",
       false,
       status_command},
      {"merge",
       "fold what Slurm tasks wrote into the experiment's database",
       "dprun merge [FILE.toml] [--db PATH]",
       "Folds the database of every Slurm task that has ended into the experiment's database:\n"
       "its trial's epochs, checkpoints and status. A task still queued or running, or whose\n"
       "database cannot be read yet, is left for a later merge; merging again changes nothing.\n"
       "dprun status, report, run and submit merge on their own.",
       {kDbOpt, kPluginsOpt},
       "",
       false,
       merge_command},
      {"train", "train one model in this process, without a database",
       "dprun train --model NAME [options]",
       "Trains one model in this process, without a database, printing one line per epoch\n"
       "(epoch, train loss, train accuracy, test accuracy, seconds, examples/s). Every key of an\n"
       "experiment file's [train] table is an option (lr_scaling is --lr-scaling).",
       train_options(), train_details.c_str(), false, train_command},
      {"settings",
       "list the settings an experiment file can give its trials",
       "dprun settings",
       "Prints the table of the keys of [train] and [sweep]: type, default and meaning (the\n"
       "README's table, in Markdown).",
       {},
       "",
       false,
       settings_command},
  };
  return table;
}

const Command* find_command(const std::string& name) {
  for (const Command& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

std::string main_help() {
  std::string out =
      "usage: dprun COMMAND [options]   (dprun FILE.toml is dprun run FILE.toml)\n\n"
      "dprun runs data-parallel training experiments declared in TOML files and records every\n"
      "epoch in SQLite.\n\ncommands:\n";
  size_t w = 0;
  for (const Command& c : commands()) w = std::max(w, std::string(c.name).size());
  for (const Command& c : commands())
    out += "  " + std::string(c.name) + std::string(w + 3 - std::string(c.name).size(), ' ') +
           c.summary + "\n";
  out +=
      "\n  dprun COMMAND --help   options of a command\n"
      "  dprun help faults      failures on purpose, for testing (DPRUN_FAULT)\n"
      "  dprun --version        the version\n\n"
      "exit status: 0 every trial done, skipped, stopped by its rule or pruned by [search], 1 a\n"
      "trial failed (its retries spent) or diverged, 2 a bad command line or experiment file,\n"
      "130/143 stopped by SIGINT/SIGTERM.\n";
  return out;
}

// `dprun help [TOPIC]`: the main help, a command's, or the testing topic (faults).
int help_command(const std::vector<std::string>& args) {
  if (args.size() < 2) {
    std::fputs(main_help().c_str(), stdout);
    return 0;
  }
  if (args[1] == "faults") {
    std::fputs(fault_help(), stdout);
    return 0;
  }
  const Command* c = find_command(args[1]);
  if (!c) {
    std::vector<std::string> topics{"faults"};
    for (const Command& command : commands()) topics.push_back(command.name);
    const std::string hint = did_you_mean(args[1], topics);
    throw UsageError("no help on '" + args[1] + "'" +
                     (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                     " (dprun help COMMAND, or dprun help faults)");
  }
  std::fputs(help_text(*c).c_str(), stdout);
  return 0;
}

int dispatch(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(main_help().c_str(), stderr);
    return 2;
  }
  const std::string first = args[0];
  if (first == "__trial") return trial_child_main({args.begin() + 1, args.end()});
  if (first == "__devices") return devices_child_main();
  if (first == "__slurm-task") return slurm_task_main({args.begin() + 1, args.end()});
  if (first == "--help" || first == "-h") {
    std::fputs(main_help().c_str(), stdout);
    return 0;
  }
  if (first == "--version" || first == "version") {
    std::printf("dprun %s\n", dp::version());
    // What a trial on this machine computes with: the CPU kernels as this process resolves them
    // (cpuid, DPRUN_CPU_KERNELS), and the backends this build has.
    try {
      std::printf("CPU kernels: %s\n", dp::cpu_kernels().c_str());
    } catch (const std::exception& e) {
      std::printf("CPU kernels: unavailable: %s\n", e.what());
    }
#ifdef DPRUN_WITH_CUDA
    std::printf("CUDA backend: built (cuDNN, cuBLAS, NCCL)\n");
#else
    std::printf("CUDA backend: not built (no CUDA toolkit when configured; see the README)\n");
#endif
#ifdef DPRUN_WITH_MPI
    std::printf("MPI: built (trials across processes under mpirun or srun)\n");
#else
    std::printf("MPI: not built (trials run as one process)\n");
#endif
    return 0;
  }
  if (first == "help") return help_command(args);

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
      for (const Command& c : commands()) names.push_back(c.name);
      std::string hint = did_you_mean(first, names);
      throw UsageError("unknown command '" + first + "'" +
                       (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                       " (see dprun --help)");
    }
  }
  const Invocation in{cmd->name, parse_args(*cmd, rest), argc, argv};
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
