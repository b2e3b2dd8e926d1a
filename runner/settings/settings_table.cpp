// The settings of this dprun, one row each (see settings.hpp for what a row says). To add a
// setting: add its row here, then the code that acts on its value (engine_options.cpp for what
// the trainer does with it). The store adds its column to every database it opens, the README's
// table is checked against these rows (test_settings.cpp), and trials stored before the setting
// existed keep their identity as long as the default is what dprun did until then. The choices
// of what the engine implements are the engine's own names (dp::layout_names(), ...), so the
// table and the engine cannot disagree.
#include "dp/backend.hpp"
#include "dp/optimizer.hpp"
#include "dp/tensor.hpp"
#include "settings/settings.hpp"

namespace dprun {

namespace {

// "auto" (resolved where the trial runs: engine_options.hpp's trial_layout), then the engine's.
std::vector<std::string> layout_choices() {
  std::vector<std::string> choices{"auto"};
  for (const std::string& name : dp::layout_names()) choices.push_back(name);
  return choices;
}

}  // namespace

// long function: the table of settings, one row per setting; splitting it would split the table.
const SettingTable& builtin_settings() {
  using namespace std::string_literals;
  using T = SettingType;
  static const SettingTable table({
      {.key = "model",
       .column = "model",
       .type = T::model,
       .default_value = ""s,
       .identity = true,
       .help = "a model from a plugin (see `dprun plugins`)",
       .default_doc = "(required)"},
      {.column = "model_options",
       .type = T::json,
       .default_value = "{}"s,
       .identity = true,
       .help = "the plugin's options with their defaults filled in ([model.NAME] tables)"},
      {.column = "dataset",
       .type = T::dataset,
       .default_value = "fashion-mnist"s,
       .identity = true,
       .help = "[data].dataset: built in (arrays, cifar10, fashion-mnist, mnist) or from a "
               "plugin (see `dprun plugins`)"},
      {.column = "data_options",
       .type = T::json,
       .default_value = "{}"s,
       .identity = true,
       .help = "the dataset's options with their defaults filled in ([data.NAME] tables); {} for "
               "a dataset without options"},
      {.column = "data_path",
       .type = T::text,
       .default_value = ""s,
       .baseline_may_differ = true,
       .help = "[data].path (the same data may live anywhere: not part of a trial's identity)"},
      {.key = "epochs",
       .column = "epochs",
       .default_value = int64_t{10},
       .range = at_least(1),
       .identity = true,
       .baseline_may_differ = true,
       .help = "passes over the training data"},
      {.key = "seed",
       .column = "seed",
       .default_value = int64_t{0},
       .range = at_least(0),
       .identity = true,
       .baseline_may_differ = true,
       .help = "initialisation and shuffling; a list in `[sweep]` gives repeats"},
      {.key = "gpus",
       .column = "gpus",
       .default_value = int64_t{1},
       .range = at_least(1),
       .identity = true,
       .help = "data-parallel replicas (GPUs on CUDA, threads on the CPU backend)"},
      {.key = "processes",
       .column = "processes",
       .default_value = int64_t{1},
       .range = at_least(1),
       .identity = true,
       // A trial of more GPUs may need more processes (hosts); its 1-GPU baseline has one.
       .baseline_may_differ = true,
       .help = "processes the replicas are spread over, gpus / processes each (gpus must divide "
               "evenly); more than 1: started with mpirun or srun, one per host or per GPU (see "
               "[launch])"},
      {.key = "batch_size",
       .column = "batch_size",
       .default_value = int64_t{256},
       .range = at_least(1),
       .identity = true,
       .baseline_may_differ = true,
       .help = "the global batch, split across the replicas; at least gpus"},
      {.key = "per_gpu_batch",
       .column = "per_gpu_batch",
       .default_value = int64_t{256},
       .range = at_least(1),
       .identity = true,
       .help = "alternative to batch_size: batch_size = per_gpu_batch × gpus",
       .default_doc = "batch_size / gpus"},
      {.key = "lr",
       .column = "lr",
       .type = T::number,
       .default_value = 0.1,
       .range = greater_than(0),
       .identity = true,
       .baseline_may_differ = true,
       .help = "learning rate (recorded after lr_scaling)"},
      {.key = "lr_scaling",
       .type = T::choice,
       .default_value = "none"s,
       .choices = {"none", "linear"},
       .help = "linear: lr × batch_size / base_batch"},
      {.key = "base_batch",
       .default_value = int64_t{256},
       .range = at_least(1),
       .help = "the batch size lr is given for, under lr_scaling = \"linear\""},
      {.key = "optimizer",
       .column = "optimizer",
       .type = T::choice,
       .default_value = "sgd"s,
       .choices = dp::optimizer_names(),
       .identity = true,
       .help = "PyTorch's SGD (momentum, nesterov, weight_decay) or AdamW (betas, eps, "
               "decoupled weight_decay)"},
      {.key = "momentum",
       .column = "momentum",
       .type = T::number,
       .default_value = 0.0,
       .range = from_to_below(0, 1),
       .identity = true,
       .baseline_may_differ = true,
       .applies_when = AppliesWhen{"optimizer", {"sgd"}},
       .help = "SGD momentum"},
      {.key = "nesterov",
       .column = "nesterov",
       .type = T::boolean,
       .default_value = false,
       .identity = true,
       .applies_when = AppliesWhen{"optimizer", {"sgd"}},
       .help = "SGD: Nesterov momentum (needs momentum > 0)"},
      {.key = "betas",
       .column = "betas",
       .type = T::numbers,
       .default_value = std::vector<double>{0.9, 0.999},
       .range = from_to_below(0, 1),
       .count = 2,
       .identity = true,
       .applies_when = AppliesWhen{"optimizer", {"adamw"}},
       .help = "AdamW: the moving averages' factors (beta1, beta2)"},
      {.key = "eps",
       .column = "eps",
       .type = T::number,
       .default_value = 1e-8,
       .range = greater_than(0),
       .identity = true,
       .applies_when = AppliesWhen{"optimizer", {"adamw"}},
       .help = "AdamW: added to the denominator"},
      {.key = "weight_decay",
       .column = "weight_decay",
       .type = T::number,
       .default_value = 0.0,
       .range = at_least(0),
       .identity = true,
       .baseline_may_differ = true,
       .help = "SGD: L2 penalty added to the gradient; AdamW: decoupled weight decay"},
      {.key = "lr_schedule",
       .column = "lr_schedule",
       .type = T::choice,
       .default_value = "constant"s,
       .choices = dp::schedule_kind_names(),
       .identity = true,
       .help = "the learning rate of every step after the warm-up: constant; step (× lr_gamma "
               "every lr_step_epochs epochs); cosine (to 0 at the end of training)"},
      {.key = "warmup_epochs",
       .column = "warmup_epochs",
       .type = T::number,
       .default_value = 0.0,
       .range = at_least(0),
       .identity = true,
       .help = "linear warm-up from lr / steps to lr over the first epochs (may be fractional), "
               "per step"},
      {.key = "lr_step_epochs",
       .column = "lr_step_epochs",
       .default_value = int64_t{30},
       .range = at_least(1),
       .identity = true,
       .applies_when = AppliesWhen{"lr_schedule", {"step"}},
       .help = "lr_schedule = \"step\": epochs between decays"},
      {.key = "lr_gamma",
       .column = "lr_gamma",
       .type = T::number,
       .default_value = 0.1,
       .range = above_up_to(0, 1),
       .identity = true,
       .applies_when = AppliesWhen{"lr_schedule", {"step"}},
       .help = "lr_schedule = \"step\": the factor of each decay"},
      {.key = "precision",
       .column = "precision",
       .type = T::choice,
       .default_value = "fp32"s,
       .choices = dp::precision_names(),
       .identity = true,
       .help = "arithmetic of convolutions and linear layers: \"bf16\" rounds their inputs and "
               "outputs, convolutions' weight gradients and batch norms' outputs to bfloat16 "
               "and accumulates in fp32; master weights, optimizer, batch norm's statistics and "
               "loss stay fp32 (the GPU runs cuBLAS's and cuDNN's bf16 kernels where they give "
               "these values, else TF32 math, exact on bf16 values, and in NHWC stores as bf16 "
               "the activations whose readers take it; the CPU keeps fp32 tensors)"},
      {.key = "allow_tf32",
       .column = "allow_tf32",
       .type = T::boolean,
       .default_value = true,
       .identity = true,
       .help = "precision = \"fp32\" on GPUs: let cuDNN and cuBLAS use TF32 tensor cores (10-bit "
               "mantissa products, fp32 accumulation), as PyTorch's convolutions do by default; "
               "false: exact fp32. The CPU backend always computes exact fp32"},
      {.key = "conv_choice",
       .column = "conv_choice",
       .type = T::choice,
       .default_value = "measured"s,
       .choices = {"measured", "heuristic"},
       // Part of the identity: the two may pick different algorithms, so different bits.
       .identity = true,
       .help = "GPU convolutions: how cuDNN's algorithm is picked among those the precision "
               "contract allows (`dprun train --help`): measured (timed once per shape on this "
               "machine and kept in the choice cache: the fastest; machines of one kind may "
               "choose differently) or heuristic (cuDNN's heuristics, nothing timed: the same "
               "choice, so the same bits, on every machine with the same GPU model and "
               "libraries)"},
      {.key = "graphs",
       .column = "graphs",
       .type = T::boolean_auto,
       .default_value = "auto"s,
       // Part of the identity although it computes the same values: a sweep over graphs is a
       // speed comparison, and its trials must not be merged into one. "auto" is resolved by
       // the trainer (TrainerOptions::graphs_auto), and the trial records what ran
       // (trials.graphs_used). Experiments begun before the default changed keep false.
       .identity = true,
       .help = "capture each training step and evaluation chunk once per batch size and replay "
               "it: CUDA graphs on GPUs (one launch per step); on the CPU a recording of the "
               "ops, the same results. Not with replicas sharing one GPU. \"auto\": on where "
               "the trial runs on CUDA with a GPU per replica (a ResNet-18 step took 13 % less "
               "time on an H200, LeNet's 38 % less), off on the CPU and where replicas share a "
               "GPU; trials record which in column graphs_used. An experiment begun by an older "
               "dprun, whose default was false, keeps false",
       .earlier_defaults = {{2, false}}},
      {.key = "layout",
       .column = "layout",
       .type = T::choice,
       .default_value = "auto"s,
       .choices = layout_choices(),
       // "auto" resolves on the machine that runs the trial (trial_layout): the trial records
       // the layout it ran with (trials.layout_used). Experiments begun before the default
       // changed keep "nchw" (their trials' identities).
       .identity = true,
       .help =
           "activation layout: \"nchw\" as PyTorch's default, \"nhwc\" channels last "
           "(both backends; checkpoints are PyTorch's either way); \"auto\": nhwc where the "
           "trial runs on CUDA with TF32 or bf16 (where ResNet-18 measured faster), nchw on the "
           "CPU and for strict fp32 on CUDA (allow_tf32 = false with precision fp32: not "
           "measured in nhwc yet); trials record which in column layout_used. An experiment "
           "begun by an older dprun, whose default was nchw, keeps nchw, so its trials stay the "
           "same trials",
       .earlier_defaults = {{1, "nchw"s}}},
      {.key = "bn",
       .column = "bn_mode",
       .type = T::choice,
       .default_value = "per-replica"s,
       .choices = {"per-replica", "sync"},
       .identity = true,
       .help = "batch-norm statistics per replica, as in d2l; \"sync\": over every replica of "
               "the trial, so k replicas compute the step of one replica on the whole batch"},
      {.key = "eval_batch_size",
       .column = "eval_batch_size",
       .default_value = int64_t{0},
       .range = at_least(0),
       .identity = true,
       .help = "the batch of evaluation; 0: batch_size"},
      {.key = "train_limit",
       .column = "train_limit",
       .default_value = int64_t{0},
       .range = at_least(0),
       .identity = true,
       .help = "train on the first N examples only; 0: all (quick runs)"},
      {.key = "test_limit",
       .column = "test_limit",
       .default_value = int64_t{0},
       .range = at_least(0),
       .identity = true,
       .help = "evaluate on the first N examples only; 0: all"},
      {.key = "augment.crop_padding",
       .column = "augment_crop_padding",
       .default_value = int64_t{0},
       .range = from_to(0, 2047),
       .identity = true,
       .help = "training: a random crop of the image's size from the image zero-padded by this "
               "many pixels on each side (torchvision's RandomCrop(size, padding)), applied on the "
               "device, drawn per example from the seed, the epoch and the example's place in "
               "it; 0: none"},
      {.key = "augment.flip",
       .column = "augment_flip",
       .type = T::boolean,
       .default_value = false,
       .identity = true,
       .help = "training: a horizontal flip of half the examples (after the crop, as "
               "torchvision's RandomHorizontalFlip), drawn as the crop is"},
      {.key = "augment.mean",
       .column = "augment_mean",
       .type = T::numbers,
       .default_value = std::vector<double>{},
       .count = kAnyCount,
       .identity = true,
       .help = "per-channel normalisation, training and evaluation: (pixel / 255 - mean) / std, "
               "one value per channel of the data (torchvision's Normalize); [] (with std []): "
               "none"},
      {.key = "augment.std",
       .column = "augment_std",
       .type = T::numbers,
       .default_value = std::vector<double>{},
       .range = greater_than(0),
       .count = kAnyCount,
       .identity = true,
       .help = "the normalisation's per-channel standard deviations, as many as augment.mean"},
      {.key = "data_budget_mib",
       .column = "data_budget_mib",
       .type = T::number,
       .default_value = 0.0,
       .range = from_to(0, 1048576),  // up to a TiB per replica
       // The same order and the same bits either way: where the data lives is not the trial.
       .baseline_may_differ = true,
       .help = "device memory for the datasets, per replica, in MiB; when the training, test "
               "and validation sets need more, they stay in host memory and are streamed to the "
               "device in chunks of steps through page-locked staging, overlapped with compute "
               "(trials record which: column data_residence); 0: no limit"},
      {.key = "validation",
       .column = "validation",
       .type = T::number,
       .default_value = 0.0,
       .range = at_least(0),
       .identity = true,
       .help = "examples of the training set held out for validation: a count (a whole number "
               "of at least 1) or a fraction of the training set (below 1); 0: none. Every epoch "
               "then records val_loss and val_acc, and stop.metric \"auto\" watches val_acc "
               "instead of test_acc"},
      {.key = "validation_seed",
       .column = "validation_seed",
       .default_value = int64_t{0},
       .range = at_least(0),
       .identity = true,
       .help = "which examples the validation split holds out: a seed of its own, so every trial "
               "of an experiment (whatever its seed) is selected on the same examples"},
      {.key = "stop.metric",
       .column = "stop_metric",
       .type = T::choice,
       .default_value = "auto"s,
       .choices = {"auto", "val_acc", "val_loss", "test_acc", "test_loss", "train_acc",
                   "train_loss"},
       .identity = true,
       .help = "what stop.patience and stop.target watch (an accuracy must rise, a loss fall); "
               "auto: val_acc with a validation split, else test_acc"},
      {.key = "stop.patience",
       .column = "stop_patience",
       .default_value = int64_t{0},
       .range = at_least(0),
       .identity = true,
       .help = "stop a trial (status stopped) after this many epochs in a row without an "
               "improvement of stop.metric by more than stop.min_delta over its best; 0: never"},
      {.key = "stop.min_delta",
       .column = "stop_min_delta",
       .type = T::number,
       .default_value = 0.0,
       .range = at_least(0),
       .identity = true,
       .help = "the least change of stop.metric that counts as an improvement"},
      {.key = "stop.target",
       .column = "stop_target",
       .type = T::number,
       .default_value = 0.0,
       .range = at_least(0),
       .identity = true,
       .help = "stop a trial (status stopped) once stop.metric reaches it (an accuracy at "
               "least, a loss at most); 0: no target"},
      {.key = "retries",
       .column = "retries",
       .default_value = int64_t{0},
       .range = at_least(0),
       // How often a failure is tried again does not change what a trial computes.
       .baseline_may_differ = true,
       .help = "run a trial that failed (not diverged, stopped or skipped) again, up to this "
               "many times in one run, from its last checkpoint where it kept one; every attempt "
               "is recorded (table attempts)"},
      {.key = "checkpoint",
       .column = "checkpoint",
       .type = T::choice,
       .default_value = "last"s,
       .choices = {"none", "last", "best", "every"},
       // What is kept of a run does not change what it computes.
       .baseline_may_differ = true,
       .help = "model files kept (PyTorch state_dict as safetensors, in <database>.checkpoints/"
               "trial-ID/): last (the last epoch's model and optimizer state; a failed or "
               "interrupted trial resumes from it), best (also the model of the best test "
               "accuracy), every (also every epoch's model), none (nothing; no resuming)"},
      {.key = "backend",
       .column = "backend_request",
       .type = T::choice,
       .default_value = "auto"s,
       .choices = {"auto", "cpu", "cuda"},
       // cpu and cuda compute the same trial; the view matches on the backend that ran instead.
       .baseline_may_differ = true,
       .help = "auto: CUDA when a GPU is visible, else CPU; `--backend` overrides it for a run"},
  });
  return table;
}

}  // namespace dprun
