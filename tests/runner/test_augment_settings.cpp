// Augmentation and the device data budget as trial settings: [train.augment] keys read, checked
// and part of the identity only when given; data_budget_mib outside it (the same bits either
// way); a trial records where its data lived (trials.data_residence), and a streamed trial
// computes the epochs of one on the device, bit for bit, through the runner.
#include <catch2/catch.hpp>
#include <string>

#include "cli_helpers.hpp"
#include "experiment_helpers.hpp"
#include "support/check.hpp"
#include "support/cifar10_files.hpp"

using Catch::Contains;
using exptest::error_of;
using exptest::kHead;
using exptest::parse;

namespace {

const std::string kTrain = "[train]\nmodel = \"lenet\"\n";

}  // namespace

TEST_CASE("[train.augment]: read, checked, and in the identity only when given",
          "[augment][settings]") {
  auto ex = parse(kHead + kTrain +
                  "[train.augment]\ncrop_padding = 4\nflip = true\nmean = [0.5, 0.25, 0.125]\n"
                  "std = [0.5, 0.5, 2]\n");
  REQUIRE(ex.trials.size() == 1);
  const auto& s = ex.trials[0].settings;
  CHECK(s[dprun::key::augment_crop_padding] == 4);
  CHECK(s[dprun::key::augment_flip]);
  CHECK(s[dprun::key::augment_mean] == std::vector<double>{0.5, 0.25, 0.125});
  CHECK(s[dprun::key::augment_std] == std::vector<double>{0.5, 0.5, 2.0});
  CHECK_THAT(ex.trials[0].canonical, Contains("\naugment_crop_padding=4\n") &&
                                         Contains("\naugment_flip=true\n") &&
                                         Contains("\naugment_mean=[0.5,0.25,0.125]\n") &&
                                         Contains("\naugment_std=[0.5,0.5,2]\n"));

  // The dotted form reads the same, and a sweep over flip makes two trials.
  auto dotted = parse(kHead + kTrain +
                      "augment.crop_padding = 4\n[sweep]\n\"augment.flip\" = "
                      "[false, true]\n");
  REQUIRE(dotted.trials.size() == 2);
  CHECK(dotted.trials[0].settings[dprun::key::augment_crop_padding] == 4);
  CHECK_FALSE(dotted.trials[0].settings[dprun::key::augment_flip]);
  CHECK(dotted.trials[1].settings[dprun::key::augment_flip]);
  CHECK(dotted.trials[0].config_hash != dotted.trials[1].config_hash);

  // Without augmentation (and whatever the budget): nothing in the identity, so every trial
  // stored before these settings keeps its hash.
  auto plain = parse(kHead + kTrain);
  auto budget = parse(kHead + kTrain + "data_budget_mib = 0.5\n");
  CHECK(plain.trials[0].canonical.find("augment") == std::string::npos);
  CHECK(budget.trials[0].canonical == plain.trials[0].canonical);
  CHECK(budget.trials[0].config_hash == plain.trials[0].config_hash);
  CHECK(budget.trials[0].settings[dprun::key::data_budget_mib] == 0.5);
}

TEST_CASE("[train.augment] errors name file:line, the key and the value", "[augment][settings]") {
  auto e = error_of(kHead + kTrain + "[train.augment]\ncrop_padding = -1\n");
  CHECK_THAT(e.what(), Contains("train.augment.crop_padding") && Contains("-1"));
  e = error_of(kHead + kTrain + "[train.augment]\ncrop_padding = 4096\n");
  CHECK_THAT(e.what(), Contains("train.augment.crop_padding") && Contains("4096"));
  e = error_of(kHead + kTrain + "[train.augment]\nstd = [0.5, 0]\nmean = [0, 0]\n");
  CHECK_THAT(e.what(), Contains("train.augment.std") && Contains("each value"));
  e = error_of(kHead + kTrain + "[train.augment]\nmean = [0.5]\n");
  CHECK_THAT(e.what(),
             Contains("augment.std") && Contains("augment.mean has 1 values and augment.std 0"));
  e = error_of(kHead + kTrain + "[train.augment]\nflop = true\n");
  CHECK_THAT(e.what(), Contains("train.augment.flop") && Contains("augment.flip"));
  e = error_of(kHead + kTrain + "data_budget_mib = -1\n");
  CHECK_THAT(e.what(), Contains("train.data_budget_mib"));
}

TEST_CASE("a trial records where its data lived, and streamed equals the device bit for bit",
          "[augment][cli]") {
  dptest::TempDir dir;
  dptest::write_cifar10_folder(dir.path() + "/cifar-10-batches-bin", 24, 40);
  const std::string toml =
      "[experiment]\nname = \"aug\"\n[data]\ndataset = \"cifar10\"\npath = \"" + dir.path() +
      "\"\n[train]\nmodel = \"lenet\"\nepochs = 2\nbatch_size = 16\ngpus = 2\nbackend = "
      "\"cpu\"\nmomentum = 0.9\n[train.augment]\ncrop_padding = 4\nflip = true\n"
      "mean = [0.49, 0.48, 0.45]\nstd = [0.25, 0.24, 0.26]\n";
  clitest::write_file(dir.path() + "/e.toml", toml);
  const std::string device_db = dir.path() + "/device.db", streamed_db = dir.path() + "/s.db";
  auto r = clitest::run({"run", "e.toml", "--db", device_db, "--threads", "2"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(clitest::sql1(device_db, "SELECT data_residence FROM trials") == "device");
  CHECK(clitest::sql1(device_db, "SELECT data_residence FROM trial_summary") == "device");
  // layout = "auto" (the default of a new experiment) ran as nchw on the CPU, and says so.
  CHECK(clitest::sql1(device_db, "SELECT layout || ' ' || layout_used FROM trial_summary") ==
        "auto nchw");
  // So did graphs = "auto": off on the CPU, and recorded as such.
  CHECK(clitest::sql1(device_db, "SELECT graphs || ' ' || graphs_used FROM trial_summary") ==
        "auto 0");
  CHECK(clitest::sql1(device_db, "SELECT defaults FROM experiments") ==
        std::to_string(dprun::kDefaultsGeneration));
  CHECK(clitest::sql1(device_db,
                      "SELECT augment_flip || ' ' || augment_crop_padding FROM trials") == "1 4");

  // A budget far below the sets' 360 kB: streamed in chunks, the same trial (the same hash)
  // and the same epochs to the last bit.
  r = clitest::run({"run", "e.toml", "--db", streamed_db, "--threads", "2", "--set",
                    "train.data_budget_mib=0.01"},
                   dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK(clitest::sql1(streamed_db, "SELECT data_residence FROM trials") == "streamed");
  CHECK(clitest::sql1(streamed_db, "SELECT config_hash FROM trials") ==
        clitest::sql1(device_db, "SELECT config_hash FROM trials"));
  const std::string epochs =
      "SELECT group_concat(printf('%d %!.17g %!.17g %!.17g', epoch, train_loss, test_acc, "
      "test_loss), '; ') FROM (SELECT * FROM epochs ORDER BY epoch)";
  const std::string on_device = clitest::sql1(device_db, epochs);
  CHECK_THAT(on_device, Contains("1 ") && Contains("; 2 "));
  CHECK(clitest::sql1(streamed_db, epochs) == on_device);

  // dprun train says so, and takes the same settings as options.
  r = clitest::run({"train",   "--model",        "lenet",    "--dataset",
                    "cifar10", "--data",         dir.path(), "--epochs",
                    "1",       "--batch-size",   "16",       "--backend",
                    "cpu",     "--threads",      "1",        "--augment-crop-padding",
                    "2",       "--augment-flip", "true",     "--data-budget-mib",
                    "0.01"},
                   dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.out, Contains("data: streamed from host memory"));

  // Normalisation with another channel count than the data's: the trial fails, saying so.
  r = clitest::run({"train", "--model", "lenet", "--dataset", "cifar10", "--data", dir.path(),
                    "--epochs", "1", "--batch-size", "16", "--backend", "cpu", "--threads", "1",
                    "--augment-mean", "0.5", "--augment-std", "0.25"},
                   dir.path());
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out + r.err, Contains("augment.mean and augment.std have 1"));
}
