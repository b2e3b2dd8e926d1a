#pragma once
// Typed handles on the recorded settings, for the code that acts on them: with a TrialSettings s,
// s[key::gpus] is an int64_t and s[key::layout] a std::string. A misspelt key does not compile,
// and test_settings.cpp holds every key to its row of the table (the column exists, the type is
// the row's value type), so the two cannot drift apart. The generic code (the store, the
// record, --filter, the README) goes by the table's rows instead.
#include <cstdint>
#include <string>
#include <vector>

namespace dprun {

/// One recorded setting: its column, and the type of its value (SettingValue's alternative).
template <class T>
struct SettingKey {
  const char* column;
};

// (type, column) of every recorded setting the code reads by name. A true/false/"auto" setting
// (graphs) has no single type: it is read with TrialSettings::get.
#define DPRUN_SETTING_KEYS(X)          \
  X(std::string, model)                \
  X(std::string, model_options)        \
  X(std::string, dataset)              \
  X(std::string, data_options)         \
  X(std::string, data_path)            \
  X(int64_t, epochs)                   \
  X(int64_t, seed)                     \
  X(int64_t, gpus)                     \
  X(int64_t, processes)                \
  X(int64_t, batch_size)               \
  X(int64_t, per_gpu_batch)            \
  X(double, lr)                        \
  X(std::string, optimizer)            \
  X(double, momentum)                  \
  X(bool, nesterov)                    \
  X(std::vector<double>, betas)        \
  X(double, eps)                       \
  X(double, weight_decay)              \
  X(std::string, lr_schedule)          \
  X(double, warmup_epochs)             \
  X(int64_t, lr_step_epochs)           \
  X(double, lr_gamma)                  \
  X(std::string, precision)            \
  X(bool, allow_tf32)                  \
  X(std::string, conv_choice)          \
  X(int64_t, augment_crop_padding)     \
  X(bool, augment_flip)                \
  X(std::vector<double>, augment_mean) \
  X(std::vector<double>, augment_std)  \
  X(double, data_budget_mib)           \
  X(std::string, layout)               \
  X(std::string, bn_mode)              \
  X(int64_t, eval_batch_size)          \
  X(int64_t, train_limit)              \
  X(int64_t, test_limit)               \
  X(std::string, checkpoint)           \
  X(std::string, backend_request)      \
  X(double, validation)                \
  X(int64_t, validation_seed)          \
  X(std::string, stop_metric)          \
  X(int64_t, stop_patience)            \
  X(double, stop_min_delta)            \
  X(double, stop_target)               \
  X(int64_t, retries)

namespace key {
#define DPRUN_DECLARE_SETTING_KEY(type, name) inline constexpr SettingKey<type> name{#name};
DPRUN_SETTING_KEYS(DPRUN_DECLARE_SETTING_KEY)
#undef DPRUN_DECLARE_SETTING_KEY
}  // namespace key

}  // namespace dprun
