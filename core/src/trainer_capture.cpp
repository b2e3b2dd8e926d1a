// The trainer's steps and evaluation chunks, run as they are or captured once per size and
// replayed (options.graphs), and graphs = "auto"'s test of whether a model's step can be captured
// at all.
#include <algorithm>
#include <cstdio>
#include <string>

#include "dp/backend.hpp"
#include "dp/comm.hpp"
#include "dp/error.hpp"
#include "trainer_impl.hpp"

namespace dp {

namespace {

using Graphs = std::vector<std::pair<int64_t, std::unique_ptr<CapturedOps>>>;

/// Captures ops() as the graph for `size` without running it; what the capture throws
/// propagates, the capture discarded.
void capture(Backend& b, Graphs& graphs, int64_t size, const std::function<void()>& ops) {
  b.begin_capture();
  try {
    ops();
    graphs.emplace_back(size, b.end_capture());
  } catch (...) {
    b.discard_capture();
    throw;
  }
}

/// capture(), except that the backend's refusal (the step needs the host: CaptureRefused) is
/// returned, with nothing kept; anything else propagates.
std::string capture_only(Backend& b, Graphs& graphs, int64_t size,
                         const std::function<void()>& ops) {
  try {
    capture(b, graphs, size, ops);
  } catch (const CaptureRefused& e) {
    return e.what();
  }
  return {};
}

}  // namespace

void Trainer::Impl::run_captured(Replica& r, Graphs& graphs, int64_t size, bool collectives,
                                 const std::function<void()>& ops) {
  if (!options.graphs) {
    ops();
    return;
  }
  Backend& b = *r.backend;
  auto it =
      std::find_if(graphs.begin(), graphs.end(), [&](const auto& g) { return g.first == size; });
  if (it == graphs.end()) {
    // A size setup did not capture (Trainer::step's batches). Under "auto", one whose capture is
    // refused runs eagerly from now on (a null graph marks it), as setup does for the trial.
    std::string refused;
    if (options.graphs_auto) {
      refused = capture_only(b, graphs, size, ops);
    } else {
      capture(b, graphs, size, ops);
    }
    if (!refused.empty()) {
      std::fprintf(stderr,
                   "dprun: warning: graphs = \"auto\": steps of %lld examples cannot be captured "
                   "in a CUDA graph, so they run without graphs: %s\n",
                   static_cast<long long>(size), refused.c_str());
      graphs.emplace_back(size, nullptr);
    }
    it = graphs.end() - 1;
  }
  if (it->second == nullptr) {
    ops();
    return;
  }
  const CapturedOps& step = *it->second;
  if (!collectives || !b.native_capture()) {
    b.replay(step);
    return;
  }
  // The graph's collectives run no host call: their communicators launch it, so an aborted
  // group refuses it and the launched work is watched.
  Communicator* grad = r.grad_comm;
  if (options.sync_bn) {
    grad->launch_captured([&] { r.comm->launch_captured([&] { b.replay(step); }); });
  } else {
    grad->launch_captured([&] { b.replay(step); });
  }
}

void Trainer::Impl::train_step(Replica& r, int64_t n) {
  run_captured(r, r.train_graphs, n, true, [&] { train_step_ops(r, n); });
}

void Trainer::Impl::eval_chunk(Replica& r, size_t set, int64_t m) {
  run_captured(r, r.evals[set].graphs, m, false, [&] { eval_chunk_ops(r, set, m); });
}

void Trainer::Impl::eval_chunk_ops(Replica& r, size_t set, int64_t m) {
  Replica::Eval& ev = r.evals[set];
  Backend& b = *r.backend;
  const Tensor x = r.x.with_batch(m), y = r.y.with_batch(m);
  const StepRow start{ev.start, r.eval_cursor};
  b.gather_batch(ev.images, ev.labels, ev.index, x, y, &start, r.eval_transform.get());
  RunContext ctx{b, *r.params, false, nullptr, 0, nullptr};
  const Tensor logits = r.model->forward(ctx, x);
  // The loss and the correct count in one pass; the gradient (scaled by 0) is not used.
  b.softmax_cross_entropy(logits, y, 0.0f, r.dlogits.with_batch(m), ev.loss_slots, ev.correct_slots,
                          &r.eval_cursor);
  b.advance(r.eval_cursor);
}

void Trainer::Impl::capture_or_run_eagerly() {
  // A capture records the ops without running them, and a step reads everything that changes
  // between steps from device memory (step tables, cursors): the graphs captured here, one per
  // training step size (the full batch, the epoch's last) and per evaluation chunk size, are the
  // ones the first epoch would capture, and they are kept. What a refused capture leaves on the
  // host (the gradient buckets' progress, the layers' saved tensors) is set afresh by the next
  // step; a plugin's own host state would see one partial step more.
  const bool local = options.graphs;  // "auto"'s choice for this process's device
  const int64_t count = train_meta.count, batch = options.batch_size;
  std::vector<int64_t> train_sizes{std::min(batch, count)};
  if (count > batch && count % batch != 0) train_sizes.push_back(count % batch);
  std::vector<std::string> refused(replicas.size());
  const auto clear_graphs = [&] {
    for (Replica& r : replicas) {
      r.train_graphs.clear();
      for (auto& e : r.evals) e.graphs.clear();
    }
  };
  if (local) {
    try {
      run_all([&](Replica& r) {
        std::string& why = refused[static_cast<size_t>(r.rank)];
        Backend& b = *r.backend;
        for (const int64_t n : train_sizes) {
          if (why.empty()) why = capture_only(b, r.train_graphs, n, [&] { train_step_ops(r, n); });
        }
        for (size_t set = 0; set < r.evals.size(); ++set) {
          std::vector<int64_t> sizes;
          for (const Unit& u : eval_units(r, set)) {
            if (std::find(sizes.begin(), sizes.end(), u.size) == sizes.end())
              sizes.push_back(u.size);
          }
          for (const int64_t m : sizes) {
            if (why.empty()) {
              why = capture_only(b, r.evals[set].graphs, m, [&] { eval_chunk_ops(r, set, m); });
            }
          }
        }
      });
    } catch (...) {
      // The constructor fails: graphs holding collectives must go before their communicators
      // (~Trainer, which does that, does not run for a constructor that throws).
      clear_graphs();
      throw;
    }
  }
  const auto first = std::find_if(refused.begin(), refused.end(),
                                  [](const std::string& why) { return !why.empty(); });
  // Every process of the trial runs alike, so the trial's graphs_used speaks for all of them.
  double off = !local || first != refused.end() ? 1.0 : 0.0;
  try {
    group->allreduce_sum(&off, 1);
  } catch (...) {
    clear_graphs();  // as above: another process failed, and this constructor fails too
    throw;
  }
  if (off == 0.0) return;
  // Every replica runs eagerly, whatever the others captured (nothing captured has run, so
  // nothing is lost).
  options.graphs = false;
  clear_graphs();
  if (first != refused.end()) {
    std::fprintf(stderr,
                 "dprun: warning: graphs = \"auto\": this model's step cannot be captured in a "
                 "CUDA graph, so its steps run without graphs: %s\n",
                 first->c_str());
  } else if (local) {
    std::fprintf(stderr,
                 "dprun: warning: graphs = \"auto\": another process of this trial runs its steps "
                 "without CUDA graphs (its replicas share a GPU, or its capture was refused), so "
                 "this one does too\n");
  }
}

}  // namespace dp
