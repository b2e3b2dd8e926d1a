#pragma once
// Settings reach the engine in one place: what a trial's settings ask of dp::Trainer, each value
// read with the engine's own parser (dp::parse_layout, dp::parse_precision, ...), whose names are
// also the table's choices (settings_table.cpp).
#include "dp/trainer.hpp"
#include "settings/settings.hpp"

namespace dprun {

/// The trainer's options that follow from the settings alone. What the machine decides is the
/// trial process's to set: the backend kind, the replicas per process and the process group,
/// CPU threads, oversubscription. Throws dp::Error naming a value the engine does not implement
/// (an optimizer whose options do not fit it included).
/// layout = "auto" is left to trial_layout; graphs = "auto" is the trainer's to resolve
/// (TrainerOptions::graphs_auto).
dp::TrainerOptions trainer_options(const TrialSettings& settings);

/// The layout a trial runs with on backend `kind`: its setting, or for "auto" the faster there
/// as measured: nhwc on CUDA with TF32 or bf16; nchw on the CPU, and for strict fp32 on CUDA
/// (allow_tf32 = false; nhwc not measured there yet).
dp::Layout trial_layout(const TrialSettings& settings, dp::BackendKind kind);

}  // namespace dprun
