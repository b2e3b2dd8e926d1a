#include "trial/trial_main.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "base/os.hpp"
#include "dp/data.hpp"
#include "dp/error.hpp"
#include "models/plugin_loader.hpp"
#include "process/launch.hpp"
#include "process/stop_rule.hpp"
#include "settings/engine_options.hpp"
#include "trial/checkpoint_writer.hpp"

namespace dprun {

namespace {

// ---- DPRUN_FAULT -----------------------------------------------------------------------------

struct Fault {
  enum class Kind { none, kill, abort, throw_, nan, inf, hang, garble };
  Kind kind = Kind::none;
  int64_t epoch = 0;
  int64_t ordinal = -1;  // -1: every trial
};

// "KIND@EPOCH[#ORDINAL][:RANK]". Bad values are errors: a test that sets a fault must not
// silently run without it. The fault applies to this process when its trial and its rank (its
// place among the trial's processes) match.
Fault parse_fault(const char* env, int64_t ordinal, int rank) {
  Fault f;
  if (!env || !*env) return f;
  const std::string text = env;
  auto bad = [&]() -> Fault {
    throw dp::Error("DPRUN_FAULT=\"" + text +
                    "\": expected KIND@EPOCH[#TRIAL][:PROCESS] with KIND one of kill, abort, "
                    "throw, nan, inf, hang, garble (e.g. kill@1, nan@2#0 or kill@1:1)");
  };
  const auto at = text.find('@');
  if (at == std::string::npos) return bad();
  const std::string kind = text.substr(0, at);
  std::string rest = text.substr(at + 1);
  // A whole non-negative number, else the error.
  auto number = [&](const std::string& digits) {
    try {
      size_t used = 0;
      const int64_t n = std::stoll(digits, &used);
      if (used == digits.size() && n >= 0) return n;
    } catch (const std::exception&) {
    }
    bad();
    return int64_t{0};
  };
  // The optional parts, from the end: ":PROCESS", then "#TRIAL".
  auto suffix = [&](char mark) -> int64_t {
    const auto pos = rest.find(mark);
    if (pos == std::string::npos) return -1;
    const int64_t n = number(rest.substr(pos + 1));
    rest = rest.substr(0, pos);
    return n;
  };
  const int64_t target_rank = suffix(':');
  const int64_t target = suffix('#');
  f.epoch = number(rest);
  if (f.epoch < 1) return bad();
  if (kind == "kill")
    f.kind = Fault::Kind::kill;
  else if (kind == "abort")
    f.kind = Fault::Kind::abort;
  else if (kind == "throw")
    f.kind = Fault::Kind::throw_;
  else if (kind == "nan")
    f.kind = Fault::Kind::nan;
  else if (kind == "inf")
    f.kind = Fault::Kind::inf;
  else if (kind == "hang")
    f.kind = Fault::Kind::hang;
  else if (kind == "garble")
    f.kind = Fault::Kind::garble;
  else
    return bad();
  f.ordinal = target;
  if (target >= 0 && target != ordinal) f.kind = Fault::Kind::none;
  if (target_rank >= 0 && target_rank != rank) f.kind = Fault::Kind::none;
  return f;
}

void act_on_fault(const Fault& f, int64_t epoch) {
  if (f.kind == Fault::Kind::none || f.epoch != epoch) return;
  switch (f.kind) {
    case Fault::Kind::kill:
      raise(SIGKILL);
      break;
    case Fault::Kind::abort:
      std::abort();
    case Fault::Kind::throw_:
      throw dp::Error("injected fault DPRUN_FAULT: throw after epoch " + std::to_string(epoch));
    case Fault::Kind::hang:
      for (;;) pause();  // until a signal ends the process
    default:
      break;
  }
}

// ---- backend resolution ------------------------------------------------------------------------

struct BackendChoice {
  dp::BackendKind kind = dp::BackendKind::cpu;
  bool oversubscribed = false;
  std::string skip_reason;  // non-empty: the trial cannot run on this machine
};

BackendChoice choose_backend(const TrialRequest& r) {
  BackendChoice c;
  const std::string& req = r.run.backend;
  if (req == "cpu") return c;
  if (req != "auto" && req != "cuda")
    throw dp::Error("backend \"" + req + "\": expected auto, cpu or cuda");
  if (req == "cuda" && !dp::cuda_compiled())
    throw dp::Error(
        "backend cuda was requested but this dprun was built without CUDA; use --backend cpu "
        "or rebuild with -DDPRUN_CUDA=ON");
  // This is the only place CUDA is initialised: in the trial process, never in the runner.
  const int devices = dp::cuda_device_count();
  if (devices == 0 && req == "auto") return c;  // auto without a GPU: the CPU backend
  c.kind = dp::BackendKind::cuda;
  const int64_t gpus = r.settings[key::gpus];
  // More GPUs than this machine has (none at all included): skipped, the sweep goes on.
  if (devices == 0) {
    c.skip_reason = "trial needs " + std::to_string(gpus) +
                    " GPUs (backend cuda), this machine has none visible (check nvidia-smi and "
                    "CUDA_VISIBLE_DEVICES; --backend cpu runs it on the CPU)";
  } else if (gpus > devices) {
    if (!r.run.oversubscribe) {
      c.skip_reason = "trial needs " + std::to_string(gpus) + " GPUs, this machine has " +
                      std::to_string(devices) + " (use --oversubscribe to share GPUs)";
    } else {
      c.oversubscribed = true;
    }
  }
  return c;
}

std::string loss_problem(double loss) { return std::isnan(loss) ? "NaN" : "infinite"; }

// Every process's value of `mine`, in rank order (one broadcast per process: a few short strings
// once per trial).
std::vector<std::string> gather_all(dp::ProcessGroup* group, const std::string& mine) {
  if (!group) return {mine};
  std::vector<std::string> all(static_cast<size_t>(group->size()));
  for (int p = 0; p < group->size(); ++p) {
    std::string value = p == group->rank() ? mine : std::string();
    group->broadcast(value, p);
    all[static_cast<size_t>(p)] = std::move(value);
  }
  return all;
}

// The CPU cores this process may run on.
int affinity_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Why the trial cannot run as asked, before anything is loaded ("" when it can).
std::string request_problem(const TrialRequest& r, int world) {
  const int processes = static_cast<int>(r.settings[key::processes]);
  if (world != processes)
    return "the trial has processes = " + std::to_string(processes) + " but runs as " +
           std::to_string(world) + " process" + (world == 1 ? "" : "es") +
           (processes > 1 ? ": start it with `mpirun -np " + std::to_string(processes) +
                                "` (dprun run does), or srun --ntasks=" + std::to_string(processes)
                          : "");
  if (r.settings[key::gpus] % processes != 0)
    return "gpus " + std::to_string(r.settings[key::gpus]) + " is not divisible by processes " +
           std::to_string(processes);
  return "";
}

// The model's plugin; nullptr, with `why`, when no plugin provides it.
const LoadedModel* find_model(const PluginScan& scan, const std::string& name, std::string& why) {
  auto found = scan.models.find(name);
  if (found != scan.models.end()) return &found->second;
  why = "unknown model \"" + name + "\"; models found:";
  for (const auto& [n, m] : scan.models) why += " " + n;
  if (scan.models.empty()) why += " none";
  why += " (searched:";
  for (const auto& d : scan.searched) why += " " + d;
  why += ")";
  for (const auto& e : scan.errors) why += "; " + e;
  for (const auto& s : scan.skipped) why += "; " + s;
  return nullptr;
}

// The trial's dataset, built in or from a plugin; nullptr, with `why`, when none has the name.
const LoadedDataset* find_dataset(const PluginScan& scan, const std::string& name,
                                  std::string& why) {
  auto found = scan.datasets.find(name);
  if (found != scan.datasets.end()) return &found->second;
  why = "unknown dataset \"" + name + "\"; datasets known:";
  for (const auto& [n, d] : scan.datasets) why += " " + n;
  why += " (plugins searched:";
  for (const auto& d : scan.searched) why += " " + d;
  why += ")";
  for (const auto& e : scan.errors) why += "; " + e;
  return nullptr;
}

// The trial's data: the validation split held out of the whole training set first (so every
// trial of an experiment is selected on the same examples, whatever its train_limit), then the
// limits.
struct TrialData {
  dp::DatasetPair sets;
  std::optional<dp::Dataset> validation;
};

TrialData trial_data(const TrialRequest& r, const LoadedDataset& dataset) {
  const TrialSettings& s = r.settings;
  const std::string path = !r.data_path.empty() ? r.data_path : s[key::data_path];
  const dp::DatasetOptions options = model_options_from_json(Json::parse(s[key::data_options]));
  TrialData data{dp::load_checked(dataset.factory, options, path), std::nullopt};
  dp::Dataset& train = data.sets.train;
  if (const double v = s[key::validation]; v > 0) {
    const int64_t count =
        v < 1 ? std::llround(v * static_cast<double>(train.count)) : static_cast<int64_t>(v);
    if (count < 1 || count >= train.count)
      throw dp::Error("validation " + setting_text(v) + " holds out " + std::to_string(count) +
                      " of the " + std::to_string(train.count) + " training examples of " +
                      s[key::dataset] + ": it must leave at least one on each side");
    data.validation = dp::hold_out(train, count, static_cast<uint64_t>(s[key::validation_seed]));
  }
  const int64_t train_limit = s[key::train_limit], test_limit = s[key::test_limit];
  if (train_limit > 0 && train_limit < train.count) train = train.head(train_limit);
  dp::Dataset& test = data.sets.test;
  if (test_limit > 0 && test_limit < test.count) test = test.head(test_limit);
  return data;
}

// What the machine decides of the trainer's options: the backend, replicas per process, the
// process group and threads (the processes of a host share its threads, or the trial's
// --threads, equally).
void machine_options(dp::TrainerOptions& t, const TrialRequest& r, const BackendChoice& backend,
                     dp::ProcessGroup* group) {
  const int processes = static_cast<int>(r.settings[key::processes]);
  t.replicas = static_cast<int>(r.settings[key::gpus]) / processes;
  t.processes = processes > 1 ? group : nullptr;
  t.backend = backend.kind;
  t.layout = trial_layout(r.settings, backend.kind);
  t.oversubscribe = r.run.oversubscribe;
  t.cpu_threads = r.run.threads;
  if (processes > 1) {
    const int budget = r.run.threads > 0 ? r.run.threads : affinity_count();
    t.cpu_threads = std::max(1, budget / std::max(1, group->local_size()));
  }
}

// The start record: where the trial runs, every process's devices, the plugin.
dps::TrialStart start_record(const dp::Trainer& trainer, const LoadedModel& model,
                             const BackendChoice& backend, dp::ProcessGroup* group,
                             std::vector<std::string>& rank_hosts) {
  dps::TrialStart start;
  start.backend = trainer.backend_name();
  rank_hosts = gather_all(group, group ? group->host() : host_name());
  const auto rank_devices = gather_all(group, trainer.devices());
  start.hosts = group_hosts(rank_hosts);
  start.devices = rank_devices[0];
  if (rank_devices.size() > 1) {
    const bool same = std::all_of(rank_devices.begin(), rank_devices.end(),
                                  [&](const auto& d) { return d == rank_devices[0]; });
    if (same) {
      start.devices += " in each of " + std::to_string(rank_devices.size()) + " processes";
    } else {
      start.devices.clear();
      for (size_t p = 0; p < rank_devices.size(); ++p)
        start.devices += (p ? "; " : "") + std::to_string(p) + ": " + rank_devices[p];
    }
  }
  start.plugin_path = model.plugin_path;
  start.plugin_sha256 = file_sha256(model.plugin_path);
  start.oversubscribed = backend.oversubscribed;
  start.data_residence = trainer.data_residence().path;
  start.layout_used = dp::layout_name(trainer.options().layout);
  start.graphs_used = trainer.options().graphs ? 1 : 0;
  return start;
}

// One epoch's record.
dps::EpochRow epoch_row(const dp::EpochReport& report, double loss, const dp::Trainer& trainer) {
  dps::EpochRow row;
  row.epoch = report.epoch;
  row.train_loss = loss;
  row.train_acc = report.train_acc;
  row.test_acc = report.test_acc;
  row.seconds = report.seconds;
  row.examples_per_second = report.examples_per_second;
  row.lr = report.lr;  // the epoch's last step's (schedules change it per step)
  row.eval_seconds = report.eval_seconds;
  row.peak_memory_bytes = static_cast<int64_t>(trainer.peak_memory_bytes());
  row.test_loss = report.test_loss;
  row.val_loss = report.val_loss;
  row.val_acc = report.val_acc;
  return row;
}

// Trains from the resume point on, reporting every epoch (and its checkpoints) to the sink.
TrialResult train(dp::Trainer& trainer, const TrialRequest& r, TrialSink& sink, const Fault& fault,
                  dp::ProcessGroup* group) {
  const int rank = group ? group->rank() : 0;
  // A trial that resumes continues after its checkpoint's epoch, in the state it left.
  int first_epoch = 1;
  if (r.resume.epoch > 0) {
    load_resume_point(trainer, r.resume, group);
    first_epoch = static_cast<int>(r.resume.epoch) + 1;
  }
  // The stopping rule sees the epochs before the resume point as a straight run would have.
  const StopRule rule = stop_rule(r.settings);
  StopWatch watch(rule);
  watch.replay(r.resume.stop_history);
  const int64_t epochs = r.settings[key::epochs];
  // A scheduler's rung already reached (a promotion claimed, then the runner died): nothing to
  // train before it pauses again.
  const int64_t stop_after = r.stop_after_epoch;
  auto paused = [&](int64_t epoch) {
    return TrialResult{TrialRecord::Kind::paused,
                       "paused after epoch " + std::to_string(epoch) + " (a rung of [search])"};
  };
  if (stop_after > 0 && stop_after < epochs && first_epoch > stop_after)
    return paused(first_epoch - 1);
  // Process 0 writes the checkpoints (every process holds the same model after a step).
  CheckpointWriter checkpoints(parse_checkpoint_mode(r.settings[key::checkpoint]),
                               rank == 0 ? r.checkpoint_dir : std::string(), r.resume);
  TrialResult result;
  trainer.fit(
      [&](const dp::EpochReport& report) {
        double loss = report.train_loss;
        bool finite = report.finite && std::isfinite(loss);
        if ((fault.kind == Fault::Kind::nan || fault.kind == Fault::Kind::inf) &&
            fault.epoch == report.epoch) {
          loss = fault.kind == Fault::Kind::nan ? std::nan("") : HUGE_VAL;
          finite = false;
        }
        if (!finite) {
          result = {TrialRecord::Kind::diverged, "loss became " + loss_problem(loss) +
                                                     " at epoch " + std::to_string(report.epoch)};
          return false;
        }
        const dps::EpochRow row = epoch_row(report, loss, trainer);
        if (fault.kind == Fault::Kind::garble && fault.epoch == report.epoch)
          sink.corrupt_epoch();
        else
          sink.epoch(row, report);
        // After the epoch's record: a crash in between leaves the epoch recorded and the
        // checkpoint of the one before, from which the epoch is trained again.
        for (const dps::CheckpointRow& c : checkpoints.after_epoch(trainer, report))
          sink.checkpoint(c);
        act_on_fault(fault, report.epoch);
        // A rule met at the last epoch cuts nothing short: that trial is done.
        if (rule.active() && report.epoch < epochs) {
          const std::string why = watch.observe(report.epoch, metric_value(row, rule.metric));
          if (!why.empty()) {
            result = {TrialRecord::Kind::stopped, why};
            return false;
          }
        }
        if (stop_after > 0 && report.epoch >= stop_after && report.epoch < epochs) {
          result = paused(report.epoch);
          return false;
        }
        return true;
      },
      first_epoch);
  return result;
}

TrialResult run_trial_unchecked(const TrialRequest& r, TrialSink& sink, dp::ProcessGroup* group) {
  const Fault fault = parse_fault(std::getenv("DPRUN_FAULT"), r.ordinal, group ? group->rank() : 0);
  // Settings the engine does not implement are refused before anything is loaded.
  dp::TrainerOptions t = trainer_options(r.settings);
  if (std::string why = request_problem(r, group ? group->size() : 1); !why.empty())
    return {TrialRecord::Kind::error, why};
  const PluginScan scan = scan_plugins(r.run.plugin_dirs);
  std::string why;
  const LoadedModel* model = find_model(scan, r.settings[key::model], why);
  if (model == nullptr) return {TrialRecord::Kind::error, why};
  const dp::ModelOptions options = dp::resolve_model_options(model->factory, r.model_options);
  const LoadedDataset* dataset = find_dataset(scan, r.settings[key::dataset], why);
  if (dataset == nullptr) return {TrialRecord::Kind::error, why};

  // Every process decides alone whether it can run; the trial runs only if all can.
  const BackendChoice backend = choose_backend(r);
  const auto skip_reasons = gather_all(group, backend.skip_reason);
  for (size_t p = 0; p < skip_reasons.size(); ++p) {
    if (skip_reasons[p].empty()) continue;
    return {TrialRecord::Kind::skipped,
            p == 0 ? skip_reasons[p]
                   : "process " + std::to_string(p) + " of the trial: " + skip_reasons[p]};
  }
  TrialData data = trial_data(r, *dataset);
  const dp::Dataset& train_set = data.sets.train;
  machine_options(t, r, backend, group);
  // The model is built for the data it will see, whatever input it was designed for.
  const dp::ModelInput input{train_set.channels, train_set.height, train_set.width,
                             train_set.classes};
  const dp::ModelFactory& factory = model->factory;
  dp::Trainer trainer(
      t, [&] { return factory.build(options, input); }, train_set, data.sets.test,
      data.validation ? &*data.validation : nullptr);
  // The trainer holds what it needs (on its devices, or in host memory to stream it): the bytes
  // loaded here are not read again, and a dataset larger than the device must not be held twice.
  data = TrialData{};
  std::vector<std::string> rank_hosts;
  const dps::TrialStart start = start_record(trainer, *model, backend, group, rank_hosts);
  sink.start(start, rank_hosts);
  return train(trainer, r, sink, fault, group);
}

}  // namespace

// ---- sinks -------------------------------------------------------------------------------------

void RecordSink::start(const dps::TrialStart& start, const std::vector<std::string>& rank_hosts) {
  TrialRecord r;
  r.kind = TrialRecord::Kind::start;
  r.start = start;
  r.rank_hosts = rank_hosts;
  w_.write(r);
}

void RecordSink::epoch(const dps::EpochRow& row, const dp::EpochReport&) {
  TrialRecord r;
  r.kind = TrialRecord::Kind::epoch;
  r.epoch = row;
  w_.write(r);
}

void RecordSink::checkpoint(const dps::CheckpointRow& row) {
  TrialRecord r;
  r.kind = TrialRecord::Kind::checkpoint;
  r.checkpoint = row;
  w_.write(r);
}

void RecordSink::corrupt_epoch() { w_.write_line("{\"kind\": \"epoch\", \"epoch\": "); }

void PrintSink::checkpoint(const dps::CheckpointRow& row) {
  std::printf("       checkpoint (%s): %s\n", row.role.c_str(), row.path.c_str());
  std::fflush(stdout);
}

void PrintSink::start(const dps::TrialStart& start, const std::vector<std::string>& rank_hosts) {
  std::printf("%s on %s: %s%s (plugin %s)\n", r_.settings[key::model].c_str(),
              start.backend.c_str(), start.devices.c_str(),
              start.oversubscribed ? ", oversubscribed" : "", start.plugin_path.c_str());
  if (rank_hosts.size() > 1) std::printf("processes on %s\n", start.hosts.c_str());
  if (start.data_residence == "streamed")
    std::printf(
        "data: streamed from host memory in chunks (it needs more than data_budget_mib "
        "= %g per replica)\n",
        r_.settings[key::data_budget_mib]);
  if (r_.settings[key::validation] > 0)
    std::printf("%5s  %10s  %9s  %8s  %8s  %8s  %12s\n", "epoch", "train_loss", "train_acc",
                "val_acc", "test_acc", "seconds", "examples/s");
  else
    std::printf("%5s  %10s  %9s  %8s  %8s  %12s\n", "epoch", "train_loss", "train_acc", "test_acc",
                "seconds", "examples/s");
  std::fflush(stdout);
}

void PrintSink::epoch(const dps::EpochRow& row, const dp::EpochReport&) {
  if (r_.settings[key::validation] > 0)
    std::printf("%5lld  %10.4f  %9.4f  %8.4f  %8.4f  %8.2f  %12.0f\n",
                static_cast<long long>(row.epoch), row.train_loss, row.train_acc, row.val_acc,
                row.test_acc, row.seconds, row.examples_per_second);
  else
    std::printf("%5lld  %10.4f  %9.4f  %8.4f  %8.2f  %12.0f\n", static_cast<long long>(row.epoch),
                row.train_loss, row.train_acc, row.test_acc, row.seconds, row.examples_per_second);
  std::fflush(stdout);
}

TrialResult run_trial(const TrialRequest& request, TrialSink& sink, dp::ProcessGroup* group) {
  try {
    return run_trial_unchecked(request, sink, group);
  } catch (const std::exception& e) {
    return {TrialRecord::Kind::error, e.what()};
  } catch (...) {
    return {TrialRecord::Kind::error, "unknown exception"};
  }
}

int trial_child_main(const std::vector<std::string>& args) {
  int fd = -1;
  bool on_stdout = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--record-fd" && i + 1 < args.size()) fd = std::atoi(args[++i].c_str());
    if (args[i] == "--records" && i + 1 < args.size()) on_stdout = args[++i] == "stdout";
  }
  if (on_stdout) return trial_process_of_many();
  if (fd < 0) {
    std::fprintf(stderr,
                 "dprun: __trial is internal: it runs one trial for `dprun run` and needs "
                 "--record-fd N (or --records stdout under a launcher) and a trial request "
                 "(JSON) on stdin\n");
    return 2;
  }
  RecordWriter writer(fd);
  TrialRecord final_record;
  try {
    std::ostringstream in;
    in << std::cin.rdbuf();
    const TrialRequest request = request_from_json(Json::parse(in.str()));
    RecordSink sink(writer);
    TrialResult result = run_trial(request, sink);
    final_record.kind = result.kind;
    final_record.message = result.message;
  } catch (const std::exception& e) {
    final_record.kind = TrialRecord::Kind::error;
    final_record.message = std::string("bad trial request: ") + e.what();
  }
  try {
    writer.write(final_record);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dprun: %s\n", e.what());
    return 1;
  }
  if (final_record.kind == TrialRecord::Kind::error) {
    std::fprintf(stderr, "dprun: %s\n", final_record.message.c_str());
    return 1;
  }
  return 0;
}

int run_train(const TrialRequest& request) {
  PrintSink sink(request);
  TrialResult result = run_trial(request, sink);
  switch (result.kind) {
    case TrialRecord::Kind::done:
      return 0;
    case TrialRecord::Kind::stopped:
    case TrialRecord::Kind::paused:
      std::fprintf(stderr, "dprun: %s\n", result.message.c_str());
      return 0;
    case TrialRecord::Kind::diverged:
      std::fprintf(stderr, "dprun: diverged: %s\n", result.message.c_str());
      return 1;
    case TrialRecord::Kind::skipped:
      std::fprintf(stderr, "dprun: skipped: %s\n", result.message.c_str());
      return 1;
    default:
      std::fprintf(stderr, "dprun: %s\n", result.message.c_str());
      return 1;
  }
}

const char* fault_help() {
  return "Testing:\n"
         "  DPRUN_FAULT=KIND@EPOCH[#TRIAL][:PROCESS] makes the trial process fail on purpose\n"
         "  after it has reported epoch EPOCH (only in the trial with 0-based sweep position\n"
         "  TRIAL when given, and only in process PROCESS of a trial of several processes when\n"
         "  given; DPRUN_COMM_TIMEOUT_S sets how long the others wait for it). KIND is one of:\n"
         "    kill   the trial process sends itself SIGKILL\n"
         "    abort  it calls abort() (SIGABRT)\n"
         "    throw  it throws an exception (recorded as an error)\n"
         "    nan    the loss of that epoch is reported as NaN (the trial diverges)\n"
         "    inf    the loss of that epoch is reported as +infinity (the trial diverges)\n"
         "    hang   it sleeps forever (see --trial-timeout)\n"
         "    garble its record of that epoch is not valid (the runner must fail the trial)\n";
}

}  // namespace dprun
