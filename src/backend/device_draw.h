#pragma once
// One row of logits a device samples itself, so that only its token comes back to the host
// (backend/device.h, DeviceSampling). Plain data: the CUDA kernels read it as it is uploaded.
#include <cstdint>
#include <vector>

namespace promptly::backend {

struct DeviceDraw {
  std::int32_t row;   // which of the pass's logit rows (batch order of the tokens that want logits)
  float temperature;  // <= 0: greedy (the first largest logit)
  std::int32_t top_k; // <= 0 or >= the vocabulary: off
  float top_p;        // >= 1: off
  float min_p;        // <= 0: off
  // Where in [0, 1) the draw lands among the kept tokens' weights (Sampler::next_uniform): the
  // host's generator decides, so a seed means the same stream of draws on either device.
  double uniform;
};

// Rows a forward pass on a device samples there (Model::forward): their tokens come back, in
// draws' order, and their logits do not.
struct DeviceSampling {
  std::vector<DeviceDraw> draws;
  std::vector<std::int32_t> tokens;
};

}  // namespace promptly::backend
