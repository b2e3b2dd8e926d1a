// The batch-norm epilogue (residual add, ReLU, fused into the batch norm's pass) on the CPU: for
// every op that takes one, the fused call must give bit for bit what the separate ops give one
// after the other (batch norm, add, relu_forward; relu_backward, then the batch norm's
// backward). That is the contract backend.hpp states, and what makes a fused model train exactly
// like an unfused one. The separate ops are tested against naive references and finite
// differences elsewhere (test_cpu_ops_norm_loss.cpp, test_layers.cpp); the fused layers are
// checked against finite differences in test_layers.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "dp/backend.hpp"
#include "support/check.hpp"
#include "test_cpu_util.hpp"

using namespace cputest;
using dptest::host_tensor;
using dptest::random_vector;

namespace {

struct EpilogueCase {
  const char* name;
  bool residual, relu;
};
const EpilogueCase kEpilogues[] = {
    {"ReLU", false, true}, {"residual", true, false}, {"residual + ReLU", true, true}};

struct ShapeCase {
  const char* name;
  dp::Shape shape;
};
const ShapeCase kShapes[] = {
    {"odd sizes", dp::Shape{3, 5, 7, 9}},
    {"(N, C) features", dp::Shape{6, 7}},
    // NHWC takes channels 1024 at a time (batchnorm_nhwc_cpu.cpp): a second, partial slice.
    {"1030 channels", dp::Shape{2, 1030, 3, 2}},
};

// Bit-for-bit equality (NaN never arises here: the inputs are finite).
void check_same(const fvec& actual, const fvec& expected, const char* what) {
  INFO(what);
  REQUIRE(actual.size() == expected.size());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] != expected[i] && differ++ == 0) first = i;
  }
  INFO("first difference at " << first << ": " << (differ ? actual[first] : 0.0f) << " vs "
                              << (differ ? expected[first] : 0.0f));
  CHECK(differ == 0);
}

// The inputs of one case: x spread around its mean so that the ReLU cuts a good part.
struct Inputs {
  fvec x, residual, dy, gamma, beta, rm, rv;
};

Inputs make_inputs(const dp::Shape& s) {
  const int64_t C = s[1];
  Inputs in{random_vector(s.numel(), 301, -2.0f, 2.0f),
            random_vector(s.numel(), 302, -1.0f, 1.0f),
            random_vector(s.numel(), 303),
            random_vector(C, 304, 0.5f, 1.5f),
            random_vector(C, 305, -0.5f, 0.5f),
            random_vector(C, 306),
            random_vector(C, 307, 0.5f, 2.0f)};
  return in;
}

}  // namespace

TEST_CASE("cpu batch norm with a fused epilogue equals batch norm, add and ReLU one by one",
          "[cpu][ops]") {
  const dp::Layout layout = GENERATE(dp::Layout::nchw, dp::Layout::nhwc);
  const int threads = GENERATE(1, 2);
  INFO("layout " << dp::layout_name(layout) << ", " << threads << " threads");
  auto b = make_cpu(threads);
  const float momentum = 0.1f, eps = 1e-5f;
  for (const ShapeCase& sc : kShapes) {
    for (const EpilogueCase& ec : kEpilogues) {
      SECTION(std::string(sc.name) + ", " + ec.name) {
        const dp::Shape& s = sc.shape;
        const dp::Layout lx = s.rank == 4 ? layout : dp::Layout::nchw;
        const int64_t C = s[1];
        const dp::Shape cs{C}, cs2{2 * C};
        Inputs in = make_inputs(s);
        auto T = [&](fvec& v) { return host_tensor(v, s, lx); };
        auto V = [&](fvec& v) { return host_tensor(v, cs); };
        const size_t n = in.x.size();

        // ---- training forward: the plain batch norm first, then a few residual values set to
        // -bn(x), so that some sums are exactly 0 and the separate ReLU's "x < 0" and the
        // mask's "y > 0" are both exercised at 0.
        fvec rm0 = in.rm, rv0 = in.rv, sm0(C), si0(C), y0(n);
        b->batchnorm_forward_train(T(in.x), V(in.gamma), V(in.beta), V(rm0), V(rv0), momentum, eps,
                                   V(sm0), V(si0), T(y0));
        if (ec.residual) {
          for (size_t i = 0; i < n; i += 17) in.residual[i] = -y0[i];
        }
        const dp::Tensor res = T(in.residual);
        const dp::BnEpilogue epilogue{ec.residual ? &res : nullptr, ec.relu};
        fvec rm1 = in.rm, rv1 = in.rv, sm1(C), si1(C), y1(n);
        b->batchnorm_forward_train(T(in.x), V(in.gamma), V(in.beta), V(rm1), V(rv1), momentum, eps,
                                   V(sm1), V(si1), T(y1), epilogue);
        fvec y2 = y0;
        if (ec.residual) b->add(T(y2), T(in.residual), T(y2));
        if (ec.relu) b->relu_forward(T(y2), T(y2));
        check_same(y1, y2, "y");
        check_same(sm1, sm0, "save_mean");
        check_same(si1, si0, "save_invstd");
        check_same(rm1, rm0, "running_mean");
        check_same(rv1, rv0, "running_var");
        if (ec.relu) {
          size_t zeros = 0;
          for (float v : y1) zeros += v == 0.0f;
          CHECK(zeros > n / 4);  // the ReLU cuts a good part: the mask is exercised
        }

        // ---- inference forward.
        fvec yi1(n), yi2(n);
        b->batchnorm_forward_infer(T(in.x), V(in.gamma), V(in.beta), V(in.rm), V(in.rv), eps,
                                   T(yi1), epilogue);
        b->batchnorm_forward_infer(T(in.x), V(in.gamma), V(in.beta), V(in.rm), V(in.rv), eps,
                                   T(yi2));
        if (ec.residual) b->add(T(yi2), T(in.residual), T(yi2));
        if (ec.relu) b->relu_forward(T(yi2), T(yi2));
        check_same(yi1, yi2, "inference y");

        // ---- backward. Without a ReLU the epilogue needs nothing in backward (dy is the
        // gradient of bn(x) and of the residual alike).
        if (!ec.relu) return;
        fvec dz1(n), dx1(n), dg1(C), db1(C), dz2(n), dx2(n), dg2(C), db2(C);
        const dp::Tensor yt = T(y1), dzt = T(dz1);
        b->batchnorm_backward(T(in.x), T(in.dy), V(in.gamma), V(sm1), V(si1), eps, T(dx1), V(dg1),
                              V(db1), {&yt, &dzt});
        b->relu_backward(T(y1), T(in.dy), T(dz2));
        b->batchnorm_backward(T(in.x), T(dz2), V(in.gamma), V(sm1), V(si1), eps, T(dx2), V(dg2),
                              V(db2));
        check_same(dz1, dz2, "dz");
        // And against the mask written out here, not through relu_backward (which the NHWC
        // fused path shares): dz = dy where y > 0, else 0, element by element in any layout.
        fvec dz_naive(n);
        for (size_t i = 0; i < dz_naive.size(); ++i) dz_naive[i] = y1[i] > 0.0f ? in.dy[i] : 0.0f;
        check_same(dz1, dz_naive, "dz (naive mask)");
        check_same(dx1, dx2, "dx");
        check_same(dg1, dg2, "dgamma");
        check_same(db1, db2, "dbeta");

        // ---- the synchronised pieces: apply_stats with the epilogue, backward sums with its
        // gradient (then backward_apply takes dz as its dy, as BatchNorm2d does).
        fvec mean = sm1, var(C);
        for (int64_t c = 0; c < C; ++c) var[c] = 1.0f / (si1[c] * si1[c]) - eps;
        const int64_t count = s.numel() / C;
        fvec ya(n), yb(n), ra = in.rm, va = in.rv, rb = in.rm, vb = in.rv, sma(C), sia(C), smb(C),
                           sib(C);
        b->batchnorm_apply_stats(T(in.x), V(in.gamma), V(in.beta), V(mean), V(var), V(ra), V(va),
                                 momentum, eps, count, V(sma), V(sia), T(ya), epilogue);
        b->batchnorm_apply_stats(T(in.x), V(in.gamma), V(in.beta), V(mean), V(var), V(rb), V(vb),
                                 momentum, eps, count, V(smb), V(sib), T(yb));
        if (ec.residual) b->add(T(yb), T(in.residual), T(yb));
        b->relu_forward(T(yb), T(yb));
        check_same(ya, yb, "apply_stats y");
        check_same(ra, rb, "apply_stats running_mean");
        fvec sums1(2 * C), sums2(2 * C), dza(n), dzb(n);
        const dp::Tensor yat = T(ya), dzat = T(dza);
        b->batchnorm_backward_sums(T(in.x), T(in.dy), V(sma), V(sia), host_tensor(sums1, cs2),
                                   {&yat, &dzat});
        b->relu_backward(T(ya), T(in.dy), T(dzb));
        b->batchnorm_backward_sums(T(in.x), T(dzb), V(sma), V(sia), host_tensor(sums2, cs2));
        check_same(dza, dzb, "backward_sums dz");
        for (size_t i = 0; i < dz_naive.size(); ++i) dz_naive[i] = ya[i] > 0.0f ? in.dy[i] : 0.0f;
        check_same(dza, dz_naive, "backward_sums dz (naive mask)");
        check_same(sums1, sums2, "backward_sums");
      }
    }
  }
}

TEST_CASE("cpu batch norm epilogue on a replica with no examples", "[cpu][ops]") {
  // Synchronised batch norm runs its pieces on an empty shard too; the epilogue then has
  // nothing to write, and the sums are zero.
  auto b = make_cpu();
  const dp::Shape s{0, 3, 2, 2}, cs{3}, cs2{6};
  fvec empty, g(3, 1.0f), z(3, 0.0f), ones(3, 1.0f), sm(3), si(3), sums(6, 7.0f);
  const dp::Tensor e = host_tensor(empty, s, dp::Layout::nhwc);
  b->batchnorm_apply_stats(e, host_tensor(g, cs), host_tensor(z, cs), host_tensor(z, cs),
                           host_tensor(ones, cs), host_tensor(z, cs), host_tensor(ones, cs), 0.1f,
                           1e-5f, 8, host_tensor(sm, cs), host_tensor(si, cs), e, {&e, true});
  b->batchnorm_backward_sums(e, e, host_tensor(sm, cs), host_tensor(si, cs), host_tensor(sums, cs2),
                             {&e, &e});
  CHECK(sums == fvec(6, 0.0f));
}
