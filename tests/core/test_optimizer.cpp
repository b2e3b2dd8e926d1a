// The optimizer unit: the update equations of PyTorch's SGD with Nesterov momentum and of AdamW
// against the documented formulas in double precision over several steps, the optimizer
// table, the learning-rate schedules step by step, and AdamW and schedules through the trainer.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "dp/bf16.hpp"
#include "dp/optimizer.hpp"
#include "dp/trainer.hpp"
#include "engine_test_util.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;
using dptest::host_tensor;
using dptest::random_vector;

TEST_CASE("cpu sgd_update with Nesterov momentum follows PyTorch's formula",
          "[cpu][ops][optimizer]") {
  auto backend = make_cpu();
  for (const float wd : {0.0f, 1e-2f}) {
    INFO("weight_decay " << wd);
    const dp::SgdParams p{0.05f, 0.9f, wd, true};
    const int64_t n = 4099;
    fvec params = random_vector(n, 301), buf(static_cast<size_t>(n), 0.0f);
    dvec ref_params(params.begin(), params.end()), ref_buf(static_cast<size_t>(n), 0.0);
    for (uint64_t step = 0; step < 5; ++step) {
      fvec grads = random_vector(n, 400 + step);
      auto bt = host_tensor(buf, {n});
      backend->sgd_update(host_tensor(params, {n}), host_tensor(grads, {n}), &bt, p);
      // torch.optim.SGD(nesterov=True): d = g + wd p; buf = mu buf + d; p -= lr (d + mu buf).
      for (size_t i = 0; i < ref_params.size(); ++i) {
        const double d = grads[i] + double{wd} * ref_params[i];
        ref_buf[i] = 0.9 * ref_buf[i] + d;
        ref_params[i] -= 0.05 * (d + 0.9 * ref_buf[i]);
      }
    }
    // fp32 updates vs a double loop over 5 steps: 1e-6 relative.
    check_close(params, ref_params, 1e-6);
    check_close(buf, ref_buf, 1e-6);
  }
  fvec params(3), grads(3);
  check_error_mentions(
      [&] {
        backend->sgd_update(host_tensor(params, {3}), host_tensor(grads, {3}), nullptr,
                            dp::SgdParams{0.1f, 0.0f, 0.0f, true});
      },
      {"sgd_update", "Nesterov", "momentum above 0"});
}

TEST_CASE("cpu adamw_update follows PyTorch's AdamW formula over several steps",
          "[cpu][ops][optimizer]") {
  auto backend = make_cpu();
  for (const float wd : {0.0f, 0.05f}) {
    for (const int64_t n : {int64_t{7}, int64_t{70001}}) {
      INFO("weight_decay " << wd << " n " << n);
      const float lr = 3e-3f, b1 = 0.8f, b2 = 0.95f, eps = 1e-6f;
      fvec params = random_vector(n, 311), m(static_cast<size_t>(n), 0.0f), v(m);
      dvec rp(params.begin(), params.end()), rm(static_cast<size_t>(n), 0.0), rv(rm);
      for (int64_t step = 1; step <= 6; ++step) {
        // Gradients of mixed sign and size, some exactly zero (v stays 0: the eps path).
        fvec grads = random_vector(n, 500 + static_cast<uint64_t>(step), -2.0f, 2.0f);
        for (size_t i = 0; i < grads.size(); i += 5) grads[i] = 0.0f;
        const fvec before = grads;
        backend->adamw_update(host_tensor(params, {n}), host_tensor(grads, {n}),
                              host_tensor(m, {n}), host_tensor(v, {n}),
                              dp::AdamWParams{lr, b1, b2, eps, wd, step});
        CHECK(grads == before);
        // torch.optim.AdamW: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
        // p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
        const double bc1 = 1 - std::pow(double{b1}, step), bc2 = 1 - std::pow(double{b2}, step);
        for (size_t i = 0; i < rp.size(); ++i) {
          rp[i] *= 1 - double{lr} * wd;
          rm[i] = b1 * rm[i] + (1 - double{b1}) * grads[i];
          rv[i] = b2 * rv[i] + (1 - double{b2}) * grads[i] * grads[i];
          rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
        }
      }
      // fp32 vs double over 6 steps; the moments' relative rounding is ~1e-7 per step.
      check_close(params, rp, 1e-6);
      check_close(m, rm, 1e-5);
      check_close(v, rv, 1e-5);
    }
  }
  fvec a(3), b(3), c(3), d(3);
  check_error_mentions(
      [&] {
        backend->adamw_update(host_tensor(a, {3}), host_tensor(b, {3}), host_tensor(c, {3}),
                              host_tensor(d, {3}), dp::AdamWParams{1e-3f, 1.0f, 0.9f, 1e-8f, 0, 1});
      },
      {"adamw_update", "beta1 must be in [0, 1)"});
  check_error_mentions(
      [&] {
        backend->adamw_update(host_tensor(a, {3}), host_tensor(b, {3}), host_tensor(c, {3}),
                              host_tensor(d, {3}), dp::AdamWParams{1e-3f, 0.9f, 0.9f, 1e-8f, 0, 0});
      },
      {"adamw_update", "step counts from 1"});
}

namespace {
// The packed bits of each value's rounding to bf16, by dp::round_bits_to_bf16.
std::vector<uint16_t> packed_reference(const fvec& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = dp::packed_bf16_bits(std::bit_cast<uint32_t>(v[i]));
  return out;
}
}  // namespace

TEST_CASE("cpu pack_bf16 and the optimizers' packed copy are the rounding of the parameters",
          "[cpu][ops][optimizer]") {
  auto backend = make_cpu();
  // pack_bf16 on the values whose rounding is not a plain truncation: ties both ways, a carry
  // into the exponent, overflow to infinity, a subnormal, -0, infinities and NaNs.
  const float inf = std::numeric_limits<float>::infinity();
  const fvec special = {1.0f + 0x1p-8f,                     // a tie, down to the even 1.0 (0x3F80)
                        1.0f + 3 * 0x1p-8f,                 // a tie, up to the even 0x3F82
                        1.0f + 0x1p-8f + 0x1p-20f,          // above the tie: up (0x3F81)
                        std::bit_cast<float>(0x3FFFFFFFu),  // carries into the exponent: 2.0
                        std::numeric_limits<float>::max(),  // rounds to +inf
                        std::bit_cast<float>(0x00012345u),  // a subnormal: 0x0001
                        -0.0f,
                        inf,
                        -inf,
                        std::numeric_limits<float>::quiet_NaN(),
                        std::bit_cast<float>(0xFF800001u)};  // a NaN whose payload rounds away
  const std::vector<uint16_t> expected = {0x3F80, 0x3F82, 0x3F81, 0x4000, 0x7F80, 0x0001,
                                          0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0};
  const auto n = static_cast<int64_t>(special.size());
  std::vector<uint16_t> packed(special.size(), 0xAAAA);
  fvec input = special;
  backend->pack_bf16(host_tensor(input, {n}), dp::Tensor(packed.data(), {n}, dp::DType::bf16));
  CHECK(packed == expected);
  CHECK(packed_reference(special) == expected);

  // Each update writes the copy of the parameters it leaves, and leaves the same parameters and
  // state as the update without one: SGD with Nesterov momentum and weight decay, and AdamW,
  // over 3 steps on 4099 values (the copy poisoned first: every value is written).
  const int64_t len = 4099;
  const auto ulen = static_cast<size_t>(len);
  std::vector<uint16_t> copy(ulen, 0xAAAA);
  const dp::Tensor copy_view(copy.data(), {len}, dp::DType::bf16);
  fvec plain = random_vector(len, 71), with = plain;
  fvec state_plain(2 * ulen, 0.0f), state_with = state_plain;
  const bool adamw = GENERATE(false, true);
  INFO((adamw ? "adamw_update" : "sgd_update"));
  for (int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    fvec g = random_vector(len, 80 + static_cast<uint64_t>(step), -2.0f, 2.0f);
    const auto run = [&](fvec& params, fvec& state, const dp::Tensor* copy_to) {
      const dp::Tensor m(state.data(), {len}), v(state.data() + ulen, {len});
      if (adamw) {
        backend->adamw_update(host_tensor(params, {len}), host_tensor(g, {len}), m, v,
                              dp::AdamWParams{3e-3f, 0.9f, 0.99f, 1e-8f, 1e-2f, step}, nullptr,
                              copy_to);
      } else {
        backend->sgd_update(host_tensor(params, {len}), host_tensor(g, {len}), &m,
                            dp::SgdParams{0.05f, 0.9f, 1e-2f, true}, nullptr, copy_to);
      }
    };
    run(plain, state_plain, nullptr);
    run(with, state_with, &copy_view);
    CHECK(std::equal(with.begin(), with.end(), plain.begin(), [](float a, float b) {
      return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
    }));
    CHECK(state_with == state_plain);
    CHECK(copy == packed_reference(with));
  }
}

TEST_CASE("optimizers are made by name from one table", "[optimizer]") {
  CHECK(dp::optimizer_table().size() == 2);
  dp::OptimizerOptions o;
  CHECK(dp::make_optimizer(o)->name() == "sgd");
  CHECK(dp::make_optimizer(o)->state_buffers() == 0);
  o.momentum = 0.9f;
  CHECK(dp::make_optimizer(o)->state_buffers() == 1);
  o.name = "adamw";
  CHECK(dp::make_optimizer(o)->state_buffers() == 2);
  o.name = "adam";
  CHECK_THROWS_WITH(dp::make_optimizer(o),
                    Catch::Contains("unknown optimizer \"adam\"") && Catch::Contains("sgd, adamw"));
  o = {};
  o.nesterov = true;
  CHECK_THROWS_WITH(dp::make_optimizer(o), Catch::Contains("Nesterov momentum needs momentum > 0"));
}

TEST_CASE("learning-rate schedules give every step's rate", "[optimizer]") {
  dp::LrSchedule s;
  s.base = 0.4;
  const int64_t per = 10, epochs = 4;  // 40 steps
  SECTION("constant, with and without warm-up") {
    for (int64_t t = 0; t < 40; ++t) CHECK(s.at(t, per, epochs) == 0.4);
    s.warmup_epochs = 1.5;  // 15 steps: 0.4 * (t + 1) / 15
    CHECK(s.at(0, per, epochs) == Approx(0.4 / 15));
    CHECK(s.at(14, per, epochs) == Approx(0.4));
    CHECK(s.at(7, per, epochs) == Approx(0.4 * 8 / 15));
    CHECK(s.at(15, per, epochs) == 0.4);
  }
  SECTION("step: gamma every step_epochs epochs, counted from the start") {
    s.kind = dp::LrSchedule::Kind::step;
    s.step_epochs = 2;
    s.gamma = 0.5;
    CHECK(s.at(0, per, epochs) == Approx(0.4));
    CHECK(s.at(19, per, epochs) == Approx(0.4));
    CHECK(s.at(20, per, epochs) == Approx(0.2));
    CHECK(s.at(39, per, epochs) == Approx(0.2));
    s.warmup_epochs = 1;
    CHECK(s.at(4, per, epochs) == Approx(0.4 * 5 / 10));
    CHECK(s.at(10, per, epochs) == Approx(0.4));
  }
  SECTION("cosine: PyTorch's CosineAnnealingLR over the steps after the warm-up") {
    s.kind = dp::LrSchedule::Kind::cosine;
    CHECK(s.at(0, per, epochs) == Approx(0.4));
    CHECK(s.at(20, per, epochs) == Approx(0.2));
    CHECK(s.at(39, per, epochs) ==
          Approx(0.4 * 0.5 * (1 + std::cos(std::numbers::pi * 39.0 / 40.0))));
    for (int64_t t = 1; t < 40; ++t) CHECK(s.at(t, per, epochs) < s.at(t - 1, per, epochs));
    s.warmup_epochs = 1;  // 10 warm-up steps, then the cosine over 30
    CHECK(s.at(9, per, epochs) == Approx(0.4));
    CHECK(s.at(10, per, epochs) == Approx(0.4));
    CHECK(s.at(25, per, epochs) == Approx(0.2));
  }
  CHECK(dp::parse_schedule_kind("cosine") == dp::LrSchedule::Kind::cosine);
  CHECK_THROWS_WITH(dp::parse_schedule_kind("linear"), Catch::Contains("constant, step, cosine"));
}

TEST_CASE("the trainer applies AdamW and the schedule per step, on every replica alike",
          "[engine][trainer][optimizer]") {
  bool real = false;
  const auto data = enginetest::training_data(256, 21, &real);
  const dp::ModelBuilder lenet = [] {
    return enginetest::build_model("libdprun_lenet.so", "lenet", {{"init_std", 0.1}});
  };
  auto o = dp::TrainerOptions{};
  o.batch_size = 50;  // 6 steps per epoch, the last of 6 examples
  o.epochs = 3;
  o.seed = 3;
  o.cpu_threads = 2;
  o.optimizer.name = "adamw";
  o.optimizer.weight_decay = 0.01f;
  o.lr.base = 2e-3;
  o.lr.kind = dp::LrSchedule::Kind::cosine;
  o.lr.warmup_epochs = 1;
  dp::Trainer one(o, lenet, data, data.head(64));
  const std::vector<float> initial = one.parameters(0);
  double first_loss = 0, last_loss = 0;
  for (int e = 1; e <= 3; ++e) {
    const auto r = one.run_epoch(e);
    CHECK(r.lr == Approx(o.lr.at(6 * e - 1, 6, 3)));  // the epoch's last step's rate
    if (e == 1) first_loss = r.train_loss;
    last_loss = r.train_loss;
  }
  CHECK(last_loss < first_loss);
  // Two replicas: AdamW's state is per replica but its inputs (summed gradients) are the same,
  // so they compute the one-replica steps, up to the gradients' summation order.
  auto o2 = o;
  o2.replicas = 2;
  dp::Trainer two(o2, lenet, data, data.head(64));
  for (int e = 1; e <= 3; ++e) two.run_epoch(e);
  CHECK(two.parameters(0) == two.parameters(1));
  const auto p1 = one.parameters(0), p2 = two.parameters(0);
  double diff = 0, moved = 0;
  for (size_t i = 0; i < p1.size(); ++i) {
    diff += (static_cast<double>(p2[i]) - p1[i]) * (static_cast<double>(p2[i]) - p1[i]);
    moved += (static_cast<double>(p1[i]) - initial[i]) * (static_cast<double>(p1[i]) - initial[i]);
  }
  // Compared with how far the 18 steps moved the parameters: a replica with its own state or
  // step count moves them by a different O(1) share. AdamW divides by sqrt(v), so an element
  // whose gradient is small is updated by ~lr whatever its size, and the gradients' summation
  // order (one batch of 50 or two of 25) decides its last bits. Measured here (norms of the
  // differences over that of the movement): 3.5e-7 with the OpenBLAS kernels, 3.1e-3 with
  // oneDNN's, whose weight gradients reduce over the batch in an order that depends on its
  // size (with SGD both stay at 2e-8 of the parameters). 3e-2 is ten times the larger.
  INFO("kernels: " << one.devices());
  CHECK(std::sqrt(diff / moved) <= 3e-2);
}
