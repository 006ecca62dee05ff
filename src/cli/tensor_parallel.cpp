// --tp R: the commands that run a model (run, serve, bench model) start the same way on every rank
// of `mpirun -n R`; rank 0 goes on with the command and the others follow its forward passes.
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "util/error.h"
#include "util/process.h"

namespace promptly::cli {

std::shared_ptr<parallel::Communicator> join_tensor_parallel(int ranks) {
  if (ranks < 1) throw Error("--tp must be at least 1 (ranks of mpirun -n)");
  if (ranks == 1) return nullptr;
  return parallel::join_mpi_world(ranks);
}

int follow_rank0(const Model& model, int threads, double model_rss_mb) {
  // Rank 0 says when to stop (a server drains first); mpirun's SIGKILL ends this rank if rank 0 dies.
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  ThreadPool pool(threads > 0 ? threads : default_thread_count());
  model.follow_steps(pool);
  // What this rank held (its slices and its heads' KV cache), for the record and the MPI test.
  std::fprintf(stderr, "promptly: tensor-parallel rank %d of %d done: RSS %.0f MB (peak %.0f MB), model %.1f MB\n",
               model.tensor_parallel()->rank(), model.tensor_parallel()->size(), rss_mb(), peak_rss_mb(), model_rss_mb);
  return 0;
}

}  // namespace promptly::cli
