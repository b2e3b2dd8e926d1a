#include "dp/module.hpp"

#include <algorithm>

#include "dp/error.hpp"
#include "module_util.hpp"

namespace dp {

// ---- Arena ------------------------------------------------------------------------------------

namespace {
constexpr size_t kArenaAlign = 256;
size_t round_up(size_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }
}  // namespace

Arena::Arena(Backend& backend, size_t block_bytes)
    : backend_(backend),
      block_bytes_(block_bytes),
      next_block_(std::min(block_bytes, kFirstBlock)) {
  DP_ASSERT(block_bytes_ >= kArenaAlign);
}

Arena::~Arena() {
  for (void* b : blocks_) backend_.release(b);
}

void* Arena::allocate_bytes(size_t bytes) {
  const size_t n = round_up(bytes == 0 ? 1 : bytes);
  // A request of half a block or more gets a block of its own, so the tail of the current block
  // is not wasted (activations of big models are often larger than a block).
  if (n >= block_bytes_ / 2) {
    void* p = backend_.allocate(n);
    blocks_.push_back(p);
    used_ += n;
    return p;
  }
  if (n > left_) {
    // Blocks grow from kFirstBlock, doubling up to block_bytes_: a replica whose small buffers
    // come to a few MiB (the planned block holds the rest) then holds a few MiB, not a 64 MiB
    // block mostly untouched (63 MiB of ResNet-18's and LeNet's totals until 2026-11-28).
    const size_t size = std::max(next_block_, n);
    next_block_ = std::min(2 * next_block_, block_bytes_);
    void* p = backend_.allocate(size);
    blocks_.push_back(p);
    cursor_ = static_cast<char*>(p);
    left_ = size;
  }
  void* p = cursor_;
  cursor_ += n;
  left_ -= n;
  used_ += n;
  return p;
}

Tensor Arena::allocate(Shape shape, DType dtype, Layout layout) {
  DP_ASSERT(shape.numel() >= 0);
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(allocate_bytes(bytes), shape, dtype, backend_.device(), layout);
}

void Arena::allocate_planned(Tensor& slot, Shape shape, DType dtype, Layout layout) {
  if (!plan_on_) {
    slot = allocate(shape, dtype, layout);
    return;
  }
  DP_ASSERT(shape.numel() >= 0);
  slot = Tensor(nullptr, shape, dtype, backend_.device(), layout);
  pending_.push_back(&slot);
}

void Arena::discard_planned() { pending_.clear(); }

void Arena::place_planned(const MemoryPlan& plan, size_t bound) {
  DP_ASSERT(plan.offsets.size() == pending_.size());
  char* base = plan.bytes > 0 ? static_cast<char*>(allocate_bytes(plan.bytes)) : nullptr;
  for (size_t i = 0; i < pending_.size(); ++i) {
    DP_ASSERT(plan.offsets[i] % kArenaAlign == 0 &&
              plan.offsets[i] + pending_[i]->bytes() <= plan.bytes);
    stats_.requested += round_up(pending_[i]->bytes());
    pending_[i]->data = base + plan.offsets[i];
  }
  stats_.placed += plan.bytes;
  stats_.bound += bound;
  pending_.clear();
}

// ---- Module -----------------------------------------------------------------------------------

Shape Module::setup(SetupContext& ctx, const Shape& input) {
  DP_CHECK(input.rank >= 1 && input[0] >= 1 && input.numel() > 0,
           std::string(type()) + ": setup needs an input shape with a batch of at least one, got " +
               input.str());
  input_ = input;
  // The outermost setup plans what every module below it made with Arena::allocate_planned,
  // once they all exist (a setup that throws leaves the depth as it found it).
  struct Depth {
    int& depth;
    explicit Depth(int& d) : depth(d) { ++depth; }
    ~Depth() { --depth; }
  };
  try {
    const Depth nested(ctx.depth);
    output_ = do_setup(ctx, input);
  } catch (...) {
    // The slots of a model that failed to set up may go with it: none is placed later.
    if (ctx.depth == 0) ctx.arena.discard_planned();
    throw;
  }
  if (ctx.depth == 0 && !ctx.arena.pending_planned().empty()) {
    // A training step: forward, the loss (reads the output), backward; the caller reads the
    // output and the input gradient after it.
    StepSchedule schedule(ctx.arena.pending_planned());
    const StepSchedule::Handle y = schedule_forward(schedule, {});
    schedule.keep(y);
    schedule.keep(schedule_backward(schedule, {}));
    const std::vector<BufferLifetime> lifetimes = schedule.lifetimes();
    ctx.arena.place_planned(plan_memory(lifetimes, kArenaAlign),
                            peak_live_bytes(lifetimes, kArenaAlign));
  }
  last_batch_ = -1;
  return output_;
}

StepSchedule::Handle Module::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  s.step();
  s.read(x);
  s.keep(x);
  return x;
}

StepSchedule::Handle Module::schedule_backward(StepSchedule& s, const StepSchedule::Handle& dy) {
  s.step();
  s.read(dy);
  return dy;
}

namespace {
// True when `actual` has the rank and per-example dims of `expected` and a batch in [0, max].
bool batch_compatible(const Shape& actual, const Shape& expected) {
  if (actual.rank != expected.rank || actual.rank < 1) return false;
  if (actual[0] < 0 || actual[0] > expected[0]) return false;
  for (int i = 1; i < actual.rank; ++i)
    if (actual[i] != expected[i]) return false;
  return true;
}
}  // namespace

Tensor Module::forward(RunContext& ctx, const Tensor& x) {
  DP_CHECK(input_.rank > 0, std::string(type()) + ": forward() called before setup()");
  DP_CHECK(batch_compatible(x.shape, input_),
           std::string(type()) + ": forward got input " + x.shape.str() + " but was set up for " +
               input_.str() + " (the batch may be smaller, every other dimension must match)");
  Tensor y = do_forward(ctx, x);
  DP_ASSERT(y.shape == output_.with_batch(x.shape[0]));
  last_batch_ = x.shape[0];
  return y;
}

Tensor Module::backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  DP_CHECK(last_batch_ >= 0, std::string(type()) + ": backward() called before forward()");
  const Shape expected = output_.with_batch(last_batch_);
  DP_CHECK(dy.shape == expected, std::string(type()) + ": backward got gradient " + dy.shape.str() +
                                     " but the last forward produced " + expected.str());
  Tensor dx = do_backward(ctx, dy, need_dx);
  if (need_dx) DP_ASSERT(dx.shape == input_.with_batch(last_batch_));
  return dx;
}

void Module::describe(std::ostream& os, int indent) const {
  os << type() << "()";
  detail::end_description(os, *this, indent);
}

namespace detail {

void end_description(std::ostream& os, const Module& m, int indent) {
  if (m.output_shape().rank > 0) os << "  -> " << m.output_shape().str();
  if (indent == 0) os << "\n";
}

void describe_children(std::ostream& os, const Module& m, int indent,
                       const std::vector<std::pair<std::string, const Module*>>& children) {
  os << m.type() << "(\n";
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  for (const auto& [name, child] : children) {
    os << pad << "(" << name << "): ";
    child->describe(os, indent + 2);
    os << "\n";
  }
  os << std::string(static_cast<size_t>(indent), ' ') << ")";
  end_description(os, m, indent);
}

}  // namespace detail

// ---- Sequential -------------------------------------------------------------------------------

Sequential& Sequential::add(std::unique_ptr<Module> m) {
  return add(std::to_string(mods_.size()), std::move(m));
}

Sequential& Sequential::add(const std::string& name, std::unique_ptr<Module> m) {
  DP_CHECK(m != nullptr, "Sequential::add('" + name + "'): the module is null");
  DP_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "Sequential::add: module name '" + name + "' must be non-empty and contain no '.'");
  for (const auto& [n, _] : mods_)
    DP_CHECK(n != name, "Sequential::add: a module named '" + name + "' already exists");
  if (!mods_.empty()) m->fold_previous(*mods_.back().second);
  mods_.emplace_back(name, std::move(m));
  return *this;
}

void Sequential::declare(ParamRegistry& registry, const std::string& prefix) {
  for (auto& [name, m] : mods_) m->declare(registry, prefix + name + ".");
}

void Sequential::describe(std::ostream& os, int indent) const {
  std::vector<std::pair<std::string, const Module*>> children;
  for (const auto& [name, m] : mods_) children.emplace_back(name, m.get());
  detail::describe_children(os, *this, indent, children);
}

std::vector<Module*> Sequential::children() {
  std::vector<Module*> out;
  for (auto& [_, m] : mods_) out.push_back(m.get());
  return out;
}

bool Sequential::takes_input(DType dtype, const SetupContext& ctx) const {
  return mods_.empty() ? dtype == DType::f32 : mods_.front().second->takes_input(dtype, ctx);
}

DType Sequential::output_dtype() const {
  return mods_.empty() ? DType::f32 : mods_.back().second->output_dtype();
}

Shape Sequential::do_setup(SetupContext& ctx, const Shape& input) {
  const bool input_grad = ctx.input_grad;
  Shape s = input;
  DType dtype = given_input_dtype();
  for (size_t i = 0; i < mods_.size(); ++i) {
    Module& m = *mods_[i].second;
    // Mirrors do_backward: only the first layer's input gradient may go unasked.
    ctx.input_grad = i > 0 || input_grad;
    // Its reader is the next module, or this container's readers.
    DType readers = readers_take();
    if (i + 1 < mods_.size()) {
      readers = mods_[i + 1].second->takes_input(DType::bf16, ctx) ? DType::bf16 : DType::f32;
    }
    m.set_input_dtype(dtype);
    m.set_readers_take(readers);
    s = m.setup(ctx, s);
    dtype = m.output_dtype();
  }
  ctx.input_grad = input_grad;
  return s;
}

Tensor Sequential::do_forward(RunContext& ctx, const Tensor& x) {
  Tensor t = x;
  for (auto& [name, m] : mods_) t = m->forward(ctx, t);
  return t;
}

StepSchedule::Handle Sequential::schedule_forward(StepSchedule& s, const StepSchedule::Handle& x) {
  StepSchedule::Handle t = x;
  for (auto& [name, m] : mods_) t = m->schedule_forward(s, t);
  return t;
}

StepSchedule::Handle Sequential::schedule_backward(StepSchedule& s,
                                                   const StepSchedule::Handle& dy) {
  StepSchedule::Handle g = dy;
  for (size_t i = mods_.size(); i-- > 0;) g = mods_[i].second->schedule_backward(s, g);
  return g;
}

Tensor Sequential::do_backward(RunContext& ctx, const Tensor& dy, bool need_dx) {
  Tensor g = dy;
  for (size_t i = mods_.size(); i-- > 0;) g = mods_[i].second->backward(ctx, g, i > 0 || need_dx);
  return need_dx ? g : Tensor();
}

}  // namespace dp
