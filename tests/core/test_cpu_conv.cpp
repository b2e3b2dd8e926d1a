// CPU backend convolution: every pass against naive double-precision loops and central
// differences, for both kernel selections (oneDNN, im2col + OpenBLAS) and both layouts (NCHW,
// NHWC). With the oneDNN kernels the formulation follows the channels: multiples of 16 run
// oneDNN's blocked formats, other NHWC cases its NHWC kernels, other NCHW cases im2col with
// oneDNN's SGEMM, so the cases below reach each. Plus what the backend promises around the
// passes: batch sizes prepared at plan time, plans made on one thread and run on others.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "conv_test_util.hpp"
#include "dp/backend.hpp"
#include "support/check.hpp"
#include "support/env_var.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;
using dptest::host_tensor;
using dptest::random_vector;

namespace {

// Every case has odd or unequal sizes somewhere; one runs fewer images than planned.
const std::vector<ConvCase> kConvCases = {
    {"3x3 pad 1, odd sizes", 3, 5, 7, 9, 4, 3, 3, 1, 1, 1, 1},
    {"3x3 stride 2 pad 1 (ResNet downsampling)", 2, 3, 9, 8, 4, 3, 3, 2, 2, 1, 1},
    {"3x2 kernel, stride 2x1, pad 1x0", 2, 3, 8, 7, 6, 3, 2, 2, 1, 1, 0},
    {"1x1 stride 2, batch 1", 1, 2, 5, 5, 3, 1, 1, 2, 2, 0, 0},
    {"4x4 stride 3 pad 2", 2, 2, 10, 11, 2, 4, 4, 3, 3, 2, 2},
    {"5x5 valid, planned for 7 run with 5", 5, 4, 9, 8, 3, 5, 5, 1, 1, 0, 0, 7},
    {"16->16 3x3 pad 1 (whole channel blocks)", 2, 16, 5, 6, 16, 3, 3, 1, 1, 1, 1},
    {"32->16 1x1 stride 2 (a ResNet shortcut)", 2, 32, 7, 7, 16, 1, 1, 2, 2, 0, 0},
    {"16->16 3x3 stride 2 pad 1, batch 1 of 3", 1, 16, 9, 8, 16, 3, 3, 2, 2, 1, 1, 3},
    {"1->16 3x3 pad 1 (a stem)", 3, 1, 8, 8, 16, 3, 3, 1, 1, 1, 1},
};

// Tolerance of a forward pass against the double loops (relative, scaled by max(|a|, |b|, 1)):
// fp32 sums of up to C*R*S = 144 products of O(1) values stay within 1e-6 whatever order a
// kernel sums in, but oneDNN's Winograd F(4x4, 3x3) (3x3 stride-1 convolutions with whole
// channel blocks) also rounds in its input and output transforms: measured up to 1.0e-5 here.
// A wrong pass is off by O(1).
constexpr double kForwardTolerance = 3e-5;

const char* name_of(dp::Layout l) { return dp::layout_name(l); }

// Every pass of `a` gives the bits of the same pass of `b`, on the case's data from `seed`.
void check_same_bits(const ConvRunner& a, const ConvRunner& b, const ConvCase& cc, uint64_t seed) {
  const auto [x, w, bias, dy] = conv_data(cc, seed);
  CHECK(a.forward(x, w, &bias) == b.forward(x, w, &bias));
  CHECK(a.forward(x, w, nullptr) == b.forward(x, w, nullptr));
  CHECK(a.backward_data(dy, w) == b.backward_data(dy, w));
  fvec dw[2], db[2];
  a.backward_filter(x, dy, dw[0], &db[0]);
  b.backward_filter(x, dy, dw[1], &db[1]);
  CHECK(dw[0] == dw[1]);
  CHECK(db[0] == db[1]);
}

}  // namespace

TEST_CASE("cpu conv forward matches a naive reference", "[cpu][ops]") {
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("kernels " << dp::cpu_kernels_name(kernels) << ", layout " << name_of(layout));
  auto backend = make_cpu(2, kernels);
  for (const ConvCase& cc : kConvCases) {
    SECTION(cc.name) {
      const auto [x, w, b, dy] = conv_data(cc, 1);
      const ConvRunner run(*backend, cc, layout);
      check_close(run.forward(x, w, &b), conv_ref(cc, x, w, &b), kForwardTolerance);
      check_close(run.forward(x, w, nullptr), conv_ref(cc, x, w, nullptr), kForwardTolerance);
    }
  }
}

TEST_CASE("cpu conv backward: data, filter and bias gradients", "[cpu][ops]") {
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("kernels " << dp::cpu_kernels_name(kernels) << ", layout " << name_of(layout));
  auto backend = make_cpu(2, kernels);
  for (const ConvCase& cc : kConvCases) {
    SECTION(cc.name) {
      const auto [x, w, b, r] = conv_data(cc, 21);  // r: the loss weights = dy
      const ConvRunner run(*backend, cc, layout);
      const fvec dx = run.backward_data(r, w);
      fvec dw, db;
      run.backward_filter(x, r, dw, &db);
      // Analytic vs a double reference of the gradient: 1e-4 (the filter gradient sums
      // N*P*Q = up to 192 products per element, dx up to K*R*S = 288).
      dvec dx_ref, dw_ref, db_ref;
      conv_ref_grads(cc, x, w, r, dx_ref, dw_ref, db_ref);
      check_close(dx, dx_ref, 1e-4);
      check_close(dw, dw_ref, 1e-4);
      check_close(db, db_ref, 1e-4);
      // Analytic vs finite differences of the forward (step 1e-2, relative 1e-2).
      check_finite_differences([&](const fvec& v) { return run.forward(v, w, &b); }, x, r, dx);
      check_finite_differences([&](const fvec& v) { return run.forward(x, v, &b); }, w, r, dw);
      check_finite_differences([&](const fvec& v) { return run.forward(x, w, &v); }, b, r, db);
      // Without a bias gradient the filter gradient is the same.
      fvec dw2;
      run.backward_filter(x, r, dw2, nullptr);
      CHECK(dw2 == dw);
    }
  }
}

TEST_CASE("cpu conv LeNet conv2 shape, many chunks and threads", "[cpu][ops]") {
  // conv 20 -> 50, 5x5 on 13x13: the shape the speed work targets; 37 images are several
  // chunks with a partial last one, on 1 and 2 threads.
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("kernels " << dp::cpu_kernels_name(kernels) << ", layout " << name_of(layout));
  const ConvCase cc{"lenet conv2", 37, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0, 64};
  const auto [x, w, b, dy] = conv_data(cc, 11, 0.1f);
  const dvec expected = conv_ref(cc, x, w, &b);
  dvec dx_ref, dw_ref, db_ref;
  conv_ref_grads(cc, x, w, dy, dx_ref, dw_ref, db_ref);
  for (int threads : {1, 2}) {
    INFO("threads " << threads);
    auto backend = make_cpu(threads, kernels);
    const ConvRunner run(*backend, cc, layout);
    const size_t memory_before = backend->memory_in_use();
    const fvec y = run.forward(x, w, &b);
    const fvec dx = run.backward_data(dy, w);
    fvec dw, db;
    run.backward_filter(x, dy, dw, &db);
    // Scratch comes from the plan (the test's own tensors are host vectors).
    CHECK(backend->memory_in_use() == memory_before);
    // Sums of 500 (forward) to 37*81 = 2997 (filter gradient) fp32 products: 1e-4 relative.
    check_close(y, expected, 1e-4);
    check_close(dx, dx_ref, 1e-4);
    check_close(dw, dw_ref, 1e-4);
    check_close(db, db_ref, 1e-4);
  }
}

TEST_CASE("cpu conv prepares declared batch sizes at plan time, others on first use",
          "[cpu][ops]") {
  // The trainer declares every batch size an epoch runs; a pass of those must not allocate
  // (nor create oneDNN primitives) in the step loop. A size nobody declared still works.
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("kernels " << dp::cpu_kernels_name(kernels) << ", layout " << name_of(layout));
  auto backend = make_cpu(2, kernels);
  for (const ConvCase& base : {kConvCases[6], kConvCases[0]}) {  // blocked, and odd channels
    INFO(base.name);
    ConvCase cc = base;
    cc.max_batch = 7;
    dp::ConvUse use;
    use.train_batches = {5, 3};
    use.infer_batches = {7};
    const ConvRunner run(*backend, cc, layout, use);
    const size_t in_use = backend->memory_in_use(), peak = backend->peak_memory();
    const fvec w = random_vector(cc.k * cc.c * cc.r * cc.s, 32);
    for (int64_t n : {5, 3, 7}) {
      ConvCase at = cc;
      at.n = n;
      const fvec x = random_vector(n * cc.c * cc.h * cc.w, 31);
      check_close(run.forward(x, w, nullptr, n), conv_ref(at, x, w, nullptr), kForwardTolerance);
    }
    for (int64_t n : {5, 3}) {
      fvec x = random_vector(n * cc.c * cc.h * cc.w, 33);
      fvec dy = random_vector(n * cc.k * cc.p() * cc.q(), 34);
      fvec wa = w, dx(x.size()), dw(w.size());
      backend->conv_backward_data(*run.plan, host_tensor(dy, run.ys(n), layout),
                                  host_tensor(wa, run.ws()), host_tensor(dx, run.xs(n), layout));
      backend->conv_backward_filter(*run.plan, host_tensor(x, run.xs(n), layout),
                                    host_tensor(dy, run.ys(n), layout), host_tensor(dw, run.ws()),
                                    nullptr);
    }
    CHECK(backend->memory_in_use() == in_use);
    CHECK(backend->peak_memory() == peak);
    // Batch 2 was not declared: prepared now, and right.
    ConvCase two = cc;
    two.n = 2;
    const fvec x2 = random_vector(2 * cc.c * cc.h * cc.w, 35);
    check_close(run.forward(x2, w, nullptr, 2), conv_ref(two, x2, w, nullptr), kForwardTolerance);
  }
}

TEST_CASE("cpu conv plans made on one thread run on the replicas' threads", "[cpu][ops]") {
  // The trainer makes plans on a setup thread and runs each replica on its own thread (a new
  // one every epoch), several replicas at once; oneDNN primitives and scratch must not be tied
  // to the thread that created them, nor shared between backends.
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  INFO("kernels " << dp::cpu_kernels_name(kernels));
  const ConvCase cc = kConvCases[6];
  const ConvData data = conv_data(cc, 41);
  const fvec &x = data.x, &w = data.w, &dy = data.dy;
  const dvec y_ref = conv_ref(cc, x, w, nullptr);
  dvec dx_ref, dw_ref, db_ref;
  conv_ref_grads(cc, x, w, dy, dx_ref, dw_ref, db_ref);
  auto first = make_cpu(2, kernels), second = make_cpu(1, kernels);
  const ConvRunner in_nchw(*first, cc, dp::Layout::nchw), in_nhwc(*second, cc, dp::Layout::nhwc);
  std::vector<fvec> results(6);
  auto replica = [&](const ConvRunner& run, size_t slot) {
    for (int step = 0; step < 3; ++step) {
      results[slot] = run.forward(x, w, nullptr);
      results[slot + 1] = run.backward_data(dy, w);
      fvec db;
      run.backward_filter(x, dy, results[slot + 2], &db);
    }
  };
  for (int epoch = 0; epoch < 2; ++epoch) {  // fresh threads each time, as the trainer's
    std::thread ta(replica, std::cref(in_nchw), 0), tb(replica, std::cref(in_nhwc), 3);
    ta.join();
    tb.join();
    for (size_t slot : {size_t{0}, size_t{3}}) {
      check_close(results[slot], y_ref, kForwardTolerance);
      check_close(results[slot + 1], dx_ref, 1e-4);
      check_close(results[slot + 2], dw_ref, 1e-4);
    }
  }
}

TEST_CASE("cpu conv: every oneDNN formulation agrees with the reference", "[cpu][ops]") {
  // DPRUN_ONEDNN_CONV forces one formulation (im2col; native: the tensors' layout; nhwc:
  // activations reordered to NHWC; blocked: oneDNN's formats; winograd: those with Winograd's
  // algorithm where oneDNN has it; own-winograd: our Winograd F(4x4, 3x3) where it applies,
  // test_cpu_winograd.cpp) on every pass instead of the one chosen per pass; each must be right
  // on cases that would choose another.
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const std::string formulation =
      GENERATE("im2col", "native", "nhwc", "blocked", "winograd", "own-winograd");
  INFO("formulation " << formulation << ", layout " << name_of(layout));
  for (const ConvCase& cc : {kConvCases[1], kConvCases[6], kConvCases[9]}) {
    INFO(cc.name);
    setenv("DPRUN_ONEDNN_CONV", formulation.c_str(), 1);
    auto backend = make_cpu(2, dp::CpuKernels::onednn);
    const ConvRunner run(*backend, cc, layout);
    unsetenv("DPRUN_ONEDNN_CONV");  // read when the plan is made
    const auto [x, w, b, dy] = conv_data(cc, 51);
    dvec dx_ref, dw_ref, db_ref;
    conv_ref_grads(cc, x, w, dy, dx_ref, dw_ref, db_ref);
    check_close(run.forward(x, w, &b), conv_ref(cc, x, w, &b), kForwardTolerance);
    check_close(run.backward_data(dy, w), dx_ref, 1e-4);
    fvec dw, db;
    run.backward_filter(x, dy, dw, &db);
    check_close(dw, dw_ref, 1e-4);
    check_close(db, db_ref, 1e-4);
  }
  setenv("DPRUN_ONEDNN_CONV", "fft", 1);
  auto backend = make_cpu(1, dp::CpuKernels::onednn);
  check_error_mentions(
      [&] { backend->plan_conv(kConvCases[0].geometry()); },
      {"DPRUN_ONEDNN_CONV=fft", "im2col, native, nhwc, blocked, winograd or own-winograd"});
  unsetenv("DPRUN_ONEDNN_CONV");
}

TEST_CASE(
    "cpu conv: with a planned workspace every formulation works in the caller's memory, with "
    "the bits of the backend's own scratch",
    "[cpu][ops][memory_plan]") {
  // ConvUse::planned_workspace: the plan keeps no scratch, says what its passes need
  // (workspace_bytes), and works in the workspace it is given, which the runner fills with NaNs
  // before every pass and guards with a canary after it. Each formulation (forced as above, and
  // the automatic choice; "blas": the OpenBLAS kernels' im2col) must give the bits of the same
  // plan without one, also for a batch size nobody declared (5 of the 7 planned: a oneDNN pass
  // made in the step loop). The planned plan has a backend of its own, whose memory must not grow
  // in the passes it declared: a pass that needed more than its workspace would have run in the
  // backend's shared scratch, grown for it.
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const std::string formulation =
      GENERATE("auto", "blas", "im2col", "native", "nhwc", "blocked", "winograd", "own-winograd");
  INFO("formulation " << formulation << ", layout " << name_of(layout));
  const dp::CpuKernels kernels =
      formulation == "blas" ? dp::CpuKernels::blas : dp::CpuKernels::onednn;
  for (const ConvCase& cc :
       {kConvCases[1], kConvCases[5], kConvCases[6], kConvCases[7], kConvCases[9]}) {
    INFO(cc.name);
    const dptest::EnvVar forced("DPRUN_ONEDNN_CONV", formulation == "blas"
                                                         ? std::optional<std::string>()
                                                         : std::optional(formulation));
    auto backend = make_cpu(2, kernels), planned_backend = make_cpu(2, kernels);
    dp::ConvUse planned_use;
    planned_use.planned_workspace = true;
    const ConvRunner own(*backend, cc, layout);
    const ConvRunner planned(*planned_backend, cc, layout, planned_use);
    const size_t set_up = planned_backend->peak_memory();
    CHECK(own.plan->workspace_bytes(dp::ConvStage::forward) == 0);
    // Every formulation works in some scratch: im2col's columns, Winograd's tiles, oneDNN's
    // reordered tensors and scratchpad.
    CHECK(planned.plan->workspace_bytes(dp::ConvStage::forward) > 0);
    CHECK(planned.plan->workspace_bytes(dp::ConvStage::backward) > 0);
    check_same_bits(planned, own, cc, 61);
    // Right, too (the NaNs would have shown as NaN or as a wrong value).
    const auto [x, w, b, dy] = conv_data(cc, 61);
    check_close(planned.forward(x, w, &b), conv_ref(cc, x, w, &b), kForwardTolerance);
    CHECK(planned.tails_intact());
    if (cc.max_batch == 0) CHECK(planned_backend->peak_memory() == set_up);
  }
}

TEST_CASE(
    "cpu conv: a plan with a planned workspace still runs a pass nobody declared, in its own "
    "scratch",
    "[cpu][ops][memory_plan]") {
  // Declared for evaluation only, a oneDNN plan needs no backward workspace (workspace_bytes 0,
  // so the caller gives none); its backward passes, made when first met, run in the backend's
  // shared scratch and give the bits of a plan that declared them.
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  INFO("layout " << name_of(layout));
  const ConvCase& cc = kConvCases[6];  // 16->16 3x3: oneDNN's kernels in every direction
  auto backend = make_cpu(2, dp::CpuKernels::onednn);
  dp::ConvUse infer;
  infer.infer_batches = {cc.n};
  infer.planned_workspace = true;
  const ConvRunner planned(*backend, cc, layout, infer);
  const ConvRunner own(*backend, cc, layout);
  CHECK(planned.plan->workspace_bytes(dp::ConvStage::forward) > 0);
  CHECK(planned.plan->workspace_bytes(dp::ConvStage::backward) == 0);
  check_same_bits(planned, own, cc, 71);
}

TEST_CASE(
    "cpu conv: a (K, R, S, C) filter gives the bits of the (K, C, R, S) filter in every "
    "formulation and precision, with and without a planned workspace",
    "[cpu][ops]") {
  // ConvUse::filter_layout nhwc (an NHWC model's Conv2d weight): the backend reads the filter
  // from, and writes its gradient through, a (K, C, R, S) copy among the pass's operand copies,
  // so each formulation sees the same filter. Every pass compared bit for bit (the runner
  // converts to and from the filter's order); the planned workspace holds the copies (the
  // runner's NaN fill and canary would show a copy outside it).
  const std::string formulation = GENERATE("auto", "blas", "im2col", "blocked", "own-winograd");
  const dp::Precision precision = GENERATE(dp::Precision::fp32, dp::Precision::bf16);
  const bool planned = GENERATE(false, true);
  INFO("formulation " << formulation << ", " << dp::precision_name(precision)
                      << (planned ? ", planned workspace" : ""));
  const dptest::EnvVar forced("DPRUN_ONEDNN_CONV", formulation == "auto" || formulation == "blas"
                                                       ? std::optional<std::string>()
                                                       : std::optional(formulation));
  dp::BackendOptions o;
  o.kind = dp::BackendKind::cpu;
  o.cpu_threads = 2;
  o.cpu_kernels = formulation == "blas" ? dp::CpuKernels::blas : dp::CpuKernels::onednn;
  o.precision = precision;
  auto backend = dp::create_backend(o);
  for (const ConvCase& cc :
       {kConvCases[0], kConvCases[2], kConvCases[5], kConvCases[6], kConvCases[7], kConvCases[9]}) {
    INFO(cc.name);
    dp::ConvUse use;
    use.planned_workspace = planned;
    const ConvRunner kcrs(*backend, cc, dp::Layout::nhwc, use);
    use.filter_layout = dp::Layout::nhwc;
    const ConvRunner krsc(*backend, cc, dp::Layout::nhwc, use);
    REQUIRE(krsc.filters() == dp::Layout::nhwc);
    // oneDNN's passes read the filter as it is (its reorder takes ohwi as well as oihw): no copy,
    // so no more workspace; im2col's take a (K, C, R, S) copy, and its gradient's room (in fp32:
    // bf16's rounded copy of w is that copy, and dw's room may fit beside the larger pass).
    if (planned) {
      for (const dp::ConvStage stage : {dp::ConvStage::forward, dp::ConvStage::backward}) {
        const size_t with = krsc.plan->workspace_bytes(stage);
        const size_t without = kcrs.plan->workspace_bytes(stage);
        if (formulation == "blocked") CHECK(with == without);
        if ((formulation == "im2col" || formulation == "blas") &&
            precision == dp::Precision::fp32)
          CHECK(with > without);
      }
    }
    check_same_bits(krsc, kcrs, cc, 81);
    CHECK(krsc.tails_intact());
  }
}

TEST_CASE("cpu conv rejects bad shapes, layouts and dtypes with clear errors", "[cpu][ops]") {
  const dp::CpuKernels kernels = CPU_KERNELS_UNDER_TEST();
  INFO("kernels " << dp::cpu_kernels_name(kernels));
  auto backend = make_cpu(2, kernels);
  const ConvCase cc = kConvCases[0];
  auto plan = backend->plan_conv(cc.geometry());
  fvec x(static_cast<size_t>(cc.n * cc.c * cc.h * cc.w)), w(static_cast<size_t>(cc.k * 45)),
      y(static_cast<size_t>(cc.n * cc.k * cc.p() * cc.q()));
  auto wrong_w = host_tensor(w, {cc.k, cc.c, 3, 3});
  wrong_w.shape = dp::Shape{cc.k, cc.c, 5, 1};
  check_error_mentions(
      [&] {
        backend->conv_forward(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}), wrong_w, nullptr,
                              host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()}));
      },
      {"conv_forward", "w", "(4, 5, 5, 1)"});
  // x in NHWC for an NCHW plan.
  check_error_mentions(
      [&] {
        backend->conv_forward(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}, dp::Layout::nhwc),
                              host_tensor(w, {cc.k, cc.c, 3, 3}), nullptr,
                              host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()}));
      },
      {"conv_forward", "nhwc"});
  dp::ConvGeometry bf16 = cc.geometry();
  bf16.dtype = dp::DType::bf16;
  check_error_mentions([&] { backend->plan_conv(bf16); }, {"plan_conv", "bf16", "use f32"});
  // Outputs without memory are errors that name the argument, not a crash.
  const dp::Tensor no_memory(nullptr, {cc.n, cc.k, cc.p(), cc.q()});
  check_error_mentions(
      [&] {
        backend->conv_forward(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}),
                              host_tensor(w, {cc.k, cc.c, 3, 3}), nullptr, no_memory);
      },
      {"conv_forward", "y", "null"});
  check_error_mentions(
      [&] {
        backend->conv_backward_data(*plan, host_tensor(y, {cc.n, cc.k, cc.p(), cc.q()}),
                                    host_tensor(w, {cc.k, cc.c, 3, 3}),
                                    dp::Tensor(nullptr, {cc.n, cc.c, cc.h, cc.w}));
      },
      {"conv_backward_data", "dx", "null"});
  check_error_mentions(
      [&] {
        backend->conv_backward_filter(*plan, host_tensor(x, {cc.n, cc.c, cc.h, cc.w}), no_memory,
                                      host_tensor(w, {cc.k, cc.c, 3, 3}), nullptr);
      },
      {"conv_backward_filter", "dy", "null"});
}
