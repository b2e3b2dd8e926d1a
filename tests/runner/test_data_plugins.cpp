// Datasets as factories in the runner: [data] dataset checked against the built-in datasets and
// the plugins', [data.NAME] options read and checked as [model.NAME] ones are, the data_options
// identity setting (absent from the identity of every trial that has no dataset options, so
// trials stored before it keep their hash), `dprun plugins` listing the datasets, and trials
// trained end to end on the "arrays" format.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cli_helpers.hpp"
#include "experiment_helpers.hpp"
#include "models/plugin_loader.hpp"
#include "support/arrays_files.hpp"
#include "support/check.hpp"
#include "sweep/sweep_runner.hpp"

using Catch::Contains;
using exptest::error_of;
using exptest::errors_of;
using exptest::kHead;
using exptest::parse;

namespace {

const std::string kTrain = "[train]\nmodel = \"lenet\"\n";

}  // namespace

TEST_CASE("[data.NAME]: the dataset's options, resolved into data_options", "[data-plugins]") {
  auto ex = parse(kHead +
                  "[data]\ndataset = \"arrays\"\n[data.arrays]\ntrain = \"a.st\"\n"
                  "classes = 3\n" +
                  kTrain);
  REQUIRE(ex.trials.size() == 1);
  const auto& s = ex.trials[0].settings;
  CHECK(s[dprun::key::dataset] == "arrays");
  CHECK(s[dprun::key::data_options] ==
        R"({"classes":3,"layout":"auto","test":"test.safetensors","train":"a.st"})");
  CHECK_THAT(ex.trials[0].canonical,
             Contains("\ndata_options={\"classes\":3,\"layout\":\"auto\",\"test\":"));

  // A dataset without options: {} and nothing in the identity, which stays that of dprun 0.1.0.
  for (const std::string dataset : {"fashion-mnist", "mnist", "cifar10"}) {
    INFO(dataset);
    auto plain = parse(kHead + "[data]\ndataset = \"" + dataset + "\"\n" + kTrain);
    CHECK(plain.trials[0].settings[dprun::key::data_options] == "{}");
    CHECK(plain.trials[0].canonical.find("data_options") == std::string::npos);
    CHECK_THAT(plain.trials[0].canonical, Contains("dataset=\"" + dataset + "\"\n"));
  }
}

TEST_CASE("identity: the canonical text of Fashion-MNIST, MNIST and CIFAR-10 trials is v1's",
          "[data-plugins][identity]") {
  // The text dprun 0.1.0 hashed, line for line: datasets becoming factories adds nothing to it
  // (data_options is {} and left out), so no stored trial gets a new config hash. The stored
  // hashes of an old database are checked in test_upgrade.cpp. An experiment begun then keeps
  // the defaults of generation 1 (layout nchw).
  dprun::ParseOptions begun_then;
  begun_then.settings = &dprun::builtin_settings().with_defaults(1);
  for (const std::string dataset : {"fashion-mnist", "mnist", "cifar10"}) {
    INFO(dataset);
    auto ex = parse(kHead + "[data]\ndataset = \"" + dataset + "\"\n" + kTrain, begun_then);
    CHECK(ex.trials[0].canonical ==
          "dprun-trial-settings v1\ndataset=\"" + dataset +
              "\"\nmodel=\"lenet\"\nmodel_options={\"hidden\":128,\"init_std\":0."
              "01,\"pool\":\"avg\"}\ngpus=1\nbatch_size=256\nper_gpu_batch=256\nlr=0."
              "10000000000000001\nepochs=10\nseed=0\noptimizer=\"sgd\"\nmomentum=0\nweight_"
              "decay=0\nprecision=\"fp32\"\nlayout=\"nchw\"\nbn_mode=\"per-replica\"\neval_"
              "batch_size=0\ntrain_limit=0\ntest_limit=0\n");
    CHECK(ex.trials[0].config_hash == dps::sha256_hex(ex.trials[0].canonical));
  }
}

TEST_CASE("[data.NAME] errors name file:line:column, the key and the value", "[data-plugins]") {
  auto unknown =
      error_of(kHead + "[data]\ndataset = \"arrays\"\n[data.arrays]\ntrian = \"x\"\n" + kTrain);
  CHECK(unknown.key() == "data.arrays.trian");
  CHECK(unknown.line() == 6);
  CHECK(unknown.column() == 1);
  CHECK_THAT(std::string(unknown.what()),
             Contains("t.toml:6:1: data.arrays.trian: unknown option \"trian\" of dataset arrays; "
                      "did you mean \"train\"? (known options: train: string = "
                      "\"train.safetensors\""));

  auto type =
      error_of(kHead + "[data]\ndataset = \"arrays\"\n[data.arrays]\nclasses = \"ten\"\n" + kTrain);
  CHECK(std::string(type.what()) ==
        "t.toml:6:11: data.arrays.classes: expected an integer (option classes of dataset arrays "
        "is int), got \"ten\"");

  auto other =
      error_of(kHead + "[data]\ndataset = \"mnist\"\n[data.arrays]\nclasses = 3\n" + kTrain);
  CHECK(other.key() == "data.arrays");
  CHECK_THAT(std::string(other.what()),
             Contains("options for dataset arrays, but the experiment trains on mnist"));

  auto no_such = error_of(kHead + "[data.arays]\nclasses = 3\n" + kTrain);
  CHECK_THAT(std::string(no_such.what()),
             Contains("data.arays: unknown dataset \"arays\"; did you mean \"arrays\"? (known "
                      "datasets: arrays, cifar10, fashion-mnist, mnist"));

  auto dataset = error_of(kHead + "[data]\ndataset = \"mnsit\"\n" + kTrain);
  CHECK(std::string(dataset.what()) ==
        "t.toml:4:11: data.dataset: unknown dataset \"mnsit\"; did you mean \"mnist\"? (known "
        "datasets: arrays, cifar10, fashion-mnist, mnist)");

  auto key = error_of(kHead + "[data]\ndatset = \"mnist\"\n" + kTrain);
  CHECK_THAT(std::string(key.what()),
             Contains("t.toml:4:1: data.datset: unknown key; did you mean \"dataset\"?"));

  auto no_options = error_of(kHead + "[data]\ndataset = \"mnist\"\n[data.mnist]\nx = 1\n" + kTrain);
  CHECK_THAT(std::string(no_options.what()),
             Contains("unknown option \"x\" of dataset mnist (the dataset takes no options)"));
}

TEST_CASE("a sweep over the dataset's options: a trial per value, each with its own identity",
          "[data-plugins][experiment]") {
  auto ex = parse(kHead + "[data]\ndataset = \"arrays\"\n[data.arrays]\ntrain = \"a.st\"\n" +
                  kTrain + "[sweep]\n\"data.arrays.classes\" = [3, 5]\nlr = [0.1, 0.2]\n");
  REQUIRE(ex.trials.size() == 4);
  CHECK(ex.trials[0].settings[dprun::key::data_options] ==
        R"({"classes":3,"layout":"auto","test":"test.safetensors","train":"a.st"})");
  CHECK(ex.trials[2].settings[dprun::key::data_options] ==
        R"({"classes":5,"layout":"auto","test":"test.safetensors","train":"a.st"})");
  CHECK(ex.trials[0].label == "data.arrays.classes=3 lr=0.1");
  CHECK(ex.trials[3].label == "data.arrays.classes=5 lr=0.2");
  CHECK(ex.trials[0].config_hash != ex.trials[2].config_hash);
  CHECK(std::get<int64_t>(ex.trials[2].data_options.at("classes")) == 5);
  // --filter answers to the sweep key.
  using F = std::vector<std::pair<std::string, std::string>>;
  CHECK(dprun::trial_matches(ex.trials[2], F{{"data.arrays.classes", "5"}}));
  CHECK_FALSE(dprun::trial_matches(ex.trials[0], F{{"data.arrays.classes", "5"}}));
  CHECK_THROWS_WITH(dprun::trial_matches(ex.trials[0], F{{"data.arrays.clases", "5"}}),
                    Contains("data.DATASET.NAME for a dataset option"));

  // In a zip group, beside a [train] key.
  auto zip = parse(kHead + "[data]\ndataset = \"arrays\"\n" + kTrain +
                   "[[sweep.zip]]\n\"data.arrays.layout\" = [\"nchw\", \"nhwc\"]\n"
                   "batch_size = [64, 128]\n");
  REQUIRE(zip.trials.size() == 2);
  CHECK(std::get<std::string>(zip.trials[1].data_options.at("layout")) == "nhwc");
  // A string option is selected as its label shows it, with or without quotes.
  CHECK(dprun::trial_matches(zip.trials[1], F{{"data.arrays.layout", "nhwc"}}));
  CHECK(dprun::trial_matches(zip.trials[1], F{{"data.arrays.layout", "\"nhwc\""}}));
  CHECK_FALSE(dprun::trial_matches(zip.trials[0], F{{"data.arrays.layout", "nhwc"}}));
  CHECK(zip.trials[1].settings[dprun::key::batch_size] == 128);

  // Sampled, as a model option is.
  auto sampled = parse(kHead + "[data]\ndataset = \"arrays\"\n" + kTrain +
                       "[search]\nsamples = 6\n[sweep]\n"
                       "\"data.arrays.classes\" = { int_uniform = [2, 9] }\n");
  REQUIRE(sampled.trials.size() >= 2);  // equal draws are one trial
  for (const auto& t : sampled.trials) {
    const int64_t classes = std::get<int64_t>(t.data_options.at("classes"));
    CHECK(classes >= 2);
    CHECK(classes <= 9);
    CHECK_THAT(t.settings[dprun::key::data_options],
               Contains("\"classes\":" + std::to_string(classes) + ","));
  }
}

TEST_CASE("dataset option axes: errors name file:line:column, the key and the value",
          "[data-plugins][experiment]") {
  const std::string head = kHead + "[data]\ndataset = \"arrays\"\n" + kTrain + "[sweep]\n";
  auto other = error_of(head + "\"data.mnist.classes\" = [3, 5]\n");
  CHECK(other.key() == "sweep.data.mnist.classes");
  CHECK(other.line() == 8);
  CHECK_THAT(std::string(other.what()),
             Contains("options for dataset mnist, but the experiment trains on arrays") &&
                 Contains("remove the key"));
  auto option = error_of(head + "\"data.arrays.clases\" = [3, 5]\n");
  CHECK_THAT(std::string(option.what()),
             Contains("unknown option \"clases\" of dataset arrays; did you mean \"classes\"?"));
  auto type = error_of(head + "\"data.arrays.classes\" = [3, \"five\"]\n");
  CHECK_THAT(std::string(type.what()),
             Contains("sweep.data.arrays.classes[1]: expected an integer (option classes of "
                      "dataset arrays is int), got \"five\""));
  auto shape = error_of(head + "\"data.arrays\" = [3, 5]\n");
  CHECK_THAT(std::string(shape.what()),
             Contains("a dataset option axis is written \"data.<dataset>.<option>\""));
  auto bare = error_of(head + "data.arrays.classes = [3, 5]\n");
  CHECK_THAT(std::string(bare.what()),
             Contains("to sweep a dataset option, quote the key: \"data.arrays.<option>\""));
  auto unknown = error_of(head + "\"data.arays.classes\" = [3, 5]\n");
  CHECK_THAT(std::string(unknown.what()),
             Contains("unknown dataset \"arays\"; did you mean \"arrays\"?"));
}

TEST_CASE("a plugin's dataset is known to the parser through the catalog", "[data-plugins]") {
  dprun::ModelCatalog catalog = exptest::fake_catalog();
  dp::DatasetFactory mine;
  mine.name = "mine";
  mine.options = {{"rows", int64_t{100}, "how many"}};
  mine.load = [](const dp::DatasetOptions&, const std::string&) { return dp::DatasetPair{}; };
  catalog.datasets["mine"] = mine;
  auto ex = dprun::parse_experiment(
      "t.toml", kHead + "[data]\ndataset = \"mine\"\n[data.mine]\nrows = 7\n" + kTrain, catalog);
  CHECK(ex.trials[0].settings[dprun::key::data_options] == R"({"rows":7})");
  // A dataset whose name holds a dot can be swept too.
  dp::DatasetFactory dotted = mine;
  dotted.name = "my.set";
  catalog.datasets["my.set"] = dotted;
  auto swept = dprun::parse_experiment("t.toml",
                                       kHead + "[data]\ndataset = \"my.set\"\n" + kTrain +
                                           "[sweep]\n\"data.my.set.rows\" = [1, 2]\n",
                                       catalog);
  REQUIRE(swept.trials.size() == 2);
  CHECK(swept.trials[1].settings[dprun::key::data_options] == R"({"rows":2})");
  // The scan holds the built-in datasets even where no plugin is found.
  const auto scan = dprun::scan_plugins({"/no/such/folder"});
  CHECK(scan.datasets.count("fashion-mnist") == 1);
  CHECK(scan.datasets.at("arrays").plugin_path.empty());
}

TEST_CASE("dprun plugins lists the datasets beside the models", "[data-plugins][cli]") {
  dptest::TempDir dir;
  auto r = clitest::run({"plugins"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("datasets ([data] dataset = \"NAME\", options in [data.NAME]):"));
  CHECK_THAT(r.out, Contains("fashion-mnist: Fashion-MNIST: 28x28 greyscale images of clothing"));
  CHECK_THAT(r.out, Contains("  yields 1x28x28, 10 classes\n  options: none"));
  CHECK_THAT(r.out, Contains("cifar10: CIFAR-10") && Contains("yields 3x32x32, 10 classes"));
  CHECK_THAT(r.out, Contains("arrays: your own images and labels"));
  CHECK_THAT(r.out, Contains("train    string  \"train.safetensors\""));
  CHECK_THAT(r.out, Contains("lenet: d2l LeNet"));
}

TEST_CASE("a trial trains on the arrays format, and on damaged files fails naming the file",
          "[data-plugins][cli]") {
  dptest::TempDir dir;
  dptest::ArraysSpec train, test;
  train.count = 96;
  test.count = 32;
  train.channels = test.channels = 3;
  train.height = test.height = train.width = test.width = 16;
  train.nhwc = test.nhwc = true;
  train.label_type = test.label_type = dp::SafeTensor::Type::u8;
  train.classes = test.classes = 4;
  dptest::write_arrays_file(dir.path() + "/mine-train.safetensors", train);
  dptest::write_arrays_file(dir.path() + "/mine-test.safetensors", test);
  const std::string toml =
      "[experiment]\nname = \"arrays\"\n[data]\ndataset = \"arrays\"\npath = \"" + dir.path() +
      "\"\n[data.arrays]\ntrain = \"mine-train.safetensors\"\ntest = \"mine-test.safetensors\"\n"
      "[train]\nmodel = \"lenet\"\nepochs = 1\nbatch_size = 32\nbackend = \"cpu\"\n";
  clitest::write_file(dir.path() + "/e.toml", toml);
  const std::string db = dir.path() + "/e.db";
  auto r = clitest::run({"run", "e.toml", "--db", db, "--threads", "1"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(clitest::sql1(db, "SELECT status FROM trials") == "done");
  CHECK(clitest::sql1(db, "SELECT dataset FROM trials") == "arrays");
  CHECK_THAT(clitest::sql1(db, "SELECT data_options FROM trials"),
             Contains("\"train\":\"mine-train.safetensors\""));

  // With classes = 4, a label 200 is out of range: the trial fails, saying where.
  auto content = dptest::arrays_content(test);
  content.tensors["labels"].u8[5] = 200;
  dp::write_safetensors(dir.path() + "/mine-test.safetensors", content);
  std::string classes = toml;
  classes.replace(classes.find("[train]"), 0, "classes = 4\n");
  clitest::write_file(dir.path() + "/e.toml", classes);
  r = clitest::run({"run", "e.toml", "--db", db, "--threads", "1"}, dir.path());
  CHECK(r.exit_code != 0);
  CHECK_THAT(clitest::sql1(db, "SELECT error FROM trials WHERE status = 'failed'"),
             Contains("mine-test.safetensors: tensor labels: label 200 of example 5 (offset ") &&
                 Contains("expected 0..3 (option classes = 4)"));

  // dprun train: --dataset and --data-option.
  dptest::write_arrays_file(dir.path() + "/mine-test.safetensors", test);
  r = clitest::run(
      {"train", "--model", "lenet", "--dataset", "arrays", "--data", dir.path(), "--data-option",
       "train=mine-train.safetensors", "--data-option", "test=mine-test.safetensors", "--epochs",
       "1", "--batch-size", "32", "--backend", "cpu", "--threads", "1"},
      dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  r = clitest::run({"train", "--model", "lenet", "--dataset", "arays"}, dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("--dataset arays: unknown dataset; did you mean arrays?"));
  r = clitest::run(
      {"train", "--model", "lenet", "--dataset", "arrays", "--data-option", "classes=many"},
      dir.path());
  DPRUN_CHECK_EXIT(r, 2);
  CHECK_THAT(r.err, Contains("--data-option classes=many: expected an integer"));
}
