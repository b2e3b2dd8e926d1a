// CUDA communicators: NCCL between distinct GPUs, a same-device path for replicas sharing one
// GPU. The design (ordering, failure handling) is described in cuda_comm.hpp.
#include "cuda/cuda_comm.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_comm_entry.hpp"
#include "cuda/kernels.cuh"
#include "cuda/lib_check.hpp"
#include "dp/error.hpp"
#include "dp/process_group.hpp"

namespace dp::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// How long a rank waits for its peers (host barrier, enqueue, GPU completion) before the group
// is declared dead: dp::comm_timeout() ($DPRUN_COMM_TIMEOUT_S).
std::string timeout_text() { return comm_timeout_text(); }

/// Abort state shared by the ranks of one group.
class AbortFlag {
 public:
  bool set(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load()) return false;
    reason_ = reason;
    aborted_.store(true);
    return true;
  }
  bool is_set() const { return aborted_.load(); }
  [[noreturn]] void raise(const char* what) const {
    std::lock_guard<std::mutex> lock(mutex_);
    throw AbortedError(std::string(what) + ": the collective was aborted (" + reason_ + ")");
  }

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> aborted_{false};
  std::string reason_;
};

/// A reusable host barrier that gives up when the group is aborted or after the timeout.
class HostBarrier {
 public:
  HostBarrier(int n, AbortFlag& flag) : n_(n), flag_(flag) {}

  /// Returns when all n ranks have arrived. Throws AbortedError when the group is (or gets)
  /// aborted; on timeout aborts the group and throws dp::Error.
  void wait(const char* what) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (flag_.is_set()) {
      lock.unlock();
      flag_.raise(what);
    }
    const uint64_t generation = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const bool done = cv_.wait_for(lock, comm_timeout(),
                                   [&] { return generation_ != generation || flag_.is_set(); });
    if (generation_ != generation) return;
    lock.unlock();
    if (done) flag_.raise(what);  // woken by an abort
    const std::string reason = std::string(what) + ": timed out after " + timeout_text() +
                               " waiting for the other ranks (one died or hangs)";
    flag_.set(reason);
    wake();
    throw Error(reason);
  }

  void wake() {
    std::lock_guard<std::mutex> lock(mutex_);
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  AbortFlag& flag_;
};

/// Waits for a stream without blocking in the driver, so an abort or the timeout can end it.
void wait_stream(cudaStream_t stream, AbortFlag& flag, const char* what) {
  const auto deadline = Clock::now() + comm_timeout();
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) CUDA_CHECK(status);
    if (flag.is_set()) flag.raise(what);
    if (Clock::now() > deadline) {
      const std::string reason =
          std::string(what) + ": this rank's GPU work did not finish within " + timeout_text();
      flag.set(reason);
      throw Error(reason);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

CudaBackend* as_cuda(Backend* b, size_t rank) {
  auto* cb = dynamic_cast<CudaBackend*>(b);
  if (cb == nullptr) {
    throw Error("cuda communicators: rank " + std::to_string(rank) + " runs on the " +
                (b ? b->name() : std::string("(null)")) +
                " backend; every rank must use the cuda backend");
  }
  return cb;
}

cudaEvent_t make_event(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// ==== fault injection (tests)
// ======================================================================

std::atomic<int> injected_init_failure{-1};

/// Throws once, right after rank `rank`'s communicator was created inside the group, when a
/// test asked for it (inject_nccl_init_failure).
void take_injected_init_failure(int rank) {
  int expected = rank;
  if (injected_init_failure.compare_exchange_strong(expected, -1)) {
    throw Error("injected failure of NCCL initialisation after rank " + std::to_string(rank) +
                " (a test asked for it)");
  }
}

// ==== same device
// =================================================================================

struct SameDeviceGroup {
  explicit SameDeviceGroup(std::vector<CudaBackend*> b)
      : backends(std::move(b)),
        size(static_cast<int>(backends.size())),
        barrier(size, aborted),
        data(backends.size()),
        counts(backends.size()) {
    for (auto* backend : backends) {
      ready.push_back(make_event(backend->device_index()));
      done.push_back(make_event(backend->device_index()));
    }
  }
  ~SameDeviceGroup() {
    for (size_t r = 0; r < backends.size(); ++r) {
      CUDA_WARN(cudaSetDevice(backends[r]->device_index()));
      if (r < ready.size()) CUDA_WARN(cudaEventDestroy(ready[r]));
      if (r < done.size()) CUDA_WARN(cudaEventDestroy(done[r]));
    }
  }

  std::vector<CudaBackend*> backends;
  int size;
  AbortFlag aborted;
  HostBarrier barrier;
  std::vector<cudaEvent_t> ready, done;  // per rank: after its inputs / after its part of the sum
  std::vector<float*> data;              // published between the two barriers of a collective
  std::vector<size_t> counts;
};

class SameDeviceCommunicator final : public Communicator {
 public:
  SameDeviceCommunicator(std::shared_ptr<SameDeviceGroup> group, int rank)
      : group_(std::move(group)), rank_(rank), backend_(group_->backends[rank]) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string kind() const override { return "cuda-same-device"; }

  void allreduce_sum(float* data, size_t count) override {
    SameDeviceGroup& g = *group_;
    if (g.aborted.is_set()) g.aborted.raise("allreduce_sum");
    if (g.size == 1) return;
    refuse_capture("allreduce_sum");
    backend_->activate();
    cudaStream_t stream = backend_->stream();
    publish(data, count, "allreduce_sum");
    kernels::RankPointers ranks{};
    ranks.count = g.size;
    for (int s = 0; s < g.size; ++s) ranks.p[s] = g.data[static_cast<size_t>(s)];
    const int64_t n = static_cast<int64_t>(count);
    const int64_t begin = n * rank_ / g.size, end = n * (rank_ + 1) / g.size;
    kernels::sum_across_ranks(ranks, begin, end, stream);
    finish(stream, "allreduce_sum");
  }

  void broadcast(float* data, size_t count, int root) override {
    SameDeviceGroup& g = *group_;
    if (root < 0 || root >= g.size) {
      throw Error("broadcast: root " + std::to_string(root) + " is not a rank of this group of " +
                  std::to_string(g.size));
    }
    if (g.aborted.is_set()) g.aborted.raise("broadcast");
    if (g.size == 1) return;
    refuse_capture("broadcast");
    backend_->activate();
    cudaStream_t stream = backend_->stream();
    publish(data, count, "broadcast");
    if (rank_ != root && count > 0) {
      CUDA_CHECK(cudaMemcpyAsync(data, g.data[static_cast<size_t>(root)], count * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream));
    }
    // The root must not overwrite its buffer before every rank has copied it: finish() makes
    // every stream wait for every other rank's copy.
    finish(stream, "broadcast");
  }

  void barrier() override {
    SameDeviceGroup& g = *group_;
    backend_->activate();
    wait_stream(backend_->stream(), g.aborted, "barrier");
    g.barrier.wait("barrier");
  }

  void abort() noexcept override {
    group_->aborted.set("rank " + std::to_string(rank_) + " failed and called abort()");
    group_->barrier.wake();
  }

 private:
  /// The ranks' streams meet through host barriers and events between streams, which a CUDA
  /// graph of one stream cannot hold.
  void refuse_capture(const char* what) const {
    if (backend_->capturing()) {
      throw CaptureRefused(
          std::string(what) +
          ": replicas sharing one GPU cannot be captured in CUDA graphs (their "
          "collectives meet on the host); run them without graphs, or one per GPU");
    }
  }

  /// Records this rank's inputs as ready, exchanges buffers, and orders this stream after every
  /// rank's inputs.
  void publish(float* data, size_t count, const char* what) {
    SameDeviceGroup& g = *group_;
    cudaStream_t stream = backend_->stream();
    g.data[static_cast<size_t>(rank_)] = data;
    g.counts[static_cast<size_t>(rank_)] = count;
    CUDA_CHECK(cudaEventRecord(g.ready[static_cast<size_t>(rank_)], stream));
    g.barrier.wait(what);
    for (int s = 0; s < g.size; ++s) {
      if (g.counts[static_cast<size_t>(s)] != count) {
        // Every rank sees the same counts, so every rank throws here.
        throw Error(std::string(what) + ": rank " + std::to_string(s) + " passed " +
                    std::to_string(g.counts[static_cast<size_t>(s)]) + " floats but rank " +
                    std::to_string(rank_) + " passed " + std::to_string(count) +
                    "; every rank must call collectives with the same count");
      }
      if (s != rank_) CUDA_CHECK(cudaStreamWaitEvent(stream, g.ready[static_cast<size_t>(s)], 0));
    }
  }

  /// Records this rank's part as done and orders this stream after every rank's part.
  void finish(cudaStream_t stream, const char* what) {
    SameDeviceGroup& g = *group_;
    CUDA_CHECK(cudaEventRecord(g.done[static_cast<size_t>(rank_)], stream));
    g.barrier.wait(what);
    for (int s = 0; s < g.size; ++s) {
      if (s != rank_) CUDA_CHECK(cudaStreamWaitEvent(stream, g.done[static_cast<size_t>(s)], 0));
    }
  }

  std::shared_ptr<SameDeviceGroup> group_;
  int rank_;
  CudaBackend* backend_;
};

// ==== NCCL
// ========================================================================================

/// Where this process's NCCL ranks sit in a communicator spanning several processes: the
/// unique id (made by process 0), the global rank of the first local rank, and the global size.
struct NcclBootstrap {
  ncclUniqueId id{};
  int first_rank = 0;
  int world = 1;
};

class NcclGroup {
 public:
  explicit NcclGroup(std::vector<CudaBackend*> b, const NcclBootstrap* boot = nullptr)
      : backends(std::move(b)),
        size(static_cast<int>(backends.size())),
        first_rank(boot != nullptr ? boot->first_rank : 0),
        world(boot != nullptr ? boot->world : size),
        barrier(size, aborted) {
    if (boot != nullptr) bootstrap_ = *boot;
    comms.assign(backends.size(), nullptr);
    pending.assign(backends.size(), false);
    waiting_start.assign(backends.size(), false);
    enqueued_at.assign(backends.size(), Clock::now());
    // Whatever fails here (an event, NCCL's initialisation, the watchdog thread) releases
    // everything made so far: no communicator or event outlives a failed construction.
    try {
      for (size_t r = 0; r < backends.size(); ++r) {
        comm_mutex.push_back(std::make_unique<std::mutex>());
        last_event.push_back(make_event(backends[r]->device_index()));
        start_event.push_back(make_event(backends[r]->device_index()));
      }
      init();
      watchdog_ = std::thread([this] { watch(); });
    } catch (...) {
      abort_comms();
      cleanup_events();
      throw;
    }
  }

  ~NcclGroup() {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    // An aborted group whose watchdog had not got to it yet (it polls every 100 ms) is aborted
    // here: finalizing would wait on collectives a dead peer never joins.
    if (!comms_aborted_) {
      if (aborted.is_set()) {
        abort_comms();
      } else {
        finalize();
      }
    }
    cleanup_events();
  }

  /// Called by a rank or the watchdog: mark the group aborted and let the watchdog abort the
  /// NCCL communicators (it owns that step, so it never races a rank's enqueue).
  void abort_group(const std::string& reason) {
    aborted.set(reason);
    barrier.wake();
    watch_cv_.notify_all();
  }

  /// Enqueues one NCCL call for `rank` under its mutex and waits (bounded) until the
  /// non-blocking communicator has accepted it; then records the completion event.
  template <typename Enqueue>
  void run(int rank, const char* what, Enqueue enqueue) {
    const size_t r = static_cast<size_t>(rank);
    if (aborted.is_set()) aborted.raise(what);
    std::lock_guard<std::mutex> lock(*comm_mutex[r]);
    if (comms_aborted_ || aborted.is_set()) aborted.raise(what);
    ncclComm_t comm = comms[r];
    // An error here means the peers may already be inside this collective on their GPUs and
    // will never see this rank: abort the group (as for asynchronous errors) rather than
    // leave them to the watchdog's timeout.
    const ncclResult_t enqueued = enqueue(comm);
    const auto deadline = Clock::now() + comm_timeout();
    for (;;) {
      ncclResult_t state = enqueued;
      if (state == ncclSuccess || state == ncclInProgress) {
        const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
        if (query != ncclSuccess) state = query;
      }
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        const std::string reason = std::string(what) + " on rank " + std::to_string(rank) +
                                   ": NCCL error " + ncclGetErrorString(state) + " (" +
                                   ncclGetLastError(comm) + ")";
        abort_group(reason);
        throw Error(reason);
      }
      if (aborted.is_set()) aborted.raise(what);
      if (Clock::now() > deadline) {
        const std::string reason = std::string(what) + " on rank " + std::to_string(rank) +
                                   ": NCCL did not accept the operation within " + timeout_text();
        abort_group(reason);
        throw Error(reason);
      }
      std::this_thread::yield();
    }
    // Inside a capture the call is a node of the graph, not work on the stream: nothing to
    // watch until the graph is launched (an event recorded in a capture cannot be queried).
    if (backends[r]->capturing()) return;
    CUDA_CHECK(cudaEventRecord(last_event[r], backends[r]->stream()));
    std::lock_guard<std::mutex> state_lock(state_mutex_);
    pending[r] = true;
    enqueued_at[r] = Clock::now();
  }

  /// Launches a captured step holding rank `rank`'s collectives (Communicator::
  /// launch_captured): refused once the group is aborted; under the rank's mutex, so an abort
  /// (which takes it) cannot free the communicator in between. The mutex is only tried: the
  /// watchdog may hold it inside ncclCommAbort, which waits for the graphs to go. The step is
  /// then watched from when its start event completes (a queue of launched steps is no hang).
  void launch_captured(int rank, const std::function<void()>& launch) {
    const size_t r = static_cast<size_t>(rank);
    std::unique_lock<std::mutex> lock(*comm_mutex[r], std::defer_lock);
    for (;;) {
      if (comms_aborted_ || aborted.is_set()) aborted.raise("a captured step");
      if (lock.try_lock()) break;
      std::this_thread::yield();
    }
    if (comms_aborted_ || aborted.is_set()) aborted.raise("a captured step");
    cudaStream_t stream = backends[r]->stream();
    CUDA_CHECK(cudaEventRecord(start_event[r], stream));
    launch();
    CUDA_CHECK(cudaEventRecord(last_event[r], stream));
    std::lock_guard<std::mutex> state_lock(state_mutex_);
    pending[r] = true;
    waiting_start[r] = true;
    enqueued_at[r] = Clock::now();
  }

  std::vector<CudaBackend*> backends;
  int size;        // ranks in this process
  int first_rank;  // global rank of local rank 0
  int world;       // ranks in every process
  AbortFlag aborted;
  HostBarrier barrier;  // this process's ranks only
  std::vector<ncclComm_t> comms;

 private:
  /// Ends an NCCL group on every path: a group left open would swallow the process's next NCCL
  /// calls (they would queue behind a ncclGroupEnd that never comes).
  class GroupGuard {
   public:
    GroupGuard() { NCCL_CHECK(ncclGroupStart()); }
    ~GroupGuard() {
      if (open_) NCCL_WARN(ncclGroupEnd());
    }
    GroupGuard(const GroupGuard&) = delete;
    GroupGuard& operator=(const GroupGuard&) = delete;
    void end() {
      open_ = false;
      NCCL_CHECK(ncclGroupEnd());
    }

   private:
    bool open_ = true;
  };

  /// Creates every rank's communicator in one group and waits until all are ready. On failure
  /// the caller (the constructor) aborts whatever was created.
  void init() {
    ncclUniqueId id = bootstrap_ ? bootstrap_->id : ncclUniqueId{};
    if (!bootstrap_) NCCL_CHECK(ncclGetUniqueId(&id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    {
      GroupGuard group;
      for (int r = 0; r < size; ++r) {
        CUDA_CHECK(cudaSetDevice(backends[static_cast<size_t>(r)]->device_index()));
        NCCL_CHECK(ncclCommInitRankConfig(&comms[static_cast<size_t>(r)], world, id, first_rank + r,
                                          &config));
        take_injected_init_failure(r);
      }
      group.end();
    }
    const auto deadline = Clock::now() + comm_timeout();
    for (int r = 0; r < size; ++r) {
      ncclComm_t comm = comms[static_cast<size_t>(r)];
      for (;;) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
        if (query != ncclSuccess) state = query;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress || Clock::now() > deadline) {
          throw Error(
              "NCCL communicator initialisation failed on rank " + std::to_string(r) + ": " +
              (state == ncclInProgress
                   ? "timed out after " + timeout_text()
                   : std::string(ncclGetErrorString(state)) + " (" + ncclGetLastError(comm) + ")"));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  /// Orderly teardown: finalize every communicator (flushes queued work), wait, destroy. On
  /// error or timeout the communicators are aborted instead.
  void finalize() noexcept {
    bool ok = true;
    for (size_t r = 0; r < comms.size(); ++r) {
      CUDA_WARN(cudaSetDevice(backends[r]->device_index()));
      const ncclResult_t status = ncclCommFinalize(comms[r]);
      if (status != ncclSuccess && status != ncclInProgress) ok = false;
    }
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    for (size_t r = 0; r < comms.size() && ok; ++r) {
      for (;;) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comms[r], &state) != ncclSuccess) state = ncclInternalError;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress || Clock::now() > deadline) {
          ok = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    for (size_t r = 0; r < comms.size(); ++r) {
      CUDA_WARN(cudaSetDevice(backends[r]->device_index()));
      if (ok) {
        NCCL_WARN(ncclCommDestroy(comms[r]));
      } else {
        NCCL_WARN(ncclCommAbort(comms[r]));
      }
      comms[r] = nullptr;
    }
  }

  void cleanup_events() noexcept {
    for (size_t r = 0; r < last_event.size(); ++r) {
      CUDA_WARN(cudaSetDevice(backends[r]->device_index()));
      CUDA_WARN(cudaEventDestroy(last_event[r]));
      if (r < start_event.size()) CUDA_WARN(cudaEventDestroy(start_event[r]));
    }
    last_event.clear();
    start_event.clear();
  }

  /// The watchdog: every 100 ms (or when woken) checks NCCL's asynchronous errors and whether
  /// each rank's last collective completed in time; aborts the communicators once the group is
  /// aborted.
  void watch() {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!stopping_) {
      watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_) break;
      if (!aborted.is_set()) check_ranks();
      if (aborted.is_set() && !comms_aborted_) abort_comms();
    }
  }

  void check_ranks() {
    for (size_t r = 0; r < comms.size(); ++r) {
      std::unique_lock<std::mutex> comm_lock(*comm_mutex[r], std::try_to_lock);
      if (!comm_lock.owns_lock()) continue;  // the rank is enqueueing; look next time
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comms[r], &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        abort_group("NCCL reported an asynchronous error on rank " + std::to_string(r) + ": " +
                    ncclGetErrorString(state));
        return;
      }
      std::lock_guard<std::mutex> state_lock(state_mutex_);
      if (!pending[r]) continue;
      if (cudaSetDevice(backends[r]->device_index()) != cudaSuccess) continue;
      if (waiting_start[r]) {
        // A launched captured step: its time counts from when the GPU reaches it.
        const cudaError_t s = cudaEventQuery(start_event[r]);
        if (s == cudaErrorNotReady) {
          enqueued_at[r] = Clock::now();
          continue;
        }
        if (s != cudaSuccess) (void)cudaGetLastError();  // reported by the query below
        waiting_start[r] = false;
        enqueued_at[r] = Clock::now();
      }
      const cudaError_t q = cudaEventQuery(last_event[r]);
      if (q == cudaSuccess) {
        pending[r] = false;
      } else if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        abort_group("rank " + std::to_string(r) + "'s stream failed: " + cudaGetErrorString(q));
        return;
      } else if (Clock::now() - enqueued_at[r] > comm_timeout()) {
        abort_group("rank " + std::to_string(r) +
                    "'s collective did not complete on the GPU within " + timeout_text() +
                    " (a peer died or hangs)");
        return;
      }
    }
  }

  void abort_comms() noexcept {
    // Ranks leave their enqueue poll loops as soon as they see the flag, releasing the mutex.
    // (During a failed construction some ranks may have no mutex or communicator yet.)
    for (size_t r = 0; r < comms.size(); ++r) {
      std::unique_lock<std::mutex> comm_lock;
      if (r < comm_mutex.size()) comm_lock = std::unique_lock<std::mutex>(*comm_mutex[r]);
      if (comms[r] == nullptr) continue;
      CUDA_WARN(cudaSetDevice(backends[r]->device_index()));
      NCCL_WARN(ncclCommAbort(comms[r]));
      comms[r] = nullptr;
    }
    comms_aborted_ = true;
  }

  std::optional<NcclBootstrap> bootstrap_;
  std::vector<std::unique_ptr<std::mutex>> comm_mutex;
  std::vector<cudaEvent_t> last_event;
  std::mutex state_mutex_;
  std::vector<bool> pending;
  std::vector<bool> waiting_start;       // a captured step launched: not yet reached by the GPU
  std::vector<cudaEvent_t> start_event;  // recorded before each captured step's launch
  std::vector<Clock::time_point> enqueued_at;
  std::atomic<bool> comms_aborted_{false};
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::thread watchdog_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank)
      : group_(std::move(group)), rank_(rank), backend_(group_->backends[rank]) {}

  int rank() const override { return group_->first_rank + rank_; }
  int size() const override { return group_->world; }
  std::string kind() const override { return "nccl"; }

  void allreduce_sum(float* data, size_t count) override {
    backend_->activate();
    cudaStream_t stream = backend_->stream();
    group_->run(rank_, "allreduce_sum", [&](ncclComm_t comm) {
      return ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm, stream);
    });
  }

  void broadcast(float* data, size_t count, int root) override {
    if (root < 0 || root >= group_->world) {
      throw Error("broadcast: root " + std::to_string(root) + " is not a rank of this group of " +
                  std::to_string(group_->world));
    }
    backend_->activate();
    cudaStream_t stream = backend_->stream();
    group_->run(rank_, "broadcast", [&](ncclComm_t comm) {
      return ncclBroadcast(data, data, count, ncclFloat, root, comm, stream);
    });
  }

  void barrier() override {
    backend_->activate();
    wait_stream(backend_->stream(), group_->aborted, "barrier");
    group_->barrier.wait("barrier");
  }

  void abort() noexcept override {
    group_->abort_group("rank " + std::to_string(rank_) + " failed and called abort()");
  }

  void launch_captured(const std::function<void()>& launch) override {
    backend_->activate();
    group_->launch_captured(rank_, launch);
  }

 private:
  std::shared_ptr<NcclGroup> group_;
  int rank_;
  CudaBackend* backend_;
};

std::vector<CudaBackend*> cuda_backends(const std::vector<Backend*>& ranks) {
  if (ranks.empty()) throw Error("cuda communicators: no ranks given");
  std::vector<CudaBackend*> out;
  for (size_t r = 0; r < ranks.size(); ++r) out.push_back(as_cuda(ranks[r], r));
  return out;
}

std::string device_list(const std::vector<CudaBackend*>& backends) {
  std::string s;
  for (auto* b : backends) s += (s.empty() ? "" : ", ") + std::to_string(b->device_index());
  return "[" + s + "]";
}

}  // namespace

void inject_nccl_init_failure(int rank) { injected_init_failure.store(rank); }

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    const std::vector<Backend*>& ranks) {
  auto backends = cuda_backends(ranks);
  std::set<int> devices;
  for (auto* b : backends) devices.insert(b->device_index());
  if (devices.size() != backends.size()) {
    throw Error("NCCL communicators need one rank per GPU, got devices " + device_list(backends) +
                " (NCCL refuses two ranks on one GPU)");
  }
  auto group = std::make_shared<NcclGroup>(backends);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < group->size; ++r) out.push_back(std::make_unique<NcclCommunicator>(group, r));
  return out;
}

std::vector<std::unique_ptr<Communicator>> make_same_device_communicators(
    const std::vector<Backend*>& ranks) {
  auto backends = cuda_backends(ranks);
  for (auto* b : backends) {
    if (b->device_index() != backends[0]->device_index()) {
      throw Error("same-device communicators need every rank on one GPU, got devices " +
                  device_list(backends));
    }
  }
  if (backends.size() > static_cast<size_t>(kernels::kMaxSameDeviceRanks)) {
    throw Error("at most " + std::to_string(kernels::kMaxSameDeviceRanks) +
                " replicas can share one GPU, got " + std::to_string(backends.size()));
  }
  auto group = std::make_shared<SameDeviceGroup>(backends);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < group->size; ++r) {
    out.push_back(std::make_unique<SameDeviceCommunicator>(group, r));
  }
  return out;
}

std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks,
                                                              ProcessGroup& processes) {
  auto backends = cuda_backends(ranks);
  std::set<int> devices;
  for (auto* b : backends) devices.insert(b->device_index());
  if (devices.size() != backends.size()) {
    throw Error(
        "a trial across processes needs one replica per GPU in every process, got devices " +
        device_list(backends) + " in process " + std::to_string(processes.rank()) +
        " (NCCL refuses two ranks on one GPU)");
  }
  // Every process must bring as many ranks: the global rank of a local one depends on it.
  const int local = static_cast<int>(backends.size());
  double total = local;
  processes.allreduce_sum(&total, 1);
  if (total != static_cast<double>(local) * processes.size()) {
    throw Error("the processes of this trial run different numbers of replicas (" +
                std::to_string(local) + " here, " + std::to_string(static_cast<int64_t>(total)) +
                " in all " + std::to_string(processes.size()) + " processes)");
  }
  std::string id_bytes;
  if (processes.rank() == 0) {
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    id_bytes.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  processes.broadcast(id_bytes, 0);
  if (id_bytes.size() != sizeof(ncclUniqueId)) {
    throw Error("NCCL bootstrap: process 0 sent " + std::to_string(id_bytes.size()) +
                " bytes for the unique id, expected " + std::to_string(sizeof(ncclUniqueId)));
  }
  NcclBootstrap boot;
  std::copy(id_bytes.begin(), id_bytes.end(), reinterpret_cast<char*>(&boot.id));
  boot.first_rank = processes.rank() * local;
  boot.world = processes.size() * local;
  auto group = std::make_shared<NcclGroup>(backends, &boot);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < group->size; ++r) out.push_back(std::make_unique<NcclCommunicator>(group, r));
  return out;
}

std::vector<std::unique_ptr<Communicator>> make_communicators(const std::vector<Backend*>& ranks) {
  auto backends = cuda_backends(ranks);
  std::set<int> devices;
  for (auto* b : backends) devices.insert(b->device_index());
  // One replica needs no transport at all: the same-device path with one rank does nothing.
  if (devices.size() == 1) return make_same_device_communicators(ranks);
  if (devices.size() == backends.size()) return make_nccl_communicators(ranks);
  throw Error("replicas on GPUs " + device_list(backends) +
              ": some share a GPU and some do not, which is not supported; use one replica per "
              "GPU, or put every replica on one GPU");
}

}  // namespace dp::cuda
