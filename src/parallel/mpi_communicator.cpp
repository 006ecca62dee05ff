// The tensor-parallel group over MPI (OpenMPI from Debian): the world `mpirun -n R` starts.
//
// Collectives are the non-blocking MPI-3 ones, completed by polling, so that a peer that died
// cannot hang this rank: a collective that gets no answer for kSilenceLimit throws (the engine then
// fails the step's requests with that message), and abandon() makes every later one throw at once.
// Only the worker's wait for rank 0's next step may last forever (an idle server); it backs off from
// spinning to short sleeps so that an idle worker does not hold a core.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.h"
#include "util/error.h"

namespace promptly::parallel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kDefaultSilenceLimitS = 30;
constexpr auto kSpinBeforeSleeping = std::chrono::milliseconds(2);
constexpr auto kSpinBeforeYielding = std::chrono::microseconds(50);
constexpr auto kIdleSleep = std::chrono::microseconds(100);

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override {
    if (abandoned_.load()) {
      // The peers are gone: MPI cannot be finalised, and its teardown at exit would wait for them
      // until mpirun kills this process. Everything of ours has been destroyed by now.
      std::fflush(nullptr);
      std::_Exit(1);
    }
    // While an error unwinds the stack the peers may be waiting for this rank: main ends the world
    // then (abort_world).
    if (std::uncaught_exceptions() == 0) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, std::size_t n) override {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req), "all-reduce");
    wait(req, "all-reduce", false);
  }

  void broadcast(void* data, std::size_t bytes) override {
    MPI_Request req;
    check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &req), "broadcast");
    // A worker waits for rank 0's next step as long as the server is idle.
    wait(req, "broadcast", rank_ != 0);
  }

  void gather(const float* send, std::size_t n, float* out, const std::size_t* counts, const std::size_t* offsets) override {
    std::vector<int> c, o;
    if (rank_ == 0) {
      for (int r = 0; r < size_; ++r) c.push_back(static_cast<int>(counts[r])), o.push_back(static_cast<int>(offsets[r]));
    }
    MPI_Request req;
    check(MPI_Igatherv(send, static_cast<int>(n), MPI_FLOAT, out, c.data(), o.data(), MPI_FLOAT, 0, MPI_COMM_WORLD, &req), "gather");
    wait(req, "gather", false);
  }

  void abandon() override { abandoned_.store(true); }
  void set_silence_limit(double seconds) override { silence_limit_s_.store(seconds); }
  Totals totals() const override { return {collectives_.load(), static_cast<double>(nanoseconds_.load()) * 1e-9}; }

 private:
  void check(int code, const char* what) {
    if (abandoned_.load()) throw Error(std::string("tensor parallelism: the rank group was abandoned before a ") + what);
    if (code != MPI_SUCCESS) {
      abandoned_.store(true);
      throw Error(std::string("tensor parallelism: MPI ") + what + " failed: " + mpi_error_text(code));
    }
  }

  void wait(MPI_Request& req, const char* what, bool patient) {
    const auto start = Clock::now();
    struct Count {  // every way out of the loop, a throw included
      MpiCommunicator& c;
      Clock::time_point start;
      ~Count() {
        c.collectives_.fetch_add(1, std::memory_order_relaxed);
        c.nanoseconds_.fetch_add(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count()),
                                 std::memory_order_relaxed);
      }
    } count{*this, start};
    for (std::uint64_t polls = 0;; ++polls) {
      int done = 0;
      const int code = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        abandoned_.store(true);
        throw Error(std::string("tensor parallelism: MPI ") + what + " failed: " + mpi_error_text(code));
      }
      if (done) return;
      if (polls % 256 != 255) continue;
      if (abandoned_.load()) throw Error(std::string("tensor parallelism: the rank group was abandoned during a ") + what);
      const auto waited = Clock::now() - start;
      if (patient) {
        if (waited > kSpinBeforeSleeping) std::this_thread::sleep_for(kIdleSleep);
        continue;
      }
      if (const double limit = silence_limit_s_.load(); std::chrono::duration<double>(waited).count() > limit) {
        abandoned_.store(true);
        throw Error(std::string("tensor parallelism: no answer from the other ranks for ") + std::to_string(static_cast<int>(limit)) +
                    " s during the " + what + " (a rank died or hangs); this process must be restarted");
      }
      // A peer that is late has most likely lost its core (the ranks run in lockstep, and other
      // programs share the machine): let it have this one.
      if (waited > kSpinBeforeYielding) std::this_thread::yield();
    }
  }

  int rank_ = 0, size_ = 1;
  std::atomic<bool> abandoned_{false};
  std::atomic<double> silence_limit_s_{kDefaultSilenceLimitS};
  std::atomic<std::uint64_t> collectives_{0}, nanoseconds_{0};
};

}  // namespace

std::shared_ptr<Communicator> join_mpi_world(int ranks) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    // Serialized: rank 0 calls MPI from the engine's step thread after main initialised it.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      throw Error("--tp: MPI could not be initialised (start the ranks with mpirun -n " + std::to_string(ranks) + ")");
    }
    if (provided < MPI_THREAD_SERIALIZED) throw Error("--tp: this MPI library cannot be called from more than one thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  auto comm = std::make_shared<MpiCommunicator>();
  if (comm->size() != ranks) {
    const int size = comm->size();
    throw Error("--tp " + std::to_string(ranks) + " but MPI started " + std::to_string(size) + " rank" + (size == 1 ? "" : "s") +
                ": run it as mpirun -n " + std::to_string(ranks) + " promptly ... --tp " + std::to_string(ranks));
  }
  return comm;
}

bool mpi_available() { return true; }

void abort_world(int exit_code) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace promptly::parallel
