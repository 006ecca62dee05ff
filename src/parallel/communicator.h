#pragma once
// The ranks of one tensor-parallel group and the collectives the forward pass needs: each rank
// holds a slice of every layer, the partial results of a layer are summed across ranks, and rank 0
// tells the others what to compute. MPI (mpi_communicator.cpp) is the implementation that runs
// across processes and machines; anything else that can sum and broadcast may stand in.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace promptly::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[i] = the sum over ranks of data[i], on every rank (the same bits on every rank).
  virtual void all_reduce_sum(float* data, std::size_t n) = 0;
  // Rank 0's `bytes` bytes at data are copied to every other rank's data.
  virtual void broadcast(void* data, std::size_t bytes) = 0;
  // Rank 0 receives every rank's `counts[r]` floats at `out + offsets[r]`; the others pass out = null.
  virtual void gather(const float* send, std::size_t n, float* out, const std::size_t* counts, const std::size_t* offsets) = 0;
  // Gives up on the group: every later collective throws at once (a rank died or the process is
  // going down; the peers cannot be waited for).
  virtual void abandon() = 0;
  // How long a collective waits for the other ranks before it gives up on them (and the group). Long
  // by default (a step of a big model on a loaded machine); a server going down shortens it, since
  // mpirun then stops every rank and a dead peer must not keep the in-flight streams waiting.
  virtual void set_silence_limit(double seconds) = 0;

  // Collectives this rank has run and the seconds it spent in them (its own share of the transfer
  // plus waiting for the slowest rank): what tensor parallelism costs on top of the arithmetic.
  struct Totals {
    std::uint64_t collectives = 0;
    double seconds = 0;
  };
  virtual Totals totals() const = 0;
};

// Joins the MPI world that `mpirun -n ranks` started (initialising MPI) and checks that it has
// `ranks` ranks. Throws Error when the binary was built without MPI or the world has another size.
// MPI is finalised when the last reference goes (unless the group was abandoned).
std::shared_ptr<Communicator> join_mpi_world(int ranks);

// Whether this binary was built with MPI.
bool mpi_available();

// After a fatal error: when this process joined an MPI world that is still running, ends every rank
// of it (MPI_Abort) rather than leaving the others waiting for this one. A no-op otherwise.
void abort_world(int exit_code);

}  // namespace promptly::parallel
