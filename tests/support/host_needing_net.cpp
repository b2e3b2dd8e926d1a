#include "support/host_needing_net.hpp"

#include "dp/backend.hpp"
#include "dp/layers.hpp"

namespace dptest {

namespace {

// Passes its input through, and reads its first element back to the host on the way.
class Peeking final : public dp::Module {
 public:
  Peeking(PeekIn where, int64_t only_batch) : where_(where), only_batch_(only_batch) {}
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
  void peek(dp::RunContext& ctx, const dp::Tensor& t) const {
    if (only_batch_ > 0 && t.shape[0] != only_batch_) return;
    float first = 0;
    if (t.numel() > 0) ctx.backend.download(&first, t.data, sizeof first);
  }
  PeekIn where_;
  int64_t only_batch_;
};

}  // namespace

std::unique_ptr<dp::Module> host_needing_net(PeekIn where, int64_t only_batch) {
  auto net = std::make_unique<dp::Sequential>();
  net->add(std::make_unique<dp::Flatten>());
  net->add(std::make_unique<dp::Linear>(784, 32));
  net->add(
      std::make_unique<Peeking>(where, only_batch));  // its backward runs between the two layers'
  net->add(std::make_unique<dp::Linear>(32, 10));
  return net;
}

}  // namespace dptest
