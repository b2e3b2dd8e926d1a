// The MPI process group (MPI_COMM_WORLD, duplicated). Every collective is non-blocking MPI
// polled against a deadline, so a peer that died or hangs ends in a dp::Error naming this
// process and its host after comm_timeout(), never in a process waiting forever. After such an
// error the group is unusable; the caller reports and calls abort(), which ends every process.
//
// The float/double sum is in a fixed order whatever MPI's own algorithms do: the buffer is cut
// into one slice per process; each process receives its slice from every process
// (MPI_Ialltoallv), adds them in process order 0, 1, ..., and every process gathers the sums
// (MPI_Iallgatherv). So the result is the same bits on every process and in every run, which is
// what makes a multi-process trial reproducible.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "dp/error.hpp"
#include "dp/process_group.hpp"

namespace dp {

namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(std::max(length, 0)));
}

#define MPI_CHECK(call)                                                                   \
  do {                                                                                    \
    const int dp_mpi_code_ = (call);                                                      \
    if (dp_mpi_code_ != MPI_SUCCESS)                                                      \
      DP_THROW(std::string("MPI error in `" #call "`: ") + mpi_error_text(dp_mpi_code_)); \
  } while (0)

void finalize_at_exit() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

/// Initialises MPI once per process and returns the thread level it provides. dprun asks for
/// MPI_THREAD_MULTIPLE (a replica's communication thread and its compute thread may each run
/// a collective of their own group) and needs at least MPI_THREAD_SERIALIZED (collectives are
/// called from replica threads, not only the main thread).
int ensure_initialized() {
  static int provided = -1;
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_CHECK(MPI_Initialized(&initialized));
    if (initialized) {
      MPI_CHECK(MPI_Query_thread(&provided));
    } else {
      MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit(finalize_at_exit);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      DP_THROW("the MPI library provides thread level " + std::to_string(provided) +
               ", below MPI_THREAD_SERIALIZED, which dprun needs (replica threads call MPI)");
    }
  });
  return provided;
}

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  explicit MpiProcessGroup(MPI_Comm base = MPI_COMM_WORLD) {
    thread_level_ = ensure_initialized();
    MPI_CHECK(MPI_Comm_dup(base, &comm_));
    // Errors come back as codes (and become dp::Error) instead of aborting the job at once.
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_Comm local = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    MPI_CHECK(MPI_Comm_size(local, &local_size_));
    MPI_Comm_free(&local);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_CHECK(MPI_Get_processor_name(name, &length));
    host_.assign(name, static_cast<size_t>(std::max(length, 0)));
  }
  ~MpiProcessGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  std::string kind() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string host() const override { return host_; }

  void allreduce_sum(float* data, size_t count) override { ordered_sum(data, count, scratch_f_); }
  void allreduce_sum(double* data, size_t count) override { ordered_sum(data, count, scratch_d_); }

  void broadcast(std::string& bytes, int root) override {
    DP_CHECK(root >= 0 && root < size_, "broadcast: root " + std::to_string(root) +
                                            " is not a process of a group of " +
                                            std::to_string(size_));
    unsigned long long length = bytes.size();
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Ibcast(&length, 1, MPI_UNSIGNED_LONG_LONG, root, comm_, &request));
    wait(request, "broadcast");
    DP_CHECK(length <= static_cast<unsigned long long>(INT_MAX),
             "broadcast: " + std::to_string(length) + " bytes are more than one MPI call carries");
    bytes.resize(static_cast<size_t>(length));
    if (length == 0) return;
    MPI_CHECK(MPI_Ibcast(bytes.data(), static_cast<int>(length), MPI_CHAR, root, comm_, &request));
    wait(request, "broadcast");
  }

  std::unique_ptr<ProcessGroup> duplicate() const override {
    return std::make_unique<MpiProcessGroup>(comm_);
  }
  bool concurrent_collectives() const override { return thread_level_ >= MPI_THREAD_MULTIPLE; }

  void barrier() override {
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Ibarrier(comm_, &request));
    wait(request, "barrier");
  }

  [[noreturn]] void abort(int exit_code, const std::string& why) override {
    std::fprintf(stderr, "dprun: process %d of %d on %s: %s\n", rank_, size_, host_.c_str(),
                 why.c_str());
    std::fflush(stderr);
    write_coverage_counts();
    MPI_Abort(comm_ != MPI_COMM_NULL ? comm_ : MPI_COMM_WORLD, exit_code);
    exit_now(exit_code);  // MPI_Abort does not return; should it, leave anyway
  }

 private:
  /// Polls `request` until it completes; after comm_timeout() the group is declared dead.
  void wait(MPI_Request& request, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + comm_timeout();
    for (;;) {
      int done = 0;
      const int code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        throw Error(std::string(what) + " across processes failed on process " +
                    std::to_string(rank_) + " (" + host_ + "): " + mpi_error_text(code));
      }
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        throw Error(std::string(what) + " across processes: process " + std::to_string(rank_) +
                    " of " + std::to_string(size_) + " on " + host_ + " waited " +
                    comm_timeout_text() + " for the others (one died or hangs)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  /// Element range owned by process p: cut on 16-element boundaries.
  std::pair<size_t, size_t> slice(size_t count, int p) const {
    const size_t blocks = (count + 15) / 16;
    const size_t per = blocks / static_cast<size_t>(size_),
                 extra = blocks % static_cast<size_t>(size_);
    const auto q = static_cast<size_t>(p);
    const size_t first = q * per + std::min(q, extra);
    const size_t n = per + (q < extra ? 1 : 0);
    return {std::min(count, first * 16), std::min(count, (first + n) * 16)};
  }

  template <typename T>
  void ordered_sum(T* data, size_t count, std::vector<T>& scratch) {
    if (size_ == 1 || count == 0) return;
    DP_CHECK(count <= static_cast<size_t>(INT_MAX), "allreduce_sum: " + std::to_string(count) +
                                                        " elements are more than one MPI call "
                                                        "carries");
    std::vector<int> slice_count(static_cast<size_t>(size_)), slice_start(slice_count.size());
    for (int p = 0; p < size_; ++p) {
      const auto [lo, hi] = slice(count, p);
      slice_start[static_cast<size_t>(p)] = static_cast<int>(lo);
      slice_count[static_cast<size_t>(p)] = static_cast<int>(hi - lo);
    }
    const int mine = slice_count[static_cast<size_t>(rank_)];
    const size_t need = static_cast<size_t>(mine) * static_cast<size_t>(size_);
    if (scratch.size() < need) scratch.resize(need);  // grows on the first step only
    std::vector<int> from_count(static_cast<size_t>(size_), mine), from_start(slice_count.size());
    for (int p = 0; p < size_; ++p) from_start[static_cast<size_t>(p)] = p * mine;
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Ialltoallv(data, slice_count.data(), slice_start.data(), mpi_type<T>(),
                             scratch.data(), from_count.data(), from_start.data(), mpi_type<T>(),
                             comm_, &request));
    wait(request, "allreduce_sum");
    T* own = data + slice_start[static_cast<size_t>(rank_)];
    for (int i = 0; i < mine; ++i) {
      T s = scratch[static_cast<size_t>(i)];
      for (int p = 1; p < size_; ++p) s += scratch[static_cast<size_t>(p * mine + i)];
      own[i] = s;
    }
    MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, slice_count.data(),
                              slice_start.data(), mpi_type<T>(), comm_, &request));
    wait(request, "allreduce_sum");
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int thread_level_ = MPI_THREAD_SINGLE;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};

}  // namespace

bool mpi_compiled() { return true; }

std::unique_ptr<ProcessGroup> make_mpi_process_group() {
  return std::make_unique<MpiProcessGroup>();
}

}  // namespace dp
