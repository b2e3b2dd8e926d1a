// The table of settings: its rows are checked, values are checked by their row, a trial's
// settings survive the store and the trial record, the identity of today's trials is frozen and
// settings added later leave it alone, and the README documents exactly the table.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "later_settings.hpp"
#include "models/plugin_loader.hpp"
#include "settings/engine_options.hpp"
#include "settings/settings.hpp"
#include "sweep/sweep_runner.hpp"

using Catch::Matchers::Contains;
using dprun::Setting;
using dprun::SettingTable;
using dprun::SettingType;
using dprun::SettingValue;
using dprun::TrialSettings;
using settingstest::later_settings;

namespace {

std::string readme() {
  std::ifstream in(std::string(DPRUN_TEST_SOURCE_DIR) + "/README.md");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string why(const std::string& column, const SettingValue& v,
                const SettingTable& table = later_settings()) {
  const Setting* row = table.by_column(column);
  if (!row) row = table.by_key(column);
  REQUIRE(row);
  return dprun::check_setting_value(*row, v);
}

dprun::Experiment parse(const std::string& toml, const SettingTable& table) {
  static dprun::ModelCatalog catalog = [] {
    dprun::ModelCatalog c;
    for (const auto& [name, m] : dprun::scan_plugins({}).models) c.models[name] = m.factory;
    return c;
  }();
  dprun::ParseOptions options;
  options.settings = &table;
  return dprun::parse_experiment("t.toml", toml, catalog, options);
}

const std::string kHead = "[experiment]\nname = \"t\"\n[train]\nmodel = \"lenet\"\n";

}  // namespace

TEST_CASE("settings: the README's table is the table of settings", "[settings]") {
  const std::string expected = dprun::settings_markdown(dprun::builtin_settings());
  INFO("README.md should contain this table (dprun settings prints it):\n" << expected);
  CHECK(readme().find(expected) != std::string::npos);
  // One line per key of an experiment file.
  for (const std::string& key : dprun::builtin_settings().keys())
    CHECK(expected.find("| `" + key + "` |") != std::string::npos);
}

TEST_CASE("settings: a row that contradicts itself is refused", "[settings]") {
  auto refused = [](Setting row, const std::string& message) {
    std::vector<Setting> rows = dprun::builtin_settings().rows();
    rows.push_back(row);
    INFO(row.key << row.column);
    REQUIRE_THROWS_WITH(SettingTable(rows), Contains(message));
  };
  refused({.key = "gpus", .column = "gpus2", .help = "h"}, "the key is used twice");
  refused({.key = "x", .column = "bn_mode", .help = "h"}, "the column is used twice");
  refused({.key = "x", .applies_when = dprun::AppliesWhen{"epochs", {"1"}}, .help = "h"},
          "names no choice setting");
  refused({.key = "x", .applies_when = dprun::AppliesWhen{"optimizer", {"lamb"}}, .help = "h"},
          "\"lamb\" is not a choice of optimizer");
  refused({.column = "x", .applies_when = dprun::AppliesWhen{"optimizer", {"sgd"}}, .help = "h"},
          "needs a key");
  refused({.key = "x",
           .column = "x",
           .type = SettingType::number,
           .default_value = int64_t{1},
           .help = "h"},
          "the default is not a value of a number setting");
  refused({.key = "x",
           .column = "x",
           .default_value = int64_t{0},
           .range = dprun::at_least(1),
           .help = "h"},
          "must be at least 1");
  refused({.key = "x",
           .column = "x",
           .type = SettingType::choice,
           .default_value = std::string("c"),
           .choices = {"a", "b"},
           .help = "h"},
          "unknown value \"c\"");
  refused({.key = "x", .default_value = int64_t{0}, .identity = true, .help = "h"},
          "an identity setting must be recorded");
  refused({.key = "X", .column = "x", .help = "h"}, "the key must be");
  refused({.key = "x", .column = "x"}, "needs a help line");
  refused({.key = "x",
           .column = "x",
           .type = SettingType::numbers,
           .default_value = std::vector<double>{},
           .help = "h"},
          "needs a count");
  refused({.key = "x", .column = "x", .help = "h", .earlier_defaults = {{1, std::string("a")}}},
          "an earlier default is not a value of the setting's type");
  refused({.key = "x",
           .column = "x",
           .default_value = int64_t{1},
           .range = dprun::at_least(1),
           .help = "h",
           .earlier_defaults = {{1, int64_t{0}}}},
          "an earlier default is refused by the setting's own check: must be at least 1");
  refused({.key = "x",
           .column = "x",
           .help = "h",
           .earlier_defaults = {{dprun::kDefaultsGeneration, int64_t{3}}}},
          "earlier defaults must be of increasing generations before the current one");
  REQUIRE_THROWS_WITH(SettingTable(dprun::builtin_settings().rows(), 0),
                      Contains("defaults generation 0"));
}

TEST_CASE("settings: values are checked by their row", "[settings]") {
  CHECK(why("gpus", int64_t{2}).empty());
  CHECK(why("gpus", int64_t{0}) == "must be at least 1, got 0");
  CHECK(why("lr", 0.0) == "must be greater than 0, got 0");
  CHECK(why("momentum", 1.0) == "must be in [0, 1), got 1");
  CHECK(why("weight_decay", std::nan("")) == "must be a finite number, got nan");
  CHECK(why("layout", std::string("nwhc")) ==
        "unknown value \"nwhc\"; did you mean \"nhwc\"? (expected one of \"auto\", \"nchw\", "
        "\"nhwc\")");
  CHECK(why("bn_mode", std::string("sync")).empty());
  CHECK(why("bn_mode", std::string("synch")) ==
        "unknown value \"synch\"; did you mean \"sync\"? (expected one of \"per-replica\", "
        "\"sync\")");
  CHECK(why("betas", std::vector<double>{0.9, 0.99}).empty());
  CHECK(why("betas", std::vector<double>{0.9}) == "expected 2 numbers, got 1");
  CHECK(why("betas", std::vector<double>{0.9, 1.5}) == "each value must be in [0, 1), got 1.5");
  CHECK(why("nesterov", true).empty());
  CHECK(why("gpus", 2.0) == "expected a positive integer");
}

TEST_CASE("settings: an experiment file sets each type the table has", "[settings]") {
  const SettingTable& later = later_settings();
  auto ex = parse(kHead +
                      "grad_accum = 2\noptimizer = \"adamw\"\nbetas = [0.8, 0.9]\ncheckpoint = "
                      "\"best\"\n[sweep]\nseed = [1, 2]\n",
                  later);
  REQUIRE(ex.trials.size() == 2);
  const TrialSettings& s = ex.trials[0].settings;
  CHECK(s.integer("grad_accum") == 2);
  CHECK(s.numbers("betas") == std::vector<double>{0.8, 0.9});
  CHECK(s.text("checkpoint") == "best");
  auto sgd = parse(kHead + "momentum = 0.9\nnesterov = true\n", later);
  REQUIRE(sgd.trials.size() == 1);
  CHECK(sgd.trials[0].settings.boolean("nesterov"));

  // A list-valued setting: a list of numbers is one value, a list of such lists an axis.
  auto axis =
      parse(kHead + "optimizer = \"adamw\"\n[sweep]\nbetas = [[0.9, 0.999], [0.5, 0.9]]\n", later);
  REQUIRE(axis.trials.size() == 2);
  CHECK(axis.trials[1].settings.numbers("betas") == std::vector<double>{0.5, 0.9});
  CHECK(axis.trials[1].label == "betas=[0.5, 0.9]");
  auto fixed = parse(kHead + "optimizer = \"adamw\"\n[sweep]\nbetas = [0.5, 0.9]\n", later);
  REQUIRE(fixed.trials.size() == 1);
  CHECK(fixed.trials[0].settings.numbers("betas") == std::vector<double>{0.5, 0.9});

  // Errors name the place, as for every key.
  try {
    parse(kHead + "betas = [0.9, 2]\nnesterov = 1\ngrad_accum = 0\n", later);
    FAIL("expected errors");
  } catch (const dprun::ConfigErrors& e) {
    const std::string all = e.what();
    CHECK_THAT(all, Contains("t.toml:5:9: train.betas: each value must be in [0, 1), got 2"));
    CHECK_THAT(all, Contains("t.toml:6:12: train.nesterov: expected a boolean, got 1"));
    CHECK_THAT(all, Contains("t.toml:7:14: train.grad_accum: must be at least 1, got 0"));
  }
  // Today's dprun does not know the key: the usual error, with the known keys.
  try {
    parse(kHead + "grad_accum = 2\n", dprun::builtin_settings());
    FAIL("expected an error");
  } catch (const dprun::ConfigErrors& e) {
    CHECK_THAT(std::string(e.what()), Contains("train.grad_accum: unknown key"));
  }
}

TEST_CASE("settings: the keys given imply batch_size, per_gpu_batch and the scaled lr",
          "[settings]") {
  const auto& table = dprun::builtin_settings();
  TrialSettings s = dprun::settings_from_keys(table, {{"gpus", int64_t{4}},
                                                      {"per_gpu_batch", int64_t{96}},
                                                      {"lr", 0.1},
                                                      {"lr_scaling", std::string("linear")},
                                                      {"base_batch", int64_t{128}}});
  CHECK(s.integer("batch_size") == 384);
  CHECK(s.integer("per_gpu_batch") == 96);
  CHECK(s.number("lr") == Approx(0.3));
  TrialSettings odd = dprun::settings_from_keys(table, {{"gpus", int64_t{3}}});
  CHECK(odd.integer("batch_size") == 256);
  CHECK(odd.integer("per_gpu_batch") == 85);  // rounded down: a replica takes whole examples
  CHECK(odd.number("lr") == 0.1);
  CHECK_THROWS_AS(s.integer("lr"), std::logic_error);  // read as another type
  CHECK_THROWS_AS(s.set("gpus", 2.0), std::logic_error);
  CHECK_THROWS_AS(s.get("lr_scaling"), std::logic_error);  // an input, not recorded
}

TEST_CASE("settings: every type survives the store and the trial record", "[settings]") {
  const SettingTable& later = later_settings();
  TrialSettings s(later);
  s.set("model", std::string("lenet"));
  s.set("model_options", std::string(R"({"hidden":64})"));
  s.set("gpus", int64_t{4});
  s.set("lr", 0.30000000000000004);
  s.set("betas", std::vector<double>{0.5, 0.123456789012345678});
  s.set("nesterov", true);
  s.set("checkpoint", std::string("every"));

  const dps::SettingValues stored = dprun::to_store(s);
  CHECK(std::get<int64_t>(stored.at("nesterov")) == 1);  // SQLite has no boolean
  CHECK(std::holds_alternative<std::string>(stored.at("betas")));
  const TrialSettings back = dprun::settings_from_store(later, stored);
  const dprun::Json record = dprun::Json::parse(dprun::settings_to_json(s).dump());
  const TrialSettings sent = dprun::settings_from_json(record, later);
  for (size_t i = 0; i < later.recorded().size(); ++i) {
    INFO(later.recorded()[i]->column);
    CHECK(back.at(i) == s.at(i));
    CHECK(sent.at(i) == s.at(i));
  }

  // A database from before a setting existed reads as its default.
  dps::SettingValues old = stored;
  old.erase("grad_accum");
  old.erase("nesterov");
  const TrialSettings from_old = dprun::settings_from_store(later, old);
  CHECK(from_old.integer("grad_accum") == 1);
  CHECK_FALSE(from_old.boolean("nesterov"));

  // The record is strict: an unknown or missing member is an error that names it.
  dprun::Json extra = record;
  extra.set("warp", dprun::Json::integer(9));
  CHECK_THROWS_WITH(dprun::settings_from_json(extra, later), Contains("\"warp\""));
  CHECK_THROWS_WITH(dprun::settings_from_json(record, dprun::builtin_settings()),
                    Contains("unknown setting"));
}

TEST_CASE("identity: the canonical text of generation 1's defaults is that of dprun 0.1.0",
          "[settings][identity]") {
  // An experiment begun by dprun 0.1.0 (or any dprun before the defaults' generation 2) keeps
  // generation 1's defaults, so its trials keep the text, and the hash, they were stored with.
  TrialSettings s(dprun::builtin_settings().with_defaults(1));
  s.set("model", std::string("lenet"));
  s.set("data_path", std::string("/anywhere"));   // not identity
  s.set("backend_request", std::string("cuda"));  // not identity
  CHECK(dprun::canonical_settings(s) ==
        "dprun-trial-settings v1\n"
        "dataset=\"fashion-mnist\"\nmodel=\"lenet\"\nmodel_options={}\ngpus=1\nbatch_size=256\n"
        "per_gpu_batch=256\nlr=0.10000000000000001\nepochs=10\nseed=0\noptimizer=\"sgd\"\n"
        "momentum=0\nweight_decay=0\nprecision=\"fp32\"\nlayout=\"nchw\"\n"
        "bn_mode=\"per-replica\"\neval_batch_size=0\ntrain_limit=0\ntest_limit=0\n");
  CHECK(dprun::config_hash(s) == dps::sha256_hex(dprun::canonical_settings(s)));
}

TEST_CASE("identity: a setting added later enters the hash only when it is not its default",
          "[settings][identity]") {
  TrialSettings today;
  today.set("model", std::string("lenet"));
  today.set("gpus", int64_t{2});
  TrialSettings later(later_settings());
  later.set("model", std::string("lenet"));
  later.set("gpus", int64_t{2});
  CHECK(dprun::canonical_settings(later) == dprun::canonical_settings(today));
  CHECK(dprun::config_hash(later) == dprun::config_hash(today));

  // An identity setting away from its default: another trial. Written after today's settings.
  TrialSettings two = later;
  two.set("grad_accum", int64_t{2});
  CHECK(dprun::config_hash(two) != dprun::config_hash(today));
  // graphs = "auto" (generation 3's default, not its first) is in today's text too.
  CHECK_THAT(dprun::canonical_settings(two),
             Catch::EndsWith("test_limit=0\ngrad_accum=2\ngraphs=\"auto\"\n"));
  TrialSettings betas = later;
  betas.set("betas", std::vector<double>{0.5, 0.9});
  betas.set("nesterov", true);
  CHECK_THAT(dprun::canonical_settings(betas),
             Catch::EndsWith("betas=[0.5,0.90000000000000002]\ngraphs=\"auto\"\nnesterov=true\n"));

  // A setting outside the identity never changes it.
  TrialSettings best = later;
  best.set("checkpoint", std::string("best"));
  CHECK(dprun::config_hash(best) == dprun::config_hash(today));
}

TEST_CASE("defaults: a changed default is a new generation, earlier experiments keep theirs",
          "[settings][identity]") {
  const SettingTable& today = dprun::builtin_settings();
  CHECK(today.generation() == dprun::kDefaultsGeneration);
  CHECK(&today.with_defaults(dprun::kDefaultsGeneration) == &today);
  const SettingTable& first = today.with_defaults(1);
  CHECK(&today.with_defaults(1) == &first);  // made once
  CHECK(first.generation() == 1);
  CHECK(std::get<std::string>(today.by_key("layout")->default_value) == "auto");
  CHECK(std::get<std::string>(first.by_key("layout")->default_value) == "nchw");
  CHECK(std::get<std::string>(today.by_key("graphs")->default_value) == "auto");
  CHECK(std::get<bool>(first.by_key("graphs")->default_value) == false);
  // Generation 2 changed layout's default only, generation 3 graphs' only.
  const SettingTable& second = today.with_defaults(2);
  auto changed = [](const SettingTable& a, const SettingTable& b) {
    std::vector<std::string> columns;
    for (size_t i = 0; i < a.rows().size(); ++i)
      if (a.rows()[i].default_value != b.rows()[i].default_value)
        columns.push_back(a.rows()[i].column);
    return columns;
  };
  CHECK(changed(second, first) == std::vector<std::string>{"layout"});
  CHECK(changed(today, second) == std::vector<std::string>{"graphs"});
  // Another trial: today's default is not generation 1's, so the identity differs.
  TrialSettings now(today), then(first);
  now.set("model", std::string("lenet"));
  then.set("model", std::string("lenet"));
  CHECK(dprun::canonical_settings(now).find("layout=\"auto\"\n") != std::string::npos);
  CHECK(dprun::config_hash(now) != dprun::config_hash(then));
  // The store fills rows stored before a column existed with the first default, in every
  // generation.
  for (const SettingTable* t : {&today, &second, &first})
    for (const auto& c : t->store_columns()) {
      if (c.name == "layout") CHECK(std::get<std::string>(c.default_value) == "nchw");
      if (c.name == "graphs") CHECK(std::get<int64_t>(c.default_value) == 0);
    }
  // Generation 2's trials are generation 1's but for the layout: graphs = false, their first
  // default, stays out of the text, so no trial of an experiment begun then is new.
  TrialSettings before(second);
  before.set("model", std::string("lenet"));
  CHECK(dprun::canonical_settings(before).find("graphs") == std::string::npos);
  CHECK(dprun::canonical_settings(now).find("\ngraphs=\"auto\"\n") != std::string::npos);

  // A later setting (not one of 0.1.0's, which are always written) whose default changed:
  // its identity is measured from its first default, whatever the experiment's generation.
  std::vector<Setting> rows = today.rows();
  rows.push_back({.key = "x",
                  .column = "x",
                  .default_value = int64_t{2},
                  .identity = true,
                  .help = "h",
                  .earlier_defaults = {{1, int64_t{1}}}});
  const SettingTable with_x(rows);
  TrialSettings x_now(with_x), x_then(with_x.with_defaults(1));
  CHECK(x_now.integer("x") == 2);
  CHECK(x_then.integer("x") == 1);
  CHECK(dprun::canonical_settings(x_then).find("\nx=") == std::string::npos);
  CHECK_THAT(dprun::canonical_settings(x_now), Catch::EndsWith("\nx=2\n"));
  x_now.set("x", int64_t{1});
  CHECK(dprun::canonical_settings(x_now).find("\nx=") == std::string::npos);
  // A column the database lacks reads as the first default.
  CHECK(dprun::settings_from_store(with_x, {}).integer("x") == 1);
}

TEST_CASE("defaults: layout auto runs nhwc on CUDA with TF32 or bf16, else nchw", "[settings]") {
  TrialSettings s;
  s.set("model", std::string("lenet"));
  REQUIRE(s[dprun::key::layout] == "auto");
  CHECK(dprun::trial_layout(s, dp::BackendKind::cuda) == dp::Layout::nhwc);
  CHECK(dprun::trial_layout(s, dp::BackendKind::cpu) == dp::Layout::nchw);
  s.set("precision", std::string("bf16"));
  CHECK(dprun::trial_layout(s, dp::BackendKind::cuda) == dp::Layout::nhwc);
  CHECK(dprun::trial_layout(s, dp::BackendKind::cpu) == dp::Layout::nchw);
  // Strict fp32 has been measured in nchw only: it stays there.
  s.set("precision", std::string("fp32"));
  s.set("allow_tf32", false);
  CHECK(dprun::trial_layout(s, dp::BackendKind::cuda) == dp::Layout::nchw);
  s.set("allow_tf32", true);
  for (const char* given : {"nchw", "nhwc"}) {
    s.set("layout", std::string(given));
    for (const auto kind : {dp::BackendKind::cpu, dp::BackendKind::cuda})
      CHECK(dprun::trial_layout(s, kind) == dp::parse_layout(given));
    CHECK(dprun::trainer_options(s).layout == dp::parse_layout(given));
  }
}

TEST_CASE("defaults: graphs auto leaves the choice to the trainer, true and false do not",
          "[settings]") {
  TrialSettings s;
  s.set("model", std::string("lenet"));
  REQUIRE(s.get("graphs") == dprun::SettingValue(std::string("auto")));
  // The trainer decides, where it knows its replicas' GPUs (test_step_capture.cpp, and ctest
  // emulated_gpu_runner on CUDA).
  const dp::TrainerOptions automatic = dprun::trainer_options(s);
  CHECK(automatic.graphs_auto);
  CHECK_FALSE(automatic.graphs);
  for (const bool given : {false, true}) {
    s.set("graphs", given);
    const dp::TrainerOptions t = dprun::trainer_options(s);
    CHECK(t.graphs == given);
    CHECK_FALSE(t.graphs_auto);
  }
}

TEST_CASE("settings: a true, false or auto setting reads, checks, stores and sends each value",
          "[settings]") {
  const SettingTable& table = dprun::builtin_settings();
  const Setting& graphs = *table.by_key("graphs");
  REQUIRE(graphs.type == dprun::SettingType::boolean_auto);
  CHECK(dprun::type_text(graphs) == "bool | \"auto\"");
  CHECK(why("graphs", true, table).empty());
  CHECK(why("graphs", std::string("auto"), table).empty());
  CHECK(why("graphs", std::string("on"), table) ==
        "unknown value \"on\" (expected true, false or \"auto\")");
  CHECK(why("graphs", int64_t{1}, table) == "expected true, false or \"auto\"");
  CHECK(dprun::setting_from_text(graphs, "auto") == dprun::SettingValue(std::string("auto")));
  CHECK(dprun::setting_from_text(graphs, "false") == dprun::SettingValue(false));
  CHECK_THROWS_WITH(dprun::setting_from_text(graphs, "yes"), "expected true, false or \"auto\"");

  // From the file: a boolean or "auto", and the usual located errors.
  auto ex = parse(kHead + "[sweep]\ngraphs = [true, false, \"auto\"]\n", table);
  REQUIRE(ex.trials.size() == 3);
  CHECK(ex.trials[0].settings.get("graphs") == dprun::SettingValue(true));
  CHECK(ex.trials[1].settings.get("graphs") == dprun::SettingValue(false));
  CHECK(ex.trials[2].settings.get("graphs") == dprun::SettingValue(std::string("auto")));
  CHECK(ex.trials[2].label == "graphs=auto");
  try {
    parse(kHead + "graphs = \"yes\"\nepochs = 1\n[sweep]\nseed = [1]\n", table);
    FAIL("expected an error");
  } catch (const dprun::ConfigErrors& e) {
    CHECK_THAT(std::string(e.what()),
               Contains("t.toml:5:10: train.graphs: unknown value \"yes\" (expected true, false "
                        "or \"auto\")"));
  }
  try {
    parse(kHead + "graphs = 1\n", table);
    FAIL("expected an error");
  } catch (const dprun::ConfigErrors& e) {
    CHECK_THAT(std::string(e.what()),
               Contains("t.toml:5:10: train.graphs: expected true, false or \"auto\", got 1"));
  }

  // The store keeps a bool as an integer (as every boolean) and "auto" as its text; the trial
  // record as JSON's true, false or "auto".
  for (const dprun::SettingValue& v : {dprun::SettingValue(true), dprun::SettingValue(false),
                                       dprun::SettingValue(std::string("auto"))}) {
    TrialSettings t(table);
    t.set("model", std::string("lenet"));
    t.set("graphs", v);
    const dps::SettingValues stored = dprun::to_store(t);
    if (std::holds_alternative<bool>(v))
      CHECK(stored.at("graphs") == dps::SqlValue(int64_t{std::get<bool>(v) ? 1 : 0}));
    else
      CHECK(stored.at("graphs") == dps::SqlValue(std::string("auto")));
    CHECK(dprun::settings_from_store(table, stored).get("graphs") == v);
    const dprun::Json record = dprun::Json::parse(dprun::settings_to_json(t).dump());
    CHECK(dprun::settings_from_json(record, table).get("graphs") == v);
  }
  dps::SettingValues bad = dprun::to_store(TrialSettings(table));
  bad["graphs"] = std::string("on");
  CHECK_THROWS_WITH(dprun::settings_from_store(table, bad), Contains("stored setting graphs"));
  dprun::Json record = dprun::settings_to_json(TrialSettings(table));
  record.set("graphs", dprun::Json::string("on"));
  CHECK_THROWS_WITH(dprun::settings_from_json(record, table),
                    Contains("\"graphs\": expected true, false or \"auto\", got \"on\""));
}

TEST_CASE("filters: every recorded setting by column or key, with a hint", "[settings][cli]") {
  auto ex = parse(kHead + "bn = \"per-replica\"\ngrad_accum = 3\n", later_settings());
  const dprun::TrialSpec& spec = ex.trials.at(0);
  using F = std::vector<std::pair<std::string, std::string>>;
  CHECK(dprun::trial_matches(spec, F{{"grad_accum", "3"}}));
  CHECK(dprun::trial_matches(spec, F{{"bn", "per-replica"}}));
  CHECK(dprun::trial_matches(spec, F{{"bn_mode", "per-replica"}}));
  CHECK(dprun::trial_matches(spec, F{{"backend", "auto"}}));
  CHECK(dprun::trial_matches(spec, F{{"nesterov", "false"}}));
  CHECK_FALSE(dprun::trial_matches(spec, F{{"betas", "[0.5, 0.9]"}}));
  CHECK(dprun::trial_matches(spec, F{{"betas", "[0.9, 0.999]"}}));
  CHECK_THROWS_WITH(dprun::trial_matches(spec, F{{"proceses", "3"}}),
                    Contains("unknown setting \"proceses\"; did you mean processes?") &&
                        Contains("known: model, model_options, dataset, data_options, data_path, epochs"));
}

TEST_CASE("settings: the trainer's options come from the settings in one place", "[settings]") {
  dprun::TrialSettings s;
  s.set("model", std::string("lenet"));
  s.set("layout", std::string("nhwc"));
  s.set("bn_mode", std::string("sync"));
  s.set("optimizer", std::string("adamw"));
  s.set("betas", std::vector<double>{0.8, 0.95});
  s.set("eps", 1e-6);
  s.set("lr_schedule", std::string("step"));
  s.set("lr_step_epochs", int64_t{7});
  s.set("lr_gamma", 0.5);
  s.set("precision", std::string("bf16"));
  s.set("allow_tf32", false);
  s.set("conv_choice", std::string("heuristic"));
  s.set("graphs", true);
  s.set("batch_size", int64_t{96});
  s.set("epochs", int64_t{3});
  s.set("seed", int64_t{11});
  const dp::TrainerOptions t = dprun::trainer_options(s);
  CHECK(t.layout == dp::Layout::nhwc);
  CHECK(t.sync_bn);
  CHECK(t.optimizer.name == "adamw");
  CHECK(t.optimizer.beta1 == 0.8f);
  CHECK(t.optimizer.beta2 == 0.95f);
  CHECK(t.optimizer.eps == 1e-6f);
  CHECK(t.lr.kind == dp::LrSchedule::Kind::step);
  CHECK(t.lr.step_epochs == 7);
  CHECK(t.lr.gamma == 0.5);
  CHECK(t.precision == dp::Precision::bf16);
  CHECK_FALSE(t.allow_tf32);
  CHECK(t.conv_choice == dp::ConvChoice::heuristic);
  CHECK(t.graphs);
  CHECK(t.batch_size == 96);
  CHECK(t.epochs == 3);
  CHECK(t.seed == 11);
  CHECK(t.data_budget == 0);  // the default: no limit
  CHECK(t.augment.crop_padding == 0);
  CHECK_FALSE(t.augment.flip);
  CHECK(t.augment.mean.empty());
  {
    dprun::TrialSettings budget = s;
    budget.set("data_budget_mib", 1.5);
    CHECK(dprun::trainer_options(budget).data_budget == 1572864);
    budget.set("data_budget_mib", 1e-9);  // below a byte is still a budget, not "no limit"
    CHECK(dprun::trainer_options(budget).data_budget == 1);
    budget.set("augment_crop_padding", int64_t{4});
    budget.set("augment_flip", true);
    budget.set("augment_mean", std::vector<double>{0.5, 0.25});
    budget.set("augment_std", std::vector<double>{0.125, 2.0});
    const dp::TrainerOptions a = dprun::trainer_options(budget);
    CHECK(a.augment.crop_padding == 4);
    CHECK(a.augment.flip);
    CHECK(a.augment.mean == std::vector<float>{0.5f, 0.25f});
    CHECK(a.augment.std == std::vector<float>{0.125f, 2.0f});
  }
  // The table's choices are the engine's names, so a value the table accepts is one the engine
  // implements; anything else is refused by the engine's own parser, naming the value.
  std::vector<std::string> layouts{"auto"};  // resolved by trial_layout
  for (const std::string& name : dp::layout_names()) layouts.push_back(name);
  CHECK(dprun::builtin_settings().by_key("layout")->choices == layouts);
  CHECK(dprun::builtin_settings().by_key("precision")->choices == dp::precision_names());
  CHECK(dprun::builtin_settings().by_key("optimizer")->choices == dp::optimizer_names());
  CHECK(dprun::builtin_settings().by_key("lr_schedule")->choices == dp::schedule_kind_names());
  for (const auto& [column, value, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"layout", "nwhc", "the known layouts are nchw, nhwc"},
           {"precision", "fp16", "the known precisions are fp32, bf16"},
           {"bn_mode", "global", "expected per-replica or sync"},
           {"lr_schedule", "linear", "constant, step, cosine"}}) {
    dprun::TrialSettings bad = s;
    bad.set(column, value);
    INFO(column);
    CHECK_THROWS_WITH(dprun::trainer_options(bad), Contains(value) && Contains(message));
  }
}

namespace {

template <class T>
void check_key(const char* name, dprun::SettingKey<T> k) {
  INFO("key::" << name);
  CHECK(std::string(k.column) == name);
  const Setting* row = dprun::builtin_settings().by_column(k.column);
  REQUIRE(row != nullptr);
  CHECK(std::holds_alternative<T>(row->default_value));
  // The handle reads what the string-keyed accessors read.
  const dprun::TrialSettings s;
  CHECK(dprun::SettingValue(s[k]) == s.get(k.column));
}

}  // namespace

TEST_CASE("settings: every typed key names a recorded setting of its type", "[settings]") {
#define DPRUN_CHECK_SETTING_KEY(type, name) check_key<type>(#name, dprun::key::name);
  DPRUN_SETTING_KEYS(DPRUN_CHECK_SETTING_KEY)
#undef DPRUN_CHECK_SETTING_KEY
}
