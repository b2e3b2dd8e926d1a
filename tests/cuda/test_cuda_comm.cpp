// The CUDA communicators: the same-device path (replicas sharing one GPU) and NCCL (one rank per
// GPU present; with a single GPU only a 1-rank NCCL group can be tested). Each rank runs on its
// own thread, as in the trainer.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.hpp"
#include "dp/backend.hpp"
#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "support/check.hpp"

#if defined(DPRUN_WITH_CUDA)
#include "../../core/src/cuda/cuda_comm.hpp"
#endif

namespace {

std::vector<std::unique_ptr<dp::Backend>> gpu_backends(const std::vector<int>& devices) {
  std::vector<std::unique_ptr<dp::Backend>> out;
  for (int d : devices) {
    dp::BackendOptions o;
    o.kind = dp::BackendKind::cuda;
    o.device_index = d;
    o.allow_tf32 = false;
    out.push_back(dp::create_backend(o));
  }
  return out;
}

std::vector<dp::Backend*> raw(const std::vector<std::unique_ptr<dp::Backend>>& b) {
  std::vector<dp::Backend*> out;
  for (auto& p : b) out.push_back(p.get());
  return out;
}

/// Runs fn(rank) on one thread per rank; rethrows the first failure.
void on_threads(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// allreduce_sum, broadcast and barrier over `comms`; the sum must equal the host sum in rank
/// order exactly when `exact` (the same-device path), else within 1e-6 relative.
void exercise(std::vector<std::unique_ptr<dp::Communicator>>& comms,
              std::vector<std::unique_ptr<dp::Backend>>& backends, bool exact) {
  const int k = static_cast<int>(comms.size());
  for (size_t count : {size_t{1}, size_t{1001}, size_t{1} << 20}) {
    INFO(k << " ranks (" << comms[0]->kind() << "), " << count << " floats");
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < k; ++r)
      inputs.push_back(
          dptest::random_vector(static_cast<int64_t>(count), 100 + static_cast<uint64_t>(r)));
    std::vector<float> expected(count, 0.0f);
    for (size_t i = 0; i < count; ++i) {
      float s = inputs[0][i];
      for (int r = 1; r < k; ++r) s += inputs[static_cast<size_t>(r)][i];
      expected[i] = s;
    }
    std::vector<std::vector<float>> results(static_cast<size_t>(k)),
        broadcasts(static_cast<size_t>(k));
    on_threads(k, [&](int r) {
      dp::Backend& b = *backends[static_cast<size_t>(r)];
      dptest::DeviceBuffer buf(b, {static_cast<int64_t>(count)});
      buf.upload(inputs[static_cast<size_t>(r)]);
      // Queue work before the collective: it must be ordered after it on the rank's stream.
      b.scale(buf.tensor(), 2.0f);
      b.scale(buf.tensor(), 0.5f);
      comms[static_cast<size_t>(r)]->allreduce_sum(buf.tensor().f32(), count);
      results[static_cast<size_t>(r)] = buf.download_f32();
      buf.upload(inputs[static_cast<size_t>(r)]);
      comms[static_cast<size_t>(r)]->broadcast(buf.tensor().f32(), count, k - 1);
      broadcasts[static_cast<size_t>(r)] = buf.download_f32();
      comms[static_cast<size_t>(r)]->barrier();
    });
    for (int r = 0; r < k; ++r) {
      if (exact) {
        CHECK(results[static_cast<size_t>(r)] == expected);
      } else {
        auto cmp = dptest::compare(results[static_cast<size_t>(r)], expected, 1e-6);
        INFO(cmp.message);
        CHECK(cmp.ok);
        CHECK(results[static_cast<size_t>(r)] == results[0]);  // identical on every rank
      }
      CHECK(broadcasts[static_cast<size_t>(r)] == inputs[static_cast<size_t>(k - 1)]);
    }
  }
}

}  // namespace

TEST_CASE("cuda same-device allreduce, broadcast and barrier (2 and 3 ranks on one GPU)",
          "[cuda][comm]") {
  for (int k : {2, 3}) {
    auto backends = gpu_backends(std::vector<int>(static_cast<size_t>(k), 0));
    auto comms = dp::make_communicators(raw(backends));
    REQUIRE(comms.size() == static_cast<size_t>(k));
    CHECK(comms[0]->kind() == "cuda-same-device");
    for (int r = 0; r < k; ++r) {
      CHECK(comms[static_cast<size_t>(r)]->rank() == r);
      CHECK(comms[static_cast<size_t>(r)]->size() == k);
    }
    exercise(comms, backends, /*exact=*/true);
    // Repeated back-to-back collectives without host synchronisation in between. The ranks only
    // collect their results: Catch2's assertions are not thread-safe, so they run on this thread.
    std::vector<std::vector<float>> repeated(static_cast<size_t>(k));
    on_threads(k, [&](int r) {
      dp::Backend& b = *backends[static_cast<size_t>(r)];
      dptest::DeviceBuffer buf(b, {4099});
      b.fill(buf.tensor(), static_cast<float>(r + 1));
      for (int i = 0; i < 20; ++i)
        comms[static_cast<size_t>(r)]->allreduce_sum(buf.tensor().f32(), 4099);
      repeated[static_cast<size_t>(r)] = buf.download_f32();
      // Every rank's buffer is written by the others' kernels: leave none in flight when this
      // rank's buffer is freed.
      comms[static_cast<size_t>(r)]->barrier();
    });
    // Round 1 gives S = 1 + 2 + ... + k on every rank; each later round sums k equal values,
    // which the host replays in the kernel's order to get the same rounding.
    float expected = static_cast<float>(k * (k + 1) / 2);
    for (int i = 1; i < 20; ++i) {
      float s = expected;
      for (int j = 1; j < k; ++j) s += expected;
      expected = s;
    }
    for (int r = 0; r < k; ++r) {
      INFO("rank " << r);
      CHECK(repeated[static_cast<size_t>(r)] == std::vector<float>(4099, expected));
    }
  }
}

TEST_CASE("cuda same-device abort releases the other ranks", "[cuda][comm]") {
  auto backends = gpu_backends({0, 0});
  auto comms = dp::make_communicators(raw(backends));
  std::atomic<bool> aborted_seen{false};
  std::thread waiter([&] {
    dptest::DeviceBuffer buf(*backends[0], {16});
    try {
      comms[0]->allreduce_sum(buf.tensor().f32(), 16);  // rank 1 never joins
    } catch (const dp::AbortedError&) {
      aborted_seen = true;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  comms[1]->abort();
  waiter.join();
  CHECK(aborted_seen);
  dptest::DeviceBuffer buf(*backends[1], {16});
  CHECK_THROWS_AS(comms[1]->allreduce_sum(buf.tensor().f32(), 16), dp::AbortedError);
}

TEST_CASE("cuda same-device count mismatch is an error on every rank", "[cuda][comm]") {
  auto backends = gpu_backends({0, 0});
  auto comms = dp::make_communicators(raw(backends));
  std::atomic<int> errors{0};
  on_threads(2, [&](int r) {
    dptest::DeviceBuffer buf(*backends[static_cast<size_t>(r)], {32});
    try {
      comms[static_cast<size_t>(r)]->allreduce_sum(buf.tensor().f32(), r == 0 ? 32 : 31);
    } catch (const dp::Error& e) {
      if (std::string(e.what()).find("same count") != std::string::npos) ++errors;
    }
  });
  CHECK(errors == 2);
}

TEST_CASE("cuda NCCL allreduce, broadcast and barrier, one rank per GPU", "[cuda][comm][nccl]") {
#if defined(DPRUN_WITH_CUDA)
  const int gpus = dp::cuda_device_count();
  std::vector<int> devices(static_cast<size_t>(gpus));
  for (int d = 0; d < gpus; ++d) devices[static_cast<size_t>(d)] = d;
  if (gpus == 1) {
    DPTEST_SKIPPED(
        "only 1 GPU: NCCL tested with a 1-rank communicator; multi-GPU NCCL was NOT tested");
  }
  auto backends = gpu_backends(devices);
  auto comms = dp::cuda::make_nccl_communicators(raw(backends));
  REQUIRE(comms.size() == static_cast<size_t>(gpus));
  CHECK(comms[0]->kind() == "nccl");
  exercise(comms, backends, /*exact=*/gpus == 1);
  if (gpus >= 2) {
    // Through the public entry point, distinct GPUs choose NCCL.
    auto via_entry = dp::make_communicators(raw(backends));
    CHECK(via_entry[0]->kind() == "nccl");
  }
#endif
}

TEST_CASE("cuda NCCL abort makes later collectives throw", "[cuda][comm][nccl]") {
#if defined(DPRUN_WITH_CUDA)
  auto backends = gpu_backends({0});
  auto comms = dp::cuda::make_nccl_communicators(raw(backends));
  dptest::DeviceBuffer buf(*backends[0], {8});
  comms[0]->allreduce_sum(buf.tensor().f32(), 8);
  comms[0]->barrier();
  comms[0]->abort();
  CHECK_THROWS_AS(comms[0]->allreduce_sum(buf.tensor().f32(), 8), dp::AbortedError);
  CHECK_THROWS_AS(comms[0]->barrier(), dp::AbortedError);
#endif
}

TEST_CASE("cuda NCCL initialisation that fails midway leaves nothing open", "[cuda][comm][nccl]") {
#if defined(DPRUN_WITH_CUDA)
  // Every rank but the last gets its communicator before the failure, inside the init group.
  const int gpus = dp::cuda_device_count();
  std::vector<int> devices(static_cast<size_t>(gpus));
  for (int d = 0; d < gpus; ++d) devices[static_cast<size_t>(d)] = d;
  auto backends = gpu_backends(devices);
  dp::cuda::inject_nccl_init_failure(gpus - 1);
  CHECK_THROWS_WITH(dp::cuda::make_nccl_communicators(raw(backends)),
                    Catch::Contains("injected failure of NCCL initialisation"));
  // Had the group been left open, this initialisation would queue behind it and never complete
  // (the test would fail on the communicator timeout); had communicators leaked, NCCL would
  // still hold them. It must work as if nothing had happened.
  auto comms = dp::cuda::make_nccl_communicators(raw(backends));
  REQUIRE(comms.size() == static_cast<size_t>(gpus));
  exercise(comms, backends, /*exact=*/gpus == 1);
#endif
}

TEST_CASE("cuda communicators refuse unsupported rank placements", "[cuda][comm]") {
#if defined(DPRUN_WITH_CUDA)
  auto same = gpu_backends({0, 0});
  CHECK_THROWS_WITH(dp::cuda::make_nccl_communicators(raw(same)),
                    Catch::Contains("one rank per GPU"));
  if (dp::cuda_device_count() >= 2) {
    auto mixed = gpu_backends({0, 0, 1});
    CHECK_THROWS_WITH(dp::make_communicators(raw(mixed)), Catch::Contains("not supported"));
  } else {
    DPTEST_SKIPPED("only 1 GPU: the mixed shared/distinct placement error was not exercised");
  }
#endif
}
