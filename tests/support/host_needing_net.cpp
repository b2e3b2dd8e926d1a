#include "support/host_needing_net.hpp"

#include "dp/backend.hpp"
#include "dp/layers.hpp"

namespace dptest {

namespace {

// Passes its input through, and reads its first element back to the host on the way.
class Peeking final : public dp::Module {
 public:
  explicit Peeking(PeekIn where) : where_(where) {}
  const char* type() const override { return "Peeking"; }

 protected:
  dp::Shape do_setup(dp::SetupContext&, const dp::Shape& input) override { return input; }
  dp::Tensor do_forward(dp::RunContext& ctx, const dp::Tensor& x) override {
    if (where_ == PeekIn::forward) peek(ctx, x);
    return x;
  }
  dp::Tensor do_backward(dp::RunContext& ctx, const dp::Tensor& dy, bool) override {
    if (where_ == PeekIn::backward) peek(ctx, dy);
    return dy;
  }

 private:
  static void peek(dp::RunContext& ctx, const dp::Tensor& t) {
    float first = 0;
    if (t.numel() > 0) ctx.backend.download(&first, t.data, sizeof first);
  }
  PeekIn where_;
};

}  // namespace

std::unique_ptr<dp::Module> host_needing_net(PeekIn where) {
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(784, 32));
  net->add(std::make_unique<Peeking>(where));  // its backward runs between the two layers'
  net->add(std::make_unique<dp::Linear>(32, 10));
  return net;
}

}  // namespace dptest
