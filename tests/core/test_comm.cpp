// The in-process communicator: exact, deterministic sums in rank order; broadcast; abort.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>

#include "dp/backend.hpp"
#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "support/check.hpp"

namespace {

// Runs body(rank, comm) on one thread per rank; returns what each rank threw ("" if nothing).
std::vector<std::string> run_ranks(std::vector<std::unique_ptr<dp::Communicator>>& comms,
                                   const std::function<void(int, dp::Communicator&)>& body) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(static_cast<int>(r), *comms[r]);
      } catch (const dp::AbortedError& e) {
        errors[r] = std::string("aborted: ") + e.what();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("In-process allreduce equals the sequential sum in rank order, bitwise",
          "[engine][comm]") {
  for (int k = 1; k <= 4; ++k) {
    for (size_t count : {size_t{1}, size_t{15}, size_t{1000}, size_t{4099}}) {
      DYNAMIC_SECTION(k << " ranks, " << count << " floats") {
        // Values of very different magnitudes, so another summation order would round
        // differently.
        std::vector<std::vector<float>> data(static_cast<size_t>(k));
        for (int r = 0; r < k; ++r) {
          data[static_cast<size_t>(r)] =
              dptest::random_vector(static_cast<int64_t>(count), 100 + static_cast<uint64_t>(r));
          for (size_t i = 0; i < count; i += 3)
            data[static_cast<size_t>(r)][i] *= (r % 2 ? 1e7f : 1e-3f);
        }
        std::vector<float> expected(count);
        for (size_t i = 0; i < count; ++i) {
          float s = data[0][i];
          for (int r = 1; r < k; ++r) s += data[static_cast<size_t>(r)][i];
          expected[i] = s;
        }
        for (int run = 0; run < 3; ++run) {
          auto work = data;
          auto comms = dp::make_inprocess_communicators(k);
          CHECK(comms[0]->kind() == "inprocess");
          CHECK(comms[static_cast<size_t>(k - 1)]->rank() == k - 1);
          CHECK(comms[0]->size() == k);
          const auto errors = run_ranks(comms, [&](int r, dp::Communicator& c) {
            // Two collectives in a row: the buffers are reused immediately.
            c.allreduce_sum(work[static_cast<size_t>(r)].data(), count);
            c.barrier();
          });
          for (const auto& e : errors) CHECK(e.empty());
          for (int r = 0; r < k; ++r)
            CHECK(std::memcmp(work[static_cast<size_t>(r)].data(), expected.data(),
                              count * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("In-process allreduce: many rounds in a row stay correct", "[engine][comm]") {
  const int k = 3;
  const size_t count = 257;
  auto comms = dp::make_inprocess_communicators(k);
  std::vector<std::vector<float>> data(k, std::vector<float>(count));
  const auto errors = run_ranks(comms, [&](int r, dp::Communicator& c) {
    auto& d = data[static_cast<size_t>(r)];
    for (int round = 0; round < 200; ++round) {
      for (size_t i = 0; i < count; ++i) d[i] = static_cast<float>(r + 1 + round);
      c.allreduce_sum(d.data(), count);
      for (size_t i = 0; i < count; ++i)
        if (d[i] != static_cast<float>(6 + 3 * round)) throw std::runtime_error("wrong sum");
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("In-process broadcast and mismatched counts", "[engine][comm]") {
  const int k = 4;
  auto comms = dp::make_inprocess_communicators(k);
  std::vector<std::vector<float>> data(k);
  for (int r = 0; r < k; ++r)
    data[static_cast<size_t>(r)] = dptest::random_vector(33, static_cast<uint64_t>(r));
  const auto root = data[2];
  auto errors = run_ranks(comms, [&](int r, dp::Communicator& c) {
    c.broadcast(data[static_cast<size_t>(r)].data(), 33, 2);
  });
  for (int r = 0; r < k; ++r) {
    CHECK(errors[static_cast<size_t>(r)].empty());
    CHECK(data[static_cast<size_t>(r)] == root);
  }
  // Every rank learns about a size mismatch (none hangs).
  errors = run_ranks(comms, [&](int r, dp::Communicator& c) {
    c.allreduce_sum(data[static_cast<size_t>(r)].data(), r == 1 ? 10 : 33);
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("different element counts"));
  CHECK_THROWS_AS(comms[0]->broadcast(data[0].data(), 1, 7), dp::Error);
}

TEST_CASE("In-process: after a count mismatch the next collective works at once",
          "[engine][comm]") {
  // A rank that has thrown goes straight on to the next collective and publishes its new
  // count while slower ranks may still be checking the old ones.
  const int k = 3;
  const size_t count = 33;
  auto comms = dp::make_inprocess_communicators(k);
  std::vector<std::vector<float>> data(k, std::vector<float>(count));
  const auto errors = run_ranks(comms, [&](int r, dp::Communicator& c) {
    auto& d = data[static_cast<size_t>(r)];
    for (int round = 0; round < 300; ++round) {
      bool threw = false;
      try {
        c.allreduce_sum(d.data(), r == round % k ? 10 : count);
      } catch (const dp::AbortedError&) {
        throw;
      } catch (const dp::Error&) {
        threw = true;
      }
      if (!threw) throw std::runtime_error("a count mismatch went unnoticed");
      for (size_t i = 0; i < count; ++i) d[i] = static_cast<float>(r + 1);
      c.allreduce_sum(d.data(), count);
      for (size_t i = 0; i < count; ++i)
        if (d[i] != 6.0f) throw std::runtime_error("wrong sum after a mismatch");
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("abort() wakes ranks blocked in a collective with AbortedError", "[engine][comm]") {
  const int k = 3;
  auto comms = dp::make_inprocess_communicators(k);
  std::vector<float> buf(64 * k, 1.0f);
  std::atomic<int> entered{0};
  const auto errors = run_ranks(comms, [&](int r, dp::Communicator& c) {
    if (r == 2) {
      // This rank "fails": it never joins; once the others are (about to be) blocked it aborts.
      while (entered.load() < 2) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      c.abort();
      return;
    }
    ++entered;
    c.allreduce_sum(buf.data() + 64 * r, 64);
  });
  CHECK_THAT(errors[0], Catch::StartsWith("aborted: "));
  CHECK_THAT(errors[1], Catch::StartsWith("aborted: "));
  CHECK(errors[2].empty());
  // Later collectives fail at once, on every rank.
  CHECK_THROWS_AS(comms[0]->barrier(), dp::AbortedError);
  CHECK_THROWS_AS(comms[1]->allreduce_sum(buf.data(), 1), dp::AbortedError);
  auto single = dp::make_inprocess_communicators(1);
  single[0]->abort();
  CHECK_THROWS_AS(single[0]->allreduce_sum(buf.data(), 1), dp::AbortedError);
}

TEST_CASE("make_communicators: CPU backends get the in-process path", "[engine][comm]") {
  dp::BackendOptions o;
  o.cpu_threads = 1;
  auto a = dp::create_backend(o), b = dp::create_backend(o);
  auto comms = dp::make_communicators({a.get(), b.get()});
  REQUIRE(comms.size() == 2);
  CHECK(comms[0]->kind() == "inprocess");
  CHECK(comms[1]->rank() == 1);
  CHECK_THROWS_AS(dp::make_communicators({}), dp::Error);
}
