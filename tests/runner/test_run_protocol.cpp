// The pieces of `dprun run` below the process level: the JSON codec, the trial request and the
// record protocol between runner and trial process, filters, query formatting, did-you-mean.
#include <catch2/catch.hpp>
#include <cmath>

#include "base/json.hpp"
#include "dpstore/store.hpp"
#include "base/suggest.hpp"
#include "process/trial_process.hpp"
#include "report/report.hpp"
#include "sweep/sweep_runner.hpp"
#include "trial/trial_main.hpp"
#include "support/check.hpp"
#include "dp/process_group.hpp"

using dprun::Json;

TEST_CASE("json: round trip of every type, escapes and exact 64-bit integers", "[cli][protocol]") {
  Json o = Json::object();
  o.set("s", Json::string("tab\t quote\" backslash\\ newline\n \x01 é"));
  o.set("big", Json::integer(9007199254740993LL));  // not representable as a double
  o.set("neg", Json::integer(-42));
  o.set("pi", Json::number(3.141592653589793));
  o.set("tiny", Json::number(1e-300));
  o.set("nan", Json::number(std::nan("")));
  o.set("t", Json::boolean(true));
  Json a = Json::array();
  a.push(Json()).push(Json::boolean(false)).push(Json::object());
  o.set("a", a);
  const std::string text = o.dump();
  CHECK(text.find('\n') == std::string::npos);  // one record per line
  Json back = Json::parse(text);
  CHECK(back.dump() == text);
  CHECK(back.at("s").as_string() == "tab\t quote\" backslash\\ newline\n \x01 é");
  CHECK(back.at("big").as_int() == 9007199254740993LL);
  CHECK(back.at("neg").as_int() == -42);
  CHECK(back.at("pi").as_double() == 3.141592653589793);
  CHECK(back.at("tiny").as_double() == 1e-300);
  CHECK(std::isnan(back.at("nan").as_double()));  // non-finite travels as null
  CHECK(back.at("t").as_bool());
  CHECK(back.at("a").items().size() == 3);
  CHECK(Json::parse(R"("\u00e9\ud83d\ude00")").as_string() == "é\xF0\x9F\x98\x80");

  CHECK_THROWS_AS(Json::parse("{\"a\":1,}"), dprun::JsonError);
  // A whole float stays a float (model options keep their type), integers stay exact.
  CHECK_FALSE(Json::parse("2.0").is_integer_text());
  CHECK(Json::parse("2.0").as_double() == 2.0);
  CHECK(Json::parse("9007199254740993").as_int() == 9007199254740993LL);
  CHECK_THROWS_AS(Json::parse("18446744073709551615"), dprun::JsonError);
  CHECK_THROWS_AS(Json::parse("[1 2]"), dprun::JsonError);
  CHECK_THROWS_AS(Json::parse("{\"a\":1} x"), dprun::JsonError);
  CHECK_THROWS_AS(Json::parse("\"open"), dprun::JsonError);
  CHECK_THROWS_AS(back.at("missing"), dprun::JsonError);
  CHECK_THROWS_AS(back.at("s").as_int(), dprun::JsonError);
}

TEST_CASE("trial request: every field survives the trip to the trial process", "[cli][protocol]") {
  dprun::TrialRequest r;
  r.ordinal = 7;
  r.settings.set("model", std::string("lenet"));
  r.settings.set("model_options", std::string(R"({"hidden":64})"));
  r.settings.set("gpus", int64_t{4});
  r.settings.set("batch_size", int64_t{1024});
  r.settings.set("per_gpu_batch", int64_t{256});
  r.settings.set("lr", 0.4);
  r.settings.set("seed", int64_t{123456789012345LL});
  r.settings.set("momentum", 0.9);
  r.settings.set("weight_decay", 5e-4);
  r.settings.set("layout", std::string("nhwc"));
  r.settings.set("bn_mode", std::string("sync"));
  r.settings.set("train_limit", int64_t{512});
  r.settings.set("backend_request", std::string("cuda"));
  r.model_options = {{"hidden", int64_t{64}},
                     {"init_std", 1.0},  // a float that prints like an integer
                     {"pool", std::string("max")},
                     {"bias", true}};
  r.data_path = "/data/fashion mnist";
  r.run.plugin_dirs = {"/a", "/b"};
  r.run.backend = "cpu";
  r.run.oversubscribe = true;
  r.run.threads = 3;
  const auto back = dprun::request_from_json(Json::parse(dprun::request_to_json(r).dump()));
  CHECK(back.ordinal == 7);
  CHECK(back.settings.text("model") == "lenet");
  CHECK(back.settings.text("model_options") == r.settings.text("model_options"));
  CHECK(back.settings.integer("gpus") == 4);
  CHECK(back.settings.integer("batch_size") == 1024);
  CHECK(back.settings.integer("per_gpu_batch") == 256);
  CHECK(back.settings.number("lr") == 0.4);
  CHECK(back.settings.integer("seed") == 123456789012345LL);
  CHECK(back.settings.number("momentum") == 0.9);
  CHECK(back.settings.number("weight_decay") == 5e-4);
  CHECK(back.settings.text("layout") == "nhwc");
  CHECK(back.settings.text("bn_mode") == "sync");
  CHECK(back.settings.integer("train_limit") == 512);
  CHECK(back.settings.text("backend_request") == "cuda");
  CHECK(back.model_options == r.model_options);
  CHECK(std::holds_alternative<double>(back.model_options.at("init_std")));
  CHECK(back.data_path == r.data_path);
  CHECK(back.run.plugin_dirs == r.run.plugin_dirs);
  CHECK(back.run.backend == "cpu");
  CHECK(back.run.oversubscribe);
  CHECK(back.run.threads == 3);

  Json broken = dprun::request_to_json(r);
  Json run = broken.at("run");
  run.set("threads", Json::string("three"));
  broken.set("run", run);
  CHECK_THROWS_WITH(dprun::request_from_json(broken),
                    Catch::Contains("\"run\"") && Catch::Contains("\"threads\""));
}

TEST_CASE("run options: every option survives the codec, and a bad member is named", "[protocol]") {
  dprun::RunOptions o;
  o.backend = "cuda";
  o.plugin_dirs = {"/p 1", "/p2"};
  o.threads = 5;
  o.oversubscribe = true;
  o.rerun = true;
  o.restart = true;
  o.verbose = true;
  o.trial_timeout = 12.5;
  o.launch.launcher = "srun";
  o.launch.hostfile = "/h";
  o.launch.args = {"--mca", "x y"};
  const Json j = Json::parse(dprun::run_options_to_json(o).dump());
  // The names submission.json has had since its version 1.
  for (const char* name : {"backend", "plugin_dirs", "threads", "oversubscribe", "rerun", "restart",
                           "verbose", "trial_timeout", "launcher", "hostfile", "launch_args"})
    CHECK(j.has(name));
  const dprun::RunOptions back = dprun::run_options_from_json(j);
  CHECK(back.backend == o.backend);
  CHECK(back.plugin_dirs == o.plugin_dirs);
  CHECK(back.threads == o.threads);
  CHECK(back.oversubscribe);
  CHECK(back.rerun);
  CHECK(back.restart);
  CHECK(back.verbose);
  CHECK(back.trial_timeout == o.trial_timeout);
  CHECK(back.launch.launcher == o.launch.launcher);
  CHECK(back.launch.hostfile == o.launch.hostfile);
  CHECK(back.launch.args == o.launch.args);
  Json missing = Json::object();
  for (const auto& [name, value] : j.members())
    if (name != "rerun") missing.set(name, value);
  CHECK_THROWS_WITH(dprun::run_options_from_json(missing), Catch::Contains("\"rerun\""));
}

TEST_CASE("records: encode and decode each kind", "[cli][protocol]") {
  using K = dprun::TrialRecord::Kind;
  dprun::TrialRecord start;
  start.kind = K::start;
  start.start.backend = "cuda";
  start.start.devices = "NVIDIA H100 80GB HBM3 x2";
  start.start.plugin_path = "/p/libdprun_lenet.so";
  start.start.plugin_sha256 = std::string(64, 'a');
  start.start.oversubscribed = true;
  auto s = dprun::decode_record(dprun::encode_record(start));
  CHECK(s.kind == K::start);
  CHECK(s.start.devices == start.start.devices);
  CHECK(s.start.plugin_sha256 == start.start.plugin_sha256);
  CHECK(s.start.oversubscribed);
  CHECK_FALSE(s.is_final());

  dprun::TrialRecord epoch;
  epoch.kind = K::epoch;
  epoch.epoch.epoch = 3;
  // Every metric the store lists gets a value of its own, so a new one is covered too.
  double next = 0.25;
  for (const dps::EpochMetric& m : dps::epoch_metrics()) {
    if (m.real != nullptr) {
      epoch.epoch.*m.real = next;
    } else {
      epoch.epoch.*m.integer = (int64_t{1} << 40) + static_cast<int64_t>(next * 4);
    }
    next += 0.25;
  }
  epoch.epoch.train_loss = 0.25;
  epoch.epoch.test_acc = 0.875;
  epoch.epoch.examples_per_second = 40000;
  epoch.epoch.peak_memory_bytes = int64_t{1} << 40;
  auto e = dprun::decode_record(dprun::encode_record(epoch));
  for (const dps::EpochMetric& m : dps::epoch_metrics()) {
    INFO(m.name);
    if (m.real != nullptr) {
      CHECK(e.epoch.*m.real == epoch.epoch.*m.real);
    } else {
      CHECK(e.epoch.*m.integer == epoch.epoch.*m.integer);
    }
  }
  CHECK(e.kind == K::epoch);
  CHECK(e.epoch.epoch == 3);
  CHECK(e.epoch.train_loss == 0.25);
  CHECK(e.epoch.test_acc == 0.875);
  CHECK(e.epoch.examples_per_second == 40000);
  CHECK(e.epoch.peak_memory_bytes == int64_t{1} << 40);

  for (K k : {K::done, K::diverged, K::skipped, K::error}) {
    dprun::TrialRecord f;
    f.kind = k;
    f.message = k == K::done ? "" : "why\nit ended";
    auto d = dprun::decode_record(dprun::encode_record(f));
    CHECK(d.kind == k);
    CHECK(d.message == f.message);
    CHECK(d.is_final());
  }
  CHECK_THROWS(dprun::decode_record("{\"type\":\"bogus\"}"));
  CHECK_THROWS(dprun::decode_record("epoch 1 loss 0.5"));
}

TEST_CASE("filters match settings by value, unknown keys are errors", "[cli][protocol]") {
  dprun::TrialSpec spec;
  spec.settings.set("model", std::string("lenet"));
  spec.settings.set("gpus", int64_t{2});
  spec.settings.set("lr", 0.4);
  spec.model_options = {{"hidden", int64_t{128}}};
  using F = std::vector<std::pair<std::string, std::string>>;
  CHECK(dprun::trial_matches(spec, {}));
  CHECK(dprun::trial_matches(spec, F{{"gpus", "2"}}));
  CHECK(dprun::trial_matches(spec, F{{"lr", "0.40"}}));  // numbers compare as numbers
  CHECK_FALSE(dprun::trial_matches(spec, F{{"gpus", "1"}}));
  CHECK(dprun::trial_matches(spec, F{{"gpus", "1"}, {"gpus", "2"}}));  // one key: any value
  CHECK_FALSE(dprun::trial_matches(spec, F{{"gpus", "2"}, {"model", "resnet18"}}));  // all keys
  CHECK(dprun::trial_matches(spec, F{{"option.hidden", "128"}}));
  CHECK_FALSE(dprun::trial_matches(spec, F{{"option.width", "64"}}));
  CHECK_THROWS_AS(dprun::trial_matches(spec, F{{"gpu", "2"}}), dprun::UsageError);
}

TEST_CASE("query output formats", "[cli][protocol]") {
  dps::QueryResult r;
  r.columns = {"name", "acc", "note"};
  r.rows = {{std::string("lenet"), std::string("0.875"), std::nullopt},
            {std::string("a,\"b\""), std::string("-1e-05"), std::string("line\nbreak")}};
  CHECK(dprun::format_query(r, dprun::QueryFormat::csv) ==
        "name,acc,note\r\nlenet,0.875,\r\n\"a,\"\"b\"\"\",-1e-05,\"line\nbreak\"\r\n");
  const std::string json = dprun::format_query(r, dprun::QueryFormat::json);
  auto parsed = Json::parse(json);
  REQUIRE(parsed.items().size() == 2);
  CHECK(parsed.items()[0].at("acc").as_double() == 0.875);
  CHECK(parsed.items()[0].at("note").is_null());
  CHECK(parsed.items()[1].at("name").as_string() == "a,\"b\"");
  CHECK(parsed.items()[1].at("note").as_string() == "line\nbreak");
  const std::string table = dprun::format_query(r, dprun::QueryFormat::table);
  CHECK(table.find("NULL") != std::string::npos);
  CHECK(table.find("(2 rows)") != std::string::npos);
}

TEST_CASE("did you mean", "[cli][protocol]") {
  const std::vector<std::string> commands{"run", "plan", "plugins", "query", "report", "train"};
  CHECK(dprun::did_you_mean("plna", commands) == "plan");
  CHECK(dprun::did_you_mean("qeury", commands) == "query");
  CHECK(dprun::did_you_mean("trian", commands) == "train");
  CHECK(dprun::did_you_mean("plug", commands) == "plugins");
  CHECK(dprun::did_you_mean("xyzzy", commands).empty());
  // The same matcher serves experiment files: a swap of neighbours is one edit.
  CHECK(dprun::did_you_mean("nwhc", {"nchw", "nhwc"}) == "nhwc");
  CHECK(dprun::did_you_mean("gpu", {"epochs", "gpus", "seed"}) == "gpus");
  CHECK(dprun::did_you_mean("lr_scale", {"lr", "lr_scaling", "base_batch"}) == "lr_scaling");
  CHECK(dprun::did_you_mean("vgg", {"lenet", "resnet18"}).empty());
}

TEST_CASE("records: a start or checkpoint record missing a member is refused, naming it",
          "[protocol]") {
  dprun::TrialRecord start;
  start.kind = dprun::TrialRecord::Kind::start;
  start.start.backend = "cpu";
  start.start.devices = "CPU x2";
  start.rank_hosts = {"h"};
  Json j = Json::parse(dprun::encode_record(start));
  CHECK(dprun::decode_record(j.dump()).start.devices == "CPU x2");
  Json missing = Json::object();
  for (const auto& [name, value] : j.members())
    if (name != "devices") missing.set(name, value);
  CHECK_THROWS_WITH(dprun::decode_record(missing.dump()),
                    Catch::Contains("start record") && Catch::Contains("\"devices\""));

  dprun::TrialRecord c;
  c.kind = dprun::TrialRecord::Kind::checkpoint;
  c.checkpoint.role = "last";
  c.checkpoint.epoch = 3;
  c.checkpoint.bytes = 1234567890123;
  Json cj = Json::parse(dprun::encode_record(c));
  CHECK(dprun::decode_record(cj.dump()).checkpoint.bytes == 1234567890123);
  cj.set("epoch", Json::string("three"));
  CHECK_THROWS_WITH(dprun::decode_record(cj.dump()),
                    Catch::Contains("checkpoint record") && Catch::Contains("\"epoch\""));
}

namespace {

// A sink that counts what reached it: a refused request reaches nothing.
struct CountingSink : dprun::TrialSink {
  int calls = 0;
  void start(const dps::TrialStart&, const std::vector<std::string>&) override { ++calls; }
  void epoch(const dps::EpochRow&, const dp::EpochReport&) override { ++calls; }
  void checkpoint(const dps::CheckpointRow&) override { ++calls; }
};

// Process 0 of a group of `n` that never communicates: run_trial must refuse a request whose
// processes do not divide its gpus before any collective.
struct SilentGroup final : dp::ProcessGroup {
  explicit SilentGroup(int n) : n_(n) {}
  std::string kind() const override { return "test"; }
  int rank() const override { return 0; }
  int size() const override { return n_; }
  int local_rank() const override { return 0; }
  int local_size() const override { return n_; }
  std::string host() const override { return "localhost"; }
  void allreduce_sum(float*, size_t) override { FAIL("a refused request communicated"); }
  void allreduce_sum(double*, size_t) override { FAIL("a refused request communicated"); }
  void broadcast(std::string&, int) override { FAIL("a refused request communicated"); }
  void barrier() override { FAIL("a refused request communicated"); }
  std::unique_ptr<dp::ProcessGroup> duplicate() const override {
    return std::make_unique<SilentGroup>(n_);
  }
  bool concurrent_collectives() const override { return true; }
  [[noreturn]] void abort(int, const std::string& why) override {
    FAIL("a refused request aborted the group: " << why);
    std::abort();
  }

 private:
  int n_;
};

}  // namespace

// `dprun run` and `dprun train` check these before they start a trial; the trial process checks
// again, because a request can also come from another runner (a Slurm task, a launcher).
TEST_CASE("trial process: a request it cannot run is refused before anything is loaded, saying why",
          "[protocol]") {
  dprun::TrialRequest r;
  r.settings.set("model", std::string("lenet"));
  CountingSink sink;

  SECTION("processes other than the processes it runs as") {
    r.settings.set("processes", int64_t{2});
    r.settings.set("gpus", int64_t{2});
    const dprun::TrialResult res = dprun::run_trial(r, sink);
    CHECK(res.kind == dprun::TrialRecord::Kind::error);
    CHECK_THAT(res.message, Catch::Contains("processes = 2 but runs as 1 process:") &&
                                Catch::Contains("mpirun -np 2"));
  }
  SECTION("gpus that its processes do not divide") {
    r.settings.set("processes", int64_t{2});
    r.settings.set("gpus", int64_t{3});
    SilentGroup group(2);
    const dprun::TrialResult res = dprun::run_trial(r, sink, &group);
    CHECK(res.kind == dprun::TrialRecord::Kind::error);
    CHECK(res.message == "gpus 3 is not divisible by processes 2");
  }
  SECTION("a model no plugin provides: the models found and the folders searched (the given ones,"
          " then the installed plugins)") {
    dptest::TempDir empty;
    r.settings.set("model", std::string("nosuch"));
    r.run.plugin_dirs = {empty.path()};
    const dprun::TrialResult res = dprun::run_trial(r, sink);
    CHECK(res.kind == dprun::TrialRecord::Kind::error);
    CHECK_THAT(res.message, Catch::StartsWith("unknown model \"nosuch\"; models found: lenet "
                                              "resnet18 (searched: " + empty.path() + " ") &&
                                Catch::EndsWith(")"));
  }
  CHECK(sink.calls == 0);
}
