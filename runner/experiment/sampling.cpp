// Sampled search: a [sweep] key given as a distribution (lr = {log_uniform = [1e-3, 1.0]}) takes
// [search].samples values drawn from it. Draw i of a key depends on ([search].seed, the key, i)
// alone (a counter-based hash, no generator state), so the same file gives the same trials on
// every machine, and more samples extend the sequence instead of redrawing it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "dp/random.hpp"
#include "experiment/experiment_detail.hpp"

namespace dprun::detail {

namespace {


uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Six significant digits: what a draw is shown and stored as. It also hides a last-bit difference
// between two libraries' exp() or log(), except for a value that falls on a rounding boundary.
double six_digits(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return std::strtod(buf, nullptr);
}

double number_of(const toml::node& n) {
  return n.is_integer() ? static_cast<double>(n.as_integer()->get())
                        : n.as_floating_point()->get();
}

const std::vector<std::string>& kinds() {
  static const std::vector<std::string> k = {"uniform", "log_uniform", "int_uniform", "choice"};
  return k;
}

}  // namespace

double sample_unit(uint64_t seed, const std::string& key, int64_t index) {
  const uint64_t h = dp::mix64(dp::mix64(seed) ^ fnv1a64(key)) ^ static_cast<uint64_t>(index);
  return static_cast<double>(dp::mix64(h) >> 11) * 0x1.0p-53;
}

bool is_distribution(const toml::node& n) {
  const auto* t = n.as_table();
  if (t == nullptr || t->size() != 1) return false;
  const std::string kind(t->begin()->first.str());
  return std::find(kinds().begin(), kinds().end(), kind) != kinds().end();
}

// long function: one distribution's checks, each with its own message, then the draws.
std::optional<toml::array> draw_samples(const toml::node& n, const std::string& key,
                                        const std::string& path, Pos pos, SampledType type,
                                        const Sampling& sampling, Diagnostics& diag) {
  const auto* t = n.as_table();
  const std::string example =
      " (e.g. lr = {log_uniform = [0.001, 1.0]}, batch_size = {choice = [64, 128, 256]})";
  if (t == nullptr || t->size() != 1) {
    diag.add(pos, path,
             "a distribution is a table of one of " + join(kinds(), ", ", false) + example);
    return std::nullopt;
  }
  const std::string kind(t->begin()->first.str());
  const toml::node& arg = t->begin()->second;
  const Pos apos = pos_of(arg.source(), pos);
  const std::string apath = path + "." + kind;
  if (std::find(kinds().begin(), kinds().end(), kind) == kinds().end()) {
    diag.add(apos, apath,
             "unknown distribution" + typo_hint(kind, kinds()) + "; known: " +
                 join(kinds(), ", ", false) + example);
    return std::nullopt;
  }
  if (sampling.samples <= 0) {
    diag.add(pos, path,
             "a distribution needs [search] samples = N: how many values to draw for each "
             "sampled key");
    return std::nullopt;
  }
  const auto* a = arg.as_array();
  toml::array draws;
  if (kind == "choice") {
    if (a == nullptr || a->empty()) {
      diag.add(apos, apath, "expected a non-empty list of values to choose from, got " +
                                describe(arg));
      return std::nullopt;
    }
    for (int64_t i = 0; i < sampling.samples; ++i) {
      const auto pick = static_cast<size_t>(sample_unit(sampling.seed, key, i) *
                                            static_cast<double>(a->size()));
      (*a)[std::min(pick, a->size() - 1)].visit([&](const auto& v) { draws.push_back(v); });
    }
    return draws;
  }
  // uniform, log_uniform, int_uniform: [low, high] numbers, low < high.
  if (type == SampledType::other) {
    diag.add(apos, apath,
             kind + " draws numbers; " + key + " takes other values: use choice = [...]");
    return std::nullopt;
  }
  const bool integer_bounds = kind == "int_uniform" || type == SampledType::integer;
  const bool bounds_ok = a != nullptr && a->size() == 2 && (*a)[0].is_number() &&
                         (*a)[1].is_number() &&
                         (!integer_bounds || ((*a)[0].is_integer() && (*a)[1].is_integer()));
  if (!bounds_ok) {
    diag.add(apos, apath,
             std::string("expected [low, high], two ") +
                 (integer_bounds ? "integers" : "numbers") + ", got " + describe(arg));
    return std::nullopt;
  }
  const double low = number_of((*a)[0]), high = number_of((*a)[1]);
  if (!(low < high) || (kind == "log_uniform" && low <= 0)) {
    diag.add(apos, apath,
             kind == "log_uniform" && low <= 0
                 ? "log_uniform needs 0 < low < high, got " + describe(arg)
                 : "needs low < high, got " + describe(arg));
    return std::nullopt;
  }
  for (int64_t i = 0; i < sampling.samples; ++i) {
    const double u = sample_unit(sampling.seed, key, i);
    if (kind == "int_uniform") {
      const auto lo = static_cast<int64_t>(low), hi = static_cast<int64_t>(high);
      const int64_t span = hi - lo + 1;
      draws.push_back(lo + std::min(span - 1, static_cast<int64_t>(u * static_cast<double>(span))));
      continue;
    }
    const double x = kind == "uniform" ? low + u * (high - low)
                                       : std::exp(std::log(low) + u * (std::log(high) - std::log(low)));
    if (type == SampledType::integer)
      draws.push_back(std::clamp(static_cast<int64_t>(std::llround(x)), static_cast<int64_t>(low),
                                 static_cast<int64_t>(high)));
    else
      draws.push_back(std::clamp(six_digits(x), low, high));
  }
  return draws;
}

void read_search_table(const toml::table& t, Diagnostics& diag, Sampling& sampling,
                       SearchConfig& search) {
  const Pos table_pos = pos_of(t.source(), {});
  const std::vector<std::string> known = {"samples", "seed", "scheduler", "eta", "min_epochs",
                                          "metric"};
  for (auto [k, n] : in_file_order(t)) {
    const std::string name(k->str());
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    diag.add(pos_of(k->source(), table_pos), "search." + name,
             "unknown key" + typo_hint(name, known) + " (known keys: " + join(known, ", ", false) +
                 ")");
  }
  auto count = [&](const char* key, int64_t min) -> std::optional<int64_t> {
    const toml::node* n = t.get(key);
    if (n == nullptr) return std::nullopt;
    if (!n->is_integer() || n->as_integer()->get() < min) {
      diag.add(pos_of(n->source(), table_pos), std::string("search.") + key,
               "expected an integer of at least " + std::to_string(min) + ", got " + describe(*n));
      return std::nullopt;
    }
    return n->as_integer()->get();
  };
  auto choice = [&](const char* key, const std::vector<std::string>& values) {
    const toml::node* n = t.get(key);
    if (n == nullptr) return std::optional<std::string>();
    const std::string got = n->is_string() ? n->as_string()->get() : "";
    if (std::find(values.begin(), values.end(), got) == values.end()) {
      diag.add(pos_of(n->source(), table_pos), std::string("search.") + key,
               "expected one of " + join(values, ", ", true) + ", got " + describe(*n) +
                   (got.empty() ? "" : typo_hint(got, values)));
      return std::optional<std::string>();
    }
    return std::optional<std::string>(got);
  };
  if (auto n = count("samples", 1)) {
    sampling.samples = *n;
    sampling.pos = pos_of(t.get("samples")->source(), table_pos);
  }
  if (auto n = count("seed", 0)) sampling.seed = static_cast<uint64_t>(*n);
  if (auto s = choice("scheduler", {"none", "asha"})) search.scheduler = *s;
  if (auto n = count("eta", 2)) search.eta = *n;
  if (auto n = count("min_epochs", 1)) search.min_epochs = *n;
  if (auto m = choice("metric", {"auto", "val_acc", "val_loss", "test_acc", "test_loss",
                                 "train_acc", "train_loss"}))
    search.metric = *m;
  for (const char* key : {"eta", "min_epochs", "metric"})
    if (t.get(key) != nullptr && !search.asha())
      diag.add(pos_of(t.get(key)->source(), table_pos), std::string("search.") + key,
               std::string(key) + " is a setting of the asha scheduler; set scheduler = "
                                  "\"asha\" or remove it");
}

void check_search(SearchConfig& search, const std::vector<TrialSpec>& trials, Pos at,
                  Diagnostics& diag) {
  if (!search.asha() || trials.empty()) return;
  size_t with_validation = 0;
  for (const TrialSpec& t : trials) {
    if (t.settings[key::validation] > 0) ++with_validation;
    if (t.settings[key::checkpoint] == "none") {
      diag.add(at, "search.scheduler",
               "asha resumes a promoted trial from its checkpoint, but trial " + t.label +
                   " has checkpoint = \"none\"; keep at least \"last\"");
      return;
    }
  }
  if (search.metric == "auto") {
    if (with_validation == trials.size()) {
      search.metric = "val_acc";
    } else if (with_validation == 0) {
      search.metric = "test_acc";
    } else {
      diag.add(at, "search.metric",
               "metric \"auto\" would rank some trials on validation and others on test (" +
                   std::to_string(with_validation) + " of " + std::to_string(trials.size()) +
                   " have a validation split): give every trial the same split, or set metric");
    }
  } else if ((search.metric == "val_acc" || search.metric == "val_loss") &&
             with_validation < trials.size()) {
    diag.add(at, "search.metric",
             "metric " + detail::quoted(search.metric) + " needs a validation split in every trial (" +
                 std::to_string(trials.size() - with_validation) + " have none): set validation");
  }
}

std::optional<Binding> sampled_binding(const SampledKey& k, const toml::node& distribution,
                                       const Sampling& sampling, Diagnostics& diag,
                                       const ValueReader& read) {
  if (k.in_zip) {
    diag.add(k.value_pos, k.path,
             "a distribution cannot be in a zip group: every sampled key of [sweep] is drawn "
             "together already ([search] samples points)");
    return std::nullopt;
  }
  SampledType type = SampledType::other;
  if (k.setting != nullptr && k.setting->type == SettingType::integer) type = SampledType::integer;
  if (k.setting != nullptr && k.setting->type == SettingType::number) type = SampledType::real;
  if (k.option != nullptr && k.option->default_value.index() == 1) type = SampledType::integer;
  if (k.option != nullptr && k.option->default_value.index() == 2) type = SampledType::real;
  auto draws = draw_samples(distribution, k.key, k.path, k.value_pos, type, sampling, diag);
  if (!draws) return std::nullopt;
  Binding b{k.key, k.path, k.value_pos, k.key_pos, 0, {}, {}, true};
  for (size_t i = 0; i < draws->size(); ++i) {
    auto v = read((*draws)[i], k.path + "[sample " + std::to_string(i) + "]", false);
    if (!v) return std::nullopt;
    b.points.push_back(*v);
  }
  return b;
}

}  // namespace dprun::detail
