#pragma once
// Sampling on the device: SamplingParams' filters (top-k, top-p, min-p, temperature; no penalties)
// over rows of logits, so that a decode step brings back token ids instead of vocabulary-sized rows.
#include <cstdint>

#include <cuda_runtime.h>

#include "backend/device_draw.h"

namespace promptly::backend::cuda {

// out[i] = the token draws[i] picks from row draws[i].row of logits (rows of n_vocab floats).
//
// The same distribution as Sampler::sample (sampling/sampler.h) for the same logits and parameters:
// greedy takes the first largest logit; otherwise the kept tokens are the same head of the order
// (logit descending, id ascending) the host's filters keep, ties at a cut included by id, and the
// draw walks their weights e^((logit - max) / T) in id order up to uniform x their sum. (The host
// walks its sorted head instead, so one uniform may name a different token on each: the two draw
// from the same distribution, not token for token.)
void sample_rows(const float* logits, int n_vocab, const DeviceDraw* draws, int n, std::int32_t* out, cudaStream_t stream);

}  // namespace promptly::backend::cuda
