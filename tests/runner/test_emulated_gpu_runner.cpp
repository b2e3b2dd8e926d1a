// The runner with trials on the CUDA backend, against the emulated GPU (tests/kernel_emu: the
// backend's host code and our kernels on the CPU, fake cuDNN, cuBLAS and NCCL). ctest runs it as
// emulated_gpu_runner (kernel_emu/emu_device.cmake) with the emulated libdpcore first on the
// library path and two emulated GPUs; hidden from test_runner's own run, which has no GPU.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "cli_helpers.hpp"
#include "support/check.hpp"
#include "support/cifar10_files.hpp"

using Catch::Matchers::Contains;

TEST_CASE("emulated gpu: graphs and layout auto resolve in the trial process, and say so",
          "[.emulated_gpu]") {
  const char* gpus = std::getenv("DPRUN_EMULATED_GPUS");
  INFO("run by ctest's emulated_gpu_runner, with the emulated libdpcore and two emulated GPUs");
  REQUIRE(gpus != nullptr);
  REQUIRE(std::string(gpus) == "2");
  dptest::TempDir dir;
  dptest::write_cifar10_folder(dir.path() + "/cifar-10-batches-bin", 8, 16);
  // One replica, and two on a GPU each (NCCL's allreduces inside the graph).
  const std::string toml =
      "[experiment]\nname = \"emu\"\n[data]\ndataset = \"cifar10\"\npath = \"" + dir.path() +
      "\"\n[train]\nmodel = \"lenet\"\nepochs = 2\nbatch_size = 16\nbackend = \"cuda\"\n"
      "conv_choice = \"heuristic\"\nmomentum = 0.9\n[model.lenet]\nhidden = 16\n"
      "[sweep]\ngraphs = [\"auto\", false]\ngpus = [1, 2]\n";
  clitest::write_file(dir.path() + "/e.toml", toml);
  const std::string db = dir.path() + "/r.db";
  auto r = clitest::run({"run", "e.toml", "--db", db, "--oversubscribe"}, dir.path());
  DPRUN_REQUIRE_EXIT(r, 0);
  // The progress names what ran: the layout, and whether the steps are CUDA graphs.
  CHECK_THAT(r.err, Contains("x1 (nhwc, CUDA graphs)") && Contains("x1 (nhwc, no CUDA graphs)"));
  const std::string what =
      "SELECT gpus, graphs, graphs_used, layout_used, oversubscribed, backend FROM trial_summary "
      "ORDER BY gpus, graphs";
  const auto rows = clitest::sql(db, what);
  REQUIRE(rows.size() == 4);
  // graphs sorts 0 (false) before 'auto' (text after integers in SQLite).
  using Row = std::vector<std::string>;
  CHECK(rows[0] == Row{"1", "0", "0", "nhwc", "0", "cuda"});
  CHECK(rows[1] == Row{"1", "auto", "1", "nhwc", "0", "cuda"});
  CHECK(rows[2] == Row{"2", "0", "0", "nhwc", "0", "cuda"});
  CHECK(rows[3] == Row{"2", "auto", "1", "nhwc", "0", "cuda"});

  // Two replicas on a machine of one GPU share it: no graphs there, whatever "auto" would like.
  const std::string shared_db = dir.path() + "/shared.db";
  r = clitest::run({"run", "e.toml", "--db", shared_db, "--oversubscribe", "--set",
                    "sweep.gpus=[2]"},
                   dir.path(), {"DPRUN_EMULATED_GPUS=1"});
  DPRUN_REQUIRE_EXIT(r, 0);
  CHECK_THAT(r.err, Contains("(oversubscribed: replicas share GPUs) (nhwc, no CUDA graphs)"));
  const auto shared = clitest::sql(shared_db, what);
  REQUIRE(shared.size() == 2);
  CHECK(shared[0] == Row{"2", "0", "0", "nhwc", "1", "cuda"});
  CHECK(shared[1] == Row{"2", "auto", "0", "nhwc", "1", "cuda"});
  // The captured steps computed what the eager ones did, to the last bit, through the runner: on
  // one GPU, and on two with the gradients' allreduces inside the graph.
  for (const char* replicas : {"1", "2"}) {
    INFO("gpus = " << replicas);
    const std::string epochs =
        "SELECT group_concat(printf('%d %!.17g %!.17g %!.17g', e.epoch, e.train_loss, "
        "e.test_acc, e.test_loss), '; ') FROM (SELECT * FROM epochs ORDER BY epoch) e JOIN trials "
        "t ON t.id = e.trial_id WHERE t.gpus = " +
        std::string(replicas) + " AND t.graphs ";
    const std::string eager = clitest::sql1(db, epochs + "= 0");
    CHECK_THAT(eager, Contains("1 ") && Contains("; 2 "));
    CHECK(clitest::sql1(db, epochs + "= 'auto'") == eager);
  }
}
