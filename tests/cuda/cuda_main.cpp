// The [cuda] tests' own main: without a CUDA build or a visible GPU it says so and exits 77,
// which ctest reports as skipped (SKIP_RETURN_CODE 77).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_test_util.hpp"
#include "dp/backend.hpp"
#include "models/plugin_loader.hpp"
#include "support/catch_run.hpp"
#include "support/check.hpp"

namespace cudatest {

dp::ModelFactory model_factory(const std::string& model) {
  const std::string file = plugin_dir() + "/libdprun_" + model + ".so";
  for (const auto& m : dprun::load_plugin(file)) {
    if (m.factory.name == model) return m.factory;
  }
  FAIL("plugin " << file << " does not provide the model " << model);
  return {};
}

}  // namespace cudatest

int main(int argc, char** argv) {
  const bool compiled = dp::cuda_compiled();
  const int devices = compiled ? dp::cuda_device_count() : 0;
  if (!compiled || devices == 0) {
    std::string which = "test_cuda";
    for (int i = 1; i < argc; ++i) which += std::string(" ") + argv[i];
    const std::string reason =
        which + (compiled ? ": dprun was built with CUDA but no CUDA device is visible "
                            "(nvidia-smi, CUDA_VISIBLE_DEVICES): these [cuda] tests did not run"
                          : ": dprun was built without CUDA (see the configure output): these "
                            "[cuda] tests did not run");
    std::printf("test_cuda: %s\n", reason.c_str());
    dptest::note_skipped(reason);
    return dptest::kSkipReturnCode;
  }
  std::printf("test_cuda: %d CUDA device(s); device 0: %s\n", devices,
              dp::cuda_device_name(0).c_str());
  // The measured cuDNN choices go to a folder of this run's own: a choice left behind by another
  // run on this machine can neither pass nor fail a test.
  const dptest::TempDir choices;
  setenv("DPRUN_CACHE_DIR", choices.path().c_str(), 1);
  std::printf("test_cuda: cuDNN choices measured into %s (removed at exit)\n",
              choices.path().c_str());
  const dptest::CatchRun run = dptest::run_catch(argc, argv);
  if (run.listing) return run.result;
  const int rc = run.result;
  cudatest::backends_slot().reset();
  // 1 for any failure (Catch2 counts failed assertions: 77 of them would read as skipped).
  return dptest::session_exit_code(rc);
}
