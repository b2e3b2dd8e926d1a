// Checkpoints: the safetensors codec (round trip, the format's layout, refusals), the
// trainer's state as PyTorch names it, and a run resumed from a checkpoint computing exactly
// what the uninterrupted run computes.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dp/layers.hpp"
#include "dp/safetensors.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "support/check.hpp"
#include "support/module_check.hpp"
#include "test_cpu_util.hpp"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

dp::SafeTensorsFile sample() {
  dp::SafeTensorsFile f;
  dp::SafeTensor a;
  a.shape = {2, 3};
  a.f32 = {1, 2, 3, 4, 5, -6.5f};
  f.tensors["layer.weight"] = a;
  dp::SafeTensor s;
  s.type = dp::SafeTensor::Type::i64;
  s.i64 = {1234567890123LL};  // a scalar: shape []
  f.tensors["bn.num_batches_tracked"] = s;
  f.metadata["format"] = "test";
  return f;
}

}  // namespace

TEST_CASE("safetensors: a round trip, and the layout the format documents", "[checkpoint]") {
  dptest::TempDir dir;
  const std::string path = dir.path() + "/a.safetensors";
  dp::write_safetensors(path, sample());
  const auto back = dp::read_safetensors(path);
  CHECK(back.metadata.at("format") == "test");
  CHECK(back.tensors.at("layer.weight").shape == std::vector<int64_t>{2, 3});
  CHECK(back.tensors.at("layer.weight").f32 == sample().tensors.at("layer.weight").f32);
  CHECK(back.tensors.at("bn.num_batches_tracked").shape.empty());
  CHECK(back.tensors.at("bn.num_batches_tracked").i64 == std::vector<int64_t>{1234567890123LL});
  // The documented layout: u64 little-endian header size N, N bytes of JSON (padded with spaces
  // to 8 bytes), then the data: 8 bytes of I64 (first by name) and 24 of F32.
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + 8 + 24);
  const std::string header = bytes.substr(8, n);
  CHECK(header.find("\"bn.num_batches_tracked\":{\"data_offsets\":[0,8],\"dtype\":\"I64\","
                    "\"shape\":[]}") != std::string::npos);
  CHECK(
      header.find("\"layer.weight\":{\"data_offsets\":[8,32],\"dtype\":\"F32\",\"shape\":[2,3]}") !=
      std::string::npos);
  float last = 0;
  std::memcpy(&last, bytes.data() + bytes.size() - 4, 4);
  CHECK(last == -6.5f);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("safetensors: damaged files are refused with the reason", "[checkpoint]") {
  dptest::TempDir dir;
  const std::string path = dir.path() + "/a.safetensors";
  dp::write_safetensors(path, sample());
  const std::string good = slurp(path);
  const std::string bad = dir.path() + "/bad.safetensors";
  spit(bad, good.substr(0, good.size() - 3));
  CHECK_THROWS_WITH(dp::read_safetensors(bad),
                    Catch::Contains(bad) && Catch::Contains("outside the file's data"));
  spit(bad, good.substr(0, 20));
  CHECK_THROWS_WITH(dp::read_safetensors(bad), Catch::Contains("truncated"));
  std::string f16 = good;
  f16.replace(f16.find("\"F32\""), 5, "\"F16\"");
  spit(bad, f16);
  CHECK_THROWS_WITH(dp::read_safetensors(bad), Catch::Contains("dtype F16"));
  std::string json = good;
  json[8] = '[';
  spit(bad, json);
  CHECK_THROWS_WITH(dp::read_safetensors(bad), Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(dp::read_safetensors(dir.path() + "/none"), Catch::Contains("cannot open"));
}

TEST_CASE("the model state has PyTorch's names, shapes and batch norm counts", "[checkpoint]") {
  const auto data = enginetest::synthetic_dataset(64, 2);
  dp::TrainerOptions o;
  o.batch_size = 32;
  o.cpu_threads = 1;
  o.epochs = 1;
  dp::Trainer t(
      o,
      [] {
        return enginetest::build_model("libdprun_resnet18.so", "resnet18", {{"width", int64_t{4}}});
      },
      data, data.head(16));
  t.run_epoch(1);
  const auto m = t.model_state();
  CHECK(m.metadata.at("format") == "dprun-model v1");
  // d2l's ResNet-18 state_dict names (PyTorch nn.Sequential + d2l.Residual).
  for (const char* name : {"0.weight", "0.bias", "1.weight", "1.running_mean",
                           "1.num_batches_tracked", "resnet_block1.0.conv1.weight",
                           "resnet_block2.0.conv3.weight", "resnet_block2.0.bn2.running_var",
                           "resnet_block4.1.bn2.num_batches_tracked", "fc.1.weight", "fc.1.bias"}) {
    INFO(name);
    CHECK(m.tensors.count(name) == 1);
  }
  CHECK(m.tensors.at("fc.1.weight").shape == std::vector<int64_t>{10, 32});
  CHECK(m.tensors.at("1.num_batches_tracked").i64 == std::vector<int64_t>{2});  // 2 steps
  const auto& entries = t.registry(0).entries();
  size_t bn = 0;
  for (const auto& e : entries) bn += e.name.size() > 11 && e.name.ends_with("running_var");
  CHECK(m.tensors.size() == entries.size() + bn);
}

TEST_CASE("an NHWC model's Linear after Flatten is stored in PyTorch's (C, H, W) order",
          "[checkpoint]") {
  // Flatten of NHWC memory gives features (h, w, c); PyTorch's flatten gives (c, h, w). The
  // stored weight applied to PyTorch's flatten of the same input must give our outputs.
  const int64_t C = 3, H = 2, W = 4, OUT = 5;
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(C * H * W, OUT, false, dp::Init::normal(1.0f)));
  dptest::ModuleRunner run(std::move(net), {1, C, H, W}, 9, dp::BackendKind::cpu, dp::Layout::nhwc);
  std::vector<dp::ParamOrder> orders;
  run.module().parameter_orders(orders);
  REQUIRE(orders.size() == 1);
  const auto nchw = dptest::random_vector(C * H * W, 4);
  std::vector<float> nhwc(nchw.size());
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < H * W; ++i)
      nhwc[static_cast<size_t>(i * C + c)] = nchw[static_cast<size_t>(c * H * W + i)];
  const auto y = run.forward(nhwc, false);
  const auto ours = run.params();
  std::vector<float> torch(static_cast<size_t>(OUT * C * H * W));
  for (size_t i = 0; i < torch.size(); ++i)
    torch[static_cast<size_t>(orders[0].pytorch_index[i])] = ours[i];
  for (int64_t o = 0; o < OUT; ++o) {
    double s = 0;
    for (int64_t j = 0; j < C * H * W; ++j)
      s += double{torch[static_cast<size_t>(o * C * H * W + j)]} * nchw[static_cast<size_t>(j)];
    CHECK(y[static_cast<size_t>(o)] == Approx(s).epsilon(1e-5));
  }
}

TEST_CASE("a run resumed from its checkpoint computes exactly the uninterrupted run",
          "[checkpoint][trainer]") {
  // Everything a step depends on is in the two files or derived from the epoch number
  // (the shuffle, the schedule, AdamW's step count): on the CPU the resumed epochs are the
  // same bits. Two replicas, BN buffers averaged before each evaluation, the last batch partial.
  bool real = false;
  const auto data = enginetest::training_data(150, 7, &real);
  const dp::ModelBuilder builder = [] {
    return enginetest::build_model("libdprun_resnet18.so", "resnet18", {{"width", int64_t{4}}});
  };
  for (const char* optimizer : {"sgd", "adamw"}) {
    DYNAMIC_SECTION(optimizer) {
      dp::TrainerOptions o;
      o.replicas = 2;
      o.batch_size = 64;
      o.epochs = 3;
      o.cpu_threads = 2;
      o.seed = 11;
      o.optimizer.name = optimizer;
      o.optimizer.momentum = std::string(optimizer) == "sgd" ? 0.9f : 0.0f;
      o.optimizer.weight_decay = 1e-3f;
      o.lr.base = std::string(optimizer) == "sgd" ? 0.05 : 1e-3;
      o.lr.kind = dp::LrSchedule::Kind::cosine;
      o.lr.warmup_epochs = 1;
      dp::Trainer whole(o, builder, data, data.head(40));
      std::vector<dp::EpochReport> expected;
      whole.fit([&](const dp::EpochReport& r) {
        expected.push_back(r);
        return true;
      });
      REQUIRE(expected.size() == 3);

      dptest::TempDir dir;
      {
        dp::Trainer first(o, builder, data, data.head(40));
        const auto r1 = first.run_epoch(1);
        CHECK(r1.train_loss == expected[0].train_loss);
        dp::write_safetensors(dir.path() + "/model.safetensors", first.model_state());
        dp::write_safetensors(dir.path() + "/state.safetensors", first.optimizer_state());
      }
      dp::Trainer resumed(o, builder, data, data.head(40));
      const auto state = dp::read_safetensors(dir.path() + "/state.safetensors");
      resumed.load_state(dp::read_safetensors(dir.path() + "/model.safetensors"), &state);
      std::vector<dp::EpochReport> got;
      resumed.fit(
          [&](const dp::EpochReport& r) {
            got.push_back(r);
            return true;
          },
          2);
      REQUIRE(got.size() == 2);
      for (size_t i = 0; i < 2; ++i) {
        INFO("epoch " << got[i].epoch);
        CHECK(got[i].epoch == expected[i + 1].epoch);
        CHECK(got[i].train_loss == expected[i + 1].train_loss);
        CHECK(got[i].train_acc == expected[i + 1].train_acc);
        CHECK(got[i].test_acc == expected[i + 1].test_acc);
        CHECK(got[i].lr == expected[i + 1].lr);
      }
      CHECK(resumed.parameters(0) == whole.parameters(0));
      CHECK(resumed.buffers(0) == whole.buffers(0));
    }
  }
}

TEST_CASE("loading a checkpoint of another model says what differs", "[checkpoint]") {
  const auto data = enginetest::synthetic_dataset(32, 2);
  dp::TrainerOptions o;
  o.batch_size = 16;
  o.cpu_threads = 1;
  dp::Trainer lenet(
      o, [] { return enginetest::build_model("libdprun_lenet.so", "lenet"); }, data, data.head(0));
  dp::Trainer wide(
      o,
      [] {
        return enginetest::build_model("libdprun_lenet.so", "lenet", {{"hidden", int64_t{64}}});
      },
      data, data.head(0));
  CHECK_THROWS_WITH(
      wide.load_state(lenet.model_state(), nullptr),
      Catch::Contains("7.weight") && Catch::Contains("(128, 800)") && Catch::Contains("(64, 800)"));
  auto other = lenet.model_state();
  other.metadata["format"] = "dprun-model v9";
  CHECK_THROWS_WITH(lenet.load_state(other, nullptr), Catch::Contains("dprun-model v9"));
  auto extra = lenet.model_state();
  extra.tensors["9.extra"] = extra.tensors.at("9.bias");
  CHECK_THROWS_WITH(lenet.load_state(extra, nullptr), Catch::Contains("9.extra"));
}
