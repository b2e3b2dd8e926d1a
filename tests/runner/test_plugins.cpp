// Plugin loader: the two real plugins load and build their models; every broken plugin (built
// from tests/plugins) is refused with a message that names the file and the problem.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "dp/data.hpp"
#include "dp/params.hpp"
#include "dp/plugin.hpp"
#include "dp/version.hpp"
#include "models/plugin_loader.hpp"
#include "support/check.hpp"
#include "support/cifar10_files.hpp"
#include "support/env_var.hpp"
#include "support/train_steps.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

const std::string kPluginDir = DPRUN_TEST_PLUGIN_DIR;
const std::string kBadPluginDir = std::string(DPRUN_TEST_BINARY_DIR) + "/test-plugins";

std::string canonical(const std::string& p) { return fs::weakly_canonical(p).string(); }

// The message of the PluginError that `file` gives ("" and a failed check when none).
std::string load_error(const std::string& file) {
  try {
    dprun::load_plugin(file);
  } catch (const dprun::PluginError& e) {
    return e.what();
  }
  FAIL_CHECK(file + ": expected a PluginError, the plugin loaded");
  return "";
}

using dptest::EnvVar;

const dp::OptionSpec* find_option(const dp::ModelFactory& f, const std::string& name) {
  for (const auto& o : f.options) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

// Trainable scalars of the model `factory` builds with `given` options (declarations only: no
// backend needed).
size_t parameter_count(const dp::ModelFactory& factory, const dp::ModelOptions& given,
                       const std::optional<dp::ModelInput>& input = std::nullopt) {
  const dp::ModelOptions options = dp::resolve_model_options(factory, given);
  std::unique_ptr<dp::Module> model = factory.build(options, input.value_or(factory.input));
  REQUIRE(model != nullptr);
  dp::ParamRegistry registry;
  model->declare(registry, "");
  return registry.parameter_count();
}

// d2l LeNet: conv3x3 1->20, conv5x5 20->50, linear 800->hidden, linear hidden->10 on 1x28x28;
// on 3x32x32 the first convolution takes 3 channels and 50x5x5 = 1250 values reach the linear.
size_t lenet_parameters(size_t hidden, size_t channels = 1, size_t flat = 800) {
  return (channels * 20 * 9 + 20) + (20 * 50 * 25 + 50) + (flat * hidden + hidden) +
         (hidden * 10 + 10);
}

// d2l small-image ResNet-18 of first-stage width w: biased convolutions, BN weight and bias.
size_t resnet18_parameters(size_t w, size_t channels = 1) {
  auto conv = [](size_t in, size_t out, size_t k) { return in * out * k * k + out; };
  auto bn = [](size_t c) { return 2 * c; };
  auto residual = [&](size_t in, size_t out, bool shortcut) {
    return conv(in, out, 3) + bn(out) + conv(out, out, 3) + bn(out) +
           (shortcut ? conv(in, out, 1) : 0);
  };
  size_t n = conv(channels, w, 3) + bn(w);
  n += 2 * residual(w, w, false);
  for (size_t c = w; c < 8 * w; c *= 2)
    n += residual(c, 2 * c, true) + residual(2 * c, 2 * c, false);
  return n + (8 * w * 10 + 10);
}

}  // namespace

TEST_CASE("the LeNet plugin loads and builds its model", "[plugins]") {
  const std::string file = kPluginDir + "/libdprun_lenet.so";
  const auto models = dprun::load_plugin(file);
  REQUIRE(models.size() == 1);
  const dprun::LoadedModel& m = models[0];
  CHECK(m.factory.name == "lenet");
  CHECK_FALSE(m.factory.description.empty());
  CHECK(m.plugin_path == canonical(file));
  CHECK(m.abi_version == DPRUN_PLUGIN_ABI_VERSION);
  CHECK(m.built_with == dp::version());
  CHECK(m.factory.input.channels == 1);
  CHECK(m.factory.input.height == 28);
  CHECK(m.factory.input.classes == 10);

  const auto* hidden = find_option(m.factory, "hidden");
  const auto* pool = find_option(m.factory, "pool");
  const auto* init_std = find_option(m.factory, "init_std");
  REQUIRE(hidden != nullptr);
  REQUIRE(pool != nullptr);
  REQUIRE(init_std != nullptr);
  CHECK(std::get<int64_t>(hidden->default_value) == 128);
  CHECK(std::get<std::string>(pool->default_value) == "avg");
  CHECK(std::get<double>(init_std->default_value) == 0.01);

  // The model is built by the plugin's code through the std::function it returned: the library
  // must still be loaded here. Options reach the model (hidden changes the first linear layer).
  CHECK(parameter_count(m.factory, {}) == lenet_parameters(128));
  CHECK(parameter_count(m.factory, {{"hidden", int64_t{64}}}) == lenet_parameters(64));
}

TEST_CASE("the ResNet-18 plugin loads and builds its model", "[plugins]") {
  const std::string file = kPluginDir + "/libdprun_resnet18.so";
  const auto models = dprun::load_plugin(file);
  REQUIRE(models.size() == 1);
  const dp::ModelFactory& f = models[0].factory;
  CHECK(f.name == "resnet18");
  const auto* width = find_option(f, "width");
  REQUIRE(width != nullptr);
  CHECK(std::get<int64_t>(width->default_value) == 64);
  CHECK(resnet18_parameters(64) > 11'000'000);  // the formula itself: d2l's ~11.2M
  CHECK(parameter_count(f, {}) == resnet18_parameters(64));
  CHECK(parameter_count(f, {{"width", int64_t{4}}}) == resnet18_parameters(4));
}

TEST_CASE("LeNet and ResNet-18 are built for the data's shape: 3x32x32 (CIFAR-10) trains",
          "[plugins][cifar10]") {
  const dp::ModelInput cifar10{3, 32, 32, 10};
  dptest::TempDir tmp;
  const std::string batch = tmp.path() + "/data_batch_1.bin";
  {
    const std::vector<uint8_t> bytes = dptest::cifar10_batch(0, 4);
    std::ofstream(batch, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  const dp::Dataset data = dp::read_cifar10({batch}, "cifar10/train");
  REQUIRE(data.count == 4);

  struct Case {
    std::string model;
    dp::ModelOptions options;  // ResNet-18 narrowed to width 4: the same layers, a fast step
    size_t parameters;
  };
  const Case cases[] = {{"lenet", {}, lenet_parameters(128, 3, 1250)},
                        {"resnet18", {{"width", int64_t{4}}}, resnet18_parameters(4, 3)}};
  for (const Case& c : cases) {
    INFO(c.model);
    const auto models = dprun::load_plugin(kPluginDir + "/libdprun_" + c.model + ".so");
    REQUIRE(models.size() == 1);
    const dp::ModelFactory& f = models[0].factory;
    CHECK(parameter_count(f, c.options, cifar10) == c.parameters);
    const dp::ModelOptions options = dp::resolve_model_options(f, c.options);
    dp::TrainerOptions o;
    o.batch_size = 4;
    o.cpu_threads = 1;
    const dptest::StepRun run =
        dptest::run_steps(o, [&] { return f.build(options, cifar10); }, data, data, {{0, 1, 2, 3}});
    REQUIRE(run.steps() == 1);
    CHECK(std::isfinite(run.losses[0]));
    CHECK(run.after[0] != run.before[0]);
  }
}

TEST_CASE("loading a plugin twice gives the same models", "[plugins]") {
  const std::string file = kPluginDir + "/libdprun_lenet.so";
  const auto a = dprun::load_plugin(file);
  const auto b = dprun::load_plugin(file);
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  CHECK(a[0].plugin_path == b[0].plugin_path);
  CHECK(parameter_count(a[0].factory, {}) == parameter_count(b[0].factory, {}));
}

TEST_CASE("a plugin that cannot be used gives an error naming the file", "[plugins]") {
  SECTION("missing file") {
    const std::string file = kBadPluginDir + "/libdprun_does_not_exist.so";
    CHECK_THAT(load_error(file), Contains(file + ": no such plugin file"));
  }
  SECTION("a folder") {
    CHECK_THAT(load_error(kBadPluginDir), Contains(kBadPluginDir + ": is a folder"));
  }
  SECTION("not a shared library") {
    dptest::TempDir tmp;
    const std::string file = tmp.path() + "/libdprun_junk.so";
    std::ofstream(file) << "this is not an ELF file\n";
    const std::string m = load_error(file);
    CHECK_THAT(m, Contains(canonical(file) + ": cannot be loaded as a shared library: "));
    CHECK_THAT(m, Contains("libdprun_junk.so"));  // dlopen's own message, which names it too
  }
  SECTION("no dprun_plugin_abi") {
    const std::string file = canonical(kBadPluginDir + "/libdprun_bad_no_abi.so");
    CHECK_THAT(load_error(file),
               Contains(file + ": not a dprun plugin: it does not export dprun_plugin_abi"));
  }
  SECTION("wrong magic") {
    const std::string file = canonical(kBadPluginDir + "/libdprun_bad_wrong_magic.so");
    CHECK_THAT(load_error(file), Contains(file + ": dprun_plugin_abi has magic 0x12345678, "
                                                 "expected 0x4450524E"));
  }
  SECTION("another ABI version (its model list, which aborts, is never called)") {
    const std::string file = canonical(kBadPluginDir + "/libdprun_bad_old_abi.so");
    CHECK_THAT(load_error(file), Contains(file + ": plugin ABI version 0, this dprun expects " +
                                          std::to_string(DPRUN_PLUGIN_ABI_VERSION) +
                                          ": rebuild the plugin against this dprun"));
  }
  SECTION("ABI record but no dprun_plugin_models") {
    const std::string file = canonical(kBadPluginDir + "/libdprun_bad_no_models.so");
    CHECK_THAT(load_error(file),
               Contains(file + ": exports dprun_plugin_abi but not dprun_plugin_models"));
  }
  SECTION("the model list throws") {
    const std::string file = canonical(kBadPluginDir + "/libdprun_bad_throws.so");
    CHECK_THAT(load_error(file), Contains(file + ": dprun_plugin_models() threw: this test "
                                                 "plugin always fails"));
  }
}

TEST_CASE("plugin_search_path: --plugins, then DPRUN_PLUGIN_PATH, then the build tree",
          "[plugins]") {
  dptest::TempDir a, b;
  EnvVar env("DPRUN_PLUGIN_PATH", b.path() + "::" + a.path() + ":/no/such/folder");
  const auto path = dprun::plugin_search_path({a.path(), "/no/such/plugins"});
  REQUIRE(path.size() >= 3);
  CHECK(path[0] == canonical(a.path()));
  CHECK(path[1] == canonical(b.path()));  // a again (from the variable) is not repeated
  CHECK(path.back() == canonical(kPluginDir));
  for (const auto& p : path) CHECK(p.find("/no/such") == std::string::npos);
}

TEST_CASE("scan_plugins finds good plugins and reports bad ones", "[plugins]") {
  EnvVar env("DPRUN_PLUGIN_PATH", std::nullopt);
  dptest::TempDir tmp;
  // A copy of the real LeNet plugin next to junk, in a folder searched before the build tree.
  const std::string lenet_copy = tmp.path() + "/libdprun_lenet.so";
  fs::copy_file(kPluginDir + "/libdprun_lenet.so", lenet_copy);
  std::ofstream(tmp.path() + "/libdprun_junk.so") << "not a library";
  std::ofstream(tmp.path() + "/notes.txt") << "ignored: not named lib*dprun*.so";
  // A plugin named otherwise (a user's first try): not loaded, but reported with the reason.
  fs::copy_file(kPluginDir + "/libdprun_lenet.so", tmp.path() + "/libmynet.so");
  std::ofstream(tmp.path() + "/libother.so.1") << "another library";

  const auto scan =
      dprun::scan_plugins({tmp.path(), kBadPluginDir, tmp.path() + "/missing-folder"});
  REQUIRE(scan.searched.size() >= 3);
  CHECK(scan.searched[0] == canonical(tmp.path()));
  CHECK(scan.searched[1] == canonical(kBadPluginDir));

  REQUIRE(scan.models.count("lenet") == 1);
  CHECK(scan.models.at("lenet").plugin_path == canonical(lenet_copy));  // the first found wins
  REQUIRE(scan.models.count("resnet18") == 1);                          // from the build tree
  CHECK(scan.models.at("resnet18").plugin_path == canonical(kPluginDir + "/libdprun_resnet18.so"));

  auto reported = [&](const std::string& needle) {
    for (const auto& e : scan.errors) {
      if (e.find(needle) != std::string::npos) return true;
    }
    return false;
  };
  INFO("errors:\n"
       << [&] {
            std::string all;
            for (const auto& e : scan.errors) all += e + "\n";
            return all;
          }());
  CHECK(reported("libdprun_junk.so: cannot be loaded as a shared library"));
  CHECK(reported("libdprun_bad_no_abi.so: not a dprun plugin"));
  CHECK(reported("libdprun_bad_wrong_magic.so: dprun_plugin_abi has magic"));
  CHECK(reported("libdprun_bad_old_abi.so: plugin ABI version 0"));
  CHECK(reported("libdprun_bad_no_models.so: exports dprun_plugin_abi but not"));
  CHECK(reported("libdprun_bad_throws.so: dprun_plugin_models() threw"));
  // A plugin's dataset cannot take a built-in's name; its other datasets still load.
  CHECK(
      reported("libdprun_bad_builtin_name.so: dataset \"cifar10\": dprun has a built-in "
               "dataset of this name, which a plugin cannot replace"));
  CHECK(scan.datasets.at("cifar10").plugin_path.empty());  // the built-in, still
  REQUIRE(scan.datasets.count("not-builtin") == 1);
  CHECK(scan.datasets.at("not-builtin").plugin_path ==
        canonical(kBadPluginDir + "/libdprun_bad_builtin_name.so"));
  CHECK(reported(tmp.path() + "/missing-folder: no such plugin file or folder"));
  CHECK_FALSE(reported("notes.txt"));
  CHECK(scan.errors.size() == 8);
  REQUIRE(scan.skipped.size() == 2);
  CHECK(scan.skipped[0].find(canonical(tmp.path() + "/libmynet.so") +
                             ": not loaded: a plugin's file name is lib*dprun*.so") == 0);
  CHECK(scan.skipped[0].find("--plugins FILE") != std::string::npos);
  CHECK(scan.skipped[1].find("libother.so.1: not loaded") != std::string::npos);
  // Given as a file, the same library loads whatever its name.
  const auto direct = dprun::scan_plugins({tmp.path() + "/libmynet.so"});
  CHECK(direct.models.at("lenet").plugin_path == canonical(tmp.path() + "/libmynet.so"));
}

TEST_CASE("file_sha256 hashes a file's bytes", "[plugins]") {
  dptest::TempDir tmp;
  const std::string file = tmp.path() + "/abc";
  std::ofstream(file, std::ios::binary) << "abc";
  CHECK(dprun::file_sha256(file) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::ofstream(tmp.path() + "/empty", std::ios::binary).flush();
  CHECK(dprun::file_sha256(tmp.path() + "/empty") ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK_THROWS_AS(dprun::file_sha256(tmp.path() + "/missing"), dprun::PluginError);
}
