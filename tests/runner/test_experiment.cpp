// Experiment files: parsing, validation messages (file:line:column, key, text), sweep expansion
// order, resolved settings and config hashes. A hand-made catalog stands in for the plugins.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "experiment/experiment.hpp"
#include "experiment_helpers.hpp"

namespace {

using dprun::ConfigError;
using dprun::ConfigErrors;
using dprun::Experiment;
using exptest::error_of;
using exptest::errors_of;
using exptest::kHead;
using exptest::parse;

std::string exact(double d) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  return buf;
}

const char* kExample = R"([experiment]
name = "scaling"
description = "d2l multi-GPU study"
database = "results/scaling.db"

[data]
dataset = "fashion-mnist"
path = "/usr/share/datasets/fashion-mnist"

[train]
epochs = 10
seed = 0

[sweep]
model = ["lenet", "resnet18"]

[[sweep.zip]]
gpus = [1, 2, 4]
batch_size = [256, 512, 1024]
lr = [0.1, 0.2, 0.4]
)";

}  // namespace

TEST_CASE("the design's example expands to 6 trials in file order", "[experiment]") {
  Experiment ex = parse(kExample);
  CHECK(ex.file == "t.toml");
  CHECK(ex.source == kExample);
  CHECK(ex.name == "scaling");
  CHECK(ex.description == "d2l multi-GPU study");
  CHECK(ex.database == "results/scaling.db");
  CHECK(ex.data_path == "/usr/share/datasets/fashion-mnist");
  REQUIRE(ex.trials.size() == 6);
  const char* models[] = {"lenet", "lenet", "lenet", "resnet18", "resnet18", "resnet18"};
  const int64_t gpus[] = {1, 2, 4, 1, 2, 4};
  const double lrs[] = {0.1, 0.2, 0.4, 0.1, 0.2, 0.4};
  for (size_t i = 0; i < 6; ++i) {
    const auto& t = ex.trials[i];
    INFO("trial " << i);
    CHECK(t.ordinal == static_cast<int64_t>(i));
    CHECK(t.settings.text("model") == models[i]);
    CHECK(t.settings.integer("gpus") == gpus[i]);
    CHECK(t.settings.integer("batch_size") == 256 * gpus[i]);
    CHECK(t.settings.integer("per_gpu_batch") == 256);
    CHECK(t.settings.number("lr") == lrs[i]);
    CHECK(t.settings.integer("epochs") == 10);
    CHECK(t.settings.integer("seed") == 0);
    CHECK(t.settings.text("dataset") == "fashion-mnist");
    CHECK(t.settings.text("data_path") == "/usr/share/datasets/fashion-mnist");
    CHECK(t.settings.text("optimizer") == "sgd");
    CHECK(t.settings.number("momentum") == 0.0);
    CHECK(t.settings.number("weight_decay") == 0.0);
    CHECK(t.settings.text("precision") == "fp32");
    CHECK(t.settings.text("layout") == "auto");
    CHECK(t.settings.text("bn_mode") == "per-replica");
    CHECK(t.settings.integer("eval_batch_size") == 0);
    CHECK(t.settings.integer("train_limit") == 0);
    CHECK(t.settings.integer("test_limit") == 0);
    CHECK(t.settings.text("backend_request") == "auto");
    CHECK(t.config_hash.size() == 64);
    CHECK(t.config_hash == dprun::config_hash(t.settings));
    CHECK(t.canonical == dprun::canonical_settings(t.settings));
  }
  CHECK(ex.trials[0].label == "model=lenet gpus=1 batch_size=256 lr=0.1");
  CHECK(ex.trials[4].label == "model=resnet18 gpus=2 batch_size=512 lr=0.2");
  CHECK(ex.trials[0].settings.text("model_options") ==
        "{\"hidden\":128,\"init_std\":" + exact(0.01) + ",\"pool\":\"avg\"}");
  CHECK(ex.trials[3].settings.text("model_options") == "{\"width\":64}");
  CHECK(std::get<int64_t>(ex.trials[0].model_options.at("hidden")) == 128);
  CHECK(std::get<std::string>(ex.trials[0].model_options.at("pool")) == "avg");
  CHECK(ex.trials[3].model_options.size() == 1);
  for (size_t i = 0; i < 6; ++i)
    for (size_t j = i + 1; j < 6; ++j) CHECK(ex.trials[i].config_hash != ex.trials[j].config_hash);
}

TEST_CASE("axes follow the file's order, not the keys' alphabetical order", "[experiment]") {
  // lr is written before gpus, so lr is the outer axis; the zip group comes last.
  auto ex = parse(kHead + R"([train]
model = "lenet"
[sweep]
lr = [0.1, 0.2]
gpus = [1, 2]
[[sweep.zip]]
seed = [5, 6]
epochs = [1, 2]
)");
  REQUIRE(ex.trials.size() == 8);
  CHECK(ex.trials[0].label == "lr=0.1 gpus=1 seed=5 epochs=1");
  CHECK(ex.trials[1].label == "lr=0.1 gpus=1 seed=6 epochs=2");
  CHECK(ex.trials[2].label == "lr=0.1 gpus=2 seed=5 epochs=1");
  CHECK(ex.trials[7].label == "lr=0.2 gpus=2 seed=6 epochs=2");
  CHECK(ex.trials[7].settings.integer("seed") == 6);
  CHECK(ex.trials[7].settings.integer("epochs") == 2);

  // An inline zip written first is the outermost axis.
  auto inline_zip = parse(kHead + R"([train]
model = "lenet"
[sweep]
zip = [{gpus = [1, 2], batch_size = [8, 16]}]
seed = [0, 1, 2]
)");
  REQUIRE(inline_zip.trials.size() == 6);
  CHECK(inline_zip.trials[0].label == "gpus=1 batch_size=8 seed=0");
  CHECK(inline_zip.trials[3].label == "gpus=2 batch_size=16 seed=0");
}

TEST_CASE("a scalar in [sweep] overrides [train], [train] holds the defaults", "[experiment]") {
  auto ex = parse(kHead + R"([train]
model = "lenet"
epochs = 3
lr = 0.5
momentum = 0.9
weight_decay = 0.0005
layout = "nhwc"
bn = "per-replica"
eval_batch_size = 1000
train_limit = 512
test_limit = 256
backend = "cpu"
[sweep]
epochs = 7
)");
  REQUIRE(ex.trials.size() == 1);
  const auto& s = ex.trials[0].settings;
  CHECK(s.integer("epochs") == 7);
  CHECK(s.number("lr") == 0.5);
  CHECK(s.number("momentum") == 0.9);
  CHECK(s.number("weight_decay") == 0.0005);
  CHECK(s.text("layout") == "nhwc");
  CHECK(s.text("bn_mode") == "per-replica");
  CHECK(s.integer("eval_batch_size") == 1000);
  CHECK(s.integer("train_limit") == 512);
  CHECK(s.integer("test_limit") == 256);
  CHECK(s.text("backend_request") == "cpu");
  CHECK(s.integer("batch_size") == 256);
  CHECK(ex.trials[0].label.empty());
  CHECK(ex.database.empty());
  CHECK(ex.data_path.empty());
}

TEST_CASE("per_gpu_batch sets the global batch from the GPU count", "[experiment]") {
  auto ex = parse(kHead + R"([train]
model = "lenet"
per_gpu_batch = 128
[sweep]
gpus = [1, 2, 4]
)");
  REQUIRE(ex.trials.size() == 3);
  CHECK(ex.trials[0].settings.integer("batch_size") == 128);
  CHECK(ex.trials[1].settings.integer("batch_size") == 256);
  CHECK(ex.trials[2].settings.integer("batch_size") == 512);
  CHECK(ex.trials[2].settings.integer("per_gpu_batch") == 128);

  // A batch that does not divide: per_gpu_batch is rounded down.
  auto odd = parse(kHead + "[train]\nmodel = \"lenet\"\ngpus = 4\nbatch_size = 10\n");
  CHECK(odd.trials[0].settings.integer("per_gpu_batch") == 2);

  auto e = error_of(kHead + R"([train]
model = "lenet"
batch_size = 256
[sweep]
per_gpu_batch = [64, 128]
)");
  CHECK(e.line() == 7);
  CHECK(e.column() == 1);
  CHECK(e.key() == "sweep.per_gpu_batch");
  CHECK(std::string(e.what()) ==
        "t.toml:7:1: sweep.per_gpu_batch: give either batch_size or per_gpu_batch, not both "
        "(batch_size is set at train.batch_size, line 5)");
}

TEST_CASE("linear lr scaling multiplies lr by batch_size / base_batch", "[experiment]") {
  auto ex = parse(kHead + R"([train]
model = "lenet"
lr = 0.1
lr_scaling = "linear"
[[sweep.zip]]
gpus = [1, 2, 4]
batch_size = [256, 512, 1024]
)");
  REQUIRE(ex.trials.size() == 3);
  CHECK(ex.trials[0].settings.number("lr") == Approx(0.1));
  CHECK(ex.trials[1].settings.number("lr") == Approx(0.2));
  CHECK(ex.trials[2].settings.number("lr") == Approx(0.4));
  // The label shows the learning rate the trial runs with.
  CHECK(ex.trials[1].label == "gpus=2 batch_size=512 lr=0.2");
  auto odd = parse(kHead +
                   "[train]\nmodel = \"lenet\"\nlr_scaling = \"linear\"\n[sweep]\n"
                   "batch_size = [768]\n");
  CHECK(odd.trials[0].label == "batch_size=768 lr=0.3");

  auto base = parse(kHead + R"([train]
model = "lenet"
lr = 0.1
lr_scaling = "linear"
base_batch = 128
batch_size = 512
)");
  CHECK(base.trials[0].settings.number("lr") == Approx(0.4));

  auto none = parse(kHead + "[train]\nmodel = \"lenet\"\nlr = 0.1\nbatch_size = 512\n");
  CHECK(none.trials[0].settings.number("lr") == 0.1);
}

TEST_CASE("seeds can be an axis", "[experiment]") {
  auto ex = parse(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\nseed = [0, 1, 2]\n");
  REQUIRE(ex.trials.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(ex.trials[i].settings.integer("seed") == i);
    CHECK(ex.trials[i].label == "seed=" + std::to_string(i));
  }
  CHECK(ex.trials[0].config_hash != ex.trials[1].config_hash);
}

TEST_CASE("model options: [model.<name>] tables, defaults and option axes", "[experiment]") {
  auto ex = parse(kHead + R"([sweep]
model = ["lenet", "resnet18"]
"model.lenet.hidden" = [64, 256]
[model.lenet]
pool = "max"
init_std = 1
[model.resnet18]
width = 32
)");
  // The option axis only applies to LeNet: ResNet-18 runs once.
  REQUIRE(ex.trials.size() == 3);
  CHECK(ex.trials[0].label == "model=lenet model.lenet.hidden=64");
  CHECK(ex.trials[1].label == "model=lenet model.lenet.hidden=256");
  CHECK(ex.trials[2].label == "model=resnet18");
  CHECK(ex.trials[2].ordinal == 2);
  CHECK(ex.trials[0].settings.text("model_options") ==
        "{\"hidden\":64,\"init_std\":1,\"pool\":\"max\"}");
  CHECK(std::get<double>(ex.trials[0].model_options.at("init_std")) == 1.0);
  CHECK(ex.trials[2].settings.text("model_options") == "{\"width\":32}");
}

TEST_CASE("canonical settings: hash stable, sensitive to every setting that matters",
          "[experiment]") {
  const std::string a = R"([experiment]
name = "a"
description = "one"
[data]
path = "/data/one"
[train]
model = "lenet"
lr = 0.1
gpus = 2
seed = 3
backend = "cpu"
)";
  // The same settings written in another order, with another description, data path, backend.
  const std::string b = R"([train]
backend = "cuda"
seed = 3
gpus = 2
lr = 0.1
model = "lenet"
[data]
path = "/elsewhere"
[experiment]
description = "two"
name = "a"
)";
  auto ha = parse(a).trials.at(0).config_hash;
  CHECK(parse(b).trials.at(0).config_hash == ha);
  // Writing a default explicitly changes nothing.
  CHECK(parse(a + "momentum = 0\n").trials.at(0).config_hash == ha);
  CHECK(parse(a + "[model.lenet]\nhidden = 128\n").trials.at(0).config_hash == ha);
  // Every setting that changes the result changes the hash.
  for (const char* change : {"momentum = 0.5\n", "epochs = 11\n", "weight_decay = 0.1\n",
                             "layout = \"nhwc\"\n", "eval_batch_size = 64\n", "train_limit = 100\n",
                             "test_limit = 100\n", "batch_size = 128\n"}) {
    INFO(change);
    CHECK(parse(a + change).trials.at(0).config_hash != ha);
  }
  CHECK(parse(a + "[model.lenet]\nhidden = 64\n").trials.at(0).config_hash != ha);
}

TEST_CASE("canonical settings name every setting and escape strings", "[experiment]") {
  dprun::TrialSettings s;
  s.set("model", std::string("lenet"));
  s.set("lr", 0.1);
  s.set("data_path", std::string("/somewhere"));
  s.set("backend_request", std::string("cuda"));
  std::string c = dprun::canonical_settings(s);
  CHECK(c.rfind("dprun-trial-settings v1\n", 0) == 0);
  CHECK(c.find("lr=" + exact(0.1) + "\n") != std::string::npos);
  CHECK(c.find("model=\"lenet\"\n") != std::string::npos);
  CHECK(c.find("somewhere") == std::string::npos);
  CHECK(c.find("cuda") == std::string::npos);
  for (const char* key : {"dataset=", "model_options=", "gpus=", "batch_size=", "epochs=", "seed=",
                          "optimizer=", "momentum=", "weight_decay=", "precision=", "layout=",
                          "bn_mode=", "eval_batch_size=", "train_limit=", "test_limit="}) {
    CHECK(c.find(std::string("\n") + key) != std::string::npos);
  }
  auto ex = parse(kHead + "[train]\nmodel = \"lenet\"\n[model.lenet]\npool = \"a\\\"b\\\\c\"\n");
  CHECK(ex.trials[0].settings.text("model_options") ==
        "{\"hidden\":128,\"init_std\":" + exact(0.01) + ",\"pool\":\"a\\\"b\\\\c\"}");
}

TEST_CASE("error: the zip lists of one group must have equal lengths", "[experiment]") {
  auto e = error_of(kHead + R"([train]
model = "lenet"
[[sweep.zip]]
gpus = [1, 2, 4]
batch_size = [256, 512]
)");
  CHECK(std::string(e.what()) ==
        "t.toml:7:14: sweep.zip[0].batch_size: the lists of one zip group must have the same "
        "length: gpus has 3 values, batch_size has 2");
  CHECK(e.file() == "t.toml");
  CHECK(e.line() == 7);
  CHECK(e.column() == 14);
  CHECK(e.key() == "sweep.zip[0].batch_size");

  auto scalar = error_of(kHead + "[train]\nmodel = \"lenet\"\n[[sweep.zip]]\ngpus = 2\n");
  CHECK(std::string(scalar.what()) ==
        "t.toml:6:8: sweep.zip[0].gpus: expected a list of positive integers (the lists of one "
        "zip group advance together), got 2");
}

TEST_CASE("error: a key may be swept in one place only", "[experiment]") {
  auto e = error_of(kHead + R"([train]
model = "lenet"
[sweep]
gpus = [1, 2]
[[sweep.zip]]
gpus = [1, 2]
lr = [0.1, 0.2]
)");
  CHECK(std::string(e.what()) ==
        "t.toml:8:1: sweep.zip[0].gpus: gpus is already set in the sweep at sweep.gpus (line 6); "
        "a key may appear in only one place of the sweep");
}

TEST_CASE("error: wrong types name the key, the expected type and the value", "[experiment]") {
  auto e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\ngpus = \"two\"\n");
  CHECK(std::string(e.what()) ==
        "t.toml:6:8: sweep.gpus: expected a list of positive integers, got \"two\"");

  auto elem = error_of(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\ngpus = [1, \"two\"]\n");
  CHECK(std::string(elem.what()) ==
        "t.toml:6:12: sweep.gpus[1]: expected a positive integer, got \"two\"");

  auto train = error_of(kHead + "[train]\nmodel = \"lenet\"\nlr = \"fast\"\n");
  CHECK(std::string(train.what()) == "t.toml:5:6: train.lr: expected a number, got \"fast\"");

  auto name = error_of("[experiment]\nname = 3\n[train]\nmodel = \"lenet\"\n");
  CHECK(std::string(name.what()) == "t.toml:2:8: experiment.name: expected a string, got 3");

  auto section = error_of("data = 3\n" + kHead + "[train]\nmodel = \"lenet\"\n");
  CHECK(std::string(section.what()) == "t.toml:1:8: data: expected a table [data], got 3");

  auto model_table = error_of(kHead + "[sweep]\nmodel.lenet.hidden = [1, 2]\n");
  CHECK(model_table.key() == "sweep.model");
  CHECK(std::string(model_table.what()).find("quote the key: \"model.lenet.hidden\"") !=
        std::string::npos);
}

TEST_CASE("error: values out of range", "[experiment]") {
  struct Case {
    const char* line;
    const char* message;
  };
  const Case cases[] = {
      {"gpus = 0", "t.toml:5:8: train.gpus: must be at least 1, got 0"},
      {"epochs = 0", "t.toml:5:10: train.epochs: must be at least 1, got 0"},
      {"batch_size = -1", "t.toml:5:14: train.batch_size: must be at least 1, got -1"},
      {"lr = 0", "t.toml:5:6: train.lr: must be greater than 0, got 0"},
      {"lr = -0.5", "t.toml:5:6: train.lr: must be greater than 0, got -0.5"},
      {"lr = inf", "t.toml:5:6: train.lr: must be a finite number, got inf"},
      {"momentum = 1.0", "t.toml:5:12: train.momentum: must be in [0, 1), got 1"},
      {"weight_decay = -0.1", "t.toml:5:16: train.weight_decay: must be at least 0, got -0.1"},
      {"train_limit = -1", "t.toml:5:15: train.train_limit: must be at least 0, got -1"},
      {"test_limit = -1", "t.toml:5:14: train.test_limit: must be at least 0, got -1"},
      {"seed = -1", "t.toml:5:8: train.seed: must be at least 0, got -1"},
      {"optimizer = \"adam\"",
       "t.toml:5:13: train.optimizer: unknown value \"adam\"; did you mean \"adamw\"? (expected "
       "one of \"sgd\", \"adamw\")"},
      {"precision = \"fp16\"",
       "t.toml:5:13: train.precision: unknown value \"fp16\"; did you mean \"fp32\"? (expected "
       "one of \"fp32\", \"bf16\")"},
      {"bn = \"synch\"",
       "t.toml:5:6: train.bn: unknown value \"synch\"; did you mean \"sync\"? (expected one of "
       "\"per-replica\", \"sync\")"},
      {"layout = \"nwhc\"",
       "t.toml:5:10: train.layout: unknown value \"nwhc\"; did you mean \"nhwc\"? (expected one "
       "of \"auto\", \"nchw\", \"nhwc\")"},
      {"lr_scaling = \"sqrt\"",
       "t.toml:5:14: train.lr_scaling: unknown value \"sqrt\" (expected one of \"none\", "
       "\"linear\")"},
  };
  for (const auto& c : cases) {
    auto e = error_of(kHead + "[train]\nmodel = \"lenet\"\n" + c.line + "\n");
    CHECK(std::string(e.what()) == c.message);
  }
}

TEST_CASE("error: an optimizer or schedule key the trial does not use", "[experiment]") {
  // Given but meaningless for this trial's optimizer or schedule: a mistake, never ignored.
  struct Case {
    const char* lines;
    const char* message;
  };
  const Case cases[] = {
      {"betas = [0.9, 0.99]",
       "t.toml:5:9: train.betas: betas applies to optimizer = \"adamw\"; this trial's optimizer is "
       "\"sgd\" (its own keys: momentum, nesterov)"},
      {"optimizer = \"adamw\"\nmomentum = 0.9",
       "t.toml:6:12: train.momentum: momentum applies to optimizer = \"sgd\"; this trial's "
       "optimizer is \"adamw\" (its own keys: betas, eps)"},
      {"nesterov = true",
       "t.toml:5:12: train.nesterov: nesterov = true needs momentum > 0 (as PyTorch's SGD)"},
      {"lr_gamma = 0.5",
       "t.toml:5:12: train.lr_gamma: lr_gamma applies to lr_schedule = \"step\"; this trial's "
       "lr_schedule is \"constant\""},
      {"epochs = 2\nwarmup_epochs = 3",
       "t.toml:6:17: train.warmup_epochs: warmup_epochs 3 is longer than the training (2 epochs)"},
      {"lr_gamma = 1.5", "t.toml:5:12: train.lr_gamma: must be in (0, 1], got 1.5"},
  };
  for (const auto& c : cases) {
    INFO(c.lines);
    auto e = error_of(kHead + "[train]\nmodel = \"lenet\"\n" + c.lines + "\n");
    CHECK(std::string(e.what()) == c.message);
  }
  // The same keys where they apply are fine.
  const auto ok = parse(kHead +
                        "[train]\nmodel = \"lenet\"\noptimizer = \"adamw\"\nbetas = "
                        "[0.8, 0.99]\neps = 1e-6\nlr_schedule = \"step\"\nlr_gamma = "
                        "0.5\nlr_step_epochs = 2\nwarmup_epochs = 0.5\n");
  REQUIRE(ok.trials.size() == 1);
  CHECK(ok.trials[0].settings.text("lr_schedule") == "step");
}

TEST_CASE("error: batch_size smaller than gpus is found per trial", "[experiment]") {
  auto e = error_of(kHead + R"([train]
model = "lenet"
batch_size = 2
[sweep]
gpus = [1, 2, 4]
)");
  CHECK(std::string(e.what()) ==
        "t.toml:5:14: train.batch_size: batch_size 2 is smaller than gpus 4 (sweep.gpus[2]): every "
        "GPU needs at least one example per batch");
}

TEST_CASE("error: unknown sections, keys, models, options and datasets", "[experiment]") {
  auto section = error_of(kHead + "[train]\nmodel = \"lenet\"\n[trian]\nepochs = 1\n");
  CHECK(std::string(section.what()) ==
        "t.toml:5:2: trian: unknown section; did you mean \"train\"? (known sections: "
        "experiment, data, train, model, search, sweep, launch)");

  auto key = error_of(kHead + "[train]\nmodel = \"lenet\"\nlr_scale = \"linear\"\n");
  CHECK(key.line() == 5);
  CHECK(key.column() == 1);
  CHECK(key.key() == "train.lr_scale");
  CHECK(
      std::string(key.what())
          .rfind(
              "t.toml:5:1: train.lr_scale: unknown key; did you mean \"lr_scaling\"? (known keys: "
              "model, epochs, seed, gpus,",
              0) == 0);

  auto exkey = error_of(kHead + "databse = \"x.db\"\n[train]\nmodel = \"lenet\"\n");
  CHECK(std::string(exkey.what()) ==
        "t.toml:3:1: experiment.databse: unknown key; did you mean \"database\"? (known keys: "
        "name, description, database)");

  auto model = error_of(kHead + "[train]\nmodel = \"lenett\"\n");
  CHECK(std::string(model.what()) ==
        "t.toml:4:9: train.model: unknown model \"lenett\"; did you mean \"lenet\"? (known "
        "models: lenet, resnet18)");

  auto swept = error_of(kHead + "[sweep]\nmodel = [\"lenet\", \"vgg\"]\n");
  CHECK(std::string(swept.what()) ==
        "t.toml:4:19: sweep.model[1]: unknown model \"vgg\" (known models: lenet, resnet18)");

  auto table = error_of(kHead + "[train]\nmodel = \"lenet\"\n[model.vgg16]\nwidth = 3\n");
  CHECK(std::string(table.what()) ==
        "t.toml:5:1: model.vgg16: unknown model \"vgg16\" (known models: lenet, resnet18)");

  auto option = error_of(kHead + "[train]\nmodel = \"lenet\"\n[model.lenet]\nhiden = 3\n");
  CHECK(std::string(option.what()) ==
        "t.toml:6:1: model.lenet.hiden: unknown option \"hiden\" of model lenet; did you mean "
        "\"hidden\"? (known options: hidden: int = 128, pool: string = \"avg\", init_std: float "
        "= 0.01)");

  auto type = error_of(kHead + "[train]\nmodel = \"lenet\"\n[model.lenet]\nhidden = 1.5\n");
  CHECK(std::string(type.what()) ==
        "t.toml:6:10: model.lenet.hidden: expected an integer (option hidden of model lenet is "
        "int), got 1.5");

  auto axis = error_of(kHead +
                       "[train]\nmodel = \"lenet\"\n[sweep]\n\"model.lenet.pool\" = "
                       "[\"avg\", 3]\n");
  CHECK(std::string(axis.what()) ==
        "t.toml:6:30: sweep.model.lenet.pool[1]: expected a string (option pool of model lenet "
        "is string), got 3");

  auto unused = error_of(kHead +
                         "[train]\nmodel = \"lenet\"\n[sweep]\n\"model.resnet18.width\" "
                         "= [32, 64]\n");
  CHECK(unused.key() == "sweep.model.resnet18.width");
  CHECK(std::string(unused.what()).find("no trial uses model resnet18") != std::string::npos);

  auto dataset = error_of(kHead + "[data]\ndataset = \"imagenet\"\n[train]\nmodel = \"lenet\"\n");
  CHECK(std::string(dataset.what()) ==
        "t.toml:4:11: data.dataset: unknown dataset \"imagenet\" (known datasets: arrays, cifar10, "
        "fashion-mnist, mnist)");

  auto sweep_key = error_of(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\ngpu = [1, 2]\n");
  CHECK(sweep_key.key() == "sweep.gpu");
  CHECK(std::string(sweep_key.what()).find("unknown key; did you mean \"gpus\"?") !=
        std::string::npos);
}

TEST_CASE("error: missing name and model", "[experiment]") {
  auto no_model = error_of(kHead + "[train]\nepochs = 1\n");
  CHECK(std::string(no_model.what()) ==
        "t.toml:3:1: train.model: no model given: set model = \"...\" in [train] or model = "
        "[...] in [sweep]; known models: lenet, resnet18");

  auto no_table = error_of("[train]\nmodel = \"lenet\"\n");
  CHECK(no_table.line() == 1);
  CHECK(no_table.column() == 1);
  CHECK(no_table.key() == "experiment.name");

  auto no_name = error_of("[experiment]\ndescription = \"x\"\n[train]\nmodel = \"lenet\"\n");
  CHECK(no_name.line() == 1);
  CHECK(no_name.key() == "experiment.name");
  CHECK(std::string(no_name.what()).find("missing") != std::string::npos);

  auto empty = error_of("[experiment]\nname = \"\"\n[train]\nmodel = \"lenet\"\n");
  CHECK(std::string(empty.what()) == "t.toml:2:8: experiment.name: must not be empty");
}

TEST_CASE("error: a name that cannot be the default database file", "[experiment]") {
  // results/NAME.db: "../../x" would put the database outside results/, a newline garbles it.
  for (const char* bad : {"../../escape", "a/b", "a\\\\b", "..", "a\\nb", "tab\\there"}) {
    INFO(bad);
    auto e =
        error_of(std::string("[experiment]\nname = \"") + bad + "\"\n[train]\nmodel = \"lenet\"\n");
    CHECK(e.line() == 2);
    CHECK(e.key() == "experiment.name");
    CHECK(std::string(e.what()).find("results/NAME.db") != std::string::npos);
  }
  // Unicode, spaces and dots are fine.
  for (const char* good : {"ünï cødé 😀", "lenet v1.2", "a-b_c"}) {
    INFO(good);
    CHECK(parse(std::string("[experiment]\nname = \"") + good + "\"\n[train]\nmodel = \"lenet\"\n")
              .name == good);
  }
}

TEST_CASE("every error of a file is reported, in file order", "[experiment]") {
  auto errors = errors_of(R"([experiment]
name = "x"
[train]
gpus = 0
lr = -1
layout = "nhcw"
[sweep]
seed = ["a"]
)");
  REQUIRE(errors.size() == 5);
  CHECK(errors[0].key() == "train.model");  // at [train], line 3
  CHECK(errors[1].key() == "train.gpus");
  CHECK(errors[2].key() == "train.lr");
  CHECK(errors[3].key() == "train.layout");
  CHECK(errors[4].key() == "sweep.seed[0]");
  try {
    parse("[experiment]\nname = \"x\"\n[train]\ngpus = 0\nlr = -1\n");
    FAIL("no error");
  } catch (const ConfigErrors& e) {
    // what() joins the messages one per line.
    CHECK(std::string(e.what()) == std::string(e.errors()[0].what()) + "\n" + e.errors()[1].what() +
                                       "\n" + e.errors()[2].what());
  }
}

TEST_CASE("error: TOML syntax errors give their position", "[experiment]") {
  auto e = error_of("[experiment]\nname = \"x\"\n[train]\nlr = = 0.1\n");
  CHECK(e.line() == 4);
  CHECK(e.column() == 6);
  CHECK(e.key().empty());
  CHECK(std::string(e.what()).rfind("t.toml:4:6: TOML syntax error: ", 0) == 0);
}

TEST_CASE("more than 1000 trials needs force", "[experiment]") {
  std::string seeds, lrs;
  for (int i = 0; i < 40; ++i) seeds += (i ? ", " : "") + std::to_string(i);
  for (int i = 1; i <= 30; ++i) lrs += (i > 1 ? ", " : "") + std::to_string(i) + ".0";
  std::string text =
      kHead + "[train]\nmodel = \"lenet\"\n[sweep]\nseed = [" + seeds + "]\nlr = [" + lrs + "]\n";
  auto e = error_of(text);
  CHECK(std::string(e.what()) ==
        "t.toml:5:1: sweep: sweep expands to 1200 trials; pass --force to run more than 1000");
  dprun::ParseOptions force;
  force.force = true;
  auto ex = parse(text, force);
  REQUIRE(ex.trials.size() == 1200);
  CHECK(ex.trials[1199].ordinal == 1199);
  CHECK(ex.trials[1199].settings.integer("seed") == 39);
  CHECK(ex.trials[1199].settings.number("lr") == 30.0);
}

TEST_CASE("the experiment files of the repository parse", "[experiment]") {
  const std::string dir = std::string(DPRUN_TEST_SOURCE_DIR) + "/experiments/";
  auto quick = dprun::load_experiment(dir + "quickstart.toml", exptest::fake_catalog());
  CHECK(quick.name == "quickstart");
  CHECK(quick.database == "results/quickstart.db");
  REQUIRE(quick.trials.size() == 2);
  CHECK(quick.trials[0].settings.text("model") == "lenet");
  CHECK(quick.trials[1].settings.integer("gpus") == 2);
  CHECK(quick.trials[1].settings.integer("batch_size") == 256);
  CHECK(quick.trials[1].settings.number("lr") == 0.2);
  CHECK(quick.trials[1].settings.integer("epochs") == 2);

  auto scaling = dprun::load_experiment(dir + "scaling.toml", exptest::fake_catalog());
  CHECK(scaling.name == "scaling");
  CHECK(scaling.database == "results/scaling.db");
  REQUIRE(scaling.trials.size() == 4);
  const char* models[] = {"lenet", "lenet", "resnet18", "resnet18"};
  const int64_t gpus[] = {1, 2, 1, 2};
  const double lrs[] = {0.2, 0.4, 0.1, 0.2};
  for (int i = 0; i < 4; ++i) {
    INFO("trial " << i);
    CHECK(scaling.trials[i].settings.text("model") == models[i]);
    CHECK(scaling.trials[i].settings.integer("gpus") == gpus[i]);
    CHECK(scaling.trials[i].settings.integer("batch_size") == 256 * gpus[i]);
    CHECK(scaling.trials[i].settings.number("lr") == Approx(lrs[i]));
    CHECK(scaling.trials[i].settings.integer("epochs") == 10);
  }
  CHECK(scaling.trials[1].label == "model=lenet lr=0.4 gpus=2 batch_size=512");

  // lr-scaling: 3 lrs x 3 replica counts x 2 warm-ups; 64 examples per replica and the lr
  // scaled linearly from a base batch of 64.
  auto lr = dprun::load_experiment(dir + "lr-scaling.toml", exptest::fake_catalog());
  CHECK(lr.name == "lr-scaling");
  CHECK(lr.database == "results/lr-scaling.db");
  REQUIRE(lr.trials.size() == 18);
  for (const auto& t : lr.trials) {
    INFO(t.label);
    const int64_t g = t.settings.integer("gpus");
    CHECK((g == 1 || g == 2 || g == 4));
    CHECK(t.settings.integer("batch_size") == 64 * g);
    CHECK(t.settings.integer("epochs") == 4);
    const double per_64 = t.settings.number("lr") / static_cast<double>(g);
    CHECK((per_64 == Approx(0.05) || per_64 == Approx(0.1) || per_64 == Approx(0.2)));
  }
  CHECK(lr.trials[17].settings.number("lr") == Approx(0.8));
  CHECK(lr.trials[17].settings.number("warmup_epochs") == 1.0);

  // lr-batch (the README's report screenshots): 5 lrs x 4 batch sizes, a validation split.
  auto lb = dprun::load_experiment(dir + "lr-batch.toml", exptest::fake_catalog());
  CHECK(lb.database == "results/lr-batch.db");
  REQUIRE(lb.trials.size() == 20);
  CHECK(lb.trials[0].settings.number("lr") == 0.003);
  CHECK(lb.trials[19].settings.number("lr") == 0.3);
  CHECK(lb.trials[19].settings.integer("batch_size") == 256);
  CHECK(lb.trials[19].settings.number("validation") == 1000.0);

  CHECK_THROWS_WITH(dprun::load_experiment(dir + "no-such-file.toml", exptest::fake_catalog()),
                    Catch::Contains("cannot read experiment file"));
}

TEST_CASE("error: sweeping a setting outside the trial's identity would merge trials",
          "[experiment]") {
  // Its points would be one trial: all but the first would be dropped without a word.
  for (const char* key : {"checkpoint", "backend"}) {
    INFO(key);
    const bool backend = std::string(key) == "backend";
    const std::string value = backend ? R"(["cpu", "cuda"])" : R"(["last", "best"])";
    auto e = error_of(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\n" + key + " = " + value + "\n");
    CHECK_THAT(std::string(e.what()),
               Catch::StartsWith("t.toml:6:") &&
                   Catch::Contains(std::string("sweep.") + key + "[1]: " + key +
                                   " is not part of a trial's identity") &&
                   Catch::Contains(backend ? "drop backend = cuda" : "drop checkpoint = best") &&
                   Catch::Contains("set it in [train]"));
  }
  // Fine where another setting tells the trials apart, or with one value.
  const auto zipped = parse(kHead + R"([train]
model = "lenet"
[[sweep.zip]]
gpus = [1, 2]
backend = ["cpu", "cuda"]
)");
  CHECK(zipped.trials.size() == 2);
  const auto single =
      parse(kHead + "[train]\nmodel = \"lenet\"\n[sweep]\ncheckpoint = [\"best\"]\n");
  CHECK(single.trials.size() == 1);
}
