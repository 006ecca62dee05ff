#pragma once
// Where a GPU pass's time goes, by stretch of launches (PROMPTLY_CUDA_PROFILE=1): an event before
// each named stretch on the compute stream and one at the end; once the pass has synchronized, the
// time between consecutive events goes to the stretch's name, decode-sized passes kept apart from
// larger ones. With graphs off (profiling turns them off), a stretch also holds the time the GPU
// waits for the host to launch its kernels: comparing the profile's total with a graph-replayed
// pass shows what the launches cost.
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace promptly::backend::cuda {

class StepProfile {
 public:
  StepProfile() = default;
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;
  ~StepProfile();

  void enable() { on_ = true; }
  bool on() const { return on_; }
  // A pass starts on `stream`; decode: at most the matrix-vector kernels' tokens.
  void begin(cudaStream_t stream, bool decode);
  // A stretch named `name` (a string literal) starts now on the stream; weight_bytes: what its
  // matrix-vector kernels stream from memory, for the report's GB/s (0: not a stream of weights).
  void mark(const char* name, double weight_bytes = 0);
  // The pass's stream has finished: its stretches' times are added up. A pass stopped early
  // (Model::forward's stop_before) is dropped.
  void end(bool finished);
  // Per pass, each stretch's milliseconds and share, largest first (and the rate its weights
  // streamed at, where it has weight bytes: launch gaps included, graphs being off); empty before
  // any pass.
  std::string report() const;

 private:
  struct Totals {
    std::map<std::string, double> ms, bytes;
    int passes = 0;
  };
  bool on_ = false;
  cudaStream_t stream_ = nullptr;
  bool decode_ = false;
  std::vector<cudaEvent_t> events_;  // reused across passes
  std::vector<const char*> names_;   // this pass's stretches, in order
  std::vector<double> bytes_;        // and their weight bytes
  Totals decode_totals_, prefill_totals_;
};

}  // namespace promptly::backend::cuda
