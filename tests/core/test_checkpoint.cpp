// Checkpoints: the safetensors codec (round trip, the format's layout, refusals), the
// trainer's state as PyTorch names it, and a run resumed from a checkpoint computing exactly
// what the uninterrupted run computes.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "conv_test_util.hpp"
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

TEST_CASE(
    "an NHWC model's Conv2d keeps its weight as (K, R, S, C) and its checkpoint in PyTorch's "
    "(K, C, R, S) order",
    "[checkpoint]") {
  // The NHWC passes read (K, R, S, C) filters (ConvUse::filter_layout): the registry stores the
  // weight so (ParamRegistry::layout), its reading order (what checkpoints write,
  // params_in_reading_order) is PyTorch's, and PyTorch's convolution of the same input with that
  // weight gives our outputs.
  const int64_t N = 2, C = 3, H = 5, W = 4, K = 4, R = 3;
  for (const dp::Layout layout : {dp::Layout::nhwc, dp::Layout::nchw}) {
    INFO(dp::layout_name(layout));
    auto net = std::make_unique<dp::Sequential>();
    auto conv = std::make_unique<dp::Conv2d>(
        C, K,
        dp::Conv2d::Options{.kernel = R, .padding = 1, .weight_init = dp::Init::normal(1.0f)});
    const dp::Conv2d* c = conv.get();
    net->add(std::move(conv));
    dptest::ModuleRunner run(std::move(net), {N, C, H, W}, 5, dp::BackendKind::cpu, layout);
    const dp::ParamRegistry& reg = run.registry();
    CHECK(c->weight_layout() == layout);
    CHECK(reg.entries()[0].layout == layout);
    const auto stored = reg.download_params();
    const auto reading = reg.params_in_reading_order(stored);
    CHECK((stored == reading) == (layout == dp::Layout::nchw));  // permuted in NHWC only
    const auto torch = dptest::entry_values(reg, reading, "0.weight");
    const auto bias = dptest::entry_values(reg, reading, "0.bias");
    const auto nchw = dptest::random_vector(N * C * H * W, 6);
    const auto y = cputest::from_layout(
        run.forward(cputest::to_layout(nchw, layout, N, C, H, W), false), layout, N, K, H, W);
    const cputest::ConvCase cc{"3x3 pad 1", N, C, H, W, K, R, R, 1, 1, 1, 1};
    const auto ref = cputest::conv_ref(cc, nchw, torch, &bias);
    for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == Approx(ref[i]).epsilon(1e-5));
  }
}

TEST_CASE("NCHW and NHWC trainers of one seed start from the same model, in PyTorch's order",
          "[checkpoint][trainer]") {
  // The NHWC registry's (K, R, S, C) weights get the values of their (K, C, R, S) twins
  // (ParamRegistry::initialize), so the two layouts start from one PyTorch model; after a step
  // on the same batch they still agree to float rounding.
  const auto data = enginetest::synthetic_dataset(48, 3);
  std::map<std::string, std::vector<float>> start[2], stepped[2];
  std::vector<float> parameters[2];
  int i = 0;
  for (const dp::Layout layout : {dp::Layout::nchw, dp::Layout::nhwc}) {
    dp::TrainerOptions o;
    o.batch_size = 24;
    o.cpu_threads = 1;
    o.layout = layout;
    dp::Trainer t(
        o,
        [] {
          return enginetest::build_model("libdprun_resnet18.so", "resnet18",
                                         {{"width", int64_t{4}}});
        },
        data, data.head(8));
    for (const auto& [name, tensor] : t.model_state().tensors) start[i][name] = tensor.f32;
    // parameters() gives each weight in its shape's order, set_parameters takes it so.
    parameters[i] = t.parameters(0);
    t.set_parameters(parameters[i]);
    CHECK(t.parameters(0) == parameters[i]);
    CHECK(t.registry(0).download_params() ==
          t.registry(0).params_in_memory_order(parameters[i]));
    t.run_epoch(1);
    for (const auto& [name, tensor] : t.model_state().tensors) stepped[i][name] = tensor.f32;
    ++i;
  }
  CHECK(start[0] == start[1]);
  CHECK(parameters[0] == parameters[1]);
  for (const auto& [name, values] : stepped[0]) {
    INFO(name);
    // num_batches_tracked (i64, no floats) and the folded convolution biases (0 before and
    // after: their gradient is 0) are equal; the rest within float rounding.
    if (values == stepped[1].at(name)) continue;
    CHECK(enginetest::norm_relative_error(values, stepped[1].at(name)) <= 1e-4);
  }
}

namespace {

// Every float tensor of a checkpoint file, by name.
std::map<std::string, std::vector<float>> floats_of(const dp::SafeTensorsFile& f) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : f.tensors)
    if (t.type == dp::SafeTensor::Type::f32) out[name] = t.f32;
  return out;
}

}  // namespace

TEST_CASE("a trial resumes in the other layout with its model and its momentum in place",
          "[checkpoint][trainer]") {
  // Both files hold PyTorch's element order (the optimizer's since format v2), so a checkpoint of
  // an NCHW run continues in NHWC, and back, where the weights are stored (K, R, S, C) and
  // LeNet's first linear layer has (H, W, C) columns. One epoch of SGD with momentum 0.9, then a
  // second in the other layout: within float rounding of the second epoch run in the first
  // layout (the two layouts' CPU convolutions sum in other orders). A momentum left in the other
  // order is off by its own size.
  const auto data = enginetest::synthetic_dataset(96, 4);
  const dp::ModelBuilder builder = [] {
    return enginetest::build_model("libdprun_lenet.so", "lenet");
  };
  for (const dp::Layout first : {dp::Layout::nchw, dp::Layout::nhwc}) {
    const dp::Layout second = first == dp::Layout::nchw ? dp::Layout::nhwc : dp::Layout::nchw;
    INFO(dp::layout_name(first) << " then " << dp::layout_name(second));
    dp::TrainerOptions o;
    o.batch_size = 16;
    o.cpu_threads = 1;
    o.epochs = 2;
    o.seed = 5;
    o.optimizer.momentum = 0.9f;
    o.lr.base = 0.1;
    o.layout = first;
    dp::Trainer whole(o, builder, data, data.head(16));
    whole.run_epoch(1);
    const dp::SafeTensorsFile model = whole.model_state(), state = whole.optimizer_state();
    CHECK(state.metadata.at("format") == "dprun-optimizer-state v2");
    whole.run_epoch(2);
    o.layout = second;
    dp::Trainer resumed(o, builder, data, data.head(16));
    resumed.load_state(model, &state);
    // Read back in the other layout, both files say what was written.
    CHECK(floats_of(resumed.model_state()) == floats_of(model));
    CHECK(floats_of(resumed.optimizer_state()) == floats_of(state));
    resumed.run_epoch(2);
    const auto expected = floats_of(whole.model_state()), got = floats_of(resumed.model_state());
    const auto expected_state = floats_of(whole.optimizer_state());
    const auto got_state = floats_of(resumed.optimizer_state());
    for (const auto* pair : {&expected, &expected_state}) {
      const auto& other = pair == &expected ? got : got_state;
      for (const auto& [name, values] : *pair) {
        INFO(name);
        if (values == other.at(name)) continue;  // a zero bias gradient's momentum, say
        CHECK(enginetest::norm_relative_error(other.at(name), values) <= 1e-4);
      }
    }
  }
}

TEST_CASE("an optimizer state of format v1 is read in the order it was written", "[checkpoint]") {
  // dprun before format v2 wrote the optimizer's state in its trainer's element order, in which
  // every convolution weight was (K, C, R, S): an NHWC trainer, which now stores them
  // (K, R, S, C), reads such a file into its own order. (ResNet-18's linear layer follows a
  // Flatten of one position, so there v1's order is PyTorch's throughout.)
  const auto data = enginetest::synthetic_dataset(32, 2);
  dp::TrainerOptions o;
  o.batch_size = 16;
  o.cpu_threads = 1;
  o.optimizer.momentum = 0.9f;
  o.layout = dp::Layout::nhwc;
  const dp::ModelBuilder builder = [] {
    return enginetest::build_model("libdprun_resnet18.so", "resnet18", {{"width", int64_t{4}}});
  };
  dp::Trainer t(o, builder, data, data.head(0));
  t.run_epoch(1);
  dp::SafeTensorsFile v1 = t.optimizer_state();
  v1.metadata["format"] = "dprun-optimizer-state v1";
  dp::Trainer back(o, builder, data, data.head(0));
  back.load_state(t.model_state(), &v1);
  CHECK(floats_of(back.optimizer_state()) == floats_of(t.optimizer_state()));
  v1.metadata["format"] = "dprun-optimizer-state v0";
  CHECK_THROWS_WITH(back.load_state(t.model_state(), &v1),
                    Catch::Contains("v0") && Catch::Contains("dprun-optimizer-state v2") &&
                        Catch::Contains("dprun-optimizer-state v1"));
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
