// Built when CMake finds no MPI: tensor parallelism is then unavailable, with a clear error.
#include "parallel/communicator.h"
#include "util/error.h"

namespace promptly::parallel {

std::shared_ptr<Communicator> join_mpi_world(int ranks) {
  throw Error("--tp " + std::to_string(ranks) +
              ": this promptly was built without MPI; install OpenMPI (Debian: libopenmpi-dev openmpi-bin) and rebuild");
}

bool mpi_available() { return false; }

void abort_world(int) {}

}  // namespace promptly::parallel
